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

from dsparksim.acceptance.base import AcceptanceModel

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


# ---- DeepSpec's per-position definitions ------------------------------------------------------------------
# deepseek-ai/DeepSpec, deepspec/eval/dspark/confidence_head.py (PerPositionConfidenceMetrics) with the bin counts
# of deepspec/eval/dspark/evaluator.py (CONFIDENCE_NUM_BINS = 20, CONFIDENCE_NUM_FINE_BINS = 1000): at position
# k the prediction is the cumulative survival s_k = c_1...c_k (clamped to [1e-8, 1 - 1e-8]) and the label the
# prefix indicator 1[A >= k], over EVERY proposal that reaches position k (not only those at risk).
#   ECE_k = sum_b n_b/N |mean(s in b) - mean(label in b)| over 20 equal-width bins, bin = floor(20 s) (top -> 19);
#   AUC_k = sum_b pos_b * (negatives in bins below b) + 0.5 * pos_b * neg_b, / (P * N), over 1000 equal-width
#           bins (ties within a bin count one half).
DEEPSPEC_ECE_BINS = 20
DEEPSPEC_AUC_BINS = 1000
_EPS_PROB = 1e-8


def _bins(p: np.ndarray, nb: int) -> np.ndarray:
    return np.minimum((np.clip(p, _EPS_PROB, 1 - _EPS_PROB) * nb).astype(np.int64), nb - 1)


def deepspec_ece(pred: np.ndarray, label: np.ndarray, weights: np.ndarray | None = None,
                 bins: int = DEEPSPEC_ECE_BINS) -> float:
    """DeepSpec's per-position ECE of predictions ``pred`` against 0/1 ``label`` (optional sample weights)."""
    p = np.clip(np.asarray(pred, dtype=float), _EPS_PROB, 1 - _EPS_PROB)
    y = np.asarray(label, dtype=float)
    w = np.ones_like(p) if weights is None else np.asarray(weights, dtype=float)
    b = _bins(p, bins)
    cnt = np.bincount(b, weights=w, minlength=bins)
    if cnt.sum() <= 0:
        return float("nan")
    gap = np.abs(np.bincount(b, weights=w * p, minlength=bins) - np.bincount(b, weights=w * y, minlength=bins))
    return float(gap.sum() / cnt.sum())


def deepspec_auc(pred: np.ndarray, label: np.ndarray, weights: np.ndarray | None = None,
                 bins: int = DEEPSPEC_AUC_BINS) -> float:
    """DeepSpec's histogram AUROC (``_auroc_from_hist``): NaN without a positive or a negative."""
    y = np.asarray(label, dtype=float)
    w = np.ones_like(y) if weights is None else np.asarray(weights, dtype=float)
    b = _bins(np.asarray(pred, dtype=float), bins)
    pos = np.bincount(b, weights=w * y, minlength=bins)
    neg = np.bincount(b, weights=w * (1 - y), minlength=bins)
    tp, tn = pos.sum(), neg.sum()
    if tp <= 0 or tn <= 0:
        return float("nan")
    below = np.cumsum(neg) - neg
    return float(((pos * below).sum() + 0.5 * (pos * neg).sum()) / (tp * tn))


def per_position_metrics(conf: np.ndarray, accepted: np.ndarray, weights: np.ndarray | None = None) -> dict:
    """DeepSpec per-position survival ECE and AUC (keys 1..K) for blocks conf (n, K), accepted (n,)."""
    conf = np.asarray(conf, dtype=float)
    accepted = np.asarray(accepted)
    surv = np.cumprod(conf, axis=1)
    ece, aucs = {}, {}
    for k in range(1, conf.shape[1] + 1):
        lab = accepted >= k
        ece[k] = deepspec_ece(surv[:, k - 1], lab, weights)
        aucs[k] = deepspec_auc(surv[:, k - 1], lab, weights)
    return {"ece_by_position": ece, "auc_by_position": aucs,
            "definition": "DeepSpec (deepspec/eval/dspark/confidence_head.py): survival c_1..c_k vs 1[A>=k] over "
                          "all blocks; ECE 20 equal-width bins, AUC from a 1000-bin histogram"}


# ---- sequential temperature scaling (what the simulator applies to raw confidences) -----------------------
def _logit(c: np.ndarray) -> np.ndarray:
    c = np.clip(np.asarray(c, dtype=float), 1e-12, 1 - 1e-12)
    return np.log(c) - np.log1p(-c)


def fit_sts_nll(conf: np.ndarray, accepted: np.ndarray, t_min: float = 0.05, t_max: float = 20.0,
                iters: int = 40) -> np.ndarray:
    """Sequential temperature scaling: T_1..T_K fitted left to right, T_k minimising the log loss of the survival
    s_k = s_{k-1} * sigmoid(logit(c_k) / T_k) against 1[A >= k] with T_1..T_{k-1} fixed (golden-section search
    on log T over [t_min, t_max]). Temperature scaling (Guo et al. 2017) applied per position of the chain, the
    paper's "sequential temperature scaling"; the log loss is smooth, so the fit is fast and deterministic."""
    conf = np.asarray(conf, dtype=float)
    accepted = np.asarray(accepted)
    z = _logit(conf)
    prev = np.ones(conf.shape[0])
    temps = np.ones(conf.shape[1])
    g = (np.sqrt(5) - 1) / 2
    for k in range(conf.shape[1]):
        y = accepted >= k + 1

        def loss(lt: float) -> float:
            s = np.clip(prev / (1.0 + np.exp(-z[:, k] / np.exp(lt))), 1e-12, 1 - 1e-12)
            return float(-(np.log(s[y]).sum() + np.log1p(-s[~y]).sum()))

        a, b = np.log(t_min), np.log(t_max)
        c1, c2 = b - g * (b - a), a + g * (b - a)
        f1, f2 = loss(c1), loss(c2)
        for _ in range(iters):
            if f1 <= f2:
                b, c2, f2 = c2, c1, f1
                c1 = b - g * (b - a)
                f1 = loss(c1)
            else:
                a, c1, f1 = c1, c2, f2
                c2 = a + g * (b - a)
                f2 = loss(c2)
        temps[k] = np.exp(0.5 * (a + b))
        prev = prev / (1.0 + np.exp(-z[:, k] / temps[k]))
    return temps
