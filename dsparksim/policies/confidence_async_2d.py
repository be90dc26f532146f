"""confidence-async-2d:LAG — confidence-async with each draft candidate priced at its own request's context.

The paper's SPS(B) is one-dimensional, and so is the price the engine hands the policies: every extra verified
token costs the batch's mean context (StepContext docs). With long contexts a request's draft token really costs
its own attention: going from L to L + 1 verified drafts of request i adds qk_s * (c_i + L + 1) seconds (c_i its
context), on top of the target's batch term (the staircase base(M), the same for every token). This variant:

* prices candidate (i, k) (k = 0-based position) at m_ik = theta + qk_s * (c_i + k + 1), theta = the base
  staircase's mean slope over this step's range, base(base_tokens + b) - base(base_tokens) over b with
  b = min(nK, max_tokens - base_tokens) (clamped at 0; theta = 0 when no draft token fits);
* ranks candidates by value per cost, s_ik / m_ik (non-increasing in k, so admitted sets stay per-request
  prefixes; ties: lower position, then request, as everywhere);
* searches the budget b globally over (n + top-b survivals) / (base(base_tokens + b) + qk_s * exact query-key
  pairs of the top-b set), queues it, and LAG steps later admits that many of the then-current candidates in this
  order -- confidence-async's causality argument unchanged (the budget is fixed before the step's tokens are
  sampled; a candidate only competes with candidates ranked above it, and a request's later positions always rank
  below its earlier ones). The first LAG steps fall back to the early stop on the same 2-D curve.

A step without a context term (``ctx.context`` None or ``qk_s`` 0) is exactly confidence-async.
"""
from __future__ import annotations

from typing import ClassVar

import numpy as np

from dsparksim.policies._common import candidate_budget, eval_times, first_drop, global_best
from dsparksim.policies.base import StepContext
from dsparksim.policies.confidence_async import ConfidenceAsync


def priced_candidates(ctx: StepContext) -> tuple[np.ndarray, np.ndarray, np.ndarray, callable]:
    """(order, survivals, query-key pairs, base) of this step's candidates ranked by value per cost: k-major flat
    order (f = k*n + i), their survivals and the query-key pairs each adds, and base(M) = step_time(M) minus the
    engine's 1-D attention term."""
    n, K = ctx.n, ctx.K
    c = np.asarray(ctx.context, dtype=np.float64)
    qk0, per, m0, sq = float(c.sum()), float(c.mean()), int(ctx.base_tokens), float(ctx.qk_s)

    def base(M: np.ndarray) -> np.ndarray:
        M = np.asarray(M)
        return ctx.step_time(M) - sq * (qk0 + (M - m0) * per)

    top = candidate_budget(ctx)   # min(room, n*K, drafted); 0 = nothing fits: no slope to read (and no price past max_tokens)
    theta = 0.0
    if top:
        ends = eval_times(base, np.array([m0, m0 + top], dtype=np.int64))
        theta = max(float(ends[1] - ends[0]) / top, 0.0)
    pairs = (c[None, :] + np.arange(1, K + 1, dtype=np.float64)[:, None]).ravel()    # k-major: f = k*n + i
    s = np.ascontiguousarray(ctx.survival.T).ravel()
    density = s / (theta + sq * pairs) if theta > 0 or sq > 0 else s
    if ctx.drafted is not None:   # early exit: undrafted positions rank after every drafted one (never admitted)
        density = np.where((np.arange(K)[:, None] >= np.asarray(ctx.drafted)[None, :]).ravel(), -np.inf, density)
    order = np.argsort(-density, kind="stable")
    return order, s[order], pairs[order], base


def ratio_2d(ctx: StepContext, vals: np.ndarray, pairs: np.ndarray, base, bmax: int) -> np.ndarray:
    """ratio[b] = (n + top-b survivals) / (base(base_tokens + b) + qk_s * (sum(context) + top-b pairs))."""
    E = np.concatenate(([float(ctx.n)], vals[:bmax]))
    np.cumsum(E, out=E)
    P = np.concatenate(([float(np.sum(ctx.context))], pairs[:bmax]))
    np.cumsum(P, out=P)
    M = ctx.base_tokens + np.arange(bmax + 1, dtype=np.int64)
    T = eval_times(lambda m: base(m) + ctx.qk_s * P, M)
    return E / T


class ConfidenceAsync2D(ConfidenceAsync):
    """confidence-async with every draft candidate priced at its own request's context (2-D: batch x context)."""

    name: ClassVar[str] = "confidence-async-2d"
    usage: ClassVar[str] = "confidence-async-2d[:LAG]"

    def __init__(self, lag: int = 2, spec: str | None = None) -> None:
        super().__init__(lag, spec or f"confidence-async-2d:{int(lag)}")

    def choose(self, ctx: StepContext) -> np.ndarray:
        if ctx.n == 0 or ctx.context is None or not ctx.qk_s > 0:
            return super().choose(ctx)
        n = ctx.n
        order, vals, pairs, base = priced_candidates(ctx)
        bmax = candidate_budget(ctx)
        ratio = ratio_2d(ctx, vals, pairs, base, bmax)
        if len(self._pending) >= self.lag:
            count = min(self._pending.popleft(), bmax)
        else:
            count = first_drop(ratio)
        self._pending.append(global_best(ratio))
        return np.bincount(order[:count] % n, minlength=n).astype(np.int64, copy=False)
