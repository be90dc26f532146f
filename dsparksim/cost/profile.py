"""Cost profiles: what one engine step costs, as measured (DESIGN.md section 3).

:meth:`CostProfile.price` prices a :class:`~dsparksim.cost.price.StepShape` in named parts (verify, context,
query-key, prefill, drafter, overhead, ...) that add up to the step time; :mod:`dsparksim.cost.price` sums the
terms below in the one order every caller (engine, prefill pool, re-pricer, residuals, fit) uses.

A profile is provenance metadata + a measured verification staircase + the non-trimmable terms::

    step_time(M, n_req, drafter, K, kv) = verify_time(M, kv)                       # trimmable
                                        + draft_time(drafter, n_req, K, kv)        # paid whatever is verified
                                        + fixed_overhead_s + batch_overhead(n_req) # floor

JSON format ``dsparksim-profile/1`` (also documented in profiles/README.md)::

    {"format": "dsparksim-profile/1",
     "name": "h100-llama2-7b-tp1",
     "metadata": {"device", "model", "source", "method",            # required
                  "dtype", "tensor_parallel", "date", "derivation", ...},  # optional, free-form
     "verify": {"M": [int, strictly increasing, >= 1],
                "time_s": [float > 0, one per M]},                  # 1-D staircase
       or     {"M": [...], "kv_tokens": [int, strictly increasing, first 0],
               "time_s": [[one per M] for each kv_tokens row]},     # 2-D: context axis
     "attention": {"model": "kv_bandwidth", "seconds_per_kv_token": float >= 0, "note": str,   # optional
                   "seconds_per_query_kv": float >= 0},                # optional, long-context term
     "prefill": {"seconds_per_token": float >= 0, "seconds_per_query_key": float >= 0,
                 "seconds_per_chunk": float >= 0, "note": str,                 # optional
                 "seconds_per_token_per_decode": float >= 0,                   # optional inside prefill
                 "seconds_per_chunk_per_decode": float >= 0,                   # (absent = 0)
                 "only": {"seconds_per_step": float > 0, "seconds_per_token": float >= 0,   # optional: steps
                          "seconds_per_query_key": float >= 0, "seconds_per_chunk": float >= 0}},  # with no decode
     "fixed_overhead_s": float >= 0,
     "request_latency_s": float >= 0,                                  # optional (absent = 0)
     "batch_overhead": {"n_req": [int, strictly increasing, >= 1], "time_s": [float >= 0]},    # optional
     "drafters": {"dspark": {"kind": "parallel", "tokens": [...], "time_s": [...],
                             "markov_overhead_frac": 0.008},
                  "eagle3": {"kind": "autoregressive", ...}, "mtp1": {"kind": "mtp", ...},
                  "mtp": {"kind": "chain", ...}}}
                 # any drafter may add "prefill_s_per_token": float >= 0 (its state update per prompt token)
                 # and "seconds_per_kv_token": float >= 0 (its attention over the step's KV tokens read)

Keys starting with "_" are comments and ignored; any other unknown key is an error (it is usually a typo).

Semantics:
  * ``kv_tokens`` is the total number of KV-cache tokens the step's batch reads (sum over its requests).
  * Every table is looked up by FLOOR over its breakpoints (the step that starts at or below the query); a
    riser is never interpolated across. Breakpoints must be strictly increasing; times may be jagged
    (measurement noise, kernel waves), so they need not be monotone.
  * A query below the first or above the last breakpoint raises :class:`ProfileRangeError` unless the profile
    was loaded with ``extrapolate=True``. Then a query above the range uses the last step plus the secant slope
    over the last octave of breakpoints (from the largest breakpoint <= half the last one; with two breakpoints
    their secant -- the secant of only the last two points of a jagged measured staircase is noise and often
    negative), clamped at >= 0 (cost does not fall with more tokens; slope 0 with a single breakpoint). A query
    below the range uses the first step. Every extrapolated query is counted in
    :meth:`CostProfile.extrapolation_report` and logged once per axis -- never silent.
  * Context: a 2-D table (``context_model == "table"``) floors on both axes; a ``kv_bandwidth`` attention
    term (``"linear"``) adds ``seconds_per_kv_token * kv_tokens``; otherwise (``"none"``) kv_tokens is unused.
    The two cannot be combined (that would count attention twice).
  * Long context (optional ``attention.seconds_per_query_kv``, absent = 0): the engine adds that much per
    query-key pair of its decoding requests (request i with context c_i verifying L_i drafts runs 1 + L_i queries
    over its cache: (1 + L_i) c_i + L_i (L_i + 1) / 2 pairs), so verified tokens cost more in long requests.
  * Prefill (optional): a step's prefill chunks cost, beyond the verify term at the step's M,
    ``seconds_per_token * prefill_tokens + seconds_per_query_key * query_key_pairs + seconds_per_chunk * chunks``
    (a chunk of c tokens starting after s cached ones attends c*s + c(c+1)/2 query-key pairs: the quadratic part
    a decode-shaped staircase does not see; a chunk is one more attention group with its bookkeeping), plus
    ``(seconds_per_token_per_decode * prefill_tokens + seconds_per_chunk_per_decode * chunks) * n_decode`` (what a
    chunk costs more beside each decoding request of the same step; absent = 0, so older profiles price
    identically), plus the drafter's ``prefill_s_per_token * prefill_tokens`` (drafters consume the
    target's features of every prompt token). Absent = 0, as in profiles derived from decode-only tables.
  * Prefill-only steps (optional ``prefill.only``): a step with no decoding request costs
    ``only.seconds_per_step + only.seconds_per_token * prefill_tokens + only.seconds_per_query_key *
    query_key_pairs + only.seconds_per_chunk * chunks`` (its whole forward and sampling, measured as such) plus
    the fixed overhead and the drafter's ``prefill_s_per_token * prefill_tokens``, instead of the verify term at
    its M plus the prefill terms: the staircase is fitted on decode-shaped batches and priced a measured CPU
    prefill-only step 1.1-1.8x its time (2026-12-02). Absent: the verify term + prefill terms, as before.
  * Request latency (optional ``request_latency_s``, absent = 0): the serving stack's latency outside the engine's
    step loop (HTTP, tokenization, detokenization, streaming) as a benchmark CLIENT sees it: the benchmark client's
    view (``dsparksim bench replay``, :mod:`dsparksim.bench.client`) adds it to every request's TTFT and E2E (not
    to TPOT) and to the run's duration; the engine does not see it (a closed-loop client's next request reaches the
    engine when the previous one finishes there), and ``run``/``frontier``/``plan`` report engine-side times.
  * Drafting: ``parallel`` = one drafter forward over n_req*K tokens, times (1 + markov_overhead_frac);
    ``autoregressive`` = K sequential forwards of n_req tokens; ``mtp`` = one forward of n_req tokens (K must
    be 1). ``drafter=None`` means no drafting (plain decoding).
  * Drafter context (optional ``drafters.<name>.seconds_per_kv_token``, absent = 0, so older profiles price
    identically): a drafting step (n_req > 0) adds ``seconds_per_kv_token * kv_tokens``, the drafter's attention
    over the context. ``kv_tokens`` is the step's whole kv_read (the same quantity the target's attention term
    uses and the step log records): in a decode-only step that is exactly the decoding requests' context; in a
    mixed step it also counts the prefill chunks' prefixes, which the drafter's state update attends too. It does
    not depend on the verify length, so policies see it as a per-step constant.
"""
from __future__ import annotations

