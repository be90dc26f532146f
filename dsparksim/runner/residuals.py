"""Per-step residuals: every real step's measured time next to the profile's price for that exact step shape.

A real step's log row (the engine's public step log + the executor's split) gives its shape (decoding requests
``n_decode``, verified tokens, ``M``, prefill tokens/chunks/query-key pairs, KV tokens read) and its measured time
``dt = t_target + t_draft + t_host``. The profile prices the same shape as a sum of terms (the parts of
:meth:`CostProfile.price`, :mod:`dsparksim.cost.price`)::

    verify   = verify_time(M, 0)                       (staircase)
    context  = verify_time(M, kv) - verify_time(M, 0)  (attention over the KV tokens read)
               + seconds_per_query_kv * decode_qk      (the long-context term, when the profile has one)
    prefill  = the prefill terms of the step's chunks  (target part; per-chunk part; drafter part)
    drafter  = draft_time(drafter, n, K)
               + the drafter's context term: draft_time(drafter, n, K, kv) - draft_time(drafter, n, K)
                 (profile drafters.<name>.seconds_per_kv_token * kv; 0 when the profile has none)
    host     = fixed_overhead_s + batch_overhead(n)    (the floor; its per-request target part B(n) is measured
                                                        inside the target forward, see measure.decompose_target)

which sums to the step's logged price ``dt_model`` (checked). Each term belongs to one measured timer (target:
verify, context, prefill-target, B(n); draft: drafter, prefill-drafter; host: the rest), so the residual
``model - measured`` of each timer is exact, and they sum to ``dt_model - dt``. Inside the target timer the
residual is attributed to its terms by least squares over the run's steps (one scale error per term; what is
left is ``r_target_other``), so the per-step columns ``r_*`` also sum exactly to ``dt_model - dt``.

Measured times are brought to the profile's machine speed first when a drift factor is given (:mod:`.drift`).
"""
from __future__ import annotations

from typing import Mapping

import numpy as np
import pandas as pd

from dsparksim.cost.price import StepShape
from dsparksim.cost.profile import CostProfile

# The real runner's step-log columns for the StepShape fields it names differently (runner/engine.py EXTRA_LOG)
RUNNER_LOG_NAMES = {"prefill_qk": "pf_qk", "prefill_chunks": "pf_chunks", "decode_qk": "dec_qk"}
TERMS = ("verify", "context", "prefill", "per_request", "drafter", "host")
TARGET_TERMS = ("verify", "context", "prefill", "per_request")


def _per_request_target(profile: CostProfile, n: np.ndarray) -> np.ndarray:
    """B(n): the target forward's per-request part that a measured profile keeps in its floor (0 otherwise)."""
    fit = profile.metadata.get("fit", {}) if isinstance(profile.metadata, Mapping) else {}
    bt = fit.get("target_per_request_s_by_n") if isinstance(fit, Mapping) else None
    grid = profile.metadata.get("grid", {}).get("n_req") if isinstance(profile.metadata.get("grid"), Mapping) else None
    if bt is None or grid is None:
        return np.zeros(len(n))
    grid, bt = np.asarray(grid), np.asarray(bt, float)
    b = bt[np.clip(np.searchsorted(grid, n, side="right") - 1, 0, len(grid) - 1)]
    return np.where(n > 0, b, 0.0)


def model_terms(steps: Mapping[str, np.ndarray], profile: CostProfile, K: int, drafter: str | None) -> pd.DataFrame:
    """The profile's price of every logged step, term by term (seconds; see module doc): the parts of
    :meth:`CostProfile.price` on the steps' shapes, with the per-request target part B(n) moved out of the floor."""
    n = np.asarray(steps["n_decode"], np.int64)
    shape = StepShape.from_log(steps, drafter, K, names=RUNNER_LOG_NAMES)
    p = profile.price(shape)
    B = _per_request_target(profile, n)
    return pd.DataFrame({"m_verify": p.verify, "m_context": p.context + p.query_key, "m_prefill_target": p.prefill,
                         "m_prefill_chunk": p.prefill_chunk, "m_prefill_drafter": p.prefill_drafter,
                         "m_per_request": B, "m_drafter": p.drafter, "m_drafter_context": p.drafter_context,
                         "m_host": p.overhead - B})


