"""Run one configuration end to end: resolve inputs, simulate, summarise, write result files."""
from __future__ import annotations

import dataclasses
import json
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

import numpy as np

from dsparksim.config import RunConfig, jsonable
from dsparksim.errors import ConfigError
from dsparksim.sim.cluster import SimResult, Simulation
from dsparksim.sim.inputs import engine_limits, max_model_len, resolve_inputs  # noqa: F401  (engine_limits: re-export)
from dsparksim.sim.streams import RequestStreams
from dsparksim.results.csvtable import csv_kinds_supported, write_csv_columns
from dsparksim.results.metrics import bench_serve_json, request_columns, summarize
from dsparksim.results.outputs import atomic_write, staged_dir
from dsparksim.traffic import build_workload
from dsparksim import __version__
from dsparksim.results.bench_json import write_bench_json

if TYPE_CHECKING:  # pandas is imported where results are written (lazy: ~0.4 s of start-up)
    import pandas as pd

__all__ = ["Prepared", "RunOutput", "prepare", "simulate", "write_run", "load_label", "run_streams"]


@dataclass
class RunOutput:
    """One simulated run (:func:`simulate`): its ``config``, ``summary`` (summary.json's fields), the engine's raw
    ``result`` (per-request arrays and the step log), the resolved ``inputs`` (config.json's provenance) and, once
    :func:`write_run` built it, ``bench`` (bench_result.json's dict)."""

    config: RunConfig
    summary: dict[str, Any]
    result: SimResult
    inputs: dict[str, Any]  # resolved provenance of profile / acceptance / workload / policy
    bench: dict[str, Any] | None = None   # bench_result.json's dict, once write_run built it

    def requests(self) -> pd.DataFrame:
        """requests.csv as a DataFrame: one row per issued request, the columns of
        :func:`dsparksim.results.metrics.per_request_table` and ``measured`` (arrived in the measurement window:
        the requests the summary's per-request metrics are over, when completed)."""
        import pandas as pd  # lazy: pandas (~0.4 s of start-up; a run's summary needs none)

        return pd.DataFrame(_request_file_columns(self))


def load_label(cfg: RunConfig) -> Any:
    """The load level of a run as a frontier axis value: concurrency (closed loop) or rate (open loop)."""
    t = cfg.traffic
    if t.mode == "closed":
        return int(t.concurrency)
    if t.mode == "trace":
        return float(t.time_scale)
    return float(t.rate)


def run_streams(seed: int) -> dict[str, Any]:
    """A run's random streams from its seed: ``workload`` and ``policy`` Generators, ``acceptance`` RequestStreams."""
    # Independent, reproducible streams. The workload depends only on the seed and the acceptance draws of request
    # i's j-th step only on (seed, i, j) (keyed streams), so every policy, load list and replica count serves the
    # very same requests with the very same draws: comparisons are paired (common random numbers).
    ss = np.random.SeedSequence(seed)
    work, acc, pol = ss.spawn(3)
    return {"workload": np.random.default_rng(work), "acceptance": RequestStreams(acc),
            "policy": np.random.default_rng(pol)}


def simulate(cfg: RunConfig, progress: Callable[[float], None] | None = None, *, profile: Any = None,
             cache: dict | None = None, wrap_policy: Callable[[Any], Any] | None = None) -> RunOutput:
    """Simulate one configuration and summarise it (nothing is written). ``profile``: an already loaded profile
    instead of ``cfg.profile``; ``cache``: shared across calls (see :func:`resolve_inputs`).

    ``wrap_policy(policy) -> policy``: replaces the resolved policy with a wrapper around it (the studies use it to
    record per-step decisions or add a knob); the wrapper keeps the inner policy's spec, K and drafter."""
    run = prepare(cfg, progress, profile=profile, cache=cache, wrap_policy=wrap_policy)
    return run.output(run.sim.run())


@dataclass
class Prepared:
    """A configuration resolved into a ready :class:`Simulation` and what its summary needs."""

    cfg: RunConfig
    sim: Simulation
    profile: Any
    acceptance: Any
    policy: Any
    workload: Any
    K: int
    drafter: str
    kv_cap: Any
    max_tok: Any
    duration: float | None

    def output(self, res: SimResult) -> RunOutput:
        """The run's output from its result (the simulation's own, or merged from shards)."""
        summary, inputs = run_summary(self.cfg, res, self.profile, self.acceptance, self.policy, self.workload,
                                      self.K, self.drafter, self.kv_cap, self.max_tok, self.duration)
        return RunOutput(config=self.cfg, summary=summary, result=res, inputs=inputs)


