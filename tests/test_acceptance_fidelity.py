"""Issue 11 parts 1-2: step-weighted tau calibration, confidences fitted to Figs. 5/6, raw vs STS, DeepSpec metrics."""
import json

import numpy as np
import pytest

from dsparksim.acceptance import load_acceptance
from dsparksim.acceptance.base import DOMAINS
from dsparksim.acceptance.calibration import calibrate_mu, calibrate_mu_steps, model_conditional_steps, tau_of_curve
from dsparksim.acceptance.confidence import (deepspec_auc, deepspec_ece, ece_survival, fit_sts_nll,
                                             per_position_metrics)
from dsparksim.acceptance.longrun import simulate_long
from dsparksim.acceptance.parametric import ParametricAcceptance, ParametricParams
from dsparksim.acceptance.reference import paper_curve
from dsparksim.errors import ConfigError

# Fig. 4 draft lengths 4, 8, 12, 16 (16 > K_MAX = 15: 15 used) plus the paper's block sizes 5 (production) and 7
TAU_CASES = [(d, K) for d in ("dspark", "dflash", "eagle3") for K in (4, 5, 7, 8, 12, 15)] + [("mtp1", 1)]


# ------------------------------------------------------------------------------ part 1: step-weighted tau
@pytest.mark.parametrize("drafter,K", TAU_CASES)
def test_long_output_tau_matches_closed_form(drafter, K):
    # Long outputs with fixed:K (every proposal verified whole), simulated straight on the model with the engine's
    # keyed draws: sum(a + 1) / sum(steps) over 3000 requests of 150 tokens (request shifts on stratified
    # quantiles; the remaining per-step sampling SE is ~0.2%) must equal 1 + sum prod alpha within 1% in every
    # domain (seed 0). On the request-weighted calibration (before issue 11) this was 1-7% low. Raw confidences:
    # the acceptance truth does not depend on them (test_raw_and_sts_share_acceptance_but_not_confidences).
    m = load_acceptance(drafter, K, confidence="raw")
    for d in DOMAINS:
        r = simulate_long(m, d, n_requests=3000, tokens=150, seed=0, stratified=True)
        exp = tau_of_curve(paper_curve(drafter, d if drafter != "mtp1" else "chat", K)[0])
        assert r["tau_unclipped"] == pytest.approx(exp, rel=0.01), (drafter, K, d, r["tau_unclipped"], exp)
        assert r["tau"] <= r["tau_unclipped"]          # the end-of-output clip only removes tokens


def test_step_weighted_calibration_is_exact_and_differs_from_request_weighted():
    a = paper_curve("dspark", "chat", 7)[0]
    mu = calibrate_mu_steps(a, 0.8, 0.8, 1.4)
    np.testing.assert_allclose(model_conditional_steps(mu, 0.8, 0.8, 1.4), a, atol=1e-9)
    # slow requests take more steps, so matching the step-weighted curve needs larger offsets than one block per
    # fresh request; without request heterogeneity the two coincide
    assert (mu > calibrate_mu(a, np.hypot(0.8, 0.8), 1.4) + 0.05).all()
    np.testing.assert_allclose(calibrate_mu_steps(a, 0.0, 1.1, 1.4), calibrate_mu(a, 1.1, 1.4), atol=1e-5)  # quadratures differ


# ------------------------------------------------------------------------------ DeepSpec metrics by hand
def test_deepspec_auc_hand_cases():
    assert deepspec_auc(np.array([.1, .2, .3, .4]), np.array([0, 0, 1, 1])) == 1.0
    # pairs (pos, neg): (.1,.2) 0, (.1,.4) 0, (.3,.2) 1, (.3,.4) 0 -> 1/4
    assert deepspec_auc(np.array([.1, .2, .3, .4]), np.array([1, 0, 1, 0])) == pytest.approx(0.25)
    # same 1000-bin bucket: a tie counts one half
    assert deepspec_auc(np.array([.5001, .5002]), np.array([1, 0])) == pytest.approx(0.5)
    assert np.isnan(deepspec_auc(np.array([.1, .2]), np.array([1, 1])))
    # weights count like repeated samples
    assert deepspec_auc(np.array([.1, .2, .3]), np.array([1, 0, 1]), np.array([1, 1, 3])) == pytest.approx(0.75)


