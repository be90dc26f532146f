"""The real serving engine: the simulator's scheduler driving real torch forwards, timed by a real clock.

:class:`RealEngine` subclasses :class:`dsparksim.engine.Simulation`, so admission (FIFO, KV reservation), chunked
prefill, the policy call (the very same policy objects, seeing the same StepContext), the acceptance draw,
emission and the result arrays are the simulator's own code. What changes is the clock: each step's duration is
the measured time (wall clock; or, on a shared CPU with one torch thread, this thread's CPU time, which
other processes' preemption does not inflate — see ExecutorConfig.clock) of planning it (acceptance draw + policy), executing it (drafter forward, one flattened
target forward, sampling) and applying it (bookkeeping, ``policy.observe``) — not the profile's prediction. The
profile still prices candidate batches *inside* the policies (that is how a real DSpark scheduler works: it plans
on the measured SPS curve). Every step also logs the profile's prediction ``dt_model`` next to the measured
``dt`` and the split ``t_draft``/``t_target``/``t_host``, so simulator error can be traced step by step.

Open-loop idle gaps (no request running, next arrival in the future) advance the clock without sleeping.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import simpy

from ..engine import DECODE as DECODE_PHASE  # noqa: F401 - re-exported for the profiler
from ..engine import Simulation
from .executor import Executor

EXTRA_LOG = ("dt_model", "t_draft", "t_target", "t_host", "pf_qk", "pf_chunks")


class RealEngine(Simulation):
    """Continuous-batching speculative decoding on a real target (trace-replay acceptance); see module doc."""

    def __init__(self, *, executor: Executor, clock: Callable[[], float] | None = None, **kw: Any) -> None:
        super().__init__(**kw)
        self.ex = executor
        self.clock = clock or executor.clock   # the executor's clock (wall, or thread CPU time on a shared CPU)
        for k in EXTRA_LOG:
            self.log[k] = []
        self.notes["engine"] = (f"real (torch), trace-replay acceptance; step time = measured "
                                f"{executor.ex.clock_name()} clock")

    # ---------------------------------------------------------------- lifecycle hooks
    def _admit(self, now: float) -> None:
        before = len(self.running)
        super()._admit(now)
        for row in self.running[before:]:
            self.ex.start(int(row), int(self.slot_of[row]), int(self.prompt[row]), str(self.domain[row]))

    def _finish(self, rows: np.ndarray, now: float) -> None:
        for r in rows:
            self.ex.finish(int(r))
        super()._finish(rows, now)

    # ---------------------------------------------------------------- one real step
    def _execute(self, plan: dict[str, Any]):
        dec = plan["dec"]
        chunks = [(int(r), int(self.slot_of[r]), int(self.prefilled[r]), int(c)) for r, c in plan["chunks"]]
        return self.ex.execute(dec, self.slot_of[dec], plan["L"], plan["a"], self.K, chunks)

    def step_once(self, now: float) -> tuple[float, float, dict[str, Any], Any]:
        """Plan + execute one step; returns (measured seconds so far, model seconds, plan, timing)."""
        t0 = self.clock()
        dt_model, plan = self._plan_step()
        tm = self._execute(plan)
        return self.clock() - t0, dt_model, plan, tm

    def apply_once(self, t_end: float, t_start: float, dt: float, dt_model: float, plan: dict[str, Any], tm) -> float:
        """Apply a step (bookkeeping + observe), log it; returns the apply time (added to the step's dt)."""
        t1 = self.clock()
        self._apply_step(t_end, t_start, dt, plan)
        t_apply = self.clock() - t1
        lg = self.log
        lg["dt"][-1] = dt + t_apply
        lg["dt_model"].append(dt_model)
        lg["t_draft"].append(tm.draft_s)
        lg["t_target"].append(tm.target_s)
        lg["t_host"].append(dt + t_apply - tm.draft_s - tm.target_s)
        lg["pf_qk"].append(plan["pf_qk"])
        lg["pf_chunks"].append(len(plan["chunks"]))
        return t_apply

    # ------------------------------------------------------- one step (the simulator's loop, real clock)
    def _step(self, env: simpy.Environment, now: float):
        dt, dt_model, plan, tm = self.step_once(now)
        if self.duration is not None and now + dt > self.duration:
            yield env.timeout(self.duration - now)
            return True
        yield env.timeout(dt)
        t_apply = self.apply_once(env.now, now, dt, dt_model, plan, tm)
        yield env.timeout(t_apply)
        return False


class LiveEngine(RealEngine):
    """The real engine with trained drafters deciding acceptance online (:mod:`.live`): the step's confidences come
    from a real drafter forward, the accepted prefix from rejection sampling against the target."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.notes["engine"] = (f"real (torch), live drafter '{self.ex.kind}' (acceptance by rejection sampling); "
                                f"step time = measured {self.ex.ex.clock_name()} clock")

    def _draw_block(self, dec: np.ndarray, slots: np.ndarray):
        return self.ex.propose(dec, slots, self.K)

    def _accepted_prefix(self, blk, L: np.ndarray) -> None:
        return None                      # decided by verification in _execute

    def _execute(self, plan: dict[str, Any]):
        tm, a = super()._execute(plan)
        plan["a"] = a
        return tm
