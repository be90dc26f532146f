"""Algorithm 1 (confidence), its global-search variants, and confidence-async, against brute force."""
from __future__ import annotations

import itertools

import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from dsparksim.policies import global_search_current, make_policy
from dsparksim.policies._common import lengths_from_ranked, rank_candidates
from dsparksim.policies.base import StepContext
from dsparksim.policies.confidence_global import global_budget

REL = 1e-12  # float tolerance for comparing ratios computed along different summation orders


def ctx_of(conf, base, step_time, max_tokens):
    conf = np.asarray(conf, dtype=float)
    return StepContext(conf=conf, survival=np.cumprod(conf, axis=1), request_ids=np.arange(conf.shape[0]),
                       base_tokens=base, step_time=step_time, max_tokens=max_tokens)


def E_of(s, L):
    return s.shape[0] + sum(s[i, :l].sum() for i, l in enumerate(L))


def prefix_vectors(n, K):
    return [np.array(v) for v in itertools.product(range(K + 1), repeat=n)]


def reference_algorithm1(s, base, T, max_tokens):
    """The paper's loop, literally: one candidate at a time, stop at the first ratio that does not rise."""
    n, K = s.shape
    cands = sorted(((s[i, k], k, i) for i in range(n) for k in range(K)), key=lambda c: (-c[0], c[1], c[2]))
    L = np.zeros(n, dtype=np.int64)
    M, E = base, float(n)
    ratio = E / T(np.array([M]))[0]
    for v, k, i in cands:
        if M + 1 > max_tokens:
            break
        new = (E + v) / T(np.array([M + 1]))[0]
        if not new > ratio:
            break
        assert L[i] == k  # admitted set is a per-request prefix
        L[i], M, E, ratio = k + 1, M + 1, E + v, new
    return L


conf_value = st.one_of(st.sampled_from([0.0, 0.25, 0.5, 0.8, 1.0]), st.floats(0, 1))


@st.composite
def small_case(draw, cost="any"):
    n = draw(st.integers(1, 3))
    K = draw(st.integers(1, 3))
    conf = np.array(draw(st.lists(conf_value, min_size=n * K, max_size=n * K))).reshape(n, K)
    base = n + draw(st.integers(0, 3))
    max_tokens = base + draw(st.integers(0, n * K + 1))
    top = max_tokens + 1
    kind = draw(st.sampled_from(["affine", "concave", "table", "staircase"]) if cost == "any" else st.just(cost))
    a = draw(st.floats(0.01, 5))
    c = draw(st.floats(0, 2))
    if kind == "affine":
        T = lambda M: a + c * np.asarray(M, dtype=float)  # noqa: E731
    elif kind == "concave":
        g = draw(st.sampled_from([np.sqrt, np.log1p]))
        T = lambda M: a + c * g(np.asarray(M, dtype=float))  # noqa: E731
    elif kind == "table":  # arbitrary positive cost per M (non-monotone included)
        tab = np.array(draw(st.lists(st.floats(0.01, 5), min_size=top, max_size=top)))
        T = lambda M: tab[np.asarray(M)]  # noqa: E731
    else:  # staircase: floor lookup over random breakpoints, levels arbitrary (flat stairs -> exact ties)
        bps = np.array(sorted(set(draw(st.lists(st.integers(1, top), min_size=1, max_size=4))) | {0}))
        lev = np.array(draw(st.lists(st.sampled_from([0.5, 1.0, 1.5, 2.0, 3.0]), min_size=len(bps),
                                     max_size=len(bps))))
        T = lambda M: lev[np.searchsorted(bps, np.asarray(M), side="right") - 1]  # noqa: E731
    return conf, base, T, max_tokens, kind


def check_invariants(L, ctx):
    assert L.dtype == np.int64 and L.shape == (ctx.n,)
    assert (L >= 0).all() and (L <= ctx.K).all()
    assert ctx.base_tokens + L.sum() <= ctx.max_tokens


def best_ratio_brute(s, base, T, max_tokens):
    n, K = s.shape
    return max(E_of(s, L) / T(np.array([base + L.sum()]))[0]
               for L in prefix_vectors(n, K) if base + L.sum() <= max_tokens)


def ratio_of(s, L, base, T):
    return E_of(s, L) / T(np.array([base + L.sum()]))[0]


