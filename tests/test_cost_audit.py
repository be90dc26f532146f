"""Audit: the step cost (DESIGN.md section 3) on hand-computed shapes, and the StepContext the engine hands a policy.

step_time = draft_time(n_req, K, drafter) + verify_time(M) + fixed_overhead (+ the per-batch-size floor), verify
looked up by floor over measured breakpoints (never smoothed across a riser; jagged staircases kept), a query past
the largest breakpoint an error unless extrapolation is on (then counted). The policy must see the whole price as a
function of M -- the non-trimmable floor included ("a planner that maximises tokens/time with the floor left out
over-trims") -- with base_tokens = the step's anchors + prefill tokens and max_tokens = the engine's token budget.
"""
from __future__ import annotations

from typing import ClassVar

import numpy as np
import pytest

from dsparksim.cost.price import StepShape
from dsparksim.cost.profile import ProfileRangeError, profile_from_dict
from dsparksim.policies.base import Policy
from sim_kit import FlatAcceptance, chat_workload, make_sim  # noqa: E402

# a jagged staircase (T(16) < T(8): a cheaper point further up), a parallel, an autoregressive and an MTP drafter
VERIFY = {1: 0.010, 4: 0.012, 8: 0.020, 16: 0.018, 64: 0.030}
FIXED = 0.001
BATCH = {1: 1e-4, 4: 3e-4, 64: 5e-4}
PAR = {1: 0.002, 16: 0.003, 512: 0.005}     # dspark, markov_overhead_frac 0.01, priced at n*K tokens
AR = {1: 0.0005, 8: 0.0007, 64: 0.001}     # eagle3, K forwards at n tokens
MTP = {1: 0.0004, 8: 0.0006, 64: 0.001}    # mtp1, one forward at n tokens


def profile(extrapolate=False):
    def tab(d):
        return {"tokens": list(d), "time_s": list(d.values())}
    return profile_from_dict({
        "format": "dsparksim-profile/1", "name": "audit",
        "metadata": {"device": "test", "model": "test", "source": "test", "method": "hand-written"},
        "verify": {"M": list(VERIFY), "time_s": list(VERIFY.values())}, "fixed_overhead_s": FIXED,
        "batch_overhead": {"n_req": list(BATCH), "time_s": list(BATCH.values())},
        "drafters": {"dspark": {"kind": "parallel", **tab(PAR), "markov_overhead_frac": 0.01},
                     "eagle3": {"kind": "autoregressive", **tab(AR)}, "mtp1": {"kind": "mtp", **tab(MTP)}}},
        "audit.json", extrapolate=extrapolate)


def floor(table, x):
    """The value of the largest breakpoint <= x (written out, not numpy's searchsorted)."""
    best = None
    for bp in sorted(table):
        if bp <= x:
            best = table[bp]
    assert best is not None
    return best


@pytest.mark.parametrize("drafter,n,K,M,want", [
    # M=5 floors to 4; dspark drafts n*K = 6 tokens -> floor 1: 0.002 * 1.01; batch floor(3) = 1
    ("dspark", 3, 2, 5, 0.012 + 0.002 * 1.01 + FIXED + 1e-4),
    # M=16 is the cheaper point above M=8..15 (kept, not smoothed); 4*7 = 28 draft tokens -> floor 16
    ("dspark", 4, 7, 16, 0.018 + 0.003 * 1.01 + FIXED + 3e-4),
    ("dspark", 4, 7, 15, 0.020 + 0.003 * 1.01 + FIXED + 3e-4),
    # autoregressive: K forwards of n tokens
    ("eagle3", 8, 3, 20, 0.018 + 3 * 0.0007 + FIXED + 3e-4),
    ("eagle3", 2, 5, 12, 0.020 + 5 * 0.0005 + FIXED + 1e-4),
    # mtp: one forward of n tokens (K = 1), M = 2n
    ("mtp1", 5, 1, 10, 0.020 + 0.0004 + FIXED + 3e-4),
    # no drafter: plain decoding pays verify + floor only
    (None, 6, 1, 6, 0.012 + FIXED + 3e-4),
])
def test_step_price_is_the_sum_of_section_3_terms(drafter, n, K, M, want):
    prof = profile()
    shape = StepShape(M=M, n_decode=n, drafter=drafter, K=K)
    assert prof.pricer().seconds(shape) == pytest.approx(want, rel=1e-12)
    parts = prof.price(shape)
    assert parts.verify == floor(VERIFY, M)
    assert parts.overhead == pytest.approx(FIXED + floor(BATCH, n), rel=1e-12)
    assert parts.seconds == pytest.approx(want, rel=1e-12)
    # the draft term does not depend on M: trimming verification never recovers drafting cost
    assert prof.price(shape._replace(M=n)).drafter == parts.drafter


def test_beyond_the_largest_breakpoint_is_an_error_or_a_counted_extrapolation():
    with pytest.raises(ProfileRangeError, match="verify.M"):
        profile().verify_time(np.array([65]))
    ex = profile(extrapolate=True)
    # secant over the last octave of breakpoints (largest <= 64/2 = 32 is 16): (0.030 - 0.018) / 48 per token
    assert float(ex.verify_time(np.array([70]))[0]) == pytest.approx(0.030 + 6 * 0.012 / 48, rel=1e-12)
    rep = ex.extrapolation_report()
    assert rep["extrapolated"] and rep["axes"]["verify.M"]["count"] >= 1


class Recorder(Policy):
    """fixed:K that records what the engine shows it: (n, base_tokens, max_tokens, step_time over 1..max_tokens)."""

    name: ClassVar[str] = "audit-recorder"
    usage: ClassVar[str] = "audit-recorder"

    def __init__(self):
        super().__init__()
        self.seen = []

    def choose(self, ctx):
        M = np.arange(ctx.base_tokens, ctx.max_tokens + 1, dtype=np.int64)
        self.seen.append((ctx.n, ctx.base_tokens, ctx.max_tokens, M, np.asarray(ctx.step_time(M), float)))
        return np.full(ctx.n, ctx.K, dtype=np.int64)


def test_the_policy_sees_the_whole_step_price_including_the_floor():
    K, budget = 3, 64
    pol = Recorder()
    res = make_sim(profile=profile(), acceptance=FlatAcceptance(K, 0.6), policy=pol,
                   workload=chat_workload(12, 4, prompt=10, out=12), block_size=K, drafter="dspark",
                   kv_capacity_tokens=10**6, max_num_seqs=8, max_batched_tokens=budget, prefill_chunk_tokens=16,
                   rng=np.random.default_rng(0), num_requests=12).run()
    steps = res.steps
    assert len(pol.seen) > 20
    with_prefill = 0
    for n, base, max_tokens, M, T in pol.seen:
        assert max_tokens == budget
        draft = floor(PAR, n * K) * 1.01
        want = np.array([floor(VERIFY, m) for m in M]) + draft + FIXED + floor(BATCH, n)
        np.testing.assert_allclose(T, want, rtol=1e-12)
        with_prefill += base > n
    assert with_prefill > 0       # base_tokens counted prefill tokens on some steps (anchors + chunk tokens)
    # the engine charged each decoding step the price the policy saw at the step's M (fixed:K, nothing padded)
    dec = np.asarray(steps["n_decode"]) > 0
    charged = np.asarray(steps["dt"], float)[dec]
    for (n, base, _, M, T), Mi, dt in zip(pol.seen, np.asarray(steps["M"])[dec], charged):
        assert Mi == base + n * K
        assert dt == pytest.approx(T[Mi - base], rel=1e-12)
