"""confidence — DSpark Algorithm 1: rank draft slots by survival, admit while expected tokens/time rises."""
from __future__ import annotations

from typing import ClassVar

import numpy as np

from dsparksim.policies._common import Ranking, candidate_budget, eval_times, first_drop, ratio_curve
from dsparksim.policies.base import Policy, StepContext


def early_stop_count(ctx: StepContext, values: np.ndarray) -> int:
    """How many ranked candidates Algorithm 1 admits, given their survivals ``values`` (best first).

    Start at M = base_tokens, E = n (each request's bonus token); candidate j moves M -> M+1, E -> E + s_j.
    Candidate j is admitted iff E_j / T(M_j) > E_{j-1} / T(M_{j-1}) and all earlier ones were; the first
    candidate that leaves the ratio equal or lower ends the scan, as does max_tokens. Admitting candidate j
    depends only on candidates ranked above it — never on the later tokens of the same request — which is what
    keeps the decision lossless. With early exit only drafted positions are candidates (``values`` ranked by
    ``Ranking(survival, drafted)``, the count capped by :func:`candidate_budget`).
    """
    bmax = candidate_budget(ctx)
    ratio = ratio_curve(float(ctx.n), values, ctx.base_tokens, ctx.step_time, bmax)
    return first_drop(ratio)


# First prefix of the ranking sorted by the fast path; Algorithm 1 rarely admits more (x4 on each retry).
FIRST_PREFIX = 64


def early_stop_ranked(ctx: StepContext, ranking: Ranking) -> int:
    """:func:`early_stop_count` on a lazily sorted :class:`Ranking`: bitwise the same count, fewer sorts.

    The ratio curve is a sequential cumsum, so its first p+1 entries do not depend on the candidates ranked
    below p; the first drop found inside a sorted prefix is the first drop of the whole curve. step_time is
    still evaluated over the whole range 0..budget, as before, so its checks and any extrapolation report see
    the very same queries.
    """
    bmax = candidate_budget(ctx)
    st = ctx.step_time
    if getattr(st, "checked", False) and ctx.base_tokens >= 1:
        # a checked dense price table (dsparksim.cost.price.DenseStepTime): every price in range is positive and
        # finite, so only the prefix the scan reads is looked up -- the same numbers
        T = None
    else:
        T = eval_times(st, ctx.base_tokens + np.arange(bmax + 1, dtype=np.int64))
    m = FIRST_PREFIX
    while True:
        keys = ranking.keys(min(m, bmax))       # the survivals best first, negated
        p = min(len(keys), bmax)
        E = np.empty(p + 1)
        E[0] = float(ctx.n)
        np.negative(keys[:p], out=E[1:])
        np.add.accumulate(E, out=E)             # np.cumsum's own loop, without its wrapper
        E /= st.span(ctx.base_tokens, p + 1) if T is None else T[: p + 1]
        j = first_drop(E)
        if j < p or p == bmax:
            return j
        m *= 4


def algorithm1(ctx: StepContext) -> np.ndarray:
    """Verify lengths chosen by Algorithm 1 (early stop on current confidences)."""
    if ctx.n == 0:
        return np.zeros(0, dtype=np.int64)
    ranking = Ranking(ctx.survival, ctx.drafted)
    return ranking.lengths(early_stop_ranked(ctx, ranking))


class Confidence(Policy):
    """DSpark Algorithm 1 (per-request, load-aware, lossless). Ties: lower position first, then request index."""

    name: ClassVar[str] = "confidence"
    usage: ClassVar[str] = "confidence"

    def choose(self, ctx: StepContext) -> np.ndarray:
        return algorithm1(ctx)
