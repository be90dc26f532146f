"""Cost profiles: floor lookup, range rules, drafting by kind, context models, validation, shipped profiles."""
from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest

from dsparksim.errors import ConfigError, InputError
from dsparksim.cost.profile import (CostProfile, ProfileRangeError, list_profiles, load_profile, profile_from_dict,
                               profile_to_dict, save_profile)

DATA = Path(__file__).resolve().parent / "data"
REPO = Path(__file__).resolve().parents[1]
SHARED_VIDUR = REPO / ".." / "shared" / "data" / "vidur-profiles"


@pytest.fixture
def small() -> CostProfile:
    return load_profile(DATA / "profile_small.json")


def small_dict() -> dict:
    return json.loads((DATA / "profile_small.json").read_text())


# ------------------------------------------------------------------ floor lookup
def test_floor_lookup_exact_at_and_between_breakpoints(small):
    # breakpoints M=[1,8,16,64], times [1,2,3,5] ms
    M = np.array([1, 2, 7, 8, 9, 15, 16, 17, 63, 64])
    want = np.array([1, 1, 1, 2, 2, 2, 3, 3, 3, 5]) * 1e-3
    np.testing.assert_array_equal(small.verify_time(M), want)
    # just below a riser gets the lower step, never an interpolated value
    assert small.verify_time(63) == 0.003
    assert small.verify_time(63.999) == 0.003
    assert isinstance(small.verify_time(8), float)
    assert small.max_tokens == 64
    np.testing.assert_allclose(small.sps(np.array([8, 64])), [500.0, 200.0])


def test_linear_attention_term(small):
    assert small.context_model == "linear"
    assert small.verify_time(8, 1000) == pytest.approx(0.002 + 1e-7 * 1000, rel=1e-12)
    got = small.verify_time(np.array([8, 16]), np.array([0, 2000]))
    np.testing.assert_allclose(got, [0.002, 0.003 + 2e-4], rtol=1e-12)
    with pytest.raises(ConfigError, match="kv_tokens"):
        small.verify_time(8, -1)


def test_range_errors_name_profile_value_and_range(small):
    for bad in (0, 65, np.array([8, 100])):
        with pytest.raises(ProfileRangeError) as ei:
            small.verify_time(bad)
        msg = str(ei.value)
        assert "small" in msg and "[1, 64]" in msg and "verify.M" in msg
        assert isinstance(ei.value, ValueError)
    with pytest.raises(ProfileRangeError, match="100"):
        small.verify_time(np.array([8, 100]))


def test_explicit_extrapolation_is_reported(small):
    e = small.with_extrapolation(True)
    # last octave secant: from the largest breakpoint <= 32 (M=16, 3 ms) to M=64 (5 ms): 2 ms / 48 tokens
    slope = (0.005 - 0.003) / 48
    assert e.verify_time(128) == pytest.approx(0.005 + slope * 64, rel=1e-12)
    assert e.verify_time(64) == 0.005  # in range: untouched
    assert e.verify_time(0.5) == 0.001  # below: first step
    rep = e.extrapolation_report()
    assert rep["enabled"] and rep["extrapolated"]
    ax = rep["axes"]["verify.M"]
    assert ax["count"] == 2 and ax["above"] == 1 and ax["below"] == 1
    assert ax["max_seen"] == 128 and ax["range"] == [1, 64]
    e.verify_time(np.array([70, 300, 8]))
    assert e.extrapolation_report()["axes"]["verify.M"]["count"] == 4
    assert e.extrapolation_report()["axes"]["verify.M"]["max_seen"] == 300
    # the original is untouched and still strict
    assert small.extrapolation_report() == {"enabled": False, "extrapolated": False, "axes": {}}
    with pytest.raises(ProfileRangeError):
        small.verify_time(128)


def test_extrapolation_slope_never_negative(tmp_path):
    d = small_dict()
    d["verify"] = {"M": [1, 8, 16, 64], "time_s": [0.001, 0.002, 0.006, 0.005]}  # jagged: falls at the end
    p = profile_from_dict(d, "x.json", extrapolate=True)
    assert p.verify_time(1000) == 0.005


