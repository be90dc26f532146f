"""Difficulty-aware early exit of drafting (issue 29, 2.5): the drafter stops a request's block when its running
survival falls below a threshold.

The drafter always proposes position 1; after proposing position k (< K) it continues only while the survival its
confidence head predicts for the block so far, s[i,k] = c[i,1]...c[i,k], is at least the threshold T. Request i
therefore drafts ``D[i] = 1 + #{k < K : s[i,k] >= T}`` positions (survival is non-increasing in k, so the leading
run is a count). Positions past D[i] do not exist: the policy sees them with confidence 0 but counts none of them
as a candidate (:mod:`dsparksim.policies._common`), and the scheduler caps L[i] at D[i]. The stop uses only the drafter's own outputs up to the stopping position, which exist before
any of them is verified, so it changes which tokens can be verified, never which are accepted: the accepted
prefix of a request stays min(L[i], A[i]) with the same drawn A[i] (keyed draws), and a request that drafted all K
positions sees exactly the block it would have seen without early exit.

What the stop saves is priced by :meth:`dsparksim.cost.profile.CostProfile.draft_time_exit`: an autoregressive
drafter skips the forwards of the positions nobody drafts and runs the others over fewer requests; a parallel
drafter still pays its one backbone forward over all K positions and saves only its Markov head's share.
"""
from __future__ import annotations

import math

import numpy as np

from dsparksim.errors import ConfigError


def check_threshold(t: float | None) -> float | None:
    """The early-exit threshold as a float in [0, 1], or None (off); ConfigError otherwise."""
    if t is None:
        return None
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or not 0.0 <= t <= 1.0:
        raise ConfigError("config", "draft_exit", f"the early-exit survival threshold must be a number in [0, 1], "
                          f"got {t!r}")
    return float(t)


def drafted_lengths(survival: np.ndarray, threshold: float) -> np.ndarray:
    """(n,) positions each request drafts, 1..K: 1 + the leading positions k < K whose survival is >= threshold."""
    s = np.asarray(survival, np.float64)
    n, K = s.shape
    if K == 0:
        return np.zeros(n, np.int64)
    keep = s[:, :K - 1] >= threshold
    # survival is non-increasing along k, but count the leading run explicitly (robust to a source that is not)
    run = np.cumprod(keep, axis=1).sum(axis=1) if K > 1 else np.zeros(n, np.int64)
    return (1 + run).astype(np.int64)


def position_counts(drafted: np.ndarray, K: int) -> np.ndarray:
    """(K,) requests drafting each position: counts[j] = #{i : drafted[i] >= j + 1} (non-increasing)."""
    d = np.asarray(drafted, np.int64)
    return np.bincount(d, minlength=K + 1)[1:K + 1][::-1].cumsum()[::-1].astype(np.int64)


def mask_undrafted(conf: np.ndarray, survival: np.ndarray, drafted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(conf, survival) with the positions past ``drafted[i]`` set to 0 (new arrays; the inputs are untouched)."""
    K = conf.shape[1]
    live = np.arange(K)[None, :] < np.asarray(drafted)[:, None]
    return np.where(live, conf, 0.0), np.where(live, survival, 0.0)
