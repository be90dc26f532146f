"""A priced step shape (dsparksim.cost.price): CostProfile.price(StepShape) parts add up to the step time the engine
charges; the engine, the disaggregated prefill pool, the runner's residuals and the fit's features read one price."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dsparksim.acceptance import load_acceptance
from dsparksim.cost.analytic.builder import build_profile
from dsparksim.cost.analytic.calibration import FAMILIES, Calibration
from dsparksim.cost.price import PART_NAMES, StepPricer, StepShape, chunk_query_keys, decode_query_keys
from dsparksim.cost.profile import load_profile, profile_from_dict
from dsparksim.fit.reprice import PARAMS, PriceBasis
from dsparksim.policies import make_policy
from dsparksim.runner.residuals import model_terms
from dsparksim.sim.disagg import PrefillPool
from dsparksim.sim.scheduler import reprice_steps
from dsparksim.traffic.base import Workload
from sim_kit import make_sim  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
K = 7
REL = 1e-12     # parts vs the step's price: the same terms, summed in another order


def _tiny(only: bool = False):
    """cpu-tiny (a measured table profile) with every term of the step formula non-zero."""
    d = json.loads((ROOT / "profiles" / "cpu-tiny.json").read_text())
    d["prefill"].update(seconds_per_token=2e-7, seconds_per_query_key=1e-9, seconds_per_chunk=1.3e-4,
                        seconds_per_token_per_decode=3e-9, seconds_per_chunk_per_decode=4e-6)
    if only:
        d["prefill"]["only"] = {"seconds_per_step": 2e-3, "seconds_per_token": 1e-6, "seconds_per_query_key": 2e-9,
                                "seconds_per_chunk": 5e-5}
    d["drafters"]["dspark"].update(prefill_s_per_token=5e-8, seconds_per_kv_token=3e-8)
    d["attention"]["seconds_per_query_kv"] = 2e-10
    return profile_from_dict(d, source="test")


def _table2d():
    """A 2-D (M x KV tokens) staircase with a drafter and prefill terms."""
    return profile_from_dict({
        "format": "dsparksim-profile/1", "name": "twod-test",
        "metadata": {"device": "test", "model": "test", "source": "test", "method": "hand-written"},
        "verify": {"M": [1, 64, 256, 512], "kv_tokens": [0, 2000, 8000],
                   "time_s": [[0.010, 0.012, 0.018, 0.025], [0.011, 0.014, 0.021, 0.029],
                              [0.013, 0.017, 0.026, 0.036]]},
        "prefill": {"seconds_per_token": 1e-6, "seconds_per_query_key": 1e-9, "seconds_per_chunk": 1e-4},
        "fixed_overhead_s": 0.001, "batch_overhead": {"n_req": [1, 8, 64], "time_s": [1e-4, 3e-4, 6e-4]},
        "drafters": {"dspark": {"kind": "parallel", "tokens": [1, 64, 4096], "time_s": [0.001, 0.0015, 0.003],
                                "markov_overhead_frac": 0.01, "prefill_s_per_token": 1e-8}}}, "2d.json")


def _built():
    """A builder profile (analytic, calibrated: not the identity)."""
    cal = Calibration(scales={"dense": 0.9, "attention": 1.2, "prefill": 1.3}, fixed_overhead_s=0.002)
    return profile_from_dict(build_profile(ROOT / "dsparksim" / "data" / "models" / "llama-2-7b.json", "H100",
                                           date="2026-12-01", calibration=cal), "built.json")


PROFILES = {"tiny": lambda: _tiny(), "tiny-only": lambda: _tiny(only=True),
            "2d": _table2d,
            "measured-h100": lambda: load_profile("h100-llama2-7b-tp1"), "built": _built}


def _shapes(prof, drafter):
    """Decode-only, mixed (decode + chunks) and prefill-only shapes inside the profile's range."""
    hi = min(int(prof.max_tokens), 512)
    kvmax = int(prof.kv_tokens[-1]) if prof.kv_tokens is not None else 10**5
    out = []
    for n, L, ctx, chunks in ((1, 0, 10, ()), (6, 3, 300, ()), (16, K, 900, ()), (4, 2, 200, ((32, 0), (16, 64))),
                              (0, 0, 0, ((48, 0),)), (0, 0, 0, ((40, 100), (24, 0)))):
        pf = sum(c for c, _ in chunks)
        M = n * (1 + L) + pf
        if M > hi or M < int(prof.min_tokens):
            continue
        kv = min(n * ctx + sum(c + s for c, s in chunks), kvmax)
        out.append(StepShape(M=M, n_decode=n, kv_read=kv, prefill_tokens=pf,
                             prefill_qk=sum(chunk_query_keys(c, s) for c, s in chunks), prefill_chunks=len(chunks),
                             decode_qk=int(n * decode_query_keys(L, ctx)), drafter=drafter, K=K))
    return out


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_parts_add_up_to_the_step_time(name):
    prof = PROFILES[name]()
    seen_only = False
    for drafter in (None, "dspark"):
        if drafter is not None and drafter not in prof.drafters:
            continue
        shapes = _shapes(prof, drafter)
        assert len(shapes) >= 4
        for s in shapes:
            p = prof.price(s)
            parts = p.parts()
            assert list(parts) == list(PART_NAMES)
            assert all(v >= 0 for k, v in parts.items() if k != "context"), parts
            assert p.parts_sum() == pytest.approx(p.seconds, rel=REL), (s, parts)
            # the step time is the pricer's own: verify at M (+ context) + everything else (+ long-context pairs)
            assert p.seconds == prof.pricer().seconds(s)
            assert p.seconds > 0
            if s.n_decode == 0:
                assert p.drafter == p.drafter_context == p.query_key == 0.0   # nothing drafted, no decode rows
                if prof.prefill_only is not None:
                    seen_only = True
                    assert p.verify == p.context == p.prefill_chunk == 0.0   # the measured prefill-only forward
            if drafter is None:
                assert p.drafter == p.prefill_drafter == 0.0
        # an array of shapes prices as its entries, in one pass
        arr = StepShape(**{f: np.array([getattr(s, f) for s in shapes])
                           for f in StepShape._fields if f not in ("drafter", "K")},
                        drafter=drafter, K=K)
        pa = prof.price(arr)
        for k in PART_NAMES:
            np.testing.assert_array_equal(getattr(pa, k), [getattr(prof.price(s), k) for s in shapes])
        np.testing.assert_array_equal(pa.seconds, [prof.price(s).seconds for s in shapes])
    assert seen_only == (prof.prefill_only is not None)


