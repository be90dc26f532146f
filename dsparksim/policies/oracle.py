"""oracle — the waste-free upper bound: verifies only tokens that will be accepted (not realisable)."""
from __future__ import annotations

from typing import ClassVar

import numpy as np

from ..errors import InputError
from ._common import draft_budget, eval_times, global_best, lengths_from_ranked
from .base import Policy, StepContext


class Oracle(Policy):
    """Knows each request's true accepted prefix A[i]; L[i] <= A[i], so the step emits exactly n + sum(L).

    Total verified c in 0..min(n*K, max_tokens - base_tokens) maximises (n + min(c, sum A)) / step_time(base + c)
    by global search (smallest c on ties): accepted slots first, then -- only where the staircase is cheaper
    further up -- rejected ones as padding. Accepted slots are water-filled position by position (all requests'
    slot 1, then slot 2, ...), lower request index first within a position, so lengths stay as even as A allows;
    padding continues each request's prefix the same way. Per step it beats every policy's realised tokens/time
    on the same A, whatever the shape of step_time (any L gives at most n + min(sum L, sum A) tokens at
    step_time(base + sum L)).
    """

    name: ClassVar[str] = "oracle"
    usage: ClassVar[str] = "oracle"
    needs_oracle: ClassVar[bool] = True

    def choose(self, ctx: StepContext) -> np.ndarray:
        n, K = ctx.n, ctx.K
        A = ctx.true_accepted
        if A is None:
            raise InputError("StepContext", "true_accepted", "the oracle policy needs the true accepted lengths; "
                             "the engine must fill them for policies with needs_oracle=True")
        A = np.asarray(A, dtype=np.int64)
        if A.shape != (n,) or (A < 0).any() or (A > K).any():
            raise InputError("StepContext", "true_accepted", f"need shape ({n},) with values in 0..{K}, got "
                             f"shape {A.shape}, range {A.min() if A.size else '-'}..{A.max() if A.size else '-'}")
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        # Candidate totals c = 0..budget of verified draft slots: accepted slots first (water-filled), then rejected
        # ones. Tokens = n + min(c, sum A); padding past sum A adds no token but, on a non-monotone staircase
        # (e.g. T(1) > T(8) on the 7B H100 profile), can make the step cheaper -- so the bound pads to the
        # cheapest M at or above what it needs. With a non-decreasing step_time the choice is the unpadded one.
        acc = int(A.sum())
        budget = draft_budget(ctx)
        c = np.arange(budget + 1, dtype=np.int64)
        tokens = float(n) + np.minimum(c, acc)
        ratio = tokens / eval_times(ctx.step_time, ctx.base_tokens + c)
        best = global_best(ratio)
        grid = np.arange(K)[:, None]                                     # k-major: f = k*n + i
        order = np.concatenate([np.flatnonzero((grid < A[None, :]).ravel()),
                                np.flatnonzero((grid >= A[None, :]).ravel())])
        return lengths_from_ranked(order, best, n)
