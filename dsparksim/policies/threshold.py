"""threshold:t — static survival threshold per request (SpecDec++/DeepSpec style)."""
from __future__ import annotations

from typing import ClassVar

import numpy as np

from dsparksim.policies._common import cap_lowest_index_first, draft_budget, existing, unit_float_arg
from dsparksim.policies.base import Policy, StepContext


class Threshold(Policy):
    """Per request, verify the largest L with s[i,L] >= t (0 if s[i,1] < t). Load-blind.

    If the token budget binds (the engine should prevent it), requests are served lowest index first.
    """

    name: ClassVar[str] = "threshold"
    usage: ClassVar[str] = "threshold:T"

    def __init__(self, t: float) -> None:
        self.t = float(t)
        self.spec = f"threshold:{self.t:g}"

    @classmethod
    def from_arg(cls, arg: str | None) -> "Threshold":
        return cls(unit_float_arg(cls.name, arg, "survival threshold t"))

    def choose(self, ctx: StepContext) -> np.ndarray:
        # s is non-increasing along k, so the entries >= t form a prefix and their count is the length.
        L = (ctx.survival >= self.t).sum(axis=1).astype(np.int64)
        return cap_lowest_index_first(existing(ctx, L), draft_budget(ctx))   # t = 0 would count undrafted ones