from importlib.resources import files
import dataclasses
import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from dsparksim.cost.price import StepPrice, StepPricer, StepShape
from dsparksim.errors import ConfigError, InputError
from dsparksim.io.textio import MAX_EXACT_INT, finite_float, is_file, loads_json, escape_controls, not_a_file, read_text

__all__ = [
    "FORMAT", "DRAFTER_KINDS", "CostProfile", "DrafterCost", "ProfileRangeError",
    "load_profile", "list_profiles", "save_profile", "profile_to_dict", "profile_from_dict", "shipped_dir",
]

FORMAT = "dsparksim-profile/1"
DRAFTER_KINDS = ("parallel", "autoregressive", "mtp", "chain")
REQUIRED_METADATA = ("device", "model", "source", "method")
INT_METADATA = ("kv_capacity_tokens", "max_model_len")   # optional; when given, positive integers
_TOP_KEYS = {"format", "name", "metadata", "verify", "attention", "prefill", "fixed_overhead_s", "batch_overhead",
             "drafters", "request_latency_s"}

log = logging.getLogger(__name__)


class ProfileRangeError(ConfigError):
    """A cost lookup outside the profile's measured range (and extrapolation was not enabled)."""

    def __init__(self, profile: str, axis: str, value: float, lo: float, hi: float):
        self.axis, self.value, self.lo, self.hi = axis, value, lo, hi
        v = int(value) if float(value).is_integer() else value
        super().__init__(
            f"profile '{profile}'", axis,
            f"{v} is outside the measured range [{_num(lo)}, {_num(hi)}]; enable extrapolation explicitly "
            "(extrapolate=True / EngineConfig.extrapolate) to extend the last step and have it reported, "
            "or keep the run inside the range (e.g. a smaller token budget)")


def _num(x: float) -> Any:
    return int(x) if float(x).is_integer() else x


@dataclass(frozen=True, eq=False)
class DrafterCost:
    """Drafting cost of one drafter: time of ONE drafter forward at `tokens` tokens (floor lookup)."""

    kind: str
    tokens: np.ndarray
    time_s: np.ndarray
    markov_overhead_frac: float = 0.0
    note: str = ""
    prefill_s_per_token: float = 0.0
    seconds_per_kv_token: float = 0.0   # drafter attention per KV token the step reads (absent = 0)


@dataclass
class _ExtrapolationLog:
    """Mutable record of extrapolated lookups; lives inside the frozen profile (one per profile copy)."""

    axes: dict[str, dict[str, Any]] = field(default_factory=dict)
    calls: int = 0  # record() calls so far: lets a caller tell whether a lookup extrapolated

    def record(self, axis: str, x: np.ndarray, lo: float, hi: float) -> None:
        self.calls += 1
        below, above = x[x < lo], x[x > hi]
        e = self.axes.setdefault(axis, {"count": 0, "below": 0, "above": 0, "min_seen": None, "max_seen": None,
                                        "range": [_num(lo), _num(hi)]})
        if e["count"] == 0:
            log.warning("cost profile: extrapolating %s outside its measured range [%s, %s] (value %s)",
                        axis, _num(lo), _num(hi), _num(float(above.max() if above.size else below.min())))
        e["count"] += int(below.size + above.size)
        e["below"] += int(below.size)
        e["above"] += int(above.size)
        if below.size:
            m = _num(float(below.min()))
            e["min_seen"] = m if e["min_seen"] is None else min(e["min_seen"], m)
        if above.size:
            m = _num(float(above.max()))
            e["max_seen"] = m if e["max_seen"] is None else max(e["max_seen"], m)


def _ro(a: np.ndarray) -> np.ndarray:
    a = np.array(a)
    a.setflags(write=False)
    return a


