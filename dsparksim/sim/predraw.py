"""Per-request blocks of pre-drawn acceptance draws: a few acceptance calls per ``B`` engine steps, not one per step.

With keyed streams (:mod:`dsparksim.sim.streams`) request i's j-th decode step draws a pure function of
(seed, i, j). An acceptance source that declares ``keyed_rows_pure = True`` computes each row of its draws from that
row's keyed halves and the request's own state (``request_state``: what ``start()`` stores in its slot, itself
keyed by the request alone) -- every operation elementwise or along the row, no state changed -- so the draws of
steps j..j+B-1 of many requests can be made in one call, ahead of time, with the very same values, bit for bit.

:class:`PredrawnDraws` keeps, per request, a ring of ``2B`` steps: the confidences, their survival (cumulative
product) and the true accepted prefix. It is shared by the engines of one request table. When a decoding request
has no drawn step left, every decoding request of that engine with at most ``B`` steps left gets its next ``B``
steps in one call (so the next such event is at least ``B`` steps away); requests are given their first ``B`` steps
ahead, ``AHEAD`` loaded rows at a time, in one call. A request with fewer than ``B`` tokens left gets only as many
steps (a decode step emits at least one token: it finishes before it needs more). Rings of finished requests are
reused. With numba installed, the default parametric source's refills run compiled (:mod:`dsparksim.sim.fill_jit`:
the same rings, bit for bit; ``DSPARKSIM_KERNEL=0`` keeps the numpy refill).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from dsparksim.acceptance.base import AcceptanceModel
from dsparksim.errors import ConfigError
from dsparksim.sim import jit
from dsparksim.sim.requests import DONE, REJECTED
from dsparksim.sim.streams import RequestStreams

# Steps per refill (the ring holds 2B): refill calls are ~B steps apart. A request is never drawn more steps than it
# has tokens left (a decode step emits at least one), so few drawn steps go unused (~1% in the 256-user headline).
BLOCK_STEPS = 16
# Loaded requests given their first B steps per call, ahead of their admission.
AHEAD = 256


def supports_predraw(acceptance: AcceptanceModel) -> bool:
    """True if ``acceptance`` draws each keyed row from that row's keys and its request's state alone."""
    return bool(getattr(acceptance, "keyed_rows_pure", False))


def compiled_fill(acceptance: AcceptanceModel) -> Any:
    """:class:`dsparksim.sim.fill_jit.CompiledFill` for ``acceptance``, or None where the numpy refill runs: numba
    not installed, switched off (``DSPARKSIM_KERNEL=0``, :mod:`dsparksim.sim.jit`), a source the compiled copy does
    not cover (no ``keyed_plan``, or it returns None), or code it mirrors that differs from its copy
    (:func:`dsparksim.sim.fill_jit.mirror_changes`)."""
    if not jit.enabled():
        return None
    plan_of = getattr(acceptance, "keyed_plan", None)
    plan = plan_of() if plan_of is not None else None
    if plan is None:
        return None
    try:
        import numba  # noqa: F401  (optional: not installed, or installed but broken, runs the numpy refill)
    except (ImportError, OSError):
        return None
    from dsparksim.sim.fill_jit import CompiledFill, mirror_changes  # optional: numba (fill_jit imports it)
    if mirror_changes(acceptance, PredrawnDraws._fill):
        return None     # the code it mirrors was edited or patched: the numpy refill runs it as it is
    return CompiledFill(plan)


class PredrawnDraws:
    """Rings of pre-drawn steps per request of ``table`` (see the module doc). Entry 0 is a sentinel (never
    filled), so a request without a ring reads as having no step drawn."""

    def __init__(self, acceptance: AcceptanceModel, streams: RequestStreams, table: Any, K: int, words: int,
                 steps: int = BLOCK_STEPS, ahead: int = AHEAD) -> None:
        self.acc, self.streams, self.req = acceptance, streams, table
        self.K, self.words, self.B, self.ahead = int(K), int(words), int(steps), int(ahead)
        self.R = 2 * self.B
        self._wrap = self.R - 1 if self.R & (self.R - 1) == 0 else 0   # st % R as a mask (R a power of 2)
        self.entry = np.zeros(0, np.int64)       # per request row: its ring (0 = none)
        self.ahead_upto = 0                      # rows below this were given their first steps (or skipped)
        self._n = 0
        self._kept: tuple[np.ndarray, ...] | None = None
        self._grow_pool(64)
        self.refills = 0                         # acceptance calls made (a benchmark figure)
        self.compiled = compiled_fill(acceptance)    # the numba refill, or None: the numpy one

    # ------------------------------------------------------------------ pool of rings
    def _grow_pool(self, n: int) -> None:
        R, K, old = self.R, self.K, self._n
        # one row per drawn step: K confidences then their K survivals (one gather per engine step)
        cs, acc = np.empty((n * R, 2 * K)), np.zeros(n * R, np.int64)
        filled, owner = np.full(n, -1, np.int64), np.full(n, -1, np.int64)
        has = np.zeros(n, bool)     # the ring's request state is in _kept (computed once per request)
        kept = None if old == 0 or self._kept is None else tuple(np.zeros(n, a.dtype) for a in self._kept)
        if old:
            cs[: old * R], acc[: old * R] = self._cs, self._acc
            filled[:old], owner[:old] = self._filled, self._owner
            has[:old] = self._has
            for a, b in zip(kept or (), self._kept or ()):
                a[:old] = b
        self._cs, self._acc, self._filled, self._owner, self._has, self._kept = cs, acc, filled, owner, has, kept
        self._free = np.concatenate([np.arange(n - 1, max(old, 1) - 1, -1, dtype=np.int64),
                                     getattr(self, "_free", np.zeros(0, np.int64))])
        self._n = n

    def _sized(self) -> None:
        """Keep the per-row ring index as long as the request table."""
        if self.entry.size < self.req.cap:
            grown = np.zeros(self.req.cap, np.int64)
            grown[: self.entry.size] = self.entry
            self.entry = grown

    def _alloc(self, rows: np.ndarray) -> np.ndarray:
        """Give ``rows`` (at least one) a ring each, reusing the rings of finished requests first."""
        m = rows.size
        if m > self._free.size:
            used = np.flatnonzero(self._owner >= 0)
            ph = self.req.phase[self._owner[used]]
            gone = used[(ph == DONE) | (ph == REJECTED)]
            if gone.size:
                self.entry[self._owner[gone]] = 0
                self._owner[gone], self._filled[gone] = -1, -1
                self._free = np.concatenate([gone[::-1], self._free])
            if m > self._free.size:
                self._grow_pool(max(2 * self._n, self._n + m - self._free.size))
        e, self._free = self._free[-m:][::-1].copy(), self._free[:-m]
        self.entry[rows] = e
        self._owner[e] = rows
        self._has[e] = False
        return e

    # ------------------------------------------------------------------ drawing
    def _state(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The acceptance source's per-request state of ``rows`` (keyed by each request alone, as start())."""
        r = self.req
        return self.acc.request_state(r.domain[rows], self.streams.rows(r.key[rows], -1, 1))

    def _ring_state(self, rows: np.ndarray, e: np.ndarray,
                    state: tuple[np.ndarray, ...] | None) -> tuple[np.ndarray, ...]:
        """The request state of ``rows`` (rings ``e``): ``state`` if given, else kept from the ring's first fill
        (the same arrays :meth:`_state` gives: it is keyed by each request alone), computed for rings without."""
        if state is None:
            miss = ~self._has[e]
            if not miss.any():
                return tuple(a[e] for a in self._kept)
            if not miss.all():
                self._ring_state(rows[miss], e[miss], self._state(rows[miss]))
                return tuple(a[e] for a in self._kept)
            state = self._state(rows)
        if self._kept is None:
            self._kept = tuple(np.zeros(self._n, np.asarray(a).dtype) for a in state)
        for a, v in zip(self._kept, state):
            a[e] = v
        self._has[e] = True
        return state

    def _fill(self, rows: np.ndarray, e: np.ndarray, first: np.ndarray,
              state: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        """Draw steps first.. of ``rows`` into their rings ``e`` (one acceptance call): B steps each, or fewer
        where the request cannot decode that many more (a decode step emits at least one token, so a request
        with t tokens left decodes at most t more steps; its ``dsteps`` is where they start)."""
        K, R, r = self.K, self.R, self.req
        count = np.minimum(r.dsteps[rows] + (r.out[rows] - r.gen[rows]) - first, self.B)
        some = count > 0
        if not some.all():
            rows, e, first, count = rows[some], e[some], first[some], count[some]
            state = None if state is None else tuple(a[some] for a in state)
            if not rows.size:
                return
        crow, u = self._ring_state(rows, e, state)
        if self.compiled is not None and self.compiled.plan.mu.shape[1] >= K:
            self.compiled.fill(r.key[rows], first, count, crow, u, e, R, self._wrap, self._cs, self._acc)
            self._filled[e] = first + count
            self.refills += 1
            return
        start = np.cumsum(count) - count
        steps = np.arange(int(start[-1] + count[-1]), dtype=np.int64) + np.repeat(first - start, count)
        keyed = self.streams.rows(np.repeat(r.key[rows], count), steps, self.words)
        crow, u = np.repeat(crow, count), np.repeat(u, count)
        by_pos = getattr(self.acc, "draw_by_position", None)
        drawn = by_pos(crow, u, keyed) if by_pos is not None else None
        if drawn is not None:
            conf, accepted = drawn                # (K, n): one row per position
            conf = conf[:K]
        else:
            blk = self.acc.draw_state(crow, u, keyed)
            conf, accepted = np.ascontiguousarray(blk.conf[:, :K].T), blk.accepted
        at = np.repeat(e * R, count) + (steps & self._wrap if self._wrap else steps % R)   # (steps >= 0)
        cs = np.empty((2 * K, conf.shape[1]))    # positions' confidences, then their survivals, by position
        cs[:K] = conf
        # survival = cumprod(conf, axis=1), a position at a time: the same products in the same order
        cs[K] = conf[0]
        for k in range(1, K):
            np.multiply(cs[K + k - 1], conf[k], out=cs[K + k])
        self._cs[at] = cs.T
        self._acc[at] = accepted
        self._filled[e] = first + count
        self.refills += 1

    def _draw_ahead(self) -> None:
        """Give the next ``AHEAD`` loaded requests their first B steps (one call)."""
        lo = self.ahead_upto
        hi = min(self.req.known, lo + self.ahead)
        self.ahead_upto = hi
        self._sized()
        rows = np.arange(lo, hi, dtype=np.int64)
        ph = self.req.phase[rows]
        rows = rows[(ph != DONE) & (ph != REJECTED)]
        if not rows.size:
            return
        try:
            state = self._state(rows)
        except ConfigError:
            # a request the acceptance source cannot serve (unknown domain) fails at its admission, as without the
            # draws ahead; these rows are drawn when they decode
            return
        self._fill(rows, self._alloc(rows), np.zeros(rows.size, np.int64), state)

    def admit(self, rows: np.ndarray) -> None:
        """Requests ``rows`` were admitted: check that the source can serve them (as its start() does), drawing
        their first steps ahead now if they are not yet."""
        top_row = int(np.maximum.reduce(rows))
        while top_row >= self.ahead_upto and self.ahead_upto < self.req.known:
            self._draw_ahead()
        self._sized()
        none = self.entry[rows] == 0
        if np.count_nonzero(none):
            self._state(rows[none])   # raises the source's error for a request it cannot serve

    def take(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(conf (n, K), survival (n, K), true accepted prefix (n,)) of decoding ``rows`` at their current step
        (``table.dsteps``)."""
        r = self.req
        st = r.dsteps[rows]
        if self.entry.size < r.cap:
            self._sized()
        e = self.entry[rows]
        if np.count_nonzero(self._filled[e] <= st):     # (ndarray.any() goes through a Python wrapper)
            e = self._refill(rows, st)
        pos = e * self.R + (st & self._wrap if self._wrap else st % self.R)
        cs = self._cs.take(pos, axis=0)
        return cs[:, :self.K], cs[:, self.K:], self._acc.take(pos)

    def _refill(self, rows: np.ndarray, st: np.ndarray) -> np.ndarray:
        """Some of ``rows`` ran out: top up every one of them with at most B steps left (see the module doc)."""
        e = self.entry[rows]
        new = e == 0
        if new.any():
            e[new] = self._alloc(rows[new])
        f = self._filled[e]
        top = f - st <= self.B
        if top.any():
            self._fill(rows[top], e[top], np.maximum(f[top], st[top]))
        return e
