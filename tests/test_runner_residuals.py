"""Per-step residual accounting (dsparksim.runner.residuals): synthetic step logs priced by the engine's own step
formula (verify_time + step_overhead) on a measured-profile shape with every term present; no torch."""
import json
from pathlib import Path

import numpy as np
import pytest

from dsparksim.cost.profile import profile_from_dict
from dsparksim.runner.residuals import RESID_COLS, by_shape, by_term, step_residuals

K = 7
PROFILE = Path(__file__).resolve().parents[1] / "profiles" / "cpu-tiny.json"


def _profile():
    d = json.loads(PROFILE.read_text())
    d["prefill"].update(seconds_per_token=2e-7, seconds_per_query_key=1e-9, seconds_per_chunk=1.3e-4,
                        seconds_per_token_per_decode=3e-9, seconds_per_chunk_per_decode=4e-6)
    d["drafters"]["dspark"]["prefill_s_per_token"] = 5e-8
    d["drafters"]["dspark"]["seconds_per_kv_token"] = 3e-8             # the drafter's context term
    d["attention"]["seconds_per_query_kv"] = 2e-10                     # the long-context term          # every term of the step formula is non-zero
    return profile_from_dict(d, source="test")


def _steps(p, rng, n_steps=300):
    n = rng.integers(0, 33, n_steps)
    L = rng.integers(0, K + 1, (n_steps, 33))
    vt = np.array([L[i, :n[i]].sum() for i in range(n_steps)])
    pf = np.where(rng.random(n_steps) < 0.3, rng.integers(1, 129, n_steps), 0)
    pf[n == 0] = np.maximum(pf[n == 0], 16)                         # a step with no decode has a prefill
    ch = np.where(pf > 0, rng.integers(1, 3, n_steps), 0)
    qk = np.where(pf > 0, pf * (pf + 1) // 2 + pf * rng.integers(0, 64, n_steps), 0)
    M = n + vt + pf
    nr = n + ch
    kv = nr * rng.integers(16, 200, n_steps) + pf
    dqk = np.where(n > 0, kv * 3, 0)                # decoding rows' query-key pairs (StepPlan.decode_qk)
    # the engine's price of the step: verify_time(M, kv) + profile.step_overhead(...) + long-context pairs
    dt_model = np.array([p.verify_time(int(M[i]), int(kv[i])) + p.step_overhead("dspark", int(n[i]), K, int(pf[i]),
                                                                                 int(qk[i]), int(ch[i]),
                                                                                 kv_tokens=int(kv[i]))
                         + p.seconds_per_query_kv * dqk[i] for i in range(n_steps)])
    # measured split: the model's shares, randomly mis-scaled per timer
    tt = dt_model * 0.7 * rng.uniform(0.8, 1.3, n_steps)
    td = dt_model * 0.1 * rng.uniform(0.8, 1.3, n_steps)
    th = dt_model * 0.2 * rng.uniform(0.8, 1.3, n_steps)
    return {"t_start": np.cumsum(tt + td + th), "dt": tt + td + th, "n_decode": n, "M": M, "verify_tokens": vt,
            "n_prefill_tokens": pf, "kv_read": kv, "n_running": nr, "pf_qk": qk, "pf_chunks": ch, "dec_qk": dqk,
            "dt_model": dt_model, "t_target": tt, "t_draft": td, "t_host": th}


@pytest.mark.parametrize("factor", [1.0, 1.4])
def test_residual_accounting_sums_to_the_measured_step_time(factor):
    p = _profile()
    st = _steps(p, np.random.default_rng(3))
    df = step_residuals(st, p, K, "dspark", factor=factor)
    # measured: the timers add up to the step (at baseline speed: the raw time over the drift factor)
    np.testing.assert_allclose(df["dt"], st["dt"] / factor, rtol=1e-12)
    # the model's terms add up to the price the engine logged for exactly this step
    terms = df[[c for c in df if c.startswith("m_")]].sum(axis=1)
    np.testing.assert_allclose(terms, st["dt_model"], rtol=1e-9)
    # the residuals, per timer and per term, add up to model - measured on every step
    np.testing.assert_allclose(df["r_target"] + df["r_draft"] + df["r_host"], st["dt_model"] - df["dt"], atol=1e-15)
    np.testing.assert_allclose(df[list(RESID_COLS)].sum(axis=1), st["dt_model"] - df["dt"], atol=1e-15)
    np.testing.assert_allclose(df["dt"] + df["r_total"], st["dt_model"], rtol=1e-12)
    # report tables keep the accounting: groups' contributions and terms' shares each sum to the total error
    tot = 100 * (st["dt_model"].sum() - df["dt"].sum()) / df["dt"].sum()
    assert by_shape(df)["contrib_pct"].sum() == pytest.approx(tot, rel=1e-9)
    bt = by_term(df).set_index("term")
    assert bt.drop("total")["resid_pct_of_measured_time"].sum() == pytest.approx(tot, rel=1e-9)
    assert bt.loc["total", "resid_pct_of_measured_time"] == pytest.approx(tot, rel=1e-9)


def test_target_residual_is_attributed_to_the_term_that_is_off():
    p = _profile()
    st = _steps(p, np.random.default_rng(5))
    m = step_residuals(st, p, K, "dspark")
    # the real target forward: the verify term 10% cheaper, the context term 25% dearer than modelled
    st["t_target"] = (0.9 * m["m_verify"] + 1.25 * m["m_context"] + m["m_prefill_target"]
                      + m["m_per_request"]).to_numpy()
    st["dt"] = st["t_target"] + st["t_draft"] + st["t_host"]
    df = step_residuals(st, p, K, "dspark")
    sc = df.attrs["target_term_scale_error"]
    assert sc["verify"] == pytest.approx(0.10, abs=1e-9) and sc["context"] == pytest.approx(-0.25, abs=1e-9)
    assert sc["prefill"] == pytest.approx(0.0, abs=1e-9) and np.abs(df["r_target_other"]).max() < 1e-12


def test_a_foreign_profile_is_refused():
    p = _profile()
    st = _steps(p, np.random.default_rng(1), 20)
    st["dt_model"] = st["dt_model"] * 1.01
    with pytest.raises(ValueError, match="residuals need the run's own profile"):
        step_residuals(st, p, K, "dspark")


def test_drafter_context_term_is_its_own_column_on_drafting_steps():
    p = _profile()
    st = _steps(p, np.random.default_rng(7), 60)
    df = step_residuals(st, p, K, "dspark")
    want = np.where(st["n_decode"] > 0, 3e-8 * st["kv_read"], 0.0)
    np.testing.assert_allclose(df["m_drafter_context"], want, rtol=1e-9, atol=1e-15)
    assert (df["m_drafter_context"] > 0).any() and (st["n_decode"] == 0).any()
    # it is the draft timer's: the draft model includes it
    np.testing.assert_allclose(df["model_draft"], df["m_drafter"] + want + df["m_prefill_drafter"], rtol=1e-12)
