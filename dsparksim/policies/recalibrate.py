"""Online recalibration (``--recalibrate``): sequential temperature scaling refitted from past verification outcomes.

A wrapper around any confidence-reading policy. Each step it rescales the conditional confidences the policy sees,
``logit c'[i,k] = logit c[i,k] / t_k``, with per-position temperatures t_k (1 at the start), and passes the
rescaled confidences and survivals on. After each step, :meth:`observe` records what verification revealed: for a
request that verified L draft tokens and accepted a of them, positions 1..min(L, a + 1) were tried, each with label
"accepted" for k <= a and "rejected" at k = a + 1 (positions beyond were never tried: censored, not counted). Every
``refit_every`` steps t_k is refitted by Newton's method on the conditional log loss of the last ``window``
observations of position k (the temperature-scaling fit of :func:`dsparksim.acceptance.confidence.fit_sts_nll`,
on the conditional label, since survival labels are censored by the verify length).

Lossless: the temperatures used at step t are a function of steps < t only (outcomes already emitted), so at step
t they are a fixed, strictly increasing map of each position's confidence; ranks within a position, the per-request
prefix order and the causality argument of the inner policy are unchanged (a draft token's admission still depends
only on information available before it was sampled). ``dsparksim audit --recalibrate`` tests it.
"""
from __future__ import annotations

from collections import deque
from dataclasses import replace
from typing import ClassVar

import numpy as np

from dsparksim.policies.base import Policy, StepContext

WINDOW = 20_000        # observations per position kept for the fit (sliding)
REFIT_EVERY = 25       # steps between refits
MIN_OBS = 500          # observations of a position before its temperature leaves 1
T_RANGE = (0.05, 20.0)


def _logit(c: np.ndarray) -> np.ndarray:
    c = np.clip(np.asarray(c, dtype=float), 1e-12, 1 - 1e-12)
    return np.log(c) - np.log1p(-c)


def fit_temperature(z: np.ndarray, y: np.ndarray, t0: float = 1.0, iters: int = 30) -> float:
    """The t minimising the log loss of sigmoid(z / t) against 0/1 labels y (Newton on 1/t, clamped to T_RANGE)."""
    th = 1.0 / t0
    lo, hi = 1.0 / T_RANGE[1], 1.0 / T_RANGE[0]
    for _ in range(iters):
        p = 1.0 / (1.0 + np.exp(-th * z))
        g = float((z * (p - y)).sum())
        h = float((z * z * p * (1.0 - p)).sum())
        if not h > 0:
            break
        step = g / h
        th = float(np.clip(th - step, lo, hi))
        if abs(step) < 1e-9 * max(1.0, abs(th)):
            break
    return 1.0 / th


class Recalibrating(Policy):
    """Online STS around a policy: confidences rescaled by temperatures fitted on past verification outcomes."""

    name: ClassVar[str] = "recalibrate"
    usage: ClassVar[str] = "--recalibrate"

    def __init__(self, inner: Policy, window: int = WINDOW, refit_every: int = REFIT_EVERY,
                 min_obs: int = MIN_OBS) -> None:
        self.inner = inner
        self.spec = f"{inner.spec}+recal"
        self.drafter = inner.drafter
        self.block_size = inner.block_size
        self.needs_oracle = inner.needs_oracle
        self.drafts = inner.drafts
        self.reads_confidence = inner.reads_confidence
        self.window, self.refit_every, self.min_obs = int(window), int(refit_every), int(min_obs)
        self.temps = np.ones(0)
        self.history: list[np.ndarray] = []   # temperatures after each refit (for the studies)

    def reset(self, K: int, rng: np.random.Generator) -> None:
        self.inner.reset(K, rng)
        self.temps = np.ones(K)
        self._z: list[deque] = [deque() for _ in range(K)]      # per position: chunks of (logits, labels)
        self._n = np.zeros(K, np.int64)
        self._pending: dict[int, np.ndarray] = {}
        self._steps = 0
        self.history = []

    def choose(self, ctx: StepContext) -> np.ndarray:
        if ctx.n == 0:
            return self.inner.choose(ctx)
        z = _logit(ctx.conf)
        self._pending = {"ids": np.asarray(ctx.request_ids).copy(), "z": z}
        if np.all(self.temps[:ctx.K] == 1.0):
            return self.inner.choose(ctx)
        conf = 1.0 / (1.0 + np.exp(-z / self.temps[None, :ctx.K]))
        # temperature scaling maps 0 -> 0 and 1 -> 1 (logit -inf / +inf); the clip of _logit must not lift a 0 (a
        # position past an early-exit stop, which the engine never verifies) or lower a 1
        ends = (ctx.conf <= 0.0) | (ctx.conf >= 1.0)
        if ends.any():
            conf = np.where(ends, ctx.conf, conf)
        return self.inner.choose(replace(ctx, conf=conf, survival=np.cumprod(conf, axis=1)))

    def observe(self, request_ids, verify_len, accepted) -> None:
        self.inner.observe(request_ids, verify_len, accepted)
        p = self._pending
        self._pending = {}
        if p and len(request_ids):
            ids = np.asarray(request_ids)
            if not np.array_equal(ids, p["ids"]):   # align by id (the engine reports the rows it chose for)
                pos = {int(r): j for j, r in enumerate(p["ids"])}
                take = np.array([pos[int(r)] for r in ids])
                z = p["z"][take]
            else:
                z = p["z"]
            L = np.asarray(verify_len, np.int64)
            a = np.asarray(accepted, np.int64)
            tried = np.minimum(L, a + 1)          # positions 1..tried were verified and reached
            for k in range(z.shape[1]):
                sel = tried >= k + 1
                if sel.any():
                    self._add(k, z[sel, k], (a[sel] >= k + 1).astype(float))
        self._steps += 1
        if self._steps % self.refit_every == 0:
            self._refit()

    def _add(self, k: int, z: np.ndarray, y: np.ndarray) -> None:
        q = self._z[k]
        q.append((z, y))
        self._n[k] += z.size
        while q and self._n[k] - q[0][0].size >= self.window:
            self._n[k] -= q.popleft()[0].size

    def _refit(self) -> None:
        for k, q in enumerate(self._z):
            if self._n[k] < self.min_obs:
                continue
            z = np.concatenate([c[0] for c in q])
            y = np.concatenate([c[1] for c in q])
            self.temps[k] = fit_temperature(z, y, float(self.temps[k]))
        self.history.append(self.temps.copy())


def recalibrating(policy: Policy) -> Policy:
    """``policy`` wrapped in online recalibration (see the module doc)."""
    return Recalibrating(policy)
