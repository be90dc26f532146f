"""Serving metrics from a simulation (DESIGN.md section 7), with the definitions `vllm bench serve` uses.

Measurement window: [warmup_s, end]. Throughput counts tokens emitted by steps that end inside the window (a step
straddling warmup_s pro rata); the per-request statistics use requests that arrived inside the window and completed,
except ITL: each window step's dt once per request decoding in it (every decoding request), and each preemption's gap
that ended in the window once (bench_result.json pools the completed window requests' ITLs, as vLLM). Warm-up is excluded because a
closed-loop run starts with every user arriving at t=0 (a prefill burst no steady state has).
Requests rejected on arrival (engine.py) are counted in ``num_requests_rejected`` / ``rejected_by_reason`` and are
excluded from every latency and throughput metric (they never run).
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

from dsparksim.errors import ConfigError
from dsparksim.sim.cluster import SimResult
from dsparksim.sim.kv import REJECT_REASONS
from dsparksim.results.bench_json import bench_result

if TYPE_CHECKING:  # pandas is imported where a table is built: a run imports it only to write results
    import pandas as pd

SUMMARY_FIELDS = (
    "policy", "load", "sim_time_s", "window_s", "num_requests_completed", "output_throughput_tok_s",
    "request_throughput_req_s", "tps_user_mean", "tps_user_median", "tps_user_p10", "tps_user_p90", "tps_user_p99",
    "ttft_mean_s", "ttft_median_s", "ttft_p10_s", "ttft_p90_s", "ttft_p99_s", "tpot_mean_s", "tpot_median_s",
    "tpot_p10_s", "tpot_p90_s", "tpot_p99_s", "itl_mean_s", "itl_median_s", "itl_p10_s", "itl_p90_s", "itl_p99_s",
    "e2e_mean_s", "e2e_median_s", "e2e_p10_s", "e2e_p90_s", "e2e_p99_s", "mean_verify_len", "tau",
    "mean_batch_tokens", "mean_running", "saturated",
)


def per_request_table(res: SimResult) -> pd.DataFrame:
    """One row per issued request; times in seconds, NaN where the request did not get that far.

    ``rejected`` marks requests refused on arrival (never admitted), ``reject_reason`` says why
    ("max_model_len" | "kv_capacity"; empty otherwise). The columns are :func:`request_columns`."""
    import pandas as pd  # lazy: pandas (a run's summary and requests.csv use the columns alone)

    return pd.DataFrame(request_columns(res))


def request_columns(res: SimResult) -> dict[str, np.ndarray]:
    """:func:`per_request_table`'s columns, in its order, as numpy arrays (no pandas)."""
    ttft = res.first_token_s - res.arrival_s
    e2e = res.finish_s - res.arrival_s
    decode_time = res.finish_s - res.first_token_s
    after_first = res.output_tokens - 1
    with np.errstate(divide="ignore", invalid="ignore"):
        tpot = np.where(after_first > 0, decode_time / after_first, np.nan)
        tps_user = np.where((after_first > 0) & (decode_time > 0), after_first / decode_time, np.nan)
        steps = np.where(res.decode_steps > 0, res.decode_steps, np.nan)
        mean_vl = res.verify_tokens / steps
        # tokens of its decode steps per decode step, as the summary's tau: the first token and, after a
        # preemption, the re-prefill's token come from prefill forwards
        dem = res.decode_emitted_tokens if res.decode_emitted_tokens is not None else res.emitted_tokens - 1
        tau = dem / steps
    rejected = res.rejected
    codes = res.reject_reason if res.reject_reason is not None else np.zeros(len(rejected), np.int8)
    reason = np.array([""] + [REJECT_REASONS.get(c, "") for c in range(1, 8)], dtype=object)[codes]
    cols = {
        "request_id": np.arange(len(res.arrival_s)) if res.request_id is None else res.request_id,
        "domain": res.domain,
        "arrival_s": res.arrival_s,
        "admitted_s": res.admitted_s,
        "first_token_s": res.first_token_s,
        "finish_s": res.finish_s,
        "prompt_tokens": res.prompt_tokens,
        "output_tokens": res.output_tokens,
        "emitted_tokens": res.emitted_tokens,
        "completed": res.completed,
        "rejected": rejected,
        "reject_reason": reason,
        "ttft_s": ttft,
        "tpot_s": tpot,
        "e2e_s": e2e,
        "tps_user": tps_user,
        "decode_steps": res.decode_steps,
        "verify_tokens": res.verify_tokens,
        "accepted_tokens": res.accepted_tokens,
        "mean_verify_len": mean_vl,
        "tau": tau,
    }
    if res.kv_policy == "paged" and res.preemptions is not None:
        cols["preemptions"] = res.preemptions              # times preempted (paged KV, recompute)
        cols["recomputed_tokens"] = res.recomputed_tokens  # KV tokens its preemptions discarded
    if res.disaggregated and res.ttft_queue_s is not None:
        cols["ttft_queue_s"] = res.ttft_queue_s            # prefill-pool queueing
        cols["ttft_prefill_s"] = res.ttft_prefill_s        # prefill time
        cols["ttft_transfer_s"] = res.ttft_transfer_s      # KV transfer
        if res.ttft_decode_wait_s is not None:
            cols["ttft_decode_wait_s"] = res.ttft_decode_wait_s  # KV landed -> admitted (room on the decode engine)
            cols["ttft_first_step_s"] = res.ttft_first_step_s    # admitted -> first token (its first step)
    if res.replica is not None:
        cols["replica"] = res.replica          # -1: rejected on arrival, never routed
        cols["dp_rank"] = res.dp_rank if res.dp_rank is not None else np.where(res.replica >= 0, 0, -1)
    return cols


