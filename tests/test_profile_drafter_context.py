"""The drafter's context term (profile ``drafters.<name>.seconds_per_kv_token``): closed form in the profile and in
the engine's step price, JSON round trip, validation, and absent = priced exactly as before."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dsparksim.acceptance.base import AcceptanceModel, Block
from dsparksim.errors import ConfigError, InputError
from dsparksim.policies import make_policy
from dsparksim.cost.profile import load_profile, profile_from_dict, profile_to_dict
from dsparksim.traffic.base import Workload
from sim_kit import make_sim  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"
S = 4e-8          # seconds per KV token of the drafter's attention


def _dict(s: float | None = S) -> dict:
    d = json.loads((DATA / "profile_small.json").read_text())
    if s is not None:
        d["drafters"]["dspark"]["seconds_per_kv_token"] = s
    return d


def test_profile_prices_the_drafter_context_in_closed_form():
    base, p = profile_from_dict(_dict(None), "base"), profile_from_dict(_dict(), "ctx")
    for n, K, kv in ((1, 4, 0), (2, 4, 500), (3, 7, 12345), (4, 8, 10**6)):
        assert p.draft_time("dspark", n, K, kv) == pytest.approx(base.draft_time("dspark", n, K) + S * kv, rel=1e-12)
        assert p.nontrimmable_time("dspark", n, K, kv) == pytest.approx(
            base.nontrimmable_time("dspark", n, K) + S * kv, rel=1e-12)
        assert p.step_overhead("dspark", n, K, kv_tokens=kv) == pytest.approx(
            base.step_overhead("dspark", n, K) + S * kv, rel=1e-12)
        st = p.step_time(np.array([8, 24]), n, "dspark", K, kv_tokens=kv)
        np.testing.assert_allclose(st, base.step_time(np.array([8, 24]), n, "dspark", K, kv_tokens=kv) + S * kv,
                                   rtol=1e-12)
    # nothing drafted -> no drafter attention: a prefill-only step and plain decoding pay none of it
    assert p.step_overhead("dspark", 0, 4, kv_tokens=5000) == base.step_overhead("dspark", 0, 4)
    assert p.draft_time(None, 3, 4, 5000) == 0.0
    np.testing.assert_allclose(p.draft_time("dspark", np.array([0, 2]), 4, np.array([900, 900])),
                               [0.0, base.draft_time("dspark", 2, 4) + S * 900], rtol=1e-12)
    # only the drafter that has the term pays it; the memo never caches one step's context for the next
    assert p.nontrimmable_time("eagle3", 2, 4, 9999) == base.nontrimmable_time("eagle3", 2, 4)
    assert p.nontrimmable_time("dspark", 2, 4, 100) != p.nontrimmable_time("dspark", 2, 4, 200)
    with pytest.raises(ConfigError, match="kv_tokens"):
        p.draft_time("dspark", 2, 4, -1)


def test_round_trip_keeps_the_term_and_absent_stays_absent():
    p = profile_from_dict(_dict(), "ctx")
    d = profile_to_dict(p)
    assert d["drafters"]["dspark"]["seconds_per_kv_token"] == S
    back = profile_from_dict(d, "back")
    assert back.drafters["dspark"].seconds_per_kv_token == S
    assert back.step_overhead("dspark", 2, 4, kv_tokens=777) == p.step_overhead("dspark", 2, 4, kv_tokens=777)
    # absent (and 0) write nothing: older profiles round-trip byte-for-byte
    assert "seconds_per_kv_token" not in profile_to_dict(profile_from_dict(_dict(None), "b"))["drafters"]["dspark"]
    assert "seconds_per_kv_token" not in profile_to_dict(profile_from_dict(_dict(0.0), "z"))["drafters"]["dspark"]


@pytest.mark.parametrize("bad,needle", [(-1e-9, ">= 0"), (float("nan"), "finite"), (float("inf"), "finite"),
                                        ("fast", "number"), (True, "number")])
def test_bad_values_are_refused_naming_the_field(tmp_path, bad, needle):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(_dict(bad)))
    with pytest.raises(InputError) as ei:
        load_profile(path)
    msg = str(ei.value)
    assert str(path) in msg and "'drafters.dspark.seconds_per_kv_token'" in msg and needle in msg, msg


def test_scalar_step_query_prices_bit_identically_to_the_array_path():
    # the engine prices one step per call with Python ints: that fast path must be the array path's sum exactly,
    # for numpy integers too, and still refuse a negative context
    p = profile_from_dict(_dict(), "ctx")
    for n in (0, 1, 2, 3, 4):
        for kv in (0, 1, 37, 4000, 10**6):
            want = float(p.nontrimmable_time("dspark", np.array([n]), 4, np.array([kv]))[0])
            assert p.nontrimmable_time("dspark", n, 4, kv) == want, (n, kv)
            assert p.nontrimmable_time("dspark", np.int64(n), 4, np.int64(kv)) == want, (n, kv)
            assert p.step_overhead("dspark", n, 4, kv_tokens=kv) == (want if n else p.fixed_overhead_s)
    with pytest.raises(ConfigError, match="kv_tokens"):
        p.nontrimmable_time("dspark", 2, 4, -1)


def test_absent_term_prices_bit_identically():
    base, zero = profile_from_dict(_dict(None), "base"), profile_from_dict(_dict(0.0), "zero")
    for n, K, kv in ((1, 4, 0), (3, 7, 4321), (0, 4, 99)):
        assert zero.step_overhead("dspark", n, K, kv_tokens=kv) == base.step_overhead("dspark", n, K)
        assert zero.draft_time("dspark", n, K, kv) == base.draft_time("dspark", n, K)


class _Accept(AcceptanceModel):
    drafter = "dspark"

    def __init__(self, K: int):
        self.K, self.metadata = K, {"source": "test"}

    def start(self, slots, domains, rng):
        pass

    def draw(self, slots, rng):
        n = len(slots)
        A = rng.integers(0, self.K + 1, n)
        return Block(conf=np.full((n, self.K), 0.7), accepted=A.astype(np.int64))


def _run(profile, K=4):
    wl = Workload(prompt_tokens=np.full(12, 20), output_tokens=np.full(12, 30),
                  domain=np.array(["chat"] * 12, dtype=object), concurrency=4)
    pol = make_policy("fixed:4")
    pol.reset(K, np.random.default_rng(0))
    return make_sim(profile=profile, acceptance=_Accept(K), policy=pol, workload=wl, block_size=K,
                      drafter="dspark", kv_capacity_tokens=10**6, max_num_seqs=4, max_batched_tokens=64,
                      prefill_chunk_tokens=16, rng=np.random.default_rng(1), num_requests=12).run()


def test_engine_step_price_rises_by_exactly_the_drafter_term_times_kv_read():
    # profile_small has no prefill or long-context term, so a step's price is verify_time(M, kv) + the floor
    base, p = profile_from_dict(_dict(None), "base"), profile_from_dict(_dict(), "ctx")
    st = _run(p).steps
    n, M, kv, dt = (np.asarray(st[k]) for k in ("n_decode", "M", "kv_read", "dt"))
    assert (n > 0).sum() > 20 and (kv[n > 0] > 0).all()
    without = np.array([base.verify_time(int(m), int(k)) + base.step_overhead("dspark", int(c), 4)
                        for m, k, c in zip(M, kv, n)])
    np.testing.assert_allclose(dt - without, np.where(n > 0, S * kv, 0.0), rtol=1e-9, atol=1e-15)
