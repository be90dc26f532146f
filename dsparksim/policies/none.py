"""none — plain autoregressive decoding: the baseline with no speculation at all."""
from __future__ import annotations

from typing import ClassVar

import numpy as np

from dsparksim.policies.base import Policy, StepContext


class NoSpeculation(Policy):
    """No drafter: one token per request per step, no drafting cost, no draft KV slots (K = 0).

    ``drafts = False`` makes the run resolve K = 0, no drafter (``profile.draft_time(None, ...) = 0``) and the
    no-draft acceptance source (:class:`dsparksim.acceptance.nodraft.NoDraftAcceptance`), so the engine reserves
    prompt + output KV tokens per request (no + K) and every step's M is the n anchors plus prefill tokens.
    """

    name: ClassVar[str] = "none"
    reads_confidence: ClassVar[bool] = False
    usage: ClassVar[str] = "none"
    drafts: ClassVar[bool] = False
    block_size: ClassVar[int | None] = 0

    def choose(self, ctx: StepContext) -> np.ndarray:
        return np.zeros(ctx.n, dtype=np.int64)
