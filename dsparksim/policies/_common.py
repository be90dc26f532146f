"""Vectorised building blocks shared by the verification policies.

Candidate order: every draft slot (i, k) of the step is a candidate; ranking is by survival s[i,k] descending, ties
broken by lower k first, then lower request index. We get exactly that order from one stable sort of the
survival matrix flattened *k-major* (flat index f = k*n + i), so ``f % n`` is the request and ``f // n`` the
0-based position. Because s is non-increasing in k, (i, k) always ranks before (i, k+1): any top-b set is a
per-request prefix and ``bincount(f % n)`` is its length vector.

Early exit of drafting (``StepContext.drafted``): only the positions a request drafted exist. A position past
``drafted[i]`` is no candidate at all -- not a candidate of survival 0 that a ratio search could admit to reach a
cheaper stair of the step-time curve, a step the engine would never run (it verifies at most the drafted
positions). :class:`Ranking` ranks the undrafted positions after every drafted one (key +inf) and
:func:`candidate_budget` caps every count at the positions drafted, so no admitted set reaches past them;
:func:`existing` caps the lengths of the policies that do not rank. Without early exit (``drafted`` None) all
three are the identity on what they are given.
"""
from __future__ import annotations

import numpy as np

from dsparksim.errors import InputError
from dsparksim.policies.base import StepContext
from dsparksim.policies.registry import int_arg, no_arg, spec_error, unit_float_arg  # noqa: F401  (re-exported)

_SRC = "StepContext"
_sum = np.add.reduce   # ndarray.sum() without its Python wrapper (called every engine step)
_NO_KEYS = np.zeros(0)   # Ranking's prefix before any is sorted (one array, not one per engine step)
_NO_KEYS.flags.writeable = False


# ------------------------------------------------------------------------------------------- budgets and caps
def draft_budget(ctx: StepContext) -> int:
    """Draft tokens that fit this step: min(max_tokens - base_tokens, n*K). Raises if the anchors alone overflow."""
    room = int(ctx.max_tokens) - int(ctx.base_tokens)
    if room < 0:
        raise InputError(_SRC, "base_tokens", f"base_tokens={ctx.base_tokens} already exceeds "
                         f"max_tokens={ctx.max_tokens}; the engine must size the batch so the anchors fit")
    return min(room, ctx.n * ctx.K)


def candidate_budget(ctx: StepContext) -> int:
    """Candidates a ranking policy may admit: :func:`draft_budget`, and never more than the positions drafted."""
    b = draft_budget(ctx)
    return b if ctx.drafted is None else min(b, int(_sum(ctx.drafted)))


def existing(ctx: StepContext, L: np.ndarray) -> np.ndarray:
    """Lengths ``L`` capped at the positions each request drafted (early exit); ``L`` itself without early exit."""
    return L if ctx.drafted is None else np.minimum(L, np.asarray(ctx.drafted, dtype=np.int64))


def cap_lowest_index_first(L: np.ndarray, budget: int) -> np.ndarray:
    """Trim L so sum(L) <= budget, keeping requests in index order (request 0 keeps its full length first).

    Used by the policies that do not rank candidates (mtp1, fixed, threshold). The engine sizes batches so the
    cap should not bind; when it does, the result is deterministic.
    """
    L = np.asarray(L, dtype=np.int64)
    before = np.cumsum(L) - L  # tokens taken by lower-index requests
    return np.clip(budget - before, 0, L).astype(np.int64, copy=False)


