"""The one step loop: schedule -> execute -> update, as vLLM v1's ``EngineCore.step``, for the simulator and the real
runner alike. Its clock is swappable (:class:`StepClock`): the profile's price in the simulator (:class:`PriceClock`),
the measured time in the runner (``dsparksim.runner.engine.MeasuredClock``).

A :class:`Driver` steps one replica: its ranks (one scheduler unless DP) in lockstep, the step taking as long as
the slowest rank (each rank's own time logged as ``rank_busy_s``). Under SimPy (:meth:`Driver.run`, the replica's
process) it waits on ``wake`` while nothing runs; :meth:`Driver.step` runs one step outside SimPy (the runner's
profiling cells). The contract it drives is :mod:`dsparksim.sim.contract`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Protocol

import numpy as np

from dsparksim.acceptance.base import Block
from dsparksim.sim.contract import CostExecutor, Executor, StepOutcome, StepPlan
from dsparksim.sim.dp_balance import DPBalance

if TYPE_CHECKING:   # annotations only: the scheduler module is the driver's caller's concern
    import simpy

    from dsparksim.sim.scheduler import Scheduler

Draft = Callable[[np.ndarray, np.ndarray], Block]


class StepClock(Protocol):
    """How long a step takes. ``measured``: False for the profile's price (the step lasts its outcome's
    ``duration_s``; applying takes no time), True for a clock read around planning, executing and applying."""

    measured: bool

    def drafter(self, scheduler: "Scheduler") -> Draft | None:
        """What replaces the scheduler's acceptance draw in ``plan_step`` (None: the draw itself)."""

    def planning(self, step: int) -> None:
        """Step ``step`` is about to be planned."""

    def executed(self, outcome: StepOutcome) -> float:
        """Seconds planning and executing took (until the step's tokens exist)."""

    def applying(self) -> None:
        """The executed step is about to be applied."""

    def applied(self, outcome: StepOutcome, dt: float) -> float:
        """Seconds applying took (0 for the price); completes ``outcome.duration_s`` and its timings."""

    def stepped(self, step: int, plan: StepPlan, seconds: float) -> None:
        """Step ``step`` is applied and logged; it took ``seconds`` in all."""


class PriceClock:
    """The simulator's clock: a step takes the cost profile's price of its plan (:class:`CostExecutor`)."""

    measured = False

    def drafter(self, scheduler: "Scheduler") -> Draft | None:
        return None

    def planning(self, step: int) -> None:
        pass

    def executed(self, outcome: StepOutcome) -> float:
        return outcome.duration_s

    def applying(self) -> None:
        pass

    def applied(self, outcome: StepOutcome, dt: float) -> float:
        return 0.0

    def stepped(self, step: int, plan: StepPlan, seconds: float) -> None:
        pass


class Driver:
    """Schedule -> execute -> update for one replica's ranks (see the module doc). ``done(rows, now)``: requests
    that finished at ``now`` (the cluster's closed loop and stop rules follow them)."""

    def __init__(self, env: "simpy.Environment | None", ranks: list["Scheduler"], executor: Executor | None = None,
                 clock: StepClock | None = None,
                 done: Callable[[np.ndarray, float], None] | None = None, balance: DPBalance | None = None) -> None:
        self.env, self.ranks = env, ranks
        self.balance = balance   # DP ranks' context hold (sim/dp_balance.py); None = each rank prefills at once
        self.ex = CostExecutor() if executor is None else executor
        self.clock = PriceClock() if clock is None else clock
        self.done = done
        self.track = self.ex.tracks_requests
        self.drafts = [self.clock.drafter(eng) for eng in ranks]
        self.wake: "simpy.Event | None" = None
        self.proc = None
        self.steps = 0

    def admit(self, eng: "Scheduler", now: float) -> list[int]:
        """Rank ``eng`` drains its inbox and admits at ``now`` (the schedule's first half); the executor starts the
        admitted requests, and those it prefilled outside the loop (:class:`~.contract.Prefilled`) decode from their
        contexts. Returns the rows admitted."""
        eng.drain()
        new = eng.admit(now)
        if new and self.track:
            pre = self.ex.start(eng.new_requests(new))
            if pre is not None:
                eng.apply_prefilled(pre, now)
        return new

    def schedule(self, now: float) -> list[tuple["Scheduler", StepPlan]]:
        """Admit and plan every rank's step at ``now``; the ranks with something to run. With the DP balance every
        rank admits first (it decides for all ranks at once from all their requests); without it each rank admits
        just before it plans."""
        balance = self.balance
        if balance is not None:
            for eng in self.ranks:
                self.admit(eng, now)
        prefill = balance is None or not balance.hold(self.ranks)
        plans = []
        for eng, draft in zip(self.ranks, self.drafts):
            if balance is None:
                self.admit(eng, now)
            self.clock.planning(self.steps)
            p = eng.plan_step(draft, prefill=prefill)
            if p is not None:
                plans.append((eng, p))
        return plans

    def execute(self, plans: list[tuple["Scheduler", StepPlan]]) -> tuple[list[StepOutcome], float]:
        """Execute the planned steps; (outcomes, the step's seconds: the slowest rank's)."""
        ex, clock = self.ex, self.clock
        outs = [ex.execute(p) for _, p in plans]
        busy = [clock.executed(o) for o in outs]
        dt = max(busy)       # lockstep: the slowest rank sets the step
        if len(self.ranks) > 1:
            for o, b in zip(outs, busy):
                o.extra["rank_busy_s"] = b
                o.duration_s = dt
        return outs, dt

    def update(self, plans: list[tuple["Scheduler", StepPlan]], outs: list[StepOutcome], t_start: float,
               t_end: float, dt: float) -> float:
        """Apply and log the executed steps (``dt`` seconds from ``t_start``) at ``t_end``; returns the seconds
        applying took (measured clock)."""
        clock, extra = self.clock, 0.0
        for (eng, p), o in zip(plans, outs):
            clock.applying()
            rows = eng.apply(p, o, t_end)
            extra = max(extra, clock.applied(o, dt))
            eng.record(p, o, t_start)
            if len(rows):
                if self.track:
                    self.ex.finish(rows)
                if self.done is not None:
                    self.done(rows, t_end)
            clock.stepped(self.steps, p, dt + extra)
        self.steps += 1
        return extra

    def run(self):
        """The replica's SimPy process."""
        env, measured = self.env, self.clock.measured
        while True:
            now = env.now
            plans = self.schedule(now)
            if not plans:
                # idle: wait (in simulated time, no sleeping) for the cluster to route the next request here
                self.wake = env.event()
                yield self.wake
                self.wake = None
                continue
            outs, dt = self.execute(plans)
            # a step that would end after the horizon never completes: the cluster stops the clock first
            yield env.timeout(dt)
            extra = self.update(plans, outs, now, env.now, dt)
            if measured:
                yield env.timeout(extra)   # the measured apply time, after the step's tokens were emitted

    def step(self, now: float) -> tuple[list[tuple["Scheduler", StepPlan]], list[StepOutcome], float] | None:
        """One step outside SimPy, starting at ``now``: (plans, outcomes, end time), None if nothing runs."""
        plans = self.schedule(now)
        if not plans:
            return None
        outs, dt = self.execute(plans)
        return plans, outs, now + dt + self.update(plans, outs, now, now + dt, dt)
