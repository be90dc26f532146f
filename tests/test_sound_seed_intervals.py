"""Issue 31 item 4: frontier.csv intervals of metrics that cannot be negative stay at or above zero."""
from __future__ import annotations

import math

import pandas as pd
import pytest

from dsparksim.results.frontier_seeds import seed_means
from dsparksim.results.stats import t_interval


def _per_seed(col: str, values: list[float]) -> pd.DataFrame:
    n = len(values)
    return pd.DataFrame({"seed": list(range(n)), "replicas": [1] * n, "router": ["round-robin"] * n,
                         "policy": ["fixed:7"] * n, "load": [8] * n, "saturated": [False] * n,
                         "output_throughput_tok_s": [100.0 + i for i in range(n)],
                         "tps_user_median": [10.0] * n, col: values})


@pytest.mark.parametrize("col,values", [
    ("num_requests_issued", [0, 0, 9]),          # the case: a count over seeds with one large value
    ("num_preemptions", [0, 0, 0, 12]),
    ("ttft_p99_s", [0.01, 0.01, 2.5]),           # a latency: never negative either
])
def test_interval_of_a_nonnegative_metric_never_goes_below_zero(col, values):
    plain = t_interval(values)
    assert plain.lo < 0                           # the bare t-interval would go negative here
    row = seed_means(_per_seed(col, values)).iloc[0]
    assert row[f"{col}_lo"] == 0.0                # bounded by the metric's range: a mean count is >= 0
    assert row[f"{col}_hi"] == pytest.approx(plain.hi)   # the upper end is the t-interval's
    assert row[col] == pytest.approx(sum(values) / len(values))


def test_a_metric_with_negative_values_keeps_its_plain_interval():
    values = [-3.0, 1.0, 2.0]
    row = seed_means(_per_seed("some_signed_metric", values)).iloc[0]
    iv = t_interval(values)
    assert row["some_signed_metric_lo"] == pytest.approx(iv.lo) and iv.lo < -3


def test_interval_above_zero_is_unchanged():
    values = [10.0, 11.0, 12.0]
    row = seed_means(_per_seed("num_requests_issued", values)).iloc[0]
    iv = t_interval(values)
    assert (row["num_requests_issued_lo"], row["num_requests_issued_hi"]) == pytest.approx((iv.lo, iv.hi))
    assert not math.isnan(row["num_requests_issued_lo"])
