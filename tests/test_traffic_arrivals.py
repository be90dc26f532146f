"""Arrival processes: statistics, exact constant spacing, bounds. All seeds fixed."""
import numpy as np
import pytest
from scipy import stats

from dsparksim.errors import ConfigError
from dsparksim.traffic.arrivals import arrival_times, interarrival_cv, interarrivals

N = 20_000


def test_poisson_rate_and_exponential_gaps():
    rate = 5.0
    gaps = interarrivals("poisson", rate, N, np.random.default_rng(1))
    # mean of N exponential gaps has relative s.e. 1/sqrt(N) = 0.7%; 3% is > 4 s.e.
    assert gaps.mean() == pytest.approx(1 / rate, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)
    # KS against Exp(rate): with a correct sampler p is uniform, so p > 0.01 fails 1% of seeds; seed fixed.
    assert stats.kstest(gaps, "expon", args=(0, 1 / rate)).pvalue > 0.01


@pytest.mark.parametrize("b", [0.25, 1.0, 4.0])
def test_gamma_mean_cv_and_distribution(b):
    rate = 3.0
    gaps = interarrivals("gamma", rate, N, np.random.default_rng(2), burstiness=b)
    # mean s.e. = CV/sqrt(N) <= 2/141 = 1.4%; 5% is > 3.5 s.e.
    assert gaps.mean() == pytest.approx(1 / rate, rel=0.05)
    # CV = 1/sqrt(b) (vllm bench serve --burstiness). Sample-std s.e. for shape 0.25 is ~1.8%; 8% tolerance.
    assert gaps.std() / gaps.mean() == pytest.approx(1 / np.sqrt(b), rel=0.08)
    assert interarrival_cv("gamma", b) == pytest.approx(1 / np.sqrt(b))
    assert stats.kstest(gaps, "gamma", args=(b, 0, 1 / (rate * b))).pvalue > 0.01


def test_ks_has_power_against_bursty_gaps():
    # The exponential KS check above must be able to fail: gamma(0.25) gaps are far from exponential.
    gaps = interarrivals("gamma", 5.0, N, np.random.default_rng(3), burstiness=0.25)
    assert stats.kstest(gaps, "expon", args=(0, 1 / 5.0)).pvalue < 1e-6


def test_constant_is_exact_and_uses_no_randomness():
    rng = np.random.default_rng(4)
    state = rng.bit_generator.state
    t = arrival_times("constant", 4.0, rng, num_requests=5)
    np.testing.assert_array_equal(t, [0.0, 0.25, 0.5, 0.75, 1.0])
    t = arrival_times("constant", 3.0, rng, num_requests=3001)
    assert t[3000] == 1000.0  # i / rate exactly, no cumsum drift
    assert rng.bit_generator.state == state
    np.testing.assert_array_equal(arrival_times("constant", 2.0, rng, duration_s=3.0), [0, 0.5, 1, 1.5, 2, 2.5])


def test_bounds_first_arrival_and_whichever_first():
    rng = np.random.default_rng(5)
    t = arrival_times("poisson", 10.0, rng, num_requests=100)
    assert len(t) == 100 and t[0] == 0.0 and np.all(np.diff(t) >= 0)
    t = arrival_times("poisson", 10.0, rng, duration_s=50.0)
    assert t.max() < 50.0 and abs(len(t) - 500) < 5 * np.sqrt(500)
    assert len(arrival_times("poisson", 10.0, rng, num_requests=30, duration_s=1000.0)) == 30
    assert arrival_times("poisson", 10.0, rng, num_requests=10_000, duration_s=5.0).max() < 5.0


def test_duration_only_covers_the_window_even_when_very_bursty():
    # burstiness 0.01 (CV 10): the first chunk often ends early, so more chunks must be drawn.
    t = arrival_times("gamma", 1.0, np.random.default_rng(6), burstiness=0.01, duration_s=2000.0)
    assert t.max() < 2000.0 and len(t) > 100 and np.all(np.diff(t) >= 0)


@pytest.mark.parametrize("kw", [dict(process="uniform", rate=1.0), dict(process="poisson", rate=0.0),
                                dict(process="poisson", rate=float("nan")),
                                dict(process="gamma", rate=1.0, burstiness=0.0)])
def test_bad_arguments(kw):
    with pytest.raises(ConfigError):
        arrival_times(rng=np.random.default_rng(0), num_requests=3, **kw)
    with pytest.raises(ConfigError, match="num_requests"):
        arrival_times("poisson", 1.0, np.random.default_rng(0))
