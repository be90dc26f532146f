"""The request table: per-request state of every request a cluster has issued, indexed by workload row.

Requests are loaded from the workload lazily, block by block, and the arrays grow geometrically, so memory follows
the requests issued, not users x duration. Every engine of a cluster reads and writes the rows of the requests
routed to it; the row index is the request's stable id (policy history, keyed random streams, result tables).

Paged KV (:mod:`dsparksim.sim.kv`) adds: ``regen`` generated tokens a preempted request re-prefills (its prefill
target is prompt + regen; its context is prefilled + gen - regen), ``pages`` KV pages held, ``preempt`` times
preempted, ``recomp`` KV tokens discarded by preemption (computed again). ``demit``: tokens emitted by the request's
decode steps (its first token and a re-prefill's token come from prefill forwards). Disaggregated runs add the TTFT parts
``ttft_q`` (prefill-pool queueing), ``ttft_pf`` (prefill) and ``ttft_tx`` (KV transfer), in seconds, and ``landed``
(the time its KV reached the decode engine's queue).
"""
from __future__ import annotations

import numpy as np

from dsparksim.sim.streams import RequestStreams
from dsparksim.traffic.base import Workload

# Request phases.
NOT_ARRIVED, WAITING, PREFILL, DECODE, DONE, REJECTED = 0, 1, 2, 3, 4, 5


class RequestTable:
    """Growable per-request arrays (see the module doc); ``n_rows`` caps the rows (None = unbounded)."""

    GROWN = ("phase", "arrival", "admitted", "first_tok", "finish", "prompt", "out", "prefilled", "gen", "dsteps",
             "vtok", "atok", "slot_of", "reject", "domain", "arr_time", "replica", "key", "session",
             "regen", "pages", "preempt", "recomp", "demit", "ttft_q", "ttft_pf", "ttft_tx", "landed")
    _FILL = {"arrival": np.nan, "admitted": np.nan, "first_tok": np.nan, "finish": np.nan, "slot_of": -1,
             "arr_time": np.nan, "replica": -1, "session": -1, "ttft_q": np.nan, "ttft_pf": np.nan,
             "ttft_tx": np.nan, "landed": np.nan}
    _DTYPE = {"phase": np.int8, "prompt": np.int64, "out": np.int64, "prefilled": np.int64, "gen": np.int64,
              "dsteps": np.int64, "vtok": np.int64, "atok": np.int64, "slot_of": np.int64, "reject": np.int8,
              "domain": object, "replica": np.int32, "key": np.uint64, "session": np.int64, "regen": np.int64,
              "pages": np.int64, "preempt": np.int64, "recomp": np.int64, "demit": np.int64}

    def __init__(self, workload: Workload, n_rows: int | None, streams: RequestStreams | None) -> None:
        self.wl = workload
        self.n_rows = n_rows
        self.streams = streams
        self._blocks = workload.iter_blocks()
        self.known = 0
        self._exhausted = False
        self.cap = 0
        self.has_session = False
        self.predraw = None   # the engines' shared pre-drawn acceptance draws (dsparksim.sim.predraw), if any
        for name in self.GROWN:
            setattr(self, name, np.zeros(0, self._DTYPE.get(name, np.float64)))

    def _grow(self, need: int) -> None:
        cap = max(2 * self.cap, need, 1024)
        for name in self.GROWN:
            old = getattr(self, name)
            new = np.full(cap, self._FILL.get(name, 0), dtype=old.dtype)
            new[: len(old)] = old
            setattr(self, name, new)
        self.cap = cap

    def load(self, row: int) -> bool:
        """Make sure request ``row`` is loaded from the workload; False if the workload has no such request."""
        while self.known <= row:
            if self._exhausted or (self.n_rows is not None and self.known >= self.n_rows):
                return False
            blk = next(self._blocks, None)
            if blk is None:
                self._exhausted = True
                return False
            p, o, d, t = blk[:4]
            n = len(p)
            if self.n_rows is not None:
                n = min(n, self.n_rows - self.known)
            i, j = self.known, self.known + n
            if j > self.cap:
                self._grow(j)
            self.prompt[i:j], self.out[i:j], self.domain[i:j] = p[:n], o[:n], d[:n]
            if t is not None:
                self.arr_time[i:j] = t[:n]
            if len(blk) > 4 and blk[4] is not None:
                self.session[i:j] = blk[4][:n]
                self.has_session = True
            if self.streams is not None:
                ids = np.arange(i, j)
                w = int(getattr(self.wl, "warmup", 0) or 0)
                if w:   # measured requests keep the ids they have without a warm-up (traffic.base)
                    from dsparksim.traffic.base import WARMUP_ID0
                    ids = np.where(ids >= w, ids - w, WARMUP_ID0 + ids)
                self.key[i:j] = self.streams.request_keys(ids)
            self.known = j
        return True