# -------------------------------------------------------------------------------------------------- ranking
def rank_candidates(survival: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return (order, values): k-major flat indices of all candidates best first, and their survivals."""
    flat = np.ascontiguousarray(survival.T).ravel()  # f = k*n + i
    order = np.argsort(-flat, kind="stable")
    return order, flat[order]


class Ranking:
    """The candidates of one step in :func:`rank_candidates` order, computed only as far as a policy reads.

    The full stable argsort of all n*K candidates dominated a step. Policies need two things from the ranking,
    and neither needs it:
      * the survivals in rank order (:meth:`values`): ties change no value, so a plain (SIMD) sort of the
        negated survivals, or a linear-time partition plus a sort of only the first m, gives the same numbers
        (up to the sign of a zero, which adds nothing to the ratio curve's running sum that starts at n >= 1);
      * the verify lengths of the first ``count`` candidates (:meth:`lengths`): with v the count-th smallest
        key, that set is every key < v plus the first (count - #<v) keys == v in ascending flat index -- the
        stable sort's tie order -- so the lengths are those of ``lengths_from_ranked(order, count, n)``.

    With ``drafted`` (early exit) the positions past ``drafted[i]`` get key +inf: they rank after every drafted
    position, so the first ``count <= sum(drafted)`` candidates (:func:`candidate_budget`) are drafted ones only.
    (drafted[i] >= 1, so every first-position key stays finite, as the partition below needs.)
    """

    __slots__ = ("n", "neg", "_sorted", "_prefix")

    def __init__(self, survival: np.ndarray, drafted: np.ndarray | None = None) -> None:
        self.n = int(survival.shape[0])
        # keys, f = k*n + i; best candidate = smallest key (negated straight into the k-major layout: one pass)
        self.neg = np.negative(survival.T, out=np.empty(survival.shape[::-1], survival.dtype)).ravel()
        if drafted is not None:   # early exit: undrafted positions are no candidates (module doc)
            K = survival.shape[1]
            gone = np.arange(K)[:, None] >= np.asarray(drafted)[None, :]      # k-major, as neg
            self.neg[gone.ravel()] = np.inf
        self._sorted: np.ndarray | None = None  # every key, ascending
        self._prefix = _NO_KEYS  # the smallest keys, ascending (replaced, never written into)

    def keys(self, m: int | None = None) -> np.ndarray:
        """At least the min(m, n*K) smallest keys, ascending (all of them when m is None), maybe more."""
        if self._sorted is not None:
            return self._sorted
        N = self.neg.size
        if m is not None and m <= len(self._prefix):
            return self._prefix
        if m is None or 4 * m >= N:  # a partition pays only when the prefix is a small part of the whole
            self._sorted = np.sort(self.neg)
            return self._sorted
        n = self.n
        if 0 < m < n:
            # the m-th smallest key t of the first position (f < n): at least m keys are <= t, so the m smallest
            # keys all are, and the keys <= t, sorted, are the first of all keys sorted (NaN sorts last)
            t = np.partition(self.neg[:n], m - 1)[m - 1]
            if t == t:
                self._prefix = np.sort(self.neg[self.neg <= t])
                return self._prefix
        self._prefix = np.sort(np.partition(self.neg, m - 1)[:m])  # NaN sorts last in both, as in argsort
        return self._prefix

    def values(self, m: int | None = None) -> np.ndarray:
        """Survivals best first: at least the first min(m, n*K) ranked (all when m is None)."""
        return -self.keys(m)

    def lengths(self, count: int) -> np.ndarray:
        """Verify lengths when the first ``count`` ranked candidates are admitted (a per-request prefix)."""
        n, neg = self.n, self.neg
        if count <= 0:
            return np.zeros(n, dtype=np.int64)
        v = self.keys(count)[count - 1]
        if v != v:  # NaN among the admitted: take the full stable order
            return lengths_from_ranked(np.argsort(neg, kind="stable"), count, n)
        # every key <= v is admitted when exactly ``count`` keys are (the usual case: no tie beyond the count-th)
        le = neg <= v
        if np.count_nonzero(le) == count:
            return _sum(le.reshape(-1, n), axis=0).astype(np.int64, copy=False)
        L = (neg < v).reshape(-1, n).sum(axis=0)
        rest = count - int(L.sum())
        if rest:
            L += np.bincount(np.flatnonzero(neg == v)[:rest] % n, minlength=n)
        return L.astype(np.int64, copy=False)


def lengths_from_ranked(order: np.ndarray, count: int, n: int) -> np.ndarray:
    """Verify lengths when the first ``count`` ranked candidates are admitted (a per-request prefix)."""
    return np.bincount(order[:count] % n, minlength=n).astype(np.int64, copy=False)


# ------------------------------------------------------------------------------------------ ratio curves
def ratio_curve(e0: float, gains: np.ndarray, base: int, step_time, bmax: int) -> np.ndarray:
    """ratio[b] = (e0 + gains[:b].sum()) / step_time(base + b) for b = 0..bmax (one vectorised cost call)."""
    E = np.empty(bmax + 1)
    E[0] = e0
    E[1:] = gains[:bmax]
    np.cumsum(E, out=E)  # sequential, so bitwise equal to Algorithm 1's running sum E += s
    return E / eval_times(step_time, base + np.arange(bmax + 1, dtype=np.int64))


def eval_times(step_time, M: np.ndarray) -> np.ndarray:
    """step_time(M) as float64, checked to be one positive finite number per M (a division follows)."""
    T = np.asarray(step_time(M), dtype=np.float64)
    if T.shape != M.shape or not (np.isfinite(T).all() and (T > 0).all()):
        raise InputError(_SRC, "step_time", f"must return {M.size} positive finite seconds for M={M.min()}.."
                         f"{M.max()}, got shape {T.shape} with values {T[:8]}...")
    return T


def first_drop(ratio: np.ndarray) -> int:
    """Algorithm 1's early stop: the largest b with ratio[0] < ratio[1] < ... < ratio[b] (strict increase).

    A candidate is admitted iff it strictly raises the ratio; the first candidate that leaves it equal or lower
    stops the scan (so zero-value candidates on a flat stair are not admitted).
    """
    if len(ratio) <= 1:
        return 0
    drops = np.subtract(ratio[1:], ratio[:-1]) <= 0  # np.diff's own arithmetic, without its call overhead
    j = int(drops.argmax())
    return j if drops[j] else len(ratio) - 1


def global_best(ratio: np.ndarray) -> int:
    """Global search: the b maximising ratio (smallest b on ties)."""
    return int(np.argmax(ratio))
