"""The oracle bounds the throughput of every realisable policy of its drafter and K, across seeds, at any load.

Paired request streams (keyed draws): every policy of one seed serves the same requests with the same acceptance
draws. Per seed s the paired difference d_s = oracle - policy (output tok/s); the bound fails if the policy's mean
exceeds the oracle's beyond the 95% interval of the mean difference: mean(d) < -t_{0.975, n-1} * se(d).
Measured margins (7B H100 profile, dspark, K=7, paged KV, 3 seeds x 20 s): 1 user +0.3% over fixed:7 and goodput
(every seed above), 8 users +1.9% (goodput) to +24% (threshold:0.5), 64 users +5.9% (confidence-async:2) to +60%
(confidence). Per-user speed is NOT bounded: at 1 user confidence-async:2's median tok/s per user was above the
oracle's in some seeds (mean -0.3 tok/s, worst seed -4.7), so only throughput is asserted.
"""
from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from dsparksim.config import RunConfig
from dsparksim.sim.simulate import simulate
from dsparksim.traffic import TrafficConfig

SEEDS = (0, 1, 2)
REALISABLE = ("fixed:7", "goodput", "confidence", "confidence-async:2", "threshold:0.5")


def _thr(policy: str, users: int, seed: int) -> float:
    cfg = RunConfig(policy=policy, seed=seed, traffic=TrafficConfig(mode="closed", concurrency=users, duration_s=8.0))
    return simulate(cfg).summary["output_throughput_tok_s"]


@pytest.mark.parametrize("users", [1, 8, 64])
def test_no_realisable_policy_beats_the_oracle_beyond_its_interval(users):
    oracle = np.array([_thr("oracle", users, s) for s in SEEDS])
    t = stats.t.ppf(0.975, len(SEEDS) - 1)
    for pol in REALISABLE:
        d = oracle - np.array([_thr(pol, users, s) for s in SEEDS])
        se = d.std(ddof=1) / np.sqrt(len(d))
        assert d.mean() >= -t * se, (users, pol, d)
        # ... and in fact it is above in every paired seed (the interval is not what saves it)
        assert (d >= 0).all(), (users, pol, d)
