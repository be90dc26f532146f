"""What a benchmark's ITL says about a speculative server: tokens per streamed chunk -> acceptance length.

The benchmark clients (vLLM ``bench serve``, SGLang ``bench_serving``, InferenceX's copy) record one ITL per
streamed chunk, and TPOT per token: TPOT = (E2E - TTFT) / (output tokens - 1). Their ratio, mean ITL / mean TPOT,
is the mean number of tokens per chunk after the first (at equal per-token times; 9.93-10.00 on the InferenceX
H200 SGLang runs at stream interval 10 without speculation, 29.4-29.6 on B200 at 30).

SGLang decides per request after each decode step whether to stream: ``len(output_ids) % stream_interval == 1``
for an interval > 1 (``scheduler_output_processor_mixin.py``, ``stream_output_generation``), and always when the
request finishes. A speculative step adds 1 + (accepted drafts) tokens at once, so a length is reached only with
probability ~1/tau (renewal): a chunk then carries ~stream_interval x tau tokens. :func:`stream_ratio` computes
the expected ratio exactly for a chain acceptance and the client's output-length range (the renewal probabilities
by recursion, the first token from prefill, the finishing chunk), and :func:`tau_from_stream_ratio` inverts it.

Assumptions (stated where used): per-token time equal across a run's chunks (the ratio of means is then a ratio of
token counts), top-k 1 chain drafts whose conditional acceptance keeps the shape a_{k+1} = a_k x ``decay`` (the
published MTP curve's, :mod:`dsparksim.acceptance.mtp`), output lengths uniform integers in [ceil(R L), L].
"""
from __future__ import annotations

import math

import numpy as np

from dsparksim.errors import ConfigError

__all__ = ["chain_increments", "stream_ratio", "tau_from_stream_ratio", "a1_for_tau", "DECAY_MTP"]

DECAY_MTP = 0.7126 / 0.87     # a2 / a1 of the published MTP curve (dsparksim.acceptance.mtp)


def chain_increments(a1: float, k: int, decay: float = DECAY_MTP) -> np.ndarray:
    """P(a verify step emits j tokens), j = 1..k+1, for a top-k-1 chain of ``k`` drafts with conditional
    acceptance a_1 = ``a1``, a_{i+1} = a_i x ``decay`` (emitted = accepted drafts + the bonus token)."""
    if not 0.0 <= a1 <= 1.0 or k < 1 or not 0.0 <= decay * a1 <= 1.0:
        raise ConfigError("stream", "a1", f"expected a1 in [0, 1], k >= 1 and a1*decay <= 1, got {a1!r}, {k!r}, "
                          f"{decay!r}")
    p = np.zeros(k + 1)
    reach, a = 1.0, a1
    for j in range(k):
        p[j] = reach * (1.0 - a)          # drafts 1..j accepted, draft j+1 rejected: j+1 tokens
        reach *= a
        a *= decay
    p[k] = reach
    return p


def stream_ratio(inc: np.ndarray, interval: int, out_len: int, range_ratio: float = 1.0) -> float:
    """Expected sum(output tokens - 1) / sum(chunks after the first) of a run whose output lengths are uniform
    integers in [ceil(range_ratio x out_len), out_len], each step emitting j tokens with probability inc[j-1]."""
    if interval < 1 or out_len < 2 or not 0 < range_ratio <= 1:
        raise ConfigError("stream", "interval", f"expected interval >= 1, out_len >= 2, range ratio in (0, 1], got "
                          f"{interval!r}, {out_len!r}, {range_ratio!r}")
    inc = np.asarray(inc, float)
    u = np.zeros(out_len + 1)             # u[n]: P(a step ends with exactly n tokens emitted); n = 1 is prefill's
    u[1] = 1.0
    for n in range(2, out_len + 1):
        lo = max(1, n - len(inc))
        u[n] = float(np.dot(u[lo:n][::-1], inc[:n - lo]))
    hit = np.zeros(out_len + 1)
    idx = np.arange(out_len + 1)
    hit[(idx >= 2) & (idx % interval == 1 if interval > 1 else idx >= 2)] = 1.0
    cum = np.cumsum(u * hit)              # expected streamed chunks at lengths 2..n
    lens = np.arange(max(2, math.ceil(range_ratio * out_len)), out_len + 1)
    chunks = cum[lens - 1] + 1.0          # hits strictly below N, plus the finishing chunk at N
    return float((lens - 1).sum() / chunks.sum())


def tau_from_stream_ratio(ratio: float, interval: int, out_len: int, range_ratio: float = 1.0, k: int = 2,
                          decay: float = DECAY_MTP) -> tuple[float, float]:
    """(tau, a1): the chain acceptance whose :func:`stream_ratio` equals ``ratio`` (bisection on a1; tau = the
    mean tokens per verify step). ConfigError when the ratio lies outside what k drafts can produce."""
    f = lambda a: stream_ratio(chain_increments(a, k, decay), interval, out_len, range_ratio)  # noqa: E731
    lo, hi = 0.0, min(1.0, 1.0 / decay) if decay > 1 else 1.0
    r_lo, r_hi = f(lo), f(hi)
    if not (math.isfinite(ratio) and r_lo <= ratio <= r_hi):
        raise ConfigError("stream", "ratio", f"ITL/TPOT {ratio!r} outside [{r_lo:.3f}, {r_hi:.3f}], what {k} chain "
                          f"drafts produce at stream interval {interval}")
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if f(mid) < ratio else (lo, mid)
    a1 = 0.5 * (lo + hi)
    inc = chain_increments(a1, k, decay)
    return float(np.dot(np.arange(1, k + 2), inc)), float(a1)


def a1_for_tau(tau: float, k: int = 2, decay: float = DECAY_MTP) -> float:
    """The chain's a1 whose mean tokens per verify step is ``tau`` (1 <= tau <= what a1 = 1 gives)."""
    g = lambda a: float(np.dot(np.arange(1, k + 2), chain_increments(a, k, decay)))  # noqa: E731
    hi = min(1.0, 1.0 / decay) if decay > 1 else 1.0
    if not (math.isfinite(tau) and 1.0 <= tau <= g(hi)):
        raise ConfigError("stream", "tau", f"expected an acceptance length in [1, {g(hi):.3f}] for {k} chain drafts, "
                          f"got {tau!r}")
    lo = 0.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if g(mid) < tau else (lo, mid)
    return 0.5 * (lo + hi)
