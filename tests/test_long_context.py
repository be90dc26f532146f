"""Long context: verified tokens pay query-key attention work that grows with their own request's context."""
from __future__ import annotations

import numpy as np
import pytest
from dsparksim.sim.contract import CostExecutor

from dsparksim.errors import InputError
from dsparksim.cost.profile import profile_from_dict, profile_to_dict

from test_disagg import _profile
from test_kv_paged import _sim, _wl


def _run(sqk: float, prompts, out=40, K=3):
    att = {"model": "kv_bandwidth", "seconds_per_kv_token": 1e-8}
    if sqk:
        att["seconds_per_query_kv"] = sqk
    prof = _profile(attention=att)
    n = len(prompts)
    return _sim(_wl(prompts, [out] * n, concurrency=n), K=K, profile=prof, alpha=1.0, kv_policy="reserve",
                max_tokens=4096, chunk=4096).run()


def test_query_key_term_matches_the_closed_form_per_request():
    # Two requests (prompts 100 and 3000) prefill together, then decode in lockstep verifying all K=3 drafts,
    # every one accepted: after prefill each has 1 generated token, then 4 more per step, so at decode step j
    # request i has context c_i = P_i + 1 + 4j and its 4 queries attend 4 c_i + 3*4/2 keys. The step's extra
    # price is seconds_per_query_kv x the sum over both requests (each at its own context, not the mean).
    sqk, K, P = 2e-9, 3, np.array([100, 3000])
    base, lc = _run(0.0, P, K=K), _run(sqk, P, K=K)
    np.testing.assert_array_equal(base.steps["M"], lc.steps["M"])   # same steps, same verify lengths
    dec = lc.steps["n_decode"] == 2
    j = np.arange(dec.sum())
    ctx = P[None, :] + 1 + (K + 1) * j[:, None]
    qk = ((1 + K) * ctx + K * (K + 1) // 2).sum(axis=1)
    np.testing.assert_allclose(lc.steps["dt"][dec] - base.steps["dt"][dec], sqk * qk, rtol=1e-9)
    assert (lc.steps["dt"][~dec] == base.steps["dt"][~dec]).all()    # the prefill step pays no decode term
    assert lc.steps["kv_read"].tolist() == base.steps["kv_read"].tolist()


def test_absent_term_prices_identically_and_round_trips():
    prof = _profile()
    assert prof.seconds_per_query_kv == 0.0 and "seconds_per_query_kv" not in profile_to_dict(prof)["attention"]
    att = {"model": "kv_bandwidth", "seconds_per_kv_token": 1e-8, "seconds_per_query_kv": 5e-10}
    p2 = _profile(attention=att)
    assert profile_from_dict(profile_to_dict(p2)).seconds_per_query_kv == 5e-10
    a, b = _run(0.0, [50, 60]), _run(0.0, [50, 60])
    assert a.steps["dt"].tolist() == b.steps["dt"].tolist()


@pytest.mark.parametrize("att,field", [
    ({"model": "kv_bandwidth", "seconds_per_kv_token": 0.0, "seconds_per_query_kv": -1.0},
     "attention.seconds_per_query_kv"),
    ({"model": "kv_bandwidth", "seconds_per_kv_token": 0.0, "seconds_per_query_key": 1.0},
     "attention.seconds_per_query_key"),
])
def test_bad_attention_terms_are_errors(att, field):
    with pytest.raises(InputError, match=field.replace(".", r"\.")):
        _profile(attention=att)


def test_rows_are_priced_at_their_own_context_and_verify_length():
    # Rows verifying different lengths: the step pays sum_i (1 + L_i) c_i + L_i (L_i + 1) / 2, not the mean context
    # times the batch's verified tokens. Engine-level: one plan, priced with and without the term.
    from dsparksim.policies.base import Policy

    class Split(Policy):
        name = "split"

        def choose(self, ctx):
            return np.where(np.asarray(ctx.request_ids) == 0, 0, 3)

    K, sqk, P = 3, 1e-8, np.array([100, 3000])
    price = {}
    for s in (0.0, sqk):
        att = {"model": "kv_bandwidth", "seconds_per_kv_token": 1e-8, **({"seconds_per_query_kv": s} if s else {})}
        pol = Split()
        pol.reset(K, np.random.default_rng(0))
        sim = _sim(_wl(P, [40, 40], concurrency=2), K=K, policy="fixed:3", profile=_profile(attention=att),
                   alpha=1.0, kv_policy="reserve", max_tokens=4096, chunk=4096)
        eng = sim.engines[0]
        eng.policy = pol
        for row in (0, 1):
            sim.req.load(row)
            eng.enqueue(row)
        eng.admit(0.0)
        p1 = eng.plan_step()
        eng.apply(p1, CostExecutor().execute(p1), p1.predicted_s)
        p2 = eng.plan_step()
        assert p2.verify.tolist() == [0, 3]
        price[s] = (p2.predicted_s, p2.decode_qk)
    c = P + 1
    want = (1 * c[0] + 0) + (4 * c[1] + 6)
    assert price[sqk][1] == want
    assert price[sqk][0] - price[0.0][0] == pytest.approx(sqk * want, rel=1e-9)
