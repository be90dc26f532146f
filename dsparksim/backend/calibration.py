"""Sequential Temperature Scaling (STS) of per-position confidences.

Given raw conditional confidences c[i, k] (probabilities) and realised accepted lengths A[i] on a held-out set
of blocks, STS fits one temperature per position, left to right: with T_1..T_{k-1} fixed, T_k is the value that
minimises the ECE (15 equal-width bins, :func:`dsparksim.acceptance.confidence.ece_survival`) of the cumulative
survival ``s_k = prod_{j<=k} sigmoid(logit(c_j) / T_j)`` against ``1[A >= k]``; the search is a log-spaced grid
over [0.05, 20] refined by golden-section search around the best grid point. Dividing a logit by a positive
temperature is strictly increasing, so the order of confidences at each position is preserved.
"""
from __future__ import annotations

import numpy as np

from dsparksim.acceptance.confidence import ece_survival

EPS = 1e-6
T_MIN, T_MAX = 0.05, 20.0


def logit(c: np.ndarray) -> np.ndarray:
    c = np.clip(np.asarray(c, dtype=float), EPS, 1 - EPS)
    return np.log(c) - np.log1p(-c)


def apply_sts(conf: np.ndarray, temps) -> np.ndarray:
    """Calibrated conditional confidences sigmoid(logit(c_k) / T_k), shape of ``conf`` (..., K)."""
    t = np.asarray(temps, dtype=float)
    return 1.0 / (1.0 + np.exp(-logit(conf) / t))


def _ece_k(prev: np.ndarray, z: np.ndarray, y: np.ndarray, T: float) -> float:
    s = prev / (1.0 + np.exp(-z / T))
    return ece_survival(s[:, None], y.astype(np.int64))


def fit_sts(conf: np.ndarray, accepted: np.ndarray) -> np.ndarray:
    """Per-position temperatures (K,) fitted left to right (see module docstring)."""
    conf = np.asarray(conf, dtype=float)
    accepted = np.asarray(accepted)
    n, K = conf.shape
    z = logit(conf)
    prev = np.ones(n)
    temps = np.ones(K)
    grid = np.geomspace(T_MIN, T_MAX, 61)
    for k in range(K):
        y = accepted >= k + 1
        f = [_ece_k(prev, z[:, k], y, T) for T in grid]
        i = int(np.argmin(f))
        lo, hi = np.log(grid[max(i - 1, 0)]), np.log(grid[min(i + 1, grid.size - 1)])
        g = (np.sqrt(5) - 1) / 2
        a, b = lo, hi
        for _ in range(30):                      # golden-section on log T (ECE is piecewise smooth)
            c1, c2 = b - g * (b - a), a + g * (b - a)
            if _ece_k(prev, z[:, k], y, np.exp(c1)) <= _ece_k(prev, z[:, k], y, np.exp(c2)):
                b = c2
            else:
                a = c1
        cand = np.exp((a + b) / 2)
        best = cand if _ece_k(prev, z[:, k], y, cand) <= f[i] else grid[i]
        temps[k] = best
        prev = prev / (1.0 + np.exp(-z[:, k] / best))
    return temps
