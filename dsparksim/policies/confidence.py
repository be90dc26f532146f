"""confidence — DSpark Algorithm 1: rank draft slots by survival, admit while expected tokens/time rises."""
from __future__ import annotations

from typing import ClassVar

import numpy as np

from ._common import draft_budget, first_drop, lengths_from_ranked, rank_candidates, ratio_curve
from .base import Policy, StepContext


def early_stop_count(ctx: StepContext, values: np.ndarray) -> int:
    """How many ranked candidates Algorithm 1 admits, given their survivals ``values`` (best first).

    Start at M = base_tokens, E = n (each request's bonus token); candidate j moves M -> M+1, E -> E + s_j.
    Candidate j is admitted iff E_j / T(M_j) > E_{j-1} / T(M_{j-1}) and all earlier ones were; the first
    candidate that leaves the ratio equal or lower ends the scan, as does max_tokens. Admitting candidate j
    depends only on candidates ranked above it — never on the later tokens of the same request — which is what
    keeps the decision lossless.
    """
    bmax = draft_budget(ctx)
    ratio = ratio_curve(float(ctx.n), values, ctx.base_tokens, ctx.step_time, bmax)
    return first_drop(ratio)


def algorithm1(ctx: StepContext) -> np.ndarray:
    """Verify lengths chosen by Algorithm 1 (early stop on current confidences)."""
    if ctx.n == 0:
        return np.zeros(0, dtype=np.int64)
    order, values = rank_candidates(ctx.survival)
    return lengths_from_ranked(order, early_stop_count(ctx, values), ctx.n)


class Confidence(Policy):
    """DSpark Algorithm 1 (per-request, load-aware, lossless). Ties: lower position first, then request index."""

    name: ClassVar[str] = "confidence"
    usage: ClassVar[str] = "confidence"

    def choose(self, ctx: StepContext) -> np.ndarray:
        return algorithm1(ctx)