def _pct(x: np.ndarray, q: float) -> float:
    x = x[np.isfinite(x)]
    return float(np.percentile(x, q)) if x.size else float("nan")


def _mean(x: np.ndarray) -> float:
    x = x[np.isfinite(x)]
    return float(x.mean()) if x.size else float("nan")


def _weighted_mean(values: np.ndarray, weights: np.ndarray) -> float:
    """The mean of the pooled samples (each value ``weights`` times), NaN without one (as :func:`_weighted_pct`)."""
    keep = weights > 0
    v, w = values[keep], weights[keep]
    return float((v * w).sum() / w.sum()) if v.size else float("nan")


def _weighted_pct(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    keep = weights > 0
    v, w = values[keep], weights[keep]
    if not v.size:
        return float("nan")
    # np.percentile (linear) over the pooled samples, as vllm bench serve computes ITL percentiles, without
    # building the pooled list: sample p of the pool is v[searchsorted(cumulative weights, p, 'right')].
    order = np.argsort(v, kind="stable")
    v, cw = v[order], np.cumsum(w[order])
    h = (cw[-1] - 1) * q / 100.0
    lo, hi = math.floor(h), math.ceil(h)
    a = v[min(np.searchsorted(cw, lo, side="right"), len(v) - 1)]
    b = v[min(np.searchsorted(cw, hi, side="right"), len(v) - 1)]
    return float(a + (h - lo) * (b - a))


# Saturation thresholds (see saturation()).
OPEN_GROWTH_FRACTION = 0.1   # queue growth above this fraction of the window's arrivals ...
OPEN_GROWTH_MIN = 5          # ... and above this many requests
HELD_NOISE_SD = 3.0          # held requests: growth beyond this many standard deviations of a stable count's noise
CLOSED_WAIT_FRACTION = 0.5   # closed loop: requests wait for admission in more than this fraction of steps
# Where a request is held between arrival and finish (saturation_detail's held_end_by_place).
HELD_PLACES = ("prefill_pool", "prefilling", "transfer", "admission_queue", "running")


def _prefill_pool_waiting(res: SimResult, t: np.ndarray) -> np.ndarray | None:
    """Requests queued at the disaggregated prefill pool at each time t (arrived, prefill not started: the
    interval [arrival, arrival + ttft_queue_s)); None when the run was not disaggregated."""
    qs = getattr(res, "ttft_queue_s", None)
    if qs is None:
        return None
    arr = np.asarray(res.arrival_s, float)
    ok = np.isfinite(arr) & ~np.asarray(res.rejected, bool)
    q, start = np.asarray(qs, float)[ok], arr[ok]
    # a request still queued at the end of the run has no queue time: it waits until the end
    end = start + np.where(np.isfinite(q), q, np.inf)
    s_sorted, e_sorted = np.sort(start), np.sort(end)
    return (np.searchsorted(s_sorted, t, "right") - np.searchsorted(e_sorted, t, "right")).astype(np.int64)


def held_by_place(res: SimResult, t: float) -> dict[str, int]:
    """Requests held at time ``t`` (arrived by t, not rejected, not finished by t), by where they are: queued at the
    disaggregated prefill pool, being prefilled there, in KV transfer, waiting for admission, or running (admitted;
    a preempted request waiting for readmission counts as running: only its first admission time is kept)."""
    arr = np.asarray(res.arrival_s, float)
    fin = np.where(np.isfinite(res.finish_s), res.finish_s, np.inf)
    held = np.isfinite(arr) & ~np.asarray(res.rejected, bool) & (arr <= t) & (fin > t)
    out = dict.fromkeys(HELD_PLACES, 0)
    rest = held
    if getattr(res, "disaggregated", False) and res.ttft_queue_s is not None:
        with np.errstate(invalid="ignore"):
            q = arr + np.nan_to_num(res.ttft_queue_s, nan=np.inf)
            p = q + np.nan_to_num(res.ttft_prefill_s, nan=0.0)
            x = p + np.nan_to_num(res.ttft_transfer_s, nan=0.0)
        out["prefill_pool"] = int((held & (t < q)).sum())
        out["prefilling"] = int((held & (q <= t) & (t < p)).sum())
        out["transfer"] = int((held & (p <= t) & (t < x)).sum())
        rest = held & (x <= t)
    adm = np.where(np.isfinite(res.admitted_s), res.admitted_s, np.inf)
    out["admission_queue"] = int((rest & (t < adm)).sum())
    out["running"] = int((rest & (adm <= t)).sum())
    return out


def saturation(res: SimResult, warmup_s: float, closed_loop: bool) -> tuple[bool, dict[str, Any]]:
    """Is the run past saturation: does service keep up with demand, wherever the requests are held?

    Open loop (rate processes, trace replay, ``--num-requests`` runs): the arrival window is [t0, t1] with
    t0 = warmup_s and t1 = min(end of run, last arrival) (requests rejected on arrival do not count). Saturated iff
    either rule fires:

    * waiting: the admission queue Q(t) = requests arrived by t minus requests admitted by t (a disaggregated
      request is admitted by its decode engine, so Q holds the prefill pool, the transfer and the decode queue)
      grew over the window by more than OPEN_GROWTH_FRACTION (10%) of the requests that arrived in it and by more
      than OPEN_GROWTH_MIN (5) requests: Q(t1) - Q(t0-) > max(5, 0.1 x arrivals in [t0, t1]);
    * held: H(t) = requests arrived by t minus requests finished by t (wherever they are, the running set
      included) grew over the window's late half [tm, t1] (tm its midpoint) by more than 10% of the requests that
      arrived in it and by more than HELD_NOISE_SD (3) standard deviations of what a stable engine's count does:
      H(t1) - H(tm-) > max(0.1 x arrivals in [tm, t1], 3 sqrt(v)). H(t1) - H(tm-) = arrivals - completions in the
      late half; in a stable engine its variance v is about the smaller of H(tm-) + H(t1) (two independent
      Poisson-like counts, variance = mean: a late half longer than a service time) and the arrivals + completions
      in the late half (two independent flows: a late half shorter than a service time). The late half, because a
      run that starts empty fills up to about rate x service time requests first.

    Paged KV admits every arrival while pages last, so past saturation requests pile up in the running set (each
    step slows as the batch grows) while the admission queue stays short: only the held rule sees it.
    ``saturation_detail`` reports the numbers behind both (window, queue and held counts, arrival, admission and
    completion rates, where the requests are held at t1: ``held_end_by_place``, median admission wait of the
    window's arrivals (censored at the end of the run) and median service time (admission to finish)).

    Closed loop (the users bound the requests held): requests wait for admission (KV or batch budget; or queued at
    a disaggregated prefill pool) in more than CLOSED_WAIT_FRACTION (half) of the window's steps: the engine cannot
    hold all N users, and more users only add queueing. A window in which no engine step ends while requests are
    held (all of them stuck, e.g. in a KV transfer that never lands) served nothing: saturated.
    """
    return closed_loop_saturation(res, warmup_s) if closed_loop else open_loop_saturation(res, warmup_s)


def closed_loop_saturation(res: SimResult, warmup_s: float) -> tuple[bool, dict[str, Any]]:
    """:func:`saturation`'s closed-loop rule: requests wait for admission in most of the window's steps."""
    st = res.steps
    t_end = st["t_start"] + st["dt"] if len(st["dt"]) else np.zeros(0)
    win = t_end > warmup_s
    q = np.asarray(st["n_waiting"])[win]
    if q.size == 0:
        where = held_by_place(res, float(res.sim_time_s))
        n_held = sum(where.values())
        return n_held > 0, {"rule": "closed loop: no engine step in the window while requests are held: "
                                    "nothing was served", "steps": 0, "held": n_held, "held_by_place": where}
    pool = _prefill_pool_waiting(res, t_end[win])
    if pool is not None:
        q = q + pool   # disaggregated: a request queued at the prefill pool waits for admission too
    frac = float((q > 0).mean())
    info = {"rule": f"closed loop: requests wait for admission in more than "
                    f"{CLOSED_WAIT_FRACTION:g} of the window's steps"
                    + (" (decode engines' queue + the prefill pool's queue)" if pool is not None else ""),
            "frac_steps_with_waiting": frac, "steps": int(q.size)}
    if pool is not None:
        info["frac_steps_with_prefill_pool_waiting"] = float((pool > 0).mean())
    return frac > CLOSED_WAIT_FRACTION, info


def open_loop_saturation(res: SimResult, warmup_s: float) -> tuple[bool, dict[str, Any]]:
    """:func:`saturation`'s open-loop rules: the admission queue or the requests held grew over the window."""
    ok = ~res.rejected & np.isfinite(res.arrival_s)
    arr = np.sort(res.arrival_s[ok])
    adm = np.sort(res.admitted_s[ok][np.isfinite(res.admitted_s[ok])])
    fin = np.sort(res.finish_s[ok][np.isfinite(res.finish_s[ok])])
    t0 = float(warmup_s)
    t1 = float(min(res.sim_time_s, arr[-1])) if arr.size else t0
    n_arr = int(np.searchsorted(arr, t1, "right") - np.searchsorted(arr, t0, "left"))
    info: dict[str, Any] = {"rule": f"open loop: admission queue growth over [warmup, last arrival] > "
                                    f"max({OPEN_GROWTH_MIN}, {OPEN_GROWTH_FRACTION:g} x arrivals in it), or requests "
                                    f"held (arrived, not finished) grew over its late half by > max("
                                    f"{OPEN_GROWTH_FRACTION:g} x arrivals in it, {HELD_NOISE_SD:g} sd of a stable "
                                    f"engine's count)",
                            "window_start_s": t0, "window_end_s": t1, "arrivals_in_window": n_arr}
    if n_arr == 0:
        info["note"] = "no arrivals inside the measurement window"
        return False, info
    q0 = int(np.searchsorted(arr, t0, "left") - np.searchsorted(adm, t0, "left"))
    q1 = int(np.searchsorted(arr, t1, "right") - np.searchsorted(adm, t1, "right"))
    growth = q1 - q0
    span = t1 - t0
    n_adm = int(np.searchsorted(adm, t1, "right") - np.searchsorted(adm, t0, "left"))
    waiting = growth > max(OPEN_GROWTH_MIN, OPEN_GROWTH_FRACTION * n_arr)
    # held: H(tm-) counts arrivals and finishes before tm, H(t1) those up to t1 (a burst at tm itself is growth)
    tm = (t0 + t1) / 2
    h_mid = int(np.searchsorted(arr, tm, "left") - np.searchsorted(fin, tm, "left"))
    h_end = int(np.searchsorted(arr, t1, "right") - np.searchsorted(fin, t1, "right"))
    n_late = int(np.searchsorted(arr, t1, "right") - np.searchsorted(arr, tm, "left"))
    n_done = int(np.searchsorted(fin, t1, "right") - np.searchsorted(fin, tm, "left"))
    h_growth = h_end - h_mid
    h_limit = max(OPEN_GROWTH_FRACTION * n_late, HELD_NOISE_SD * math.sqrt(min(h_mid + h_end, n_late + n_done)))
    held = n_late > 0 and h_growth > h_limit
    late = t1 - tm
    in_win = ok & (res.arrival_s >= t0) & (res.arrival_s <= t1)
    wait = np.where(np.isfinite(res.admitted_s), res.admitted_s, res.sim_time_s)[in_win] - res.arrival_s[in_win]
    done = res.completed & ~res.rejected
    info.update(queue_start=q0, queue_end=q1, queue_growth=growth, growth_per_arrival=growth / n_arr,
                arrival_rate_rps=n_arr / span if span > 0 else None,
                admission_rate_rps=n_adm / span if span > 0 else None,
                window_mid_s=tm, arrivals_in_late_half=n_late, completions_in_late_half=n_done, held_mid=h_mid,
                held_end=h_end, held_growth=h_growth, held_growth_limit=h_limit,
                completion_rate_rps=n_done / late if late > 0 else None,
                held_end_by_place=held_by_place(res, t1), saturated_by=[k for k, v in (("waiting", waiting),
                                                                                       ("held", held)) if v],
                median_admission_wait_s=float(np.median(wait)),
                median_service_s=float(np.median(res.finish_s[done] - res.admitted_s[done])) if done.any() else None)
    return bool(waiting or held), info


def latency_stats(done: Mapping[str, np.ndarray], dt: np.ndarray, n_dec: np.ndarray,
                  gaps: np.ndarray | None = None) -> dict[str, float]:
    """Per-user speed and latency of the window's completed requests (``done``: their columns, a dict of arrays or
    a DataFrame), and ITL from the window's step durations ``dt`` and their decoding-request counts ``n_dec``, plus
    one sample per preemption gap that ended in the window (``gaps``: :func:`preemption_gaps`)."""
    if gaps is not None and len(gaps):
        dt, n_dec = np.concatenate([dt, gaps]), np.concatenate([n_dec, np.ones(len(gaps))])
    return {
    "tps_user_mean": _mean(np.asarray(done["tps_user"])),
    "tps_user_median": _pct(np.asarray(done["tps_user"]), 50),
    "tps_user_p10": _pct(np.asarray(done["tps_user"]), 10),
    "tps_user_p90": _pct(np.asarray(done["tps_user"]), 90),
    "tps_user_p99": _pct(np.asarray(done["tps_user"]), 99),
    "ttft_mean_s": _mean(np.asarray(done["ttft_s"])),
    "ttft_median_s": _pct(np.asarray(done["ttft_s"]), 50),
    "ttft_p10_s": _pct(np.asarray(done["ttft_s"]), 10),
    "ttft_p90_s": _pct(np.asarray(done["ttft_s"]), 90),
    "ttft_p99_s": _pct(np.asarray(done["ttft_s"]), 99),
    "tpot_mean_s": _mean(np.asarray(done["tpot_s"])),
    "tpot_median_s": _pct(np.asarray(done["tpot_s"]), 50),
    "tpot_p10_s": _pct(np.asarray(done["tpot_s"]), 10),
    "tpot_p90_s": _pct(np.asarray(done["tpot_s"]), 90),
    "tpot_p99_s": _pct(np.asarray(done["tpot_s"]), 99),
    # ITL per streamed chunk: every decoding request receives one chunk per step, so the step durations
    # weighted by the number of decoding requests are exactly the pooled per-request ITL samples.
    "itl_mean_s": _weighted_mean(dt, n_dec),
    "itl_median_s": _weighted_pct(dt, n_dec, 50),
    "itl_p10_s": _weighted_pct(dt, n_dec, 10),
    "itl_p90_s": _weighted_pct(dt, n_dec, 90),
    "itl_p99_s": _weighted_pct(dt, n_dec, 99),
    "e2e_mean_s": _mean(np.asarray(done["e2e_s"])),
    "e2e_median_s": _pct(np.asarray(done["e2e_s"]), 50),
    "e2e_p10_s": _pct(np.asarray(done["e2e_s"]), 10),
    "e2e_p90_s": _pct(np.asarray(done["e2e_s"]), 90),
    "e2e_p99_s": _pct(np.asarray(done["e2e_s"]), 99),
    }


def preemption_gaps(res: SimResult, in_win: np.ndarray) -> np.ndarray:
    """One ITL sample per preemption whose re-prefill streamed the request's next token in a window step: the
    steps it sat out, that one included, as one wait between two chunks (their summed dt); a step's n_decode
    leaves the request out of them. Empty without paged KV's gap record (SimResult.gap_steps)."""
    if res.gap_steps is None or not len(res.gap_steps):
        return np.zeros(0)
    dt = np.asarray(res.steps["dt"], float)
    return np.array([float(dt[p:q + 1].sum()) for p, q in np.asarray(res.gap_steps).tolist() if q >= 0 and in_win[q]])


def kv_and_ttft_parts(res: SimResult, st: dict[str, np.ndarray], done: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """Paged KV's preemption counts and a disaggregated run's TTFT split, when the run has them."""
    s: dict[str, Any] = {}
    if res.kv_policy == "paged" and res.preemptions is not None:
        # whole-run counts (not windowed): every preemption and the KV tokens it threw away
        s.update(kv_policy="paged", kv_page_tokens=int(res.kv_page_tokens),
                 kv_peak_used_pages=int(st["kv_pages"].max()) if len(st.get("kv_pages", ())) else 0,
                 num_preemptions=int(res.preemptions.sum()),
                 num_requests_preempted=int((res.preemptions > 0).sum()),
                 recomputed_tokens=int(res.recomputed_tokens.sum()))
    if res.disaggregated and res.ttft_queue_s is not None:
        s["disaggregated"] = True
        for part in ("queue", "prefill", "transfer", "decode_wait", "first_step"):
            if f"ttft_{part}_s" not in done:
                continue
            x = np.asarray(done[f"ttft_{part}_s"])
            s[f"ttft_{part}_mean_s"], s[f"ttft_{part}_median_s"] = _mean(x), _pct(x, 50)
            s[f"ttft_{part}_p99_s"] = _pct(x, 99)
    return s


def summarize(res: SimResult, *, policy: str, load: Any, warmup_s: float, closed_loop: bool) -> dict[str, Any]:
    """The run's summary (summary.json): throughput, per-user speed, latency percentiles, verify length, tau."""
    end = res.sim_time_s
    window = end - warmup_s
    if not window > 0:
        raise ConfigError("config", "warmup_s", f"warm-up {warmup_s:g} s leaves no measurement window (the run "
                          f"ended at {end:.3f} s): lower --warmup")
    st = res.steps
    t_end = st["t_start"] + st["dt"]
    in_win = t_end > warmup_s
    # Tokens from a step that straddles the warm-up boundary count pro rata.
    frac = np.clip((t_end - warmup_s) / np.where(st["dt"] > 0, st["dt"], 1.0), 0.0, 1.0)
    out_tokens = float((st["emitted"] * frac).sum())
    req = request_columns(res)
    keep = req["completed"] & (req["arrival_s"] >= warmup_s)  # rejected requests never complete
    done = {k: v[keep] for k, v in req.items()}
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
        "num_requests_completed": int(keep.sum()),
        "num_requests_completed_total": int(req["completed"].sum()),
        "num_requests_rejected": int(req["rejected"].sum()),
        "rejected_by_reason": {r: int((req["reject_reason"] == r).sum()) for r in REJECT_REASONS.values()},
        "output_throughput_tok_s": out_tokens / window,
        "request_throughput_req_s": int(keep.sum()) / window,
        **latency_stats(done, st["dt"][in_win], n_dec, preemption_gaps(res, in_win)),
        "mean_verify_len": float(st["verify_tokens"][in_win].sum() / dec_steps) if dec_steps else float("nan"),
        "tau": _tau(st, in_win, dec_steps),
        "tau_unclipped": _tau_unclipped(st, in_win, dec_steps),
        "mean_batch_tokens": _mean(st["M"][in_win].astype(float)),
        "mean_running": _mean(st["n_running"][in_win].astype(float)),
        "num_steps": int(in_win.sum()),
        "saturated": sat,
        "saturation_detail": sat_info,
        "kv_capacity_tokens": res.kv_capacity_tokens,
        "kv_peak_used_tokens": int(st["kv_used"].max()) if len(st["kv_used"]) else 0,
        "block_size": res.block_size,
        "drafter": res.drafter,
        "replicas": int(res.replicas),
        "dp_ranks": int(res.dp_ranks),
    }
    s.update(kv_and_ttft_parts(res, st, done))
    if res.replicas > 1:
        # Per-replica view of the same window: how evenly the router spread the load.
        s["per_replica"] = [_replica_summary(res.for_replica(r), r, warmup_s, closed_loop)
                            for r in range(res.replicas)]
    return {k: _clean(v) for k, v in s.items()}


def _replica_summary(res: SimResult, r: int, warmup_s: float, closed_loop: bool) -> dict[str, Any]:
    """A few of summarize()'s figures for replica ``r`` alone (same definitions, same window)."""
    s = summarize(res, policy="", load=None, warmup_s=warmup_s, closed_loop=closed_loop)
    return {"replica": r, "num_requests_routed": s["num_requests_issued"],
            **{k: s[k] for k in ("num_requests_completed", "output_throughput_tok_s", "tps_user_median",
                                 "ttft_p99_s", "mean_running", "num_steps")}}


def _tau(st: dict[str, np.ndarray], in_win: np.ndarray, dec_steps: float) -> float:
    """Tokens emitted per decoding request per decode step (first tokens from prefill excluded)."""
    return float(st["decode_emitted"][in_win].sum() / dec_steps) if dec_steps else float("nan")


def _tau_unclipped(st: dict[str, np.ndarray], in_win: np.ndarray, dec_steps: float) -> float:
    """Accepted prefix + bonus per decoding request per decode step, sum(a + 1) / steps, before the last step of
    each request is clipped at its output length (``tau`` counts only the tokens emitted). a = min(verified, true
    accepted prefix), so this is the acceptance length DeepSpec's evaluator pools over proposals."""
    if not dec_steps or "accepted" not in st:      # a step log without accepted counts (hand-built results)
        return float("nan")
    return float((np.asarray(st["accepted"])[in_win].sum() + dec_steps) / dec_steps)


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
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]      # e.g. per_replica: a replica that finished nothing has null metrics
    return v


def bench_serve_json(res: SimResult, summary: dict[str, Any], *, model_id: str, request_rate: Any,
                     burstiness: Any, max_concurrency: Any, **options: Any) -> dict[str, Any]:
    """The run shaped exactly as `vllm bench serve --save-result` writes it (keys, units, meanings):
    see :mod:`dsparksim.results.bench_json`. Prompts are the requests issued in the measurement window."""

    d = bench_result(res, warmup_s=float(summary["warmup_s"]), duration_s=float(summary["window_s"]),
                     model_id=model_id, request_rate=request_rate, burstiness=burstiness,
                     max_concurrency=max_concurrency, **options)
    return {k: (_clean_list(v) if isinstance(v, list) else v if k == "itls" else _clean(v)) for k, v in d.items()}


def _clean_list(v: list) -> list:
    """``[_clean(x) for x in v]``, without the call for a str, an int or a float that is not NaN (kept as is)."""
    kinds = set(map(type, v))
    if kinds <= {str, int} or (kinds == {float} and not any(map(math.isnan, v))):
        return list(v)      # every item kept as is (a long run's lists: 10^4-10^5 numbers)
    return [x if (t := type(x)) is str or t is int or (t is float and x == x) else _clean(x) for x in v]
