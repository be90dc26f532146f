"""The workload a run serves: who arrives when, with how many prompt and output tokens, from which domain.

Two forms share one interface for the engine (:meth:`iter_blocks`): :class:`Workload` holds its requests in
arrays (tests, the real runner's calibration, trace replay), :class:`LazyWorkload` generates them block by block
as the engine needs them, so memory does not grow with users x duration.

Request streams (DESIGN.md section 6): everything random about request i (its arrival gap, the length row it
draws, its domain) comes from block ``i // CHUNK`` of a keyed stream, a Generator seeded by
``SeedSequence([key, stream, i // CHUNK])``. Request i is therefore the same whatever else runs: another load
level, another policy, a longer or shorter run.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np

from dsparksim.errors import ConfigError

CHUNK = 1024  # requests per keyed block
# Memory bound of a closed loop without --num-requests (whose count only the run decides): every issued request keeps
# its row until the run ends, ~2.4 KiB each at `dsparksim run`'s peak (measured, docs/outputs.md), so the limit is
# ~24 GiB; 4,096 users issue ~3.8M requests per simulated hour even at 64-token prompts and 16-token outputs
# (340,791 in 320 s on h100-llama2-7b-tp1, measured).
MAX_CLOSED_LOOP_REQUESTS = 10_000_000
# Warm-up requests (the benchmark client's) come from blocks WARMUP_BLOCK0 + b of the same streams, so the measured
# requests are the same whatever the warm-up count; their stable ids (RequestTable) are WARMUP_ID0 + row.
WARMUP_BLOCK0 = 2**40
WARMUP_ID0 = 2**62
STREAM_GAP, STREAM_ROW, STREAM_DOMAIN = 1, 2, 3

# A block: (prompt_tokens, output_tokens, domain, arrival_s or None), all of one length.
# (prompt, output, domain, arrival or None[, session or None])
Block = tuple[np.ndarray, ...]


def keyed_rng(key: int, stream: int, block: int) -> np.random.Generator:
    """The Generator of one block of one stream: a pure function of (key, stream, block)."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(key), int(stream), int(block)])))


@dataclass
class Workload:
    """Requests in issue order, held in arrays.

    prompt_tokens: (n,) int64 >= 1
    output_tokens: (n,) int64 >= 1   (the request emits exactly this many tokens, then finishes)
    domain:        (n,) object array of domain strings ("math" | "code" | "chat")
    arrival_s:     (n,) float64 non-decreasing arrival times for open loop; None for closed loop.
    concurrency:   closed loop only: number of users; user u sends request rows in order as it frees up
                   (row j goes to the first free user). None for open loop.
    metadata:      what generated it (process, rate, burstiness, trace file, replay mode, scaling, ...).

    For closed loop the arrays are all the requests there are; running out ends the run (reported, never
    silently recycled).
    """

    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    domain: np.ndarray
    arrival_s: np.ndarray | None = None
    concurrency: int | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    session: np.ndarray | None = None   # (n,) int64 session / prefix id per request (-1 = none), or None
    user_steps: tuple[tuple[float, int], ...] | None = None   # closed loop: changes of the user count
    warmup: int = 0                      # the first rows are the client's warm-up (ids WARMUP_ID0 + row)

    def __post_init__(self) -> None:
        n = len(self.prompt_tokens)
        if len(self.output_tokens) != n or len(self.domain) != n:
            raise ValueError(f"Workload arrays differ in length: {n}, {len(self.output_tokens)}, {len(self.domain)}")
        if (self.arrival_s is None) == (self.concurrency is None):
            raise ValueError("Workload needs exactly one of arrival_s (open loop) or concurrency (closed loop)")
        if self.arrival_s is not None and len(self.arrival_s) != n:
            raise ValueError(f"arrival_s has {len(self.arrival_s)} rows, expected {n}")
        if self.user_steps is not None and self.concurrency is None:
            raise ValueError("user_steps needs a closed-loop workload (concurrency)")

    @property
    def closed_loop(self) -> bool:
        return self.concurrency is not None

    @property
    def limit(self) -> int:
        """Most requests this workload can issue."""
        return len(self.prompt_tokens)

    def __len__(self) -> int:
        return len(self.prompt_tokens)

    def max_request_tokens(self) -> int:
        """Largest prompt + output of any request (0 if empty)."""
        return int((self.prompt_tokens + self.output_tokens).max()) if len(self) else 0

    def iter_blocks(self) -> Iterator[Block]:
        """The requests in order, CHUNK at a time (the engine's view)."""
        for i in range(0, len(self), CHUNK):
            j = i + CHUNK
            yield (np.asarray(self.prompt_tokens[i:j], np.int64), np.asarray(self.output_tokens[i:j], np.int64),
                   np.asarray(self.domain[i:j], dtype=object),
                   None if self.arrival_s is None else np.asarray(self.arrival_s[i:j], np.float64),
                   None if self.session is None else np.asarray(self.session[i:j], np.int64))


