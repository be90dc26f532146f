"""The step contract shared by the simulator and the torch runner (vLLM v1's SchedulerOutput / ModelRunnerOutput).

One engine step is schedule -> execute -> update (:class:`dsparksim.sim.driver.Driver`)::

    scheduler.drain(); new = scheduler.admit(now)   # take requests from the inbox (FIFO), admit FIFO
    pre = executor.start(scheduler.new_requests(new))  # the executor learns the admitted requests (slot, prompt)
    scheduler.apply_prefilled(pre, now)              # Prefilled: those it prefilled outside the loop decode on
    plan = scheduler.plan_step()                     # StepPlan: what runs, priced by the cost profile
    outcome = executor.execute(plan)                 # StepOutcome: duration, accepted prefix per decoding row
    done = scheduler.apply(plan, outcome, t_end)     # emit tokens, finish requests
    scheduler.record(plan, outcome, t_start)         # append the step to the engine's log
    executor.finish(done)                            # the executor frees the finished requests' state

:class:`CostExecutor` prices a plan on the cost profile (the simulator); the runner's executors run torch.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple, Protocol, Sequence

import numpy as np


@dataclass
class StepPlan:
    """What one engine step does. Arrays are aligned with ``decode`` (n decoding requests, admission order).

    decode:        (n,) int64 request rows decoding this step
    slots:         (n,) int64 their slots (acceptance-source state, KV slot of the real runner)
    verify:        (n,) int64 L, draft tokens verified per request (0..K), chosen by the policy
    conf:          (n, K) float64 the draft confidences the policy saw
    true_accepted: (n,) int64 accepted prefix had all K been verified (drawn); None = real verification decides
    prefill:       [(row, slot, tokens prefilled before this chunk, chunk tokens)] in FIFO order
    M:             tokens in the target forward: n + sum(verify) + prefill tokens
    kv_read:       context tokens read (prefilled + generated of every running request, + this step's chunks)
    prefill_qk:    query-key pairs of the prefill chunks' causal attention
    predicted_s:   the cost profile's price of exactly this step
    decode_qk:     query-key pairs of the decoding rows' attention (long-context term; sim/scheduler.py doc)
    preempted:     rows preempted (paged KV) since the previous plan, to make room for this step; None = none
    kv_pages:      KV pages held after this step's allocation (paged KV; 0 under reserve)
    drafted:       (n,) positions each decoding row drafted (early exit; None = all K)
    pad_tokens:    verify tokens a padded engine runs beyond M (pad_verify; priced, never verified)
    """

    decode: np.ndarray
    slots: np.ndarray
    verify: np.ndarray
    conf: np.ndarray | None
    true_accepted: np.ndarray | None
    prefill: list[tuple[int, int, int, int]]
    M: int
    n_prefill: int
    kv_read: int
    prefill_qk: int
    K: int
    predicted_s: float
    n_running: int = 0
    decode_qk: int = 0
    preempted: np.ndarray | None = None
    kv_pages: int = 0
    drafted: np.ndarray | None = None
    pad_tokens: int = 0

    @property
    def n_decode(self) -> int:
        return int(self.decode.size)


@dataclass
class StepOutcome:
    """What executing a plan gave. ``accepted``: (n,) accepted prefix per decoding row (0..verify).
    ``emitted``/``decode_emitted``/``drafts``/``accepted_total`` are filled by ``Scheduler.apply``;
    ``extra``: executor timings logged with the step (the real runner's draft/target/host split)."""

    duration_s: float
    accepted: np.ndarray
    emitted: int = 0
    decode_emitted: int = 0
    drafts: int = 0
    accepted_total: int = 0
    accepted_per_pos: np.ndarray | None = None
    extra: dict[str, float] = field(default_factory=dict)


class NewRequest(NamedTuple):
    """An admitted request as the executor needs it (vLLM's NewRequestData): its row, KV slot, prompt tokens (after
    a preemption: prompt + the tokens to recompute are re-prefilled on the same row) and domain."""

    row: int
    slot: int
    prompt_tokens: int
    domain: str


class Prefilled(NamedTuple):
    """Admitted requests whose prompts an executor prefilled outside the step loop, as a disaggregated prefill
    pool's KV arrives at the decode engine (here: the real runner's untimed prefill of ``measure``'s profiling
    cells): request ``rows[i]`` decodes from ``contexts[i]`` tokens (its prompt length becomes that context), its
    first token emitted at admission. Returned by :meth:`Executor.start`."""

    rows: np.ndarray
    contexts: np.ndarray


class Executor(Protocol):
    """Runs steps. ``tracks_requests``: whether it keeps per-request state (then :meth:`start` and :meth:`finish`
    are called; the simulator's :class:`CostExecutor` keeps none)."""

    tracks_requests: bool

    def start(self, new: Sequence[NewRequest]) -> Prefilled | None:
        """Requests admitted since the previous step (before the step that first schedules them); returns those
        whose prefill the executor did itself, outside the loop (None: none, the scheduler plans their prefill)."""

    def finish(self, rows: np.ndarray) -> None:
        """Requests that finished in the step just applied."""

    def execute(self, plan: StepPlan) -> StepOutcome:
        """Run ``plan``; ``duration_s``: the profile's price (simulator) or the measured execution time."""


class CostExecutor:
    """The simulator's executor: a step takes the profile's price of its plan; the drawn truth decides acceptance."""

    tracks_requests = False

    def start(self, new: Sequence[NewRequest]) -> Prefilled | None:
        return None

    def finish(self, rows: np.ndarray) -> None:
        pass

    def execute(self, plan: StepPlan) -> StepOutcome:
        a = (np.minimum(plan.verify, plan.true_accepted) if plan.n_decode else np.zeros(0, np.int64))
        return StepOutcome(duration_s=plan.predicted_s, accepted=a)