def prepare(cfg: RunConfig, progress: Callable[[float], None] | None = None, *, profile: Any = None,
            cache: dict | None = None, wrap_policy: Callable[[Any], Any] | None = None,
            shard: tuple[int, int] | None = None) -> Prepared:
    """Resolve ``cfg`` and build its Simulation (not run); ``shard``: only replicas lo..hi-1 (dsparksim.sim.shard)."""
    if cfg.traffic is None:
        raise ConfigError("config", "traffic", "a run needs its load: RunConfig(traffic=TrafficConfig(...)), or "
                          "RunConfig.from_options({...}) (closed loop of 32 users for 60 s by default)")
    rngs = run_streams(cfg.seed)
    # profile, policy, K, acceptance, drafter and engine limits (dsparksim.sim.inputs)
    ri = resolve_inputs(cfg, profile=profile, cache=cache)
    profile, policy, K, acceptance, drafter = ri.profile, ri.policy, ri.K, ri.acceptance, ri.drafter
    if wrap_policy is not None:
        policy = wrap_policy(policy)
    kv_cap, max_tok = ri.kv_cap, ri.max_tokens
    policy.reset(K, rngs["policy"])

    t = cfg.traffic
    workload = build_workload(t, rngs["workload"])
    duration = t.duration_s if t.num_requests is None else None
    if policy is not ri.policy:
        ri = dataclasses.replace(ri, policy=policy)
    sim = Simulation(cfg.engine, ri, workload, rngs["acceptance"], duration_s=duration, num_requests=t.total_requests,
                     progress=progress, router_seed=cfg.seed, client_cap=t.max_concurrency,
                     warmup_requests=t.num_warmup_prompts, shard=shard)
    return Prepared(cfg, sim, profile, acceptance, policy, workload, K, drafter, kv_cap, max_tok, duration)


def run_summary(cfg: RunConfig, res: SimResult, profile, acceptance, policy, workload, K: int, drafter: str,
                kv_cap: int, max_tok: int, duration: float | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(summary, resolved inputs) of a finished run, simulated or real (the real runner adds its own fields)."""
    warmup = cfg.warmup_s if cfg.warmup_s is not None else (0.1 * duration if duration else 0.0)
    if cfg.traffic.num_warmup_prompts:
        # the benchmark client's warm-up: the measurement starts when the warm-up requests have finished
        warmup = float(res.notes["benchmark_start_s"])
    summary = summarize(res, policy=policy.spec, load=load_label(cfg), warmup_s=warmup,
                        closed_loop=workload.closed_loop)
    summary["context_model"] = profile.context_model
    if cfg.engine.extrapolate:
        summary["extrapolation"] = profile.extrapolation_report()
    inputs = {
        "profile": {"name": profile.name, "source": str(profile.source), "context_model": profile.context_model,
                    "max_tokens": int(profile.max_tokens), "metadata": profile.metadata},
        "acceptance": acceptance.describe(),
        "workload": workload.metadata,
        "policy": {"spec": policy.spec, "block_size": K, "drafter": drafter},
        "engine": {"kv_capacity_tokens": int(kv_cap), "max_batched_tokens": int(max_tok),
                   "max_model_len": max_model_len(profile, kv_cap),
                   "admission": _ADMISSION[cfg.engine.kv_policy],
                   "rejection": "on arrival when prompt+output > max_model_len or prompt+output+K > KV capacity "
                                "(counted, never admitted; closed loop: the user sends its next request)"},
    }
    if cfg.engine.disaggregated:
        inputs["engine"]["disaggregated"] = (
            f"decode-only engines; {cfg.engine.prefill_replicas} FIFO prefill instance(s), one request at a time in "
            "chunks priced as prefill-only steps; KV shipped at full link bandwidth "
            f"({res.notes.get('kv_transfer_gbps')} Gbit/s, {res.notes.get('kv_bytes_per_token')} bytes/token)")
    return summary, inputs


_ADMISSION = {
    "reserve": "FIFO; reserve prompt+output+K KV tokens at admission (no preemption)",
    "paged": "FIFO; paged KV (pages taken as tokens, draft slots included, are written; admission keeps the "
             "watermark of pages free); a step that cannot get its pages preempts the most recently admitted "
             "request by recompute (re-queued first, re-prefills prompt + generated tokens)",
}


def write_json(path: Path, obj: Any) -> None:
    atomic_write(path, lambda p: p.write_text(json.dumps(obj, indent=2, sort_keys=False, allow_nan=False) + "\n"))


def write_table(path: Path, df: pd.DataFrame | Mapping[str, np.ndarray]) -> None:
    """A table as CSV (floats ``%.9g``) or Parquet, by ``path``'s suffix. ``df``: a DataFrame or its columns (a
    dict of arrays: CSV written without pandas, the same bytes, see dsparksim.results.csvtable)."""
    if isinstance(df, Mapping):
        if path.suffix != ".parquet" and csv_kinds_supported(df):
            atomic_write(path, lambda p: write_csv_columns(p, df))
            return
        import pandas as pd  # lazy: pandas (Parquet, or a column kind only pandas formats)

        df = pd.DataFrame(df)
    if path.suffix == ".parquet":
        atomic_write(path, lambda p: df.to_parquet(p, index=False))
    else:
        atomic_write(path, lambda p: df.to_csv(p, index=False, float_format="%.9g"))


def round_floats(obj: Any, sig: int = 10) -> Any:
    """Round floats to ``sig`` significant digits so saved summaries are stable across platforms' last bits."""
    if isinstance(obj, float):
        return float(f"{obj:.{sig}g}")
    if isinstance(obj, dict):
        return {k: round_floats(v, sig) for k, v in obj.items()}
    if isinstance(obj, list):
        return [round_floats(v, sig) for v in obj]
    return obj