def step_residuals(steps: Mapping[str, np.ndarray], profile: CostProfile, K: int, drafter: str | None,
                   factor: float = 1.0, check_price: bool = True) -> pd.DataFrame:
    """One row per step: shape, measured split (at baseline speed: divided by the drift ``factor``), the model's
    terms, and residuals (model - measured) per timer and per term; ``r_total = dt_model - dt``.

    ``check_price``: the terms must add up to the logged ``dt_model`` (the price the engine used); a mismatch means
    the profile is not the run's, and raises ValueError.
    """
    n_steps = len(steps["dt"])
    base = {k: np.asarray(steps[k]) for k in ("t_start", "n_decode", "M", "verify_tokens", "n_prefill_tokens",
                                               "kv_read", "n_running") if k in steps}
    df = pd.DataFrame(base)
    df["pf_chunks"] = np.asarray(steps.get("pf_chunks", np.zeros(n_steps)))
    df["ctx_mean"] = df["kv_read"] / np.maximum(df["n_running"] if "n_running" in df else 1, 1)
    df["dt_raw"] = np.asarray(steps["dt"], float)
    df["factor"] = float(factor)
    for k in ("t_target", "t_draft", "t_host"):
        df[k] = np.asarray(steps[k], float) / factor
    df["dt"] = df["t_target"] + df["t_draft"] + df["t_host"]      # == dt_raw / factor (t_host is the remainder)
    m = model_terms(steps, profile, K, drafter)
    df = pd.concat([df, m], axis=1)
    df["model_target"] = m["m_verify"] + m["m_context"] + m["m_prefill_target"] + m["m_per_request"]
    df["model_draft"] = m["m_drafter"] + m["m_drafter_context"] + m["m_prefill_drafter"]
    df["model_host"] = m["m_host"] + m["m_prefill_chunk"]
    df["dt_model"] = df["model_target"] + df["model_draft"] + df["model_host"]
    if check_price and "dt_model" in steps:
        logged = np.asarray(steps["dt_model"], float)
        bad = ~np.isclose(df["dt_model"].to_numpy(), logged, rtol=1e-9, atol=1e-12)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"step {i}: the profile's terms sum to {df['dt_model'].iloc[i]:.9g} s but the run "
                             f"priced it {logged[i]:.9g} s; residuals need the run's own profile")
    for t, tm in (("target", "t_target"), ("draft", "t_draft"), ("host", "t_host")):
        df[f"r_{t}"] = df[f"model_{t}"] - df[tm]
    df["r_total"] = df["dt_model"] - df["dt"]
    # attribute the target timer's residual to its terms: one scale error per term, least squares over steps
    cols = {"verify": m["m_verify"], "context": m["m_context"], "prefill": m["m_prefill_target"],
            "per_request": m["m_per_request"]}
    scale = attribute(df["r_target"].to_numpy(), {k: v.to_numpy() for k, v in cols.items()})
    for k, v in cols.items():
        df[f"r_{k}"] = scale.get(k, 0.0) * v
    df["r_target_other"] = df["r_target"] - sum(df[f"r_{k}"] for k in cols)
    df["r_drafter"] = df["r_draft"]
    df["r_host_loop"] = df["r_host"]
    df.attrs["target_term_scale_error"] = scale
    return df


