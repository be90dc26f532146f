"""Drift normalisation (dsparksim.runner.drift): a fake machine whose speed is injected, a fake clock; no torch."""
import numpy as np
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


# ---------------------------------------------------------------------------------------------------- gate
def test_calibration_takes_the_fast_state_and_settle_waits_for_it():
    m = FakeMachine()
    seq = iter([2.0, 1.0, 1.0, 2.0, 1.0, 1.0, 1.0, 2.0, 1.0])   # a slow spell covers 3 of 9 calibration probes

    def probe():
        m.slowdown = next(seq, m.slowdown)
        return m.probe()
    mon = DriftMonitor(probe, gate=0.25, sleep=lambda s: None)
    assert mon.calibrate(probes=9) == pytest.approx(50.0)          # lower quartile: the fast state, not the mean
    # now the machine is slow for 3 probes, then fast again: settle waits (re-probing) until the fast state
    seq = iter([2.0, 2.0, 2.0, 1.0])
    mon.sample("slow")
    t = mon.settle("cell")
    assert t == pytest.approx(50.0) and mon.waits == 1 and mon.waited_probes == 3
    # a measurement that ends in a slow state is not steady even when the drift across it is small
    assert not mon.steady(Bracket(64.0, 65.0, 50.0)) and mon.steady(Bracket(55.0, 60.0, 50.0))
    with pytest.raises(ConfigError, match="gate"):
        DriftMonitor(probe, gate=0.0)


def test_settle_gives_up_after_max_wait_and_says_so():
    m = FakeMachine()
    m.slowdown = 3.0
    mon = DriftMonitor(m.probe, baseline=50.0, gate=0.25, max_wait_s=0.0, sleep=lambda s: None)
    mon.sample("slow")
    assert mon.settle("cell") == pytest.approx(150.0)
    assert mon.gave_up == 1 and mon.summary()["gave_up_waiting"] == 1
    # the command's total waiting budget: once spent, settle measures at once (no probe, no sleep)
    mon2 = DriftMonitor(m.probe, baseline=50.0, gate=0.25, max_total_wait_s=0.0, sleep=lambda s: None)
    mon2.sample("slow")
    n = len(mon2.samples)
    mon2.waited_s = 0.0
    assert mon2.settle("cell") == pytest.approx(150.0) and len(mon2.samples) == n and mon2.gave_up == 1


# ---------------------------------------------------------------------------------------------------- windows
def _run_result(dts, factors_true):
    """A closed-loop-like timeline: back-to-back steps; request 0 finishes at the end of step 2, request 1 at the
    end; a first token inside step 1 (after 40% of it)."""
    from dsparksim.sim.cluster import SimResult
    dts = np.asarray(dts, float)
    t0 = np.concatenate([[0.0], np.cumsum(dts)[:-1]])
    end = t0 + dts
    n = len(dts)
    steps = {"t_start": t0, "dt": dts, "t_draft": 0.2 * dts, "t_target": 0.5 * dts, "t_host": 0.3 * dts,
             "dt_model": np.full(n, 1.0)}
    z = np.zeros(2)
    return SimResult(arrival_s=np.array([0.0, end[2]]), admitted_s=np.array([0.0, end[2]]),
                     first_token_s=np.array([t0[1] + 0.4 * dts[1], end[3]]), finish_s=np.array([end[2], end[-1]]),
                     prompt_tokens=z, output_tokens=z, emitted_tokens=z, decode_steps=z, verify_tokens=z,
                     accepted_tokens=z, domain=np.array(["chat", "chat"]), steps=steps, sim_time_s=float(end[-1]),
                     ended_by="requests", kv_capacity_tokens=1, max_batched_tokens=1, block_size=1, drafter="dspark")


def test_windows_recover_a_slowdown_injected_mid_run_and_warp_rebuilds_the_timeline():
    from dsparksim.runner.drift import RunWindows, warp_result
    # true (baseline-speed) step times; the machine runs at 1x for steps 0-3, 1.5x for steps 4-7
    true = np.array([1.0, 2.0, 1.0, 3.0, 1.0, 2.0, 2.0, 1.0])
    slow = np.where(np.arange(8) < 4, 1.0, 1.5)
    m = FakeMachine()
    mon = DriftMonitor(m.probe, threshold=0.10)
    mon.calibrate()
    win = RunWindows(mon, every_s=1.0)
    for i in range(8):
        if i in (0, 4):                      # checkpoints at steps 0 and 4 (the driver's every_s decides where)
            m.slowdown = slow[i]
            win.checkpoint(i)
    win.close(8)
    f, ok = win.step_factors(8)
    # window 0 (steps 0-3) is bracketed by 1x and 1.5x: unsteady, factor 1.25; window 1 by 1.5x and 1.5x
    np.testing.assert_allclose(f, [1.25] * 4 + [1.5] * 4)
    assert list(ok) == [False] * 4 + [True] * 4
    # a known per-step slowdown is undone exactly by the warp, and every time stamp moves with its step
    res = _run_result(true * slow, slow)
    w = warp_result(res, slow)
    np.testing.assert_allclose(w.steps["dt"], true)
    np.testing.assert_allclose(w.steps["t_start"], np.concatenate([[0.0], np.cumsum(true)[:-1]]))
    np.testing.assert_allclose(w.steps["t_target"], 0.5 * true)
    np.testing.assert_allclose(w.steps["dt_raw"], true * slow)
    ends = np.cumsum(true)
    np.testing.assert_allclose(w.finish_s, [ends[2], ends[-1]])
    np.testing.assert_allclose(w.first_token_s, [ends[0] + 0.4 * true[1], ends[3]])
    assert w.sim_time_s == pytest.approx(ends[-1])
    with pytest.raises(ValueError, match="positive factor"):
        warp_result(res, np.ones(3))
    with pytest.raises(ValueError, match="start at step 0"):
        RunWindows(mon).step_factors(8)
