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

    Early exit of drafting (``StepContext.drafted``, ``--draft-exit T``): request i verifies min(L, drafted[i])
    (the engine caps L there), so the rule is applied to the step those lengths make on a variable-length engine:
    L maximises
    sum_i (1 + sum_{k<=min(L, drafted[i])} prod_{j<=k} alpha_j) / step_time(base + sum_i min(L, drafted[i])),
    over L = 0..min(K, max(drafted)) whose step fits (base + sum_i min(L, drafted[i]) <= max_tokens); ties go to
    the shorter L, and the lengths returned are min(L, drafted[i]). ``step_time`` prices that M as it prices any
    (its long-context term, if any, at the mean context). Pricing n*L tokens and counting n full prefixes, as
    without early exit, chose from steps the engine never runs. Without early exit (``drafted`` None) the rule
    above is the same and the code path is unchanged.

    Padded verification (``--pad-verify``) is not in the price: policies are not told about padding (by design,
    docs/serving.md), so M is priced as above while the engine charges M + pad_tokens, pad_tokens =
    n_decode * max(L_i) - sum(L_i). Without early exit the lengths are one batch-wide L and pad nothing; with it,
    the min(L, drafted[i]) differ and the engine charges base + n_decode * max_i min(L, drafted[i]) for the step
    this policy priced at base + sum_i min(L, drafted[i]).
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
        if ctx.drafted is not None:
            return self._choose_drafted(ctx, np.asarray(ctx.drafted, dtype=np.int64))
        l_max = min(K, draft_budget(ctx) // n)
        per_req = np.empty(l_max + 1)
        per_req[0] = 1.0
        np.cumsum(np.cumprod(self.rates[:l_max]), out=per_req[1:])
        per_req[1:] += 1.0
        Ls = np.arange(l_max + 1, dtype=np.int64)
        ratio = n * per_req / eval_times(ctx.step_time, ctx.base_tokens + n * Ls)
        return np.full(n, int(np.argmax(ratio)), dtype=np.int64)

    def _choose_drafted(self, ctx: StepContext, d: np.ndarray) -> np.ndarray:
        """:meth:`choose` under early exit: each candidate L priced and counted as the step the engine runs,
        request i verifying min(L, d[i]) (class doc)."""
        n, top = ctx.n, min(ctx.K, int(d.max()))
        per_pos = np.bincount(d, minlength=top + 1)[:top + 1]          # requests that drafted exactly j positions
        below = np.concatenate([[0], np.cumsum(per_pos)[:-1]])          # requests with d < L, L = 0..top
        Ls = np.arange(top + 1, dtype=np.int64)
        # sum_i min(L, d_i): the requests with d < L verify their d, the others L
        tokens = np.concatenate([[0], np.cumsum(per_pos * Ls)[:-1]]) + Ls * (n - below)
        l_max = int(np.flatnonzero(tokens <= draft_budget(ctx))[-1])   # tokens[0] = 0 always fits
        per_req = np.empty(l_max + 1)
        per_req[0] = 1.0
        np.cumsum(np.cumprod(self.rates[:l_max]), out=per_req[1:])
        per_req[1:] += 1.0
        short = per_pos[:l_max + 1] * per_req                           # expected tokens of the d = j requests
        expect = np.concatenate([[0.0], np.cumsum(short)[:-1]]) + (n - below[:l_max + 1]) * per_req
        ratio = expect / eval_times(ctx.step_time, ctx.base_tokens + tokens[:l_max + 1])
        return np.minimum(d, int(np.argmax(ratio)))

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
