"""fixed:k — verify the same number of draft tokens for every request."""
from __future__ import annotations

from typing import ClassVar

import numpy as np

from dsparksim.policies._common import cap_lowest_index_first, draft_budget, existing, int_arg
from dsparksim.policies.base import Policy, StepContext


class Fixed(Policy):
    """Verify min(k, K) draft tokens of every request (``fixed:K`` = verify everything).

    If the step's token budget cannot hold them all (the engine should prevent it), requests are served lowest
    index first.
    """

    name: ClassVar[str] = "fixed"
    reads_confidence: ClassVar[bool] = False
    usage: ClassVar[str] = "fixed:K"

    def __init__(self, k: int) -> None:
        self.k = int(k)
        self.spec = f"fixed:{self.k}"

    @classmethod
    def from_arg(cls, arg: str | None) -> "Fixed":
        return cls(int_arg(cls.name, arg, 1, "k (draft tokens to verify)"))

    def choose(self, ctx: StepContext) -> np.ndarray:
        L = np.full(ctx.n, min(self.k, ctx.K), dtype=np.int64)
        # early exit: a request verifies at most what it drafted, before the budget is shared out in index order
        return cap_lowest_index_first(existing(ctx, L), draft_budget(ctx))
