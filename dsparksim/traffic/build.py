"""Turn a TrafficConfig into a Workload (arrivals, lengths, domains) with full provenance in its metadata."""
from __future__ import annotations

import numpy as np

from dsparksim.errors import ConfigError, InputError
from dsparksim.traffic.arrivals import arrival_times, interarrival_cv
from dsparksim.traffic.base import Workload
from dsparksim.traffic.config import DEFAULT_LENGTHS, OPEN_SYNTHETIC, TrafficConfig, parse_domain
from dsparksim.traffic.readers import DOMAINS, TraceTable, read_trace
from dsparksim.traffic.sources import resolve


def _file_meta(tab: TraceTable, label: str) -> dict:
    return {"source": label, "path": tab.source, "format": tab.format, "sha256_16": tab.sha256,
            "rows_available": len(tab)}


def mooncake_groups(arrival_s: np.ndarray, spread: bool) -> tuple[np.ndarray, dict]:
    """Replay times for Mooncake's ~3 s timestamp groups (rows sharing one timestamp form a group).

    spread=False: every request of a group at the group's timestamp. spread=True: the group's n requests evenly
    over [t_g, t_next): t_g + j * (t_next - t_g) / n, file order kept; the last group uses the median gap.
    """
    starts = np.flatnonzero(np.r_[True, np.diff(arrival_s) > 0])
    t_group = arrival_s[starts]
    sizes = np.diff(np.r_[starts, len(arrival_s)])
    gaps = np.diff(t_group)
    info = {"groups": int(len(starts)), "max_group_size": int(sizes.max()),
            "median_group_gap_s": float(np.median(gaps)) if len(gaps) else None}
    if not spread:
        info["replay"] = "mooncake groups fired at once (each request at its group's timestamp)"
        return arrival_s.copy(), info
    if not len(gaps):
        raise ConfigError("TrafficConfig", "mooncake_spread", "the trace has a single timestamp group, so there "
                          "is no gap to spread it over")
    gaps = np.r_[gaps, np.median(gaps)]
    g = np.repeat(np.arange(len(starts)), sizes)
    j = np.arange(len(arrival_s)) - starts[g]
    info["replay"] = ("mooncake groups spread evenly over the gap to the next group (t_g + j*gap/n; last group "
                      "over the median gap)")
    info["last_group_gap_s"] = float(gaps[-1])
    return t_group[g] + j * gaps[g] / sizes[g], info


def _domains(cfg: TrafficConfig, n: int, tab: TraceTable, rows: np.ndarray, rng: np.random.Generator):
    weights = parse_domain(cfg.domain)
    if weights is None:
        if tab.domain is None:
            raise ConfigError("TrafficConfig", "domain", f"'trace' needs a 'domain' column in {tab.source}, which "
                              "has none; give a domain or a mix instead")
        dom = np.asarray(tab.domain[rows], dtype=object)
        meta = {"spec": "trace", "column": "domain", "source": tab.source}
    elif max(weights.values()) == 1.0:
        dom = np.full(n, max(weights, key=weights.get), dtype=object)
        meta = {"spec": cfg.domain, "weights": weights}
    else:
        dom = rng.choice(np.array(DOMAINS, dtype=object), size=n, p=[weights[d] for d in DOMAINS])
        meta = {"spec": cfg.domain, "weights": weights}
    meta["counts"] = {d: int(np.sum(dom == d)) for d in DOMAINS}
    return dom, meta


def _check_limits(cfg: TrafficConfig, tab: TraceTable, rows: np.ndarray) -> None:
    for limit, arr, col, name in ((cfg.max_prompt_tokens, tab.prompt_tokens, tab.columns[0], "max_prompt_tokens"),
                                  (cfg.max_output_tokens, tab.output_tokens, tab.columns[1], "max_output_tokens")):
        if limit is None:
            continue
        over = arr[rows] > limit
        if over.any():
            k = int(np.argmax(over))
            raise InputError(tab.source, col, f"request {k} of the workload has {int(arr[rows[k]])} tokens > "
                             f"{name}={limit} ({int(over.sum())} of {len(rows)} requests exceed it; nothing is "
                             "clipped or dropped: raise the limit or use another length source)",
                             line=int(tab.line[rows[k]]))


def _lengths(cfg: TrafficConfig, n: int, rng: np.random.Generator) -> tuple[TraceTable, np.ndarray, dict]:
    path, label = resolve(cfg.lengths or DEFAULT_LENGTHS, "lengths")
    tab = read_trace(path)
    rows = rng.integers(0, len(tab), size=n)
    meta = _file_meta(tab, label) | {"sampling": "uniform with replacement (rng)"}
    return tab, rows, meta


def _arrival_stats(t: np.ndarray) -> dict:
    gaps = np.diff(t)
    span = float(t[-1] - t[0]) if len(t) else 0.0
    return {"first_arrival_s": float(t[0]) if len(t) else None, "last_arrival_s": float(t[-1]) if len(t) else None,
            "measured_rate_rps": (len(t) - 1) / span if span > 0 else None,
            "measured_cv": float(gaps.std() / gaps.mean()) if len(gaps) > 1 and gaps.mean() > 0 else None}