class LazyWorkload:
    """Requests generated block by block from a length table and keyed streams (see the module doc).

    rows(b, n) -> the table rows of block b's first n requests (or ``lengths(b, n)`` -> their prompt and output
    lengths directly; the tables then hold the largest of each); domains(b, rows) -> their domains;
    gaps(b, n) -> the unscaled gap before each of them (None = closed loop). Arrival times are
    cumsum(gaps) / time_scale with the first request at t = 0; ``horizon`` ends the arrivals (open loop,
    exclusive), ``limit`` the count. Closed loop without a limit is unbounded: the engine's duration ends it.

    ``metadata`` adds the counts of a finite workload (computed on first access by generating it once).
    """

    def __init__(self, *, prompt_table: np.ndarray, output_table: np.ndarray,
                 rows: Callable[[int, int], np.ndarray], domains: Callable[[int, np.ndarray], np.ndarray],
                 gaps: Callable[[int, int], np.ndarray] | None = None, time_scale: float = 1.0,
                 exact_times: Callable[[np.ndarray], np.ndarray] | None = None,
                 horizon: float | None = None, limit: int | None = None, concurrency: int | None = None,
                 metadata: dict[str, Any] | None = None,
                 user_steps: tuple[tuple[float, int], ...] | None = None,
                 finish_meta: Callable[["Workload"], dict[str, Any]] | None = None,
                 lengths: Callable[[int, int], tuple[np.ndarray, np.ndarray]] | None = None,
                 warmup: int = 0) -> None:
        if (gaps is None) == (concurrency is None):
            raise ValueError("LazyWorkload needs exactly one of gaps (open loop) or concurrency (closed loop)")
        self._p, self._o = prompt_table, output_table
        self._rows, self._domains, self._gaps, self._exact = rows, domains, gaps, exact_times
        self.time_scale, self.horizon, self.limit, self.concurrency = time_scale, horizon, limit, concurrency
        if user_steps is not None and concurrency is None:
            raise ValueError("user_steps needs a closed-loop workload (concurrency)")
        self.user_steps = user_steps   # closed loop: ((t_s, users), ...) changes of the user count (TrafficConfig)
        self.warmup = int(warmup)   # first rows: warm-up, from blocks WARMUP_BLOCK0 + b (limit counts them)
        self._lengths = lengths   # (block, n) -> (prompt, output) of its first n requests, instead of table rows
        self._meta = dict(metadata or {})
        self._finish_meta = finish_meta
        self._eager: Workload | None = None
        self._meta_done: dict[str, Any] | None = None

    @property
    def closed_loop(self) -> bool:
        return self.concurrency is not None

    @property
    def finite(self) -> bool:
        return self.limit is not None or self.horizon is not None

    def max_request_tokens(self) -> int:
        """Largest prompt + output of any request: exact for a finite workload, else the length table's largest
        row (an upper bound)."""
        if self.finite:
            return self.materialise().max_request_tokens()
        return int((self._p + self._o).max()) if len(self._p) else 0

    def iter_blocks(self) -> Iterator[Block]:
        for wb in range(-(-self.warmup // CHUNK)):   # the warm-up first (sent at once: arrival 0)
            n = min(CHUNK, self.warmup - wb * CHUNK)
            bb = WARMUP_BLOCK0 + wb
            yield self._block(bb, self._rows(bb, n), None if self._gaps is None else np.zeros(n))
        limit = None if self.limit is None else self.limit - self.warmup
        t_prev = 0.0   # unscaled arrival of the last request of the previous block
        for b in itertools.count():
            n = CHUNK if limit is None else min(CHUNK, limit - b * CHUNK)
            if n <= 0:
                return
            if limit is None and self.closed_loop and b * CHUNK >= MAX_CLOSED_LOOP_REQUESTS:
                raise closed_loop_limit_error(b * CHUNK)
            rows = self._rows(b, n)
            arrival = None
            if self._gaps is not None:
                if self._exact is not None:   # constant rate: i / rate exactly, no accumulated rounding
                    raw = self._exact(np.arange(b * CHUNK, b * CHUNK + n))
                else:
                    g = self._gaps(b, n)
                    if b == 0:
                        g[0] = 0.0   # the first request arrives at t = 0
                    raw = t_prev + np.cumsum(g)
                    t_prev = float(raw[-1])
                arrival = raw / self.time_scale
                if self.horizon is not None and arrival[-1] >= self.horizon:
                    keep = int(np.searchsorted(arrival, self.horizon, side="left"))
                    if keep:
                        yield self._block(b, rows[:keep], arrival[:keep])
                    return
            yield self._block(b, rows, arrival)

    def _block(self, b: int, rows: np.ndarray, arrival: np.ndarray | None) -> Block:
        if self._lengths is not None:
            p, o = self._lengths(b, len(rows))
            return (np.asarray(p, np.int64), np.asarray(o, np.int64), self._domains(b, rows), arrival)
        return (self._p[rows].astype(np.int64), self._o[rows].astype(np.int64), self._domains(b, rows), arrival)

    # ------------------------------------------------------------ the finite workload in arrays (tests, metadata)
    def materialise(self) -> Workload:
        """All requests in arrays; only for a finite workload."""
        if self._eager is None:
            if not self.finite:
                raise ValueError("an unbounded closed-loop workload cannot be materialised (no num_requests)")
            blocks = list(self.iter_blocks())
            cat = (lambda k, dt: np.concatenate([x[k] for x in blocks]) if blocks else np.zeros(0, dt))
            self._eager = Workload(prompt_tokens=cat(0, np.int64), output_tokens=cat(1, np.int64),
                                   domain=cat(2, object), arrival_s=None if self.closed_loop else cat(3, float),
                                   concurrency=self.concurrency, warmup=self.warmup, user_steps=self.user_steps)
        return self._eager

    @property
    def metadata(self) -> dict[str, Any]:
        if self._meta_done is None:
            meta = dict(self._meta)
            if self.finite and self._finish_meta is not None:
                meta |= self._finish_meta(self.materialise())
            self._meta_done = meta
        return self._meta_done

    def __len__(self) -> int:
        return len(self.materialise())

    prompt_tokens = property(lambda self: self.materialise().prompt_tokens)
    output_tokens = property(lambda self: self.materialise().output_tokens)
    domain = property(lambda self: self.materialise().domain)
    arrival_s = property(lambda self: self.materialise().arrival_s)


def closed_loop_limit_error(rows: int) -> ConfigError:
    """The error of a closed loop (no --num-requests) whose users need request row ``rows`` (0-based, warm-up rows
    aside), past MAX_CLOSED_LOOP_REQUESTS: the limit is checked when a block of CHUNK rows is drawn, so ``rows`` is
    the first multiple of CHUNK at or past it (10,000,384 for 10,000,000) and the run needs more than that many. Not
    "have issued": users pinned to engines draw rows out of order, so some of those rows may be unsent yet."""
    return ConfigError("TrafficConfig", "duration_s", f"the closed-loop users need more than {rows:,} requests "
                       f"(warm-up aside), past the limit of {MAX_CLOSED_LOOP_REQUESTS:,} per run (checked every "
                       f"{CHUNK:,} requests): every request keeps its row until "
                       "the run ends (~2.4 KiB each, ~24 GiB at the limit), and a closed loop's count is known only "
                       "as it runs; shorten --duration or lower --concurrency (4,096 users issue ~3.8M requests per "
                       "simulated hour even at 64-token prompts and 16-token outputs)")


def expected_count(rate: float, duration_s: float) -> float:
    """Expected arrivals of a rate process over a duration (for the up-front memory cap)."""
    return rate * duration_s if math.isfinite(rate * duration_s) else math.inf
