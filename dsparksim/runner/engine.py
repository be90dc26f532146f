"""The real serving engine: the simulator's scheduler driving real torch forwards, timed by a real clock.

Built on the step contract of :mod:`dsparksim.sim.contract` only: admission (FIFO, KV reservation), chunked
prefill, the policy call (the very same policy objects, seeing the same StepContext), the acceptance draw,
emission and the result arrays are the simulator's own :class:`~dsparksim.sim.scheduler.Scheduler`, arrivals, the
closed loop and rejection on arrival are :class:`~dsparksim.sim.cluster.Simulation`'s, and the step loop is the
simulator's one :class:`~dsparksim.sim.driver.Driver`. The executor (:class:`~.executor.Executor`, or
:class:`~.live.LiveExecutor` whose trained drafter proposes through ``plan_step(draft=...)``) implements the
contract's Executor: ``start`` / ``finish`` (admitted and finished requests) and ``execute(plan) -> StepOutcome``.

What changes is the clock (:class:`MeasuredClock`): each step's duration is the measured time (wall clock; or, on a
shared CPU with one torch thread, this thread's CPU time, which other processes' preemption does not inflate — see
ExecutorConfig.clock) of planning it (acceptance draw or drafter proposal + policy), executing it (drafter forward,
one flattened target forward, sampling) and applying it (bookkeeping, ``policy.observe``) — not the profile's
prediction. The profile still prices candidate batches *inside* the policies (that is how a real DSpark scheduler
works: it plans on the measured SPS curve). Every step also logs the profile's prediction ``dt_model`` next to the
measured ``dt`` and the split ``t_draft``/``t_target``/``t_host``, so simulator error can be traced step by step.

Open-loop idle gaps (no request running, next arrival in the future) advance the clock without sleeping.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from dsparksim.acceptance.base import Block
from dsparksim.sim.cluster import SimResult
from dsparksim.sim.contract import StepOutcome, StepPlan
from dsparksim.sim.scheduler import Scheduler

EXTRA_LOG = ("dt_model", "t_draft", "t_target", "t_host", "pf_qk", "pf_chunks", "dec_qk", "t_replay")


def step_extra(plan: StepPlan, draft_s: float, target_s: float) -> dict[str, float]:
    """The executor columns logged with a step (EXTRA_LOG order; ``t_host`` is filled by
    :meth:`MeasuredClock.applied` once the whole step, apply included, has been timed)."""
    return {"dt_model": plan.predicted_s, "t_draft": draft_s, "t_target": target_s, "t_host": float("nan"),
            "pf_qk": plan.prefill_qk, "pf_chunks": len(plan.prefill), "dec_qk": plan.decode_qk}


class MeasuredClock:
    """The real runner's step clock (a :class:`~dsparksim.sim.driver.StepClock`, one engine): a step lasts the
    measured time of planning + executing it (until its tokens exist) and then of applying it.

    ``live``: the executor's trained drafter proposes the step's drafts (``plan_step(draft=executor.propose)``,
    no drawn truth); the executor's verification decides the accepted prefixes.

    Trace replay: the acceptance draw (the engine's keyed replay of the trace: confidences and true accepted
    prefix) stands in for the drafter's confidence head and is the replay's machinery, not serving work (the
    drafter proxy's forward is timed in the executor). It is timed apart, logged as ``t_replay`` and left out of
    the step's measured time; it cost 0.1-0.2 ms a step here, up to a fifth of a one-request step's host time,
    and the profile (measured with a trivial draw) would otherwise under-price every real step's host loop.

    ``checkpoint(next step index)`` runs between steps every ``every_s`` of measured time (the drift windows) and
    ``after_step(step index, plan)`` once a step is applied and logged (the paired reference cells of
    runner.paired); both run off the measured clock, so whatever they do changes nothing here.
    """

    measured = True

    def __init__(self, executor: Any, live: bool = False, clock: Callable[[], float] | None = None,
                 checkpoint: Callable[[int], None] | None = None, every_s: float = 0.5,
                 after_step: Callable[[int, StepPlan], None] | None = None) -> None:
        self.ex, self.live = executor, live
        self.clock = clock or executor.clock   # the executor's clock (wall, or thread CPU time on a shared CPU)
        self.checkpoint, self.every_s, self.after_step = checkpoint, every_s, after_step
        self._since = float("inf")
        self._replay = self._t0 = self._t1 = 0.0

    def drafter(self, scheduler: Scheduler) -> Callable[[np.ndarray, np.ndarray], Block]:
        if self.live:
            K, ex = scheduler.K, self.ex
            return lambda rows, slots: ex.propose(rows, slots, K)

        def replay_draw(rows: np.ndarray, slots: np.ndarray) -> Block:
            t0 = self.clock()
            blk = scheduler.draw(rows, slots)
            self._replay += self.clock() - t0
            return blk
        return replay_draw

    def planning(self, step: int) -> None:
        if self.checkpoint is not None and self._since >= self.every_s:
            self.checkpoint(step)
            self._since = 0.0
        self._replay = 0.0
        self._t0 = self.clock()

    def executed(self, outcome: StepOutcome) -> float:
        dt = self.clock() - self._t0 - self._replay
        outcome.extra["t_replay"] = self._replay
        return dt

    def applying(self) -> None:
        self._t1 = self.clock()

    def applied(self, outcome: StepOutcome, dt: float) -> float:
        t_apply = self.clock() - self._t1
        outcome.duration_s = dt + t_apply
        outcome.extra["t_host"] = outcome.duration_s - outcome.extra["t_draft"] - outcome.extra["t_target"]
        return t_apply

    def stepped(self, step: int, plan: StepPlan, seconds: float) -> None:
        if self.after_step is not None:
            self.after_step(step, plan)
        self._since += seconds


def real_result(res: SimResult, describe: str) -> SimResult:
    """A real run's result: the executor's step columns present even when no step ran, and what ran it."""
    n = len(res.steps["dt"])
    for k in EXTRA_LOG:
        if k not in res.steps:
            res.steps[k] = np.full(n, np.nan)
    res.notes["engine"] = describe
    return res
