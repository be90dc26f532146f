"""``dsparksim profile fit``: from a runs table to a calibrated ``dsparksim-profile/1`` JSON with ``metadata.fit``."""
from __future__ import annotations

import datetime as _dt
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from dsparksim.cost.analytic.calibration import FAMILIES, FAMILY_NOTES, Calibration
from dsparksim.bench.client import is_trtllm
from dsparksim.bench.replay import check_deployment, model_note, unchecked_columns
from dsparksim.errors import ConfigError, InputError
from dsparksim.fit.fitter import (DELTA_MIN, GAMMA_MAX, FitProblem, bootstrap, fit_problem, loco,
                                  param_bounds)
from dsparksim.fit.reprice import PARAMS, LinearRun, PriceBasis
from dsparksim.fit.runs import FitRun, file_sha256, load_fit_runs
from dsparksim.fit.trace import Trace, simulate_trace
from dsparksim.cost.analytic.builder import build_profile
from dsparksim.cost.profile import profile_from_dict

__all__ = ["FitOptions", "run_fit", "traces_for", "KINDS"]

PARAM_NOTES = {"fixed_overhead_s": "seconds added to every engine step (host scheduling, launches)",
               "request_latency_s": "seconds outside the engine's step loop (HTTP, tokenization, detokenization, "
                                    "streaming) that the benchmark client sees in every TTFT and E2E, not in TPOT "
                                    "(profile field request_latency_s; the engine and run/frontier do not see it)"}
KINDS = {"mean_tpot_ms": "tpot", "median_tpot_ms": "tpot", "mean_ttft_ms": "ttft", "median_ttft_ms": "ttft",
         "output_throughput_per_gpu": "tput"}


@dataclass(frozen=True)
class FitOptions:
    model: str
    gpu: str
    tp: int = 1
    ep: int = 1
    where: tuple[tuple[str, str], ...] = ()
    bootstrap: int = 200
    seed: int = 0
    max_num_seqs: int = 1024
    prefill_chunk_tokens: int | None = None     # None = the profile's token budget
    name: str | None = None
    date: str | None = None
    model_label: str | None = None
    metrics: tuple[str, ...] = ("tpot", "ttft", "tput")   # kinds fitted (KINDS values); all are reported
    mem_fraction_static: float | None = None     # the server's memory fraction (None: the profile's KV capacity)
    kv_dtype: str | None = None                  # the server's KV-cache dtype (None: the builder's default)
    mixed_prefill: bool | None = None            # None: each run's engine default (SGLang: off)
    batch_wait_timeout_iters: int | None = None  # TensorRT-LLM's batch waiting, both or neither (sim/batch_wait.py)
    batch_wait_max_tokens_ratio: float | None = None
    batch_wait_runs: tuple[str, ...] | None = None   # the run ids it applies to; None = every selected run


def traces_for(runs: list[FitRun], profile: Any, progress: Any = None) -> list[Trace]:
    """One trace per distinct client spec (repeated runs of one configuration share it)."""
    cache: dict[Any, Trace] = {}
    out = []
    for r in runs:
        if r.spec not in cache:
            cache[r.spec] = simulate_trace(profile, r.spec)
        out.append(cache[r.spec])
        if progress is not None:
            progress(1)
    return out


def _mixed_record(runs: list[FitRun], given: bool | None) -> dict[str, Any]:
    """metadata.fit's record of whether prefill chunks shared steps with decode, and why."""
    vals = sorted({bool(r.spec.mixed_prefill) for r in runs})
    return {"value": vals[0] if len(vals) == 1 else vals,
            "source": ("--mixed-prefill/--no-mixed-prefill" if given is not None else
                       "each run's engine default: SGLang off (--enable-mixed-chunk defaults to False), "
                       "others on (dsparksim.bench.client.engine_mixes_prefill)")}


def _batch_wait_record(runs: list[FitRun]) -> dict[str, Any]:
    """metadata.fit's record of TensorRT-LLM's batch waiting in the simulated runs ({} when off in all: a fit
    without it writes the same metadata as before it existed)."""
    on = [r for r in runs if r.spec.batch_wait_timeout_iters is not None]
    if not on:
        return {}
    return {"batch_wait": {"timeout_iters": sorted({r.spec.batch_wait_timeout_iters for r in on}),
            "max_tokens_ratio": sorted({r.spec.batch_wait_max_tokens_ratio for r in on}),
            "run_ids": [r.run_id for r in on] if len(on) < len(runs) else "all"}}


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind in ("tpot", "ttft", "tput"):
        e = np.array([abs(r["rel_error"]) for r in rows if KINDS[r["metric"]] == kind])
        if e.size:
            out[kind] = {"median_abs": round(float(np.median(e)), 4), "p90_abs": round(float(np.percentile(e, 90)), 4),
                         "max_abs": round(float(e.max()), 4), "n": int(e.size)}
    return out


