"""One serving engine: continuous batching with speculative decode steps (DESIGN.md section 6).

The public step contract, shared by the simulator and the torch runner::

    engine.drain(); engine.admit(now)          # take requests from the inbox (FIFO), admit FIFO
    plan = engine.plan_step()                  # StepPlan: decoding rows, their drafts' confidences, the policy's
                                               #   verify lengths, prefill chunks, M, context, the profile's price
                                               #   (the step's StepShape priced by cost/price.py's StepPricer)
    outcome = executor.execute(plan)           # StepOutcome: duration, accepted prefix per decoding row
    finished = engine.apply(plan, outcome, t)  # emit tokens, finish requests (at time t = end of the step)
    engine.record(plan, outcome, t_start)      # append the step to the engine's log

:class:`CostExecutor` (here) prices a plan on a cost profile; the runner's executors run torch. All per-request
work inside a step is numpy over the running requests (no Python event per token).

KV memory, two policies (``kv_policy``):

* ``"paged"`` (the run default, as vLLM): the cache is ``kv_capacity_tokens // page_tokens`` pages of
  ``page_tokens`` tokens. Admission (FIFO) takes the pages of the request's prompt (plus, after a preemption, its
  already generated tokens) and keeps at least ``watermark`` x pages free unless nothing runs (vLLM's block manager:
  ``watermark=0.01``, ``watermark_blocks = int(watermark * num_gpu_blocks)``, a prompt is admitted only if
  ``free - required >= watermark_blocks``; vllm/core/block_manager.py). Before each step every decoding request
  holds ``ceil((context + K) / page_tokens)`` pages (context = prompt + generated tokens; the step's K draft slots
  are written too, as vLLM V1's lookahead slots). When the step cannot get its pages the most recently admitted
  running request is preempted by recompute (vLLM V1 ``self.running.pop()``): its pages are freed, it re-queues at
  the FRONT of the waiting queue, and when readmitted it re-prefills prompt + already generated tokens (the last
  chunk's forward emits its next token). Nothing is admitted in a step that preempted (vLLM V1 schedules waiting
  requests only when no running one was preempted). Counted per request: preemptions and recomputed tokens (the
  KV tokens each preemption discarded).
* ``"reserve"`` (the pre-paging behaviour, bit for bit): a request is admitted only when its prompt + full output
  + K draft slots fit in the unreserved KV capacity, so nothing is ever preempted.

:class:`Engine` and :class:`~dsparksim.sim.cluster.Simulation` default to ``"reserve"`` (the real runner's fixed KV
slots); a run's :class:`~dsparksim.config.EngineConfig` defaults to ``"paged"``. Paged steps log ``kv_pages`` (pages
held, never above the capacity: checked every step) and ``preempted``; ``kv_used`` is then the pages' tokens.

A request that can never be served (prompt + output beyond ``max_model_len``, or prompt + output + K beyond the
whole KV capacity -- in pages when paged) is rejected on arrival by the cluster (:mod:`dsparksim.sim.cluster`), as
vLLM answers 400.

Disaggregated (``disaggregated=True``, decode-only engines): a request reaches the engine with its prompt's KV built
by the prefill pool (:mod:`dsparksim.sim.disagg`) and waits, like any request, for admission (KV room). Admitted,
it has all but its last prompt token prefilled: its first step here computes that token (a one-token prefill
chunk) and samples the first output token, which reaches the user at that step's end (vLLM's P/D connectors load
the remote KV of all but the last prompt token). A request preempted here re-prefills locally by recompute.

Long context: with the profile's ``seconds_per_query_kv`` (attention block) a step also pays that much per
query-key pair of its decoding requests' attention: request i, with context c_i and L_i verified drafts, runs
1 + L_i queries over its cache, (1 + L_i) * c_i + L_i (L_i + 1) / 2 pairs (``StepPlan.decode_qk``). The policy
prices candidate M with every extra verified token at the decoding requests' mean context (a 1-D price in M, the
paper's SPS(B)); the step itself is priced with the exact pairs.

Padded verification (``pad_verify``): an engine without variable-length attention kernels runs every decoding row
of a step at the step's longest verify length (CUDA-graph / static-shape verification): the target's forward is
priced at M + pad_tokens with pad_tokens = n_decode * max(L) - sum(L) (``StepShape.pad_tokens``; the long-context
term at the padded rows too), while only the chosen L[i] are verified. The policy is not told (it prices M as an
unpadded engine would). The log gains ``pad_tokens``.

Early exit of drafting (``draft_exit`` = T): the drafter stops a request's block at the first position whose running
survival falls below T (:mod:`dsparksim.sim.early_exit`): the policy sees the undrafted positions at confidence 0,
their verify lengths are capped at the drafted ones, and the step's drafting is priced for what was drafted
(``StepShape.draft_counts``, ``CostProfile.draft_time_exit``). The log gains ``drafted`` (positions drafted),
``draft_counts`` (requests drafting each position, space-separated), ``draft_s`` and ``draft_full_s`` (drafting
priced, and what all K positions would have cost).

Mixed prefill (``mixed_prefill``, default True = vLLM V1 and TensorRT-LLM's in-flight batching): a step carries
the decoding rows' tokens first and the rest of the token budget goes to prefill chunks. With ``mixed_prefill=False``
(SGLang's default, ``--enable-mixed-chunk`` off) a step that schedules any prefill chunk is a prefill-only step: it
carries no decode tokens, the decoding rows wait it out and decode on the next step without a chunk; the chunks
get ``min(prefill_chunk_tokens, max_batched_tokens)`` tokens (decode rows take none of that budget), and the step
is priced by the profile's prefill-only path (``n_decode == 0``), its ``kv_read`` being the context of the
non-decoding rows only. Sources: sgl-project/sglang python/sglang/srt/server_args.py ``enable_mixed_chunk: bool =
False``; python/sglang/srt/managers/scheduler.py (commit d51c1c21d1ac07cd5d1de9ead6c99087d8428e79)
``get_new_batch_prefill``: ``num_mixed_running = running_bs if self.is_mixed_chunk else 0`` and the running batch
is mixed into the prefill batch only ``if self.is_mixed_chunk``; ``get_next_batch_to_run`` in later versions:
``if new_batch is not None: # Run prefill first if possible`` else run the decode batch.

Randomness: with ``streams`` (:class:`dsparksim.sim.streams.RequestStreams`) the confidences and true accepted prefix
of request i's j-th decode step are a pure function of (seed, i, j), whichever engine, policy or load serves it.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import simpy

from dsparksim.acceptance.base import AcceptanceModel, Block
from dsparksim.cost.price import StepShape, chunk_query_keys, decode_query_keys
from dsparksim.cost.profile import CostProfile
from dsparksim.policies.base import Policy, StepContext
from dsparksim.sim.requests import DECODE, DONE, NOT_ARRIVED, PREFILL, REJECTED, WAITING, RequestTable  # noqa: F401
from dsparksim.sim.early_exit import check_threshold, drafted_lengths, mask_undrafted, position_counts
from dsparksim.sim.predraw import PredrawnDraws, supports_predraw
from dsparksim.sim.streams import RequestStreams

# Why a request was rejected on arrival (SimResult.reject_reason; 0 = not rejected).
REJECT_REASONS = {1: "max_model_len", 2: "kv_capacity"}
R_LEN, R_KV = 1, 2
KV_POLICIES = ("paged", "reserve")
# vLLM's admission watermark (vllm/core/block_manager.py, CacheConfig.watermark): 1% of the KV pages stay free.
DEFAULT_WATERMARK = 0.01
DEFAULT_PAGE_TOKENS = 16    # vLLM's default --block-size (KV page) on CUDA
LOG_KEYS = ("t_start", "dt", "n_decode", "n_prefill_tokens", "M", "verify_tokens", "emitted", "decode_emitted",
            "n_waiting", "n_running", "kv_used", "kv_read", "drafts", "accepted", "prefill_qk", "prefill_chunks",
            "decode_qk")
# The columns a step's price is a function of (with the profile, the drafter and K): reprice_steps() recomputes dt
# from them exactly.
PRICE_KEYS = ("M", "n_decode", "kv_read", "n_prefill_tokens", "prefill_qk", "prefill_chunks", "decode_qk")
# ... and, when the run logged them (--pad-verify, --draft-exit), these
EXTRA_PRICE_KEYS = ("pad_tokens", "draft_counts")


@dataclass
class StepPlan:
    """What one engine step does. Arrays are aligned with ``decode`` (n decoding requests, admission order).

    decode:        (n,) int64 request rows decoding this step
    slots:         (n,) int64 their slots (acceptance-source state, KV slot of the real runner)
    verify:        (n,) int64 L, draft tokens verified per request (0..K), chosen by the policy
    conf:          (n, K) float64 the draft confidences the policy saw
    true_accepted: (n,) int64 accepted prefix had all K been verified (drawn); None = real verification decides
    prefill:       [(row, slot, tokens prefilled before this chunk, chunk tokens)] in FIFO order
    M:             tokens in the target forward: n + sum(verify) + prefill tokens
    kv_read:       context tokens read (prefilled + generated of every running request, + this step's chunks)
    prefill_qk:    query-key pairs of the prefill chunks' causal attention
    predicted_s:   the cost profile's price of exactly this step
    decode_qk:     query-key pairs of the decoding rows' attention (long-context term; see the module doc)
    preempted:     rows preempted (paged KV) since the previous plan, to make room for this step; None = none
    kv_pages:      KV pages held after this step's allocation (paged KV; 0 under reserve)
    drafted:       (n,) positions each decoding row drafted (early exit; None = all K)
    pad_tokens:    verify tokens a padded engine runs beyond M (pad_verify; priced, never verified)
    """

    decode: np.ndarray
    slots: np.ndarray
    verify: np.ndarray
    conf: np.ndarray | None
    true_accepted: np.ndarray | None
    prefill: list[tuple[int, int, int, int]]
    M: int
    n_prefill: int
    kv_read: int
    prefill_qk: int
    K: int
    predicted_s: float
    n_running: int = 0
    decode_qk: int = 0
    preempted: np.ndarray | None = None
    kv_pages: int = 0
    drafted: np.ndarray | None = None
    pad_tokens: int = 0

    @property
    def n_decode(self) -> int:
        return int(self.decode.size)


@dataclass
class StepOutcome:
    """What executing a plan gave. ``accepted``: (n,) accepted prefix per decoding row (0..verify).
    ``emitted``/``decode_emitted``/``drafts``/``accepted_total`` are filled by :meth:`Engine.apply`;
    ``extra``: executor timings logged with the step (the real runner's draft/target/host split)."""

    duration_s: float
    accepted: np.ndarray
    emitted: int = 0
    decode_emitted: int = 0
    drafts: int = 0
    accepted_total: int = 0
    accepted_per_pos: np.ndarray | None = None
    extra: dict[str, float] = field(default_factory=dict)


class Inbox:
    """An engine's inbox: the rows routed to it and not yet drained, FIFO (``items``, as a simpy.Store names it).
    A put takes effect at once and schedules nothing (a simpy.Store scheduled an event per put and per get)."""

    __slots__ = ("items",)

    def __init__(self) -> None:
        self.items: list[int] = []

    def put(self, row: int) -> None:
        self.items.append(row)


class CostExecutor:
    """The simulator's executor: a step takes the profile's price of its plan; the drawn truth decides acceptance."""

    def execute(self, plan: StepPlan) -> StepOutcome:
        a = (np.minimum(plan.verify, plan.true_accepted) if plan.n_decode else np.zeros(0, np.int64))
        return StepOutcome(duration_s=plan.predicted_s, accepted=a)


class Engine:
    """One engine's scheduler state and step logic over a shared :class:`RequestTable` (see the module doc).

    ``slot_base``: first acceptance slot of this engine (engines sharing one acceptance source use disjoint
    slots). ``on_admit(rows)`` / ``on_finish(rows, now)`` callbacks let the cluster and the runner follow requests.
    """

    def __init__(self, *, table: RequestTable, profile: CostProfile, acceptance: AcceptanceModel, policy: Policy,
                 K: int, drafter: str, kv_capacity_tokens: int, max_num_seqs: int, max_batched_tokens: int,
                 prefill_chunk_tokens: int, streams: RequestStreams | None = None,
                 rng: np.random.Generator | None = None, index: int = 0, rank: int = 0, slot_base: int = 0,
                 max_model_len: int | None = None, kv_policy: str = "reserve",
                 kv_page_tokens: int = DEFAULT_PAGE_TOKENS, kv_watermark: float = DEFAULT_WATERMARK,
                 disaggregated: bool = False, mixed_prefill: bool = True, draft_exit: float | None = None,
                 pad_verify: bool = False) -> None:
        if streams is None and rng is None:
            raise ValueError("Engine needs keyed streams or a Generator for its acceptance draws")
        if kv_policy not in KV_POLICIES:
            raise ValueError(f"kv_policy must be one of {KV_POLICIES}, got {kv_policy!r}")
        if int(kv_page_tokens) < 1 or not 0 <= kv_watermark < 1:
            raise ValueError(f"need kv_page_tokens >= 1 and 0 <= kv_watermark < 1, got {kv_page_tokens}, "
                             f"{kv_watermark}")
        self.paged, self.disagg = kv_policy == "paged", bool(disaggregated)
        self.kv_policy = kv_policy
        self.mixed = bool(mixed_prefill)
        self.draft_exit = check_threshold(draft_exit)   # early exit of drafting (module sim/early_exit.py)
        self.pad_verify = bool(pad_verify)              # verify lengths padded to the step's maximum (module doc)
        self._exit_log = (0.0, 0.0)                     # this step's drafting priced, and all K positions' price
        self.page = int(kv_page_tokens)
        self.n_pages = int(kv_capacity_tokens) // self.page
        self.wm_pages = int(kv_watermark * self.n_pages)
        self.pages_used = 0
        self._grown = False   # paged: admit() gave every decoding request its pages for the coming step
        self.n_preemptions = 0
        self._preempted: list[int] = []
        self.req, self.profile, self.acc, self.policy = table, profile, acceptance, policy
        self.K, self.drafter = int(K), drafter
        self.kv_cap, self.max_seqs = int(kv_capacity_tokens), int(max_num_seqs)
        self.max_tokens, self.chunk = int(max_batched_tokens), int(prefill_chunk_tokens)
        self.streams, self.rng = streams, rng
        self.index, self.rank = int(index), int(rank)
        self.max_model_len = max_model_len
        self.inbox: Inbox | None = None
        self.running: list[int] = []
        self._run_arr: np.ndarray | None = np.zeros(0, np.int64)
        self.free_slots: list[int] = list(range(slot_base + self.max_seqs - 1, slot_base - 1, -1))
        self.waiting: deque[int] = deque()
        self.kv_reserved = 0
        self.waiting_need = 0   # KV the waiting requests will reserve (the least-kv router reads it)
        self.n_admitted = 0
        self.on_admit: list[Callable[[list[int]], None]] = []
        self.on_finish: list[Callable[[np.ndarray, float], None]] = []
        self.log: dict[str, list] = {k: [] for k in LOG_KEYS}
        self.acc_pos_log: list[np.ndarray] = []
        self._words = int(getattr(acceptance, "words_per_step", 8))
        # the step's price (cost/price.py): the profile's pricer for this token budget
        self.pricer = profile.pricer(self.max_tokens)
        # keyed draws of a pure acceptance source are drawn ahead in blocks of steps per request (same values),
        # by one PredrawnDraws shared by the engines of the request table
        self._pre: PredrawnDraws | None = None
        if streams is not None and supports_predraw(acceptance):
            pre = table.predraw
            if pre is None or pre.acc is not acceptance or pre.K != self.K or pre.streams is not streams:
                pre = table.predraw = PredrawnDraws(acceptance, streams, table, self.K, self._words)
            self._pre = pre

    # ---------------------------------------------------------------- inbox and admission
    def attach(self, env: simpy.Environment) -> "Inbox":
        """Create the inbox of request rows (for the engine stepped in ``env``)."""
        self.inbox = Inbox()
        return self.inbox

    def drain(self) -> int:
        """Move every request in the inbox to the waiting queue (FIFO); returns how many."""
        box = self.inbox
        if box is None or not box.items:
            return 0
        rows, box.items = box.items, []
        for row in rows:
            self.enqueue(row)
        return len(rows)

    def enqueue(self, row: int) -> None:
        """Queue request ``row`` for admission (it has been checked servable)."""
        r = self.req
        r.phase[row] = WAITING
        r.replica[row] = self.index
        self.waiting.append(row)
        self.waiting_need += self._need(row)

    def _need(self, row: int) -> int:
        """KV tokens request ``row`` takes at admission: prompt + output + K (reserve); the pages of its prompt and
        regenerated tokens (paged)."""
        r = self.req
        if self.paged:
            return self.pages_for(int(r.prompt[row] + r.regen[row])) * self.page
        return int(r.prompt[row] + r.out[row]) + self.K

    def pages_for(self, tokens: Any) -> Any:
        """KV pages that hold ``tokens`` tokens (ceil)."""
        return -(-tokens // self.page)

    @property
    def outstanding(self) -> int:
        """Requests routed here and not finished: running + waiting + still in the inbox."""
        return len(self.running) + len(self.waiting) + (len(self.inbox.items) if self.inbox is not None else 0)

    @property
    def free_kv(self) -> int:
        """KV tokens neither reserved (paged: held in pages) by running requests nor needed by queued ones."""
        if self.paged:
            return (self.n_pages - self.pages_used) * self.page - self.waiting_need
        return self.kv_cap - self.kv_reserved - self.waiting_need

    def reject_reason(self, row: int) -> int:
        """0 if request ``row`` can ever be served here, else a key of REJECT_REASONS."""
        total = int(self.req.prompt[row] + self.req.out[row])
        if self.max_model_len is not None and total > self.max_model_len:
            return R_LEN
        if (self.pages_for(total + self.K) > self.n_pages) if self.paged else (total + self.K > self.kv_cap):
            return R_KV
        return 0

    def admit(self, now: float) -> list[int]:
        """Admit waiting requests FIFO while KV, slots and the token budget allow; returns the rows admitted.
        Paged KV: first gives the running requests their next step's pages (preempting if needed; a step that
        preempted admits nothing)."""
        K, r = self.K, self.req
        new: list[int] = []
        if self.paged:
            if self._grow_pages():
                return new
            self._grown = True   # plan_step need not grow again unless this admission adds decoding rows
        while self.waiting and self.free_slots:
            row = self.waiting[0]
            if self.paged:
                need = self._need(row)
                pages, free = need // self.page, self.n_pages - self.pages_used
                # the watermark keeps headroom for the running requests' growth; alone, a request may use it all
                if pages > free or (self.running and free - pages < self.wm_pages):
                    break
            else:
                need = int(r.prompt[row] + r.out[row] + K)
                if self.kv_reserved + need > self.kv_cap:
                    break  # FIFO: the head waits for KV; nothing behind it jumps the queue
            if (len(self.running) + 1) * (1 + K) > self.max_tokens:
                break
            self.waiting.popleft()
            self.waiting_need -= need
            if self.paged:
                r.pages[row] = pages
                self.pages_used += pages
            else:
                self.kv_reserved += need
            slot = self.free_slots.pop()
            r.slot_of[row] = slot
            r.phase[row] = PREFILL
            if r.preempt[row] == 0:
                r.admitted[row] = now       # first admission (a preempted request keeps its own)
                if self.disagg:
                    # the prefill pool built the prompt's KV: the first step here computes the last prompt token
                    # and samples the first output token (module doc)
                    r.prefilled[row] = r.prompt[row] - 1
            self.n_admitted += 1
            self.running.append(row)
            new.append(row)
        if new:
            self._run_arr = None
            rows = np.array(new, np.int64)
            # one call for all admitted requests: each row's start draws are keyed by its request alone
            if self._pre is not None:
                self._pre.admit(rows)        # the source's per-request state, keyed by each request alone
            else:
                rng = self.rng if self.streams is None else self.streams.rows(r.key[rows], -1, 1)
                self.acc.start(r.slot_of[rows], r.domain[rows], rng)
            if self.disagg:
                self._grown = False
            for cb in self.on_admit:
                cb(new)
        return new

    # ---------------------------------------------------------------- paged KV
    def _grow_pages(self) -> bool:
        """Paged KV: give every decoding request the pages of its context + K draft slots, preempting the most
        recently admitted running request while they do not fit; True if any request was preempted."""
        r = self.req
        preempted = False
        while self.running:
            run = self.running_rows()
            dec = run[r.phase[run] == DECODE]
            held = r.pages[dec]
            want = self.pages_for(r.prefilled[dec] + r.gen[dec] - r.regen[dec] + self.K)
            grow = np.maximum(want - held, 0)
            need = int(grow.sum())
            if need <= self.n_pages - self.pages_used:
                if need:
                    r.pages[dec] = held + grow
                self.pages_used += need
                break
            self._preempt(self.running[-1])
            preempted = True
        if self.pages_used > self.n_pages:   # the invariant the property tests check step by step
            raise RuntimeError(f"KV pages overflow: {self.pages_used} > {self.n_pages}")
        return preempted

    def _preempt(self, row: int) -> None:
        """Preempt running request ``row`` by recompute: free its pages and slot, re-queue it at the front."""
        r = self.req
        r.recomp[row] += int(r.prefilled[row] + r.gen[row] - r.regen[row])   # KV tokens thrown away
        r.preempt[row] += 1
        self.n_preemptions += 1
        self.pages_used -= int(r.pages[row])
        r.pages[row] = 0
        self.running.remove(row)
        self._run_arr = None
        self.free_slots.append(int(r.slot_of[row]))
        r.regen[row] = r.gen[row]            # re-prefill prompt + every token generated so far
        r.prefilled[row] = 0
        r.phase[row] = WAITING
        self.waiting.appendleft(row)
        self.waiting_need += self._need(row)
        self._preempted.append(row)

    def skip_prefill(self, rows: np.ndarray, contexts: np.ndarray, now: float) -> None:
        """Mark admitted requests ``rows`` (running, nothing prefilled yet) as fully prefilled with ``contexts``
        tokens each, their first token emitted at ``now``, without running a prefill step; their prompt length
        becomes the context and the KV reservation follows. For profiling decode steps at long contexts (the
        real runner's ``measure``); a request must have more than one output token left."""
        r = self.req
        rows = np.asarray(rows, np.int64)
        ctx = np.asarray(contexts, np.int64)
        if rows.shape != ctx.shape or rows.ndim != 1:
            raise ValueError(f"skip_prefill: {rows.shape} rows but {ctx.shape} contexts")
        if self.paged:
            raise ValueError("skip_prefill: supported with kv_policy 'reserve' only")
        if not set(rows.tolist()) <= set(self.running):
            raise ValueError("skip_prefill: every row must be running on this engine")
        if (r.phase[rows] != PREFILL).any() or r.prefilled[rows].any() or (ctx < 1).any() or (r.out[rows] < 2).any():
            raise ValueError("skip_prefill: rows must be admitted, not yet prefilled, with contexts >= 1 and more "
                             "than one output token")
        self.kv_reserved += int((ctx - r.prompt[rows]).sum())
        r.prompt[rows] = ctx
        r.prefilled[rows] = ctx
        r.phase[rows] = DECODE
        r.first_tok[rows] = now
        r.gen[rows] = 1

    # ---------------------------------------------------------------- one step
    def running_rows(self) -> np.ndarray:
        if self._run_arr is None:
            self._run_arr = np.fromiter(self.running, np.int64, len(self.running))
        return self._run_arr

    def draw(self, dec: np.ndarray, slots: np.ndarray) -> Block:
        """This step's confidences and true accepted prefixes for decoding rows ``dec`` (keyed: (seed, row, j))."""
        if self.streams is None:
            return self.acc.draw(slots, self.rng)
        if self._pre is not None:
            conf, surv, acc = self._pre.take(dec)
            return Block(conf=conf, accepted=acc, survival=surv)
        r = self.req
        return self.acc.draw(slots, self.streams.rows(r.key[dec], r.dsteps[dec], self._words))

    def plan_step(self, draft: Callable[[np.ndarray, np.ndarray], Block] | None = None) -> StepPlan | None:
        """Plan the next step over the running requests (None if none runs). ``draft(rows, slots)`` replaces the
        acceptance draw (the live runner drafts for real and leaves ``true_accepted`` None)."""
        if self.paged and not self._grown:
            self._grow_pages()
        self._grown = False
        if not self.running:
            return None
        K, r = self.K, self.req
        run = self.running_rows()
        n_run = len(run)
        ph = r.phase[run]
        dec = run[ph == DECODE]
        n_dec = len(dec)
        # Chunked prefill: decode tokens first, the rest of the budget goes to prefills in FIFO order. Not mixed
        # (SGLang's default): the chunks get the whole budget and a step with a chunk carries no decode (module doc).
        budget = min(self.chunk, self.max_tokens - (n_dec * (1 + K) if self.mixed else 0))
        chunks: list[tuple[int, int, int, int]] = []
        n_pf = pf_qk = 0
        if n_dec < len(run):
            for row in run[ph == PREFILL]:
                if budget <= 0:
                    break
                done = int(r.prefilled[row])
                c = int(min(r.prompt[row] + r.regen[row] - done, budget))
                chunks.append((int(row), int(r.slot_of[row]), done, c))
                budget -= c
                n_pf += c
                # prefill beyond the verify term: the quadratic query-key part of the chunk's causal attention
                pf_qk += chunk_query_keys(c, done)
        if chunks and not self.mixed and n_dec:
            # a prefill-only step: the decoding rows wait; only the prefilling rows' context is read
            dec, n_dec = dec[:0], 0
            run = run[ph != DECODE]
        kv_read = int(r.prefilled[run].sum() + r.gen[run].sum() - r.regen[run].sum()) + n_pf
        slots = r.slot_of[dec]
        blk = drafted = counts = None
        if n_dec:
            blk = draft(dec, slots) if draft is not None else self.draw(dec, slots)
            if self.draft_exit is not None and self.drafter is not None and K > 1:
                # early exit: the drafter stopped each block at its survival threshold (module sim/early_exit.py)
                drafted = drafted_lengths(np.cumprod(blk.conf[:, :K], axis=1) if blk.survival is None
                                          else blk.survival, self.draft_exit)
                counts = tuple(position_counts(drafted, K).tolist())
        pricer = self.pricer
        # StepShape(M, n_decode, kv_read, prefill_tokens, prefill_qk, prefill_chunks, decode_qk, drafter, K,
        # pad_tokens, draft_counts), positional (built every step); M and decode_qk before the policy's choice
        step_time = base_time = pricer.step_time(StepShape(n_dec + n_pf, n_dec, kv_read, n_pf, pf_qk, len(chunks), 0,
                                                           self.drafter, K, 0, counts))
        if counts is not None:
            kv_d = kv_read if pricer.drafter_reads_kv(self.drafter) else 0
            self._exit_log = (self.profile.draft_time_exit(self.drafter, counts, K, kv_d),
                              float(self.profile.draft_time(self.drafter, n_dec, K, kv_d)))
        dctx = None
        if pricer.sq and n_dec:
            # long context: the policy prices each extra verified token at the decoding rows' mean context
            dctx = r.prefilled[dec] + r.gen[dec] - r.regen[dec]
            step_time = pricer.with_decode_qk(base_time, int(dctx.sum()), float(dctx.mean()), n_dec + n_pf)
        L = np.zeros(0, np.int64)
        conf = A = None
        if n_dec:
            conf = blk.conf[:, :K]
            A = blk.accepted
            surv = np.cumprod(conf, axis=1) if blk.survival is None else blk.survival
            if drafted is not None:
                conf, surv = mask_undrafted(conf, surv, drafted)
            ctx = StepContext(conf=conf, survival=surv, request_ids=dec,
                              base_tokens=n_dec + n_pf, step_time=step_time, max_tokens=self.max_tokens,
                              true_accepted=A if self.policy.needs_oracle else None, drafted=drafted,
                              context=dctx, qk_s=float(pricer.sq) if dctx is not None else 0.0)
            L = np.asarray(self.policy.choose(ctx), dtype=np.int64)
            if L.shape != (n_dec,) or (n_dec and (L.min() < 0 or L.max() > K)):
                raise RuntimeError(f"policy {self.policy.spec} returned invalid verify lengths {L!r} (K={K})")
            if drafted is not None:
                L = np.minimum(L, drafted)   # positions never drafted cannot be verified
        M = n_dec + n_pf + int(L.sum())
        if M > self.max_tokens:
            raise RuntimeError(f"policy {self.policy.spec} exceeded the token budget: M={M} > {self.max_tokens}")
        # a padded engine (no variable-length attention kernels) runs every decoding row at the step's longest
        # verify length: the target's forward is priced at M + pad (module doc); M + pad <= n_dec (1 + K) + n_pf
        # <= max_tokens (admission and the chunk budget)
        Lp = np.full(n_dec, int(L.max()), np.int64) if self.pad_verify and n_dec else L
        pad = int(Lp.sum()) - int(L.sum())
        dec_qk = 0 if dctx is None else int(decode_query_keys(Lp, dctx).sum())
        dt = pricer.charge(base_time, M + pad, n_dec, dec_qk)
        if not dt > 0:
            raise RuntimeError(f"non-positive step time {dt} at M={M}")
        pre = None
        if self._preempted:
            pre, self._preempted = np.array(self._preempted, np.int64), []
        return StepPlan(decode=dec, slots=slots, verify=L, conf=conf, true_accepted=A, prefill=chunks, M=M,
                        n_prefill=n_pf, kv_read=kv_read, prefill_qk=pf_qk, K=K, predicted_s=dt,
                        n_running=n_run, decode_qk=dec_qk, preempted=pre, kv_pages=self.pages_used,
                        drafted=drafted, pad_tokens=pad)

    def apply(self, plan: StepPlan, outcome: StepOutcome, now: float) -> np.ndarray:
        """Apply an executed step at time ``now`` (its end): emit tokens, advance prefills, finish requests.
        Fills the outcome's token counts; returns the rows that finished."""
        dec, L, a, r = plan.decode, plan.verify, outcome.accepted, self.req
        emitted = 0
        finished: list[np.ndarray] = []
        if len(dec):
            a = np.asarray(a, np.int64)
            if a.shape != dec.shape or (a.size and (a.min() < 0 or (a > L).any())):
                raise RuntimeError(f"executor returned accepted prefixes {a!r} outside 0..verify {L!r}")
            # vLLM's spec-decode counters: a draft is a request verifying >= 1 draft token this step.
            drafted = a[L > 0]
            outcome.drafts, outcome.accepted_total = int(drafted.size), int(drafted.sum())
            # requests whose accepted prefix reached past position p: a reversed cumulative count
            cnt = np.bincount(drafted, minlength=self.K + 1)
            outcome.accepted_per_pos = np.cumsum(cnt[::-1])[::-1][1:self.K + 1].astype(np.int64)
            out, gen = r.out[dec], r.gen[dec]
            emit = np.minimum(a + 1, out - gen)  # the last step may overshoot: stop at length
            gen += emit
            r.gen[dec] = gen
            r.demit[dec] += emit
            r.dsteps[dec] += 1
            r.vtok[dec] += L
            r.atok[dec] += a
            emitted = int(emit.sum())
            self.policy.observe(dec, L, a)
            finished.append(dec[gen >= out])
        else:
            outcome.accepted_per_pos = np.zeros(self.K, np.int64)
        outcome.decode_emitted = emitted
        for row, _slot, _done, c in plan.prefill:
            r.prefilled[row] += c
            if r.prefilled[row] == r.prompt[row] + r.regen[row]:
                # The last prefill chunk's forward produces the first output token (after a preemption: the
                # next one; the first token's time stays).
                r.phase[row] = DECODE
                if r.regen[row] == 0:
                    r.first_tok[row] = now
                r.gen[row] += 1
                emitted += 1
                if r.gen[row] >= r.out[row]:
                    finished.append(np.array([row]))
        outcome.emitted = emitted
        done = np.concatenate(finished) if finished else np.zeros(0, np.int64)
        if len(done):
            self._finish(done, now)
        return done

    def record(self, plan: StepPlan, outcome: StepOutcome, t_start: float) -> None:
        """Append the applied step to the log (one row per step; ``outcome.extra`` adds executor columns)."""
        lg = self.log
        lg["t_start"].append(t_start)
        lg["dt"].append(outcome.duration_s)
        lg["n_decode"].append(plan.n_decode)
        lg["n_prefill_tokens"].append(plan.n_prefill)
        lg["M"].append(plan.M)
        lg["verify_tokens"].append(int(plan.verify.sum()))
        lg["emitted"].append(outcome.emitted)
        lg["decode_emitted"].append(outcome.decode_emitted)
        lg["n_waiting"].append(len(self.waiting))
        lg["n_running"].append(plan.n_running)
        if self.paged:
            lg["kv_used"].append(plan.kv_pages * self.page)    # tokens held in pages
            lg.setdefault("kv_pages", []).append(plan.kv_pages)
            lg.setdefault("preempted", []).append(0 if plan.preempted is None else len(plan.preempted))
        else:
            lg["kv_used"].append(plan.kv_read + plan.n_running * self.K)
        lg["kv_read"].append(plan.kv_read)
        lg["drafts"].append(outcome.drafts)
        lg["accepted"].append(outcome.accepted_total)
        lg["prefill_qk"].append(plan.prefill_qk)
        lg["prefill_chunks"].append(len(plan.prefill))
        lg["decode_qk"].append(plan.decode_qk)
        if self.pad_verify:
            lg.setdefault("pad_tokens", []).append(plan.pad_tokens)
        if self.draft_exit is not None:
            d = plan.drafted
            lg.setdefault("drafted", []).append(0 if d is None else int(d.sum()))
            lg.setdefault("draft_counts", []).append(
                "" if d is None else " ".join(map(str, position_counts(d, self.K).tolist())))
            lg.setdefault("draft_s", []).append(self._exit_log[0] if d is not None else 0.0)
            lg.setdefault("draft_full_s", []).append(self._exit_log[1] if d is not None else 0.0)
        self.acc_pos_log.append(outcome.accepted_per_pos)
        for k, v in outcome.extra.items():
            lg.setdefault(k, []).append(v)

    def _finish(self, rows: np.ndarray, now: float) -> None:
        K, r = self.K, self.req
        r.phase[rows] = DONE
        r.finish[rows] = now
        if len(rows) == 1:
            self.running.remove(int(rows[0]))
        else:
            done = set(rows.tolist())
            self.running = [x for x in self.running if x not in done]
        self._run_arr = None
        if self.paged:
            self.pages_used -= int(r.pages[rows].sum())
            r.pages[rows] = 0
        else:
            self.kv_reserved -= int((r.prompt[rows] + r.out[rows]).sum()) + K * len(rows)
        self.free_slots.extend(r.slot_of[rows].tolist())
        for cb in self.on_finish:
            cb(rows, now)


def reprice_steps(profile: CostProfile, steps: Any, drafter: str | None, K: int,
                  max_batched_tokens: int | None = None) -> np.ndarray:
    """The price of every logged step, recomputed from its shape (the PRICE_KEYS columns of an engine's step log,
    with EXTRA_PRICE_KEYS where logged; a dict of arrays or a DataFrame) by the profile's pricer, as
    :meth:`Engine.plan_step` charged it, so that it equals the logged ``dt`` of a simulated single-rank step bit for bit. A DP rank's own price is its
    ``rank_busy_s`` (its ``dt`` is the slowest rank's). ``max_batched_tokens``: the run's token budget (None = the
    profile's largest breakpoint), which decides whether verify times came from the dense table."""
    cols = {k: steps[k] for k in PRICE_KEYS} | {k: steps[k] for k in EXTRA_PRICE_KEYS if k in steps}
    shape = StepShape.from_log(cols, drafter, K)
    return profile.pricer(max_batched_tokens).seconds_each(shape)