def bench_json_of(out: RunOutput, **options: Any) -> dict[str, Any]:
    """The run's bench_result.json dict (``options``: bench_json.bench_result's vLLM output options)."""
    t = out.config.traffic
    bench = bench_serve_json(out.result, out.summary, model_id=str(out.inputs["profile"]["metadata"].get("model", "")),
                             request_rate=(t.rate if t.mode in ("poisson", "gamma", "constant") else "inf"),
                             burstiness=t.burstiness,
                             max_concurrency=t.concurrency if t.mode == "closed" else t.max_concurrency, **options)
    bench["date"] = time.strftime("%Y%m%d-%H%M%S")
    return bench


def write_run(out: RunOutput, out_dir: str | Path | None, fmt: str = "csv", steps: bool = False,
              bench_options: dict[str, Any] | None = None, result_file: Path | None = None,
              bench_copy_name: str | None = None, fit_used: Mapping[str, Any] | None = None) -> dict[str, Path]:
    """Write config.json, requests.{csv,parquet}, bench_result.json, [steps.csv] and summary.json.

    Everything goes into a staging directory that then replaces ``out_dir`` whole (dsparksim.results.outputs): the result
    is complete or absent, and no file of an earlier run into the same directory survives. ``out_dir`` None: no
    folder. ``result_file``: also write the bench JSON there, as a new file (``--result-dir``: never replaces the
    folder, never an existing file); ``bench_copy_name``: also inside ``out_dir`` under that name
    (``--result-filename`` without ``--result-dir``); ``fit_used``: the run options a fitted profile's server filled
    in (config.json ``options_from_profile_fit``, as plan.json has it; absent when none was)."""

    cfg = out.config
    names = {"config": "config.json", "requests": f"requests.{fmt}", "bench": "bench_result.json",
             "summary": "summary.json"}
    if steps:
        names["steps"] = "steps.csv"
    if bench_copy_name:
        names["result"] = bench_copy_name
    bench = bench_json_of(out, **(bench_options or {}))
    out.bench = bench
    paths: dict[str, Path] = {}
    if result_file is not None:
        _write_new_file(Path(result_file), lambda p: write_bench_json(p, bench))
        paths["result"] = Path(result_file)
    if out_dir is None:
        return paths
    final = Path(out_dir)
    with staged_dir(final) as d:
        write_json(d / names["config"], {"config": cfg.to_dict(), "inputs": jsonable(out.inputs),
                                         **({"options_from_profile_fit": dict(fit_used)} if fit_used else {}),
                                         "dsparksim_version": _version()})
        write_table(d / names["requests"], _request_file_columns(out))
        write_bench_json(d / names["bench"], bench)
        if steps:
            write_table(d / names["steps"], out.result.steps)
        write_json(d / names["summary"], round_floats(out.summary))
        if bench_copy_name:
            write_bench_json(d / bench_copy_name, bench)
    return {**{k: final / v for k, v in names.items()}, **paths}


def _request_file_columns(out: RunOutput) -> dict[str, np.ndarray]:
    """requests.csv's columns: :func:`request_columns` and ``measured``, the requests of the measurement window (arrived
    at or after the warm-up: the per-request metrics' and bench_result.json's population, which arrival_s >=
    summary.json's warmup_s cannot always select: both are rounded, and a --num-warmup-prompts run issues its
    prompts exactly at the warm-up's end)."""
    cols = request_columns(out.result)
    arr = np.asarray(out.result.arrival_s, float)
    cols["measured"] = np.isfinite(arr) & (arr >= float(out.summary["warmup_s"]))
    return cols


def _write_new_file(path: Path, write: Callable[[Path], None]) -> None:
    """Write ``path`` as a new file (its folder is created if missing; an existing file is never replaced: the
    final rename is a link that fails if the name was taken meanwhile)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp"
    try:
        write(tmp)
        os.link(tmp, path)    # FileExistsError if it exists: checked up front, so only a race gets here
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _version() -> str:
    return __version__
