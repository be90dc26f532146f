"""Summaries of acceptance data (trace files or simulated blocks): what ``dsparksim trace inspect`` prints.

Per domain: requests, blocks, tau with all K verified (1 + mean accepted_len), conditional acceptance per
position with a 95% confidence interval, mean confidence per position, and ECE / AUC of the confidences
(definitions in :mod:`.confidence`), and per position DeepSpec's survival ECE (20 bins) and survival AUC
(1000-bin histogram) over all blocks (:func:`.confidence.per_position_metrics`). Intervals are cluster-robust by request (delta method for the ratio
sum(successes)/sum(at-risk) with requests as clusters), because blocks of one response are correlated; they are
normal approximations clipped to [0, 1].
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from dsparksim.acceptance.base import DOMAINS, AcceptanceModel
from dsparksim.acceptance.confidence import confidence_metrics, per_position_metrics
from dsparksim.acceptance.synthetic import simulate_blocks
from dsparksim.acceptance.trace_format import AcceptanceTrace

Z95 = 1.959963984540054
PER_POSITION_DEFINITION = ("DeepSpec (deepseek-ai/DeepSpec deepspec/eval/dspark/confidence_head.py): at position k the "
                           "survival c_1..c_k against 1[A>=k] over all blocks; ECE 20 equal-width bins, AUC from a "
                           "1000-bin histogram")


def ratio_se(y: np.ndarray, n: np.ndarray) -> tuple[float, float]:
    """Ratio sum(y)/sum(n) over clusters and its cluster-robust standard error (NaN when undefined)."""
    tot = n.sum()
    if tot == 0:
        return math.nan, math.nan
    c = y.sum() / tot
    m = int((n > 0).sum())
    if m < 2:
        return float(c), math.nan
    return float(c), math.sqrt(m / (m - 1) * ((y - c * n) ** 2).sum()) / tot


def _ci(c: float, se: float, clip: bool) -> list[float]:
    lo, hi = c - Z95 * se, c + Z95 * se
    return [max(0.0, lo), min(1.0, hi)] if clip else [lo, hi]


def summarize_blocks(request_id: np.ndarray, domain: np.ndarray, accepted: np.ndarray, conf: np.ndarray,
                     confidence_head: bool = True) -> dict:
    """Per-domain (and pooled "all") statistics of blocks; see module docstring. Without a confidence head
    (``confidence_head=False``, e.g. ``mtp``) the blocks' confidences mean nothing: every confidence statistic is
    None (no ECE, AUC or mean confidence is reported)."""
    K = conf.shape[1]
    out: dict[str, Any] = {}
    doms = [d for d in DOMAINS if (domain == d).any()]
    for d in doms + (["all"] if len(doms) > 1 else []):
        sel = np.ones(domain.size, bool) if d == "all" else domain == d
        rid, A, C = request_id[sel], accepted[sel], conf[sel]
        _, g = np.unique(rid, return_inverse=True)
        m = int(g.max()) + 1
        tau, tau_se = ratio_se(np.bincount(g, weights=A + 1.0, minlength=m),
                                np.bincount(g, minlength=m).astype(float))
        pos = []
        for k in range(1, K + 1):
            risk = A >= k - 1
            succ = A >= k
            c, se = ratio_se(np.bincount(g, weights=succ, minlength=m), np.bincount(g, weights=risk, minlength=m))
            pos.append({"k": k, "at_risk": int(risk.sum()), "accepted": int(succ.sum()), "conditional": c,
                        "ci95": _ci(c, se, clip=True),
                        "mean_conf_at_risk": float(C[risk, k - 1].mean()) if risk.any() else math.nan,
                        "mean_conf": float(C[:, k - 1].mean())})
        if not confidence_head:
            for p in pos:
                p.update(mean_conf_at_risk=None, mean_conf=None, ece_survival=None, auc_survival=None)
            out[d] = {"requests": m, "blocks": int(A.size), "tau_all_verified": tau,
                      "tau_ci95": _ci(tau, tau_se, clip=False), "positions": pos, "ece": None,
                      "auc_by_position": {p["k"]: None for p in pos}, "mean_auc": None,
                      "ece_by_position": None, "auc_survival_by_position": None}
            continue
        q = confidence_metrics(C, A)
        dq = per_position_metrics(C, A)
        for p in pos:
            p["ece_survival"] = dq["ece_by_position"][p["k"]]
            p["auc_survival"] = dq["auc_by_position"][p["k"]]
        out[d] = {"requests": m, "blocks": int(A.size), "tau_all_verified": tau,
                  "tau_ci95": _ci(tau, tau_se, clip=False),
                  "positions": pos, "ece": q["ece"], "auc_by_position": q["auc_by_position"],
                  "mean_auc": q["mean_auc"],
                  "ece_by_position": dq["ece_by_position"], "auc_survival_by_position": dq["auc_by_position"]}
    return out


def summarize_trace(trace: AcceptanceTrace) -> dict:
    """Metadata + per-domain summary of a trace file."""
    return {"source": trace.path, "kind": "trace", "K": trace.K, "metadata": trace.metadata,
            "ci_method": "cluster-robust by request, normal approximation, clipped to [0,1]",
            "ece_definition": "survival vs realised survival, 15 equal-width bins",
            "per_position_definition": PER_POSITION_DEFINITION,
            "domains": summarize_blocks(trace.request_id, trace.domain, trace.accepted, trace.conf)}


def summarize_model(model: AcceptanceModel, n_blocks: int, blocks_per_request: int, seed: int,
                    domains: Sequence[str] = DOMAINS) -> dict:
    """Simulate about ``n_blocks`` blocks per domain (``blocks_per_request`` each) and summarise them."""
    rng = np.random.default_rng(seed)
    n_req = max(2, -(-n_blocks // blocks_per_request))
    doms = np.repeat(np.asarray(domains, dtype=object), n_req)
    data = simulate_blocks(model, doms, np.full(doms.size, blocks_per_request), rng)
    return {"source": model.describe().get("source"), "kind": "simulated", "K": model.K,
            "metadata": model.describe(), "simulation": {"seed": seed, "requests_per_domain": n_req,
                                                         "blocks_per_request": blocks_per_request},
            "ci_method": "cluster-robust by request, normal approximation, clipped to [0,1]",
            "ece_definition": "survival vs realised survival, 15 equal-width bins",
            "per_position_definition": PER_POSITION_DEFINITION, "confidence_head": model.confidence_head,
            "domains": summarize_blocks(data["request_id"], data["domain"], data["accepted_len"], data["conf"],
                                        confidence_head=model.confidence_head)}