# ------------------------------------------------------------------ drafting and non-trimmable terms
def test_draft_time_by_kind(small):
    # parallel: one forward over n_req*K tokens: 2*4=8 -> 0.6 ms, times 1.008
    assert small.draft_time("dspark", 2, 4) == pytest.approx(0.0006 * 1.008, rel=1e-12)
    # 3*3=9 tokens floors to the 8-token step; 31 floors to 8; 32 -> 1.0 ms
    assert small.draft_time("dspark", 3, 3) == pytest.approx(0.0006 * 1.008, rel=1e-12)
    assert small.draft_time("dspark", 4, 8) == pytest.approx(0.0010 * 1.008, rel=1e-12)
    # autoregressive: K forwards of n_req tokens
    assert small.draft_time("eagle3", 8, 5) == pytest.approx(5 * 0.0003, rel=1e-12)
    assert small.draft_time("eagle3", 7, 5) == pytest.approx(5 * 0.0002, rel=1e-12)
    # mtp: one forward of n_req tokens
    assert small.draft_time("mtp1", 8, 1) == pytest.approx(0.00035, rel=1e-12)
    with pytest.raises(ConfigError, match="K=1"):
        small.draft_time("mtp1", 8, 2)
    # vectorised over n_req; zero requests cost nothing; no drafter = plain decoding
    np.testing.assert_allclose(small.draft_time("eagle3", np.array([0, 1, 8]), 2), [0.0, 0.0004, 0.0006])
    assert small.draft_time(None, 8, 7) == 0.0
    # beyond the drafter's tokens axis is a range error, too
    with pytest.raises(ProfileRangeError, match="drafters.dspark.tokens"):
        small.draft_time("dspark", 5, 7)


def test_chain_drafter_runs_its_first_forward_over_the_verified_tokens():
    """kind chain (the MTP/EAGLE chain as SGLang runs it): one forward over n_req*(K+1) tokens (the draft extend
    over the verified tokens, which yields the first draft) + K-1 forwards over n_req tokens."""
    d = small_dict()
    d["drafters"]["chain"] = {**d["drafters"]["eagle3"], "kind": "chain"}   # tokens [1, 8, 32], 0.2/0.3/0.4 ms
    p = profile_from_dict(d, "x.json")
    # n=4, K=2: 12 tokens floor to the 8-token step (0.3 ms) + 1 forward at 4 -> floors to 1 (0.2 ms)
    assert p.draft_time("chain", 4, 2) == pytest.approx(0.0003 + 0.0002, rel=1e-12)
    # n=8, K=3: 32 tokens (0.4 ms) + 2 forwards at 8 (0.3 ms each); the autoregressive kind pays 3 x 0.3 ms
    assert p.draft_time("chain", 8, 3) == pytest.approx(0.0004 + 2 * 0.0003, rel=1e-12)
    assert p.draft_time("eagle3", 8, 3) == pytest.approx(3 * 0.0003, rel=1e-12)
    # K=1: the one forward is the draft extend over 2 tokens per request
    assert p.draft_time("chain", 4, 1) == pytest.approx(0.0003, rel=1e-12)
    # vectorised; zero requests cost nothing
    np.testing.assert_allclose(p.draft_time("chain", np.array([0, 1, 8]), 2), [0.0, 0.0002 + 0.0002, 0.0003 + 0.0003])  # 24 tokens floor to 8


def test_unknown_drafter_lists_available(small):
    with pytest.raises(ConfigError) as ei:
        small.draft_time("medusa", 1, 1)
    msg = str(ei.value)
    assert "small" in msg and "medusa" in msg and "dspark, eagle3, mtp1" in msg


def test_nontrimmable_and_step_time(small):
    # n_req=3 -> batch overhead floor at n_req=1 (0.1 ms); dspark 3*7=21 tokens -> 0.6 ms * 1.008
    nt = small.nontrimmable_time("dspark", 3, 7)
    assert nt == pytest.approx(0.0006 * 1.008 + 0.0015 + 0.0001, rel=1e-12)
    assert small.nontrimmable_time("dspark", 4, 8) == pytest.approx(0.0010 * 1.008 + 0.0015 + 0.0004, rel=1e-12)
    st = small.step_time(np.array([8, 24]), 3, "dspark", 7, kv_tokens=500)
    np.testing.assert_allclose(st, np.array([0.002, 0.003]) + 500e-7 + nt, rtol=1e-12)
    assert small.batch_overhead_time(0) == 0.0