def parameter_entries(prob: FitProblem, res: Any, boot: np.ndarray | None, seed: int) -> dict[str, Any]:
    """``metadata.fit.parameters``: each parameter's value, builder value, status, bounds, sensitivity, and for a
    fitted one whether it sits at a bound and its bootstrap percentiles."""
    params: dict[str, Any] = {}
    for k, p in enumerate(PARAMS):
        st = res.status[p]
        e: dict[str, Any] = {"value": float(res.coef[k]), "builder_value": float(prob.builder_coef[k]),
                             "status": st["status"], "bounds": list(param_bounds(p)),
                             "sensitivity": st.get("sensitivity")}
        if "reason" in st:
            e["reason"] = st["reason"]
        if "collinearity_index" in st:
            e["collinearity_index"] = st["collinearity_index"]
        if st["status"] == "fitted":
            lo, hi = param_bounds(p)
            e["at_bound"] = bool(res.coef[k] <= lo * 1.001 or res.coef[k] >= hi / 1.001)
            if boot is not None:
                b = boot[:, k]
                e["bootstrap"] = {"n": int(len(b)), "seed": seed, "p2.5": float(np.percentile(b, 2.5)),
                                  "p50": float(np.median(b)), "p97.5": float(np.percentile(b, 97.5)),
                                  "sd_log": float(np.std(np.log(b)))}
        e["meaning"] = FAMILY_NOTES.get(p, PARAM_NOTES.get(p, ""))
        params[p] = e
    return params


def fit_metadata(runs_path: str | Path, opt: FitOptions, where: dict[str, str], runs: list[FitRun], chunk: int,
                 params: dict[str, Any], res: Any, in_rows: list[dict], loco_rows: list[dict],
                 elapsed: float) -> dict[str, Any]:
    """``metadata.fit``: the runs and selection, the client model, the objective, the parameters, the
    identifiability rule and the fit and leave-one-concurrency-out errors."""
    return {
        "command": "dsparksim profile fit",
        "runs": {"file": str(runs_path), "sha256": file_sha256(runs_path), "selection": where,
                 "run_ids": [r.run_id for r in runs], "n_runs": len(runs),
                 "concurrencies": sorted({r.concurrency for r in runs}),
                 "workloads": sorted({f"{r.spec.input_len}/{r.spec.output_len}" for r in runs})},
        "client_model": {"workload": "the run's client: max_concurrency cap over num_prompts requests released at "
                         "once, warm-up prompts first; lengths uniform in [int(R*L), L]; ignore_eos",
                         "max_num_seqs": opt.max_num_seqs, "prefill_chunk_tokens": chunk, "seed": 0,
                         "mem_fraction_static": opt.mem_fraction_static, "kv_dtype": opt.kv_dtype,
                         "mixed_prefill": _mixed_record(runs, opt.mixed_prefill),
                         **_batch_wait_record(runs),
                         "simulated_by": "dsparksim.bench.client.run_client (warm-up prompts included)"},
        "objective": "least squares of log(simulated/measured): per run mean TPOT (median where the run has no "
                     "mean), mean TTFT (median likewise) and output tokens/s per GPU, equal weights",
        "fitted_metrics": list(opt.metrics),
        "parameters": params,
        "identifiability": {"rule": f"Brun et al. 2001: flat if sensitivity ||J_j||/sqrt(n) < {DELTA_MIN} (J: "
                                    "d log metric / d log parameter); in decreasing sensitivity a parameter is "
                                    f"fitted only if the collinearity index of the fitted set stays <= {GAMMA_MAX:g}; "
                                    "judged at the builder's values and again at the fitted ones",
                            "passes": res.passes, "unidentified_held_at_builder_value":
                                [p for p in PARAMS if res.status[p]["status"] != "fitted"]},
        "fit_error": _summary(in_rows),
        "loco_error": _summary(loco_rows) if loco_rows else "fewer than 2 concurrencies: not computed",
        "rms_log_residual": float(np.sqrt(np.mean(res.residuals ** 2))) if len(res.residuals) else None,
        "elapsed_s": round(elapsed, 1),
    }


