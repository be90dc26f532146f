"""Empirical acceptance: replay recorded draft blocks from an acceptance trace.

Per new request the sampler picks, uniformly at random, one recorded response of the request's domain and
replays its blocks in order — this keeps the within-request correlation (easy and hard responses) that a
per-request scheduler exploits. When the recorded response runs out before the simulated request finishes, the
request continues with another uniformly chosen response of the same domain (counted in ``describe()``).

Block size: a run with K smaller than the trace's K uses ``conf[:, :K]`` and ``accepted = min(A, K)`` — exact,
because the first K positions' outcomes and confidences do not depend on later draft tokens. A larger K is an
error (a trace cannot be extended).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from dsparksim.errors import ConfigError
from dsparksim.acceptance.base import DOMAINS, AcceptanceModel, Block
from dsparksim.acceptance.trace_format import AcceptanceTrace, read_trace


class TraceAcceptance(AcceptanceModel):
    """Trace-replay acceptance source (vectorised: blocks in flat arrays, per slot a cursor and an end)."""

    def __init__(self, trace: AcceptanceTrace | str | Path, K: int | None = None, *, domain_default: str = "chat",
                 source: str | None = None):
        if not isinstance(trace, AcceptanceTrace):
            trace = read_trace(trace)
        self.trace_path = trace.path
        self.source = source or trace.path
        K = trace.K if K is None else int(K)
        if K < 1:
            raise ConfigError(self.source, "K", f"block size must be >= 1, got {K}")
        if K > trace.K:
            raise ConfigError(self.source, "K", f"K mismatch: the run uses K={K} but the trace recorded K={trace.K} "
                              "draft tokens per block; a trace can be truncated to a smaller K, never extended")
        self.K = K
        self.drafter = str(trace.metadata.get("drafter", "unknown"))
        self.domain_default = domain_default
        self._conf = np.ascontiguousarray(trace.conf[:, :K])
        self._acc = np.minimum(trace.accepted, K).astype(np.int64)
        starts, lengths, doms = trace.responses()
        self._resp_start = starts.astype(np.int64)
        self._resp_end = (starts + lengths).astype(np.int64)
        self._dom_id = {d: i for i, d in enumerate(DOMAINS)}
        resp_dom = np.array([self._dom_id[d] for d in doms], dtype=np.int64)
        self._resp_of = [np.flatnonzero(resp_dom == i) for i in range(len(DOMAINS))]
        self._pos = np.zeros(0, dtype=np.int64)
        self._end = np.zeros(0, dtype=np.int64)
        self._sdom = np.zeros(0, dtype=np.int64)
        self.continuations = 0
        self.requests_started = 0
        counts = {d: {"responses": int(self._resp_of[i].size),
                      "blocks": int(lengths[resp_dom == i].sum())} for d, i in self._dom_id.items()}
        self.metadata = {
            "source": self.source, "kind": "trace", "drafter": self.drafter, "K": K, "trace_K": trace.K,
            "trace_metadata": dict(trace.metadata), "counts": counts,
            "truncated": K < trace.K,
            "sampling": "per request: a uniformly random recorded response of its domain, replayed block by block "
                        "in order; when it runs out the request continues with another uniformly random response "
                        "of the same domain (see 'continuations')",
        }
        if K < trace.K:
            self.metadata["truncation"] = f"trace K={trace.K} truncated to K={K}: conf[:, :{K}], accepted=min(A, {K})"

    # ---- helpers -----------------------------------------------------------------------------------------------
    def _domain_ids(self, domains) -> np.ndarray:
        doms = np.asarray(domains, dtype=object)
        out = np.empty(doms.size, dtype=np.int64)
        for d in set(doms.tolist()):
            key = self.domain_default if d is None or d == "" else str(d)
            i = self._dom_id.get(key)
            if i is None or self._resp_of[i].size == 0:
                have = [x for x, j in self._dom_id.items() if self._resp_of[j].size]
                raise ConfigError(self.trace_path, "domain", f"the trace has no blocks of domain {key!r} "
                                  f"(it has {have}); record that domain or map requests to another one")
            out[doms == d] = i
        return out

    def _ensure_capacity(self, top: int) -> None:
        if top < self._pos.size:
            return
        cap = max(64, self._pos.size)
        while cap <= top:
            cap *= 2
        for name in ("_pos", "_end", "_sdom"):
            old = getattr(self, name)
            new = np.full(cap, -1, dtype=np.int64)
            new[: old.size] = old
            setattr(self, name, new)

    def _assign(self, slots: np.ndarray, dom_ids: np.ndarray, u: np.ndarray) -> None:
        """Point each slot at the first block of a random response of its domain (``u``: one uniform per slot)."""
        for i in np.unique(dom_ids):
            sel = dom_ids == i
            pool = self._resp_of[i]
            resp = pool[np.minimum((u[sel] * pool.size).astype(np.int64), pool.size - 1)]
            self._pos[slots[sel]] = self._resp_start[resp]
            self._end[slots[sel]] = self._resp_end[resp]

    # ---- AcceptanceModel interface -----------------------------------------------------------------------------
    def start(self, slots: np.ndarray, domains: np.ndarray, rng: np.random.Generator) -> None:
        slots = np.asarray(slots, dtype=np.int64)
        if slots.size == 0:
            return
        ids = self._domain_ids(domains)
        if ids.size != slots.size:
            raise ValueError(f"start(): {slots.size} slots but {ids.size} domains")
        self._ensure_capacity(int(slots.max()))
        self._sdom[slots] = ids
        self._assign(slots, ids, rng.random(slots.size))
        self.requests_started += int(slots.size)

    words_per_step = 1

    def draw(self, slots: np.ndarray, rng: np.random.Generator) -> Block:
        slots = np.asarray(slots, dtype=np.int64)
        if slots.size and (slots.max() >= self._pos.size or (self._pos[slots] < 0).any()):
            raise ValueError("draw() on a slot that was never start()ed")
        pos = self._pos[slots]
        done = pos >= self._end[slots]
        if done.any():
            # the recorded response ran out and the request still wants blocks: continue with another one (one
            # uniform per row, so keyed streams keep row i's draw a function of (request, step) alone)
            ds = slots[done]
            self._assign(ds, self._sdom[ds], rng.random(slots.size)[done])
            self.continuations += int(ds.size)
            pos = self._pos[slots]
        self._pos[slots] = pos + 1
        return Block(conf=self._conf[pos], accepted=self._acc[pos])

    def suspend(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The replay cursors of ``slots`` (next block, end of the response, domain): a preempted request goes on
        with the block it had reached when readmitted, not with its response's first block again."""
        slots = np.asarray(slots, dtype=np.int64)
        return self._pos[slots].copy(), self._end[slots].copy(), self._sdom[slots].copy()

    def resume(self, slots: np.ndarray, state: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
        slots = np.asarray(slots, dtype=np.int64)
        self._pos[slots], self._end[slots], self._sdom[slots] = state

    def describe(self) -> dict[str, Any]:
        out = dict(self.metadata)
        out["requests_started"] = self.requests_started
        out["continuations"] = self.continuations
        return out
