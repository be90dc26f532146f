"""Audit: every registered verification policy against a brute-force reading of DESIGN.md section 5.

Each ``ref_*`` below is written from the text (DESIGN.md section 5, and the policy's own documented rule where
DESIGN.md is silent: budget caps, the goodput estimator, the oracle's running lambda, the 2-D pricing), with plain
Python loops over candidates -- no shared helper from ``dsparksim.policies``. Random StepContexts (hypothesis,
derandomized, bounded sizes) cover ties, all-zero confidences, confidences of exactly 1, a binding token budget,
base_tokens at the budget, K = 1, one request, and step-time curves that are affine, arbitrary tables (non-monotone),
staircases with flat stairs, and the engine's own dense price table (``DenseStepTime``, whose ``checked`` flag
switches Algorithm 1 to its unchecked prefix path). The lazy ranking (partial sorts, retries past the first 64
candidates) is driven by a separate family of larger contexts. Every comparison is exact: the references add
and divide in the same order as the Algorithm's running sums, so equal ratios (ties) must resolve identically.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsparksim.cost.price import DenseStepTime
from dsparksim.policies import REGISTRY, make_policy
from dsparksim.policies.base import StepContext
from dsparksim.policies.oracle import Oracle

AUDIT = settings(max_examples=120, deadline=None, derandomize=True, database=None)
SEQ = settings(max_examples=40, deadline=None, derandomize=True, database=None)


# ------------------------------------------------------------------------------------------- step-time curves
def affine(a, c):
    return lambda M: a + c * np.asarray(M, dtype=np.float64)


def table_time(tab):
    tab = np.asarray(tab, dtype=np.float64)
    return lambda M: tab[np.asarray(M)]


def staircase(bps, levels):
    bps, levels = np.asarray(bps), np.asarray(levels, dtype=np.float64)
    return lambda M: levels[np.searchsorted(bps, np.asarray(M), side="right") - 1]


def dense_time(tab, extra):
    """The engine's dense price table object (cost/price.py) over ``tab`` (index 0 unused, as the engine's)."""
    d = np.asarray(tab, dtype=np.float64).copy()
    d[0] = np.nan
    body = d[1:]
    return DenseStepTime(d, float(extra), float(body.min()), float(body.max()))


def T_at(T, M: int) -> float:
    return float(np.asarray(T(np.array([M], dtype=np.int64)), dtype=np.float64)[0])


CONF = st.one_of(st.sampled_from([0.0, 0.25, 0.5, 0.8, 1.0]), st.floats(0, 1))


@st.composite
def step_time_for(draw, top: int):
    """A positive step-time curve valid for M = 1..top."""
    kind = draw(st.sampled_from(["affine", "table", "staircase", "dense"]))
    if kind == "affine":
        return affine(draw(st.floats(0.01, 5)), draw(st.floats(0, 2)))
    if kind == "table":      # arbitrary positive, non-monotone included
        return table_time(draw(st.lists(st.floats(0.01, 5), min_size=top + 1, max_size=top + 1)))
    levels = [0.5, 1.0, 1.5, 2.0, 3.0]
    if kind == "staircase":  # flat stairs: exact ratio ties between neighbouring M
        bps = sorted(set(draw(st.lists(st.integers(1, top), min_size=1, max_size=4))) | {0})
        return staircase(bps, draw(st.lists(st.sampled_from(levels), min_size=len(bps), max_size=len(bps))))
    tab = draw(st.lists(st.sampled_from(levels + [0.75, 1.25]), min_size=top + 1, max_size=top + 1))
    return dense_time(tab, draw(st.sampled_from([0.0, 0.25, 1.0])))


@st.composite
def step_ctx(draw, max_n=5, max_K=5, oracle=False, exit=False):
    n = draw(st.integers(1, max_n))
    K = draw(st.integers(1, max_K))
    conf = np.array(draw(st.lists(CONF, min_size=n * K, max_size=n * K)), dtype=np.float64).reshape(n, K)
    base = n + draw(st.integers(0, 3))
    max_tokens = base + draw(st.integers(0, n * K + 2))       # 0: base_tokens at the budget; < n*K: it binds
    T = draw(step_time_for(max_tokens))
    A = np.array(draw(st.lists(st.integers(0, K), min_size=n, max_size=n)), dtype=np.int64) if oracle else None
    D = None
    if exit or (oracle and draw(st.booleans())):   # early exit of drafting: positions past D[i] at confidence 0
        D = np.array(draw(st.lists(st.integers(1, K), min_size=n, max_size=n)), dtype=np.int64)
        conf = np.where(np.arange(K)[None, :] < D[:, None], conf, 0.0)
    return StepContext(conf=conf, survival=np.cumprod(conf, axis=1), request_ids=np.arange(n), base_tokens=base,
                       step_time=T, max_tokens=max_tokens, true_accepted=A, drafted=D)


# ------------------------------------------------------------------------------------------- brute forces
def drafted(ctx) -> list[int]:
    """Positions each request drafted (early exit); all K without it. Only these positions exist."""
    return [ctx.K] * ctx.n if ctx.drafted is None else [int(x) for x in ctx.drafted]


def room(ctx) -> int:
    """Draft tokens the step may add: max_tokens - base_tokens, and never more than the n*K slots (with early exit,
    the positions drafted)."""
    return min(ctx.max_tokens - ctx.base_tokens, ctx.n * ctx.K, sum(drafted(ctx)))


def capped_in_index_order(want, budget):
    """The documented cap of the non-ranking policies: requests served lowest index first."""
    L = []
    for w in want:
        give = min(w, budget)
        L.append(give)
        budget -= give
    return np.array(L, dtype=np.int64)


def ref_fixed(ctx, k):
    """fixed:k -- verify min(k, K) for every request."""
    return capped_in_index_order([min(k, ctx.K, d) for d in drafted(ctx)], room(ctx))


def ref_threshold(ctx, t):
    """threshold:t -- per request, the largest L with s[i,L] >= t (L = 0 if none)."""
    want = []
    for i in range(ctx.n):
        best = 0
        for L in range(1, ctx.K + 1):
            if ctx.survival[i, L - 1] >= t:
                best = L
        want.append(min(best, drafted(ctx)[i]))
    return capped_in_index_order(want, room(ctx))


def ranked(ctx):
    """All candidates (s[i,k], k, i), best first: survival descending, ties lower k, then request. A candidate is a
    position that exists: with early exit, k < drafted[i] only."""
    D = drafted(ctx)
    c = [(float(ctx.survival[i, k]), k, i) for i in range(ctx.n) for k in range(D[i])]
    return sorted(c, key=lambda x: (-x[0], x[1], x[2]))


def lengths_of(cands, count, n):
    L = [0] * n
    for _, k, i in cands[:count]:
        assert L[i] == k, "the admitted set must be a per-request prefix"
        L[i] = k + 1
    return np.array(L, dtype=np.int64)


def ref_algorithm1_count(ctx) -> int:
    """Algorithm 1: M = base, E = n; admit candidates one by one while E / step_time(M) strictly rises."""
    cands = ranked(ctx)
    M, E = ctx.base_tokens, float(ctx.n)
    ratio = E / T_at(ctx.step_time, M)
    admitted = 0
    for v, _, _ in cands:
        if M + 1 > ctx.max_tokens:
            break
        new = (E + v) / T_at(ctx.step_time, M + 1)
        if not new > ratio:
            break
        M, E, ratio, admitted = M + 1, E + v, new, admitted + 1
    return admitted


def ref_global_count(ctx) -> int:
    """Global search: the b in 0..budget maximising (n + top-b survivals) / step_time(base + b); smallest b on ties."""
    cands = ranked(ctx)
    E = float(ctx.n)
    best_b, best = 0, E / T_at(ctx.step_time, ctx.base_tokens)
    for b in range(1, room(ctx) + 1):
        E += cands[b - 1][0]
        r = E / T_at(ctx.step_time, ctx.base_tokens + b)
        if r > best:
            best_b, best = b, r
    return best_b


def ref_confidence(ctx):
    return lengths_of(ranked(ctx), ref_algorithm1_count(ctx), ctx.n)


class RefAsync:
    """confidence-async:LAG -- the budget of step t is the global-search b of step t - LAG (on that step's own
    information), capped by this step's room; the first LAG steps use Algorithm 1. Steps without a decoding request
    carry no information and leave the queue alone."""

    def __init__(self, lag):
        self.lag, self.queue = lag, []

    def choose(self, ctx):
        if ctx.n == 0:
            return np.zeros(0, dtype=np.int64)
        if len(self.queue) >= self.lag:
            count = min(self.queue.pop(0), room(ctx))
        else:
            count = ref_algorithm1_count(ctx)
        self.queue.append(ref_global_count(ctx))
        return lengths_of(ranked(ctx), count, ctx.n)


def check_valid(L, ctx):
    assert L.dtype == np.int64 and L.shape == (ctx.n,)
    assert (L >= 0).all() and (L <= ctx.K).all()
    assert ctx.base_tokens + int(L.sum()) <= ctx.max_tokens


def choose(spec, ctx):
    p = make_policy(spec)
    p.reset(ctx.K, np.random.default_rng(0))
    L = p.choose(ctx)
    check_valid(L, ctx)
    return L


# ------------------------------------------------------------------------------------------- none, mtp1, fixed
@AUDIT
@given(step_ctx())
def test_none_verifies_nothing(ctx):
    assert choose("none", ctx).tolist() == [0] * ctx.n


@AUDIT
@given(step_ctx(max_K=1))
def test_mtp1_verifies_its_one_draft_in_index_order(ctx):
    np.testing.assert_array_equal(choose("mtp1", ctx), ref_fixed(ctx, 1))


@AUDIT
@given(step_ctx(), st.integers(1, 7))
def test_fixed_is_min_k_K_in_index_order(ctx, k):
    np.testing.assert_array_equal(choose(f"fixed:{k}", ctx), ref_fixed(ctx, k))


# ------------------------------------------------------------------------------------------------- threshold
@AUDIT
@given(step_ctx(), st.one_of(st.sampled_from([0.0, 0.25, 0.5, 0.8, 1.0]), st.floats(0, 1)))
def test_threshold_is_the_largest_L_with_survival_at_least_t(ctx, t):
    # a t that equals a survival exactly is admitted (>=); t = 0 admits everything, t = 1 only survival-1 prefixes
    np.testing.assert_array_equal(choose(f"threshold:{t!r}", ctx), ref_threshold(ctx, t))


# ------------------------------------------------------------------------------------------------ confidence
@AUDIT
@given(step_ctx())
def test_confidence_is_algorithm1_literally(ctx):
    np.testing.assert_array_equal(choose("confidence", ctx), ref_confidence(ctx))


@AUDIT
@given(step_ctx())
def test_confidence_global_is_the_exhaustive_search(ctx):
    want = lengths_of(ranked(ctx), ref_global_count(ctx), ctx.n)
    np.testing.assert_array_equal(choose("confidence-global", ctx), want)


@st.composite
def large_ctx(draw):
    """Contexts past the lazy ranking's first prefix (64 candidates): flat-ish costs make the scan run long, so the
    partial sort is retried and falls back to a full sort; quantised confidences tie across requests."""
    n = draw(st.integers(10, 100))   # n > 64: the partition over the first position's keys (Ranking.keys)
    K = draw(st.integers(2, 9))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    kind = draw(st.sampled_from(["quantised", "continuous", "rows", "ones"]))
    if kind == "quantised":
        conf = rng.choice([0.0, 0.5, 0.9, 1.0], size=(n, K))
    elif kind == "rows":
        conf = np.repeat(rng.uniform(0.3, 1.0, size=(1, K)), n, axis=0)
    elif kind == "ones":
        conf = np.ones((n, K))
    else:
        conf = rng.uniform(0, 1, size=(n, K))
    base = n + int(rng.integers(0, 20))
    max_tokens = base + int(rng.integers(0, n * K + 20))
    M = np.arange(max_tokens + 1)
    slope = draw(st.sampled_from([0.0, 1e-6, 1e-4, 1e-3]))
    tab = 0.01 + slope * M + (rng.uniform(0, 1e-4, M.size) if draw(st.booleans()) else 0.0)
    T = dense_time(tab, 0.002) if draw(st.booleans()) else table_time(tab + 0.002)
    return StepContext(conf=conf, survival=np.cumprod(conf, axis=1), request_ids=np.arange(n), base_tokens=base,
                       step_time=T, max_tokens=max_tokens)


@settings(max_examples=80, deadline=None, derandomize=True, database=None)
@given(large_ctx())
def test_lazy_ranking_and_dense_prices_never_change_algorithm1(ctx):
    np.testing.assert_array_equal(choose("confidence", ctx), ref_confidence(ctx))
    np.testing.assert_array_equal(choose("confidence-global", ctx),
                                  lengths_of(ranked(ctx), ref_global_count(ctx), ctx.n))


# ------------------------------------------------------------------------------------------ confidence-async
@SEQ
@given(st.lists(st.one_of(step_ctx(max_n=4, max_K=4), st.just(None)), min_size=1, max_size=8), st.integers(1, 3))
def test_confidence_async_uses_the_global_budget_of_lag_steps_earlier(steps, lag):
    p = make_policy(f"confidence-async:{lag}")
    p.reset(4, np.random.default_rng(0))
    ref = RefAsync(lag)
    for ctx in steps:
        if ctx is None:   # a step where nothing decodes
            ctx = StepContext(conf=np.zeros((0, 3)), survival=np.zeros((0, 3)), request_ids=np.zeros(0, np.int64),
                              base_tokens=2, step_time=affine(1.0, 0.1), max_tokens=8)
        np.testing.assert_array_equal(p.choose(ctx), ref.choose(ctx))


@SEQ
@given(st.lists(large_ctx(), min_size=1, max_size=4), st.integers(1, 2))
def test_confidence_async_on_large_steps(steps, lag):
    p, ref = make_policy(f"confidence-async:{lag}"), RefAsync(lag)
    p.reset(9, np.random.default_rng(0))
    for ctx in steps:
        np.testing.assert_array_equal(p.choose(ctx), ref.choose(ctx))


def test_every_registered_policy_is_audited():
    # a new policy must get a brute-force reference here (or in the files this one names)
    assert set(REGISTRY) == {"none", "mtp1", "fixed", "threshold", "goodput", "confidence", "confidence-async",
                             "confidence-async-2d", "confidence-global", "oracle"}


# --------------------------------------------------------------------------------------------------- goodput
class RefGoodput:
    """goodput -- one batch-wide L maximising n * (1 + sum_{k<=L} prod_{j<=k} alpha_j) / step_time(base + n L),
    alpha_j the Beta(1, 1) posterior mean of position j's conditional acceptance observed so far: position j was
    tried by a request that verified it and reached it (L >= j, a >= j - 1) and succeeded if a >= j. Ties: the
    shorter L; L <= K and L <= (max_tokens - base_tokens) // n."""

    def __init__(self):
        self.seen = []   # (verify length, accepted) of every request-step observed

    def alpha(self, j):
        tried = sum(1 for L, a in self.seen if L >= j and a >= j - 1)
        succ = sum(1 for L, a in self.seen if a >= j)
        return (succ + 1.0) / (tried + 1.0 + 1.0)

    def choose(self, ctx):
        n = ctx.n
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        l_max = min(ctx.K, room(ctx) // n)
        best_L, best = 0, None
        prod, acc = 1.0, 0.0
        for L in range(l_max + 1):
            if L:
                prod *= self.alpha(L)
                acc += prod
            r = n * (acc + 1.0) / T_at(ctx.step_time, ctx.base_tokens + n * L)
            if best is None or r > best:
                best_L, best = L, r
        return np.full(n, best_L, dtype=np.int64)

    def observe(self, L, a):
        self.seen += list(zip(L.tolist(), a.tolist()))

    def ratios_drafted(self, ctx):
        """Early exit: {L: ratio} of the step the engine runs, request i verifying min(L, drafted[i]): expected
        tokens sum_i (1 + sum_{k <= min(L, d_i)} prod alpha) over step_time(base + sum_i min(L, d_i)), for
        L = 0..min(K, max d) while that step fits."""
        d, out = drafted(ctx), {}
        acc = [0.0]
        for L in range(1, ctx.K + 1):
            prod = 1.0
            for j in range(1, L + 1):
                prod *= self.alpha(j)
            acc.append(acc[-1] + prod)
        for L in range(min(ctx.K, max(d)) + 1):
            tokens = sum(min(L, x) for x in d)
            if tokens > ctx.max_tokens - ctx.base_tokens:
                break
            out[L] = sum(1.0 + acc[min(L, x)] for x in d) / T_at(ctx.step_time, ctx.base_tokens + tokens)
        return out


@SEQ
@given(st.lists(st.tuples(step_ctx(max_n=4, max_K=4), st.lists(st.integers(0, 4), min_size=4, max_size=4)),
                min_size=1, max_size=8))
def test_goodput_is_the_batch_wide_argmax_over_online_rates(steps):
    p, ref = make_policy("goodput"), RefGoodput()
    p.reset(4, np.random.default_rng(0))
    for ctx, draws in steps:
        L = p.choose(ctx)
        check_valid(L, ctx)
        np.testing.assert_array_equal(L, ref.choose(ctx))
        a = np.minimum(np.array(draws[:ctx.n], dtype=np.int64), L)      # accepted prefixes a <= L
        p.observe(ctx.request_ids, L, a)
        ref.observe(L, a)
    np.testing.assert_allclose(p.rates, [ref.alpha(j) for j in range(1, 5)], rtol=0, atol=0)


@SEQ
@given(st.lists(st.tuples(step_ctx(max_n=4, max_K=4, exit=True), st.lists(st.integers(0, 4), min_size=4,
                                                                           max_size=4)), min_size=1, max_size=8))
def test_goodput_under_early_exit_maximises_the_ratio_of_the_step_the_engine_runs(steps):
    """--draft-exit: request i verifies min(L, drafted[i]). goodput priced n*L tokens and counted n full prefixes,
    choosing among steps the engine never runs; now L maximises the brute-force ratio of the step that runs (up to
    float rounding between near-equal ratios; ties: the shorter L) and the lengths are min(L, drafted)."""
    p, ref = make_policy("goodput"), RefGoodput()
    p.reset(4, np.random.default_rng(0))
    for ctx, draws in steps:
        L = p.choose(ctx)
        check_valid(L, ctx)
        ratios = ref.ratios_drafted(ctx)
        best = max(ratios.values())
        near = [x for x, r in ratios.items() if r >= best * (1 - 1e-12)]
        (c,) = [x for x in ratios if np.array_equal(np.minimum(x, ctx.drafted), L)]   # one L <= max(drafted)
        assert c in near and (c == min(near) or ratios[min(near)] < ratios[c]), (L.tolist(), ratios)
        a = np.minimum(np.array(draws[:ctx.n], dtype=np.int64), L)
        p.observe(ctx.request_ids, L, a)
        ref.observe(L, a)


def test_goodput_under_early_exit_prices_what_each_request_drafted():
    # Two requests, drafted 1 and 4 of K = 4, rates at their prior 0.5: a request verifying L expects
    # 1, 1.5, 1.75, 1.875, 1.9375 tokens. Step 1 s up to M = 4, 1.05 s up to 7, 2 s from 8. Pricing n*L tokens
    # (M = 2 + 2L) chose L = 2 (3.5 / 1.05): the engine ran [1, 2], M = 5, 3.25 tokens in 1.05 s (3.10/s). The step
    # [1, 4] (L = 4: M = 7, 1.5 + 1.9375 tokens in 1.05 s, 3.27/s) is the best the engine can run.
    tab = np.array([1, 1, 1, 1, 1, 1.05, 1.05, 1.05, 2, 2, 2.0])
    conf = np.array([[0.9, 0, 0, 0], [0.9, 0.9, 0.9, 0.9]])
    ctx = StepContext(conf=conf, survival=np.cumprod(conf, axis=1), request_ids=np.arange(2), base_tokens=2,
                      step_time=table_time(tab), max_tokens=10, drafted=np.array([1, 4]))
    assert choose("goodput", ctx).tolist() == [1, 4]
    ctx.drafted = None                      # without early exit: the rule as before, n*L priced
    assert choose("goodput", ctx).tolist() == [2, 2]
    # the step must fit: max_tokens 6 leaves 4 draft tokens, so L = 3 ([1, 3], M = 6) is the longest that fits
    ctx = StepContext(conf=conf, survival=np.cumprod(conf, axis=1), request_ids=np.arange(2), base_tokens=2,
                      step_time=table_time(tab), max_tokens=6, drafted=np.array([1, 4]))
    assert choose("goodput", ctx).tolist() == [1, 3]


# ---------------------------------------------------------------------------------------------------- oracle
class RefOracle:
    """oracle -- knows A[i]. Each step it chooses the total c of verified slots maximising tokens(c) - lambda *
    step_time(base + c), tokens(c) = n + min(c, sum A) (smallest c on ties), lambda = the running throughput of its
    own steps (exponentially discounted sums of emitted tokens and step time, DECAY per step; the first step uses its
    own best ratio). Slots: accepted ones first, position by position, lower request first within a position; then
    rejected ones the same way (padding, worth taking only where the staircase is cheaper further up). With early
    exit only drafted positions exist: A[i] -> min(A[i], drafted[i]), slots k < drafted[i]."""

    DECAY = 1.0 - 1.0 / 512   # half-life ~355 steps (documented)

    def __init__(self):
        self.tok = self.time = 0.0

    def choose(self, ctx):
        n, K = ctx.n, ctx.K
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        D = [K] * n if ctx.drafted is None else [int(x) for x in ctx.drafted]
        A = [min(int(a), d) for a, d in zip(ctx.true_accepted, D)]
        acc = sum(A)
        top = min(room(ctx), sum(D))
        opts = [(float(n) + min(c, acc), T_at(ctx.step_time, ctx.base_tokens + c)) for c in range(top + 1)]
        lam = self.tok / self.time if self.time > 0 else max(t / s for t, s in opts)
        best_c, best = 0, None
        for c, (tok, sec) in enumerate(opts):
            v = tok - lam * sec
            if best is None or v > best:
                best_c, best = c, v
        self.tok = self.DECAY * self.tok + opts[best_c][0]
        self.time = self.DECAY * self.time + opts[best_c][1]
        slots = [(k, i) for k in range(K) for i in range(n) if k < A[i]]
        slots += [(k, i) for k in range(K) for i in range(n) if A[i] <= k < D[i]]
        L = [0] * n
        for k, i in slots[:best_c]:
            assert L[i] == k
            L[i] = k + 1
        return np.array(L, dtype=np.int64)


@SEQ
@given(st.lists(step_ctx(max_n=4, max_K=4, oracle=True), min_size=1, max_size=8))
def test_oracle_is_the_dinkelbach_choice_with_waste_free_slots(steps):
    assert Oracle.DECAY == RefOracle.DECAY
    p, ref = make_policy("oracle"), RefOracle()
    p.reset(4, np.random.default_rng(0))
    for ctx in steps:
        L = p.choose(ctx)
        check_valid(L, ctx)
        np.testing.assert_array_equal(L, ref.choose(ctx))
        A = ctx.true_accepted if ctx.drafted is None else np.minimum(ctx.true_accepted, ctx.drafted)
        if ctx.drafted is not None:
            assert (L <= ctx.drafted).all()
        if int(L.sum()) <= int(A.sum()):
            assert (L <= A).all()     # never a rejected slot unless the whole accepted set is already in
        else:
            assert (L >= A).all()     # padding only after every accepted slot


# --------------------------------------------------------------------------------------- confidence-async-2d
def with_context(ctx, context, qk_s):
    """The engine's 1-D long-context price (StepContext docs): every extra verified token at the mean context."""
    c = np.asarray(context, dtype=np.int64)
    base, qk0, per, m0 = ctx.step_time, float(c.sum()), float(c.mean()), ctx.base_tokens
    T = lambda M: base(M) + qk_s * (qk0 + (np.asarray(M) - m0) * per)  # noqa: E731
    return StepContext(conf=ctx.conf, survival=ctx.survival, request_ids=ctx.request_ids, base_tokens=m0,
                       step_time=T, max_tokens=ctx.max_tokens, context=c, qk_s=qk_s, drafted=ctx.drafted)


class Ref2D:
    """confidence-async-2d:LAG (its module doc): candidate (i, k) (0-based k) adds qk_s * (c_i + k + 1) seconds of
    attention on top of the base staircase (step_time less the engine's 1-D attention term); candidates ranked by
    s / (theta + qk_s (c_i + k + 1)), theta = max(0, mean slope of the base over this step's range, base_tokens ..
    base_tokens + min(nK, room); 0 when nothing fits); ties lower k, then request. Ratio of b = (n + top-b survivals) / (base(base_tokens + b) + qk_s (sum c +
    top-b pairs)); the budget is the global best of LAG steps earlier, the first LAG steps stop early."""

    def __init__(self, lag):
        self.lag, self.queue = lag, []

    def choose(self, ctx):
        n, K, c, sq, m0 = ctx.n, ctx.K, ctx.context, ctx.qk_s, ctx.base_tokens
        qk0, per = float(c.sum()), float(c.mean())

        def base(M):
            return T_at(ctx.step_time, M) - sq * (qk0 + (M - m0) * per)
        top = room(ctx)
        theta = max((base(m0 + top) - base(m0)) / top, 0.0) if top else 0.0
        cands = []
        for k in range(K):
            for i in range(n):
                if k >= drafted(ctx)[i]:   # early exit: not drafted, no candidate
                    continue
                s, pairs = float(ctx.survival[i, k]), float(c[i]) + (k + 1.0)
                dens = s / (theta + sq * pairs) if theta > 0 or sq > 0 else s
                cands.append((dens, k, i, s, pairs))
        cands.sort(key=lambda x: (-x[0], x[1], x[2]))
        ratios, E, P = [], float(n), qk0
        for b in range(room(ctx) + 1):
            if b:
                E += cands[b - 1][3]
                P += cands[b - 1][4]
            ratios.append(E / (base(m0 + b) + sq * P))
        best = max(range(len(ratios)), key=lambda b: (ratios[b], -b))
        if len(self.queue) >= self.lag:
            count = min(self.queue.pop(0), room(ctx))
        else:
            count = 0
            while count + 1 < len(ratios) and ratios[count + 1] > ratios[count]:
                count += 1
        self.queue.append(best)
        L = [0] * n
        for _, k, i, _, _ in cands[:count]:
            assert L[i] == k
            L[i] = k + 1
        return np.array(L, dtype=np.int64)


@SEQ
@given(st.lists(st.tuples(step_ctx(max_n=4, max_K=4), st.lists(st.integers(1, 5000), min_size=4, max_size=4),
                          st.sampled_from([1e-6, 1e-4, 1e-3])), min_size=1, max_size=6), st.integers(1, 2))
def test_confidence_async_2d_prices_each_candidate_at_its_own_context(steps, lag):
    p, ref = make_policy(f"confidence-async-2d:{lag}"), Ref2D(lag)
    p.reset(4, np.random.default_rng(0))
    for ctx, context, qk_s in steps:
        ctx = with_context(ctx, context[:ctx.n], qk_s)
        np.testing.assert_array_equal(p.choose(ctx), ref.choose(ctx))


@SEQ
@given(st.lists(step_ctx(max_n=4, max_K=4), min_size=1, max_size=5), st.integers(1, 2))
def test_confidence_async_2d_without_a_context_term_is_confidence_async(steps, lag):
    p, ref = make_policy(f"confidence-async-2d:{lag}"), RefAsync(lag)
    p.reset(4, np.random.default_rng(0))
    for ctx in steps:
        np.testing.assert_array_equal(p.choose(ctx), ref.choose(ctx))


# ------------------------------------------------------------------------------------- the step-time contract
class Strict:
    """A step time that fails the test on any M outside 1..max_tokens (the engine's dense price table has no entry
    past the budget; a profile lookup there raises or extrapolates)."""

    def __init__(self, inner, max_tokens):
        self.inner, self.max_tokens, self.asked = inner, max_tokens, []

    def __call__(self, M):
        M = np.asarray(M)
        self.asked.append(M.copy())
        assert M.min() >= 1 and M.max() <= self.max_tokens, f"priced M={M.min()}..{M.max()} > {self.max_tokens}"
        return self.inner(M)


SPECS = ["none", "fixed:2", "threshold:0.5", "goodput", "confidence", "confidence-global", "confidence-async:1",
         "confidence-async-2d:1", "oracle"]


@AUDIT
@given(step_ctx(oracle=True), st.lists(st.integers(1, 5000), min_size=5, max_size=5))
def test_no_policy_prices_a_batch_beyond_max_tokens(ctx, context):
    for spec in SPECS + (["mtp1"] if ctx.K == 1 else []):
        for c in (None, context[:ctx.n]):
            T = Strict(ctx.step_time, ctx.max_tokens)
            one = StepContext(conf=ctx.conf, survival=ctx.survival, request_ids=ctx.request_ids,
                              base_tokens=ctx.base_tokens, step_time=T, max_tokens=ctx.max_tokens,
                              true_accepted=ctx.true_accepted)
            if c is not None:
                one = with_context(one, c, 1e-4)
                one.true_accepted = ctx.true_accepted
            choose(spec, one)


# ------------------------------------------------------------------------------ early exit: undrafted positions
def test_oracle_counts_only_drafted_positions_as_verifiable():
    # --draft-exit: request 0 drafted 1 position, request 1 drafted 2; A (drawn as if all K were verified) = [5, 2].
    # Positions past drafted[i] do not exist (the engine caps L at drafted), so the verifiable accepted prefix is
    # min(A, drafted) = [1, 2]: with room for 3 draft tokens on a flat cost the waste-free choice is [1, 2]
    # (3 accepted). Water-filling the uncapped A gave [2, 1], which the engine trims to [1, 1] (2 accepted).
    conf = np.array([[0.9, 0.0, 0.0, 0.0, 0.0], [0.9, 0.9, 0.0, 0.0, 0.0]])
    ctx = StepContext(conf=conf, survival=np.cumprod(conf, axis=1), request_ids=np.arange(2), base_tokens=2,
                      step_time=affine(1.0, 0.0), max_tokens=5, true_accepted=np.array([5, 2]),
                      drafted=np.array([1, 2]))
    assert choose("oracle", ctx).tolist() == [1, 2]


# Every policy that ranks or counts positions, with early exit on every step: positions past drafted[i] reach the
# policy at confidence 0, but they do not exist -- no candidate of survival 0 that a ratio search could admit to
# reach a cheaper stair (a step the engine, which verifies at most the drafted positions, never runs).
EXIT_SPECS = ["fixed:5", "fixed:2", "threshold:0", "threshold:0.5", "goodput", "confidence", "confidence-global",
              "confidence-async:1", "confidence-async-2d:1"]


@AUDIT
@given(step_ctx(exit=True), st.lists(st.integers(1, 5000), min_size=5, max_size=5))
def test_no_policy_verifies_a_position_that_was_not_drafted(ctx, context):
    for spec in EXIT_SPECS:
        for one in (ctx, with_context(ctx, context[:ctx.n], 1e-4)):
            L = choose(spec, one)
            assert (L <= ctx.drafted).all(), (spec, L.tolist(), ctx.drafted.tolist())


@AUDIT
@given(step_ctx(exit=True))
def test_early_exit_ranking_policies_are_the_brute_force_over_drafted_positions(ctx):
    np.testing.assert_array_equal(choose("confidence", ctx), ref_confidence(ctx))
    np.testing.assert_array_equal(choose("confidence-global", ctx),
                                  lengths_of(ranked(ctx), ref_global_count(ctx), ctx.n))
    np.testing.assert_array_equal(choose("fixed:3", ctx), ref_fixed(ctx, 3))
    np.testing.assert_array_equal(choose("threshold:0", ctx), ref_threshold(ctx, 0.0))


@SEQ
@given(st.lists(st.tuples(step_ctx(max_n=4, max_K=4, exit=True), st.lists(st.integers(1, 5000), min_size=4,
                                                                         max_size=4)), min_size=1, max_size=6),
       st.integers(1, 2))
def test_early_exit_async_policies_are_the_brute_force_over_drafted_positions(steps, lag):
    pa, ra = make_policy(f"confidence-async:{lag}"), RefAsync(lag)
    p2, r2 = make_policy(f"confidence-async-2d:{lag}"), Ref2D(lag)
    pa.reset(4, np.random.default_rng(0))
    p2.reset(4, np.random.default_rng(0))
    for ctx, context in steps:
        np.testing.assert_array_equal(pa.choose(ctx), ra.choose(ctx))
        two = with_context(ctx, context[:ctx.n], 1e-4)
        np.testing.assert_array_equal(p2.choose(two), r2.choose(two))


def test_a_cheaper_stair_past_the_drafted_positions_is_not_chosen():
    # One request drafted 1 of 3 positions (c = 0.9). The step costs 1 s up to M = 2 and 0.5 s from M = 3 (a
    # staircase cheaper further up). Counting the two undrafted positions as survival-0 candidates, M = 3 looks
    # best (1.9 / 0.5 = 3.8 > 1.9 / 1): the policies chose L = 2, a step the engine (L <= drafted) never runs.
    conf = np.array([[0.9, 0.0, 0.0]])
    ctx = StepContext(conf=conf, survival=np.cumprod(conf, axis=1), request_ids=np.arange(1), base_tokens=1,
                      step_time=staircase([0, 3], [1.0, 0.5]), max_tokens=4, drafted=np.array([1]))
    for spec in ("confidence", "confidence-global", "confidence-async:1", "confidence-async-2d:1"):
        assert choose(spec, ctx).tolist() == [1], spec