def attribute(r: np.ndarray, cols: Mapping[str, np.ndarray]) -> dict[str, float]:
    """Least-squares scale errors x_k with r ~ sum_k x_k * col_k over the steps (columns that are all zero are
    left out: nothing to attribute to them). x_k = +0.1: the measured term is 10% below the model's price
    (model - real = 0.1 * model)."""
    use = [k for k, c in cols.items() if np.any(np.abs(c) > 0)]
    if not use or len(r) == 0:
        return {}
    A = np.stack([cols[k] for k in use], 1)
    x, *_ = np.linalg.lstsq(A, r, rcond=None)
    return {k: float(v) for k, v in zip(use, x)}


RESID_COLS = ("r_verify", "r_context", "r_prefill", "r_per_request", "r_target_other", "r_drafter", "r_host_loop")

BINS = {
    "n_decode": ([-1, 0, 1, 4, 8, 16, 32, np.inf], ["0", "1", "2-4", "5-8", "9-16", "17-32", ">32"]),
    "M": ([0, 8, 32, 64, 128, 256, 512, np.inf], ["1-8", "9-32", "33-64", "65-128", "129-256", "257-512", ">512"]),
    "ctx_mean": ([-1, 128, 512, 2048, 8192, np.inf], ["<=128", "129-512", "513-2k", "2k-8k", ">8k"]),
}


def by_shape(df: pd.DataFrame) -> pd.DataFrame:
    """Residuals grouped by step shape: (n decoding, M, prefill or not, mean context) bins. ``resid_pct`` =
    sum(model - measured) / sum(measured) in the group; ``contrib_pct`` = the group's residual over all steps'
    measured time (what it adds to the run's total error); per-timer residuals likewise."""
    g = df.copy()
    for k, (edges, labels) in BINS.items():
        g[f"{k}_bin"] = pd.cut(g[k], edges, labels=labels)
    g["prefill"] = np.where(g["n_prefill_tokens"] > 0, "yes", "no")
    total = float(g["dt"].sum())
    rows = []
    for key, grp in g.groupby(["n_decode_bin", "M_bin", "prefill", "ctx_mean_bin"], observed=True, sort=True):
        t = float(grp["dt"].sum())
        row = dict(zip(("n_decode", "M", "prefill", "context"), key))
        row.update({"steps": len(grp), "time_share_pct": 100 * t / total, "measured_ms": 1e3 * t / len(grp),
                    "model_ms": 1e3 * float(grp["dt_model"].mean()),
                    "resid_pct": 100 * float(grp["r_total"].sum()) / t,
                    "contrib_pct": 100 * float(grp["r_total"].sum()) / total})
        for tm in ("target", "draft", "host"):
            row[f"{tm}_resid_pct"] = 100 * float(grp[f"r_{tm}"].sum()) / t
        rows.append(row)
    return pd.DataFrame(rows)


def by_term(df: pd.DataFrame) -> pd.DataFrame:
    """Residuals by cost term over all steps: model seconds, residual seconds, and the residual as a share of all
    measured time (the terms' shares sum to the total error of the summed step time)."""
    total = float(df["dt"].sum())
    model = {"verify": df["m_verify"], "context": df["m_context"], "prefill": df["m_prefill_target"],
             "per_request": df["m_per_request"], "target_other": 0 * df["dt"], "drafter": df["model_draft"],
             "host_loop": df["model_host"]}
    rows = []
    for k, c in zip(model, RESID_COLS):
        ms, rs = float(model[k].sum()), float(df[c].sum())
        rows.append({"term": k, "model_s": ms, "resid_s": rs, "resid_pct_of_measured_time": 100 * rs / total,
                     "resid_pct_of_term": (100 * rs / (ms - rs)) if ms - rs > 0 else float("nan")})
    rows.append({"term": "total", "model_s": float(df["dt_model"].sum()), "resid_s": float(df["r_total"].sum()),
                 "resid_pct_of_measured_time": 100 * float(df["r_total"].sum()) / total,
                 "resid_pct_of_term": 100 * float(df["r_total"].sum()) / total})
    return pd.DataFrame(rows)