def test_two_d_table_floors_on_both_axes():
    p = load_profile(DATA / "profile_2d.json")
    assert p.context_model == "table"
    assert p.verify_time(8, 0) == 0.002
    assert p.verify_time(8, 999) == 0.002  # below the kv riser: lower row
    assert p.verify_time(8, 1000) == 0.0025
    assert p.verify_time(15, 3999) == 0.0025
    assert p.verify_time(16, 4000) == 0.006
    np.testing.assert_array_equal(p.verify_time(np.array([1, 8, 16]), 1500), [0.0015, 0.0025, 0.0035])
    with pytest.raises(ProfileRangeError, match="kv_tokens"):
        p.verify_time(8, 4001)
    with pytest.raises(ProfileRangeError, match="verify.M"):
        p.verify_time(17, 0)
    e = p.with_extrapolation(True)
    # kv above: last row + octave secant along kv (rows 1000 -> 4000 at M=8: 1.5 ms / 3000 tokens)
    assert e.verify_time(8, 7000) == pytest.approx(0.004 + 0.0015 / 3000 * 3000, rel=1e-12)
    assert e.extrapolation_report()["axes"]["verify.kv_tokens"]["max_seen"] == 7000
    with pytest.raises(ConfigError, match="no drafter costs"):
        p.draft_time("dspark", 1, 7)


def test_jagged_times_are_accepted_and_kept():
    d = small_dict()
    d["verify"]["time_s"] = [0.002, 0.001, 0.003, 0.0025]
    p = profile_from_dict(d, "jagged.json")
    assert p.verify_time(8) == 0.001 and p.verify_time(64) == 0.0025


# ------------------------------------------------------------------ validation
def _mutations():
    def m(f):
        d = small_dict()
        f(d)
        return d
    return [
        ("missing field", m(lambda d: d["verify"].pop("M")), "verify.M", "missing"),
        ("renamed field", m(lambda d: d.__setitem__("fixed_overhead_ms", d.pop("fixed_overhead_s"))),
         "fixed_overhead_ms", "unknown key"),
        ("missing top field", m(lambda d: d.pop("fixed_overhead_s")), "fixed_overhead_s", "missing"),
        ("missing metadata", m(lambda d: d["metadata"].pop("source")), "metadata.source", "missing"),
        ("empty breakpoints", m(lambda d: d["verify"].update(M=[], time_s=[])), "verify.M", "empty"),
        ("non-monotone", m(lambda d: d["verify"].update(M=[1, 16, 8, 64])), "verify.M", "index 2"),
        ("repeated breakpoint", m(lambda d: d["verify"].update(M=[1, 8, 8, 64])), "verify.M", "strictly increasing"),
        ("zero M", m(lambda d: d["verify"].update(M=[0, 8, 16, 64])), "verify.M", ">= 1"),
        ("negative time", m(lambda d: d["verify"].update(time_s=[0.001, -0.002, 0.003, 0.005])), "verify.time_s",
         "index 1"),
        ("NaN time", m(lambda d: d["verify"].update(time_s=[0.001, 0.002, float("nan"), 0.005])), "verify.time_s",
         "index 2"),
        ("length mismatch", m(lambda d: d["verify"].update(time_s=[0.001, 0.002])), "verify.time_s",
         "length mismatch"),
        ("bad format", m(lambda d: d.update(format="dsparksim-profile/0")), "format", "dsparksim-profile/1"),
        ("unknown kind", m(lambda d: d["drafters"]["dspark"].update(kind="tree")), "drafters.dspark.kind", "tree"),
        ("drafter tokens", m(lambda d: d["drafters"]["eagle3"].update(tokens=[1, 32, 8])), "drafters.eagle3.tokens",
         "index 2"),
        ("markov on ar", m(lambda d: d["drafters"]["eagle3"].update(markov_overhead_frac=0.01)),
         "drafters.eagle3.markov_overhead_frac", "parallel"),
        ("negative overhead", m(lambda d: d.update(fixed_overhead_s=-1.0)), "fixed_overhead_s", ">= 0"),
        ("batch length", m(lambda d: d["batch_overhead"].update(time_s=[0.1])), "batch_overhead.time_s",
         "length mismatch"),
        ("2d plus attention", m(lambda d: d["verify"].update(kv_tokens=[0], time_s=[[0.001, 0.002, 0.003, 0.005]])),
         "attention", "twice"),
        ("2d first kv", m(lambda d: (d.pop("attention"), d["verify"].update(
            kv_tokens=[5], time_s=[[0.001, 0.002, 0.003, 0.005]]))), "verify.kv_tokens", "must be 0"),
        ("negative prefill", m(lambda d: d.update(prefill={"seconds_per_token": -1e-6})), "prefill.seconds_per_token",
         ">= 0"),
        ("prefill typo", m(lambda d: d.update(prefill={"seconds_per_token": 0.0, "seconds_per_qk": 1e-9})),
         "prefill.seconds_per_qk", "unknown key"),
        ("drafter prefill", m(lambda d: d["drafters"]["dspark"].update(prefill_s_per_token="fast")),
         "drafters.dspark.prefill_s_per_token", "number"),
        ("2d rows", m(lambda d: (d.pop("attention"), d["verify"].update(
            kv_tokens=[0, 10], time_s=[[0.001, 0.002, 0.003, 0.005]]))), "verify.time_s", "one row per kv_tokens"),
    ]


