"""Long-output block simulation straight on an acceptance model (no engine, no cost profile).

Each of ``n_requests`` requests (one domain) decodes ``tokens`` output tokens, one block per step, drawn with the
engine's keyed streams (:class:`dsparksim.streams.RequestStreams`: request i's step j uses the words of
(seed, i, j), exactly what the engine hands the model), and verifies the length a per-step rule picks:

* ``fixed``: all K positions (the paper's evaluator: every proposal verified whole);
* ``threshold:t``: the positions whose cumulative survival is >= t (the threshold policy's rule).

Tokens emitted per step are a + 1 (accepted prefix plus the bonus token), clipped at the tokens the request still
needs. Pooled over every step of every request, as DeepSpec pools acceptance lengths over all proposals:

* ``tau`` = sum emitted / sum steps (clipped at each request's length, as :mod:`dsparksim.metrics` reports it);
* ``tau_unclipped`` = sum (a + 1) / sum steps (the same steps without the end-of-output clip; by Wald's
  identity its expectation equals the model's step-weighted 1 + sum_k P(a >= k) whatever the length);
* ``verified`` = sum (L + 1) / sum steps (verified slots including the bonus position, Fig. 5's count).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..streams import RequestStreams
from .base import AcceptanceModel


def _lengths(rule: str, conf: np.ndarray) -> np.ndarray:
    K = conf.shape[1]
    if rule == "fixed":
        return np.full(conf.shape[0], K, np.int64)
    kind, _, arg = rule.partition(":")
    if kind == "threshold":
        return (np.cumprod(conf, axis=1) >= float(arg)).sum(axis=1).astype(np.int64)
    raise ValueError(f"unknown rule {rule!r}; expected 'fixed' or 'threshold:T'")


def simulate_long(model: AcceptanceModel, domain: str, *, n_requests: int, tokens: int, seed: int = 0,
                  rule: str = "fixed") -> dict[str, Any]:
    """Pooled tau / unclipped tau / verified slots per step of ``n_requests`` outputs of ``tokens`` tokens."""
    streams = RequestStreams(seed)
    keys = streams.request_keys(np.arange(n_requests))
    slots = np.arange(n_requests)
    model.start(slots, np.full(n_requests, domain, dtype=object), streams.rows(keys, -1, 1))
    words = int(getattr(model, "words_per_step", 8))
    gen = np.zeros(n_requests, np.int64)
    steps = np.zeros(n_requests, np.int64)
    emitted = unclipped = verified = 0
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
        active = active[gen[active] < tokens]
    n_steps = int(steps.sum())
    return {"tau": emitted / n_steps, "tau_unclipped": unclipped / n_steps, "verified": verified / n_steps,
            "steps": n_steps, "requests": n_requests, "tokens": tokens, "rule": rule, "domain": domain}
