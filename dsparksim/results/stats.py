"""Seed statistics: Student-t intervals over independent seeds, and the seed list of a multi-seed run.

A frontier or capacity run with N seeds repeats every cell with seeds ``seed, seed+1, ..., seed+N-1``. Simulation
draws are keyed per (seed, request, step) (dsparksim.sim.streams), so two policies at one load and seed serve the same
requests with the same draws: per-seed differences between policies are paired, and an interval over the per-seed
differences (a gain) is the paired interval.
"""
from __future__ import annotations

import argparse
import math
from typing import Iterable, NamedTuple

import numpy as np
from dsparksim.config import pos_int

LEVEL = 0.95  # the nominal coverage of every interval dsparksim reports


class Interval(NamedTuple):
    """Mean of n per-seed values and its two-sided t-interval [lo, hi] (NaN when undefined)."""

    mean: float
    lo: float
    hi: float
    n: int

    @property
    def half_width(self) -> float:
        return (self.hi - self.lo) / 2


# The most seeds one multi-seed command runs per cell (--seeds, [capacity] seeds, [regress] seeds, plan.seeds):
# a 95% t-interval is within 1% of its limit from ~100 seeds; far above that a typo would run for days.
MAX_SEEDS = 1000


def seeds_arg(s: str) -> int:
    """Option parser of --seeds: an integer in 1..MAX_SEEDS."""

    n = pos_int(s)
    if n > MAX_SEEDS:
        raise argparse.ArgumentTypeError(f"expected at most {MAX_SEEDS} seeds, got {s!r}")
    return n


def seed_list(seed: int, n: int) -> list[int]:
    """The N seeds of a multi-seed run: ``seed, seed+1, ..., seed+n-1`` (the first is the run's own seed, so
    seed 0 of N is exactly the single-seed run)."""
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_SEEDS:
        raise ValueError(f"number of seeds must be an integer in 1..{MAX_SEEDS}, got {n!r}")
    return [int(seed) + i for i in range(n)]


def t_quantile(n: int, level: float = LEVEL) -> float:
    """The two-sided Student-t critical value for ``n`` samples (n - 1 degrees of freedom); NaN for n < 2."""
    if n < 2:
        return math.nan
    from scipy.stats import t  # lazy: scipy

    return float(t.ppf(0.5 + level / 2, n - 1))


def t_interval(values: Iterable[float | None], level: float = LEVEL) -> Interval:
    """Mean and t-interval of per-seed values: mean +- t_{n-1} * sd / sqrt(n).

    A missing value (None or NaN: e.g. a seed where no request finished) makes the whole result NaN: averaging the
    other seeds would silently condition on the seeds that happened to finish. With one value the mean is that
    value and the interval is NaN (no spread to estimate). Identical values give a zero-width interval exactly.
    """
    v = np.array([math.nan if x is None else float(x) for x in values], float)
    n = len(v)
    if n == 0 or not np.isfinite(v).all():
        return Interval(math.nan, math.nan, math.nan, n)
    m = float(v.mean())
    if n < 2:
        return Interval(m, math.nan, math.nan, n)
    if (v == v[0]).all():
        return Interval(float(v[0]), float(v[0]), float(v[0]), n)  # exact: no float noise around a constant
    h = t_quantile(n, level) * float(v.std(ddof=1)) / math.sqrt(n)
    return Interval(m, m - h, m + h, n)
