"""--recalibrate (issue 29, 2.2): online STS from past verification outcomes only -- the temperature fit, causality,
censoring, the run option, and the distribution audit (lossless)."""
from __future__ import annotations

import numpy as np
import pytest

from dsparksim.cli.main import main
from dsparksim.policies import make_policy
from dsparksim.policies.base import StepContext
from dsparksim.policies.recalibrate import Recalibrating, fit_temperature
from dsparksim.runner.audit import RECALIBRATED, SETTINGS, run_audit


def test_fit_temperature_recovers_a_known_temperature():
    rng = np.random.default_rng(3)
    true = rng.normal(0.5, 1.5, 40_000)
    y = (rng.random(true.size) < 1 / (1 + np.exp(-true))).astype(float)
    for T in (0.6, 1.0, 2.5):
        assert fit_temperature(true * T, y) == pytest.approx(T, rel=0.04)


def _ctx(conf: np.ndarray, ids: np.ndarray) -> StepContext:
    sps = 1.0 / (1.0 + 0.02 * np.arange(1, 200))
    return StepContext(conf=conf, survival=np.cumprod(conf, 1), request_ids=ids, base_tokens=len(ids),
                       step_time=lambda M: 1.0 / sps[np.asarray(M) - 1], max_tokens=199)


def _drive(outcome_last: int, steps: int = 300, seed: int = 0) -> list[np.ndarray]:
    """Run the wrapper over a fixed sequence of contexts; the outcomes of the LAST step vary with outcome_last."""
    rng = np.random.default_rng(seed)
    pol = Recalibrating(make_policy("confidence-async:2"), refit_every=5, min_obs=50)
    pol.reset(4, np.random.default_rng(1))
    Ls = []
    for t in range(steps):
        conf = rng.uniform(0.3, 0.99, (6, 4))
        L = pol.choose(_ctx(conf, np.arange(6)))
        Ls.append(L)
        a = np.minimum(L, rng.integers(0, 5, 6)) if t < steps - 1 else np.full(6, outcome_last).clip(0, L)
        pol.observe(np.arange(6), L, a)
    return Ls, pol


def test_decisions_use_only_past_outcomes():
    """Changing what verification reveals at the last step changes no decision up to and including that step."""
    a, pa = _drive(0)
    b, pb = _drive(4)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    assert len(pa.history) > 10 and not np.allclose(pa.temps, 1.0)      # it did recalibrate


def test_only_tried_positions_are_recorded():
    pol = Recalibrating(make_policy("confidence-async:2"), refit_every=10_000)
    pol.reset(3, np.random.default_rng(0))
    conf = np.full((3, 3), 0.8)
    pol.choose(_ctx(conf, np.array([7, 8, 9])))
    # request 7 verified 2, accepted 2 -> positions 1, 2 (both accepted); 8 verified 3, accepted 1 -> positions 1
    # (accepted) and 2 (rejected); 9 verified 0 -> nothing
    pol.observe(np.array([7, 8, 9]), np.array([2, 3, 0]), np.array([2, 1, 0]))
    labels = [np.concatenate([c[1] for c in q]) if q else np.zeros(0) for q in pol._z]
    assert [list(x) for x in labels] == [[1.0, 1.0], [1.0, 0.0], []]


@pytest.mark.parametrize("setting", ["appendix_a", "batch"])
def test_recalibrated_policies_pass_the_audit(setting):
    """The lossless confidence readers, wrapped in online recalibration, keep the target distribution (chi-square
    p > 1e-3 at a fixed seed); the same audit catches the non-causal global search (its power at this size)."""
    for pol in RECALIBRATED:
        r = run_audit(pol, SETTINGS[setting](), steps=4000, seed=0, recalibrate=True)
        assert r["policy"] == pol + "+recal"
        assert r["p_value"] > 1e-3, r
    if setting == "appendix_a":
        assert run_audit("confidence-global", SETTINGS[setting](), steps=4000, seed=0)["p_value"] < 1e-3


def test_recalibration_changes_decisions_in_the_audit():
    """Not vacuous: in the batch setting the recalibrated policy verifies differently from the plain one."""
    plain = run_audit("confidence-async:2", SETTINGS["batch"](), steps=1500, seed=1)
    recal = run_audit("confidence-async:2", SETTINGS["batch"](), steps=1500, seed=1, recalibrate=True)
    assert abs(plain["mean_L"] - recal["mean_L"]) > 0.02


def test_run_option(tmp_path, capsys):
    from dsparksim.config import RunConfig
    from dsparksim.sim.simulate import simulate
    from dsparksim.traffic import TrafficConfig

    t = TrafficConfig(mode="closed", concurrency=8, duration_s=2.0)
    out = simulate(RunConfig(policy="confidence-async:2", recalibrate=True, traffic=t, seed=0))
    assert out.summary["policy"] == "confidence-async:2+recal"
    assert main(["run", "--policy", "fixed:5", "--recalibrate", "--duration", "1", "--out",
                 str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "--recalibrate" in err and "fixed:5" in err


def test_rescaling_keeps_confidences_of_exactly_0_and_1():
    # temperature scaling maps 0 -> 0 and 1 -> 1 (logit +-inf divided by t); a position past an early-exit stop
    # reaches the policy at confidence 0 and must stay impossible. The clip to 1e-12 before the logit made it
    # sigmoid(logit(1e-12) / t): 0.06 at t = 10.
    class Seen:
        spec, drafter, block_size, needs_oracle, drafts, reads_confidence = "seen", None, None, False, True, True

        def reset(self, K, rng):
            pass

        def choose(self, ctx):
            self.conf = ctx.conf
            return np.zeros(ctx.n, dtype=np.int64)
    inner = Seen()
    pol = Recalibrating(inner)
    pol.reset(3, np.random.default_rng(0))
    pol.temps[:] = [10.0, 10.0, 0.5]
    conf = np.array([[0.9, 0.0, 0.0], [1.0, 0.7, 1.0]])
    ctx = StepContext(conf=conf, survival=np.cumprod(conf, axis=1), request_ids=np.arange(2), base_tokens=2,
                      step_time=lambda M: 1.0 + 0.01 * np.asarray(M, dtype=float), max_tokens=8,
                      drafted=np.array([1, 3]))
    pol.choose(ctx)
    assert inner.conf[0, 1] == inner.conf[0, 2] == 0.0
    assert inner.conf[1, 0] == inner.conf[1, 2] == 1.0
    assert 0.5 < inner.conf[0, 0] < 0.9 and 0.7 > inner.conf[1, 1] > 0.5   # the others are rescaled (t = 10)
