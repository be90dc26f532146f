"""Measurement that machine drift cannot fool: a fixed reference cell re-timed beside every measurement.

On a shared machine the same work runs 14-60% slower or faster within one command (other processes' cache and
memory-bandwidth pressure, frequency scaling; a thread CPU-time clock removes preemption but not these). Every
timed measurement (a profile cell, a real run) is bracketed by timings of one fixed *reference cell*; the
machine's speed at that moment relative to a baseline is

    factor = mean(reference before, reference after) / baseline        (> 1: the machine is slower now)

and the measurement is brought back to baseline speed: a time is divided by the factor, a rate multiplied. The
measurement is *discarded* (and counted) when the reference moved by more than ``threshold`` across it
(``max/min - 1`` of the two bracketing timings): then the speed was not steady, and no single factor holds.

The monitor only calls a ``probe`` (seconds of the reference cell) and reads nothing else, so a test drives it
with a fake clock and a known injected slowdown.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import ConfigError

DEFAULT_THRESHOLD = 0.10


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
    samples: list[tuple[str, float]] = field(default_factory=list)
    discarded: list[str] = field(default_factory=list)
    kept: int = 0

    def __post_init__(self) -> None:
        if not self.threshold > 0:
            raise ConfigError("drift", "threshold", f"must be > 0, got {self.threshold}")

    def sample(self, label: str) -> float:
        t = float(self.probe())
        if not t > 0:
            raise ConfigError("drift", "reference cell", f"non-positive reference timing {t} at {label}")
        self.samples.append((label, t))
        return t

    def calibrate(self, label: str = "baseline") -> float:
        t = self.sample(label)
        if self.baseline is None:
            self.baseline = t
        return self.baseline

    def bracket(self, fn: Callable[[], Any], label: str) -> tuple[Any, Bracket]:
        """Run ``fn`` between two reference timings; returns (its result, the bracket). Does not judge it."""
        if self.baseline is None:
            self.calibrate()
        before = self.samples[-1][1]
        out = fn()
        after = self.sample(f"after {label}")
        return out, Bracket(before, after, float(self.baseline))

    def judge(self, b: Bracket, label: str) -> bool:
        """True if the measurement is kept (drift <= threshold); a discarded one is counted under its label."""
        ok = b.drift <= self.threshold
        if ok:
            self.kept += 1
        else:
            self.discarded.append(label)
        return ok

    def measure(self, fn: Callable[[], Any], label: str, attempts: int = 1) -> tuple[Any, Bracket, bool]:
        """Bracket ``fn``, retried (up to ``attempts`` runs) while the drift exceeds the threshold; every discarded
        attempt is counted. Returns (result, bracket, kept): the last attempt when none was steady."""
        for i in range(max(1, attempts)):
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
                "kept": self.kept, "discarded": len(self.discarded), "discarded_labels": list(self.discarded)}