def test_a_drafter_changes_only_the_drafting_parts():
    prof = _tiny()
    for s in _shapes(prof, "dspark"):
        a, b = prof.price(s), prof.price(s._replace(drafter=None))
        for k in ("verify", "context", "query_key", "prefill", "prefill_chunk", "overhead"):
            assert getattr(a, k) == getattr(b, k)
        if s.n_decode:
            assert a.drafter > 0 and a.drafter_context > 0 and a.seconds > b.seconds


def _sim(prof, mixed: bool, policy: str = "confidence", max_tokens: int = 256):
    n = 10
    rng = np.random.default_rng(3)
    wl = Workload(prompt_tokens=rng.integers(20, 120, n), output_tokens=rng.integers(5, 30, n),
                  domain=np.array(["chat"] * n, dtype=object), arrival_s=np.sort(rng.random(n) * 0.05))
    pol = make_policy(policy)
    pol.reset(K, np.random.default_rng(0))
    return make_sim(profile=prof, acceptance=load_acceptance("dspark", K), policy=pol, workload=wl, block_size=K,
                      drafter="dspark", kv_capacity_tokens=10**6, max_num_seqs=8, max_batched_tokens=max_tokens,
                      prefill_chunk_tokens=48, rng=np.random.default_rng(0), num_requests=n,
                      mixed_prefill=mixed).run()


@pytest.mark.parametrize("name", ["tiny", "tiny-only", "measured-h100"])
@pytest.mark.parametrize("mixed", [True, False], ids=["mixed", "unmixed"])
def test_the_engine_charges_the_price_of_each_logged_shape(name, mixed):
    prof = PROFILES[name]()
    res = _sim(prof, mixed)
    st = res.steps
    dt = np.asarray(st["dt"], float)
    shape = StepShape.from_log(st, "dspark", K)
    p = prof.price(shape, 256)
    np.testing.assert_array_equal(p.seconds, dt)                   # bit for bit: the engine's clock is the price
    np.testing.assert_allclose(p.parts_sum(), dt, rtol=REL)
    np.testing.assert_array_equal(reprice_steps(prof, st, "dspark", K, 256), dt)
    pf_only = (np.asarray(st["n_decode"]) == 0) & (np.asarray(st["n_prefill_tokens"]) > 0)
    both = (np.asarray(st["n_decode"]) > 0) & (np.asarray(st["n_prefill_tokens"]) > 0)
    assert pf_only.any() and both.any() == mixed                   # the shapes the test means to cover
    if prof.seconds_per_query_kv:                                  # the long-context term is exercised
        assert (np.asarray(st["decode_qk"])[np.asarray(st["n_decode"]) > 0] > 0).all()


