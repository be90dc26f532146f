"""The fast policy paths give bitwise the same verify lengths as the reference implementation they replaced.

``reference_algorithm1`` below is a verbatim copy of the implementation before the partial-sort speed-up (full
stable argsort of all n*K candidates, ratio curve over the whole budget). Contexts are random with many ties
(quantised confidences, equal rows, zeros, ones), jagged and flat step-time staircases and binding budgets.
"""
from __future__ import annotations

from collections import deque

import numpy as np
import pytest

from dsparksim.errors import InputError
from dsparksim.policies import make_policy
from dsparksim.policies import global_search_current
from dsparksim.policies._common import Ranking, rank_candidates
from dsparksim.policies.base import StepContext
from dsparksim.policies.confidence import FIRST_PREFIX, algorithm1


# ----------------------------------------------------------------------------- reference (old code, verbatim)
def _ref_draft_budget(ctx):
    room = int(ctx.max_tokens) - int(ctx.base_tokens)
    if room < 0:
        raise InputError("StepContext", "base_tokens", "overflow")
    return min(room, ctx.n * ctx.K)


def _ref_rank_candidates(survival):
    flat = np.ascontiguousarray(survival.T).ravel()
    order = np.argsort(-flat, kind="stable")
    return order, flat[order]


def _ref_lengths_from_ranked(order, count, n):
    return np.bincount(order[:count] % n, minlength=n).astype(np.int64, copy=False)


def _ref_eval_times(step_time, M):
    T = np.asarray(step_time(M), dtype=np.float64)
    if T.shape != M.shape or not (np.isfinite(T).all() and (T > 0).all()):
        raise InputError("StepContext", "step_time", "bad")
    return T


def _ref_ratio_curve(e0, gains, base, step_time, bmax):
    E = np.empty(bmax + 1)
    E[0] = e0
    E[1:] = gains[:bmax]
    np.cumsum(E, out=E)
    return E / _ref_eval_times(step_time, base + np.arange(bmax + 1, dtype=np.int64))


def _ref_first_drop(ratio):
    if len(ratio) <= 1:
        return 0
    drops = np.diff(ratio) <= 0
    j = int(np.argmax(drops))
    return j if drops[j] else len(ratio) - 1


def _ref_early_stop_count(ctx, values):
    bmax = _ref_draft_budget(ctx)
    return _ref_first_drop(_ref_ratio_curve(float(ctx.n), values, ctx.base_tokens, ctx.step_time, bmax))


def _ref_global_budget(ctx, values):
    bmax = _ref_draft_budget(ctx)
    return int(np.argmax(_ref_ratio_curve(float(ctx.n), values, ctx.base_tokens, ctx.step_time, bmax)))


def reference_algorithm1(ctx):
    if ctx.n == 0:
        return np.zeros(0, dtype=np.int64)
    order, values = _ref_rank_candidates(ctx.survival)
    return _ref_lengths_from_ranked(order, _ref_early_stop_count(ctx, values), ctx.n)


def reference_global_search_current(ctx):
    if ctx.n == 0:
        return np.zeros(0, dtype=np.int64)
    order, values = _ref_rank_candidates(ctx.survival)
    return _ref_lengths_from_ranked(order, _ref_global_budget(ctx, values), ctx.n)


class ReferenceConfidenceAsync:
    """confidence-async's choose() before the speed-up (state: the queue of stale budgets)."""

    def __init__(self, lag):
        self.lag, self._pending = lag, deque()

    def choose(self, ctx):
        if ctx.n == 0:
            return np.zeros(0, dtype=np.int64)
        order, values = _ref_rank_candidates(ctx.survival)
        if len(self._pending) >= self.lag:
            count = min(self._pending.popleft(), _ref_draft_budget(ctx))
        else:
            count = _ref_early_stop_count(ctx, values)
        self._pending.append(_ref_global_budget(ctx, values))
        return _ref_lengths_from_ranked(order, count, ctx.n)


# ----------------------------------------------------------------------------- random contexts
class Recorder:
    """A step_time over a dense staircase that records every query (to compare side effects too)."""

    def __init__(self, table: np.ndarray, extra: float):
        self.table, self.extra, self.calls = table, extra, []

    def __call__(self, M):
        self.calls.append(np.array(M, copy=True))
        return self.table[M] + self.extra


def random_ctx(rng: np.random.Generator) -> tuple[StepContext, Recorder]:
    n = int(rng.choice([0, 1, 2, 5, 17, 64, 150, 300, 700]))
    K = int(rng.integers(1, 16))
    kind = rng.integers(0, 4)
    if kind == 0:  # heavy ties: a handful of values, zeros and ones
        conf = rng.choice([0.0, 0.25, 0.5, 0.75, 1.0], size=(n, K))
    elif kind == 1:  # identical rows: every rank position is a tie across requests
        conf = np.repeat(rng.uniform(0.2, 1.0, size=(1, K)), n, axis=0)
    elif kind == 2:  # continuous
        conf = rng.uniform(0.0, 1.0, size=(n, K))
    else:  # quantised continuous: ties between survivals of different positions
        conf = np.round(rng.uniform(0.5, 1.0, size=(n, K)), 1)
    base = n + int(rng.integers(0, 200))
    max_tokens = base + int(rng.integers(0, n * K + 50)) if rng.random() < 0.8 else base + n * K + 100
    shape = rng.integers(0, 3)
    M = np.arange(max_tokens + 1)
    if shape == 0:  # jagged, non-monotone staircase
        table = 0.01 + 1e-5 * M + rng.uniform(0, 2e-4, size=M.size)
    elif shape == 1:  # flat: every candidate raises the ratio, the scan runs to the budget (retries, full sort)
        table = np.full(M.size, 0.02)
    else:  # steep: few candidates pay
        table = 0.001 + 1e-4 * M
    rec = Recorder(table, float(rng.uniform(0, 0.01)))
    ctx = StepContext(conf=conf, survival=np.cumprod(conf, axis=1), request_ids=np.arange(n), base_tokens=base,
                      step_time=rec, max_tokens=max_tokens)
    return ctx, rec


