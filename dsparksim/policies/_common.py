"""Vectorised building blocks shared by the verification policies.

Candidate order: every draft slot (i, k) of the step is a candidate; ranking is by survival s[i,k] descending, ties
broken by lower k first, then lower request index. We get exactly that order from one stable sort of the
survival matrix flattened *k-major* (flat index f = k*n + i), so ``f % n`` is the request and ``f // n`` the
0-based position. Because s is non-increasing in k, (i, k) always ranks before (i, k+1): any top-b set is a
per-request prefix and ``bincount(f % n)`` is its length vector.
"""
from __future__ import annotations

import numpy as np

from ..errors import ConfigError, InputError
from .base import StepContext

_SRC = "StepContext"


# ----------------------------------------------------------------------------------------------- spec parsing
def spec_error(name: str, arg: str | None, why: str) -> ConfigError:
    """A ConfigError naming the spec as written and listing the valid specs."""
    from . import list_specs  # lazy: the registry imports the policy modules that import this one

    spec = name if arg is None else f"{name}:{arg}"
    return ConfigError(None, "policy", f"bad spec {spec!r}: {why}; valid specs: {', '.join(list_specs())}")


def no_arg(name: str, arg: str | None) -> None:
    if arg is not None:
        raise spec_error(name, arg, f"'{name}' takes no argument")


def int_arg(name: str, arg: str | None, lo: int, what: str) -> int:
    if arg is None or arg.strip() == "":
        raise spec_error(name, arg, f"'{name}' needs an integer {what} >= {lo}, e.g. '{name}:{max(lo, 2)}'")
    try:
        v = int(arg)
    except ValueError:
        raise spec_error(name, arg, f"{what} must be an integer >= {lo}, got {arg!r}") from None
    if v < lo:
        raise spec_error(name, arg, f"{what} must be an integer >= {lo}, got {v}")
    return v


def unit_float_arg(name: str, arg: str | None, what: str) -> float:
    if arg is None or arg.strip() == "":
        raise spec_error(name, arg, f"'{name}' needs a {what} in [0, 1], e.g. '{name}:0.5'")
    try:
        v = float(arg)
    except ValueError:
        raise spec_error(name, arg, f"{what} must be a number in [0, 1], got {arg!r}") from None
    if not 0.0 <= v <= 1.0:  # also rejects nan
        raise spec_error(name, arg, f"{what} must be in [0, 1], got {v}")
    return v


# ------------------------------------------------------------------------------------------- budgets and caps
def draft_budget(ctx: StepContext) -> int:
    """Draft tokens that fit this step: min(max_tokens - base_tokens, n*K). Raises if the anchors alone overflow."""
    room = int(ctx.max_tokens) - int(ctx.base_tokens)
    if room < 0:
        raise InputError(_SRC, "base_tokens", f"base_tokens={ctx.base_tokens} already exceeds "
                         f"max_tokens={ctx.max_tokens}; the engine must size the batch so the anchors fit")
    return min(room, ctx.n * ctx.K)


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
    """The candidates of one step in :func:`rank_candidates` order, sorted only as far as a policy reads.

    Algorithm 1 admits a few dozen of the n*K candidates, so :meth:`top` finds the first m with a linear-time
    partition and stable-sorts just those. The set {f : -flat[f] <= v}, v the m-th smallest key, is exactly the
    first |set| entries of the full stable order (every other key is larger, or NaN, which sorts last), and a
    stable sort of that set in ascending f breaks ties as the full sort does: the prefix is bitwise the same.
    """

    __slots__ = ("flat", "neg", "order", "values", "complete")

    def __init__(self, survival: np.ndarray) -> None:
        self.flat = np.ascontiguousarray(survival.T).ravel()  # f = k*n + i
        self.neg = -self.flat
        self.order = np.zeros(0, dtype=np.intp)
        self.values = np.zeros(0)
        self.complete = False

    def top(self, m: int) -> tuple[np.ndarray, np.ndarray]:
        """(order, values) holding at least the first min(m, n*K) ranked candidates (possibly more)."""
        if self.complete or len(self.order) >= m:
            return self.order, self.values
        neg, N = self.neg, self.neg.size
        order = None
        if 4 * m < N:  # partitioning pays only when the prefix is a small part of the whole
            v = np.partition(neg, m - 1)[m - 1]
            if v == v:  # not NaN
                idx = np.flatnonzero(neg <= v)
                order = idx[np.argsort(neg[idx], kind="stable")]
        if order is None:
            order = np.argsort(neg, kind="stable")
            self.complete = True
        self.order, self.values = order, self.flat[order]
        return order, self.values


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
    drops = np.diff(ratio) <= 0
    j = int(np.argmax(drops))
    return j if drops[j] else len(ratio) - 1


def global_best(ratio: np.ndarray) -> int:
    """Global search: the b maximising ratio (smallest b on ties)."""
    return int(np.argmax(ratio))
