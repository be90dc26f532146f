"""An engine's KV memory (``EngineConfig.kv_policy``): what admission takes, what each step needs, what a finished or
preempted request gives back, and which requests can never fit. The scheduler (:mod:`dsparksim.sim.scheduler`)
decides who runs; a :class:`KVManager` only counts.

* :class:`PagedKV` (``"paged"``, the run default, as vLLM): the cache is ``kv_capacity_tokens // page_tokens`` pages
  of ``page_tokens`` tokens. Admission (FIFO) takes the pages of the request's prompt (plus, after a preemption, its
  already generated tokens) and keeps at least ``watermark`` x pages free unless nothing runs (vLLM's block
  manager: ``watermark=0.01``, ``watermark_blocks = int(watermark * num_gpu_blocks)``, a prompt is admitted only if
  ``free - required >= watermark_blocks``; vllm/core/block_manager.py). Before each step every decoding request
  holds ``ceil((context + K) / page_tokens)`` pages (context = prompt + generated tokens; the step's K draft slots
  are written too, as vLLM V1's lookahead slots): :meth:`PagedKV.grow` gives them, or says they do not fit and the
  scheduler preempts (its doc).
* :class:`ReserveKV` (``"reserve"``, the pre-paging behaviour, bit for bit; the real runner's fixed KV slots): a
  request is admitted only when its prompt + full output + K draft slots fit in the unreserved KV capacity, so
  nothing is ever preempted.

Per-request page counts live in the request table (``RequestTable.pages``), so a shard's merge sees them.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from dsparksim.sim.requests import DECODE, RequestTable

# Why a request was rejected on arrival (SimResult.reject_reason; 0 = not rejected).
REJECT_REASONS = {1: "max_model_len", 2: "kv_capacity"}
R_LEN, R_KV = 1, 2
KV_POLICIES = ("paged", "reserve")
_sum = np.add.reduce   # ndarray.sum() without its Python wrapper (called every engine step)


class KVManager:
    """The interface both policies implement (see the module doc); ``paged`` tells the scheduler which."""

    paged = False

    def __init__(self, table: RequestTable, capacity_tokens: int, K: int) -> None:
        self.req, self.cap, self.K = table, int(capacity_tokens), int(K)

    def need(self, row: int) -> int:
        """KV tokens request ``row`` takes at admission (the least-kv router counts the waiting ones)."""
        raise NotImplementedError

    def never_fits(self, tokens: int) -> bool:
        """True when a request of ``tokens`` prompt + output tokens (+ K draft slots) exceeds the whole cache."""
        raise NotImplementedError

    def take(self, row: int, need: int, others_running: bool) -> bool:
        """Admit ``row`` (``need`` = :meth:`need`) if it fits, taking its KV; False (nothing taken) otherwise."""
        raise NotImplementedError

    def release(self, rows: np.ndarray) -> None:
        """Give back the KV of finished requests ``rows``."""
        raise NotImplementedError

    @property
    def free_tokens(self) -> int:
        """KV tokens neither reserved nor held in pages."""
        raise NotImplementedError

    @property
    def used_pages(self) -> int:
        """Pages held (0 under reserve)."""
        return 0


class ReserveKV(KVManager):
    """Prompt + output + K reserved at admission (see the module doc)."""

    def __init__(self, table: RequestTable, capacity_tokens: int, K: int) -> None:
        super().__init__(table, capacity_tokens, K)
        self.reserved = 0

    def need(self, row: int) -> int:
        r = self.req
        return int(r.prompt[row] + r.out[row]) + self.K

    def never_fits(self, tokens: int) -> bool:
        return tokens + self.K > self.cap

    def take(self, row: int, need: int, others_running: bool) -> bool:
        if self.reserved + need > self.cap:
            return False    # FIFO: the head waits for KV; nothing behind it jumps the queue
        self.reserved += need
        return True

    def release(self, rows: np.ndarray) -> None:
        r = self.req
        self.reserved -= int((r.prompt[rows] + r.out[rows]).sum()) + self.K * len(rows)

    def grow_prompts(self, extra_tokens: int) -> None:
        """Admitted requests' prompts grew by ``extra_tokens`` in all (``Scheduler.apply_prefilled``)."""
        self.reserved += int(extra_tokens)

    @property
    def free_tokens(self) -> int:
        return self.cap - self.reserved


class PagedKV(KVManager):
    """Pages taken as tokens are written, preemption by recompute (see the module doc)."""

    paged = True

    def __init__(self, table: RequestTable, capacity_tokens: int, K: int, page_tokens: int, watermark: float) -> None:
        super().__init__(table, capacity_tokens, K)
        self.page = int(page_tokens)
        self.n_pages = self.cap // self.page
        self.wm_pages = int(watermark * self.n_pages)
        self.pages_used = 0

    def pages_for(self, tokens: Any) -> Any:
        """KV pages that hold ``tokens`` tokens (ceil)."""
        return -(-tokens // self.page)

    def need(self, row: int) -> int:
        r = self.req
        return self.pages_for(int(r.prompt[row] + r.regen[row])) * self.page

    def never_fits(self, tokens: int) -> bool:
        return self.pages_for(tokens + self.K) > self.n_pages

    def take(self, row: int, need: int, others_running: bool) -> bool:
        pages, free = need // self.page, self.n_pages - self.pages_used
        # the watermark keeps headroom for the running requests' growth; alone, a request may use it all
        if pages > free or (others_running and free - pages < self.wm_pages):
            return False
        self.req.pages[row] = pages
        self.pages_used += pages
        return True

    def grow(self, run: np.ndarray) -> bool:
        """Give every decoding request among running rows ``run`` the pages of its context + K draft slots; False
        (nothing taken) when they do not fit."""
        return self.grow_decoding(run[self.req.phase[run] == DECODE])

    def grow_decoding(self, dec: np.ndarray) -> bool:
        """:meth:`grow` given the decoding rows ``dec`` themselves."""
        r = self.req
        held = r.pages[dec]
        # pages_for(context + K): ceil(t / page) = (t + page - 1) // page for integers, the constants added at once
        want = r.prefilled[dec] + r.gen[dec]
        want -= r.regen[dec]
        want += self.K + self.page - 1
        want //= self.page
        now = np.maximum(want, held, out=want)     # held + max(want - held, 0)
        need = int(_sum(now)) - int(_sum(held))
        if need > self.n_pages - self.pages_used:
            return False
        if need:
            r.pages[dec] = now
        self.pages_used += need
        return True

    def check(self) -> None:
        if self.pages_used > self.n_pages:   # the invariant the property tests check step by step
            raise RuntimeError(f"KV pages overflow: {self.pages_used} > {self.n_pages}")

    def release(self, rows: np.ndarray) -> None:
        r = self.req
        self.pages_used -= int(_sum(r.pages[rows]))
        r.pages[rows] = 0

    def release_row(self, row: int) -> None:
        """Free a preempted request's pages."""
        r = self.req
        self.pages_used -= int(r.pages[row])
        r.pages[row] = 0

    @property
    def free_tokens(self) -> int:
        return (self.n_pages - self.pages_used) * self.page

    @property
    def used_pages(self) -> int:
        return self.pages_used


def make_kv(policy: str, table: RequestTable, capacity_tokens: int, K: int, page_tokens: int,
            watermark: float) -> ReserveKV | PagedKV:
    """The KV manager of ``policy`` (``EngineConfig.kv_policy``, checked there)."""
    if policy == "paged":
        return PagedKV(table, capacity_tokens, K, page_tokens, watermark)
    return ReserveKV(table, capacity_tokens, K)