def test_algorithm1_fast_path_equals_reference_on_random_contexts():
    rng = np.random.default_rng(2026)
    retried = full = 0
    for _ in range(1500):
        ctx, rec = random_ctx(rng)
        want = reference_algorithm1(ctx)
        ref_calls, rec.calls = rec.calls, []
        got = algorithm1(ctx)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
        # the same step_time queries as before (extrapolation reports count them)
        assert len(rec.calls) == len(ref_calls)
        for a, b in zip(rec.calls, ref_calls):
            np.testing.assert_array_equal(a, b)
        retried += int(want.sum() > FIRST_PREFIX)
        full += int(ctx.n * ctx.K > 4 * FIRST_PREFIX and want.sum() > 4 * FIRST_PREFIX)
    assert retried > 50 and full > 20  # the retry and the fall-back-to-full-sort branches were exercised


def test_confidence_policy_choose_equals_reference():
    rng = np.random.default_rng(7)
    pol = make_policy("confidence")
    for _ in range(300):
        ctx, _ = random_ctx(rng)
        np.testing.assert_array_equal(pol.choose(ctx), reference_algorithm1(ctx))


def _same_calls(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


def test_global_search_and_async_equal_reference_on_random_contexts():
    rng = np.random.default_rng(99)
    for lag in (1, 2, 3):
        new, ref = make_policy(f"confidence-async:{lag}"), ReferenceConfidenceAsync(lag)
        new.reset(7, rng)
        for _ in range(250):  # one stream of steps: the stale-budget queue must evolve identically
            ctx, rec = random_ctx(rng)
            want = ref.choose(ctx)
            ref_calls, rec.calls = rec.calls, []
            got = new.choose(ctx)
            assert got.dtype == want.dtype
            np.testing.assert_array_equal(got, want)
            _same_calls(rec.calls, ref_calls)
            assert list(new._pending) == list(ref._pending)
    for _ in range(400):
        ctx, rec = random_ctx(rng)
        want = reference_global_search_current(ctx)
        ref_calls, rec.calls = rec.calls, []
        np.testing.assert_array_equal(global_search_current(ctx), want)
        _same_calls(rec.calls, ref_calls)


@pytest.mark.parametrize("seed", range(5))
def test_ranking_values_and_lengths_are_those_of_the_full_stable_order(seed):
    rng = np.random.default_rng(seed)
    n, K = 200, 7
    conf = rng.choice([0.0, 0.5, 1.0, 0.9], size=(n, K))  # survivals tie across requests and positions
    s = np.cumprod(conf, axis=1)
    order, values = _ref_rank_candidates(s)
    for m in (1, 5, 64, 349, 350, 351, 1400, None):
        v = Ranking(s).values(m)
        assert len(v) >= (n * K if m is None else min(m, n * K))
        np.testing.assert_array_equal(v, values[: len(v)])
    r = Ranking(s)
    for count in (0, 1, 2, 17, 64, 200, 333, 350, 351, 700, 1399, 1400):
        np.testing.assert_array_equal(r.lengths(count), _ref_lengths_from_ranked(order, count, n))
        np.testing.assert_array_equal(Ranking(s).lengths(count), _ref_lengths_from_ranked(order, count, n))
    np.testing.assert_array_equal(rank_candidates(s)[0], order)


def test_ranking_handles_nan_like_the_full_sort():
    s = np.array([[np.nan, np.nan], [0.5, 0.2], [np.nan, np.nan], [0.5, 0.5]] * 40)
    order, values = _ref_rank_candidates(s)
    n = s.shape[0]
    for m in (3, 100, 200, None):
        v = Ranking(s).values(m)
        np.testing.assert_array_equal(v, values[: len(v)])  # assert_array_equal treats NaN == NaN
    for count in (0, 3, 80, 159, 160, 161, 250, 320):
        np.testing.assert_array_equal(Ranking(s).lengths(count), _ref_lengths_from_ranked(order, count, n))


def test_fast_path_raises_the_same_errors():
    conf = np.full((4, 3), 0.5)
    bad = StepContext(conf=conf, survival=np.cumprod(conf, axis=1), request_ids=np.arange(4), base_tokens=4,
                      step_time=lambda M: np.where(M > 9, 0.0, 0.01), max_tokens=20)
    with pytest.raises(InputError, match="step_time"):
        algorithm1(bad)
    over = StepContext(conf=conf, survival=np.cumprod(conf, axis=1), request_ids=np.arange(4), base_tokens=9,
                       step_time=lambda M: 0.01 + 0 * M, max_tokens=8)
    with pytest.raises(InputError, match="base_tokens"):
        algorithm1(over)
