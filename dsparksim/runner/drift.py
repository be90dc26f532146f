"""Measurement that machine drift cannot fool: a fixed reference cell re-timed beside every measurement.

On a shared machine the same work runs 14-60% slower or faster within one command (other processes' cache and
memory-bandwidth pressure, frequency scaling; a thread CPU-time clock removes preemption but not these). Every
timed measurement (a profile cell, a real run) is bracketed by timings of one fixed *reference cell*; the
machine's speed at that moment relative to a baseline is

    factor = mean(reference before, reference after) / baseline        (> 1: the machine is slower now)

and the measurement is brought back to baseline speed: a time is divided by the factor, a rate multiplied. The
measurement is *discarded* (and counted) when the reference moved by more than ``threshold`` across it
(``max/min - 1`` of the two bracketing timings): then the speed was not steady, and no single factor holds.

Measured on this 2-core VM (idle from our side, 2026-12-01): the reference cell switches between a fast state
(~7 ms) and slow states (~10-14 ms) every 0.5-20 s; probe-to-probe autocorrelation is 0.6 at 70 ms and 0.1 at
0.7 s; and the slowdown is *not* proportional across step shapes (a 32-request step slowed 1.37x while the
reference slowed 1.5x). So a factor from two probes around a multi-second run neither tracks the run's speed nor
corrects it exactly. Hence three more rules:

* **gate**: a measurement starts only in the machine's fast state (reference within ``gate`` of the baseline;
  :meth:`DriftMonitor.settle` waits, re-probing, up to ``max_wait_s``) and is kept only if the reference after it
  is in that state too; the baseline is the lower quartile of several calibration probes (the fast state); a
  steady gated measurement is not rescaled (:meth:`DriftMonitor.speed`), one outside the fast state is;
* **windows**: a real run is re-timed every ``every_s`` of its measured time (:class:`RunWindows`, a checkpoint
  between steps; waiting there changes nothing in the run, whose clock is its measured step time), and every
  step outside the fast state is normalised by the mean of the two probes around its window;
* **warp**: a run's timeline is rebuilt from the normalised step times (:func:`warp_result`), so every metric of
  the real run is at baseline speed, not only its throughput.

The monitor only calls a ``probe`` (seconds of the reference cell) and reads nothing else, so a test drives it
with a fake clock and a known injected slowdown.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import numpy as np

from dsparksim.errors import ConfigError

DEFAULT_THRESHOLD = 0.15
DEFAULT_GATE = 0.25          # fast state: reference within 25% of the baseline (fast-state noise
                             # reaches about +20%, slow states +40-100%)
CALIBRATION_PROBES = 9       # baseline = lower quartile of these (the fast state, robust to a slow spell)


@dataclass(frozen=True)
class Bracket:
    """The reference timings around one measurement, against the baseline."""

    before: float
    after: float
    baseline: float

    @property
    def factor(self) -> float:
        """Machine slowdown during the measurement vs the baseline (1.0 = same speed, 1.3 = 30% slower)."""
        return 0.5 * (self.before + self.after) / self.baseline

    @property
    def drift(self) -> float:
        """Speed change across the measurement: max/min of the bracketing reference timings - 1."""
        return max(self.before, self.after) / min(self.before, self.after) - 1.0

    def time(self, seconds: Any) -> Any:
        """A measured time (or array) at baseline speed."""
        return seconds / self.factor

    def rate(self, per_second: Any) -> Any:
        """A measured rate (tokens/s) at baseline speed."""
        return per_second * self.factor


@dataclass
class DriftMonitor:
    """Re-times a reference cell beside measurements (see module doc).

    ``probe()`` returns the reference cell's seconds; ``threshold`` is the largest drift across one measurement
    that is kept. The first sample (:meth:`calibrate`) is the baseline unless ``baseline`` is given (e.g. the
    reference timing stored with a profile measured earlier). The after-sample of one measurement is the
    before-sample of the next (they are adjacent), so a command of N measurements costs N + 1 probes.
    """

    probe: Callable[[], float]
    threshold: float = DEFAULT_THRESHOLD
    baseline: float | None = None
    gate: float | None = None          # None: no gating (every state accepted, normalised by the factor)
    max_wait_s: float = 20.0           # settle: longest wait for the fast state before measuring anyway
    max_total_wait_s: float = 300.0    # settle: all waits of the command together; past it, no more waiting
    pause_s: float = 0.1               # settle: sleep between probes while the machine is slow
    sleep: Callable[[float], None] = time.sleep
    samples: list[tuple[str, float]] = field(default_factory=list)
    discarded: list[str] = field(default_factory=list)
    kept: int = 0
    waits: int = 0                     # settle calls that found the machine slow
    waited_probes: int = 0             # probes taken while waiting
    gave_up: int = 0                   # settle calls that measured anyway (max_wait_s or max_total_wait_s)
    waited_s: float = 0.0              # wall seconds spent waiting for the fast state

    def __post_init__(self) -> None:
        if not self.threshold > 0:
            raise ConfigError("drift", "threshold", f"must be > 0, got {self.threshold}")
        if self.gate is not None and not self.gate > 0:
            raise ConfigError("drift", "gate", f"must be > 0 (or None), got {self.gate}")
        if not self.max_wait_s >= 0:
            raise ConfigError("drift", "max_wait_s", f"must be >= 0, got {self.max_wait_s}")

    def sample(self, label: str) -> float:
        t = float(self.probe())
        if not t > 0:
            raise ConfigError("drift", "reference cell", f"non-positive reference timing {t} at {label}")
        self.samples.append((label, t))
        return t

    def calibrate(self, label: str = "baseline", probes: int = 1) -> float:
        """Set the baseline (unless given): the lower quartile of ``probes`` reference timings, i.e. the
        machine's fast state even if a slow spell covers some of them (one probe: that timing)."""
        ts = [self.sample(label if i == 0 else f"{label} ({i + 1})") for i in range(max(1, probes))]
        if self.baseline is None:
            self.baseline = float(np.quantile(ts, 0.25, method="lower")) if len(ts) > 1 else ts[0]
        return self.baseline

    def fast(self, t: float) -> bool:
        """True when a reference timing is in the fast state (always, without a gate)."""
        return self.gate is None or t <= (1.0 + self.gate) * float(self.baseline)

    def settle(self, label: str) -> float:
        """Wait for the fast state before a measurement: re-probe (sleeping ``pause_s``) while the last reference
        timing is slow, up to ``max_wait_s``; returns the last timing (the measurement's 'before')."""
        if self.baseline is None:
            self.calibrate()
        t = self.samples[-1][1]
        if self.fast(t):
            return t
        self.waits += 1
        if self.waited_s >= self.max_total_wait_s:       # the command's waiting budget is spent: measure now
            self.gave_up += 1
            return t
        t0 = time.monotonic()
        try:
            while True:
                self.sleep(self.pause_s)
                t = self.sample(f"settle {label}")
                self.waited_probes += 1
                if self.fast(t):
                    return t
                if time.monotonic() - t0 >= self.max_wait_s:
                    self.gave_up += 1
                    return t
        finally:
            self.waited_s += time.monotonic() - t0

    def bracket(self, fn: Callable[[], Any], label: str) -> tuple[Any, Bracket]:
        """Run ``fn`` between two reference timings; returns (its result, the bracket). Does not judge it."""
        if self.baseline is None:
            self.calibrate()
        before = self.samples[-1][1]
        out = fn()
        after = self.sample(f"after {label}")
        return out, Bracket(before, after, float(self.baseline))

    def steady(self, b: Bracket) -> bool:
        """Drift <= threshold and, with a gate, both bracketing timings in the fast state."""
        return b.drift <= self.threshold and self.fast(b.before) and self.fast(b.after)

    def speed(self, b: Bracket) -> float:
        """The factor a measurement is divided by: 1 when gated and steady (both timings in the fast state: the
        probe's own scatter there, +-5-10% from one probe to the next, is larger than the speed change it would
        correct, measured), else the bracket's factor."""
        return 1.0 if self.gate is not None and self.steady(b) else b.factor

    def judge(self, b: Bracket, label: str) -> bool:
        """True if the measurement is kept (:meth:`steady`); a discarded one is counted under its label."""
        ok = self.steady(b)
        if ok:
            self.kept += 1
        else:
            self.discarded.append(label)
        return ok

    def measure(self, fn: Callable[[], Any], label: str, attempts: int = 1) -> tuple[Any, Bracket, bool]:
        """Bracket ``fn``, retried (up to ``attempts`` runs) while the drift exceeds the threshold; every discarded
        attempt is counted. Returns (result, bracket, kept): the last attempt when none was steady."""
        for i in range(max(1, attempts)):
            if self.gate is not None:
                self.settle(label)
            out, b = self.bracket(fn, label if i == 0 else f"{label} (retry {i})")
            if self.judge(b, label if i == 0 else f"{label} (retry {i})"):
                return out, b, True
        return out, b, False

    def summary(self) -> dict[str, Any]:
        """Drift seen over the command: reference timings, max/min - 1, kept and discarded measurements."""
        ts = [t for _, t in self.samples]
        return {"threshold": self.threshold, "baseline_s": self.baseline,
                "reference_s": [[k, t] for k, t in self.samples],
                "drift_over_command": (max(ts) / min(ts) - 1.0) if ts else 0.0,
                "speed_vs_baseline_range": ([min(ts) / self.baseline, max(ts) / self.baseline]
                                            if ts and self.baseline else None),
                "kept": self.kept, "discarded": len(self.discarded), "discarded_labels": list(self.discarded),
                "gate": self.gate, "waits_for_fast_state": self.waits, "probes_while_waiting": self.waited_probes,
                "waited_s": round(self.waited_s, 2), "gave_up_waiting": self.gave_up}