def batch_wait_settings(opt: FitOptions) -> dict[str, Any]:
    """The ClientSpec fields of ``opt``'s batch waiting ({} when off); InputError unless both values are given."""
    t, r = opt.batch_wait_timeout_iters, opt.batch_wait_max_tokens_ratio
    if (t is None) != (r is None):
        raise InputError("profile fit", "--batch-wait-timeout-iters" if r is None else "--batch-wait-max-tokens-ratio",
                         f"{t if r is None else r} given alone: TensorRT-LLM's batch waiting holds prefills only with "
                         "both --batch-wait-timeout-iters and --batch-wait-max-tokens-ratio set: give both, or neither")
    if t is not None and (isinstance(t, bool) or not isinstance(t, int) or t < 1):
        raise InputError("profile fit", "--batch-wait-timeout-iters", f"expected an integer >= 1, got {t!r}")
    if r is not None and (isinstance(r, bool) or not isinstance(r, (int, float)) or not 0 < r <= 1):
        raise InputError("profile fit", "--batch-wait-max-tokens-ratio", f"expected a fraction in (0, 1], got {r!r}")
    if opt.batch_wait_runs is not None and t is None:
        raise InputError("profile fit", "batch_wait_runs", "names runs for batch waiting, but it is off")
    return {} if t is None else {"batch_wait_timeout_iters": int(t), "batch_wait_max_tokens_ratio": float(r)}


def _check_batch_wait_engines(rows: list[dict[str, Any]], opt: FitOptions) -> None:
    """Batch waiting is TensorRT-LLM's: every run it applies to must be a TensorRT-LLM run (or name no engine)."""
    if opt.batch_wait_timeout_iters is None:
        return
    named = None if opt.batch_wait_runs is None else set(opt.batch_wait_runs)
    for r in rows:
        eng = r.get("engine")
        if (named is None or r["run_id"] in named) and eng and not is_trtllm(eng):
            raise InputError("profile fit", "--batch-wait-timeout-iters", f"{opt.batch_wait_timeout_iters} given, "
                             f"but run {r['run_id']} ran on {eng!r} (batch waiting is TensorRT-LLM's): select the "
                             "runs it applies to with --where")


def check_fit_deployment(rows: list[dict[str, Any]], base: Any, source: str, opt: FitOptions) -> list[str]:
    """Every run on the deployment the fit's options build (bench replay's check, its advice worded for the fit:
    the profile comes from --gpu / --tp / --ep, not from a file); returns notes on what it cannot check: runs whose
    model shares no family word with --model's (bench replay's note), runs without gpu / tp (taken as the
    options')."""
    for r in rows:
        try:
            check_deployment(r, base, source)
        except ConfigError as e:
            if e.field not in ("gpu", "tp", "ep"):
                raise
            raise ConfigError(e.source, e.field, e.message.replace(" (file <builder>)", "") + f" (profile fit builds "
                              f"that profile from --gpu {opt.gpu} --tp {opt.tp} --ep {opt.ep}: give the runs' own "
                              f"--{e.field}, or select the runs of that deployment)") from None
    notes = []
    other = sorted({str(r["model"]) for r in rows if model_note(r, base)})
    if other:
        notes.append(f"the runs' model {', '.join(map(repr, other))} shares no name with --model "
                     f"{base.metadata.get('model')!r}: is --model its architecture? (it is what the fit prices)")
    empty = [unchecked_columns(r, base) for r in rows]
    cols = [c for c in ("gpu", "tp", "ep") if any(c in dict(e) for e in empty)]
    if cols:
        notes.append(f"{sum(1 for e in empty if e)} run(s) with {' / '.join(cols)} empty: taken as the fit's "
                     f"--{' / --'.join(cols)}, not checked (set them at bench import)")
    return notes


