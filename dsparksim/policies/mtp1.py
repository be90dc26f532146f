"""mtp1: the production baseline — the MTP-1 drafter proposes one token per request and it is always verified."""
from __future__ import annotations

from typing import ClassVar

import numpy as np

from dsparksim.policies._common import cap_lowest_index_first, draft_budget
from dsparksim.policies.base import Policy, StepContext


class MTP1(Policy):
    """Verify the single MTP-1 draft token of every request (M = base_tokens + n).

    Runs with the MTP-1 drafter's own acceptance and drafting cost (``drafter``/``block_size``). If the budget
    cannot hold one draft per request (the engine sizes batches so it should not happen) requests are served
    lowest index first and the rest verify 0.
    """

    name: ClassVar[str] = "mtp1"
    reads_confidence: ClassVar[bool] = False
    usage: ClassVar[str] = "mtp1"
    drafter: ClassVar[str | None] = "mtp1"
    block_size: ClassVar[int | None] = 1

    def choose(self, ctx: StepContext) -> np.ndarray:
        L = np.ones(ctx.n, dtype=np.int64) if ctx.K >= 1 else np.zeros(ctx.n, dtype=np.int64)
        return cap_lowest_index_first(L, draft_budget(ctx))