def test_deepspec_ece_hand_cases():
    # 20 bins: .12 and .14 share bin 2 (mean pred .13, mean label .5 -> gap .37), .93 alone in bin 18 (gap .07)
    got = deepspec_ece(np.array([.12, .14, .93]), np.array([1, 0, 1]))
    assert got == pytest.approx((2 * 0.37 + 0.07) / 3)
    assert deepspec_ece(np.array([1.0, 1.0]), np.array([1, 1])) == pytest.approx(1e-8)   # clamped to 1 - 1e-8


def test_per_position_metrics_use_survival_over_all_blocks():
    conf = np.array([[0.9, 0.5], [0.6, 0.9], [0.2, 0.9]])
    A = np.array([2, 1, 0])
    q = per_position_metrics(conf, A)
    # position 2: survivals .45, .54, .18 vs labels 1, 0, 0 (the third block is included although not at risk)
    assert q["auc_by_position"][2] == pytest.approx(0.5)
    assert q["auc_by_position"][1] == pytest.approx(1.0)
    s2, y2 = np.array([.45, .54, .18]), np.array([1, 0, 0])
    assert q["ece_by_position"][2] == pytest.approx(deepspec_ece(s2, y2))


def test_sts_recovers_a_known_temperature():
    # truth: accept position k with prob sigmoid(x_k); the raw head reports sigmoid(2.5 x_k): STS finds T ~ 2.5
    rng = np.random.default_rng(3)
    x = rng.normal(1.5, 1.5, (40_000, 4))
    ok = rng.random(x.shape) < 1 / (1 + np.exp(-x))
    A = np.where(ok.all(axis=1), 4, ok.argmin(axis=1))
    T = fit_sts_nll(1 / (1 + np.exp(-2.5 * x)), A)
    np.testing.assert_allclose(T, 2.5, rtol=0.05)


# ------------------------------------------------------------------------------ part 2: raw vs sts
def _one_block(model, n=20_000, seed=11, domain="math"):
    rng = np.random.default_rng(seed)
    model.start(np.arange(n), np.full(n, domain, dtype=object), rng)
    return model.draw(np.arange(n), rng)


def test_raw_and_sts_share_acceptance_but_not_confidences():
    sts = load_acceptance("dspark", 7)
    raw = load_acceptance("dspark", 7, confidence="raw")
    assert sts.confidence == "sts" and raw.confidence == "raw"
    b1, b2 = _one_block(sts), _one_block(raw)
    np.testing.assert_array_equal(b1.accepted, b2.accepted)       # paired: the truth is identical
    assert np.abs(b1.conf - b2.conf).max() > 0.05
    # order per position is preserved (both are monotone in the same latent logit)
    assert (np.argsort(b1.conf[:, 0], kind="stable") == np.argsort(b2.conf[:, 0], kind="stable")).mean() > 0.99
    e_sts, e_raw = ece_survival(b1.conf, b1.accepted), ece_survival(b2.conf, b2.accepted)
    assert e_sts < 0.02 < e_raw, (e_sts, e_raw)
    assert raw.describe()["confidence"] == "raw" and sts.describe()["sts_temperatures"] is not None


def test_confidence_option_reaches_the_model_and_rejects_bad_values():
    from dsparksim.config import RunConfig
    from dsparksim.sim.inputs import resolve_inputs

    with pytest.raises(ConfigError, match="confidence"):
        RunConfig(confidence="calibrated")
    with pytest.raises(ConfigError, match="confidence"):
        load_acceptance("dspark", 7, confidence="platt")
    acc = resolve_inputs(RunConfig(policy="fixed:7", confidence="raw")).acceptance
    assert isinstance(acc, ParametricAcceptance) and acc.confidence == "raw"
    tau = load_acceptance("tau:3.5", 7, confidence="raw")
    assert tau.confidence == "raw"