@dataclass(frozen=True, eq=False)
class CostProfile:
    """A loaded, validated cost profile. Build with :func:`load_profile` or :func:`profile_from_dict`.

    verify_time_s is 1-D (len(verify_M),) or 2-D (len(kv_tokens), len(verify_M)).
    batch_overhead is (n_req breakpoints, seconds) or None. drafters maps name -> :class:`DrafterCost`.
    """

    name: str
    metadata: dict[str, Any]
    verify_M: np.ndarray
    verify_time_s: np.ndarray
    kv_tokens: np.ndarray | None
    seconds_per_kv_token: float | None
    fixed_overhead_s: float
    batch_overhead: tuple[np.ndarray, np.ndarray] | None
    drafters: dict[str, DrafterCost]
    source: str
    extrapolate: bool = False
    attention_note: str = ""
    prefill_s_per_token: float = 0.0
    prefill_s_per_query_key: float = 0.0
    prefill_s_per_chunk: float = 0.0
    prefill_s_per_token_per_decode: float = 0.0
    prefill_s_per_chunk_per_decode: float = 0.0
    prefill_note: str | None = None       # None = the profile has no prefill term
    # prefill.only: (seconds_per_step, per_token, per_query_key, per_chunk) of a step with no decoding request
    prefill_only: tuple[float, float, float, float] | None = None
    seconds_per_query_kv: float = 0.0     # long-context attention term per decode query-key pair
    request_latency_s: float = 0.0        # client-side latency outside the step loop (benchmark client's view)
    _extrap: _ExtrapolationLog = field(default_factory=_ExtrapolationLog, repr=False, compare=False)
    # Per-copy caches of the hot per-step lookups (not init: every copy, e.g. with_extrapolation, starts empty).
    _memo: dict[Any, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    # ------------------------------------------------------------------ properties
    @property
    def max_tokens(self) -> int:
        """Largest verification-batch breakpoint M (the profile's measured range ends here)."""
        return int(self.verify_M[-1])

    @property
    def min_tokens(self) -> int:
        return int(self.verify_M[0])

    @property
    def context_model(self) -> str:
        """"table" (2-D kv axis), "linear" (kv_bandwidth term) or "none" (kv_tokens ignored)."""
        if self.kv_tokens is not None:
            return "table"
        if self.seconds_per_kv_token is not None:
            return "linear"
        return "none"

    # ------------------------------------------------------------------ copies / reports
    def with_extrapolation(self, flag: bool) -> "CostProfile":
        """A copy with extrapolation on/off and a fresh extrapolation report."""
        return dataclasses.replace(self, extrapolate=bool(flag), _extrap=_ExtrapolationLog())

    def extrapolation_report(self) -> dict[str, Any]:
        """{"enabled", "extrapolated" (any lookup left the range), "axes": {axis: {count, below, above,
        min_seen, max_seen, range}}}. Axes: "verify.M", "verify.kv_tokens", "batch_overhead.n_req",
        "drafters.<name>.tokens"."""
        axes = {k: dict(v) for k, v in self._extrap.axes.items()}
        return {"enabled": self.extrapolate, "extrapolated": any(v["count"] for v in axes.values()), "axes": axes}

    # ------------------------------------------------------------------ lookups
    def _floor(self, axis: np.ndarray, values: np.ndarray, x: np.ndarray, name: str) -> np.ndarray:
        """Floor lookup of 1-D `values` at x (any shape) with range rules; returns float64 of x's shape."""
        lo, hi = float(axis[0]), float(axis[-1])
        below, above = x < lo, x > hi
        if below.any() or above.any():
            if not self.extrapolate:
                bad = float(x[below][0] if below.any() else x[above].max())
                raise ProfileRangeError(self.name, name, bad, lo, hi)
            self._extrap.record(name, x, lo, hi)
        idx = np.clip(np.searchsorted(axis, x, side="right") - 1, 0, len(axis) - 1)
        out = values[idx].astype(np.float64)
        if above.any():
            out = np.where(above, values[-1] + _tail_slope(axis, values) * (x - hi), out)
        return out

    def verify_time(self, M: Any, kv_tokens: Any = 0) -> Any:
        """Target verification forward time (s) at batch M (array or int) and total KV tokens read.

        Returns a float for scalar inputs, else an array of the broadcast shape.
        """
        t = self._verify_fast(M, kv_tokens)
        if t is not None:
            return t
        Mx = _as_query(M, self.name, "M")
        kv = _as_query(kv_tokens, self.name, "kv_tokens")
        if np.any(kv < 0):
            raise ConfigError(f"profile '{self.name}'", "kv_tokens", f"must be >= 0, got {_num(float(kv.min()))}")
        Mb, kvb = np.broadcast_arrays(Mx, kv)
        if self.kv_tokens is None:
            t = self._floor(self.verify_M, self.verify_time_s, Mb, "verify.M")
            if self.seconds_per_kv_token is not None:
                t = t + self.seconds_per_kv_token * kvb
        else:
            t = self._table2d(Mb, kvb)
        return _scalar_or(t, M, kv_tokens)

    def _verify_fast(self, M: Any, kv: Any) -> np.ndarray | None:
        """verify_time for the per-step query (an integer array of M inside the measured range, one in-range
        kv number), bitwise equal to the general path: the same floor indices and the same float operations.
        None = take the general path (scalars, floats, anything out of range, errors, extrapolation records)."""
        if not (isinstance(M, np.ndarray) and M.ndim >= 1 and M.size and M.dtype.kind in "iu"):
            return None
        if isinstance(kv, (bool, np.bool_)) or not isinstance(kv, (int, float, np.integer, np.floating)):
            return None
        kvf = float(kv)
        if not (math.isfinite(kvf) and kvf >= 0):
            return None
        if int(M.min()) < int(self.verify_M[0]) or int(M.max()) > int(self.verify_M[-1]):
            return None
        col = self._memo.get("verify.col")
        if col is None:  # floor index of every integer M in 0..max (breakpoints are ints <= 2^53: exact)
            hi = int(self.verify_M[-1])
            if hi > 1 << 20:
                return None
            col = np.searchsorted(self.verify_M, np.arange(hi + 1), side="right") - 1
            self._memo["verify.col"] = col
        ci = col[M]
        if self.kv_tokens is None:
            t = self.verify_time_s[ci].astype(np.float64)
            if self.seconds_per_kv_token is not None:
                t = t + self.seconds_per_kv_token * kvf
            return t
        if kvf > float(self.kv_tokens[-1]):
            return None
        r = int(np.searchsorted(self.kv_tokens, kvf, side="right")) - 1
        return self.verify_time_s[r][ci]

    def _table2d(self, M: np.ndarray, kv: np.ndarray) -> np.ndarray:
        tab, kva, Ma = self.verify_time_s, self.kv_tokens, self.verify_M
        # Floor on M for every kv row at once (range rules recorded once), then floor on kv.
        lo, hi = float(Ma[0]), float(Ma[-1])
        below, above = M < lo, M > hi
        if below.any() or above.any():
            if not self.extrapolate:
                bad = float(M[below][0] if below.any() else M[above].max())
                raise ProfileRangeError(self.name, "verify.M", bad, lo, hi)
            self._extrap.record("verify.M", M, lo, hi)
        ci = np.clip(np.searchsorted(Ma, M, side="right") - 1, 0, len(Ma) - 1)
        rows = tab[:, ci]  # (n_kv, *M.shape)
        if above.any():
            slopes = np.array([_tail_slope(Ma, tab[r]) for r in range(tab.shape[0])])
            ext = tab[:, -1].reshape((-1,) + (1,) * M.ndim) + slopes.reshape((-1,) + (1,) * M.ndim) * (M - hi)
            rows = np.where(above, ext, rows)
        khi = float(kva[-1])
        kabove = kv > khi
        if kabove.any():
            if not self.extrapolate:
                raise ProfileRangeError(self.name, "verify.kv_tokens", float(kv.max()), 0.0, khi)
            self._extrap.record("verify.kv_tokens", kv, 0.0, khi)
        r = np.clip(np.searchsorted(kva, kv, side="right") - 1, 0, len(kva) - 1)
        out = np.take_along_axis(rows, r[None, ...], axis=0)[0]
        if kabove.any():
            if len(kva) > 1:
                j = _tail_index(kva)
                slope = np.maximum((rows[-1] - rows[j]) / float(kva[-1] - kva[j]), 0.0)
            else:
                slope = np.zeros_like(rows[-1])
            out = np.where(kabove, rows[-1] + slope * (kv - khi), out)
        return out

    def sps(self, M: Any) -> Any:
        """Target steps per second at batch M, 1 / verify_time(M) (no context term, no floor)."""
        t = self.verify_time(M)
        return 1.0 / t

    def drafter(self, name: str) -> DrafterCost:
        """The DrafterCost for `name`; ConfigError naming the profile and the drafters it has."""
        if name in self.drafters:
            return self.drafters[name]
        if not self.drafters:
            raise ConfigError(
                f"profile '{self.name}' ({self.source})", "drafters",
                f"has no drafter costs, so drafter '{name}' cannot be priced. Add a 'drafters' section to the "
                "profile JSON, or re-import it with --drafters-from PROFILE to copy another profile's drafters")
        raise ConfigError(f"profile '{self.name}' ({self.source})", "drafters",
                          f"unknown drafter '{name}'; this profile has: {', '.join(sorted(self.drafters))}")

    def draft_time(self, drafter: str | None, n_req: Any, K: int, kv_tokens: Any = 0) -> Any:
        """Drafting time (s) of one step for n_req decoding requests with block size K, reading ``kv_tokens``
        KV tokens (the drafter's context term; see module doc)."""
        if drafter is None:
            return _scalar_or(np.zeros_like(_as_query(n_req, self.name, "n_req")), n_req)
        d = self.drafter(drafter)
        n = _as_query(n_req, self.name, "n_req")
        K = int(K)
        if K < 1:
            raise ConfigError(f"profile '{self.name}'", "K", f"block size must be >= 1, got {K}")
        axis = f"drafters.{drafter}.tokens"
        if d.kind == "parallel":
            tok = n * K
            t = self._floor_pos(d.tokens, d.time_s, tok, axis) * (1.0 + d.markov_overhead_frac)
        elif d.kind == "autoregressive":
            t = K * self._floor_pos(d.tokens, d.time_s, n, axis)
        elif d.kind == "chain":
            # EAGLE-style chain as SGLang/vLLM run it: the first draft token comes from a forward over the
            # K + 1 tokens per request the target just verified (SGLang's draft extend), then K - 1 forwards
            t = self._floor_pos(d.tokens, d.time_s, n * (K + 1), axis) \
                + (K - 1) * self._floor_pos(d.tokens, d.time_s, n, axis)
        else:  # mtp
            if K != 1:
                raise ConfigError(f"profile '{self.name}'", f"drafters.{drafter}",
                                  f"an 'mtp' drafter makes one forward per step and only supports K=1, got K={K}; "
                                  "model a deeper MTP chain as a 'chain' (or 'autoregressive') drafter")
            t = self._floor_pos(d.tokens, d.time_s, n, axis)
        if d.seconds_per_kv_token:
            t = t + self._draft_kv(d, n, kv_tokens)
        return _scalar_or(t, n_req)

    def draft_time_exit(self, drafter: str, counts: Any, K: int, kv_tokens: int = 0) -> float:
        """Drafting time (s) of one step whose drafter stopped early (early exit, :mod:`dsparksim.sim.early_exit`):
        ``counts[j]`` decoding requests drafted position j + 1 (j = 0..K-1; non-increasing, ``counts[0]`` = all
        decoding requests, :func:`dsparksim.sim.early_exit.position_counts`).

        * ``autoregressive``: one forward per position over the requests still drafting it (position j + 1 costs
          the forward at ``counts[j]`` tokens);
        * ``parallel``: the backbone's one forward over n*K tokens is paid whole (it computes every position at
          once, before any confidence exists); only the Markov head's share, ``markov_overhead_frac``, shrinks to
          the positions drafted;
        * ``mtp``: one forward (K = 1; nothing to stop).

        With every request drafting all K positions this is :meth:`draft_time` (autoregressive: the same terms
        summed instead of multiplied by K)."""
        d = self.drafter(drafter)
        c = np.asarray(counts, np.int64).reshape(-1)
        K = int(K)
        if c.size != K or (K and (c.min() < 0 or np.any(np.diff(c) > 0))):
            raise ConfigError(f"profile '{self.name}'", "counts", f"expected K={K} non-increasing counts of "
                              f"requests drafting each position, got {c.tolist()}")
        n = int(c[0]) if K else 0
        if n == 0:
            return 0.0
        axis = f"drafters.{drafter}.tokens"
        if d.kind == "autoregressive":
            t = float(self._floor_pos(d.tokens, d.time_s, c[c > 0], axis).sum())
        elif d.kind == "parallel":
            base = float(self._floor_pos(d.tokens, d.time_s, np.array([n * K]), axis)[0])
            t = base * (1.0 + d.markov_overhead_frac * (float(c.sum()) / (n * K)))
        else:  # mtp: one forward of n tokens
            t = float(self._floor_pos(d.tokens, d.time_s, np.array([n]), axis)[0])
        if d.seconds_per_kv_token:
            t += float(self._draft_kv(d, np.array([n]), kv_tokens)[0])
        return t

    def _draft_kv(self, d: DrafterCost, n: np.ndarray, kv_tokens: Any) -> np.ndarray:
        """The drafter's context term: seconds_per_kv_token * kv_tokens on drafting steps (n > 0), else 0."""
        kv = _as_query(kv_tokens, self.name, "kv_tokens")
        if np.any(kv < 0):
            raise ConfigError(f"profile '{self.name}'", "kv_tokens", f"must be >= 0, got {_num(float(kv.min()))}")
        return np.where(n > 0, d.seconds_per_kv_token * kv, 0.0)

    def _floor_pos(self, axis: np.ndarray, values: np.ndarray, x: np.ndarray, name: str) -> np.ndarray:
        """Floor lookup where x == 0 costs nothing (no requests -> no forward)."""
        if np.any(x < 0):
            raise ConfigError(f"profile '{self.name}'", name, f"must be >= 0, got {_num(float(x.min()))}")
        zero = x == 0
        if zero.all():
            return np.zeros(x.shape)
        t = self._floor(axis, values, np.where(zero, axis[0], x), name)
        return np.where(zero, 0.0, t)

    def batch_overhead_time(self, n_req: Any) -> Any:
        """Per-batch-size non-trimmable term alpha(n_req) (floor lookup); 0 without a batch axis or n_req=0."""
        n = _as_query(n_req, self.name, "n_req")
        if self.batch_overhead is None:
            return _scalar_or(np.zeros(n.shape), n_req)
        ax, val = self.batch_overhead
        return _scalar_or(self._floor_pos(ax, val, n, "batch_overhead.n_req"), n_req)

    def nontrimmable_time(self, drafter: str | None, n_req: Any, K: int, kv_tokens: Any = 0) -> Any:
        """draft_time + fixed_overhead_s + batch overhead: what a step costs whatever is verified.

        Integer (n_req, K) queries -- one per engine step -- are memoised per (drafter, n_req, K); a lookup that
        raised or extrapolated is never stored, so errors and extrapolation reports are as without the memo.
        The drafter's context term (``kv_tokens``) is added outside the memo (it changes every step).
        """
        d = self.drafters.get(drafter) if drafter is not None else None
        if d is not None and d.seconds_per_kv_token:
            t = self._nontrim_memo(drafter, n_req, K)
            ints = (int, np.integer)
            if isinstance(n_req, ints) and isinstance(kv_tokens, ints) and isinstance(t, float):
                # one engine step's scalar query: the same sum without the array round trip (it is priced on
                # the real runner's host loop every step, which the profiling cells price with a trivial profile)
                if kv_tokens < 0:
                    raise ConfigError(f"profile '{self.name}'", "kv_tokens", f"must be >= 0, got {kv_tokens}")
                return t + d.seconds_per_kv_token * float(kv_tokens) if n_req > 0 else t
            return _scalar_or(t + self._draft_kv(d, _as_query(n_req, self.name, "n_req"), kv_tokens), n_req, kv_tokens)
        return self._nontrim_memo(drafter, n_req, K)

    def _nontrim_memo(self, drafter: str | None, n_req: Any, K: int) -> Any:
        ints = (int, np.integer)
        if isinstance(n_req, ints) and isinstance(K, ints) and not isinstance(n_req, bool):
            key = ("nontrim", drafter, int(n_req), int(K))
            t = self._memo.get(key)
            if t is None:
                seen = self._extrap.calls
                t = self._nontrimmable(drafter, n_req, K)
                if self._extrap.calls == seen:
                    self._memo[key] = t
            return t
        return self._nontrimmable(drafter, n_req, K)

    def _nontrimmable(self, drafter: str | None, n_req: Any, K: int) -> Any:
        d = self.draft_time(drafter, n_req, K)    # kv_tokens = 0: the context term is added by the caller
        return d + self.fixed_overhead_s + self.batch_overhead_time(n_req)

    def prefill_time(self, drafter: str | None, prefill_tokens: float, query_keys: float, chunks: int = 1,
                     n_decode: int = 0) -> float:
        """Extra seconds of a step's prefill chunks beyond the verify term, beside ``n_decode`` decoding requests
        (0 without a prefill term)."""
        t = (self.prefill_s_per_token * prefill_tokens + self.prefill_s_per_query_key * query_keys
             + self.prefill_s_per_chunk * chunks)
        if n_decode:
            t += (self.prefill_s_per_token_per_decode * prefill_tokens
                  + self.prefill_s_per_chunk_per_decode * chunks) * n_decode
        if drafter is not None and drafter in self.drafters:
            t += self.drafters[drafter].prefill_s_per_token * prefill_tokens
        return float(t)

    def prefill_only_time(self, drafter: str | None, prefill_tokens: float, query_keys: float,
                          chunks: int = 1) -> float | None:
        """A prefill-only step's price without the fixed overhead (``prefill.only`` + the drafter's prompt-token
        term), or None when the profile has no ``prefill.only`` (then it is the verify term + prefill terms)."""
        if self.prefill_only is None:
            return None
        p0, a, b, e = self.prefill_only
        t = p0 + a * prefill_tokens + b * query_keys + e * chunks
        if drafter is not None and drafter in self.drafters:
            t += self.drafters[drafter].prefill_s_per_token * prefill_tokens
        return float(t)

    def step_time(self, M: Any, n_req: Any, drafter: str | None, K: int, kv_tokens: Any = 0) -> Any:
        """Whole decode step without prefill: verify_time(M, kv_tokens) + nontrimmable_time(drafter, n_req, K,
        kv_tokens)."""
        return self.verify_time(M, kv_tokens) + self.nontrimmable_time(drafter, n_req, K, kv_tokens)

    def step_overhead(self, drafter: str | None, n_req: int, K: int, prefill_tokens: int = 0,
                      query_keys: int = 0, chunks: int = 0, kv_tokens: int = 0, draft_counts: Any = None) -> float:
        """Everything one engine step costs beyond verify_time(M, context) -- the one place of the step formula:
        drafting + fixed + batch overhead for ``n_req`` decoding requests (a prefill-only step, n_req = 0, pays
        the fixed overhead only: nothing is drafted) plus the prefill terms of its chunks, if the profile has them.
        A step's price is ``verify_time(M, context) + step_overhead(...)``, summed by
        :class:`dsparksim.cost.price.StepPricer` (:meth:`price` gives it in named parts).
        ``kv_tokens`` (the step's kv_read) prices the drafter's context term, if its profile entry has one.
        ``draft_counts``: the drafter stopped early (requests drafting each position): drafting is
        :meth:`draft_time_exit` instead of :meth:`draft_time`."""
        if draft_counts is not None and n_req and drafter is not None:
            t = (self.draft_time_exit(drafter, draft_counts, K, kv_tokens) + self.fixed_overhead_s
                 + float(self.batch_overhead_time(n_req)))
        else:
            t = float(self.nontrimmable_time(drafter, n_req, K, kv_tokens)) if n_req else float(self.fixed_overhead_s)
        if prefill_tokens and self.prefill_note is not None:
            t += self.prefill_time(drafter, prefill_tokens, query_keys, chunks, n_req)
        return t

    def pricer(self, max_tokens: int | None = None) -> StepPricer:
        """The :class:`~dsparksim.cost.price.StepPricer` of this profile for a token budget (None = the largest
        breakpoint; it decides whether the dense verify table prices candidates), built once per budget."""
        key = ("pricer", max_tokens)
        p = self._memo.get(key)
        if p is None:
            p = self._memo[key] = StepPricer(self, max_tokens)
        return p

    def price(self, shape: StepShape, max_tokens: int | None = None) -> StepPrice:
        """One step's (or an array of steps') price in named parts that add up to the step time
        (:mod:`dsparksim.cost.price`); ``max_tokens``: the run's token budget (see :meth:`pricer`)."""
        return self.pricer(max_tokens).price(shape)

    def __repr__(self) -> str:
        return (f"<CostProfile {self.name!r} M=[{self.min_tokens},{self.max_tokens}] ({len(self.verify_M)} steps), "
                f"context={self.context_model}, drafters={sorted(self.drafters)}>")


def _tail_index(axis: np.ndarray) -> int:
    """Start of the tail secant: the largest breakpoint <= half the last one (the last octave).

    Measured staircases are jagged, so the secant of the last two breakpoints is noise (often negative); the
    secant over the last doubling of the axis follows the trend. With two breakpoints it is their secant.
    """
    j = int(np.searchsorted(axis, axis[-1] / 2.0, side="right")) - 1
    return max(min(j, len(axis) - 2), 0)


def _tail_slope(axis: np.ndarray, values: np.ndarray) -> float:
    """Slope used above the last breakpoint: secant over the last octave, clamped at >= 0 (0 if one point)."""
    if len(axis) < 2:
        return 0.0
    j = _tail_index(axis)
    return max(float(values[-1] - values[j]) / float(axis[-1] - axis[j]), 0.0)


def _short(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 80 else r[:77] + "..."


def _as_query(x: Any, profile: str, name: str) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    if not np.all(np.isfinite(a)):
        raise ConfigError(f"profile '{profile}'", name, f"must be finite, got {x!r}")
    return a


def _scalar_or(t: np.ndarray, *inputs: Any) -> Any:
    if all(np.ndim(i) == 0 for i in inputs):
        return float(np.asarray(t).reshape(-1)[0]) if np.size(t) else float("nan")
    return np.asarray(t, dtype=np.float64)


# what to do with a benchmark's results handed over as a profile (docs/from-benchmark-to-frontier.md)
FIT_HINT = ("learn a profile from benchmark runs with `dsparksim bench import FILE... --out runs.csv`, then "
            "`dsparksim profile fit runs.csv --model CONFIG --gpu GPU --out P.json`, and pass P.json "
            "(docs/from-benchmark-to-frontier.md)")


def _bench_result(d: Mapping) -> bool:
    """Whether a JSON object is a benchmark's result (vllm bench serve / sglang bench_serving): its keys."""
    return {"model_id", "num_prompts"} <= set(d) or {"dataset_name", "completed"} <= set(d)


def _bench_jsonl(text: str) -> bool:
    """Whether ``text``, no single JSON value, is JSON lines whose first is a benchmark's result (sglang
    bench_serving appends one per run)."""
    first = text.lstrip().split("\n", 1)[0]
    try:
        d = json.loads(first)
    except (ValueError, RecursionError):
        return False
    return isinstance(d, Mapping) and _bench_result(d)


# ====================================================================== parsing / validation
class _Checker:
    """Validation helpers that raise InputError naming the file, the field and the index."""

    def __init__(self, source: str):
        self.source = source

    def fail(self, fld: str, msg: str) -> InputError:
        return InputError(self.source, escape_controls(fld), escape_controls(msg))

    def get(self, d: Mapping[str, Any], key: str, prefix: str = "", required: bool = True) -> Any:
        fld = f"{prefix}{key}"
        if not isinstance(d, Mapping):
            raise self.fail(prefix.rstrip("."), f"expected an object, got {type(d).__name__}")
        if key not in d:
            if required:
                raise self.fail(fld, f"missing (present keys: {', '.join(sorted(map(str, d))) or 'none'})")
            return None
        return d[key]

    def number(self, v: Any, fld: str, lo: float = 0.0, strict: bool = False) -> float:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise self.fail(fld, f"expected a number, got {_short(v)}")
        f = finite_float(v)
        if f is None or f < lo or (strict and f <= lo):
            raise self.fail(fld, f"expected a finite number {'>' if strict else '>='} {_num(lo)}, got {v!r}")
        return f

    def count(self, v: Any, fld: str) -> int:
        """A positive integer (an integral float such as 1000.0 is accepted as 1000; 1000.7 is an error)."""
        ok = not isinstance(v, bool) and (isinstance(v, int) or (isinstance(v, float) and v.is_integer()))
        if not ok or not 1 <= v <= MAX_EXACT_INT:
            raise self.fail(fld, f"expected a positive integer number of tokens (<= 2^53-1), got {_short(v)}"
                            + (" (a fraction is an error, never truncated)" if isinstance(v, float) else ""))
        return int(v)

    def breakpoints(self, v: Any, fld: str, first_min: int = 1, first_exact: int | None = None) -> np.ndarray:
        if not isinstance(v, list):
            raise self.fail(fld, f"expected a list of integers, got {type(v).__name__}")
        if not v:
            raise self.fail(fld, "breakpoints are empty: at least one measured point is required")
        for i, x in enumerate(v):
            if isinstance(x, bool) or not isinstance(x, int):
                raise self.fail(fld, f"(index {i}): expected an integer breakpoint, got {_short(x)}")
            if x > MAX_EXACT_INT:
                raise self.fail(fld, f"(index {i}): expected a breakpoint <= {MAX_EXACT_INT} (2^53-1), got {_short(x)}")
        if first_exact is not None and v[0] != first_exact:
            raise self.fail(fld, f"(index 0): the first breakpoint must be {first_exact}, got {v[0]}")
        if v[0] < first_min:
            raise self.fail(fld, f"(index 0): breakpoints must be >= {first_min}, got {v[0]}")
        for i in range(1, len(v)):
            if v[i] <= v[i - 1]:
                raise self.fail(fld, f"(index {i}): breakpoints must be strictly increasing, got {v[i]} after "
                                     f"{v[i - 1]}")
        return np.asarray(v, dtype=np.int64)

    def times(self, v: Any, fld: str, n: int, allow_zero: bool = False) -> np.ndarray:
        if not isinstance(v, list):
            raise self.fail(fld, f"expected a list of {n} numbers, got {type(v).__name__}")
        if len(v) != n:
            raise self.fail(fld, f"length mismatch: {len(v)} times for {n} breakpoints")
        for i, x in enumerate(v):
            f = finite_float(x)
            if f is None or (f < 0 if allow_zero else f <= 0):
                want = ">= 0" if allow_zero else "> 0"
                raise self.fail(fld, f"(index {i}): expected a finite time {want} in seconds, got {_short(x)}")
        return np.asarray(v, dtype=np.float64)


def _finite_json(c: _Checker, v: Any, fld: str) -> None:
    """Fail on the first NaN/Infinity inside a free-form JSON value (strict JSON cannot carry them)."""
    if isinstance(v, float) and not math.isfinite(v):
        raise c.fail(fld, f"expected a finite number (strict JSON has no NaN/Infinity), got {v!r}")
    if isinstance(v, Mapping):
        for k, x in v.items():
            _finite_json(c, x, f"{fld}.{k}")
    elif isinstance(v, list):
        for i, x in enumerate(v):
            _finite_json(c, x, f"{fld}[{i}]")


def _parse_head(c: _Checker, d: Any) -> str:
    """The top level: an object of the right format with known keys; returns the profile's name."""
    if not isinstance(d, Mapping):
        raise c.fail("", f"expected a JSON object at the top level, got {type(d).__name__}")
    if "format" not in d and _bench_result(d):
        raise c.fail("format", "missing: this is a benchmark's result (vllm bench serve / sglang bench_serving), not "
                     f"a cost profile; {FIT_HINT}")
    fmt = c.get(d, "format")
    if fmt != FORMAT:
        raise c.fail("format", f"expected '{FORMAT}', got {fmt!r}")
    unknown = sorted(k for k in d if k not in _TOP_KEYS and not str(k).startswith("_"))
    if unknown:
        raise c.fail(unknown[0], f"unknown key (allowed: {', '.join(sorted(_TOP_KEYS))}; prefix comments with '_')")
    name = c.get(d, "name")
    if not isinstance(name, str) or not name or escape_controls(name) != name:
        # the name is quoted in later errors and output titles: one printable line
        raise c.fail("name", f"expected a non-empty one-line string, got {_short(name)}")
    return name


def _parse_metadata(c: _Checker, d: Mapping[str, Any]) -> dict[str, Any]:
    """The metadata object: required keys present, strict-JSON values, integer counts."""
    meta = c.get(d, "metadata")
    if not isinstance(meta, Mapping):
        raise c.fail("metadata", f"expected an object, got {type(meta).__name__}")
    for k in REQUIRED_METADATA:
        c.get(meta, k, "metadata.")
    meta = dict(meta)
    _finite_json(c, meta, "metadata")   # results repeat the metadata as strict JSON (no NaN/Infinity)
    for k in INT_METADATA:
        if meta.get(k) is not None:
            meta[k] = c.count(meta[k], f"metadata.{k}")
    return meta


def _parse_verify(c: _Checker, d: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """The verify table: (M breakpoints, times (1-D, or 2-D rows per kv_tokens), kv_tokens or None)."""
    ver = c.get(d, "verify")
    M = c.breakpoints(c.get(ver, "M", "verify."), "verify.M")
    kv_raw = c.get(ver, "kv_tokens", "verify.", required=False)
    t_raw = c.get(ver, "time_s", "verify.")
    kv = None
    if kv_raw is None:
        T = c.times(t_raw, "verify.time_s", len(M))
    else:
        kv = c.breakpoints(kv_raw, "verify.kv_tokens", first_min=0, first_exact=0)
        if not isinstance(t_raw, list) or len(t_raw) != len(kv):
            n = len(t_raw) if isinstance(t_raw, list) else type(t_raw).__name__
            raise c.fail("verify.time_s", f"length mismatch: a 2-D table needs one row per kv_tokens breakpoint "
                                          f"({len(kv)}), got {n}")
        T = np.stack([c.times(row, f"verify.time_s[{r}]", len(M)) for r, row in enumerate(t_raw)])
    return M, T, kv


def _parse_attention(c: _Checker, d: Mapping[str, Any], kv: np.ndarray | None) -> tuple[float | None, str, float]:
    """The optional kv_bandwidth attention term: (seconds_per_kv_token or None, note, seconds_per_query_kv)."""
    spk, att_note, sqk = None, "", 0.0
    att = c.get(d, "attention", required=False)
    if att is not None:
        model = c.get(att, "model", "attention.")
        if model != "kv_bandwidth":
            raise c.fail("attention.model", f"expected 'kv_bandwidth', got {model!r}")
        bad = sorted(set(att) - {"model", "seconds_per_kv_token", "seconds_per_query_kv", "note"})
        if bad:
            raise c.fail(f"attention.{bad[0]}", "unknown key (allowed: model, seconds_per_kv_token, "
                                                "seconds_per_query_kv, note)")
        spk = c.number(c.get(att, "seconds_per_kv_token", "attention."), "attention.seconds_per_kv_token")
        sqk = c.number(att.get("seconds_per_query_kv", 0.0), "attention.seconds_per_query_kv")
        att_note = str(att.get("note", ""))
        if kv is not None:
            raise c.fail("attention", "a profile with a 2-D verify table (verify.kv_tokens) already prices context; "
                                      "a kv_bandwidth term on top would count attention twice")
    return spk, att_note, sqk


def _parse_prefill_only(c: _Checker, po: Any) -> tuple[float, ...]:
    """prefill.only: the prefill-only step's (per step, per token, per query-key, per chunk) seconds."""
    if not isinstance(po, Mapping):
        raise c.fail("prefill.only", f"expected an object, got {type(po).__name__}")
    keys = ("seconds_per_step", "seconds_per_token", "seconds_per_query_key", "seconds_per_chunk")
    bad = sorted(set(po) - set(keys))
    if bad:
        raise c.fail(f"prefill.only.{bad[0]}", f"unknown key (allowed: {', '.join(keys)})")
    # a step is never free: the per-step part must be > 0
    return (c.number(c.get(po, "seconds_per_step", "prefill.only."), "prefill.only.seconds_per_step",
                     strict=True),
            *(c.number(po.get(k, 0.0), f"prefill.only.{k}") for k in keys[1:]))


def _parse_prefill(c: _Checker, d: Mapping[str, Any]) -> dict[str, Any]:
    """The optional prefill section, as CostProfile's prefill_* keyword arguments (zeros when absent)."""
    pf_tok = pf_qk = pf_ch = pf_tn = pf_cn = 0.0
    pf_note = None
    pf_only = None
    pf = c.get(d, "prefill", required=False)
    if pf is not None:
        if not isinstance(pf, Mapping):
            raise c.fail("prefill", f"expected an object, got {type(pf).__name__}")
        bad = sorted(set(pf) - {"seconds_per_token", "seconds_per_query_key", "seconds_per_chunk", "note",
                                "seconds_per_token_per_decode", "seconds_per_chunk_per_decode", "only"})
        if bad:
            raise c.fail(f"prefill.{bad[0]}", "unknown key (allowed: seconds_per_token, seconds_per_query_key, "
                                              "seconds_per_chunk, seconds_per_token_per_decode, "
                                              "seconds_per_chunk_per_decode, only, note)")
        po = pf.get("only")
        if po is not None:
            pf_only = _parse_prefill_only(c, po)
        pf_tok = c.number(c.get(pf, "seconds_per_token", "prefill."), "prefill.seconds_per_token")
        pf_qk = c.number(pf.get("seconds_per_query_key", 0.0), "prefill.seconds_per_query_key")
        pf_ch = c.number(pf.get("seconds_per_chunk", 0.0), "prefill.seconds_per_chunk")
        pf_tn = c.number(pf.get("seconds_per_token_per_decode", 0.0), "prefill.seconds_per_token_per_decode")
        pf_cn = c.number(pf.get("seconds_per_chunk_per_decode", 0.0), "prefill.seconds_per_chunk_per_decode")
        pf_note = str(pf.get("note", ""))
    return dict(prefill_s_per_token=pf_tok, prefill_s_per_query_key=pf_qk, prefill_s_per_chunk=pf_ch,
                prefill_s_per_token_per_decode=pf_tn, prefill_s_per_chunk_per_decode=pf_cn, prefill_note=pf_note,
                prefill_only=pf_only)


def _parse_batch_overhead(c: _Checker, d: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray] | None:
    """The optional batch_overhead table: (n_req breakpoints, times) or None."""
    b = c.get(d, "batch_overhead", required=False)
    if b is None:
        return None
    bn = c.breakpoints(c.get(b, "n_req", "batch_overhead."), "batch_overhead.n_req")
    bt = c.times(c.get(b, "time_s", "batch_overhead."), "batch_overhead.time_s", len(bn), allow_zero=True)
    return _ro(bn), _ro(bt)


def _parse_drafter(c: _Checker, dname: Any, spec: Any) -> DrafterCost:
    """One drafters.NAME entry."""
    p = f"drafters.{dname}."
    if not dname or escape_controls(dname) != dname:
        raise c.fail("drafters", f"expected drafter names that are non-empty printable strings, got {dname!r}")
    kind = c.get(spec, "kind", p)
    if kind not in DRAFTER_KINDS:
        raise c.fail(p + "kind", f"unknown drafter kind {kind!r}; expected one of {', '.join(DRAFTER_KINDS)}")
    tok = c.breakpoints(c.get(spec, "tokens", p), p + "tokens")
    tt = c.times(c.get(spec, "time_s", p), p + "time_s", len(tok), allow_zero=True)  # 0: drafting folded elsewhere
    mo = spec.get("markov_overhead_frac", 0.0)
    mo = c.number(mo, p + "markov_overhead_frac")
    if mo >= 1.0:
        raise c.fail(p + "markov_overhead_frac", f"expected a fraction < 1, got {mo}")
    if mo and kind != "parallel":
        raise c.fail(p + "markov_overhead_frac", f"only a 'parallel' drafter has a Markov head; kind is {kind!r}")
    dpf = c.number(spec.get("prefill_s_per_token", 0.0), p + "prefill_s_per_token")
    dkv = c.number(spec.get("seconds_per_kv_token", 0.0), p + "seconds_per_kv_token")
    return DrafterCost(kind=kind, tokens=_ro(tok), time_s=_ro(tt), markov_overhead_frac=mo,
                       note=str(spec.get("note", "")), prefill_s_per_token=dpf, seconds_per_kv_token=dkv)


def _parse_drafters(c: _Checker, d: Mapping[str, Any]) -> dict[str, DrafterCost]:
    """The optional drafters object: name -> DrafterCost."""
    drafters: dict[str, DrafterCost] = {}
    dr = c.get(d, "drafters", required=False) or {}
    if not isinstance(dr, Mapping):
        raise c.fail("drafters", f"expected an object mapping drafter name -> cost, got {type(dr).__name__}")
    for dname, spec in dr.items():
        drafters[str(dname)] = _parse_drafter(c, dname, spec)
    return drafters


def profile_from_dict(d: Any, source: str = "<dict>", extrapolate: bool = False) -> CostProfile:
    """Validate a profile JSON object and build the :class:`CostProfile` (InputError on any defect).

    Sections are checked in a fixed order (head, metadata, verify, attention, prefill, overheads, drafters), so
    the first defect reported is the same whatever else is wrong.
    """
    c = _Checker(source)
    name = _parse_head(c, d)
    meta = _parse_metadata(c, d)
    M, T, kv = _parse_verify(c, d)
    spk, att_note, sqk = _parse_attention(c, d, kv)
    prefill = _parse_prefill(c, d)
    fixed = c.number(c.get(d, "fixed_overhead_s"), "fixed_overhead_s")
    req_lat = c.number(d.get("request_latency_s", 0.0), "request_latency_s")
    bo = _parse_batch_overhead(c, d)
    drafters = _parse_drafters(c, d)
    return CostProfile(name=name, metadata=json.loads(json.dumps(meta)), verify_M=_ro(M), verify_time_s=_ro(T),
                       kv_tokens=None if kv is None else _ro(kv), seconds_per_kv_token=spk, fixed_overhead_s=fixed,
                       batch_overhead=bo, drafters=drafters, source=source, extrapolate=bool(extrapolate),
                       attention_note=att_note, seconds_per_query_kv=sqk, request_latency_s=req_lat, **prefill)


def profile_to_dict(p: CostProfile) -> dict[str, Any]:
    """The JSON object for `p` (inverse of :func:`profile_from_dict`)."""
    ver: dict[str, Any] = {"M": [int(x) for x in p.verify_M]}
    if p.kv_tokens is None:
        ver["time_s"] = [float(x) for x in p.verify_time_s]
    else:
        ver["kv_tokens"] = [int(x) for x in p.kv_tokens]
        ver["time_s"] = [[float(x) for x in row] for row in p.verify_time_s]
    out: dict[str, Any] = {"format": FORMAT, "name": p.name, "metadata": p.metadata, "verify": ver}
    if p.seconds_per_kv_token is not None:
        out["attention"] = {"model": "kv_bandwidth", "seconds_per_kv_token": float(p.seconds_per_kv_token),
                            "note": p.attention_note}
        if p.seconds_per_query_kv:
            out["attention"]["seconds_per_query_kv"] = float(p.seconds_per_query_kv)
    if p.prefill_note is not None:
        out["prefill"] = {"seconds_per_token": float(p.prefill_s_per_token),
                          "seconds_per_query_key": float(p.prefill_s_per_query_key),
                          "seconds_per_chunk": float(p.prefill_s_per_chunk), "note": p.prefill_note}
        for k in ("token", "chunk"):      # optional terms: written only when measured (absent = 0)
            v = float(getattr(p, f"prefill_s_per_{k}_per_decode"))
            if v:
                out["prefill"][f"seconds_per_{k}_per_decode"] = v
        if p.prefill_only is not None:
            out["prefill"]["only"] = dict(zip(("seconds_per_step", "seconds_per_token", "seconds_per_query_key",
                                               "seconds_per_chunk"), (float(x) for x in p.prefill_only)))
    out["fixed_overhead_s"] = float(p.fixed_overhead_s)
    if p.request_latency_s:               # optional: written only when non-zero (absent = 0)
        out["request_latency_s"] = float(p.request_latency_s)
    if p.batch_overhead is not None:
        out["batch_overhead"] = {"n_req": [int(x) for x in p.batch_overhead[0]],
                                 "time_s": [float(x) for x in p.batch_overhead[1]]}
    drs: dict[str, Any] = {}
    for k, dc in p.drafters.items():
        e: dict[str, Any] = {"kind": dc.kind, "tokens": [int(x) for x in dc.tokens],
                             "time_s": [float(x) for x in dc.time_s]}
        if dc.markov_overhead_frac:
            e["markov_overhead_frac"] = float(dc.markov_overhead_frac)
        if dc.prefill_s_per_token:
            e["prefill_s_per_token"] = float(dc.prefill_s_per_token)
        if dc.seconds_per_kv_token:       # optional: written only when non-zero (absent = 0)
            e["seconds_per_kv_token"] = float(dc.seconds_per_kv_token)
        if dc.note:
            e["note"] = dc.note
        drs[k] = e
    out["drafters"] = drs
    return out


def dumps_profile(d: Mapping[str, Any]) -> str:
    """Pretty JSON with numeric lists kept on one line (profiles hold long staircases)."""
    def enc(x: Any, ind: int) -> str:
        pad, pad1 = "  " * ind, "  " * (ind + 1)
        if isinstance(x, Mapping):
            if not x:
                return "{}"
            items = [f"{pad1}{json.dumps(str(k))}: {enc(v, ind + 1)}" for k, v in x.items()]
            return "{\n" + ",\n".join(items) + "\n" + pad + "}"
        if isinstance(x, (list, tuple)):
            if all(isinstance(v, (int, float, str, bool)) or v is None for v in x):
                return json.dumps(list(x))
            return "[\n" + ",\n".join(pad1 + enc(v, ind + 1) for v in x) + "\n" + pad + "]"
        return json.dumps(x)
    return enc(d, 0) + "\n"


def save_profile(p: CostProfile | Mapping[str, Any], path: str | Path) -> Path:
    """Write a profile (object or already-built dict, validated first) as JSON; returns the path."""
    d = profile_to_dict(p) if isinstance(p, CostProfile) else p
    profile_from_dict(d, str(path))  # never write something load_profile would reject
    path = Path(path)
    path.write_text(dumps_profile(d), encoding="utf-8")
    return path


# ====================================================================== shipped profiles
def shipped_dir() -> Path:
    """Folder holding the shipped profile JSONs (package dsparksim._profiles, or ./profiles in a checkout)."""
    try:
        p = Path(str(files("dsparksim._profiles")))
        if p.is_dir():
            return p
    except (ModuleNotFoundError, TypeError):
        pass
    return Path(__file__).resolve().parents[2] / "profiles"  # source checkout without install


def list_profiles() -> list[str]:
    """Names (file stems) of the shipped profiles."""
    d = shipped_dir()
    return sorted(p.stem for p in d.glob("*.json")) if d.is_dir() else []


def profile_path(name_or_path: str | Path) -> Path:
    """The file of a profile JSON path or shipped profile name (InputError / ConfigError when there is none)."""
    s = str(name_or_path)
    path = Path(s)
    looks_like_path = path.suffix == ".json" or "/" in s or "\\" in s
    if not is_file(path):
        if looks_like_path:
            raise InputError(s, None, not_a_file(path, "profile file"))
        path = shipped_dir() / f"{s}.json"
        if not is_file(path):
            raise ConfigError("profile", "name", f"unknown profile {s!r}: not a file, and not a shipped profile "
                                                 f"(shipped: {', '.join(list_profiles()) or 'none'})")
    return path


def read_profile_dict(name_or_path: str | Path) -> tuple[dict, Path]:
    """(the profile's JSON object, its file): errors name the file and line, as :func:`load_profile`'s."""
    path = profile_path(name_or_path)
    text = read_text(path, "profile file", bom=False)
    if text.startswith("# dsparksim runs table"):   # bench import's marker line (dsparksim.bench.runs.MARKER)
        raise InputError(str(path), None, f"a runs table (bench import), not a cost profile; {FIT_HINT}")
    try:
        return loads_json(text, str(path), label="not valid JSON"), path
    except InputError:
        if _bench_jsonl(text):   # several JSON lines: json's own error is "Extra data" on line 2
            raise InputError(str(path), None, "benchmark results, one JSON line per run (sglang bench_serving "
                             f"--output-file), not a cost profile; {FIT_HINT}") from None
        raise


def beside_spec_hint(name: str, spec: str | Path) -> str:
    """For a spec (sweep, plan) naming a profile by a relative path that is not in the working directory: where
    it is read from, and the file of that name beside the spec if there is one (the usual slip); else ""."""
    path = Path(str(name))
    if path.is_absolute() or path.exists() or not (Path(str(spec)).parent / path).is_file():
        return ""
    return (f" (a relative profile path is read from the working directory {str(Path.cwd())!r}, not from the spec's "
            f"folder; there is one beside the spec: {str(Path(str(spec)).parent / path)!r})")


def load_profile(name_or_path: str | Path, extrapolate: bool = False) -> CostProfile:
    """Load a profile from a JSON path, or a shipped profile by name (see :func:`list_profiles`)."""
    d, path = read_profile_dict(name_or_path)
    return profile_from_dict(d, str(path), extrapolate=extrapolate)
