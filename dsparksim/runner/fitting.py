"""Fitting a cost profile from the timed cells of `dsparksim measure` (:mod:`.timing`): the verify staircase, the
per-request and context terms, the drafters, the floor and the prefill terms. numpy/scipy only (no torch), so
:mod:`.refit` and the tests can re-fit recorded cells anywhere."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from scipy.optimize import isotonic_regression, nnls

from dsparksim.cost.profile import FORMAT, profile_from_dict
from dsparksim.errors import ConfigError
from dsparksim.runner.drift import Bracket

if TYPE_CHECKING:
    from dsparksim.runner.grid import MeasureConfig

class MeasurementError(ConfigError):
    """A measurement that must not be written (flat, inert, or nothing measured)."""


def fit_prefill_only(recs: list[dict]) -> dict[str, Any] | None:
    """``prefill.only`` from the prefill-only cells (n_dec = 0): NNLS of their whole step time less the drafter's
    part on [1, prompt tokens, query-key pairs, chunks]. None without such cells or when the fit leaves no
    positive per-step part (a step is never free)."""
    rows = [r for r in recs if r.get("n_dec", 4) == 0]
    if len(rows) < 4:
        return None
    A = np.array([[1.0, r["tokens"], r["qk"], r["k"]] for r in rows])
    y = np.array([r["d_step"] - r["d_draft"] for r in rows])
    w = 1.0 / np.maximum(np.abs(y), 1e-9)            # relative errors, as the target fit
    x, _ = nnls(A * w[:, None], y * w)
    if not x[0] > 0:
        return None
    return {"seconds_per_step": float(x[0]), "seconds_per_token": float(x[1]),
            "seconds_per_query_key": float(x[2]), "seconds_per_chunk": float(x[3])}


def prefill_section(pfit: dict[str, Any], note: str) -> dict[str, Any]:
    """The profile's ``prefill`` object from a :func:`fit_prefill` result: the three base terms, the per-decode
    terms when > 0 (absent = 0) and ``only`` when fitted."""
    out = {k: pfit[k] for k in ("seconds_per_token", "seconds_per_query_key", "seconds_per_chunk")}
    out["note"] = note
    for k in ("seconds_per_token_per_decode", "seconds_per_chunk_per_decode"):
        if pfit[k] > 0:
            out[k] = pfit[k]
    if pfit.get("only") is not None:
        out["only"] = pfit["only"]
        out["note"] += ("; prefill-only steps: prefill.only, NNLS of the prefill-only cells' whole step time on "
                        "[1, tokens, query-key pairs, chunks]")
    return out


def fit_prefill(recs: list[dict], prof: dict, relative: bool = True) -> dict[str, Any]:
    """NNLS of what the chunks add to a step beyond the verify term's own growth (target + host) on prompt
    tokens, query-key pairs, chunks, and tokens and chunks times the decoding requests beside them (when the
    cells have more than one n); the drafter's part per prompt token (median). The prefill-only cells (n_dec = 0)
    are left to :func:`fit_prefill_only` when there are enough of them (a step with no decoding request is priced
    by ``prefill.only``, not by the verify term: the decode-shaped staircase at a chunk's M alone was 1.1-1.8x a
    measured prefill-only step here, which no non-negative prefill term can take back); ``"only"`` is that fit
    (None without it).

    ``relative`` (default): each cell weighted by 1 / its added time, i.e. least squares in relative error, as the
    target and prefill-only fits. In absolute seconds the few 2 x 128-token cells after a 512-token prefix ruled
    the fit and 16-32-token chunks (what short-prompt traffic schedules) were priced 15-50% low on this CPU
    (2026-12-02: the cells' mean bias +4.9% -> +1.5%). A cell's weight is capped at twice the median cell's, so one
    noisy cell timed at ~0 s cannot take the fit over."""
    only = fit_prefill_only(recs)
    if only is not None:
        recs = [r for r in recs if r.get("n_dec", 4) != 0]
    p = profile_from_dict(prof | {"name": "fit", "metadata": {k: "-" for k in ("device", "model", "source",
                                                                                  "method")}})
    tok = np.array([r["tokens"] for r in recs], float)
    qk = np.array([r["qk"] for r in recs], float)
    ch = np.array([r["k"] for r in recs], float)
    nd = np.array([r.get("n_dec", 4) for r in recs], float)
    # a prefill-only record (M0 = 0) is a whole step: its verify term is the staircase at the chunks' M
    dv = np.array([float(p.verify_time(r["M1"], r["kv1"]) - (p.verify_time(r["M0"], r["kv0"]) if r["M0"] else 0.0))
                   for r in recs])
    resid = np.array([r["d_step"] - r["d_draft"] for r in recs]) - dv
    cols = [tok, qk, ch] + ([tok * nd, ch * nd] if len(np.unique(nd)) > 1 else [])
    A = np.stack(cols, 1)
    if relative:
        # a noisy cell can time its chunks at ~0 s (or below): its weight is capped at 2x the median cell's
        d = np.abs(np.array([r["d_step"] for r in recs], float))
        w = 1.0 / np.maximum(d, 0.5 * max(float(np.median(d)), 1e-12))
        A, resid = A * w[:, None], resid * w
    x, _ = nnls(A, resid)
    a, b, e = x[:3]
    tn, cn = (x[3], x[4]) if len(x) > 3 else (0.0, 0.0)
    return {"seconds_per_token": float(a), "seconds_per_query_key": float(b), "seconds_per_chunk": float(e),
            "seconds_per_token_per_decode": float(tn), "seconds_per_chunk_per_decode": float(cn),
            "decode_rows": sorted({int(v) for v in nd}), "only": only,
            "drafter_s_per_token": float(max(0.0, np.median([r["d_draft"] / r["tokens"] for r in recs]))),
            "cells": len(recs)}


def median_by(keys: np.ndarray, vals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-key medians. Medians of times throughout the fit (means of KV and query-key counts): a spike in one of
    a cell's few steps moves a mean by 10%, and validation takes each real step's median over repeated runs too."""
    u = np.unique(keys)
    return u, np.array([np.median(vals[keys == k]) for k in u])


def cell_table(r: dict[str, np.ndarray], time_key: str) -> dict[str, np.ndarray]:
    """One row per measured (n, L, context) cell: ``key`` (n, L, ctx), the median of ``time_key`` and the mean
    KV tokens read (and query-key pairs, when recorded) over the cell's timed steps."""
    uk, inv = np.unique(np.stack([r["n"], r["L"], r["ctx"]], 1), axis=0, return_inverse=True)
    inv = inv.ravel()
    cells = range(len(uk))
    out = {"key": uk, "t": np.array([np.median(r[time_key][inv == i]) for i in cells]),
           "kv": np.array([np.mean(r["kv"][inv == i]) for i in cells])}
    if "qk" in r:
        out["qk"] = np.array([np.mean(r["qk"][inv == i]) for i in cells])
    return out


def cell_medians(recs: list[dict], K: int) -> dict[str, Any]:
    """The profile's raw cell timings for ``metadata.cells`` (validate's paired cells, :mod:`.paired`): one row
    [n, ctx, L, median t_step (s), mean context per request] per measured cell (times as the fit saw them: at the
    baseline speed)."""
    if not recs:
        return {"K": K, "rows": []}
    c = cell_table({k: np.array([x[k] for x in recs], float) for k in ("n", "L", "ctx", "t_step", "kv")}, "t_step")
    return {"K": K, "rows": [[int(n), int(ctx), int(L), float(t), float(kv / n)]
                             for (n, L, ctx), t, kv in zip(c["key"], c["t"], c["kv"])]}


def prefill_cell_rows(recs: list[dict] | None) -> list[list[float]]:
    """The prefill-only cells for ``metadata.prefill_cells`` (validate pairs every real prefill-only step with the
    nearest one, :mod:`.paired`): one row [chunk, k, prefix, median step time (s), KV tokens read] per cell with no
    decoding request beside its chunks (times at the baseline speed, as the fit saw them)."""
    return [[int(r["chunk"]), int(r["k"]), int(r["prefix"]), float(r["d_step"]), float(r["kv1"])]
            for r in recs or [] if r.get("n_dec", 4) == 0]


def decompose_target(r: dict[str, np.ndarray], v0_at_shortest: bool = False
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray, float | None, float | None]:
    """Non-negative least squares t_target = V0(M) + b (n - n_min) + s * kv + q * qk over the cell medians (B(n) =
    b (n - n_min), one per-request slope), then V0 made non-decreasing in M (weighted isotonic regression).

    At one M the target forward still costs more with more requests (per-request attention/KV gathers): that
    per-request part is non-trimmable (it is paid whatever is verified), so it belongs in the floor B(n), and
    V0(M) is the marginal cost of the verified tokens. ``kv`` is the KV tokens read (sum of contexts: the KV
    gathers); ``qk`` (records with a ``qk`` field) the decoding rows' query-key pairs, sum of (1+L) c + L(L+1)/2:
    one request verifying L=7 reads its cache once but scores it 8 times, which a kv-only term prices as 8
    requests' reads would not. Rows are weighted by 1/t (relative errors). With ``v0_at_shortest`` (and two or more
    contexts), V0 at every M the shortest context measured is then what those cells leave after the fitted B, s
    and q terms (see the code comment; :func:`fit_profile` does not use it: no reliable gain measured).
    Returns (M breakpoints, V0, B per
    measured n, s or None when only one context was measured, q or None without qk records or one context).
    """
    c = cell_table(r, "t_target")
    uk, t, kv = c["key"], c["t"], c["kv"]
    n = uk[:, 0].astype(int)
    Mc = (uk[:, 0] * (1 + uk[:, 1])).astype(int)
    Ms, mi = np.unique(Mc, return_inverse=True)
    ns = np.unique(n)
    use_kv = len(np.unique(uk[:, 2])) >= 2
    use_qk = use_kv and "qk" in c and len(np.unique(uk[:, 1])) >= 2
    # columns: V0 per M | b * (n - n_min) | s * kv | q * qk. B(n) is one per-request slope: a free B per n
    # trades off against the free V0 per M (n and M are tied by M = n(1+L)) and zigzagged by +-0.5 ms between
    # neighbouring n on this machine's noise.
    A = np.zeros((len(uk), len(Ms) + 1 + int(use_kv) + int(use_qk)))
    A[np.arange(len(uk)), mi] = 1.0
    A[:, len(Ms)] = n - ns[0]
    if use_kv:
        A[:, len(Ms) + 1] = kv
    if use_qk:
        A[:, -1] = c["qk"]
    w = 1.0 / t
    # Non-negative least squares: every term is a cost (>= 0); unconstrained, background-load noise lets a
    # negative per-request term trade off against an inflated context slope.
    x, _ = nnls(A * w[:, None], t * w)
    V0 = x[: len(Ms)].copy()
    if use_kv and v0_at_shortest:
        # V0(M) is the forward's cost without context: at every M measured at the shortest context, it is what
        # those cells leave after the fitted per-request, KV and query-key terms. Shared with the long contexts
        # in the least squares, V0 also absorbed whatever a linear KV term misses there (attention that costs
        # more per KV token in large long-context batches); prefill chunks and short requests would pay it.
        short = uk[:, 2] == uk[:, 2].min()
        e = (t - A[:, len(Ms):] @ x[len(Ms):])[short]
        ms = mi[short]
        for j in np.unique(ms):
            V0[j] = max(0.0, float(np.median(e[ms == j])))
    # the verify staircase never falls with more tokens: a weighted isotonic fit over M (weights = cells per M)
    # keeps its steps and removes the dips that noise puts between them
    V = isotonic_regression(V0, weights=np.bincount(mi).astype(float)).x
    B = x[len(Ms)] * (ns - ns[0]).astype(float)
    s = float(x[len(Ms) + 1]) if use_kv else None
    q = float(x[-1]) if use_qk else None
    return Ms, V, B, s, q


BLOCK_TIMES = ("t_step", "t_target", "t_draft", "t_host")
PREFILL_TIMES = ("d_step", "d_target", "d_draft")


def normalise_records(recs: list[dict] | None, b: Bracket | None, keys=BLOCK_TIMES,
                      factor: float | None = None) -> list[dict] | None:
    """Cell records with their times brought to the baseline speed (divided by the bracket's factor); the
    factor and drift are kept on every record."""
    if recs is None or b is None:
        return recs
    f = b.factor if factor is None else float(factor)
    return [{**r, **{k: r[k] / f for k in keys}, "speed_factor": f, "drift": b.drift} for r in recs]


def per_request_cost(n: np.ndarray, t: np.ndarray) -> dict[str, float]:
    """Least-squares line t = intercept + per_request * n over per-n medians (a diagnostic of the per-n tables:
    what one more request costs in the drafter or the host loop)."""
    A = np.stack([np.ones(len(n)), np.asarray(n, float)], 1)
    (c0, c1), *_ = np.linalg.lstsq(A, np.asarray(t, float), rcond=None)
    return {"intercept_s": float(c0), "per_request_s": float(c1)}


def context_shape(r: dict[str, np.ndarray], M: np.ndarray, V: np.ndarray, ns: np.ndarray,
                  B: np.ndarray, q: float | None = None) -> dict[str, Any]:
    """The context term's shape: at each measured context, the least-squares seconds per KV token of what the
    target forward costs beyond V0(M) + B(n). A linear (kv_bandwidth) term is right when these agree; a slope
    that grows with the context says attention costs more than linearly (or a 2-D table is needed)."""
    ct = cell_table(r, "t_target")
    uk, t, kv = ct["key"], ct["t"], ct["kv"]
    Mc = (uk[:, 0] * (1 + uk[:, 1])).astype(int)
    e = t - V[np.searchsorted(M, Mc)] - B[np.searchsorted(ns, uk[:, 0].astype(int))]
    if q:
        e = e - q * ct["qk"]
    out = {}
    for c in np.unique(uk[:, 2]):
        m = uk[:, 2] == c
        out[str(int(c))] = float((e[m] * kv[m]).sum() / (kv[m] ** 2).sum()) if (kv[m] > 0).any() else float("nan")
    vals = np.array([v for v in out.values() if np.isfinite(v)])
    return {"s_per_kv_token_by_context": out,
            "max_over_min": float(vals.max() / vals.min()) if len(vals) > 1 and vals.min() > 0 else None}


def fit_drafter_context(r: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, float | None, str]:
    """Least squares t_draft = D(n) + s * kv over the cell medians (one intercept per n, rows weighted by 1/t).

    Returns (ns, D per n, s or None, note). s is None with one context (nothing to fit); a negative s is clipped
    to 0 and then D(n) is the plain median per n, as without the term; so is a fit that would leave some
    D(n) <= 0 (the slope would claim more than the whole drafter time), with the note saying so.
    """
    c = cell_table(r, "t_draft")
    uk, t, kv = c["key"], c["t"], c["kv"]
    ns, D0 = median_by(r["n"].astype(int), r["t_draft"])
    if len(np.unique(uk[:, 2])) < 2:
        return ns, D0, None, "one context measured: no drafter context term"
    ni = np.searchsorted(ns, uk[:, 0].astype(int))
    A = np.zeros((len(uk), len(ns) + 1))
    A[np.arange(len(uk)), ni] = 1.0
    A[:, -1] = kv
    w = 1.0 / t
    x, *_ = np.linalg.lstsq(A * w[:, None], t * w, rcond=None)
    s, D = float(x[-1]), x[:-1]
    if s < 0:
        return ns, D0, 0.0, (f"fitted drafter slope {s:.3g} s per KV token is negative (noise: the drafter does not "
                             "get cheaper with context); clipped to 0, no term written")
    if s * kv.max() < 1e-9 * t.max():      # a float-noise slope (exact data): nothing measurable to write
        return ns, D0, 0.0, f"fitted drafter slope {s:.3g} s per KV token is below resolution; no term written"
    if not (D > 0).all():
        return ns, D0, 0.0, (f"fitted drafter slope {s:.3g} s per KV token leaves a non-positive drafter time at "
                             f"n={int(ns[np.argmin(D)])}; not used, no term written")
    return ns, D, s, "least squares of drafter time on D(n) + s*kv_tokens over the cell medians"


def fit_profile(recs: list[dict], mtp_recs: list[dict], mc: MeasureConfig,
                v0_at_shortest: bool = False) -> dict[str, Any]:
    """Separate the floor from the verify term (see module doc). Raises MeasurementError if flat or inert.
    ``v0_at_shortest``: see :func:`decompose_target` (off in `measure`; :mod:`.refit` compares it)."""
    if not recs:
        raise MeasurementError("measure", "cells", "no cell was measured (all failed?)")
    r = {k: np.array([x[k] for x in recs], dtype=float) for k in recs[0]}
    for k in ("t_step", "t_target", "t_draft"):
        if not (np.isfinite(r[k]).all() and (r[k] > 0).all()):
            raise MeasurementError("measure", k, "inert measurement: non-positive or non-finite timings "
                                   f"(min {np.nanmin(r[k])}); the timer or the forward did nothing")
    # V0 fitted jointly over all contexts (anchor included). Taking it from the anchor cells alone
    # (v0_at_shortest) was refitted on the same cells and real steps of three long-context validations on
    # 2026-12-02: priced-over-measured bias +3.5 -> -0.3%, +6.1 -> +4.3%, -3.6 -> -8.1% (~1k, ~1k, ~4k): no
    # reliable gain, so not used (validation/README.md); measuring the anchor at all: +1.5/+22.2/+10.0% without it
    M, V, Bn, s, q = decompose_target(r, v0_at_shortest=v0_at_shortest)
    if not (np.isfinite(V).all() and (V > 0).all()):
        raise MeasurementError("measure", "verify.time_s", f"inert: a verify time is non-positive after separating "
                               f"the per-request and context terms ({V.min():.3g} s at M={int(M[np.argmin(V)])})")
    growth = float(np.median(V[-max(1, len(V) // 8):]) / np.median(V[: max(1, len(V) // 8)]))
    if growth < mc.min_growth:
        raise MeasurementError("measure", "verify", f"flat result: the target forward at M={int(M[-1])} is only "
                               f"{growth:.3f}x the time at M={int(M[0])} (need >= {mc.min_growth}); the step is "
                               "dominated by overhead/noise, so no verify term can be separated. Measure larger M "
                               "or a larger model, or reduce background load"
                               + (f". With only {len(mc.n_reqs)} batch sizes ({list(mc.n_reqs)}) every M above "
                                  f"{mc.K + 1} comes from the largest alone and the per-request term can absorb "
                                  "all of the growth: add intermediate --n-req values (e.g. 1,2,4,8)"
                                  if len(mc.n_reqs) < 4 else ""))
    ns, D, s_draft, draft_note = fit_drafter_context(r)
    _, H = median_by(r["n"].astype(int), r["t_host"])
    H = H + Bn                      # the target forward's per-request term joins the floor
    fixed = float(H.min())
    what = (f"the trained {mc.block_drafter} drafter from {mc.live_models} (propose + state update)"
            if mc.live_models is not None else "random-weight drafter proxy, one forward over n*K tokens (no Markov head)")
    kind = "autoregressive" if mc.block_drafter == "eagle3" else "parallel"
    # an autoregressive drafter is priced per sequential step (K forwards over n tokens)
    drafters = {mc.block_drafter: {"kind": kind, "tokens": [int(n * mc.K) if kind == "parallel" else int(n)
                                                           for n in ns],
                                   "time_s": [float(x) / (mc.K if kind != "parallel" else 1) for x in D],
                                   "note": f"measured: {what}"}}
    if kind == "parallel":
        drafters[mc.block_drafter]["markov_overhead_frac"] = 0.0
    if s_draft:                     # written only when > 0 (absent = 0); once per step, not per sequential forward
        drafters[mc.block_drafter]["seconds_per_kv_token"] = s_draft
    if mtp_recs:
        m = {k: np.array([x[k] for x in mtp_recs], dtype=float) for k in mtp_recs[0]}
        mn, mD, s_mtp, mtp_note = fit_drafter_context(m)
        drafters["mtp1"] = {"kind": "mtp", "tokens": [int(x) for x in mn], "time_s": [float(x) for x in mD],
                            "note": "measured: " + (f"the trained mtp1 drafter from {mc.live_models}"
                                                    if mc.live_models is not None else
                                                    "drafter proxy, one forward over n tokens")}
        if s_mtp:
            drafters["mtp1"]["seconds_per_kv_token"] = s_mtp
    prof: dict[str, Any] = {
        "format": FORMAT,
        "verify": {"M": [int(x) for x in M], "time_s": [float(x) for x in V]},
        "fixed_overhead_s": fixed,
        "batch_overhead": {"n_req": [int(x) for x in ns], "time_s": [float(max(0.0, h - fixed)) for h in H]},
        "drafters": drafters,
    }
    if s is not None:
        prof["attention"] = {"model": "kv_bandwidth", "seconds_per_kv_token": s,
                             "note": "fitted: non-negative least squares of target-forward time on V0(M) + B(n) + "
                                     "s*kv_tokens" + (" + q*query_key_pairs" if q is not None else "")
                                     + f" over cells at contexts {sorted({int(c) for c in r['ctx']})}"}
        if q:                        # written only when > 0 (absent = 0)
            prof["attention"]["seconds_per_query_kv"] = q
    _, H_raw = median_by(r["n"].astype(int), r["t_host"])
    prof["_fit"] = {"verify_growth": growth, "seconds_per_kv_token": s, "seconds_per_query_kv": q,
                    "drafter_per_request": per_request_cost(ns, D),
                    "drafter_context": {"seconds_per_kv_token": s_draft, "note": draft_note},
                    "mtp1_context": ({"seconds_per_kv_token": s_mtp, "note": mtp_note} if mtp_recs else None),
                    "host_per_request": per_request_cost(ns, H_raw),
                    "context_shape": context_shape(r, M, V, ns, Bn, q) if s is not None else None,
                    "target_per_request_s_by_n": [float(x) for x in Bn], "floor_s_by_n": [float(x) for x in H]}
    return prof