# (a) ------------------------------------------------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(small_case())
def test_greedy_top_b_maximises_expected_tokens_for_every_b(case):
    conf, *_ = case
    s = np.cumprod(conf, axis=1)
    n, K = s.shape
    order, values = rank_candidates(s)
    assert (np.diff(values) <= 0).all()
    vecs = prefix_vectors(n, K)
    for b in range(n * K + 1):
        L = lengths_from_ranked(order, b, n)
        assert L.sum() == b
        admitted = {(int(f % n), int(f // n)) for f in order[:b]}
        assert admitted == {(i, k) for i in range(n) for k in range(L[i])}  # a per-request prefix
        best = max(E_of(s, v) for v in vecs if v.sum() == b)
        assert E_of(s, L) >= best - REL * best


# (b) ------------------------------------------------------------------------------------------------------
def greedy_ratios(s, base, T, max_tokens):
    order, values = rank_candidates(s)
    bmax = min(max_tokens - base, values.size)
    E = s.shape[0] + np.concatenate([[0.0], np.cumsum(values[:bmax])])
    return E / T(base + np.arange(bmax + 1))


def is_unimodal(r):
    d = np.diff(r)
    rising = np.argmax(d <= 0) if (d <= 0).any() else len(d)
    return bool((d[rising:] <= 0).all())


@settings(max_examples=200, deadline=None)
@given(small_case(cost="affine"))
def test_early_stop_is_globally_optimal_on_affine_cost(case):
    # Concave E over increasing affine T is quasi-concave: the first local max is global (no filter needed).
    conf, base, T, max_tokens, _ = case
    ctx = ctx_of(conf, base, T, max_tokens)
    L = make_policy("confidence").choose(ctx)
    check_invariants(L, ctx)
    best = best_ratio_brute(ctx.survival, base, T, max_tokens)
    assert ratio_of(ctx.survival, L, base, T) >= best * (1 - REL)


@settings(max_examples=150, deadline=None)
@given(small_case(cost="concave"))
def test_early_stop_is_globally_optimal_when_ratio_is_unimodal(case):
    conf, base, T, max_tokens, _ = case
    ctx = ctx_of(conf, base, T, max_tokens)
    assume(is_unimodal(greedy_ratios(ctx.survival, base, T, max_tokens)))
    L = make_policy("confidence").choose(ctx)
    check_invariants(L, ctx)
    assert ratio_of(ctx.survival, L, base, T) >= best_ratio_brute(ctx.survival, base, T, max_tokens) * (1 - REL)


# (c) ------------------------------------------------------------------------------------------------------
@settings(max_examples=300, deadline=None)
@given(small_case())
def test_vectorised_algorithm1_equals_the_literal_loop(case):
    conf, base, T, max_tokens, _ = case
    ctx = ctx_of(conf, base, T, max_tokens)
    L = make_policy("confidence").choose(ctx)
    check_invariants(L, ctx)
    np.testing.assert_array_equal(L, reference_algorithm1(ctx.survival, base, T, max_tokens))


@settings(max_examples=200, deadline=None)
@given(small_case())
def test_global_search_current_is_the_brute_force_optimum(case):
    conf, base, T, max_tokens, _ = case
    ctx = ctx_of(conf, base, T, max_tokens)
    L = global_search_current(ctx)
    check_invariants(L, ctx)
    best = best_ratio_brute(ctx.survival, base, T, max_tokens)
    assert abs(ratio_of(ctx.survival, L, base, T) - best) <= REL * best
    # ... and it is never worse than the early stop (which it beats on jagged curves, at the price of bias)
    assert ratio_of(ctx.survival, L, base, T) >= ratio_of(ctx.survival, make_policy("confidence").choose(ctx),
                                                          base, T) * (1 - REL)


# Appendix A -----------------------------------------------------------------------------------------------
# One request, K = 2, c1 = 0.8, SPS(1) = 1.0, SPS(2) = 0.5, SPS(3) = 0.45 -> T(M) = 1 / SPS(M), M = 1 + L.
# Ratios E/T:  L=0: 1/1 = 1.0   L=1: 1.8/2 = 0.9   L=2: (1.8 + 0.8*c2) * 0.45 = 0.81 + 0.36*c2.
# L=2 beats L=0 iff c2 > 0.19/0.36 = 0.528.   c2 = 0.3 -> 0.918 (global picks L=0);  c2 = 0.9 -> 1.134 (L=2).
# Global search therefore verifies token 1 only when c2 (computed after token 1 was sampled) is high: biased.
# Algorithm 1 stops at the first candidate (0.9 < 1.0) whatever c2 is: L = 0 for both.
SPS = {1: 1.0, 2: 0.5, 3: 0.45}
T_APPX = lambda M: 1.0 / np.array([SPS[int(m)] for m in np.atleast_1d(M)])  # noqa: E731
LOW, HIGH = 0.3, 0.9


def appx_ctx(c2):
    return ctx_of([[0.8, c2]], base=1, step_time=T_APPX, max_tokens=3)


def test_appendix_a_global_search_depends_on_c2_early_stop_does_not():
    assert global_search_current(appx_ctx(LOW)).tolist() == [0]
    assert global_search_current(appx_ctx(HIGH)).tolist() == [2]
    assert make_policy("confidence-global").choose(appx_ctx(HIGH)).tolist() == [2]
    for c2 in (LOW, HIGH, 0.0, 1.0):
        assert make_policy("confidence").choose(appx_ctx(c2)).tolist() == [0]


def test_appendix_a_async_budget_is_set_before_c2_is_seen():
    rng = np.random.default_rng(0)
    for current in (LOW, HIGH):
        p = make_policy("confidence-async:2")
        p.reset(2, rng)
        # steps 0 and 1: no stale budget yet -> Algorithm 1 on current info -> L = 0 whatever c2 is
        assert p.choose(appx_ctx(HIGH)).tolist() == [0]  # queues b0 = 2 (global on step 0's info)
        assert p.choose(appx_ctx(LOW)).tolist() == [0]   # queues b1 = 0
        # step 2 uses b0 = 2: both tokens verified regardless of the current c2
        assert p.choose(appx_ctx(current)).tolist() == [2]
        # step 3 uses b1 = 0
        assert p.choose(appx_ctx(current)).tolist() == [0]
        p.reset(2, rng)  # history cleared -> back to the Algorithm 1 fallback
        assert p.choose(appx_ctx(HIGH)).tolist() == [0]


# confidence-async general behaviour ---------------------------------------------------------------------------
@settings(max_examples=100, deadline=None)
@given(st.lists(small_case(), min_size=2, max_size=5), st.integers(1, 3))
def test_async_uses_the_budget_from_lag_steps_earlier(cases, lag):
    p = make_policy(f"confidence-async:{lag}")
    p.reset(3, np.random.default_rng(0))
    ctxs = [ctx_of(c, b, T, m) for c, b, T, m, _ in cases]
    for t, ctx in enumerate(ctxs):
        L = p.choose(ctx)
        check_invariants(L, ctx)
        order, values = rank_candidates(ctx.survival)
        if t < lag:
            np.testing.assert_array_equal(L, make_policy("confidence").choose(ctx))
        else:
            old = ctxs[t - lag]
            want = min(global_budget(old, rank_candidates(old.survival)[1]), ctx.max_tokens - ctx.base_tokens,
                       ctx.n * ctx.K)
            np.testing.assert_array_equal(L, lengths_from_ranked(order, want, ctx.n))


def test_confidence_on_a_staircase_stops_at_the_first_riser():
    # 2 requests, K = 3, base 2. Survivals: r0 .9 .81 .729, r1 .5 .25 .125. T = 1 up to M = 4, then 1.2.
    ctx = ctx_of([[0.9, 0.9, 0.9], [0.5, 0.5, 0.5]], base=2,
                 step_time=lambda M: np.where(np.asarray(M) <= 4, 1.0, 1.2), max_tokens=8)
    # ranked .9 .81 .729 .5 .25 .125: E/T = 2, 2.9, 3.71, then 4.439/1.2 = 3.699 < 3.71 -> stop, L = [2, 0].
    assert make_policy("confidence").choose(ctx).tolist() == [2, 0]
    # global: b = 4, 5, 6 give 4.116, 4.324, 5.314/1.2 = 4.428 -> global verifies everything
    assert global_search_current(ctx).tolist() == [3, 3]


def test_global_search_breaks_ties_towards_fewer_tokens():
    # zero survivals on a flat cost: every b has the same ratio -> the smallest b (verify nothing)
    ctx = ctx_of(np.zeros((2, 3)), base=2, step_time=lambda M: np.ones(len(M)), max_tokens=8)
    assert global_search_current(ctx).tolist() == [0, 0]
    assert make_policy("confidence").choose(ctx).tolist() == [0, 0]
