"""confidence-global — global search on the CURRENT step's confidences. NOT lossless; for demonstrating bias.

The paper's Appendix A: with a global search, whether draft token 1 is verified can depend on c2, and c2 is
computed after token 1 was sampled, so the admission decision leaks the token's own realisation into what gets
verified and the output distribution is no longer the target's. The simulator cannot see that bias (it does not
model token values); only the real runner can. Never use it to compare serving policies.
"""
from __future__ import annotations

from typing import ClassVar

import numpy as np

from dsparksim.policies._common import Ranking, candidate_budget, global_best, ratio_curve
from dsparksim.policies.base import Policy, StepContext


def global_budget(ctx: StepContext, values: np.ndarray) -> int:
    """The b in 0..budget maximising (n + top-b survival sum) / step_time(base + b); smallest b on ties.

    ``values``: the survivals in :class:`Ranking` order (drafted positions first); the budget counts only the
    positions drafted (:func:`candidate_budget`), so b never reaches an undrafted one."""
    bmax = candidate_budget(ctx)
    return global_best(ratio_curve(float(ctx.n), values, ctx.base_tokens, ctx.step_time, bmax))


def global_search_current(ctx: StepContext) -> np.ndarray:
    """Admit the top-b* candidates by current survival, b* from a global search on current info (NOT lossless)."""
    if ctx.n == 0:
        return np.zeros(0, dtype=np.int64)
    ranking = Ranking(ctx.survival, ctx.drafted)
    return ranking.lengths(global_budget(ctx, ranking.values()))


class ConfidenceGlobal(Policy):
    """NOT LOSSLESS. Global search over current confidences (no early stop) — only to demonstrate the bias."""

    name: ClassVar[str] = "confidence-global"
    usage: ClassVar[str] = "confidence-global"
    lossless: ClassVar[bool] = False

    def choose(self, ctx: StepContext) -> np.ndarray:
        return global_search_current(ctx)