@dataclass
class RunWindows:
    """In-run reference timings of one real run (see module doc): :meth:`checkpoint` is called between steps
    with the index of the next step (waits for the fast state first, then probes); :meth:`close` probes after
    the last step. Window j = the steps between checkpoints j and j + 1."""

    mon: DriftMonitor
    every_s: float = 0.5               # measured run time between checkpoints
    marks: list[tuple[int, float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.every_s > 0:
            raise ConfigError("drift", "every_s", f"must be > 0, got {self.every_s}")

    def checkpoint(self, step: int) -> None:
        probes = self.mon.waited_probes
        if self.mon.gate is not None:
            t = self.mon.settle(f"window at step {step}")
        if self.mon.waited_probes == probes:       # settle did not probe: take the window's timing now
            t = self.mon.sample(f"window at step {step}")
        self.marks.append((int(step), t))

    def close(self, n_steps: int) -> None:
        if not self.marks or self.marks[-1][0] != n_steps:
            self.marks.append((int(n_steps), self.mon.sample(f"after step {n_steps - 1}")))

    def step_factors(self, n_steps: int) -> tuple[np.ndarray, np.ndarray]:
        """(factor, steady) per step: :meth:`DriftMonitor.speed` of its window's two probes (1 in a steady gated
        window, else their mean over the baseline), and whether the window was steady
        (:meth:`DriftMonitor.steady`). Needs a checkpoint at step 0 and :meth:`close`."""
        if not self.marks or self.marks[0][0] != 0 or self.marks[-1][0] != n_steps:
            raise ValueError(f"windows must start at step 0 and end at step {n_steps}, got marks "
                             f"{[m[0] for m in self.marks]}")
        f = np.empty(n_steps)
        ok = np.empty(n_steps, bool)
        for (s0, p0), (s1, p1) in zip(self.marks[:-1], self.marks[1:]):
            b = Bracket(p0, p1, float(self.mon.baseline))
            f[s0:s1], ok[s0:s1] = self.mon.speed(b), self.mon.steady(b)
        return f, ok


def warp_result(res: Any, factor: np.ndarray) -> Any:
    """A copy of a real run's SimResult with every step's measured time divided by its ``factor`` and the
    timeline rebuilt from those times: each step keeps its place in the event order and lasts dt / factor, and
    every request time stamp (arrival, admission, first token, finish) moves with the step it fell in
    (piecewise-linear map through the step boundaries; the run's events all happen at step boundaries or
    inside a step). The raw step times stay as ``dt_raw`` and the factor as ``speed_factor``."""
    st = res.steps
    n = len(st["dt"])
    factor = np.asarray(factor, float)
    if factor.shape != (n,) or not (factor > 0).all():
        raise ValueError(f"need one positive factor per step ({n}), got shape {factor.shape}")
    if n == 0:
        return res
    t0 = np.asarray(st["t_start"], float)
    dt = np.asarray(st["dt"], float)
    order = np.argsort(t0, kind="stable")
    a, d, f = t0[order], dt[order], factor[order]
    # knots: (old, new) at every step start and end; gaps between steps keep their length
    new_start = np.empty(n)
    cur_old, cur_new = 0.0, 0.0
    for i in range(n):
        cur_new += max(a[i] - cur_old, 0.0)            # idle gap before the step (open loop), unscaled
        new_start[i] = cur_new
        cur_new += d[i] / f[i]
        cur_old = a[i] + d[i]
    xo = np.stack([a, a + d], 1).ravel()
    xn = np.stack([new_start, new_start + d / f], 1).ravel()

    def tmap(t: np.ndarray) -> np.ndarray:
        t = np.asarray(t, float)
        out = np.interp(t, xo, xn)
        out = np.where(t > xo[-1], t - xo[-1] + xn[-1], out)   # after the last step: shift by the end offset
        out = np.where(t < xo[0], t, out)                      # before the first step: unchanged
        return np.where(np.isfinite(t), out, t)

    steps = dict(st)
    inv = np.empty(n)
    inv[order] = new_start
    steps["t_start"] = inv
    steps["dt_raw"] = dt
    steps["speed_factor"] = factor
    steps["dt"] = dt / factor
    for k in ("t_draft", "t_target", "t_host"):
        if k in steps:
            steps[k] = np.asarray(steps[k], float) / factor
    kw = {k: tmap(getattr(res, k)) for k in ("arrival_s", "admitted_s", "first_token_s", "finish_s")}
    return replace(res, steps=steps, sim_time_s=float(tmap(np.array([res.sim_time_s]))[0]), **kw)
