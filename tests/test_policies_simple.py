"""mtp1, fixed, threshold, goodput and oracle: exact outputs on hand cases; oracle dominates on random cases."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsparksim.errors import InputError
from dsparksim.policies import REGISTRY, make_policy
from dsparksim.policies.base import StepContext


def ctx_of(conf, base=None, step_time=None, max_tokens=10_000, A=None):
    conf = np.asarray(conf, dtype=float)
    n = conf.shape[0]
    return StepContext(conf=conf, survival=np.cumprod(conf, axis=1), request_ids=np.arange(n),
                       base_tokens=n if base is None else base,
                       step_time=step_time or (lambda M: 1.0 + 0.01 * np.asarray(M, dtype=float)),
                       max_tokens=max_tokens, true_accepted=None if A is None else np.asarray(A))


def choose(spec, ctx, K=None):
    p = make_policy(spec)
    p.reset(K or ctx.K, np.random.default_rng(0))
    L = p.choose(ctx)
    assert L.dtype == np.int64 and L.shape == (ctx.n,)
    return L


CONF = [[0.9, 0.8, 0.5, 0.9], [0.6, 0.9, 0.9, 0.9], [0.2, 1.0, 1.0, 1.0]]
# survivals: r0 .9 .72 .36 .324 | r1 .6 .54 .486 .4374 | r2 .2 .2 .2 .2


def test_fixed_and_mtp1_exact():
    assert choose("fixed:2", ctx_of(CONF)).tolist() == [2, 2, 2]
    assert choose("fixed:9", ctx_of(CONF)).tolist() == [4, 4, 4]  # min(k, K)
    assert choose("mtp1", ctx_of(np.array(CONF)[:, :1])).tolist() == [1, 1, 1]
    # budget binds: base 3 + 5 slots -> lowest index first (documented; the engine should not let it happen)
    assert choose("fixed:2", ctx_of(CONF, max_tokens=8)).tolist() == [2, 2, 1]
    assert choose("fixed:4", ctx_of(CONF, max_tokens=8)).tolist() == [4, 1, 0]
    assert choose("mtp1", ctx_of(np.array(CONF)[:, :1], base=5, max_tokens=6)).tolist() == [1, 0, 0]


def test_threshold_exact():
    assert choose("threshold:0.5", ctx_of(CONF)).tolist() == [2, 2, 0]
    assert choose("threshold:0.324", ctx_of(CONF)).tolist() == [4, 4, 0]  # >= is inclusive
    assert choose("threshold:0.2", ctx_of(CONF)).tolist() == [4, 4, 4]
    assert choose("threshold:0.95", ctx_of(CONF)).tolist() == [0, 0, 0]
    assert choose("threshold:0", ctx_of(CONF)).tolist() == [4, 4, 4]
    assert choose("threshold:0.2", ctx_of(CONF, max_tokens=3 + 9)).tolist() == [4, 4, 1]


def test_anchors_overflowing_budget_is_an_error():
    with pytest.raises(InputError, match="base_tokens"):
        choose("fixed:1", ctx_of(CONF, base=20, max_tokens=10))


# ------------------------------------------------------------------------------------------------- goodput
def test_goodput_learns_rates_and_picks_argmax():
    conf = np.full((2, 3), 0.99)  # goodput must ignore the confidence head
    # base 2, M = 2 + 2L; T(M) = 1 + 0.15 M -> T = 1.3, 1.6, 1.9, 2.2 for L = 0..3
    ctx = ctx_of(conf, step_time=lambda M: 1.0 + 0.15 * np.asarray(M, dtype=float))
    p = make_policy("goodput")
    p.reset(3, np.random.default_rng(0))
    np.testing.assert_allclose(p.rates, [0.5, 0.5, 0.5])  # Beta(1,1) prior
    # prior: tokens/request 1, 1.5, 1.75, 1.875 -> ratios .769 .9375 .921 .852 -> L = 1
    assert p.choose(ctx).tolist() == [1, 1]
    # request 0 verified 3, accepted 1 (reached pos 2, rejected); request 1 accepted all 3.
    p.observe(np.array([0, 1]), np.array([3, 3]), np.array([1, 3]))
    # tried = [2, 2, 1], succ = [2, 1, 1] -> alpha = [3/4, 2/4, 2/3]
    np.testing.assert_allclose(p.rates, [3 / 4, 2 / 4, 2 / 3])
    # tokens/request 1, 1.75, 2.125, 2.375 -> ratios .769 1.094 1.118 1.080 -> L = 2
    assert p.choose(ctx).tolist() == [2, 2]
    # a request that verified 1 and had it rejected is tried at position 1 only
    p.observe(np.array([0]), np.array([1]), np.array([0]))
    np.testing.assert_allclose(p.rates, [3 / 5, 2 / 4, 2 / 3])
    # flat step time favours the longest L, but one batch-wide L must fit: (max_tokens - base) // n = (5-2)//2 = 1
    assert p.choose(ctx_of(conf, step_time=lambda M: np.ones(len(M)), max_tokens=5)).tolist() == [1, 1]
    p.reset(3, np.random.default_rng(0))
    np.testing.assert_allclose(p.rates, [0.5, 0.5, 0.5])


def test_goodput_observe_rejects_inconsistent_feedback():
    p = make_policy("goodput")
    p.reset(3, np.random.default_rng(0))
    with pytest.raises(InputError, match="accepted"):
        p.observe(np.array([0]), np.array([1]), np.array([2]))


# -------------------------------------------------------------------------------------------------- oracle
def test_oracle_hand_case():
    # n=3, A = [3, 0, 2]; free tokens up to M = 6 then expensive: T = 1 for M <= 6, 10 beyond.
    ctx = ctx_of(np.full((3, 4), 0.5), A=[3, 0, 2], step_time=lambda M: np.where(np.asarray(M) <= 6, 1.0, 10.0))
    # b <= 3 (M = 3 + b <= 6): best b = 3; water-fill: slot 1 of req 0 and 2, then slot 2 of req 0.
    assert choose("oracle", ctx).tolist() == [2, 0, 1]
    with pytest.raises(InputError, match="true_accepted"):
        choose("oracle", ctx_of(np.full((3, 4), 0.5)))


@st.composite
def random_case(draw):
    n = draw(st.integers(1, 6))
    K = draw(st.integers(1, 5))
    conf = np.array(draw(st.lists(st.floats(0, 1), min_size=n * K, max_size=n * K))).reshape(n, K)
    A = np.array(draw(st.lists(st.integers(0, K), min_size=n, max_size=n)))
    base = n + draw(st.integers(0, 4))
    max_tokens = base + draw(st.integers(0, n * K + 2))
    # non-decreasing staircase plus slope: the oracle bound holds for non-decreasing step time
    steps = np.cumsum(draw(st.lists(st.floats(0, 1), min_size=max_tokens + 1, max_size=max_tokens + 1)))
    floor_s = draw(st.floats(0.05, 2))
    return n, K, conf, A, base, max_tokens, (lambda M: floor_s + steps[np.asarray(M)])


@settings(max_examples=150, deadline=None)
@given(random_case())
def test_oracle_dominates_every_policy_on_the_same_outcomes(case):
    n, K, conf, A, base, max_tokens, T = case
    ctx = ctx_of(conf, base=base, step_time=T, max_tokens=max_tokens, A=A)
    Lo = choose("oracle", ctx)
    assert (Lo <= A).all() and (Lo >= 0).all() and base + Lo.sum() <= max_tokens
    best = (n + Lo.sum()) / T(np.array([base + Lo.sum()]))[0]
    for spec in ["fixed:1", f"fixed:{K}", "threshold:0.5", "goodput", "confidence", "confidence-async",
                 "confidence-global"] + (["mtp1"] if K == 1 else []):
        L = choose(spec, ctx)
        assert (L >= 0).all() and (L <= K).all() and base + L.sum() <= max_tokens, spec
        realised = (n + np.minimum(L, A).sum()) / T(np.array([base + L.sum()]))[0]
        assert best >= realised * (1 - 1e-12), spec


def test_every_registered_policy_returns_empty_for_empty_batch():
    for name, cls in REGISTRY.items():
        spec = {"fixed": "fixed:2", "threshold": "threshold:0.5"}.get(name, name)
        ctx = ctx_of(np.zeros((0, 3)), A=np.zeros(0, dtype=np.int64))
        assert choose(spec, ctx).shape == (0,)


@st.composite
def jagged_case(draw):
    """Any positive step-time table, non-monotone allowed (measured staircases have T(1) > T(8))."""
    n = draw(st.integers(1, 3))
    K = draw(st.integers(1, 3))
    A = np.array(draw(st.lists(st.integers(0, K), min_size=n, max_size=n)))
    base = n + draw(st.integers(0, 2))
    max_tokens = base + draw(st.integers(0, n * K + 1))
    table = np.array(draw(st.lists(st.floats(0.05, 3), min_size=max_tokens + 1, max_size=max_tokens + 1)))
    return n, K, A, base, max_tokens, (lambda M: table[np.asarray(M)])


@settings(max_examples=300, deadline=None)
@given(jagged_case())
def test_oracle_is_a_per_step_bound_on_any_staircase(case):
    # brute force over every verify-length vector: none realises more tokens per second on the same A
    import itertools
    n, K, A, base, max_tokens, T = case
    ctx = ctx_of(np.full((n, K), 0.5), base=base, step_time=T, max_tokens=max_tokens, A=A)
    Lo = choose("oracle", ctx)
    assert (Lo >= 0).all() and (Lo <= K).all() and base + Lo.sum() <= max_tokens
    best = (n + np.minimum(Lo, A).sum()) / T(np.array([base + Lo.sum()]))[0]
    for L in itertools.product(range(K + 1), repeat=n):
        L = np.array(L)
        if base + L.sum() <= max_tokens:
            assert best >= (n + np.minimum(L, A).sum()) / T(np.array([base + L.sum()]))[0] * (1 - 1e-12), L


def test_oracle_pads_with_rejected_slots_only_where_the_staircase_is_cheaper():
    # A = [1, 0]; T(M) = 2 for M <= 3, 1 at M = 4..5 (a riser that falls back), 9 beyond
    T = lambda M: np.select([np.asarray(M) <= 3, np.asarray(M) <= 5], [2.0, 1.0], 9.0)  # noqa: E731
    ctx = ctx_of(np.full((2, 3), 0.5), base=2, step_time=T, max_tokens=8, A=[1, 0])
    L = choose("oracle", ctx)
    assert L.sum() == 2 and L[0] >= 1            # M = 4: the accepted slot plus one padded rejected slot
    mono = ctx_of(np.full((2, 3), 0.5), base=2, step_time=lambda M: 1.0 + 0.1 * np.asarray(M), max_tokens=8,
                  A=[1, 0])
    assert choose("oracle", mono).tolist() == [1, 0]   # non-decreasing cost: never verify a rejected slot


def test_oracle_long_run_dinkelbach_on_a_closed_form_case():
    # One request, K = 2, alternating steps: "good" (A = 2) and "bad" (A = 0). T(M) = 1.0 for M <= 2, 1.6 at M = 3.
    # Good step: c = 1 gives 2 tokens / 1.0 s (ratio 2.0), c = 2 gives 3 / 1.6 (1.875): the myopic per-step choice
    # is c = 1 and the long run is (2 + 1) / (1 + 1) = 1.5 tok/s. The second slot's marginal rate 1 / 0.6 = 1.67 beats
    # that average, so the ratio of sums is larger with c = 2: (3 + 1) / (1.6 + 1) = 1.538 -- Dinkelbach's optimum
    # (at lambda* = 1.538 < 1.67, c = 2 maximises tokens - lambda* time).
    table = np.array([np.nan, 1.0, 1.0, 1.6])
    p = make_policy("oracle")
    p.reset(2, np.random.default_rng(0))
    tok = tim = 0.0
    chosen = []
    for j in range(400):
        A = [2] if j % 2 == 0 else [0]
        L = p.choose(ctx_of(np.full((1, 2), 0.5), base=1, step_time=lambda M: table[np.asarray(M)],
                            max_tokens=3, A=A))
        chosen.append(int(L[0]))
        tok += 1 + min(int(L[0]), A[0])
        tim += table[1 + int(L[0])]
    assert chosen[0] == 1                       # no history: the per-step bound (lambda = this step's best ratio)
    assert chosen[2::2] == [2] * 199 and set(chosen[1::2]) == {0}
    assert tok / tim == pytest.approx((3 * 199 + 2 + 200) / (1.6 * 199 + 1.0 + 200), rel=1e-12)
    assert tok / tim > 1.53 > 1.5
