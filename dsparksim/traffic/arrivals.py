"""Open-loop arrival processes (vectorised numpy), with the conventions of ``vllm bench serve``.

The first request arrives at t = 0 and request i arrives after the sum of the first i inter-arrival gaps
(vLLM sends a request, then sleeps one gap). Gaps:

- ``poisson``:  exponential with mean 1/rate (CV = 1).
- ``gamma``:    gamma with shape = burstiness and scale = 1/(rate * burstiness), exactly like
                ``vllm bench serve --burstiness``: the mean gap stays 1/rate, the coefficient of variation of the
                gaps is 1/sqrt(burstiness). burstiness = 1 is Poisson, < 1 is burstier, > 1 is smoother.
- ``constant``: exactly 1/rate (CV = 0).
"""
from __future__ import annotations

import math

import numpy as np

from dsparksim.errors import ConfigError

PROCESSES = ("poisson", "gamma", "constant")


def _check(process: str, rate: float, burstiness: float) -> None:
    if process not in PROCESSES:
        raise ConfigError("arrivals", "process", f"expected one of {PROCESSES}, got {process!r}")
    if not (isinstance(rate, (int, float)) and math.isfinite(rate) and rate > 0):
        raise ConfigError("arrivals", "rate", f"expected a finite rate > 0 req/s, got {rate!r}")
    if not (isinstance(burstiness, (int, float)) and math.isfinite(burstiness) and burstiness > 0):
        raise ConfigError("arrivals", "burstiness", f"expected a finite value > 0, got {burstiness!r}")


def interarrival_cv(process: str, burstiness: float = 1.0) -> float:
    """Theoretical coefficient of variation of the inter-arrival gaps."""
    return {"poisson": 1.0, "constant": 0.0}.get(process, 1.0 / math.sqrt(burstiness))


def interarrivals(process: str, rate: float, n: int, rng: np.random.Generator, burstiness: float = 1.0) -> np.ndarray:
    """``n`` inter-arrival gaps in seconds (float64). ``constant`` does not touch ``rng``."""
    _check(process, rate, burstiness)
    if process == "poisson":
        return rng.exponential(1.0 / rate, size=n)
    if process == "gamma":
        return rng.gamma(burstiness, 1.0 / (rate * burstiness), size=n)
    return np.full(n, 1.0 / rate)


def arrival_times(process: str, rate: float, rng: np.random.Generator, *, burstiness: float = 1.0,
                  num_requests: int | None = None, duration_s: float | None = None) -> np.ndarray:
    """Arrival times from t = 0: ``num_requests`` of them, or all with t < ``duration_s``, whichever is fewer.

    At least one bound is required. With only ``duration_s`` the gaps are drawn in chunks sized from the
    expected count, so the draw sequence (and the result) is a pure function of the arguments and the rng state.
    """
    _check(process, rate, burstiness)
    if num_requests is None and duration_s is None:
        raise ConfigError("arrivals", "num_requests/duration_s", "give num_requests, duration_s or both")
    if process == "constant":   # i / rate exactly, no accumulated rounding from a cumsum
        n = num_requests if num_requests is not None else int(math.ceil(duration_s * rate)) + 1
        t = np.arange(n, dtype=np.float64) / rate
    elif num_requests is not None:
        gaps = interarrivals(process, rate, max(num_requests - 1, 0), rng, burstiness)
        t = np.concatenate(([0.0], np.cumsum(gaps)))[:num_requests]
    else:
        expected = rate * duration_s
        chunk = int(expected + 10.0 * math.sqrt(expected) + 64)
        t = np.zeros(1)
        while t[-1] < duration_s:   # a chunk usually suffices; very bursty gamma may need more
            t = np.concatenate((t, t[-1] + np.cumsum(interarrivals(process, rate, chunk, rng, burstiness))))
    if duration_s is not None:
        t = t[t < duration_s]
    return t
