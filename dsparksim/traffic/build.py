"""Turn a TrafficConfig into a Workload (arrivals, lengths, domains) with full provenance in its metadata."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from dsparksim.errors import ConfigError, InputError
from dsparksim.traffic.arrivals import interarrival_cv, interarrivals
from dsparksim.traffic.base import (CHUNK, STREAM_DOMAIN, STREAM_GAP, STREAM_ROW, LazyWorkload, Workload,
                                    expected_count, keyed_rng)
from dsparksim.traffic.config import DEFAULT_LENGTHS, TrafficConfig, parse_domain
from dsparksim.traffic.readers import AZURE_COLUMNS, DOMAINS, MOONCAKE_KEYS, TraceTable, header_columns, read_trace
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


def _domain_source(cfg: TrafficConfig, tab: TraceTable, key: int):
    """(domains(block, rows) -> object array, metadata). Mixed domains are drawn from the keyed DOMAIN stream."""
    weights = parse_domain(cfg.domain)
    if weights is None:
        if tab.domain is None:
            raise ConfigError("TrafficConfig", "domain", f"'trace' needs a 'domain' column in {tab.source}, which "
                              "has none; give a domain or a mix instead")
        col = np.asarray(tab.domain, dtype=object)
        return (lambda b, rows: col[rows]), {"spec": "trace", "column": "domain", "source": tab.source}
    meta = {"spec": cfg.domain, "weights": weights}
    if cfg.domain_drift is not None:
        return _drift_source(cfg, weights, key), meta | {"drift": {
            "mix_b": parse_domain(cfg.domain_drift[0]), "from_request": cfg.domain_drift[1],
            "to_request": cfg.domain_drift[2], "how": "weights linear in the request index between the two; domain "
                                                      "= inverse CDF (math, code, chat) of the request's keyed uniform"}}
    if max(weights.values()) == 1.0:
        only = max(weights, key=weights.get)
        return (lambda b, rows: np.full(len(rows), only, dtype=object)), meta
    names, p = np.array(DOMAINS, dtype=object), [weights[d] for d in DOMAINS]
    return (lambda b, rows: keyed_rng(key, STREAM_DOMAIN, b).choice(names, size=CHUNK, p=p)[:len(rows)]), meta


def drift_weights(a: dict, b: dict, i: np.ndarray, i0: int, i1: int) -> np.ndarray:
    """(n, 3) domain weights (DOMAINS order) of requests i: mix a before i0, b from i1, linear in between."""
    f = (np.asarray(i) >= i1).astype(float) if i1 <= i0 else np.clip((np.asarray(i) - i0) / (i1 - i0), 0.0, 1.0)
    wa, wb = np.array([a[d] for d in DOMAINS]), np.array([b[d] for d in DOMAINS])
    return (1.0 - f)[:, None] * wa[None, :] + f[:, None] * wb[None, :]


def _drift_source(cfg: TrafficConfig, a: dict, key: int):
    b = parse_domain(cfg.domain_drift[0])
    _, i0, i1 = cfg.domain_drift
    names = np.array(DOMAINS, dtype=object)

    def domains(blk: int, rows) -> np.ndarray:
        n = len(rows)
        u = keyed_rng(key, STREAM_DOMAIN, blk).random(CHUNK)[:n]
        w = drift_weights(a, b, blk * CHUNK + np.arange(n), i0, i1)
        return names[np.minimum((u[:, None] >= np.cumsum(w, axis=1)).sum(axis=1), len(DOMAINS) - 1)]
    return domains


def _check_limits(cfg: TrafficConfig, tab: TraceTable, rows: np.ndarray, what: str) -> None:
    for limit, arr, col, name in ((cfg.max_prompt_tokens, tab.prompt_tokens, tab.columns[0], "max_prompt_tokens"),
                                  (cfg.max_output_tokens, tab.output_tokens, tab.columns[1], "max_output_tokens")):
        if limit is None:
            continue
        over = arr[rows] > limit
        if over.any():
            k = int(np.argmax(over))
            raise InputError(tab.source, col, f"{what} {k} has {int(arr[rows[k]])} tokens > "
                             f"{name}={limit} ({int(over.sum())} of {len(rows)} exceed it; nothing is "
                             "clipped or dropped: raise the limit or use another length source)",
                             line=int(tab.line[rows[k]]))


def mean_lengths(cfg: TrafficConfig) -> tuple[float, float]:
    """The mean prompt and output length a run of ``cfg`` draws: the random dataset's (uniform over
    [max(1, int(R*L)), L]), else its length table's rows' (--lengths, a replayed trace's own rows, the default
    sample), each row equally likely."""
    if cfg.dataset_name == "random":
        return tuple((max(1, int(L * cfg.range_ratio)) + L) / 2 for L in (cfg.input_len, cfg.output_len))
    own = cfg.lengths is None and cfg.trace is not None
    path, _ = resolve(cfg.trace if own else cfg.lengths or DEFAULT_LENGTHS, "trace" if own else "lengths")
    tab = read_trace(path, cfg.trace_format if own else None)
    return float(np.mean(tab.prompt_tokens)), float(np.mean(tab.output_tokens))


def _length_source(cfg: TrafficConfig, key: int):
    """(table, rows(block, n), metadata): rows resampled uniformly with replacement from the keyed ROW stream."""
    path, label = resolve(cfg.lengths or DEFAULT_LENGTHS, "lengths")
    tab = read_trace(path)
    # Any row may be drawn by some request, so every row must respect the limits (checked before any run).
    _check_limits(cfg, tab, np.arange(len(tab)), "row")
    size = len(tab)
    meta = _file_meta(tab, label) | {"sampling": "uniform with replacement; request i's row from keyed block "
                                                  f"i // {CHUNK} of the seed's ROW stream"}
    return tab, (lambda b, n: keyed_rng(key, STREAM_ROW, b).integers(0, size, CHUNK)[:n]), meta


class _Support:
    """The length 'table' of the random dataset: its largest prompt and output (the rows are never read)."""

    def __init__(self, p: int, o: int) -> None:
        self.prompt_tokens, self.output_tokens = np.array([p], np.int64), np.array([o], np.int64)
        self.domain = None
        self.source = "random dataset"


def _random_source(cfg: TrafficConfig, key: int):
    """(support, rows, lengths(block, n), metadata) of the random dataset: prompt and output lengths independent,
    uniform over the integers [max(1, int(R*L)), L], request i's from keyed block i // CHUNK of the ROW stream
    (SGLang bench_serving sample_random_requests: np.random.randint(int(L * R), L + 1); the 1 keeps a length)."""
    Li, Lo, R = cfg.input_len, cfg.output_len, cfg.range_ratio
    lo_i, lo_o = max(1, int(Li * R)), max(1, int(Lo * R))
    for limit, L, name in ((cfg.max_prompt_tokens, Li, "max_prompt_tokens"),
                           (cfg.max_output_tokens, Lo, "max_output_tokens")):
        if limit is not None and L > limit:
            raise ConfigError("TrafficConfig", name, f"the random dataset draws up to {L} tokens > {name}={limit}")

    def lengths(b: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        g = keyed_rng(key, STREAM_ROW, b)
        p = g.integers(lo_i, Li + 1, CHUNK)
        o = g.integers(lo_o, Lo + 1, CHUNK)
        return p[:n], o[:n]

    meta = {"source": "random", "random_input_len": Li, "random_output_len": Lo, "random_range_ratio": R,
            "prompt_range": [lo_i, Li], "output_range": [lo_o, Lo],
            "sampling": "independent uniform integers per request from keyed block i // "
                        f"{CHUNK} of the seed's ROW stream (SGLang/vLLM<=0.10 random dataset: [int(R*L), L])"}
    return _Support(Li, Lo), (lambda b, n: np.arange(n)), lengths, meta


def _arrival_stats(t: np.ndarray) -> dict:
    gaps = np.diff(t)
    span = float(t[-1] - t[0]) if len(t) else 0.0
    return {"first_arrival_s": float(t[0]) if len(t) else None, "last_arrival_s": float(t[-1]) if len(t) else None,
            "measured_rate_rps": (len(t) - 1) / span if span > 0 else None,
            "measured_cv": float(gaps.std() / gaps.mean()) if len(gaps) > 1 and gaps.mean() > 0 else None}


def _counts(dom: np.ndarray) -> dict:
    return {d: int(np.sum(dom == d)) for d in DOMAINS}


def build_workload(cfg: TrafficConfig, rng: np.random.Generator) -> Workload | LazyWorkload:
    """Requests for one run. One integer drawn from ``rng`` keys every request stream (see traffic.base): same
    seed, same requests; request i never depends on how many others there are.

    Closed loop and synthetic arrivals are generated lazily, block by block, as the engine consumes them.
    """
    if (cfg.total_requests or 0) > MAX_EXPECTED_ARRIVALS:   # the memory bound a rate x duration keeps
        raise ConfigError("TrafficConfig", "num_requests", f"{cfg.total_requests:,} requests (with the warm-up) are "
                          f"above the limit of {MAX_EXPECTED_ARRIVALS:,} requests per run")
    key = int(rng.integers(0, 2**63))
    meta: dict = {"mode": cfg.mode, "time_scale": cfg.time_scale, "num_requests": cfg.num_requests,
                  "duration_s": cfg.duration_s, "max_prompt_tokens": cfg.max_prompt_tokens,
                  "max_output_tokens": cfg.max_output_tokens, "request_streams":
                  f"keyed per request: SeedSequence([key, stream, i // {CHUNK}])"}
    if cfg.mode == "trace":
        return _replay_workload(cfg, meta, key)
    lengths = None
    if cfg.dataset_name == "random":
        tab, rows, lengths, meta["lengths"] = _random_source(cfg, key)
        if parse_domain(cfg.domain) is None:
            raise ConfigError("TrafficConfig", "domain", "'trace' takes the domain column of a length file; the "
                              "random dataset has none: give a domain or a mix")
    else:
        tab, rows, meta["lengths"] = _length_source(cfg, key)
    domains, meta["domain"] = _domain_source(cfg, tab, key)

    def dom_counts(w: Workload) -> dict:
        return {"domain": meta["domain"] | {"counts": _counts(w.domain)}}

    common = dict(prompt_table=tab.prompt_tokens, output_table=tab.output_tokens, rows=rows, domains=domains,
                  lengths=lengths, warmup=cfg.num_warmup_prompts)
    meta["num_warmup_prompts"] = cfg.num_warmup_prompts
    meta["max_concurrency"] = cfg.max_concurrency
    if cfg.mode == "closed":
        limit = cfg.total_requests or cfg.pool_size
        meta |= {"process": "closed", "concurrency": cfg.concurrency, "pool_size": limit,
                 "user_steps": None if cfg.user_steps is None else [list(x) for x in cfg.user_steps],
                 "pool_note": "requests are generated as users need them; None = unlimited (the duration ends the "
                              "run); a run that uses up a limit ends there, rows are never recycled"}
        return LazyWorkload(**common, concurrency=cfg.concurrency, limit=limit, metadata=meta, finish_meta=dom_counts,
                            user_steps=cfg.user_steps)
    horizon = cfg.duration_s
    if cfg.num_requests is None:
        check_expected_arrivals(cfg.rate * cfg.time_scale, cfg.duration_s)
    rate, burst = cfg.rate, cfg.burstiness
    interarrivals(cfg.mode, rate, 0, rng, burst)  # validates the process parameters
    meta |= {"process": cfg.mode, "rate_rps": rate, "effective_rate_rps": rate * cfg.time_scale,
             "burstiness": burst if cfg.mode == "gamma" else None, "cv": interarrival_cv(cfg.mode, burst),
             "gamma_parametrisation": "shape=burstiness, scale=1/(rate*burstiness) (vllm bench serve)"
             if cfg.mode == "gamma" else None}

    def finish(w: Workload) -> dict:
        n = len(w)
        return dom_counts(w) | {"requests": n, "stopped_by": "num_requests" if cfg.num_requests is not None and
                                n == cfg.total_requests else "duration_s"} | _arrival_stats(w.arrival_s)

    exact = (lambda i: i.astype(np.float64) / rate) if cfg.mode == "constant" else None
    return LazyWorkload(**common, gaps=lambda b, n: interarrivals(cfg.mode, rate, CHUNK, keyed_rng(
        key, STREAM_GAP, b), burst)[:n], exact_times=exact, time_scale=cfg.time_scale, horizon=horizon,
        limit=cfg.total_requests, concurrency=None, metadata=meta, finish_meta=finish)


# Memory bound (DESIGN: memory stays bounded for any rate and duration): an open-loop run whose expected number of
# arrivals exceeds this is refused before it starts (measured in a closed loop: ~660 bytes of simulator state per
# request, ~2.4 KiB at `dsparksim run`'s peak with its outputs, so 2M is ~1.2-4.8 GiB; docs/outputs.md).
MAX_EXPECTED_ARRIVALS = 2_000_000


def check_expected_arrivals(rate: float, duration_s: float) -> None:
    """ConfigError when rate x duration asks for more arrivals than MAX_EXPECTED_ARRIVALS."""
    n = expected_count(rate, duration_s)
    if n > MAX_EXPECTED_ARRIVALS:
        raise ConfigError("TrafficConfig", "rate", f"{rate:g} req/s over {duration_s:g} s is {n:.3g} expected "
                          f"arrivals, above the limit of {MAX_EXPECTED_ARRIVALS:,} requests per run: lower the rate "
                          "(--rate / --time-scale) or the duration")


def _replay_workload(cfg: TrafficConfig, meta: dict, key: int) -> Workload:
    arrival, tab, rows = _replay(cfg, meta)
    n = len(arrival)
    meta |= _arrival_stats(arrival)
    if cfg.lengths is not None:   # trace timestamps, lengths from elsewhere
        tab, row_of, meta["lengths"] = _length_source(cfg, key)
        rows = np.concatenate([row_of(b, min(CHUNK, n - b * CHUNK)) for b in range(-(-n // CHUNK))]) if n else \
            np.zeros(0, np.int64)
    else:
        meta["lengths"] = {"source": "the trace's own rows", "path": tab.source}
        _check_limits(cfg, tab, rows, "request")
    domains, meta["domain"] = _domain_source(cfg, tab, key)
    dom = np.concatenate([domains(b, rows[b * CHUNK:(b + 1) * CHUNK]) for b in range(-(-n // CHUNK))]) if n else \
        np.zeros(0, object)
    meta["domain"]["counts"] = _counts(dom)
    if tab.session is not None:
        meta["trace"]["session_ids"] = ("per row, the first hash_id not shared by every row (prefix affinity "
                                         "for the session router)")
    return Workload(prompt_tokens=tab.prompt_tokens[rows].astype(np.int64),
                    output_tokens=tab.output_tokens[rows].astype(np.int64), domain=dom, arrival_s=arrival,
                    metadata=meta, session=None if tab.session is None else tab.session[:n])


def no_timestamps_error(path: str | Path, tab: TraceTable) -> InputError:
    """The error for a length-only file given as a trace to replay: it names the file, the columns it has, the
    timestamp column a replay needs, and the ``--lengths`` flag (spec key ``lengths``) that takes such a file."""
    cols = ", ".join(header_columns(path)) or ", ".join(tab.columns)
    return InputError(tab.source, AZURE_COLUMNS[0], f"missing: this length-only file (columns {cols}) has no "
                      f"timestamp column, so it cannot be replayed as --trace: a replayed CSV needs a "
                      f"{AZURE_COLUMNS[0]} column beside {AZURE_COLUMNS[1]} and {AZURE_COLUMNS[2]} (Azure 2023 "
                      f"format), a JSONL trace a '{MOONCAKE_KEYS[0]}' key (Mooncake); to draw request lengths from "
                      f"it, pass it as --lengths {tab.source} (spec key lengths) with a load such as --rate or "
                      "--concurrency")


def _replay(cfg: TrafficConfig, meta: dict) -> tuple[np.ndarray, TraceTable, np.ndarray]:
    path, label = resolve(cfg.trace, "trace")
    tab = read_trace(path, cfg.trace_format)
    if tab.arrival_s is None:
        raise no_timestamps_error(path, tab)
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
