"""One engine's scheduler: continuous batching with speculative decode steps (DESIGN.md section 6); vLLM v1's
Scheduler. It admits waiting requests under its KV manager (:mod:`dsparksim.sim.kv`), plans each step
(:meth:`Scheduler.plan_step`: the policy's verify lengths, prefill chunks, the profile's price) and applies the
executed step (:meth:`Scheduler.apply`); the step contract (StepPlan, StepOutcome, Executor) is
:mod:`dsparksim.sim.contract` and one :class:`~dsparksim.sim.driver.Driver` runs it. All per-request work inside a
step is numpy over the running requests (no Python event per token).

Paged KV (:class:`~dsparksim.sim.kv.PagedKV`): when the step cannot get its pages the most recently admitted running
request is preempted by recompute (vLLM V1 ``self.running.pop()``): its pages are freed, it re-queues at the FRONT
of the waiting queue, and when readmitted it re-prefills prompt + already generated tokens (the last chunk's
forward emits its next token). Nothing is admitted in a step that preempted (vLLM V1 schedules waiting requests
only when no running one was preempted). Counted per request: preemptions and recomputed tokens (the KV tokens
each preemption discarded). Paged steps log ``kv_pages`` (pages held, never above the capacity: checked every
step) and ``preempted``; ``kv_used`` is then the pages' tokens. Reserve KV (:class:`~dsparksim.sim.kv.ReserveKV`)
never preempts.

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
survival falls below T (:mod:`dsparksim.sim.early_exit`): the policy sees the undrafted positions at confidence 0
(and counts none of them as a candidate), their verify lengths are capped at the drafted ones, and the step's drafting is priced for what was drafted
(``StepShape.draft_counts``, ``CostProfile.draft_time_exit``). The log gains ``drafted`` (positions drafted),
``draft_counts`` (requests drafting each position, space-separated), ``draft_s`` and ``draft_full_s`` (drafting
priced, and what all K positions would have cost).

Mixed prefill (``mixed_prefill``, default True = vLLM V1 and TensorRT-LLM's in-flight batching): a step carries
the decoding rows' tokens first and the rest of the token budget goes to prefill chunks. With ``mixed_prefill=False``
(SGLang's default, ``--enable-mixed-chunk`` off) a step that schedules any prefill chunk is a prefill-only step: it
carries no decode tokens, the decoding rows wait it out and decode on the next step without a chunk; the chunks
get ``min(prefill_chunk_tokens, max_batched_tokens)`` tokens (decode rows take none of that budget), and the step
is priced by the profile's prefill-only path (``n_decode == 0``), its ``kv_read`` being the context of the
non-decoding rows only. A decode-only engine (``disaggregated``) always mixes: SGLang's decode server runs no prefill
forward for a transferred request (its ``PrebuiltExtendBatch`` only fills metadata, then the request joins the
running batch: python/sglang/srt/disaggregation/decode.py), so its one-token first step, and a preempted request's
local re-prefill, ride with the decode rows (a prefill-only step there would stall every decoding request for it). Sources: sgl-project/sglang python/sglang/srt/server_args.py ``enable_mixed_chunk: bool =
False``; python/sglang/srt/managers/scheduler.py (commit d51c1c21d1ac07cd5d1de9ead6c99087d8428e79)
``get_new_batch_prefill``: ``num_mixed_running = running_bs if self.is_mixed_chunk else 0`` and the running batch
is mixed into the prefill batch only ``if self.is_mixed_chunk``; ``get_next_batch_to_run`` in later versions:
``if new_batch is not None: # Run prefill first if possible`` else run the decode batch.

Randomness: with ``streams`` (:class:`dsparksim.sim.streams.RequestStreams`) the confidences and true accepted prefix
of request i's j-th decode step are a pure function of (seed, i, j), whichever engine, policy or load serves it.
"""
from __future__ import annotations

from collections import deque
from typing import Any, Callable

import numpy as np

