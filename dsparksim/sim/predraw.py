"""Per-request blocks of pre-drawn acceptance draws: one acceptance call per request per ``B`` decode steps.

With keyed streams (:mod:`dsparksim.sim.streams`) request i's j-th decode step draws a pure function of
(seed, i, j). An acceptance source that declares ``keyed_rows_pure = True`` computes each row of ``draw()`` from
that row's keyed draws and the slot state ``start()`` set (nothing else, no state changed by ``draw``), so the draws
of steps j..j+B-1 of a request can be made in one call, ahead of time, with the same values bit for bit: the rows of
one call are just more rows (every operation is elementwise or along the row). This module keeps, per engine slot,
the confidences, their survival (cumulative product) and the true accepted prefix of the next ``B`` steps of the
request holding the slot, and refills a slot's block when its request runs past it or the slot changes hands.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from dsparksim.acceptance.base import AcceptanceModel
from dsparksim.sim.streams import RequestStreams

# Steps per request block: long enough that the refill calls are rare (a request decodes ~200 steps in the
# benchmark), short enough that the draws a finishing request leaves unused stay a small fraction.
BLOCK_STEPS = 32


def supports_predraw(acceptance: AcceptanceModel) -> bool:
    """True if ``acceptance`` draws each keyed row from that row's keys and its slot's start() state alone."""
    return bool(getattr(acceptance, "keyed_rows_pure", False))


class PredrawnBlocks:
    """Draws of the next ``steps`` decode steps of each slot's request (see the module doc).

    ``slot_base``: the engine's first slot; slots are ``slot_base .. slot_base + capacity - 1``. Buffers grow with
    the highest slot used (slots are handed out lowest first), not with the engine's capacity."""

    def __init__(self, acceptance: AcceptanceModel, streams: RequestStreams, table: Any, K: int, slot_base: int,
                 words: int, steps: int = BLOCK_STEPS) -> None:
        self.acc, self.streams, self.req = acceptance, streams, table
        self.K, self.base, self.words, self.B = int(K), int(slot_base), int(words), int(steps)
        self._offsets = np.arange(self.B, dtype=np.int64)
        self._alloc(0)

    def _alloc(self, cap: int) -> None:
        B, K = self.B, self.K
        old = getattr(self, "_cap", 0)
        conf, surv, acc = np.empty((cap * B, K)), np.empty((cap * B, K)), np.empty(cap * B, np.int64)
        owner, start = np.full(cap, -1, np.int64), np.zeros(cap, np.int64)
        if old:
            conf[: old * B], surv[: old * B], acc[: old * B] = self._conf, self._surv, self._acc
            owner[:old], start[:old] = self._owner, self._start
        self._conf, self._surv, self._acc, self._owner, self._start = conf, surv, acc, owner, start
        self._cap = cap

    def take(self, rows: np.ndarray, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(conf (n, K), survival (n, K), true accepted prefix (n,)) of decoding ``rows`` at their current step
        (``table.dsteps``), held in ``slots``."""
        ls = slots - self.base
        top = int(ls.max()) + 1
        if top > self._cap:
            self._alloc(max(top, 2 * self._cap, 64))
        st = self.req.dsteps[rows]
        j = st - self._start[ls]
        stale = (self._owner[ls] != rows) | (j < 0) | (j >= self.B)
        if stale.any():
            idx = np.flatnonzero(stale)
            self._refill(rows[idx], slots[idx], ls[idx], st[idx])
            j[idx] = 0
        flat = ls * self.B + j
        return self._conf.take(flat, axis=0), self._surv.take(flat, axis=0), self._acc.take(flat)

    def _refill(self, rows: np.ndarray, slots: np.ndarray, ls: np.ndarray, first: np.ndarray) -> None:
        """Draw steps first..first+B-1 of ``rows`` (one acceptance call, rows repeated B times)."""
        B, K = self.B, self.K
        steps = (first[:, None] + self._offsets).ravel()
        keyed = self.streams.rows(np.repeat(self.req.key[rows], B), steps, self.words)
        blk = self.acc.draw(np.repeat(slots, B), keyed)
        conf = blk.conf[:, :K]
        at = (ls[:, None] * B + self._offsets).ravel()
        self._conf[at] = conf
        self._surv[at] = np.cumprod(conf, axis=1)
        self._acc[at] = blk.accepted
        self._owner[ls] = rows
        self._start[ls] = first
