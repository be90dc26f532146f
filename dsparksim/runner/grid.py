"""The measurement grid of `dsparksim measure`: which cells are timed (contexts, request counts, verify lengths,
prefill chunks) and the KV slots they need. No timing and no fitting here (:mod:`.timing`, :mod:`.fitting`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dsparksim.errors import ConfigError
from dsparksim.runner.drift import DEFAULT_GATE, DEFAULT_THRESHOLD
from dsparksim.runner.executor import ExecutorConfig
from dsparksim.traffic.readers import read_lengths

ANCHOR_CONTEXT = 32    # tokens: the short context the cells are also measured at (MeasureConfig.grid_contexts)


@dataclass(frozen=True)
class MeasureConfig:
    model: str = "tiny"
    executor: ExecutorConfig = field(default_factory=ExecutorConfig)
    K: int = 7
    n_reqs: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 24, 28, 32)
    contexts: tuple[int, ...] = (32, 96, 160)
    warmup: int = 2
    reps: int = 5
    block_drafter: str = "dspark"
    mtp1: bool = True
    min_growth: float = 1.05
    name: str | None = None
    live_models: str | None = None   # time live-drafter steps with the trained drafters of this models dir
    prefill: bool = True             # also fit the prefill term (prefill-only cells)
    drift: bool = True               # re-time the reference cell beside every cell and normalise by it
    drift_threshold: float = DEFAULT_THRESHOLD   # a cell whose bracketing reference moved more is re-measured
    drift_attempts: int = 3          # measurements of one cell while the machine drifts past the threshold
    drift_gate: float | None = DEFAULT_GATE   # cells start and end in the machine's fast state (drift.py); None: off
    anchor_context: int = ANCHOR_CONTEXT   # also measured when every context is longer (0: off); see grid_contexts
    # a cell's contexts relative to their mean (quantiles of a workload's context distribution, :func:`context_spread`);
    # None: evenly over [c/2, 3c/2]
    context_spread: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if self.K < 1:
            raise ConfigError("measure", "K", f"must be >= 1, got {self.K}")
        if not self.n_reqs or min(self.n_reqs) < 1 or list(self.n_reqs) != sorted(set(self.n_reqs)):
            raise ConfigError("measure", "n_reqs", f"expected strictly increasing integers >= 1, got {self.n_reqs}")
        if 1 not in self.n_reqs:
            raise ConfigError("measure", "n_reqs", "must include 1 (the staircase must start at M=1)")
        if not self.contexts or min(self.contexts) < 1:
            raise ConfigError("measure", "contexts", f"expected context lengths >= 1, got {self.contexts}")
        if not self.drift_threshold > 0 or self.drift_attempts < 1:
            raise ConfigError("measure", "drift_threshold/drift_attempts", f"need a threshold > 0 and >= 1 attempt, "
                              f"got {self.drift_threshold}/{self.drift_attempts}")
        if self.warmup < 1 or self.reps < 3:
            raise ConfigError("measure", "warmup/reps", f"need warmup >= 1 and reps >= 3, got {self.warmup}/{self.reps}")
        if self.anchor_context < 0:
            raise ConfigError("measure", "anchor_context", f"expected >= 0 (0: off), got {self.anchor_context}")
        if self.context_spread is not None:
            check_spread(self.context_spread, "measure")

    @property
    def grid_contexts(self) -> tuple[int, ...]:
        """The contexts the cells are measured at: ``contexts`` plus ``anchor_context`` when every context is
        longer. V0(M) is the forward's cost with no context, which prefill chunks (from the first one of every
        prompt) and short requests pay; fitted from long contexts only it is an extrapolation to kv = 0, and on
        this CPU it came out 1.5-2x too high at M >= 72 (2026-12-02, contexts 512-1536: the dense part absorbed
        the 24-request cells' 12k-37k KV tokens; prefill-only steps were priced +41%, validation -7% pessimistic)."""
        a = self.anchor_context
        return (a,) + tuple(self.contexts) if a and min(self.contexts) > a else tuple(self.contexts)



def slot_tokens(ctx: int, K: int, warmup: int, reps: int, nL: int | None = None,
                 spread: tuple[float, ...] | None = None) -> int:
    """KV positions one profiling request needs: its longest context + one token per step + the draft block."""
    nL = K + 1 if nL is None else nL
    top = (3 * ctx) // 2 if spread is None else int(np.ceil(ctx * max(spread) / np.mean(spread))) + 1
    return top + 2 + nL * (warmup + reps) + 6 + K + 2


REFERENCE_CELL = {"n_req": 4, "context": 64, "K": 3, "L": 3, "warmup": 2, "reps": 7}


PREFILL_CHUNKS = (16, 32, 64, 128)
PREFILL_PREFIXES = (0, 512)         # tokens already cached before the chunk: its c*s query-key pairs
PREFIX_CAP = 8192                   # (n + 2) KV slots of this many tokens must fit beside the model (GPU: 8B bf16)


def prefill_prefixes(contexts) -> tuple[int, ...]:
    """Cached-prefix lengths of the prefill cells: 0 and the largest measured context (at least 512, at most
    PREFIX_CAP), so the query-key slope is fitted over the contexts the profile will price."""
    return (0, int(min(PREFIX_CAP, max(PREFILL_PREFIXES[1], max(contexts)))))
# decoding requests beside the chunks (the chunk cost's n-dependence). 0 = a prefill-only step, timed whole
# (prefill.only): before, a step with no decoding request was priced as the decode-fitted staircase at its M plus
# an extrapolation of the 1/4/16-request cells to n = 0, and at ~1k-token prompts (6-10 chunks per request) a
# single user's prefill-only steps were priced +17-18% (2026-12-02 c1k validations, runner.refit)
PREFILL_DECODE_ROWS = (0, 1, 4, 16)


def cell_contexts(n: int, ctx: int, spread: tuple[float, ...] | None = None) -> np.ndarray:
    """Per-request contexts of a cell (mean ctx), in a fixed shuffled order: evenly spread over [ctx/2, 3ctx/2], or,
    with ``spread`` (sorted contexts relative to their mean, :func:`context_spread`), ctx times its quantiles at
    (i + 1/2)/n.

    A served batch is heterogeneous, and a batch's attention cost follows its longest contexts, not only their
    sum (the real runner pads each attention group to its longest context): a homogeneous profiling batch would
    under-price real batches with the same total KV tokens, and a batch spread less or more widely than the served
    ones mis-prices them by the difference in padding (2026-12-02: a 32-request step at mean context 88 cost 3-6%
    more spread over 16-160 than over 44-132).
    """
    if n == 1:
        return np.array([ctx], np.int64)
    if spread is None:
        lens = np.rint(np.linspace(0.5 * ctx, 1.5 * ctx, n)).astype(np.int64)
    else:
        q = np.asarray(spread, float) / float(np.mean(spread))
        lens = np.rint(ctx * np.interp((np.arange(n) + 0.5) / n, (np.arange(len(q)) + 0.5) / len(q), q)
                       ).astype(np.int64)
    lens += ctx - int(round(lens.mean()))
    return np.maximum(1, np.random.default_rng(n).permutation(lens))


SPREAD_POINTS = 33


def check_spread(spread, where: str) -> None:
    """A context spread is >= 2 finite positive relative contexts in non-decreasing order."""
    q = np.asarray(spread, float)
    if q.ndim != 1 or len(q) < 2 or not np.all(np.isfinite(q)) or q.min() <= 0 or np.any(np.diff(q) < 0):
        raise ConfigError(where, "context_spread", f"expected >= 2 positive relative contexts in non-decreasing "
                          f"order, got {list(spread)}")


def context_spread(prompt: np.ndarray, output: np.ndarray, points: int = SPREAD_POINTS) -> tuple[float, ...]:
    """The contexts a workload's decoding requests have, relative to their mean: ``points`` quantiles (at
    (j + 1/2)/points) of p + k over every request (p prompt tokens, o output tokens) and every k in [0, o), each
    decode position weighted once, as a served batch samples requests at every stage of their output."""
    p, o = np.asarray(prompt, np.int64), np.asarray(output, np.int64)
    if len(p) == 0 or len(p) != len(o) or p.min() < 1 or o.min() < 1:
        raise ConfigError("measure", "context_spread", "needs >= 1 request with prompt and output tokens >= 1")
    ctx = np.repeat(p, o) + (np.arange(int(o.sum())) - np.repeat(np.cumsum(o) - o, o))
    q = np.quantile(ctx, (np.arange(points) + 0.5) / points)
    return tuple(round(float(x), 4) for x in q / ctx.mean())


def context_spread_from_csv(path: str | Path, points: int = SPREAD_POINTS) -> tuple[float, ...]:
    """:func:`context_spread` of a length-only CSV (num_prefill_tokens/num_decode_tokens, as `dsparksim validate`
    writes lengths.csv), read and checked by the traffic readers (errors name file, line and column)."""
    t = read_lengths(path)
    return context_spread(t.prompt_tokens, t.output_tokens, points)
