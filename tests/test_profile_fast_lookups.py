"""The per-step cost lookups (memoised nontrimmable_time, integer-array verify_time) equal the general path bitwise.

The general path is the code the fast paths bypass (float queries take it, and ``_nontrimmable`` is the former
``nontrimmable_time`` body), so every comparison below is old value vs new value on the same profile.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from dsparksim.cost.profile import ProfileRangeError, list_profiles, load_profile, profile_from_dict

SHIPPED = list_profiles()


def test_shipped_profiles_are_found():
    assert "h100-llama2-7b-tp1" in SHIPPED and len(SHIPPED) >= 4


def _Ks(kind):
    return [1] if kind == "mtp" else [1, 4, 7, 15]


def _ns(p, dc, K):
    """Every n up to 256 and both sides of every breakpoint of the drafter's axis, inside its measured range."""
    # tokens the drafter's table is looked up at per request: the parallel drafter's K, a chain's first forward
    # over the verified K + 1 (dsparksim.cost.profile, kind "chain"), one otherwise
    per = K if dc.kind == "parallel" else K + 1 if dc.kind == "chain" else 1
    lo, hi = int(dc.tokens[0]), int(dc.tokens[-1])
    edges = {int(t) // per + d for t in dc.tokens[::2] for d in (0, 1)}
    nmax = int(p.batch_overhead[0][-1]) if p.batch_overhead is not None else hi
    return np.array(sorted(n for n in set(range(1, 257)) | edges if 1 <= n <= nmax and lo <= n * per <= hi))


@pytest.mark.parametrize("name", SHIPPED)
def test_nontrimmable_memo_equals_general_path_for_all_n_K(name):
    p, ref = load_profile(name), load_profile(name)
    for drafter, dc in p.drafters.items():
        for K in _Ks(dc.kind):
            ns = _ns(p, dc, K)
            want = ref._nontrimmable(drafter, ns, K)  # general path, elementwise the same float operations
            assert want.shape == ns.shape
            for n, w in zip(ns.tolist(), want.tolist()):
                first = p.nontrimmable_time(drafter, n, K)
                again = p.nontrimmable_time(drafter, np.int64(n), K)  # memo hit
                assert type(first) is float and first == w and again == w, (drafter, n, K)
            n = int(ns[len(ns) // 2])  # the scalar general path agrees with the array one
            assert p.nontrimmable_time(drafter, n, K) == ref._nontrimmable(drafter, n, K)
    assert p.nontrimmable_time(None, 5, 7) == p._nontrimmable(None, 5, 7) == \
        p.fixed_overhead_s + p.batch_overhead_time(5)


@pytest.mark.parametrize("name", SHIPPED)
def test_integer_verify_time_equals_general_path_for_all_M(name):
    p = load_profile(name)
    M = np.arange(p.min_tokens, p.max_tokens + 1, dtype=np.int64)
    for kv in (0, 1, 123_457, 2.5e6):
        fast = p.verify_time(M, kv)
        slow = p.verify_time(M.astype(np.float64), kv)  # float queries take the general path
        assert fast.dtype == np.float64 and fast.shape == M.shape
        np.testing.assert_array_equal(fast, slow)
        np.testing.assert_array_equal(p.verify_time(M[::-7].reshape(-1, 1), kv)[:, 0],
                                      p.verify_time(M[::-7].astype(float), kv))


def _two_d(extrapolate=False):
    d = json.loads(open(load_profile("h100-llama2-7b-tp1").source).read())
    d.pop("attention")
    T = d["verify"]["time_s"]
    d["verify"] = {"M": d["verify"]["M"], "kv_tokens": [0, 1000, 50_000],
                   "time_s": [T, [t * 1.1 for t in T], [t * 1.7 + 3e-5 for t in T]]}
    return profile_from_dict(d, "<2d>", extrapolate=extrapolate)


def test_two_d_integer_verify_time_equals_general_path():
    p = _two_d()
    M = np.arange(1, p.max_tokens + 1, dtype=np.int64)
    for kv in (0, 999, 1000, 1001, 49_999, 50_000, np.int64(7), 3.5):
        np.testing.assert_array_equal(p.verify_time(M, kv), p.verify_time(M.astype(float), kv))
    with pytest.raises(ProfileRangeError, match="kv_tokens"):
        p.verify_time(M, 50_001)  # out of range still raises (the fast path steps aside)


def test_fast_paths_keep_range_errors_and_extrapolation_reports():
    p = load_profile("h100-llama2-7b-tp1")
    with pytest.raises(ProfileRangeError, match="verify.M"):
        p.verify_time(np.array([5, p.max_tokens + 1]), 0)
    with pytest.raises(ProfileRangeError, match="drafters.dspark.tokens"):
        p.nontrimmable_time("dspark", 100_000, 7)
    with pytest.raises(ProfileRangeError):  # a failed lookup is not memoised: it fails again
        p.nontrimmable_time("dspark", 100_000, 7)
    e = p.with_extrapolation(True)
    big = int(e.drafters["dspark"].tokens[-1])  # n*K above the drafter's last breakpoint
    a = e.nontrimmable_time("dspark", big, 7)
    b = e.nontrimmable_time("dspark", big, 7)
    assert a == b == e._nontrimmable("dspark", big, 7)
    # every extrapolated lookup is counted, memo or not: three calls, three queries
    assert e.extrapolation_report()["axes"]["drafters.dspark.tokens"]["count"] == 3
    e.verify_time(np.array([1, e.max_tokens + 5]), 0)
    assert e.extrapolation_report()["axes"]["verify.M"]["count"] == 1
    # copies start with empty caches
    assert e._memo is not p._memo