from dsparksim.acceptance.base import Block
from dsparksim.config import EngineConfig
from dsparksim.cost.price import StepShape, chunk_query_keys, decode_query_keys
from dsparksim.cost.profile import CostProfile
from dsparksim.policies.base import Policy, StepContext
from dsparksim.sim.batch_wait import BatchWait
from dsparksim.sim.contract import NewRequest, Prefilled, StepOutcome, StepPlan
from dsparksim.sim.inputs import ResolvedInputs
from dsparksim.sim.kv import R_KV, R_LEN, make_kv
from dsparksim.sim.early_exit import drafted_lengths, mask_undrafted, position_counts
from dsparksim.sim.predraw import PredrawnDraws, supports_predraw
from dsparksim.sim.requests import DECODE, DONE, PREFILL, WAITING, RequestTable
from dsparksim.sim.streams import RequestStreams

LOG_KEYS = ("t_start", "dt", "n_decode", "n_prefill_tokens", "M", "verify_tokens", "emitted", "decode_emitted",
            "n_waiting", "n_running", "kv_used", "kv_read", "drafts", "accepted", "prefill_qk", "prefill_chunks",
            "decode_qk")
# The columns a step's price is a function of (with the profile, the drafter and K): reprice_steps() recomputes dt
# from them exactly.
PRICE_KEYS = ("M", "n_decode", "kv_read", "n_prefill_tokens", "prefill_qk", "prefill_chunks", "decode_qk")
# ... and, when the run logged them (--pad-verify, --draft-exit), these
EXTRA_PRICE_KEYS = ("pad_tokens", "draft_counts")

# ndarray.sum() without its Python wrapper (a few calls per engine step; the same reduction)
_sum = np.add.reduce


class Inbox:
    """An engine's inbox: the rows routed to it and not yet drained, FIFO (``items``, as a simpy.Store names it).
    A put takes effect at once and schedules nothing (a simpy.Store scheduled an event per put and per get)."""

    __slots__ = ("items",)

    def __init__(self) -> None:
        self.items: list[int] = []

    def put(self, row: int) -> None:
        self.items.append(row)


