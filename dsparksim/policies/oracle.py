"""oracle — the waste-free upper bound: verifies only tokens that will be accepted (not realisable)."""
from __future__ import annotations

from typing import ClassVar

import numpy as np

from ..errors import InputError
from ._common import draft_budget, global_best, lengths_from_ranked, ratio_curve
from .base import Policy, StepContext


class Oracle(Policy):
    """Knows each request's true accepted prefix A[i]; L[i] <= A[i], so the step emits exactly n + sum(L).

    Total b in 0..min(sum A, max_tokens - base_tokens) maximises (n + b) / step_time(base + b) by global search
    (smallest b on ties). Every split of b with L <= A yields the same tokens; we water-fill: accepted slots are
    taken position by position (all requests' slot 1, then slot 2, ...), lower request index first within a
    position, so lengths stay as even as A allows. It beats every policy's realised tokens/time on the same A
    whenever step_time is non-decreasing in M.
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
        bmax = min(int(A.sum()), draft_budget(ctx))
        b = global_best(ratio_curve(float(n), np.ones(bmax), ctx.base_tokens, ctx.step_time, bmax))
        slots = np.flatnonzero((np.arange(K)[:, None] < A[None, :]).ravel())  # k-major: f = k*n + i
        return lengths_from_ranked(slots, b, n)
