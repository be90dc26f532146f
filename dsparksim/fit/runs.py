"""The fit's view of a runs table (``dsparksim bench import`` output, :mod:`dsparksim.bench.runs`): selection
(``--where``), checks, one :class:`FitRun` per measured run. Every refusal is an InputError naming the file, the
run and the field.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from dsparksim.bench.replay import (cell_matches, check_one_gpu, check_lengths, low_range_ratio, sglang_zero_outputs,
                                    unaccounted, unaccounted_text)
from dsparksim.bench.runs import duplicate_run, format_cell, NAMES, read_runs
from dsparksim.errors import InputError
from dsparksim.fit.trace import ClientSpec
from dsparksim.bench.client import engine_mixes_prefill

__all__ = ["FitRun", "load_fit_runs", "file_sha256", "METRIC_CHOICES"]

# measured metric (runs-table column) -> per kind, in order of preference
METRIC_CHOICES = {"tpot": ("mean_tpot_ms", "median_tpot_ms"), "ttft": ("mean_ttft_ms", "median_ttft_ms"),
                  "tput": ("output_throughput_per_gpu",)}


_RATIO_WHY = ("the length range: lengths uniform in [int(R*L), L]; set it at import, bench import "
              "--random-range-ratio R, e.g. 0 for vLLM's default, every length L")


@dataclass(frozen=True)
class FitRun:
    """One selected run: its row id, the client spec to simulate and its measured metrics (name -> value)."""

    run_id: str
    spec: ClientSpec
    measured: dict[str, float] = field(default_factory=dict)

    @property
    def concurrency(self) -> int:
        return self.spec.concurrency


def file_sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _need(path: Path, r: dict[str, Any], key: str, why: str) -> Any:
    v = r.get(key)
    if v is None:
        raise InputError(str(path), key, f"run {r['run_id']}: empty; the fit needs it ({why})")
    return v


def _check_selection(path: Path, sel: list[dict[str, Any]]) -> None:
    """Refuse a selection of runs of more than one model (names compared case-insensitively; empty = unknown): one
    fitted profile prices one model, and another model's runs would pull its scales toward that model's costs; and
    one measurement selected twice (:func:`dsparksim.bench.runs.duplicate_run`), which would weigh twice."""
    first: dict[str, str] = {}
    for r in sel:
        m = r.get("model")
        if m is None:
            continue
        first.setdefault(str(m).strip().lower(), r["run_id"])
        if len(first) > 1:
            (m0, id0), (m1, id1) = list(first.items())[:2]
            raise InputError(str(path), "model", f"the selected runs are of more than one model: run {id0} "
                             f"{m0!r}, run {id1} {m1!r}; one fit prices one model: select its runs (--where "
                             "model=...)")
    dup = duplicate_run(sel)
    if dup is not None:   # one measurement twice would weigh twice in the fit
        raise InputError(str(path), "run_id", f"run {dup[1]['run_id']} is run {dup[0]['run_id']} again (every field "
                         "but its source equal): keep one of them (--where, or import each run once)")


def _per_gpu_divisor(path: Path, r: dict[str, Any], default: int) -> int:
    """The GPUs the run's per-GPU throughput was divided by, as the source applied it (InferenceX: tp), from
    output_throughput / output_throughput_per_gpu; ``default`` without both. A quotient off a whole number by more
    than 2% (published figures round to 0.04% at most) is an InputError: one of the two figures is wrong."""
    agg, per = r.get("output_throughput"), r.get("output_throughput_per_gpu")
    if not (agg and per):
        return default
    q = agg / per
    n = max(int(round(q)), 1)
    if abs(q - n) > 0.02 * n:
        raise InputError(str(path), "output_throughput_per_gpu", f"run {r['run_id']}: {per:g} is output_throughput "
                         f"{agg:g} / {q:.3g}, not a whole number of GPUs: one of the two figures is wrong")
    return n


def _check_counts(path: Path, r: dict[str, Any]) -> None:
    """Refuse a run whose measured figures cover fewer requests than the simulated client completes: failed
    requests, or prompts neither completed nor counted failed (:func:`dsparksim.bench.replay.unaccounted`)."""
    failed, gone = r.get("failed"), unaccounted(r)
    if gone:
        raise InputError(str(path), "completed", f"run {r['run_id']}: {unaccounted_text(r, gone)}: the measured "
                         "figures cover the completed ones only, while the simulated client completes every prompt")
    if failed:
        raise InputError(str(path), "failed", f"run {r['run_id']}: {failed} request(s) failed: the measured figures "
                         "cover the completed ones only, while the simulated client completes every prompt")


def _check_zero_outputs(path: Path, r: dict[str, Any], L: int, ratio: float) -> None:
    """Refuse an SGLang run whose client drew 0-token outputs (:func:`dsparksim.bench.replay.sglang_zero_outputs`)
    for more than 2% of its prompts (the share 1 / (L + 1); 2% is the length check's tolerance): they lower its
    measured TTFT (recorded as 0) and token count by about that share, and the fit cannot simulate them."""
    zeros = sglang_zero_outputs(r, L, ratio)
    if zeros is not None and 1 / (L + 1) > 0.02:
        raise InputError(str(path), "random_range_ratio", f"run {r['run_id']}: SGLang's bench_serving (0033168f) drew "
                         f"output lengths in [int(R*L), L] = [0, {L}], so about {zeros:.2g} of its prompts (1 in "
                         f"{L + 1}, above the 2% the fit tolerates) were prefill-only requests with max_new_tokens 0, "
                         "which the fit cannot simulate; fit runs with int(R * random_output_len) >= 1 or longer "
                         "outputs")


def load_fit_runs(path: str | Path, where: dict[str, str], *, server: dict[str, Any] | None = None,
                  mixed_prefill: bool | None = None, run_server: Mapping[str, Mapping[str, Any]] | None = None
                  ) -> tuple[list[FitRun], list[dict[str, Any]]]:
    """(the selected runs, their rows). InputError on an empty selection, a speculative, open-loop, non-random or
    non-``ignore_eos`` run, or a run without the fields the fit needs. ``mixed_prefill``: None = each run's
    engine default (SGLang: off; :func:`dsparksim.bench.client.engine_mixes_prefill`). ``server``: ClientSpec
    server fields of every run; ``run_server``: more of them for the runs it names (by run id)."""

    path = Path(path)
    for k in where:
        if k not in NAMES:
            raise InputError("--where", k, f"not a column of the runs table (columns: {', '.join(NAMES)})")
    rows = read_runs(path)
    sel = [r for r in rows if all(cell_matches(r.get(k), v, k) for k, v in where.items())]
    if not sel:
        raise InputError(str(path), "--where", f"no run matches {where or 'the whole table (it is empty)'}")
    check_one_gpu(sel, list(where.items()), "--where")
    _check_selection(path, sel)
    server = server or {}
    runs = []
    for r in sel:
        rid = str(r["run_id"])
        sm = r.get("spec_method")
        if sm is None:
            raise InputError(str(path), "spec_method", f"run {rid}: empty; the fit needs runs known to be "
                             "non-speculative (set it at import: bench import --spec-method none)")
        if sm != "none":
            raise InputError(str(path), "spec_method", f"run {rid}: {sm!r}: the fit re-prices non-speculative runs "
                             "only; select them (e.g. --where spec_method=none)")
        if r.get("ignore_eos") is not True:
            raise InputError(str(path), "ignore_eos", f"run {rid}: {format_cell(r.get('ignore_eos')).strip() or 'empty'}: the fit "
                             "needs ignore_eos runs (step shapes must not depend on what the model generates); "
                             "vLLM and SGLang files do not record it: set it at import, bench import --ignore-eos true")
        rate = r.get("request_rate")
        if rate is not None and not math.isinf(rate):
            raise InputError(str(path), "request_rate", f"run {rid}: {rate}: the fit needs closed-loop runs "
                             "released at once (request rate inf); a finite rate makes step shapes depend on prices: "
                             "select the others, e.g. --where request_rate=inf")
        if r.get("dataset_name") not in (None, "random") or r.get("lengths_file"):
            raise InputError(str(path), "dataset_name", f"run {rid}: the fit simulates the random dataset only")
        ratio = low_range_ratio(r, lambda f, m: InputError(str(path), f, f"run {rid}: {m}"))
        if r.get("dp_attention"):
            raise InputError(str(path), "dp_attention", f"run {rid}: DP-attention engines step their ranks in "
                             "lockstep (a max over ranks) which the fit's re-pricing does not cover")
        _check_counts(path, r)
        conc = _need(path, r, "max_concurrency", "closed loop at a fixed concurrency")
        if ratio is None:
            _need(path, r, "random_range_ratio", _RATIO_WHY)     # refused: the fit never guesses the lengths
        check_lengths(r, int(_need(path, r, "random_output_len", "output lengths")), float(ratio), str(path))
        _check_zero_outputs(path, r, int(r["random_output_len"]), float(ratio))
        tp = _need(path, r, "tp", "GPUs of the engine")
        gpus = _per_gpu_divisor(path, r, int(r.get("gpu_count") or tp))
        spec = ClientSpec(concurrency=int(conc), num_prompts=int(_need(path, r, "num_prompts", "closed-loop pool")),
                          input_len=int(_need(path, r, "random_input_len", "prompt lengths")),
                          output_len=int(_need(path, r, "random_output_len", "output lengths")),
                          range_ratio=float(ratio), gpus=max(gpus, 1),
                          num_warmup_prompts=int(r.get("num_warmup_prompts") or 0),
                          mixed_prefill=(engine_mixes_prefill(r.get("engine")) if mixed_prefill is None
                                         else bool(mixed_prefill)),
                          **{**server, **(run_server or {}).get(rid, {})})
        meas: dict[str, float] = {}
        for names in METRIC_CHOICES.values():
            for n in names:
                if r.get(n):
                    meas[n] = float(r[n])
                    break
        if not meas:
            raise InputError(str(path), "mean_tpot_ms", f"run {rid}: no measured TPOT, TTFT or output throughput")
        runs.append(FitRun(run_id=rid, spec=spec, measured=meas))
    stray = sorted(set(run_server or {}) - {r.run_id for r in runs})
    if stray:
        raise InputError(str(path), "run_id", f"server settings given for {len(stray)} run(s) not selected, e.g. "
                         f"{stray[0]!r}")
    return runs, sel