class Scheduler:
    """One engine's scheduler state and step logic over a shared :class:`RequestTable` (see the module doc).

    ``config``: the engine's options (KV policy, slots, chunking, mixing, disaggregation); ``inputs``: the resolved
    profile, acceptance source, K, drafter, KV capacity, token budget and ``max_model_len`` (they win over
    ``config``'s unresolved block_size/drafter/kv_capacity_tokens/max_batched_tokens); ``policy``: this engine's
    policy object (default ``inputs.policy``). Acceptance draws come from keyed ``streams`` or, legacy, ``rng``.
    ``index``: this engine's index in the cluster; ``slot_base``: its first acceptance slot (engines sharing one
    acceptance source use disjoint slots).
    """

    def __init__(self, config: EngineConfig, inputs: ResolvedInputs, table: RequestTable, *,
                 streams: RequestStreams | None = None, rng: np.random.Generator | None = None,
                 policy: Policy | None = None, index: int = 0, slot_base: int = 0) -> None:
        if streams is None and rng is None:
            raise ValueError("Scheduler needs keyed streams or a Generator for its acceptance draws")
        K = int(inputs.K)
        self.req, self.profile, self.acc = table, inputs.profile, inputs.acceptance
        self.policy = inputs.policy if policy is None else policy
        self.K, self.drafter = K, inputs.drafter
        self.kv = make_kv(config.kv_policy, table, inputs.kv_cap, K, config.kv_page_tokens, config.kv_watermark)
        # A decode-only engine never runs a prefill-only step, whatever mixed_prefill says (module doc)
        self.paged, self.disagg = self.kv.paged, config.disaggregated
        self.mixed = config.mixed_prefill or config.disaggregated
        self.draft_exit = config.draft_exit     # early exit of drafting (module sim/early_exit.py)
        self.pad_verify = config.pad_verify     # verify lengths padded to the step's maximum (module doc)
        self._exit_log = (0.0, 0.0)             # this step's drafting priced, and all K positions' price
        self._grown = False   # paged: admit() gave every decoding request its pages for the coming step
        self._grown_dec: np.ndarray | None = None   # paged: the decoding rows the last growth gave pages to
        self.n_preemptions = 0
        self._preempted: list[int] = []
        self._suspended: dict[int, Any] = {}   # preempted row -> its acceptance state (AcceptanceModel.suspend)
        # Paged KV: each preemption of a request that had streamed its first token, as [row, first step it misses,
        # the step whose re-prefill streams its next token] (steps: indices into this engine's log; -1 while it is
        # not back): between two of its chunks the client sees one gap, the sum of those steps' dt (bench ITLs).
        self.gaps: list[list[int]] = []
        self._gap_open: dict[int, list[int]] = {}
        self.max_seqs, self.max_tokens = config.max_num_seqs, int(inputs.max_tokens)
        self.chunk = config.prefill_chunk_tokens
        # TensorRT-LLM's batch waiting (sim/batch_wait.py): None = prefills are scheduled as soon as they fit. Its
        # max_num_tokens bounds both a step's tokens and the contexts it schedules; here the smaller of the token
        # budget and the prefill chunk plays that part (both are TensorRT-LLM's max_num_tokens when set to it)
        self.batch_wait = (None if config.batch_wait_timeout_iters is None else
                           BatchWait(config.batch_wait_timeout_iters, config.batch_wait_max_tokens_ratio,
                                     min(self.max_tokens, self.chunk)))
        self.streams, self.rng = streams, rng
        self.index = int(index)
        self.max_model_len = inputs.max_model_len
        self.inbox = Inbox()
        # the running rows in admission order (:meth:`running_rows`); ``running`` lists them, built when read
        self._run_arr = np.zeros(0, np.int64)
        self._run_list: tuple[int, ...] | None = ()
        self.free_slots: list[int] = list(range(slot_base + self.max_seqs - 1, slot_base - 1, -1))
        self.waiting: deque[int] = deque()
        self.waiting_need = 0   # KV the waiting requests will take (the least-kv router reads it)
        self.n_admitted = 0
        self.log: dict[str, list] = {k: [] for k in LOG_KEYS}
        self.acc_pos_log: list[np.ndarray] = []
        self._words = int(getattr(self.acc, "words_per_step", 8))   # an acceptance object, not a config
        # the step's price (cost/price.py): the profile's pricer for this token budget
        self.pricer = self.profile.pricer(self.max_tokens)
        # keyed draws of a pure acceptance source are drawn ahead in blocks of steps per request (same values),
        # by one PredrawnDraws shared by the engines of the request table
        self._pre: PredrawnDraws | None = None
        if streams is not None and supports_predraw(self.acc):
            pre = table.predraw
            if pre is None or pre.acc is not self.acc or pre.K != K or pre.streams is not streams:
                pre = table.predraw = PredrawnDraws(self.acc, streams, table, K, self._words)
            self._pre = pre

    # ---------------------------------------------------------------- inbox and admission
    def drain(self) -> int:
        """Move every request in the inbox to the waiting queue (FIFO); returns how many."""
        box = self.inbox
        if not box.items:
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
        self.waiting_need += self.kv.need(row)

    @property
    def running(self) -> tuple[int, ...]:
        """The running rows in admission order (built from :meth:`running_rows` when read; a tuple, so that code
        which tried to change it fails loudly instead of changing a copy)."""
        if self._run_list is None:
            self._run_list = tuple(self._run_arr.tolist())
        return self._run_list

    @property
    def outstanding(self) -> int:
        """Requests routed here and not finished: running + waiting + still in the inbox."""
        return len(self._run_arr) + len(self.waiting) + len(self.inbox.items)

    @property
    def free_kv(self) -> int:
        """KV tokens neither reserved (paged: held in pages) by running requests nor needed by queued ones."""
        return self.kv.free_tokens - self.waiting_need

    def reject_reason(self, row: int) -> int:
        """0 if request ``row`` can ever be served here, else a key of REJECT_REASONS."""
        total = int(self.req.prompt[row] + self.req.out[row])
        if self.max_model_len is not None and total > self.max_model_len:
            return R_LEN
        if self.kv.never_fits(total):
            return R_KV
        return 0

    def admit(self, now: float) -> list[int]:
        """Admit waiting requests FIFO while KV, slots and the token budget allow; returns the rows admitted.
        Paged KV: first gives the running requests their next step's pages (preempting if needed; a step that
        preempted admits nothing)."""
        K, r, kv = self.K, self.req, self.kv
        new: list[int] = []
        n_run = len(self._run_arr)    # running requests, those admitted below included
        if self.paged:
            if self._grow():
                return new
            self._grown = True   # plan_step need not grow again unless this admission adds decoding rows
        while self.waiting and self.free_slots:
            row = self.waiting[0]
            if (n_run + 1) * (1 + K) > self.max_tokens:
                break
            need = kv.need(row)
            if not kv.take(row, need, n_run > 0):
                break   # FIFO: the head waits for KV; nothing behind it jumps the queue
            self.waiting.popleft()
            self.waiting_need -= need
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
            n_run += 1
            new.append(row)
        if new:
            rows = np.array(new, np.int64)
            # running = the rows before + the admitted, in that order
            self._run_arr, self._run_list = np.concatenate([self._run_arr, rows]), None
            # one call for all admitted requests: each row's start draws are keyed by its request alone
            if self._pre is not None:
                self._pre.admit(rows)        # the source's per-request state, keyed by each request alone
            else:
                rng = self.rng if self.streams is None else self.streams.rows(r.key[rows], -1, 1)
                self.acc.start(r.slot_of[rows], r.domain[rows], rng)
            for row in new if self._suspended else ():
                state = self._suspended.pop(row, None)
                if state is not None:   # a preempted request: its draws go on from the step it had reached
                    self.acc.resume(r.slot_of[[row]], state)
            if self.disagg:
                self._grown = False
        return new

    def new_requests(self, rows: list[int]) -> list[NewRequest]:
        """The executor's view of admitted ``rows`` (:class:`~dsparksim.sim.contract.NewRequest`)."""
        r = self.req
        return [NewRequest(int(row), int(r.slot_of[row]), int(r.prompt[row]), str(r.domain[row])) for row in rows]

    # ---------------------------------------------------------------- paged KV: growth and preemption
    def _grow(self) -> bool:
        """Paged KV: give every decoding request the pages of its context + K draft slots, preempting the most
        recently admitted running request while they do not fit; True if any request was preempted."""
        preempted = False
        self._grown_dec = None
        while len(self._run_arr):
            run = self._run_arr
            dec = run[self.req.phase[run] == DECODE]
            if self.kv.grow_decoding(dec):
                self._grown_dec = dec
                break
            self._preempt(int(run[-1]))
            preempted = True
        self.kv.check()
        return preempted

    def _preempt(self, row: int) -> None:
        """Preempt running request ``row`` by recompute: free its pages and slot, re-queue it at the front."""
        r = self.req
        r.recomp[row] += int(r.prefilled[row] + r.gen[row] - r.regen[row])   # KV tokens thrown away
        r.preempt[row] += 1
        self.n_preemptions += 1
        self.kv.release_row(row)
        run = self._run_arr
        self._run_arr, self._run_list = run[run != row], None
        state = self.acc.suspend(r.slot_of[[row]])
        if state is not None:
            self._suspended[row] = state
        self.free_slots.append(int(r.slot_of[row]))
        if r.gen[row] > 0 and row not in self._gap_open:   # (preempted again while re-prefilling: same gap)
            self._gap_open[row] = gap = [row, len(self.log["dt"]), -1]
            self.gaps.append(gap)
        r.regen[row] = r.gen[row]            # re-prefill prompt + every token generated so far
        r.prefilled[row] = 0
        r.phase[row] = WAITING
        self.waiting.appendleft(row)
        self.waiting_need += self.kv.need(row)
        self._preempted.append(row)

    def apply_prefilled(self, pre: Prefilled, now: float) -> None:
        """Requests the executor prefilled outside the loop (:class:`~dsparksim.sim.contract.Prefilled`: admitted,
        running, nothing prefilled yet) decode from their contexts, their first token emitted at ``now``, without a
        prefill step; their prompt length becomes the context and the KV reservation follows. For profiling decode
        steps at long contexts (the real runner's ``measure``); a request must have more than one output token
        left."""
        r = self.req
        rows = np.asarray(pre.rows, np.int64)
        ctx = np.asarray(pre.contexts, np.int64)
        if rows.shape != ctx.shape or rows.ndim != 1:
            raise ValueError(f"apply_prefilled: {rows.shape} rows but {ctx.shape} contexts")
        if self.paged:
            raise ValueError("apply_prefilled: supported with kv_policy 'reserve' only")
        if not set(rows.tolist()) <= set(self.running):
            raise ValueError("apply_prefilled: every row must be running on this engine")
        if (r.phase[rows] != PREFILL).any() or r.prefilled[rows].any() or (ctx < 1).any() or (r.out[rows] < 2).any():
            raise ValueError("apply_prefilled: rows must be admitted, not yet prefilled, with contexts >= 1 and more "
                             "than one output token")
        self.kv.grow_prompts(int((ctx - r.prompt[rows]).sum()))
        r.prompt[rows] = ctx
        r.prefilled[rows] = ctx
        r.phase[rows] = DECODE
        r.first_tok[rows] = now
        r.gen[rows] = 1
        self._grown, self._grown_dec = False, None     # (reserve KV only; rows that decode now)

    # ---------------------------------------------------------------- one step
    def running_rows(self) -> np.ndarray:
        """The running rows in admission order (int64; replaced, never written into)."""
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

    def phase_counts(self) -> tuple[int, int]:
        """(decoding, prefilling) running requests (the DP balance's view, sim/dp_balance.py)."""
        n_dec = int(np.count_nonzero(self.req.phase[self._run_arr] == DECODE))
        return n_dec, len(self._run_arr) - n_dec

    def plan_step(self, draft: Callable[[np.ndarray, np.ndarray], Block] | None = None,
                  prefill: bool = True) -> StepPlan | None:
        """Plan the next step over the running requests (None if none runs). ``draft(rows, slots)`` replaces the
        acceptance draw (the live runner drafts for real and leaves ``true_accepted`` None). ``prefill`` False:
        no prefill chunk this step (held by the DP balance, sim/dp_balance.py; only when requests decode)."""
        if self.paged and not self._grown:
            self._grow()
        self._grown = False
        if not len(self._run_arr):
            return None
        K, r = self.K, self.req
        run = self.running_rows()
        n_run = len(run)
        ph = r.phase[run]
        # paged: the rows the growth just gave pages to (an admission since adds prefilling rows only)
        dec = run[ph == DECODE] if self._grown_dec is None else self._grown_dec
        self._grown_dec = None
        n_dec = len(dec)
        # Chunked prefill: decode tokens first, the rest of the budget goes to prefills in FIFO order. Not mixed
        # (SGLang's default): the chunks get the whole budget and a step with a chunk carries no decode (module doc).
        budget = min(self.chunk, self.max_tokens - (n_dec * (1 + K) if self.mixed else 0))
        chunks, n_pf, pf_qk = self._chunks(run[ph == PREFILL], budget) if n_dec < n_run and prefill else ([], 0, 0)
        if chunks and n_dec and self.batch_wait is not None and self._wait(chunks, n_dec):
            chunks, n_pf, pf_qk = [], 0, 0
        if chunks and not self.mixed and n_dec:
            # a prefill-only step: the decoding rows wait; only the prefilling rows' context is read
            dec, n_dec = dec[:0], 0
            run = run[ph != DECODE]
        kv_read = int(_sum(r.prefilled[run]) + _sum(r.gen[run]) - _sum(r.regen[run])) + n_pf
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
            L, conf, A = self._choose(dec, blk, drafted, n_dec + n_pf, step_time, dctx)
        n_verify = int(_sum(L))
        M = n_dec + n_pf + n_verify
        if M > self.max_tokens:
            raise RuntimeError(f"policy {self.policy.spec} exceeded the token budget: M={M} > {self.max_tokens}")
        # a padded engine (no variable-length attention kernels) runs every decoding row at the step's longest
        # verify length: the target's forward is priced at M + pad (module doc); M + pad <= n_dec (1 + K) + n_pf
        # <= max_tokens (admission and the chunk budget)
        Lp = np.full(n_dec, int(L.max()), np.int64) if self.pad_verify and n_dec else L
        pad = int(Lp.sum()) - n_verify if Lp is not L else 0
        dec_qk = 0 if dctx is None else int(decode_query_keys(Lp, dctx).sum())
        dt = pricer.charge(base_time, M + pad, n_dec, dec_qk)
        if not dt > 0:
            raise RuntimeError(f"non-positive step time {dt} at M={M}")
        pre = None
        if self._preempted:
            pre, self._preempted = np.array(self._preempted, np.int64), []
        return StepPlan(decode=dec, slots=slots, verify=L, conf=conf, true_accepted=A, prefill=chunks, M=M,
                        n_prefill=n_pf, kv_read=kv_read, prefill_qk=pf_qk, K=K, predicted_s=dt,
                        n_running=n_run, decode_qk=dec_qk, preempted=pre, kv_pages=self.kv.used_pages,
                        drafted=drafted, pad_tokens=pad)

    def _choose(self, dec: np.ndarray, blk: Block, drafted: np.ndarray | None, base_tokens: int, step_time: Any,
                dctx: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """The policy's verify lengths for decoding rows ``dec`` from their drafts ``blk``: (L, confidences seen,
        true accepted prefixes)."""
        K, n_dec = self.K, len(dec)
        conf = blk.conf[:, :K]
        A = blk.accepted
        surv = np.cumprod(conf, axis=1) if blk.survival is None else blk.survival
        if drafted is not None:
            conf, surv = mask_undrafted(conf, surv, drafted)
        ctx = StepContext(conf=conf, survival=surv, request_ids=dec,
                          base_tokens=base_tokens, step_time=step_time, max_tokens=self.max_tokens,
                          true_accepted=A if self.policy.needs_oracle else None, drafted=drafted,
                          context=dctx, qk_s=float(self.pricer.sq) if dctx is not None else 0.0)
        L = np.asarray(self.policy.choose(ctx), dtype=np.int64)
        # (a negative L viewed as uint64 is above any K: one reduction checks both ends)
        if L.shape != (n_dec,) or (n_dec and np.count_nonzero(L.view(np.uint64) > K)):
            raise RuntimeError(f"policy {self.policy.spec} returned invalid verify lengths {L!r} (K={K})")
        if drafted is not None:
            L = np.minimum(L, drafted)   # positions never drafted cannot be verified
        return L, conf, A

    def _wait(self, chunks: list[tuple[int, int, int, int]], n_dec: int) -> bool:
        """TensorRT-LLM's batch waiting (sim/batch_wait.py): whether this step's chunks are held. It counts each
        chosen context request's whole prompt (recomputed tokens included) and 1 + K tokens per decoding request."""
        r = self.req
        rows = [c[0] for c in chunks]
        ctx = int(_sum(r.prompt[rows]) + _sum(r.regen[rows]))
        return self.batch_wait.hold(ctx + n_dec * (1 + self.K))

    def _chunks(self, rows: np.ndarray, budget: int) -> tuple[list[tuple[int, int, int, int]], int, int]:
        """Prefill chunks of prefilling ``rows`` (FIFO) within ``budget`` tokens: (chunks, tokens, query-key pairs)."""
        r = self.req
        chunks: list[tuple[int, int, int, int]] = []
        n_pf = pf_qk = 0
        prefilled, target, regen, slot_of = r.prefilled, r.prompt, r.regen, r.slot_of
        for row in rows.tolist():       # Python ints: cheaper scalar reads and arithmetic than numpy scalars'
            if budget <= 0:
                break
            done = int(prefilled[row])
            c = min(int(target[row]) + int(regen[row]) - done, budget)
            chunks.append((row, int(slot_of[row]), done, c))
            budget -= c
            n_pf += c
            # prefill beyond the verify term: the quadratic query-key part of the chunk's causal attention
            pf_qk += chunk_query_keys(c, done)
        return chunks, n_pf, pf_qk

    def apply(self, plan: StepPlan, outcome: StepOutcome, now: float) -> np.ndarray:
        """Apply an executed step at time ``now`` (its end): emit tokens, advance prefills, finish requests.
        Fills the outcome's token counts; returns the rows that finished."""
        dec, L, a, r = plan.decode, plan.verify, outcome.accepted, self.req
        emitted = 0
        finished: list[np.ndarray] = []
        if len(dec):
            a = np.asarray(a, np.int64)
            # (L is in 0..K: a negative a viewed as uint64 is above it, so one comparison checks both ends)
            if a.shape != dec.shape or (a.size and np.count_nonzero(a.view(np.uint64) > np.asarray(L, np.int64).view(np.uint64))):
                raise RuntimeError(f"executor returned accepted prefixes {a!r} outside 0..verify {L!r}")
            # vLLM's spec-decode counters: a draft is a request verifying >= 1 draft token this step (a request
            # verifying none accepted none: 0 <= a <= L, so the sums over all requests are those over the drafts)
            outcome.drafts, outcome.accepted_total = int(np.count_nonzero(L)), int(_sum(a))
            # requests whose accepted prefix reached past position p: a reversed cumulative count (count 0 unused)
            cnt = np.bincount(a, minlength=self.K + 1)
            outcome.accepted_per_pos = np.add.accumulate(cnt[:0:-1])[::-1].copy()   # np.cumsum's loop, no wrapper
            out, gen = r.out[dec], r.gen[dec]
            emit = np.minimum(a + 1, out - gen)  # the last step may overshoot: stop at length
            gen += emit
            r.gen[dec] = gen
            r.demit[dec] += emit
            r.dsteps[dec] += 1
            r.vtok[dec] += L
            r.atok[dec] += a
            emitted = int(_sum(emit))
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
                elif row in self._gap_open:
                    self._gap_open.pop(row)[2] = len(self.log["dt"])   # this step (recorded next) streams it
                r.gen[row] += 1
                emitted += 1
                if r.gen[row] >= r.out[row]:
                    finished.append(np.array([row]))
        outcome.emitted = emitted
        # (each part is a new array: one is returned as it is)
        done = finished[0] if len(finished) == 1 else np.concatenate(finished) if finished else np.zeros(0, np.int64)
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
        lg["verify_tokens"].append(plan.M - len(plan.decode) - plan.n_prefill)    # sum(verify) (StepPlan.M)
        lg["emitted"].append(outcome.emitted)
        lg["decode_emitted"].append(outcome.decode_emitted)
        lg["n_waiting"].append(len(self.waiting))
        lg["n_running"].append(plan.n_running)
        if self.paged:
            lg["kv_used"].append(plan.kv_pages * self.kv.page)    # tokens held in pages
            if "kv_pages" not in lg:    # (the first step adds the paged columns, in this order)
                lg["kv_pages"], lg["preempted"] = [], []
            lg["kv_pages"].append(plan.kv_pages)
            lg["preempted"].append(0 if plan.preempted is None else len(plan.preempted))
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
        r = self.req
        r.phase[rows] = DONE
        r.finish[rows] = now
        # the running rows in order, less the finished (now DONE; a running row is PREFILL or DECODE)
        run = self._run_arr
        self._run_arr, self._run_list = run[r.phase[run] != DONE], None
        self.kv.release(rows)
        self.free_slots.extend(r.slot_of[rows].tolist())


def reprice_steps(profile: CostProfile, steps: Any, drafter: str | None, K: int,
                  max_batched_tokens: int | None = None) -> np.ndarray:
    """The price of every logged step, recomputed from its shape (the PRICE_KEYS columns of an engine's step log,
    with EXTRA_PRICE_KEYS where logged; a dict of arrays or a DataFrame) by the profile's pricer, as
    :meth:`Scheduler.plan_step` charged it, so that it equals the logged ``dt`` of a simulated single-rank step bit
    for bit. A DP rank's own price is its
    ``rank_busy_s`` (its ``dt`` is the slowest rank's). ``max_batched_tokens``: the run's token budget (None = the
    profile's largest breakpoint), which decides whether verify times came from the dense table."""
    cols = {k: steps[k] for k in PRICE_KEYS} | {k: steps[k] for k in EXTRA_PRICE_KEYS if k in steps}
    shape = StepShape.from_log(cols, drafter, K)
    return profile.pricer(max_batched_tokens).seconds_each(shape)
