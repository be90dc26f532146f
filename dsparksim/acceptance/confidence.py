"""Confidence quality: ECE and per-position AUC of calibrated confidences against realised acceptance.

Definitions (used everywhere in dsparksim, including ``dsparksim trace inspect``):

* **ECE** — expected calibration error of the *cumulative survival* ``s[i,k] = c[i,1]...c[i,k]`` against the
  realised survival ``1[A_i >= k]``, pooling every (block, position) pair, with 15 equal-width bins on [0, 1]:
  ``ECE = sum_b n_b/N * |mean(s in b) - mean(1[A>=k] in b)|``.
* **AUC at position k** — ROC AUC of the conditional confidence ``c[i,k]`` for the label "position k accepted",
  over the blocks whose positions 1..k-1 were all accepted (``A_i >= k-1``); ties count one half
  (Mann-Whitney). NaN when a position has no positive or no negative example.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .base import AcceptanceModel

ECE_BINS = 15


def auc(score: np.ndarray, label: np.ndarray) -> float:
    """ROC AUC by the Mann-Whitney rank formula (average ranks for ties)."""
    label = np.asarray(label, dtype=bool)
    npos = int(label.sum())
    nneg = label.size - npos
    if npos == 0 or nneg == 0:
        return float("nan")
    from scipy.stats import rankdata  # lazy: scipy.stats costs ~0.5 s at start-up, AUC is rarely needed

    ranks = rankdata(score)
    return float((ranks[label].sum() - npos * (npos + 1) / 2.0) / (npos * nneg))


def ece_survival(conf: np.ndarray, accepted: np.ndarray, bins: int = ECE_BINS) -> float:
    """ECE of cumulative survival vs realised survival, ``bins`` equal-width bins (see module docstring)."""
    conf = np.asarray(conf, dtype=float)
    n, K = conf.shape
    surv = np.cumprod(conf, axis=1).ravel()
    real = (np.asarray(accepted)[:, None] >= np.arange(1, K + 1)[None, :]).ravel().astype(float)
    b = np.minimum((surv * bins).astype(np.int64), bins - 1)
    cnt = np.bincount(b, minlength=bins)
    gap = np.abs(np.bincount(b, weights=surv, minlength=bins) - np.bincount(b, weights=real, minlength=bins))
    return float(gap.sum() / max(cnt.sum(), 1))


def confidence_metrics(conf: np.ndarray, accepted: np.ndarray) -> dict[str, Any]:
    """ECE (survival, 15 bins) and AUC per position (1-based keys) for blocks (conf (n,K), accepted (n,))."""
    conf = np.asarray(conf, dtype=float)
    accepted = np.asarray(accepted)
    K = conf.shape[1]
    aucs = {}
    for k in range(1, K + 1):
        at_risk = accepted >= k - 1
        aucs[k] = auc(conf[at_risk, k - 1], accepted[at_risk] >= k)
    finite = [v for v in aucs.values() if np.isfinite(v)]
    return {"ece": ece_survival(conf, accepted), "ece_definition": "survival vs realised survival, 15 equal-width bins",
            "auc_by_position": aucs, "mean_auc": float(np.mean(finite)) if finite else float("nan"),
            "n_blocks": int(conf.shape[0])}


def calibration_quality(model: AcceptanceModel, domain: str, n: int, rng: np.random.Generator) -> dict[str, Any]:
    """ECE/AUC of ``model``'s confidences in ``domain`` from one block of each of ``n`` fresh requests.

    Uses slots 0..n-1 of the model (call it on a model that is not inside a running simulation).
    """
    slots = np.arange(n)
    model.start(slots, np.full(n, domain, dtype=object), rng)
    blk = model.draw(slots, rng)
    out = confidence_metrics(blk.conf, blk.accepted)
    out["domain"] = domain
    return out
