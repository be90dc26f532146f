"""goodput — one batch-wide verify length from online per-position acceptance rates (no confidence head).

What vLLM's dynamic speculative decoding and SmartSpec do: the strongest load-aware peer that does not look at
per-request confidence.
"""
from __future__ import annotations

from typing import ClassVar

import numpy as np

from dsparksim.errors import InputError
from dsparksim.policies._common import draft_budget, eval_times
from dsparksim.policies.base import Policy, StepContext


class Goodput(Policy):
    """Pick one L for the whole batch maximising n*(1 + sum_{k<=L} prod_{j<=k} alpha_j) / step_time(base + n*L).

    alpha_j is the conditional acceptance rate of draft position j observed so far in this run:
    tried_j = #(L >= j and a >= j-1) (position j was verified and reached), succ_j = #(a >= j), and
    alpha_j = (succ_j + 1) / (tried_j + 2), the posterior mean under a Beta(1, 1) prior — so a position never
    tried yet counts as 0.5. Counts are cumulative over the run (cleared by ``reset``). A position beyond every
    length chosen so far keeps its prior: the policy does not explore. Ties go to the shorter L. L is capped at
    K and at floor((max_tokens - base_tokens) / n) so it stays batch-wide.
    """

    name: ClassVar[str] = "goodput"
    reads_confidence: ClassVar[bool] = False
    usage: ClassVar[str] = "goodput"
    prior_succ: ClassVar[float] = 1.0  # Beta(1, 1)
    prior_fail: ClassVar[float] = 1.0

    def __init__(self) -> None:
        super().__init__()
        self._tried = np.zeros(0, dtype=np.int64)
        self._succ = np.zeros(0, dtype=np.int64)

    def reset(self, K: int, rng: np.random.Generator) -> None:
        self._tried = np.zeros(K, dtype=np.int64)
        self._succ = np.zeros(K, dtype=np.int64)

    def _grow(self, K: int) -> None:
        if K > self._tried.size:  # used without reset(): start from the prior
            self._tried = np.concatenate([self._tried, np.zeros(K - self._tried.size, dtype=np.int64)])
            self._succ = np.concatenate([self._succ, np.zeros(K - self._succ.size, dtype=np.int64)])

    @property
    def rates(self) -> np.ndarray:
        """Current alpha_j estimates, j = 1..K (index 0 = position 1)."""
        return (self._succ + self.prior_succ) / (self._tried + self.prior_succ + self.prior_fail)

    def choose(self, ctx: StepContext) -> np.ndarray:
        n, K = ctx.n, ctx.K
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        self._grow(K)
        l_max = min(K, draft_budget(ctx) // n)
        per_req = np.empty(l_max + 1)
        per_req[0] = 1.0
        np.cumsum(np.cumprod(self.rates[:l_max]), out=per_req[1:])
        per_req[1:] += 1.0
        Ls = np.arange(l_max + 1, dtype=np.int64)
        ratio = n * per_req / eval_times(ctx.step_time, ctx.base_tokens + n * Ls)
        return np.full(n, int(np.argmax(ratio)), dtype=np.int64)

    def observe(self, request_ids: np.ndarray, verify_len: np.ndarray, accepted: np.ndarray) -> None:
        L = np.asarray(verify_len, dtype=np.int64)
        a = np.asarray(accepted, dtype=np.int64)
        if L.shape != a.shape or (a < 0).any() or (a > L).any():
            raise InputError("observe", "accepted", f"need 0 <= accepted <= verify_len elementwise with equal "
                             f"shapes, got shapes {a.shape}/{L.shape}")
        if L.size == 0:
            return
        self._grow(int(L.max()))
        K = self._tried.size
        # request i reached and verified positions 1..min(L, a+1); it accepted positions 1..a.
        reach = np.bincount(np.minimum(L, a + 1), minlength=K + 1)
        acc = np.bincount(a, minlength=K + 1)
        self._tried += np.cumsum(reach[::-1])[::-1][1:K + 1]  # tried_j = #(reach >= j)
        self._succ += np.cumsum(acc[::-1])[::-1][1:K + 1]