def test_disagg_engine_and_residuals_agree_on_one_shape():
    """One prefill chunk (and one decode step): the prefill pool, the engine's pricer, the step-log re-pricer and
    the runner's residual terms give the same seconds."""
    for prof in (_tiny(), _tiny(only=True), _table2d()):
        pool = PrefillPool(profile=prof, drafter="dspark", K=K, replicas=1, chunk_tokens=64, gbps=1.0,
                           bytes_per_token=1.0)
        shape = StepShape.prefill_chunk(64, 0, "dspark", K)
        assert shape.prefill_qk == 64 * 65 // 2 and shape.kv_read == 64
        want = prof.price(shape).seconds
        assert pool.prefill_s(64) == StepPricer(prof, dense=False).seconds(shape)
        assert pool.prefill_s(64) == pytest.approx(want, rel=REL)
        # two chunks: the second after 64 cached tokens
        assert pool.prefill_s(100) == pytest.approx(
            want + prof.price(StepShape.prefill_chunk(36, 64, "dspark", K)).seconds, rel=REL)
        for s in (shape, StepShape(M=30, n_decode=6, kv_read=1800, decode_qk=int(6 * decode_query_keys(4, 300)),
                                   drafter="dspark", K=K)):
            log = {"M": [s.M], "n_decode": [s.n_decode], "kv_read": [s.kv_read],
                   "n_prefill_tokens": [s.prefill_tokens], "prefill_qk": [s.prefill_qk],
                   "prefill_chunks": [s.prefill_chunks], "decode_qk": [s.decode_qk]}
            engine = reprice_steps(prof, log, "dspark", K)[0]
            runner = {"M": log["M"], "n_decode": log["n_decode"], "kv_read": log["kv_read"],
                      "n_prefill_tokens": log["n_prefill_tokens"], "pf_qk": log["prefill_qk"],
                      "pf_chunks": log["prefill_chunks"], "dec_qk": log["decode_qk"]}
            resid = float(model_terms(runner, prof, K, "dspark").to_numpy().sum())
            assert engine == prof.price(s).seconds
            assert resid == pytest.approx(engine, rel=REL)


def test_fit_features_reproduce_price_per_family():
    """Each coefficient's feature column is what that coefficient adds to a calibrated builder profile's price:
    doubling one family's scale (or adding 1 s of fixed overhead) adds exactly its column."""
    model = ROOT / "dsparksim" / "data" / "models" / "llama-2-7b.json"
    basis = PriceBasis.build(model, "H100")
    rng = np.random.default_rng(1)
    n = 200
    nd = rng.integers(0, 40, n)
    pf = np.where((rng.random(n) < 0.4) | (nd == 0), rng.integers(1, 512, n), 0)
    steps = {"M": nd * 3 + pf, "n_decode": nd, "kv_read": nd * rng.integers(10, 4000, n) + pf,
             "n_prefill_tokens": pf, "prefill_qk": np.where(pf > 0, pf * (pf + 1) // 2, 0),
             "prefill_chunks": (pf > 0).astype(np.int64), "decode_qk": nd * rng.integers(10, 4000, n)}
    X = basis.features(steps)
    shape = StepShape.from_log(steps, None, 1)

    def priced(cal):
        return profile_from_dict(build_profile(model, "H100", date="2026-12-01", calibration=cal), "c.json"
                                 ).price(shape).seconds

    base = Calibration(fixed_overhead_s=basis.fixed_overhead_s)
    t0 = priced(base)
    coef = np.array([1.0] * len(FAMILIES) + [basis.fixed_overhead_s, 0.0])
    np.testing.assert_allclose(X @ coef, t0, rtol=1e-9)
    for k, param in enumerate(PARAMS):
        if param == "request_latency_s":       # outside the step loop: no step price
            assert not X[:, k].any()
            continue
        if param == "fixed_overhead_s":
            bumped = Calibration(fixed_overhead_s=basis.fixed_overhead_s + 1.0)
        else:
            bumped = Calibration(scales={param: 2.0}, fixed_overhead_s=basis.fixed_overhead_s)
        np.testing.assert_allclose(priced(bumped) - t0, X[:, k], rtol=1e-9, atol=1e-15, err_msg=param)
    assert (X[:, PARAMS.index("prefill")][pf == 0] == 0).all() and (X[:, PARAMS.index("prefill")][pf > 0] > 0).all()
