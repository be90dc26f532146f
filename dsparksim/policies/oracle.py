"""oracle — the waste-free upper bound: verifies only tokens that will be accepted (not realisable)."""
from __future__ import annotations

from typing import ClassVar

import numpy as np

from dsparksim.errors import InputError
from dsparksim.policies._common import draft_budget, eval_times, lengths_from_ranked
from dsparksim.policies.base import Policy, StepContext


def dinkelbach_choice(tokens: np.ndarray, times: np.ndarray, lam: float | None) -> int:
    """Index c maximising ``tokens[c] - lam * times[c]`` (smallest c on ties).

    ``lam`` None (no history yet) uses this step's own best ratio max(tokens/times): at that lambda the maximum is
    0, reached exactly where tokens/times is largest, so the choice is the per-step tokens-per-second bound.
    """
    if lam is None:
        lam = float(np.max(tokens / times))
    return int(np.argmax(tokens - lam * times))


class Oracle(Policy):
    """Knows each request's true accepted prefix A[i]; L[i] <= A[i] except for padding (emits n + min(sum L, sum A)).

    What it maximises: the long-run throughput sum(tokens) / sum(time), a ratio of sums, by Dinkelbach's
    criterion -- each step picks the total verified c in 0..min(n*K, max_tokens - base_tokens) maximising
    ``n + min(c, sum A) - lambda * step_time(base + c)`` (smallest c on ties), with lambda the running throughput of
    its own decode steps (ratio of exponentially discounted sums of emitted tokens and step time, half-life ~350
    steps; the first step uses its own best ratio, i.e. the per-step bound). A verified slot is worth its time
    when it raises the long-run ratio, not only this step's: myopic per-step ratio maximisation stops too early on
    steps that are better than average. When steps are independent (the options of a step do not depend on
    earlier choices) lambda converges to the best long-run ratio and the choice is optimal for it (Dinkelbach
    1967); in a serving engine the batch does depend on earlier steps, so the bound on throughput is checked
    empirically across seeds (tests/test_oracle_bound.py).

    Which slots: accepted slots first, water-filled position by position (all requests' slot 1, then slot 2, ...),
    lower request index first within a position; then -- only where the staircase is cheaper further up
    (T(1) > T(8) on the 7B H100 profile) -- rejected ones as padding, continuing each request's prefix the same way.
    The bound is on throughput at a given load among policies that share its drafter and K (same drafting cost,
    same draft KV slots); it is not a bound on per-user speed, nor on ``none`` or ``mtp1`` (other drafters).
    With early exit of drafting (``ctx.drafted``) only drafted positions are slots: A[i] counts as
    min(A[i], drafted[i]) and padding never reaches past drafted[i] (the engine could not verify it).
    """

    name: ClassVar[str] = "oracle"
    reads_confidence: ClassVar[bool] = False
    usage: ClassVar[str] = "oracle"
    needs_oracle: ClassVar[bool] = True
    # discount per decode step of the running throughput lambda: half-life ln 2 / (1/512) ~ 355 steps, long enough
    # to average over steps, short enough to follow a load that changes (open loop, warm-up)
    DECAY: ClassVar[float] = 1.0 - 1.0 / 512

    def __init__(self) -> None:
        super().__init__()
        self._tok = self._time = 0.0

    def reset(self, K: int, rng: np.random.Generator) -> None:
        self._tok = self._time = 0.0

    @property
    def lam(self) -> float | None:
        """The running throughput estimate (tokens per second of its decode steps); None before the first step."""
        return self._tok / self._time if self._time > 0 else None

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
        # early exit of drafting: positions past drafted[i] do not exist (the engine caps L at drafted), so the
        # verifiable accepted prefix is min(A, drafted) and only drafted positions are slots, padding included
        D = np.full(n, K, dtype=np.int64) if ctx.drafted is None else np.asarray(ctx.drafted, dtype=np.int64)
        A = np.minimum(A, D)
        # Candidate totals c = 0..budget of verified draft slots: accepted slots first (water-filled), then rejected
        # ones. Tokens = n + min(c, sum A); padding past sum A adds no token but, on a non-monotone staircase,
        # can make the step cheaper -- so the bound pads to the cheapest M at or above what it needs.
        acc = int(A.sum())
        budget = min(draft_budget(ctx), int(D.sum()))
        c = np.arange(budget + 1, dtype=np.int64)
        tokens = float(n) + np.minimum(c, acc)
        times = eval_times(ctx.step_time, ctx.base_tokens + c)
        best = dinkelbach_choice(tokens, times, self.lam)
        self._tok = self.DECAY * self._tok + float(tokens[best])
        self._time = self.DECAY * self._time + float(times[best])
        grid = np.arange(K)[:, None]                                     # k-major: f = k*n + i
        order = np.concatenate([np.flatnonzero((grid < A[None, :]).ravel()),
                                np.flatnonzero(((grid >= A[None, :]) & (grid < D[None, :])).ravel())])
        return lengths_from_ranked(order, best, n)