@pytest.mark.parametrize("label,d,field,needle", _mutations(), ids=[m[0] for m in _mutations()])
def test_malformed_profiles_name_file_and_field(tmp_path, label, d, field, needle):
    path = tmp_path / "bad_profile.json"
    path.write_text(json.dumps(d))  # json writes NaN as NaN, which json.loads reads back
    with pytest.raises(InputError) as ei:
        load_profile(path)
    msg = str(ei.value)
    assert str(path) in msg, msg
    assert f"'{field}'" in msg, msg
    assert needle in msg, msg


def test_invalid_json_and_missing_file(tmp_path):
    p = tmp_path / "broken.json"
    p.write_text('{"format": "dsparksim-profile/1",\n "name": }')
    with pytest.raises(InputError, match=r"broken.json:2"):
        load_profile(p)
    with pytest.raises(InputError, match="not found"):
        load_profile(tmp_path / "nope.json")


def test_unknown_name_lists_shipped():
    with pytest.raises(ConfigError) as ei:
        load_profile("h100-llama9-tp1")
    assert "h100-llama2-7b-tp1" in str(ei.value)


def test_save_load_round_trip(tmp_path, small):
    out = save_profile(small, tmp_path / "rt.json")
    q = load_profile(out)
    assert profile_to_dict(q) == profile_to_dict(small)
    for name in ("verify_M", "verify_time_s"):
        np.testing.assert_array_equal(getattr(q, name), getattr(small, name))
    p2 = load_profile(DATA / "profile_2d.json")
    q2 = load_profile(save_profile(p2, tmp_path / "rt2.json"))
    np.testing.assert_array_equal(q2.verify_time_s, p2.verify_time_s)
    # save refuses to write what load would reject
    bad = profile_to_dict(small)
    bad["verify"]["M"] = [1, 1, 2, 3]
    with pytest.raises(InputError):
        save_profile(bad, tmp_path / "bad.json")
    assert not (tmp_path / "bad.json").exists()


def test_arrays_are_read_only(small):
    with pytest.raises(ValueError):
        small.verify_time_s[0] = 1.0


# ------------------------------------------------------------------ shipped profiles
def test_shipped_profiles_load_with_provenance():
    names = list_profiles()
    assert {"h100-llama2-7b-tp1", "h100-llama2-70b-tp4"} <= set(names)
    for n in names:
        p = load_profile(n)
        md = p.metadata
        if "derivation" not in md:  # measured on a real engine (dsparksim measure), not derived from vidur
            assert md["source"] and md["date"] and md["kv_capacity_tokens"] > 0
            continue
        der = md["derivation"]
        assert p.name == n and p.context_model == "linear"
        assert {"dspark", "dflash", "eagle3", "mtp1"} <= set(p.drafters)
        assert p.drafters["dspark"].markov_overhead_frac == 0.008
        assert len(der["csv_sha256_16"]) == 16 and der["model_shape"]["n_layers"] in (32, 80)
        assert md["kv_capacity_tokens"] > 10_000 and md["date"]
        assert p.drafters["dspark"].tokens[-1] == p.max_tokens  # drafter axis covers the CSV range


