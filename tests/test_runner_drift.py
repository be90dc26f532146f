"""Drift normalisation (dsparksim.runner.drift): a fake machine whose speed is injected, a fake clock; no torch."""
import pytest

from dsparksim.errors import ConfigError
from dsparksim.runner.drift import Bracket, DriftMonitor


class FakeMachine:
    """Work units cost ``slowdown`` seconds each on a fake clock; the slowdown is set by the test."""

    def __init__(self):
        self.now, self.slowdown = 0.0, 1.0

    def clock(self):
        return self.now

    def work(self, units):
        self.now += units * self.slowdown

    def probe(self):                      # the reference cell: 50 units of fixed work, timed on the clock
        t0 = self.clock()
        self.work(50)
        return self.clock() - t0

    def run(self, tokens=1000, units_per_token=3):
        """A 'real run': returns its measured throughput (tokens / measured seconds)."""
        t0 = self.clock()
        for _ in range(tokens):
            self.work(units_per_token)
        return tokens / (self.clock() - t0)


def test_normalisation_recovers_an_injected_slowdown_exactly():
    m = FakeMachine()
    mon = DriftMonitor(m.probe, threshold=0.05)
    mon.calibrate()                                   # baseline at full speed
    true_thr = m.run()                                # what the machine does at baseline speed
    for slow in (1.0, 1.37, 2.5, 0.8):                # another process starts / stops between runs
        m.slowdown = slow
        mon.sample(f"settle {slow}")                  # the slowdown also holds for the reference before the run
        thr, b, kept = mon.measure(m.run, f"run {slow}")
        assert kept and b.factor == pytest.approx(slow, rel=1e-12)
        assert thr == pytest.approx(true_thr / slow, rel=1e-12)         # the raw figure is fooled ...
        assert b.rate(thr) == pytest.approx(true_thr, rel=1e-12)        # ... the normalised one is not
        assert b.time(1.0 * slow) == pytest.approx(1.0, rel=1e-12)
    s = mon.summary()
    assert s["kept"] == 4 and s["discarded"] == 0
    assert s["drift_over_command"] == pytest.approx(2.5 / 0.8 - 1, rel=1e-12)


def test_a_run_during_which_the_speed_changed_is_discarded_counted_and_retried():
    m = FakeMachine()
    mon = DriftMonitor(m.probe, threshold=0.10)
    mon.calibrate()
    calls = []

    def run():
        calls.append(1)
        out = m.run()
        if len(calls) == 1:
            m.slowdown = 1.5                          # the machine slows down in the middle of the first attempt
        return out

    thr, b, kept = mon.measure(run, "cell", attempts=2)
    assert len(calls) == 2 and kept                   # the first attempt was thrown away, the retry is steady
    assert b.drift == pytest.approx(0.0) and b.factor == pytest.approx(1.5)
    assert mon.discarded == ["cell"] and mon.kept == 1
    # a drift below the threshold is kept, above it discarded: the stated threshold is the boundary
    assert mon.judge(Bracket(1.0, 1.09, 1.0), "x") and not mon.judge(Bracket(1.0, 1.11, 1.0), "y")
    assert mon.summary()["discarded"] == 2


def test_stored_baseline_and_bad_settings():
    m = FakeMachine()
    m.slowdown = 2.0
    mon = DriftMonitor(m.probe, baseline=50.0)       # the profile's reference timing, measured at full speed
    mon.calibrate()
    assert mon.baseline == 50.0
    _, b, _ = mon.measure(m.run, "r")
    assert b.factor == pytest.approx(2.0)
    with pytest.raises(ConfigError, match="threshold"):
        DriftMonitor(m.probe, threshold=0.0)
    with pytest.raises(ConfigError, match="non-positive"):
        DriftMonitor(lambda: 0.0).calibrate()