def build_workload(cfg: TrafficConfig, rng: np.random.Generator) -> Workload:
    """Requests for one run. Draws from ``rng`` in a fixed order (arrivals, lengths, domains): same seed, same
    workload."""
    meta: dict = {"mode": cfg.mode, "time_scale": cfg.time_scale, "num_requests": cfg.num_requests,
                  "duration_s": cfg.duration_s, "max_prompt_tokens": cfg.max_prompt_tokens,
                  "max_output_tokens": cfg.max_output_tokens}
    arrival = None
    if cfg.mode == "closed":
        n = cfg.num_requests or cfg.pool_size
        meta |= {"process": "closed", "concurrency": cfg.concurrency, "pool_size": n,
                 "pool_note": "a run that uses up the pool ends there; rows are never recycled"}
        tab, rows, meta["lengths"] = _lengths(cfg, n, rng)
    elif cfg.mode in OPEN_SYNTHETIC:
        arrival = arrival_times(cfg.mode, cfg.rate, rng, burstiness=cfg.burstiness, num_requests=cfg.num_requests,
                                duration_s=None if cfg.duration_s is None else cfg.duration_s * cfg.time_scale)
        arrival = arrival / cfg.time_scale
        n = len(arrival)
        meta |= {"process": cfg.mode, "rate_rps": cfg.rate, "effective_rate_rps": cfg.rate * cfg.time_scale,
                 "burstiness": cfg.burstiness if cfg.mode == "gamma" else None,
                 "cv": interarrival_cv(cfg.mode, cfg.burstiness),
                 "gamma_parametrisation": "shape=burstiness, scale=1/(rate*burstiness) (vllm bench serve)"
                 if cfg.mode == "gamma" else None,
                 "requests": n,
                 "stopped_by": "num_requests" if cfg.num_requests is not None and n == cfg.num_requests
                 else "duration_s"}
        tab, rows, meta["lengths"] = _lengths(cfg, n, rng)
    else:
        arrival, tab, rows = _replay(cfg, meta)
        n = len(arrival)
        if cfg.lengths is not None:   # trace timestamps, lengths from elsewhere
            tab, rows, meta["lengths"] = _lengths(cfg, n, rng)
        else:
            meta["lengths"] = {"source": "the trace's own rows", "path": tab.source}
    if arrival is not None:
        meta |= _arrival_stats(arrival)
    _check_limits(cfg, tab, rows)
    dom, meta["domain"] = _domains(cfg, n, tab, rows, rng)
    return Workload(prompt_tokens=tab.prompt_tokens[rows].astype(np.int64),
                    output_tokens=tab.output_tokens[rows].astype(np.int64), domain=dom,
                    arrival_s=arrival, concurrency=cfg.concurrency if cfg.mode == "closed" else None, metadata=meta)


def _replay(cfg: TrafficConfig, meta: dict) -> tuple[np.ndarray, TraceTable, np.ndarray]:
    path, label = resolve(cfg.trace, "trace")
    tab = read_trace(path, cfg.trace_format)
    if tab.arrival_s is None:
        raise InputError(tab.source, None, "has no timestamps (length-only format); it cannot be replayed — use it "
                         "as `lengths` with a synthetic arrival process")
    if tab.format == "mooncake":
        t, info = mooncake_groups(tab.arrival_s, cfg.mooncake_spread)
    else:
        if cfg.mooncake_spread:
            raise ConfigError("TrafficConfig", "mooncake_spread", f"only applies to Mooncake traces; {tab.source} is "
                              f"{tab.format!r}")
        t, info = tab.arrival_s.copy(), {"replay": "exact timestamps, relative to the first row"}
    t = t / cfg.time_scale
    n_total = len(t)
    if cfg.num_requests is not None and cfg.num_requests > n_total:
        raise ConfigError("TrafficConfig", "num_requests", f"{cfg.num_requests} requested but {tab.source} has only "
                          f"{n_total} rows (a trace is never looped or extrapolated)")
    n = n_total if cfg.duration_s is None else int(np.searchsorted(t, cfg.duration_s, side="left"))
    stopped = "duration_s" if n < n_total else "end of trace"
    if cfg.num_requests is not None and cfg.num_requests <= n:
        n, stopped = cfg.num_requests, "num_requests"
    meta |= {"process": "trace", "trace": _file_meta(tab, label) | info | {
        "time_origin": tab.time_origin, "rows_used": n, "rows_total": n_total, "stopped_by": stopped,
        "trace_span_s": float(t[-1])}}
    if cfg.duration_s is not None and t[-1] < cfg.duration_s:
        meta["trace"]["note"] = (f"the trace ends at {t[-1]:.1f} s (after time_scale), before duration_s="
                                 f"{cfg.duration_s}")
    return t[:n], tab, np.arange(n)