def test_h100_7b_decode_step_ballpark():
    p = load_profile("h100-llama2-7b-tp1")
    # 64 decoding requests x 512 context, no speculation: public H100 7B decode steps are ~10-20 ms
    t = p.verify_time(64, 64 * 512) + p.fixed_overhead_s
    assert 0.010 < t < 0.020
    # drafting is non-trimmable and cheaper than the target forward
    assert 0 < p.draft_time("dspark", 8, 7) < p.verify_time(64)
    assert p.draft_time("dspark", 8, 7) > p.draft_time("dflash", 8, 7)
    p70 = load_profile("h100-llama2-70b-tp4")
    assert p70.metadata["tensor_parallel"] == 4 and p70.verify_time(64) > p.verify_time(64)


def _derive_module():
    spec = importlib.util.spec_from_file_location("derive_vidur", REPO / "profiles" / "derive_vidur.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_shipped_profiles_regenerate_identically():
    if not SHARED_VIDUR.is_dir():
        pytest.skip("../shared/data/vidur-profiles not present")
    mod = _derive_module()
    for name in mod.SHIPPED:
        shipped = json.loads((REPO / "profiles" / f"{name}.json").read_text())
        fresh = json.loads(json.dumps(mod.derive(name, SHARED_VIDUR, shipped["metadata"]["date"])))
        assert fresh == shipped, f"{name} does not regenerate identically"


def test_derive_keeps_the_measured_staircase():
    if not SHARED_VIDUR.is_dir():
        pytest.skip("../shared/data/vidur-profiles not present")
    import pandas as pd
    mod = _derive_module()
    d = mod.derive("h100-llama2-7b-tp1", SHARED_VIDUR, "2026-01-01")
    df = pd.read_csv(SHARED_VIDUR / "h100_meta-llama_Llama-2-7b-hf_mlp.csv")
    df = df[df.num_tensor_parallel_workers == 1]
    assert d["verify"]["M"] == sorted(int(x) for x in df.num_tokens.unique())
    # M=1: 32 layers x per-layer op sum + emb + LM head (weight-bandwidth bound at 1 token), no smoothing
    r = df[df.num_tokens == 1]
    layer = sum(r[f"time_stats.{op}.median"].median() for op in mod.OPS) / 1e3
    emb = r["time_stats.emb.median"].median() / 1e3
    head = int(r.vocab_size.iloc[0]) * 4096 * 2 / (3.35e12 * 0.7)
    assert d["verify"]["time_s"][0] == pytest.approx(32 * layer + emb + head, rel=1e-5)
    # kv bandwidth: 2 * 32 layers * 32 kv heads * 128 * 2 bytes / (3.35 TB/s * 0.7)
    assert d["attention"]["seconds_per_kv_token"] == pytest.approx(2 * 32 * 32 * 128 * 2 / 2.345e12, rel=1e-5)
    assert not math.isnan(d["fixed_overhead_s"])


def test_prefill_term_prices_tokens_query_keys_chunks_and_the_drafter(tmp_path):
    d = small_dict()
    assert load_profile(DATA / "profile_small.json").prefill_time("dspark", 100, 5000, 2) == 0.0   # no term: 0
    d["prefill"] = {"seconds_per_token": 1e-6, "seconds_per_query_key": 2e-9, "seconds_per_chunk": 3e-4,
                    "note": "test"}
    d["drafters"]["dspark"]["prefill_s_per_token"] = 4e-6
    p = profile_from_dict(d, source="t")
    assert p.prefill_time("dspark", 100, 5000, 2) == pytest.approx(100e-6 + 10e-6 + 6e-4 + 400e-6)
    assert p.prefill_time("mtp1", 100, 5000, 2) == pytest.approx(100e-6 + 10e-6 + 6e-4)
    assert p.prefill_time(None, 100, 5000, 2) == pytest.approx(100e-6 + 10e-6 + 6e-4)
    back = profile_from_dict(profile_to_dict(p), source="t2")
    assert back.prefill_time("dspark", 7, 33, 1) == p.prefill_time("dspark", 7, 33, 1)
    assert profile_to_dict(back)["drafters"]["dspark"]["prefill_s_per_token"] == 4e-6
