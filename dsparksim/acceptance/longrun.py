"""Long-output block simulation straight on an acceptance model (no engine, no cost profile).

Each of ``n_requests`` requests (one domain) decodes ``tokens`` output tokens, one block per step, drawn with the
engine's keyed streams (:class:`dsparksim.sim.streams.RequestStreams`: request i's step j uses the words of
(seed, i, j), exactly what the engine hands the model), and verifies the length a per-step rule picks:

* ``fixed``: all K positions (the paper's evaluator: every proposal verified whole);
* ``threshold:t``: the positions whose cumulative survival is >= t (the threshold policy's rule).

Tokens emitted per step are a + 1 (accepted prefix plus the bonus token), clipped at the tokens the request still
needs. Pooled over every step of every request, as DeepSpec pools acceptance lengths over all proposals:

* ``tau`` = sum emitted / sum steps (clipped at each request's length, as :mod:`dsparksim.results.metrics` reports it);
* ``tau_unclipped`` = sum (a + 1) / sum steps (the same steps without the end-of-output clip; by Wald's
  identity its expectation equals the model's step-weighted 1 + sum_k P(a >= k) whatever the length);
* ``verified`` = sum (L + 1) / sum steps (verified slots including the bonus position, Fig. 5's count);
* ``conditional`` = per position k, steps with a >= k over steps with a >= k - 1 (pooled conditional acceptance).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from dsparksim.sim.streams import RequestStreams
from dsparksim.acceptance.base import AcceptanceModel


def _lengths(rule: str, conf: np.ndarray) -> np.ndarray:
    K = conf.shape[1]
    if rule == "fixed":
        return np.full(conf.shape[0], K, np.int64)
    kind, _, arg = rule.partition(":")
    if kind == "threshold":
        return (np.cumprod(conf, axis=1) >= float(arg)).sum(axis=1).astype(np.int64)
    raise ValueError(f"unknown rule {rule!r}; expected 'fixed' or 'threshold:T'")


class _Stratified:
    """start() draws of a verification run: the normals are the n midpoint quantiles Phi^-1((i + 0.5) / n) in a
    seeded random order, so the request mix (the between-request sampling error that dominates a pooled tau) is
    nearly exact; every step's draws still come from the engine's keyed streams."""

    def __init__(self, seed: int) -> None:
        self._rng = np.random.default_rng(seed)

    def standard_normal(self, size):
        from scipy.special import ndtri  # lazy: scipy

        n = int(np.prod(size))
        return self._rng.permutation(ndtri((np.arange(n) + 0.5) / n)).reshape(size)

    def random(self, size):
        n = int(np.prod(size))
        return self._rng.permutation((np.arange(n) + 0.5) / n).reshape(size)


def simulate_long(model: AcceptanceModel, domain: str, *, n_requests: int, tokens: int, seed: int = 0,
                  rule: str = "fixed", stratified: bool = False) -> dict[str, Any]:
    """Pooled tau / unclipped tau / verified slots per step of ``n_requests`` outputs of ``tokens`` tokens
    (``stratified``: request-level draws from stratified quantiles instead of the keyed start draws)."""
    streams = RequestStreams(seed)
    keys = streams.request_keys(np.arange(n_requests))
    slots = np.arange(n_requests)
    model.start(slots, np.full(n_requests, domain, dtype=object),
                _Stratified(seed) if stratified else streams.rows(keys, -1, 1))
    words = int(getattr(model, "words_per_step", 8))
    gen = np.zeros(n_requests, np.int64)
    steps = np.zeros(n_requests, np.int64)
    emitted = unclipped = verified = 0
    reach = np.zeros(model.K + 1, np.int64)          # reach[k] = steps whose accepted prefix a >= k
    active = slots
    while active.size:
        blk = model.draw(active, streams.rows(keys[active], steps[active], words))
        L = _lengths(rule, blk.conf)
        a = np.minimum(L, blk.accepted)
        emit = np.minimum(a + 1, tokens - gen[active])
        gen[active] += emit
        steps[active] += 1
        emitted += int(emit.sum())
        unclipped += int((a + 1).sum())
        verified += int((L + 1).sum())
        reach += np.cumsum(np.bincount(a, minlength=model.K + 1)[::-1])[::-1]
        active = active[gen[active] < tokens]
    n_steps = int(steps.sum())
    with np.errstate(invalid="ignore", divide="ignore"):
        conditional = reach[1:] / reach[:-1]
    return {"conditional": conditional, "tau": emitted / n_steps, "tau_unclipped": unclipped / n_steps, "verified": verified / n_steps,
            "steps": n_steps, "requests": n_requests, "tokens": tokens, "rule": rule, "domain": domain}
