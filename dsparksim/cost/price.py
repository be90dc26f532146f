"""A priced step shape: what one engine step is (:class:`StepShape`) and what it costs (:class:`StepPrice`).

One step's price, term by term (the terms' formulas are the profile's lookups, :mod:`dsparksim.cost.profile`)::

    verify    = verify_time(M', 0)                                  staircase at the step's M' = M + pad_tokens
    context   = verify_time(M', kv_read) - verify_time(M', 0)      attention over the KV tokens read
    query_key = seconds_per_query_kv * decode_qk                   long context (decoding rows' query-key pairs)
    prefill   = prefill per token + per query-key pair (+ per token beside each decoding row)
    prefill_chunk    = per chunk (+ per chunk beside each decoding row)
    prefill_drafter  = the drafter's prompt-token update
    drafter          = draft_time(drafter, n_decode, K), or draft_time_exit(drafter, draft_counts, K) when the
                       drafter stopped early (early exit)
    drafter_context  = the drafter's attention over kv_read (drafting steps only)
    overhead         = fixed_overhead_s + batch_overhead(n_decode)

A prefill-only step (no decoding row) of a profile with a measured ``prefill.only`` price has no verify, context
or chunk part: its ``prefill`` part is that measured forward (per step + per token + per query-key pair + per
chunk). Without one it is priced as any other step. A padded engine (``pad_tokens`` > 0: verify lengths padded to the
step's maximum) runs and pays its forward at M + pad_tokens.

:class:`StepPricer` is the one place the terms are summed into the seconds a step takes, in one fixed order (the
engine's clock, the disaggregated prefill pool, the step-log re-pricer and the runner's residuals all read it):
the per-step terms first (``step_overhead``), then the verify term at M, then the long-context pairs. Its
:meth:`StepPricer.step_time` is the same price as a vectorised function of candidate M (the verification policies
search over it); with a dense verify table (context none or linear, the token budget inside the profile) the
per-step terms are folded into one constant first (:class:`DenseStepTime`), else the verify lookup comes first --
the two orders are kept as they were, so every logged price is unchanged to the bit.

:meth:`StepPricer.price` groups the same terms into named parts (``StepPrice``); the parts add up to
``StepPrice.seconds`` up to float rounding of the summation order (1e-12 relative). Shapes may hold arrays (one
entry per step): parts are then arrays, priced in one vectorised pass.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Callable, Mapping, NamedTuple

import numpy as np

__all__ = ["StepShape", "StepPrice", "StepPricer", "DenseStepTime", "chunk_query_keys", "decode_query_keys",
           "PART_NAMES"]

PART_NAMES = ("verify", "context", "query_key", "prefill", "prefill_chunk", "prefill_drafter", "drafter",
              "drafter_context", "overhead")


def chunk_query_keys(tokens: Any, prefix: Any) -> Any:
    """Query-key pairs of a prefill chunk of ``tokens`` tokens after ``prefix`` cached ones (causal attention):
    ``tokens * prefix + tokens (tokens + 1) / 2`` (ints or integer arrays; exact)."""
    return tokens * prefix + tokens * (tokens + 1) // 2


def decode_query_keys(verify: Any, context: Any) -> Any:
    """Query-key pairs of decoding rows verifying ``verify`` drafts over ``context`` cached tokens each: each runs
    1 + L queries, ``(1 + L) c + L (L + 1) / 2`` pairs (elementwise)."""
    return (1 + verify) * context + verify * (verify + 1) // 2


class StepShape(NamedTuple):
    """One engine step as the cost model sees it (ints; or integer arrays of equal length, one entry per step).
    Immutable and typed; a NamedTuple rather than a frozen dataclass because the engine builds one per step (a
    third of the construction time).

    M:              tokens in the target forward (decode rows + verified drafts + prefill tokens)
    n_decode:       decoding requests (each drafts and verifies)
    kv_read:        KV tokens the step reads (all running rows' context, + this step's chunks)
    prefill_tokens: prompt tokens of the step's prefill chunks
    prefill_qk:     the chunks' query-key pairs (:func:`chunk_query_keys`, summed)
    prefill_chunks: how many chunks
    decode_qk:      the decoding rows' query-key pairs (:func:`decode_query_keys`, summed; long-context term)
    drafter, K:     the drafter (None = no drafting) and its block size
    pad_tokens:     verify tokens a padded engine runs beyond M (priced, never verified; 0 = variable-length)
    draft_counts:   early exit of drafting: a K-tuple, requests drafting each position (non-increasing, first =
                    n_decode); None = every decoding row drafted all K. An array shape holds one per step.
    """

    M: Any
    n_decode: Any = 0
    kv_read: Any = 0
    prefill_tokens: Any = 0
    prefill_qk: Any = 0
    prefill_chunks: Any = 0
    decode_qk: Any = 0
    drafter: str | None = None
    K: int = 1
    pad_tokens: Any = 0
    draft_counts: Any = None

    @classmethod
    def prefill_chunk(cls, tokens: int, prefix: int, drafter: str | None, K: int) -> "StepShape":
        """A step that only prefills one chunk of ``tokens`` tokens after ``prefix`` cached ones."""
        return cls(M=tokens, kv_read=prefix + tokens, prefill_tokens=tokens,
                   prefill_qk=chunk_query_keys(tokens, prefix), prefill_chunks=1, drafter=drafter, K=K)

    @classmethod
    def from_log(cls, steps: Mapping[str, Any], drafter: str | None, K: int,
                 names: Mapping[str, str] | None = None) -> "StepShape":
        """The shapes of logged steps (arrays, as logged) from step-log columns: the engine's names (``M``,
        ``n_decode``, ``kv_read``, ``n_prefill_tokens``, ``prefill_qk``, ``prefill_chunks``, ``decode_qk``,
        ``pad_tokens``), or others given by ``names`` (field -> column; a column missing from ``steps`` counts 0).
        ``draft_counts`` (early exit) is read from its column of space-separated counts, empty = none."""
        cols = {"M": "M", "n_decode": "n_decode", "kv_read": "kv_read", "prefill_tokens": "n_prefill_tokens",
                "prefill_qk": "prefill_qk", "prefill_chunks": "prefill_chunks", "decode_qk": "decode_qk",
                "pad_tokens": "pad_tokens"}
        cols.update(names or {})
        n = len(steps["M"])
        get = {f: np.asarray(steps[c]) if c in steps else np.zeros(n, np.int64) for f, c in cols.items()}
        counts = None
        if "draft_counts" in steps:
            counts = [tuple(int(x) for x in str(v).split()) if isinstance(v, str) and v.strip() else None
                      for v in steps["draft_counts"]]
        return cls(**get, drafter=drafter, K=int(K), draft_counts=counts)

    def n_steps(self) -> int:
        """Entries of an array shape (1 for a scalar one)."""
        return int(np.size(self.M))

    def row(self, i: int) -> "StepShape":
        """Entry ``i`` of an array shape, as ints."""
        v = {f: int(np.asarray(getattr(self, f)).reshape(-1)[i]) for f in self._fields
             if f not in ("drafter", "K", "draft_counts")}
        dc = self.draft_counts
        if dc is not None and not (len(dc) and isinstance(dc[0], (int, np.integer))):
            dc = dc[i]                           # an array shape: one entry (a K-tuple or None) per step
        return StepShape(**v, drafter=self.drafter, K=self.K, draft_counts=dc)


@dataclass(frozen=True)
class StepPrice:
    """A step's price in named parts (seconds; arrays for an array shape). ``seconds`` is the step's price as
    the engine charges it (the parts' sum, in the pricer's one summation order)."""

    verify: Any
    context: Any
    query_key: Any
    prefill: Any
    prefill_chunk: Any
    prefill_drafter: Any
    drafter: Any
    drafter_context: Any
    overhead: Any
    shape: StepShape
    pricer: "StepPricer"

    def parts(self) -> dict[str, Any]:
        """{part name: seconds} in :data:`PART_NAMES` order."""
        return {k: getattr(self, k) for k in PART_NAMES}

    def parts_sum(self) -> Any:
        return sum(getattr(self, k) for k in PART_NAMES)

    @cached_property
    def seconds(self) -> Any:
        """The step's price (float; an array for an array shape), exactly as the engine's clock charges it."""
        s = self.shape
        if np.ndim(s.M) == 0:
            return self.pricer.seconds(s)
        return self.pricer.seconds_each(s)


class DenseStepTime:
    """A step's price as a function of M from the dense verify table: ``dense[M] + extra`` (``extra``: every term
    but the verify staircase). ``checked``: every price over M = 1..len(dense)-1 is positive and finite (the
    table's are, and ``extra`` cannot make one otherwise), so a policy may read a slice of them unchecked
    (:meth:`span`)."""

    __slots__ = ("dense", "extra", "checked")

    def __init__(self, dense: np.ndarray, extra: float, lo: float, hi: float) -> None:
        self.dense, self.extra = dense, extra
        # lo > 0 and extra >= 0: every dense[M] + extra >= lo > 0 (rounding is monotone); hi + extra finite
        self.checked = lo > 0 and extra >= 0 and math.isfinite(hi + extra)

    def __call__(self, M: np.ndarray) -> np.ndarray:
        return self.dense[M] + self.extra

    def at(self, M: int) -> float:
        """The price at one M: the same sum as ``self(np.array([M]))[0]``."""
        return float(self.dense[M] + self.extra)

    def span(self, base: int, count: int) -> np.ndarray:
        """Prices at M = base .. base + count - 1 (1 <= base, base + count <= len(dense)): the same numbers as
        ``self(base + arange(count))``."""
        return self.dense[base: base + count] + self.extra


class FlatStepTime:
    """A price that does not depend on M (a prefill-only step with a measured ``prefill.only`` price)."""

    __slots__ = ("t",)

    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self, M: np.ndarray) -> np.ndarray:
        return np.full(np.shape(M), self.t)

    def at(self, M: int) -> float:
        return self.t


class TableStepTime:
    """``verify_time(M, kv_read) + extra``: the profile's verify lookup first (2-D tables, or a token budget the
    dense table does not cover -- extrapolated lookups are counted by the profile)."""

    __slots__ = ("verify_time", "kv", "extra")

    def __init__(self, verify_time: Callable[..., Any], kv: int, extra: float) -> None:
        self.verify_time, self.kv, self.extra = verify_time, kv, extra

    def __call__(self, M: np.ndarray) -> np.ndarray:
        return self.verify_time(M, self.kv) + self.extra

    def at(self, M: int) -> float:
        return float(self(np.array([M]))[0])


class DecodeQKStepTime:
    """Candidate prices with the long-context term: every extra verified token beyond ``m0`` is priced at the
    decoding rows' mean context ``per`` (a 1-D price in M, the paper's SPS(B)); the step itself is charged the
    exact pairs (:meth:`StepPricer.seconds`)."""

    __slots__ = ("base", "sq", "qk0", "per", "m0")

    def __init__(self, base: Any, sq: float, qk0: int, per: float, m0: int) -> None:
        self.base, self.sq, self.qk0, self.per, self.m0 = base, sq, qk0, per, m0

    def __call__(self, M: np.ndarray) -> np.ndarray:
        return self.base(M) + self.sq * (self.qk0 + (np.asarray(M) - self.m0) * self.per)


class StepPricer:
    """Prices steps on one profile for one token budget ``max_tokens`` (None = the profile's largest breakpoint),
    which decides whether the dense verify table is used (see the module doc). ``dense=False``: never use it (the
    verify lookup first, as the disaggregated prefill pool has always summed)."""

    # profile: a dsparksim.cost.profile.CostProfile (not imported: profile.py imports this module)
    def __init__(self, profile: Any, max_tokens: int | None = None, dense: bool = True) -> None:
        self.profile = profile
        self.max_tokens = int(profile.max_tokens if max_tokens is None else max_tokens)
        self.sq = float(profile.seconds_per_query_kv)
        self.spk = float(profile.seconds_per_kv_token or 0.0)
        self._draft_kv: dict[str | None, bool] = {}
        self.dense = self._dense_verify_table() if dense else None

    def _dense_verify_table(self) -> np.ndarray | None:
        """Verify time (context term excluded) for every M in 0..max_tokens, looked up once.

        Policies price hundreds of candidate M values per step; one fancy index into this table replaces a floor
        search per call. Only possible when the context term is additive (none or linear) and the whole range
        lies inside the profile (extrapolated lookups go through the profile so they are counted).
        """
        prof = self.profile
        if prof.context_model not in ("none", "linear"):
            return None
        if self.max_tokens > int(prof.max_tokens) or int(prof.min_tokens) > 1:
            return None
        table = np.full(self.max_tokens + 1, np.nan)
        table[1:] = prof.verify_time(np.arange(1, self.max_tokens + 1), 0)
        body = table[1:]
        ok = bool(np.isfinite(body).all() and (body > 0).all())
        self._dense_lo, self._dense_hi = (float(body.min()), float(body.max())) if ok else (math.nan, math.nan)
        return table

    def drafter_reads_kv(self, drafter: str | None) -> bool:
        """Whether the drafter has a context term (only then is kv_read passed to step_overhead)."""
        r = self._draft_kv.get(drafter)
        if r is None:
            dc = self.profile.drafters.get(drafter) if drafter is not None else None
            r = self._draft_kv[drafter] = bool(dc is not None and dc.seconds_per_kv_token)
        return r

    # ------------------------------------------------------------------ the one summation order
    def step_time(self, shape: StepShape) -> Any:
        """The shape's price as a vectorised function of M (``shape.M`` is ignored), without the long-context
        term: ``f(M_array) -> seconds`` with ``f.at(M) -> float``."""
        _, n_dec, kv, n_pf, pf_qk, n_ch, _, drafter, K, _, counts = shape    # (one unpacking: runs every step)
        prof = self.profile
        if n_dec == 0 and n_pf and prof.prefill_only is not None:
            # a prefill-only step has its own measured price (profile prefill.only), whatever its M
            return FlatStepTime(float(prof.fixed_overhead_s) + prof.prefill_only_time(drafter, n_pf, pf_qk, n_ch))
        reads_kv = self._draft_kv.get(drafter)
        if reads_kv is None:
            reads_kv = self.drafter_reads_kv(drafter)
        if counts is not None:    # early exit: drafting priced for the positions drafted
            nontrim = prof.step_overhead(drafter, n_dec, K, n_pf, pf_qk, n_ch, kv_tokens=kv if reads_kv else 0,
                                         draft_counts=counts)
        elif reads_kv:
            nontrim = prof.step_overhead(drafter, n_dec, K, n_pf, pf_qk, n_ch, kv_tokens=kv)
        else:
            nontrim = prof.step_overhead(drafter, n_dec, K, n_pf, pf_qk, n_ch)
        if self.dense is not None:
            # the per-step terms folded first: the same sum as verify_time(M, kv) + nontrim up to that order
            return DenseStepTime(self.dense, nontrim + self.spk * kv, self._dense_lo, self._dense_hi)
        return TableStepTime(prof.verify_time, kv, nontrim)

    def with_decode_qk(self, base: Any, qk0: int, per: float, m0: int) -> Any:
        """Candidate prices of :meth:`step_time` plus the long-context term (see :class:`DecodeQKStepTime`);
        ``base`` itself when the profile has none."""
        return DecodeQKStepTime(base, self.sq, qk0, per, m0) if self.sq else base

    def charge(self, base: Any, M: int, n_decode: int, decode_qk: int) -> float:
        """The seconds of the step ``base = step_time(shape)`` at its actual M (+ pad_tokens on a padded engine) and
        decoding rows' pairs."""
        t = base.at(M)
        if self.sq and n_decode:
            t += self.sq * decode_qk
        return t

    def seconds(self, shape: StepShape) -> float:
        """One step's price (ints), as the engine charges it."""
        return self.charge(self.step_time(shape), int(shape.M) + int(shape.pad_tokens), int(shape.n_decode),
                           int(shape.decode_qk))

    def seconds_each(self, shape: StepShape) -> np.ndarray:
        """The price of every entry of an array shape (float64 array), each as :meth:`seconds`."""
        return np.array([self.seconds(shape.row(i)) for i in range(shape.n_steps())], dtype=np.float64)

    # ------------------------------------------------------------------ named parts
    def price(self, shape: StepShape) -> StepPrice:
        """The shape's price in named parts (arrays for an array shape; see the module doc)."""
        prof = self.profile
        M, n = (np.asarray(getattr(shape, k), np.int64) for k in ("M", "n_decode"))
        M = M + np.asarray(shape.pad_tokens, np.int64)     # a padded engine runs (and pays) the padded batch
        kv = np.asarray(shape.kv_read)      # as given: a stored cell's KV read may be a (fractional) median
        pf, qk, ch, dqk = (np.asarray(getattr(shape, k), np.float64)
                           for k in ("prefill_tokens", "prefill_qk", "prefill_chunks", "decode_qk"))
        v0 = np.asarray(prof.verify_time(M, np.zeros_like(M)), float)
        ctx = np.asarray(prof.verify_time(M, kv), float) - v0
        q = self.sq * np.where(n > 0, dqk, 0.0)
        dr = shape.drafter
        d = np.asarray(prof.draft_time(dr, n, shape.K), float) if dr is not None else np.zeros(n.shape)
        dc = shape.draft_counts
        if dc is not None and dr is not None:   # early exit: the positions drafted
            each = [dc] if np.ndim(shape.M) == 0 else list(dc)
            ex = np.array([np.nan if c is None else prof.draft_time_exit(dr, c, shape.K) for c in each])
            d = np.where(np.isnan(ex), d, ex).reshape(d.shape)
        d_ctx = (np.asarray(prof.draft_time(dr, n, shape.K, kv), float) - d if self.drafter_reads_kv(dr)
                 else np.zeros(n.shape))
        over = prof.fixed_overhead_s + np.asarray(prof.batch_overhead_time(n), float)
        has = (pf > 0) & (prof.prefill_note is not None)
        nf = n.astype(np.float64)
        p_t = np.where(has, prof.prefill_s_per_token * pf + prof.prefill_s_per_query_key * qk
                       + prof.prefill_s_per_token_per_decode * pf * nf, 0.0)
        p_c = np.where(has, prof.prefill_s_per_chunk * ch + prof.prefill_s_per_chunk_per_decode * ch * nf, 0.0)
        dc = prof.drafters.get(dr) if dr is not None else None
        p_d = np.where(has, (dc.prefill_s_per_token if dc is not None else 0.0) * pf, 0.0)
        if prof.prefill_only is not None:
            # prefill-only steps priced by the profile's own prefill.only terms: the whole forward is the measured
            # term (no verify staircase, no context, no per-chunk part)
            only = (n == 0) & (pf > 0)
            p0, a, b, e = prof.prefill_only
            v0, ctx = np.where(only, 0.0, v0), np.where(only, 0.0, ctx)
            p_t = np.where(only, p0 + a * pf + b * qk + e * ch, p_t)
            p_c = np.where(only, 0.0, p_c)
        parts = dict(verify=v0, context=ctx, query_key=q, prefill=p_t, prefill_chunk=p_c, prefill_drafter=p_d,
                     drafter=d, drafter_context=d_ctx, overhead=over)
        if np.ndim(shape.M) == 0:
            parts = {k: float(np.asarray(v).reshape(-1)[0]) for k, v in parts.items()}
        return StepPrice(**parts, shape=shape, pricer=self)
