"""The real serving engine: the simulator's scheduler driving real torch forwards, timed by a real clock.

Built on the public step contract of :mod:`dsparksim.sim.engine` only: admission (FIFO, KV reservation), chunked
prefill, the policy call (the very same policy objects, seeing the same StepContext), the acceptance draw,
emission and the result arrays are the simulator's own :class:`~dsparksim.sim.engine.Engine`, and arrivals, the closed
loop and rejection on arrival are :class:`~dsparksim.sim.cluster.Simulation`'s (with a ``driver_factory`` that steps the
engine on the real clock). The executor (:class:`~.executor.Executor`, or :class:`~.live.LiveExecutor` whose trained
drafter proposes through ``plan_step(draft=...)``) implements ``execute(plan) -> StepOutcome``.

What changes is the clock: each step's duration is the measured time (wall clock; or, on a shared CPU with one
torch thread, this thread's CPU time, which other processes' preemption does not inflate — see
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
import simpy

from dsparksim.sim.cluster import Simulation, SimResult
from dsparksim.sim.engine import Engine, StepOutcome, StepPlan
from dsparksim.errors import ConfigError

EXTRA_LOG = ("dt_model", "t_draft", "t_target", "t_host", "pf_qk", "pf_chunks", "dec_qk", "t_replay")


def step_extra(plan: StepPlan, draft_s: float, target_s: float) -> dict[str, float]:
    """The executor columns logged with a step (EXTRA_LOG order; ``t_host`` is filled by :meth:`RealStepper.end`
    once the whole step, apply included, has been timed)."""
    return {"dt_model": plan.predicted_s, "t_draft": draft_s, "t_target": target_s, "t_host": float("nan"),
            "pf_qk": plan.prefill_qk, "pf_chunks": len(plan.prefill), "dec_qk": plan.decode_qk}


def connect(engine: Engine, executor: Any) -> None:
    """Follow the engine's requests on the executor: an admitted request gets its KV slot and prompt tokens
    (``executor.start``), a finished one frees its state (``executor.finish``)."""
    req = engine.req

    def admitted(rows: list[int]) -> None:
        for row in rows:
            executor.start(int(row), int(req.slot_of[row]), int(req.prompt[row]), str(req.domain[row]))

    def finished(rows: np.ndarray, now: float) -> None:
        for row in rows:
            executor.finish(int(row))

    engine.on_admit.append(admitted)
    engine.on_finish.append(finished)


class RealStepper:
    """One engine's steps on a measured clock: plan + execute (:meth:`begin`), then apply + record (:meth:`end`).

    ``live``: the executor's trained drafter proposes the step's drafts (``plan_step(draft=executor.propose)``,
    no drawn truth); the executor's verification decides the accepted prefixes.

    Trace replay: the acceptance draw (the engine's keyed replay of the trace: confidences and true accepted
    prefix) stands in for the drafter's confidence head and is the replay's machinery, not serving work (the
    drafter proxy's forward is timed in the executor). It is timed apart, logged as ``t_replay`` and left out of
    the step's measured time; it cost 0.1-0.2 ms a step here, up to a fifth of a one-request step's host time,
    and the profile (measured with a trivial draw) would otherwise under-price every real step's host loop.
    """

    def __init__(self, engine: Engine, executor: Any, clock: Callable[[], float] | None = None,
                 live: bool = False) -> None:
        self.engine, self.ex = engine, executor
        self.clock = clock or executor.clock
        K = engine.K
        self.draft = (lambda rows, slots: executor.propose(rows, slots, K)) if live else self._replay_draw
        self._replay = 0.0

    def _replay_draw(self, rows: np.ndarray, slots: np.ndarray):
        t0 = self.clock()
        blk = self.engine.draw(rows, slots)
        self._replay += self.clock() - t0
        return blk

    def begin(self) -> tuple[StepPlan, StepOutcome, float] | None:
        """Plan and execute the next step; returns (plan, outcome, measured seconds so far, the replay draw left
        out), None if nothing runs."""
        self._replay = 0.0
        t0 = self.clock()
        plan = self.engine.plan_step(draft=self.draft)
        if plan is None:
            return None
        out = self.ex.execute(plan)
        dt = self.clock() - t0 - self._replay
        out.extra["t_replay"] = self._replay
        return plan, out, dt

    def end(self, plan: StepPlan, out: StepOutcome, dt: float, t_start: float, t_end: float) -> float:
        """Apply the step at ``t_end`` and log it with dt = measured plan + execute + apply time; returns the
        apply time (the caller advances its clock by it)."""
        t1 = self.clock()
        self.engine.apply(plan, out, t_end)
        t_apply = self.clock() - t1
        out.duration_s = dt + t_apply
        out.extra["t_host"] = out.duration_s - out.extra["t_draft"] - out.extra["t_target"]
        self.engine.record(plan, out, t_start)
        return t_apply


class RealDriver:
    """The SimPy process of the real engine (the cluster's driver protocol: ``run()`` and ``wake``): the step
    contract with measured durations; the apply time is added after the step's tokens are emitted."""

    def __init__(self, env: simpy.Environment, stepper: RealStepper,
                 checkpoint: Callable[[int], None] | None = None, every_s: float = 0.5,
                 after_step: Callable[[int, StepPlan], None] | None = None) -> None:
        self.env, self.stepper = env, stepper
        # after_step(step index, plan) once a step is applied and logged, also off the measured clock (the
        # paired reference cells of runner.paired)
        self.after_step = after_step
        self.wake: simpy.Event | None = None
        # checkpoint(next step index) between steps every ``every_s`` of measured time (the drift windows): it
        # runs off the measured clock, so whatever it does (re-timing a reference, waiting) changes nothing here
        self.checkpoint, self.every_s = checkpoint, every_s
        self.steps, self._since = 0, float("inf")

    def run(self):
        env, st, eng = self.env, self.stepper, self.stepper.engine
        while True:
            now = env.now
            eng.drain()
            eng.admit(now)
            if self.checkpoint is not None and self._since >= self.every_s:
                self.checkpoint(self.steps)
                self._since = 0.0
            step = st.begin()
            if step is None:
                # idle: wait (in simulated time, no sleeping) for the cluster to route the next request here
                self.wake = env.event()
                yield self.wake
                self.wake = None
                continue
            plan, out, dt = step
            # a step that would end after the horizon never completes: the cluster stops the clock first
            yield env.timeout(dt)
            t_apply = st.end(plan, out, dt, now, env.now)
            if self.after_step is not None:
                self.after_step(self.steps, plan)
            self.steps += 1
            self._since += dt + t_apply
            yield env.timeout(t_apply)


class RealEngine:
    """Continuous-batching speculative decoding on a real target (trace-replay acceptance); see module doc.

    Takes :class:`~dsparksim.sim.cluster.Simulation`'s keyword arguments (one replica, one rank) plus the executor.
    """

    live = False

    def __init__(self, *, executor: Any, clock: Callable[[], float] | None = None,
                 checkpoint: Callable[[int], None] | None = None, checkpoint_every_s: float = 0.5,
                 after_step: Callable[[int, StepPlan], None] | None = None, **kw: Any) -> None:
        for k in ("replicas", "dp_ranks"):
            if kw.get(k, 1) != 1:
                raise ConfigError("runner", k, f"the real engine serves one engine on one device, got {k}={kw[k]}")
        if "driver_factory" in kw:
            raise TypeError("RealEngine sets its own driver_factory")
        self.ex = executor
        self.clock = clock or executor.clock   # the executor's clock (wall, or thread CPU time on a shared CPU)
        self.checkpoint, self.checkpoint_every_s, self.after_step = checkpoint, checkpoint_every_s, after_step
        self.sim = Simulation(driver_factory=self.driver, **kw)
        (self.engine,) = self.sim.engines
        connect(self.engine, executor)
        self.stepper = RealStepper(self.engine, executor, self.clock, live=self.live)

    def driver(self, env: simpy.Environment, ranks: list[Engine]) -> RealDriver:
        """The cluster's driver_factory: the real clock's process for this (single) engine."""
        if ranks != [self.engine]:
            raise ConfigError("runner", "replicas", "the real engine drives exactly its one engine")
        return RealDriver(env, self.stepper, self.checkpoint, self.checkpoint_every_s, self.after_step)

    def describe(self) -> str:
        return f"real (torch), trace-replay acceptance; step time = measured {self.ex.ex.clock_name()} clock"

    def run(self) -> SimResult:
        res = self.sim.run()
        n = len(res.steps["dt"])
        for k in EXTRA_LOG:               # present even when no step ran
            if k not in res.steps:
                res.steps[k] = np.full(n, np.nan)
        res.notes["engine"] = self.describe()
        return res


class LiveEngine(RealEngine):
    """The real engine with trained drafters deciding acceptance online (:mod:`.live`): the step's confidences come
    from a real drafter forward, the accepted prefix from rejection sampling against the target."""

    live = True

    def describe(self) -> str:
        return (f"real (torch), live drafter '{self.ex.kind}' (acceptance by rejection sampling); "
                f"step time = measured {self.ex.ex.clock_name()} clock")
