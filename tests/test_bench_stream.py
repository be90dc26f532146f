"""Tokens per streamed chunk (dsparksim.bench.stream): closed forms, the measured non-speculative ratios, and the
inversion to an acceptance length."""
import math

import numpy as np
import pytest

from dsparksim.bench.stream import chain_increments, stream_ratio, tau_from_stream_ratio
from dsparksim.errors import ConfigError


def test_chain_increments_sum_to_one_and_give_tau():
    p = chain_increments(0.87, 2, decay=0.7126 / 0.87)
    assert p.sum() == pytest.approx(1.0)
    assert np.dot([1, 2, 3], p) == pytest.approx(1 + 0.87 + 0.87 * 0.7126)      # 2.49, the published figure


def test_non_speculative_ratio_closed_form():
    # one token per step, fixed length N: hits at 11, 21, ..., below N plus the finishing chunk
    n = 101                                   # hits at 11..91 (9) + finish = 10 chunks over 100 tokens
    assert stream_ratio(np.array([1.0]), 10, n, 1.0) == pytest.approx(100 / 10)
    n = 100                                   # hits at 11..91 (9) + finish = 10 chunks over 99 tokens
    assert stream_ratio(np.array([1.0]), 10, n, 1.0) == pytest.approx(99 / 10)


def test_non_speculative_ratio_matches_the_inferencex_runs():
    # InferenceX SGLang MTP-off runs: mean ITL / mean TPOT 9.95-9.96 (1k out, interval 10), 29.5-29.56 (B200, 30),
    # 9.99-10.0 (8k out, interval 10); lengths uniform in [0.8 L, L]
    assert stream_ratio(np.array([1.0]), 10, 1024, 0.8) == pytest.approx(9.955, abs=0.01)
    assert stream_ratio(np.array([1.0]), 30, 1024, 0.8) == pytest.approx(29.53, abs=0.04)
    assert stream_ratio(np.array([1.0]), 10, 8192, 0.8) == pytest.approx(9.995, abs=0.006)


def test_speculative_chunks_carry_interval_times_tau_tokens():
    # a renewal process visits each length with probability 1/tau: long outputs give interval x tau
    inc = chain_increments(0.8, 2)
    tau = float(np.dot([1, 2, 3], inc))
    assert stream_ratio(inc, 10, 200_00, 1.0) == pytest.approx(10 * tau, rel=0.01)


def test_inversion_round_trip_and_monotone():
    for a1 in (0.3, 0.6, 0.87):
        inc = chain_increments(a1, 2)
        r = stream_ratio(inc, 10, 1024, 0.8)
        tau, a = tau_from_stream_ratio(r, 10, 1024, 0.8)
        assert a == pytest.approx(a1, abs=1e-6)
        assert tau == pytest.approx(float(np.dot([1, 2, 3], inc)), abs=1e-6)
    rs = [stream_ratio(chain_increments(a, 2), 10, 1024, 0.8) for a in (0.2, 0.5, 0.8)]
    assert rs == sorted(rs)


def test_ratio_outside_what_the_chain_produces_is_refused():
    with pytest.raises(ConfigError, match="outside"):
        tau_from_stream_ratio(31.0, 10, 1024, 0.8)     # 3 tokens per step at most: < 30
    with pytest.raises(ConfigError, match="outside"):
        tau_from_stream_ratio(math.nan, 10, 1024, 0.8)


def test_a1_for_tau_inverts_the_chain_mean():
    from dsparksim.bench.stream import a1_for_tau
    a1 = a1_for_tau(2.49)
    assert a1 == pytest.approx(0.87, abs=1e-4)          # the published pair: a1 0.87, a2 0.7126 -> 2.49
    with pytest.raises(ConfigError, match="acceptance length"):
        a1_for_tau(3.5)
