"""Serving metrics from a simulation (DESIGN.md section 7), with the definitions `vllm bench serve` uses.

Measurement window: [warmup_s, end]. Throughput counts tokens emitted by steps that end inside the window; the
per-request statistics use requests that arrived inside the window and completed. Warm-up is excluded because a
closed-loop run starts with every user arriving at t=0 (a prefill burst no steady state has).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from dsparksim.engine import SimResult

SUMMARY_FIELDS = (
    "policy", "load", "sim_time_s", "window_s", "num_requests_completed", "output_throughput_tok_s",
    "request_throughput_req_s", "tps_user_mean", "tps_user_median", "tps_user_p10", "tps_user_p90",
    "ttft_mean_s", "ttft_median_s", "ttft_p99_s", "tpot_mean_s", "tpot_median_s", "tpot_p99_s", "itl_median_s",
    "itl_p99_s", "e2e_mean_s", "e2e_median_s", "e2e_p99_s", "mean_verify_len", "tau", "mean_batch_tokens",
    "mean_running", "saturated",
)


def per_request_table(res: SimResult) -> pd.DataFrame:
    """One row per issued request; times in seconds, NaN where the request did not get that far."""
    ttft = res.first_token_s - res.arrival_s
    e2e = res.finish_s - res.arrival_s
    decode_time = res.finish_s - res.first_token_s
    after_first = res.output_tokens - 1
    with np.errstate(divide="ignore", invalid="ignore"):
        tpot = np.where(after_first > 0, decode_time / after_first, np.nan)
        tps_user = np.where((after_first > 0) & (decode_time > 0), after_first / decode_time, np.nan)
        steps = np.where(res.decode_steps > 0, res.decode_steps, np.nan)
        mean_vl = res.verify_tokens / steps
        tau = (res.emitted_tokens - 1) / steps
    return pd.DataFrame({
        "request_id": np.arange(len(res.arrival_s)),
        "domain": res.domain,
        "arrival_s": res.arrival_s,
        "admitted_s": res.admitted_s,
        "first_token_s": res.first_token_s,
        "finish_s": res.finish_s,
        "prompt_tokens": res.prompt_tokens,
        "output_tokens": res.output_tokens,
        "emitted_tokens": res.emitted_tokens,
        "completed": res.completed,
        "ttft_s": ttft,
        "tpot_s": tpot,
        "e2e_s": e2e,
        "tps_user": tps_user,
        "decode_steps": res.decode_steps,
        "verify_tokens": res.verify_tokens,
        "accepted_tokens": res.accepted_tokens,
        "mean_verify_len": mean_vl,
        "tau": tau,
    })


def _pct(x: np.ndarray, q: float) -> float:
    x = x[np.isfinite(x)]
    return float(np.percentile(x, q)) if x.size else float("nan")


def _mean(x: np.ndarray) -> float:
    x = x[np.isfinite(x)]
    return float(x.mean()) if x.size else float("nan")


def _weighted_pct(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    keep = weights > 0
    v, w = values[keep], weights[keep]
    if not v.size:
        return float("nan")
    order = np.argsort(v, kind="stable")
    cw = np.cumsum(w[order])
    return float(v[order][np.searchsorted(cw, q / 100.0 * cw[-1])])


def saturation(res: SimResult, warmup_s: float, closed_loop: bool) -> tuple[bool, dict[str, float]]:
    """Is the engine past saturation?

    Open loop: the admission queue grows without bound — a least-squares slope of the waiting-queue length over
    the window's second half predicts growth of more than max(5, 5% of requests arrived) over that half.
    Closed loop (the queue is bounded by the users): requests wait for admission (KV or batch budget) in more
    than half of the window's steps — more users only add queueing.
    """
    st = res.steps
    end = res.sim_time_s
    t_end = st["t_start"] + st["dt"] if len(st["dt"]) else np.zeros(0)
    sel = t_end > warmup_s
    q = st["n_waiting"][sel].astype(float)
    t = t_end[sel]
    info: dict[str, float] = {}
    if q.size < 4:
        return False, {"note": "too few steps to judge"}  # type: ignore[dict-item]
    if closed_loop:
        frac = float((q > 0).mean())
        info["frac_steps_with_waiting"] = frac
        return frac > 0.5, info
    half = t >= warmup_s + (end - warmup_s) / 2
    if half.sum() < 4 or np.ptp(t[half]) <= 0:
        return False, info
    slope = float(np.polyfit(t[half], q[half], 1)[0])
    growth = slope * (end - warmup_s) / 2
    arrived = int(np.isfinite(res.arrival_s).sum())
    info.update(queue_slope_req_per_s=slope, queue_growth_second_half=growth, final_queue=float(q[-1]))
    return bool(growth > max(5.0, 0.05 * arrived)), info


def summarize(res: SimResult, *, policy: str, load: Any, warmup_s: float, closed_loop: bool) -> dict[str, Any]:
    """The run's summary (summary.json): throughput, per-user speed, latency percentiles, verify length, tau."""
    end = res.sim_time_s
    window = end - warmup_s
    if not window > 0:
        raise ValueError(f"warm-up {warmup_s}s leaves no measurement window (run ended at {end:.3f}s)")
    st = res.steps
    t_end = st["t_start"] + st["dt"]
    in_win = t_end > warmup_s
    # Tokens from a step that straddles the warm-up boundary count pro rata.
    frac = np.clip((t_end - warmup_s) / np.where(st["dt"] > 0, st["dt"], 1.0), 0.0, 1.0)
    out_tokens = float((st["emitted"] * frac).sum())
    req = per_request_table(res)
    done = req[req["completed"] & (req["arrival_s"] >= warmup_s)]
    n_dec = st["n_decode"][in_win].astype(float)
    dec_steps = n_dec.sum()
    sat, sat_info = saturation(res, warmup_s, closed_loop)
    s = {
        "policy": policy,
        "load": load,
        "sim_time_s": end,
        "window_s": window,
        "warmup_s": warmup_s,
        "ended_by": res.ended_by,
        "num_requests_issued": int(np.isfinite(res.arrival_s).sum()),
        "num_requests_completed": int(len(done)),
        "num_requests_completed_total": int(req["completed"].sum()),
        "output_throughput_tok_s": out_tokens / window,
        "request_throughput_req_s": len(done) / window,
        "tps_user_mean": _mean(done["tps_user"].to_numpy()),
        "tps_user_median": _pct(done["tps_user"].to_numpy(), 50),
        "tps_user_p10": _pct(done["tps_user"].to_numpy(), 10),
        "tps_user_p90": _pct(done["tps_user"].to_numpy(), 90),
        "ttft_mean_s": _mean(done["ttft_s"].to_numpy()),
        "ttft_median_s": _pct(done["ttft_s"].to_numpy(), 50),
        "ttft_p99_s": _pct(done["ttft_s"].to_numpy(), 99),
        "tpot_mean_s": _mean(done["tpot_s"].to_numpy()),
        "tpot_median_s": _pct(done["tpot_s"].to_numpy(), 50),
        "tpot_p99_s": _pct(done["tpot_s"].to_numpy(), 99),
        # ITL per streamed chunk: every decoding request receives one chunk per step, so the step durations
        # weighted by the number of decoding requests are exactly the pooled per-request ITL samples.
        "itl_median_s": _weighted_pct(st["dt"][in_win], n_dec, 50),
        "itl_p99_s": _weighted_pct(st["dt"][in_win], n_dec, 99),
        "e2e_mean_s": _mean(done["e2e_s"].to_numpy()),
        "e2e_median_s": _pct(done["e2e_s"].to_numpy(), 50),
        "e2e_p99_s": _pct(done["e2e_s"].to_numpy(), 99),
        "mean_verify_len": float(st["verify_tokens"][in_win].sum() / dec_steps) if dec_steps else float("nan"),
        "tau": _tau(st, in_win, dec_steps),
        "mean_batch_tokens": _mean(st["M"][in_win].astype(float)),
        "mean_running": _mean(st["n_running"][in_win].astype(float)),
        "num_steps": int(in_win.sum()),
        "saturated": sat,
        "saturation_detail": sat_info,
        "kv_capacity_tokens": res.kv_capacity_tokens,
        "kv_peak_used_tokens": int(st["kv_used"].max()) if len(st["kv_used"]) else 0,
        "block_size": res.block_size,
        "drafter": res.drafter,
    }
    return {k: _clean(v) for k, v in s.items()}


def _tau(st: dict[str, np.ndarray], in_win: np.ndarray, dec_steps: float) -> float:
    """Tokens emitted per decoding request per decode step (first tokens from prefill excluded)."""
    return float(st["decode_emitted"][in_win].sum() / dec_steps) if dec_steps else float("nan")


def _clean(v: Any) -> Any:
    if isinstance(v, (np.floating, float)):
        f = float(v)
        return None if math.isnan(f) else f
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, np.bool_):
        return bool(v)
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    return v


def bench_serve_json(res: SimResult, summary: dict[str, Any], *, model_id: str, request_rate: Any,
                     burstiness: Any, max_concurrency: Any) -> dict[str, Any]:
    """The run shaped exactly as `vllm bench serve --save-result` writes it (keys, units, meanings):
    see :mod:`dsparksim.bench_json`. Prompts are the requests issued in the measurement window."""
    from dsparksim.bench_json import bench_result

    d = bench_result(res, warmup_s=float(summary["warmup_s"]), duration_s=float(summary["window_s"]),
                     model_id=model_id, request_rate=request_rate, burstiness=burstiness,
                     max_concurrency=max_concurrency)
    return {k: ([_clean(x) for x in v] if isinstance(v, list) else _clean(v)) for k, v in d.items()}