# ------------------------------------------------------------------------------ part 2: fit to Figs. 5/6
def test_shipped_fit_residuals_within_tolerance():
    # The shipped parameters (scripts/fit_acceptance.py) against the paper, re-measured with a different random
    # sample (seed 5) than the fit's: every Fig. 5 ratio at t=0.9 within FIG5_TOL_09 (absolute; the logit-normal
    # before issue 29 was up to 0.15 off on math), the others within FIG5_TOL, every Fig. 6 AUC within AUC_TOL,
    # STS ECE <= 0.02 (paper 0.01). The issue-29 criteria proper are in tests/test_acceptance_confidence_model.py.
    # The loose t=0.5/0.7 tolerances state what a calibrated head reaches (acceptance/fit.py: the paper's 98% of
    # math's slots at t=0.5 would need survivals just above 0.5 and collapse Fig. 6's AUC).
    from dsparksim.acceptance.fit import evaluate, residuals
    from dsparksim.acceptance.parametric import load_fit

    ev = evaluate(ParametricParams(), n_u=10, blocks=800, seed=5)
    res = residuals(ev)
    shipped = load_fit()["fit"]["residuals"]
    for k, v in res.items():
        tol = AUC_TOL if k.startswith("AUC") else FIG5_TOL_09 if k.endswith("t=0.9") else FIG5_TOL
        assert abs(v) <= tol, (k, v)
        assert v == pytest.approx(shipped[k], abs=0.03), (k, v, shipped[k])   # the table in the JSON is current
    assert ev["ece_mean"] <= 0.02


FIG5_TOL_09 = 0.05
FIG5_TOL = 0.33
AUC_TOL = 0.07


# ------------------------------------------------------------------------------ trace inspect
def test_trace_inspect_reports_deepspec_per_position_metrics_for_a_real_trace(capsys):
    # Any trace (here the shipped sample): per-position survival ECE / AUC equal DeepSpec's definitions computed
    # directly on the trace's blocks, in the JSON and as ECE_k / AUC_k columns in the text.
    import argparse
    from pathlib import Path

    from dsparksim.cli import trace as cli_trace
    from dsparksim.acceptance.trace_format import read_trace

    sample = Path(__file__).resolve().parents[1] / "traces" / "sample_dspark_k7.csv"
    parser = argparse.ArgumentParser(prog="dsparksim")
    cli_trace.register(parser.add_subparsers(dest="cmd"))
    args = parser.parse_args(["trace", "inspect", str(sample), "--json"])
    assert args.func(args) == 0
    s = json.loads(capsys.readouterr().out)
    assert "DeepSpec" in s["per_position_definition"]
    tr = read_trace(sample)
    sel = tr.domain == "math"
    q = per_position_metrics(tr.conf[sel], tr.accepted[sel])
    for p in s["domains"]["math"]["positions"]:
        assert p["ece_survival"] == pytest.approx(q["ece_by_position"][p["k"]])
        assert p["auc_survival"] == pytest.approx(q["auc_by_position"][p["k"]])
    args = parser.parse_args(["trace", "inspect", str(sample)])
    assert args.func(args) == 0
    assert "ECE_k" in capsys.readouterr().out


# ------------------------------------------------------------------------------ summary: tau_unclipped
def test_summary_tau_unclipped_counts_the_accepted_prefix_before_the_length_clip(tmp_path):
    # Outputs of 3 tokens under fixed:7: the first token comes from prefill, so each request has 2 decode tokens
    # left and most decode steps accept more than that. tau counts the emitted tokens (clipped), tau_unclipped
    # sum(a + 1) / steps from the step log, so it is larger here; with long outputs the two nearly coincide.
    from dsparksim.cli.main import main

    lengths = tmp_path / "short.csv"
    lengths.write_text("num_prefill_tokens,num_decode_tokens\n" + "100,3\n" * 20)
    out = tmp_path / "out"
    assert main(["run", "--policy", "fixed:7", "--concurrency", "4", "--num-requests", "40", "--lengths",
                 str(lengths), "--acceptance", "dspark", "--domain", "math", "--quiet", "--save-steps",
                 "--out", str(out)]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["tau"] <= 2.0 + 1e-9 < s["tau_unclipped"]
    import pandas as pd

    st = pd.read_csv(out / "steps.csv")                      # no warm-up in a --num-requests run
    n = st["n_decode"].sum()
    assert s["tau_unclipped"] == pytest.approx((st["accepted"].sum() + n) / n)
    assert s["tau"] == pytest.approx(st["decode_emitted"].sum() / n)