def run_fit(runs_path: str | Path, opt: FitOptions, *, tqdm_file: Any = None
            ) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the fitted profile object, a report with the per-run and LOCO rows). InputError on bad input."""
    t0 = time.perf_counter()
    where = dict(opt.where)
    server_kw = {"kv_dtype": opt.kv_dtype}
    base_d = build_profile(opt.model, opt.gpu, tp=opt.tp, ep=opt.ep, date=opt.date or "2026-12-01",
                           model_label=opt.model_label, **server_kw)
    base = profile_from_dict(base_d, "<builder>")
    chunk = int(opt.prefill_chunk_tokens or base.max_tokens)
    if chunk > base.max_tokens:
        raise InputError("profile fit", "--prefill-chunk", f"{chunk} exceeds the profile's token budget "
                         f"{base.max_tokens} (the largest batch `profile build` prices, which caps every simulated "
                         f"step's prefill): give --prefill-chunk {base.max_tokens} or less, or leave it out (the fit "
                         f"then takes the budget, as bench replay simulates a larger server chunk: at most "
                         f"{base.max_tokens} prefill tokens per step)")
    server: dict[str, Any] = {"max_num_seqs": opt.max_num_seqs, "prefill_chunk_tokens": chunk,
                              "mem_fraction_static": opt.mem_fraction_static}
    wait = batch_wait_settings(opt)
    runs, rows = load_fit_runs(runs_path, where, server={**server, **(wait if opt.batch_wait_runs is None else {})},
                               mixed_prefill=opt.mixed_prefill,
                               run_server=None if opt.batch_wait_runs is None else
                               {rid: wait for rid in opt.batch_wait_runs})
    _check_batch_wait_engines(rows, opt)
    notes = check_fit_deployment(rows, base, str(runs_path), opt)
    basis = PriceBasis.build(opt.model, opt.gpu, tp=opt.tp, ep=opt.ep, kv_dtype=opt.kv_dtype)
    with tqdm(total=len(runs), desc="simulate runs", unit="run", file=tqdm_file, leave=False) as bar:
        traces = traces_for(runs, base, bar.update)
    lin_cache: dict[int, LinearRun] = {}
    lin = [lin_cache.setdefault(id(t), LinearRun(t, basis)) for t in traces]
    full = FitProblem(basis, runs, lin)
    prob = FitProblem(basis, runs, lin, [t for t in full.targets if KINDS[t[1]] in opt.metrics])
    if not prob.targets:
        raise InputError(str(runs_path), "--metrics", f"the selected runs publish none of {', '.join(opt.metrics)}")
    res = fit_problem(prob)
    with tqdm(total=opt.bootstrap, desc="bootstrap", unit="fit", file=tqdm_file, leave=False) as bar:
        boot = bootstrap(prob, res, opt.bootstrap, opt.seed, bar.update) if opt.bootstrap else None
    n_conc = len({r.concurrency for r in runs})
    with tqdm(total=n_conc if n_conc > 1 else 0, desc="leave one concurrency out", unit="fit", file=tqdm_file,
              leave=False) as bar:
        loco_rows = loco(prob, bar.update, report=full.targets)
    in_rows = [{"run_id": runs[i].run_id, "concurrency": runs[i].concurrency, "metric": m, "measured": v,
                "predicted": lin[i].metric(m, res.coef), "fitted_metric": KINDS[m] in opt.metrics}
               for i, m, v in full.targets]
    for r in in_rows:
        r["rel_error"] = r["predicted"] / r["measured"] - 1.0
    elapsed = time.perf_counter() - t0

    params = parameter_entries(prob, res, boot, opt.seed)
    scales = {p: float(res.coef[PARAMS.index(p)]) for p in FAMILIES if res.coef[PARAMS.index(p)] != 1.0}
    lat = float(res.coef[PARAMS.index("request_latency_s")])
    cal = Calibration(scales=scales, fixed_overhead_s=float(res.coef[PARAMS.index("fixed_overhead_s")]),
                      request_latency_s=lat if lat > 0 else None)
    name = opt.name or f"fitted-{opt.gpu.lower()}x{opt.tp}-{Path(opt.model).stem}"
    d = build_profile(opt.model, opt.gpu, tp=opt.tp, ep=opt.ep, date=opt.date or _dt.date.today().isoformat(),
                      model_label=opt.model_label, calibration=cal, name=name, **server_kw)
    md = d["metadata"]
    md["source"] = (f"dsparksim profile fit on {len(runs)} measured runs of {Path(runs_path).name} "
                    f"(builder v{md['build']['builder_version']} calibrated)")
    md["method"] = ("analytic builder profile with one scale per cost family, a fixed per-step overhead and a "
                    "request latency outside the step loop fitted by bounded least squares on log(simulated/"
                    "measured) of the runs' TPOT, TTFT and output tokens/s per GPU; see metadata.fit")
    md["fit"] = fit_metadata(runs_path, opt, where, runs, chunk, params, res, in_rows, loco_rows, elapsed)
    return d, {"in_sample": in_rows, "loco": loco_rows, "result": res, "runs": runs, "elapsed_s": elapsed,
               "notes": notes}
