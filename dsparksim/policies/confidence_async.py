"""confidence-async:LAG — production DSpark: budget from a global search on LAG-step-old info, admit by rank."""
from __future__ import annotations

from collections import deque
from typing import ClassVar

import numpy as np

from dsparksim.policies._common import Ranking, candidate_budget, int_arg, spec_error
from dsparksim.policies.base import Policy, StepContext
from dsparksim.policies.confidence import early_stop_count
from dsparksim.policies.confidence_global import global_budget


class ConfidenceAsync(Policy):
    """Draft budget b* from a global search over the step LAG steps earlier; current slots admitted by rank.

    At every step t the policy computes, from that step's own context only (its n, base_tokens, survivals,
    step_time and max_tokens), b_t = argmax_b (n + top-b survival sum) / step_time(base + b) over all b (no early
    stop, so a jagged step-time staircase cannot trap it), and queues it. Step t uses b_{t-LAG}: the current
    candidates are admitted by current survival rank (ties: lower position, then request) up to
    min(b_{t-LAG}, max_tokens - base_tokens, n*K, positions drafted). Since the budget was fixed before this step's tokens were
    sampled and a token only competes with candidates ranked above it, the decision stays lossless.
    For the first LAG steps after ``reset`` there is no stale budget yet; those steps fall back to Algorithm 1's
    early stop on current information (also causal). LAG must be >= 1: LAG = 0 would be ``confidence-global``,
    which is not lossless.
    """

    name: ClassVar[str] = "confidence-async"
    usage: ClassVar[str] = "confidence-async[:LAG]"
    default_lag: ClassVar[int] = 2

    def __init__(self, lag: int = 2, spec: str | None = None) -> None:
        if lag < 1:
            raise spec_error(self.name, str(lag), "LAG must be >= 1 (LAG=0 is 'confidence-global', not lossless)")
        self.lag = int(lag)
        self.spec = spec or f"confidence-async:{self.lag}"
        self._pending: deque[int] = deque()

    @classmethod
    def from_arg(cls, arg: str | None) -> "ConfidenceAsync":
        if arg is None:
            return cls(cls.default_lag, spec=cls.name)
        if arg.strip() == "0":
            raise spec_error(cls.name, arg, "LAG must be >= 1 (LAG=0 is 'confidence-global', not lossless)")
        return cls(int_arg(cls.name, arg, 1, "LAG (steps)"))

    def reset(self, K: int, rng: np.random.Generator) -> None:
        self._pending.clear()

    def choose(self, ctx: StepContext) -> np.ndarray:
        if ctx.n == 0:  # nothing decodes: no information, leave the queue as it is
            return np.zeros(0, dtype=np.int64)
        ranking = Ranking(ctx.survival, ctx.drafted)  # rank order without a full argsort (see Ranking)
        values = ranking.values()
        if len(self._pending) >= self.lag:
            count = min(self._pending.popleft(), candidate_budget(ctx))
        else:
            count = early_stop_count(ctx, values)
        self._pending.append(global_budget(ctx, values))  # for step t + LAG
        return ranking.lengths(count)
