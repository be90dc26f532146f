"""The simulated serving engine: continuous batching with speculative decode steps (DESIGN.md section 6).

One SimPy process runs the engine loop; each iteration is one engine step. All per-request work inside a step is
numpy over the running requests (no Python event per token): draw K confidences and the true accepted prefix for
every decoding request, let the policy choose verify lengths, price the step on the cost profile, advance time,
then emit tokens, finish requests and admit waiting ones.

KV admission is conservative: a request is admitted only when its prompt + full output + K draft slots fit in
the free KV capacity, so the cache can never overflow and nothing is ever preempted (stated in results).

A request that can never be served (prompt + output beyond ``max_model_len``, or prompt + output + K beyond the
whole KV capacity) is rejected on arrival, as vLLM answers 400: it is counted and marked, never admitted, and in
closed loop its user sends the next request at once. Requests are taken from the workload lazily, block by block,
and the per-request arrays grow geometrically, so memory follows the requests issued, not users x duration.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import simpy

from dsparksim.acceptance.base import AcceptanceModel, Block
from dsparksim.errors import ConfigError
from dsparksim.policies.base import Policy, StepContext
from dsparksim.traffic.base import Workload

# Request phases (per row of the workload).
NOT_ARRIVED, WAITING, PREFILL, DECODE, DONE, REJECTED = 0, 1, 2, 3, 4, 5
# Why a request was rejected on arrival (SimResult.reject_reason; 0 = not rejected).
REJECT_REASONS = {1: "max_model_len", 2: "kv_capacity"}
_R_LEN, _R_KV = 1, 2
# Memory bound: an open-loop queue this long is far past saturation; the run stops with a ConfigError.
MAX_WAITING = 500_000
# Closed loop: this many rejections in a row without one admission means nothing in the workload fits.
MAX_REJECT_STREAK = 10_000


@dataclass
class SimResult:
    """Raw outcome of one simulation: per-request rows (index = workload row) and a per-step log."""

    # per request (len = rows issued)
    arrival_s: np.ndarray
    admitted_s: np.ndarray
    first_token_s: np.ndarray
    finish_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    emitted_tokens: np.ndarray
    decode_steps: np.ndarray
    verify_tokens: np.ndarray
    accepted_tokens: np.ndarray
    domain: np.ndarray
    # per step
    steps: dict[str, np.ndarray]
    sim_time_s: float
    ended_by: str
    kv_capacity_tokens: int
    max_batched_tokens: int
    block_size: int
    drafter: str
    notes: dict[str, Any] = field(default_factory=dict)
    reject_reason: np.ndarray | None = None  # per request: 0 served/queued, else a key of REJECT_REASONS
    # per step x draft position p (0-based): decoding requests whose accepted prefix reached past p (vLLM's
    # num_accepted_tokens_per_pos counter, kept per step so metrics can window it)
    step_accepted_per_pos: np.ndarray | None = None

    @property
    def completed(self) -> np.ndarray:
        return np.isfinite(self.finish_s)

    @property
    def rejected(self) -> np.ndarray:
        if self.reject_reason is None:
            return np.zeros(len(self.arrival_s), bool)
        return self.reject_reason > 0


class Simulation:
    """Simulate one policy on one workload.

    Stop rules: ``duration_s`` stops the clock there (requests still running are reported as not completed);
    ``num_requests`` issues that many requests and runs until all of them finish. Exactly one must be given.
    ``max_model_len``: longest prompt + output a request may have (None = no limit but the KV capacity).
    """

    def __init__(
        self,
        *,
        profile: Any,
        acceptance: AcceptanceModel,
        policy: Policy,
        workload: Workload,
        block_size: int,
        drafter: str,
        kv_capacity_tokens: int,
        max_num_seqs: int,
        max_batched_tokens: int,
        prefill_chunk_tokens: int,
        rng: np.random.Generator,
        duration_s: float | None = None,
        num_requests: int | None = None,
        progress: Callable[[float], None] | None = None,
        max_model_len: int | None = None,
    ) -> None:
        if (duration_s is None) == (num_requests is None):
            raise ConfigError("config", "duration_s/num_requests", "give exactly one of duration or number of requests")
        if duration_s is not None and not duration_s > 0:
            raise ConfigError("config", "duration_s", f"must be > 0, got {duration_s}")
        if num_requests is not None and num_requests < 1:
            raise ConfigError("config", "num_requests", f"must be >= 1, got {num_requests}")
        K = int(block_size)
        if acceptance.K < K:
            raise ConfigError("config", "block_size", f"acceptance source yields K={acceptance.K} < block size {K}")
        if max_batched_tokens < 1 + K:
            raise ConfigError("config", "max_batched_tokens",
                              f"{max_batched_tokens} cannot hold even one request's 1+K={1 + K} verify tokens")
        self.profile, self.acc, self.policy, self.wl = profile, acceptance, policy, workload
        self.K, self.drafter = K, drafter
        self.kv_cap, self.max_seqs = int(kv_capacity_tokens), int(max_num_seqs)
        self.max_tokens, self.chunk = int(max_batched_tokens), int(prefill_chunk_tokens)
        self.rng, self.duration, self.num_requests = rng, duration_s, num_requests
        self.progress = progress

        self.max_model_len = None if max_model_len is None else int(max_model_len)
        limit = workload.limit
        if num_requests is not None and limit is not None and num_requests > limit:
            raise ConfigError("config", "num_requests", f"{num_requests} requested but the workload has only {limit} "
                              "rows")
        self.n_rows = limit if num_requests is None else num_requests  # None = unbounded (duration ends the run)
        self._blocks = workload.iter_blocks()
        self.known = 0  # requests loaded from the workload into the arrays below
        self._exhausted = False

        # Per-request (row) state; grown geometrically as requests are loaded (_grow).
        self._cap = 0
        self.phase = np.zeros(0, np.int8)
        self.arrival = np.zeros(0)
        self.admitted = np.zeros(0)
        self.first_tok = np.zeros(0)
        self.finish = np.zeros(0)
        self.prompt = np.zeros(0, np.int64)
        self.out = np.zeros(0, np.int64)
        self.prefilled = np.zeros(0, np.int64)
        self.gen = np.zeros(0, np.int64)
        self.dsteps = np.zeros(0, np.int64)
        self.vtok = np.zeros(0, np.int64)
        self.atok = np.zeros(0, np.int64)
        self.slot_of = np.zeros(0, np.int64)
        self.reject = np.zeros(0, np.int8)
        self.domain = np.zeros(0, object)
        self.arr_time = np.zeros(0)  # workload arrival times of loaded requests (open loop)
        self.n_rejected = 0
        self.n_admitted = 0
        self._reject_streak = 0

        # Running set: rows in admission order; slots index the acceptance model's per-request state.
        self.running: list[int] = []
        self.free_slots: list[int] = list(range(self.max_seqs - 1, -1, -1))
        self.waiting: deque[int] = deque()
        self.kv_reserved = 0
        self.issued = 0  # rows handed to the engine so far (arrived or issued by a closed-loop user)
        self.log: dict[str, list] = {k: [] for k in (
            "t_start", "dt", "n_decode", "n_prefill_tokens", "M", "verify_tokens", "emitted", "decode_emitted",
            "n_waiting",
            "n_running", "kv_used", "kv_read", "drafts", "accepted")}
        self.acc_pos_log: list[np.ndarray] = []
        self.notes: dict[str, Any] = {}
        self._dense = self._dense_verify_table()

    def _dense_verify_table(self) -> np.ndarray | None:
        """Verify time (context term excluded) for every M in 0..max_tokens, looked up once.

        Policies price hundreds of candidate M values per step; one fancy index into this table replaces a floor
        search per call. Only possible when the context term is additive (none or linear) and the whole range
        lies inside the profile (extrapolated lookups go through the profile so they are counted).
        """
        prof = self.profile
        if getattr(prof, "context_model", "none") not in ("none", "linear"):
            return None
        lo, hi = int(getattr(prof, "min_tokens", 1)), int(prof.max_tokens)
        if self.max_tokens > hi or lo > 1:
            return None
        table = np.full(self.max_tokens + 1, np.nan)
        table[1:] = prof.verify_time(np.arange(1, self.max_tokens + 1), 0)
        return table

    # ---------------------------------------------------------------- request loading
    _GROWN = ("phase", "arrival", "admitted", "first_tok", "finish", "prompt", "out", "prefilled", "gen", "dsteps",
              "vtok", "atok", "slot_of", "reject", "domain", "arr_time")
    _FILL = {"arrival": np.nan, "admitted": np.nan, "first_tok": np.nan, "finish": np.nan, "slot_of": -1,
             "arr_time": np.nan}

    def _grow(self, need: int) -> None:
        cap = max(2 * self._cap, need, 1024)
        for name in self._GROWN:
            old = getattr(self, name)
            new = np.full(cap, self._FILL.get(name, 0), dtype=old.dtype)
            new[: len(old)] = old
            setattr(self, name, new)
        self._cap = cap

    def _load(self, row: int) -> bool:
        """Make sure request ``row`` is loaded from the workload; False if the workload has no such request."""
        while self.known <= row:
            if self._exhausted or (self.n_rows is not None and self.known >= self.n_rows):
                return False
            blk = next(self._blocks, None)
            if blk is None:
                self._exhausted = True
                return False
            p, o, d, t = blk
            n = len(p)
            if self.n_rows is not None:
                n = min(n, self.n_rows - self.known)
            i, j = self.known, self.known + n
            if j > self._cap:
                self._grow(j)
            self.prompt[i:j], self.out[i:j], self.domain[i:j] = p[:n], o[:n], d[:n]
            if t is not None:
                self.arr_time[i:j] = t[:n]
            self.known = j
        return True

    def _reject_reason(self, row: int) -> int:
        total = int(self.prompt[row] + self.out[row])
        if self.max_model_len is not None and total > self.max_model_len:
            return _R_LEN
        if total + self.K > self.kv_cap:
            return _R_KV
        return 0

    # ---------------------------------------------------------------- arrivals
    def _issue(self, row: int, t: float) -> bool:
        """Request ``row`` arrives at ``t``: queued, or rejected on arrival if it can never be served (False)."""
        self._load(row)
        self.arrival[row] = t
        self.issued += 1
        reason = self._reject_reason(row)
        if reason:
            self.phase[row] = REJECTED
            self.reject[row] = reason
            self.n_rejected += 1
            self._reject_streak += 1
            return False
        self._reject_streak = 0
        self.phase[row] = WAITING
        self.waiting.append(row)
        if len(self.waiting) > MAX_WAITING:
            raise ConfigError("config", "traffic", f"{len(self.waiting):,} requests wait for admission at "
                              f"t={t:.3f}s, above the limit of {MAX_WAITING:,}: the load is far past saturation "
                              + ("(lower --concurrency)" if self.wl.closed_loop else
                                 "(lower --rate / --time-scale, or shorten the run)"))
        return True

    def _issue_user(self, t: float) -> None:
        """Closed loop: a free user sends requests until one is queued (rejected ones are answered at once)."""
        while self.n_rows is None or self.issued < self.n_rows:
            if not self._load(self.issued):
                return
            if self._issue(self.issued, t):
                return
            if self._reject_streak >= MAX_REJECT_STREAK or (self.n_admitted == 0 and self.n_rejected >= 1000
                                                            and not self.waiting):
                self._nothing_fits()

    def _nothing_fits(self) -> None:
        lim = f" or max_model_len {self.max_model_len}" if self.max_model_len is not None else ""
        field_ = "kv_capacity_tokens" if not np.any(self.reject[: self.known] == _R_LEN) else "max_model_len"
        raise ConfigError("config", field_, f"{self.n_rejected} requests were rejected (prompt+output+K beyond the "
                          f"KV capacity {self.kv_cap}{lim}) and none could be admitted: no request of this "
                          "workload fits this engine")

    def _pull_arrivals(self, now: float) -> None:
        """Open loop: move every row whose arrival time has come into the waiting queue."""
        while self._load(self.issued):
            t = float(self.arr_time[self.issued])
            if t > now or (self.duration is not None and t >= self.duration):
                break
            self._issue(self.issued, t)

    def _next_arrival(self) -> float | None:
        if self.wl.closed_loop or not self._load(self.issued):
            return None
        t = float(self.arr_time[self.issued])
        if self.duration is not None and t >= self.duration:
            return None
        return t

    # ---------------------------------------------------------------- admission
    def _admit(self, now: float) -> None:
        K = self.K
        while self.waiting and self.free_slots:
            row = self.waiting[0]
            need = int(self.prompt[row] + self.out[row] + K)
            if self.kv_reserved + need > self.kv_cap:
                break  # FIFO: the head waits for KV; nothing behind it jumps the queue
            if (len(self.running) + 1) * (1 + K) > self.max_tokens:
                break
            self.waiting.popleft()
            self.kv_reserved += need
            slot = self.free_slots.pop()
            self.slot_of[row] = slot
            self.phase[row] = PREFILL
            self.admitted[row] = now
            self.n_admitted += 1
            self.running.append(row)
            self.acc.start(np.array([slot]), self.domain[row: row + 1], self.rng)

    # ---------------------------------------------------------------- one step
    def _plan_step(self) -> tuple[float, dict[str, Any]]:
        K = self.K
        run = np.fromiter(self.running, np.int64, len(self.running))
        ph = self.phase[run]
        dec = run[ph == DECODE]
        n_dec = len(dec)
        # Chunked prefill: decode tokens first, the rest of the budget goes to prefills in FIFO order.
        budget = min(self.chunk, self.max_tokens - n_dec * (1 + K))
        chunks: list[tuple[int, int]] = []
        for row in run[ph == PREFILL]:
            if budget <= 0:
                break
            c = int(min(self.prompt[row] - self.prefilled[row], budget))
            chunks.append((int(row), c))
            budget -= c
        n_pf = sum(c for _, c in chunks)
        kv_read = int(self.prefilled[run].sum() + self.gen[run].sum()) + n_pf
        prof = self.profile
        if n_dec:
            nontrim = float(prof.nontrimmable_time(self.drafter, n_dec, K))
        else:
            nontrim = float(prof.fixed_overhead_s)  # prefill-only step: no drafting
        # prefill beyond the verify term: per token, the quadratic query-key part, the drafter's state update
        pf_qk = sum(c * int(self.prefilled[row]) + c * (c + 1) // 2 for row, c in chunks)
        if n_pf and getattr(prof, "prefill_note", None) is not None:
            nontrim += prof.prefill_time(self.drafter, n_pf, pf_qk, len(chunks))

        dense = self._dense
        if dense is not None:
            # Same sum as the profile's verify_time(M, kv) + nontrim, with the per-step terms folded first.
            extra = nontrim + float(getattr(prof, "seconds_per_kv_token", None) or 0.0) * kv_read

            def step_time(M: np.ndarray) -> np.ndarray:
                return dense[M] + extra
        else:
            def step_time(M: np.ndarray) -> np.ndarray:
                return prof.verify_time(M, kv_read) + nontrim

        L = np.zeros(0, np.int64)
        a = np.zeros(0, np.int64)
        if n_dec:
            slots = self.slot_of[dec]
            blk = self._draw_block(dec, slots)
            conf = blk.conf[:, :K]
            surv = np.cumprod(conf, axis=1)
            ctx = StepContext(conf=conf, survival=surv, request_ids=dec, base_tokens=n_dec + n_pf,
                              step_time=step_time, max_tokens=self.max_tokens,
                              true_accepted=blk.accepted if self.policy.needs_oracle else None)
            L = np.asarray(self.policy.choose(ctx), dtype=np.int64)
            if L.shape != (n_dec,) or (n_dec and (L.min() < 0 or L.max() > K)):
                raise RuntimeError(f"policy {self.policy.spec} returned invalid verify lengths {L!r} (K={K})")
            a = self._accepted_prefix(blk, L)
        M = n_dec + n_pf + int(L.sum())
        if M > self.max_tokens:
            raise RuntimeError(f"policy {self.policy.spec} exceeded the token budget: M={M} > {self.max_tokens}")
        dt = float(step_time(np.array([M]))[0])
        if not dt > 0:
            raise RuntimeError(f"non-positive step time {dt} at M={M}")
        plan = dict(dec=dec, L=L, a=a, chunks=chunks, M=M, n_pf=n_pf, kv_read=kv_read, pf_qk=pf_qk)
        return dt, plan

    def _draw_block(self, dec: np.ndarray, slots: np.ndarray) -> Block:
        """This step's confidences (and true accepted lengths) for the decoding rows ``dec`` in KV ``slots``.
        The real engine's live-drafter mode overrides this with a real drafter forward."""
        return self.acc.draw(slots, self.rng)

    def _accepted_prefix(self, blk: Block, L: np.ndarray) -> np.ndarray | None:
        """Accepted prefix of the verified drafts: min(L, A). None = decided later by real verification."""
        return np.minimum(L, blk.accepted)

    def _apply_step(self, now: float, t0: float, dt: float, plan: dict[str, Any]) -> None:
        dec, L, a = plan["dec"], plan["L"], plan["a"]
        emitted = decode_emitted = 0
        finished: list[np.ndarray] = []
        # vLLM's spec-decode counters: a draft is a request verifying >= 1 draft token this step.
        drafted = a[L > 0] if len(dec) else np.zeros(0, np.int64)
        self.acc_pos_log.append((drafted[:, None] > np.arange(self.K)).sum(0).astype(np.int64))
        if len(dec):
            emit = np.minimum(a + 1, self.out[dec] - self.gen[dec])  # the last step may overshoot: stop at length
            self.gen[dec] += emit
            self.dsteps[dec] += 1
            self.vtok[dec] += L
            self.atok[dec] += a
            emitted += int(emit.sum())
            decode_emitted = emitted
            self.policy.observe(dec, L, a)
            finished.append(dec[self.gen[dec] >= self.out[dec]])
        for row, c in plan["chunks"]:
            self.prefilled[row] += c
            if self.prefilled[row] == self.prompt[row]:
                # The last prefill chunk's forward produces the first output token.
                self.phase[row] = DECODE
                self.first_tok[row] = now
                self.gen[row] = 1
                emitted += 1
                if self.out[row] == 1:
                    finished.append(np.array([row]))
        lg = self.log
        lg["t_start"].append(t0)
        lg["dt"].append(dt)
        lg["n_decode"].append(len(dec))
        lg["n_prefill_tokens"].append(plan["n_pf"])
        lg["M"].append(plan["M"])
        lg["verify_tokens"].append(int(L.sum()))
        lg["emitted"].append(emitted)
        lg["decode_emitted"].append(decode_emitted)
        lg["n_waiting"].append(len(self.waiting))
        lg["n_running"].append(len(self.running))
        lg["kv_used"].append(plan["kv_read"] + len(self.running) * self.K)
        lg["kv_read"].append(plan["kv_read"])
        lg["drafts"].append(int(drafted.size))
        lg["accepted"].append(int(drafted.sum()))
        if finished:
            done = np.concatenate(finished)
            if len(done):
                self._finish(done, now)

    def _finish(self, rows: np.ndarray, now: float) -> None:
        K = self.K
        self.phase[rows] = DONE
        self.finish[rows] = now
        done = set(int(r) for r in rows)
        self.running = [r for r in self.running if r not in done]
        for r in rows:
            self.kv_reserved -= int(self.prompt[r] + self.out[r] + K)
            self.free_slots.append(int(self.slot_of[r]))
        if self.wl.closed_loop:
            # Each finished user immediately sends its next request (zero think time).
            for _ in range(len(rows)):
                self._issue_user(now)

    # ---------------------------------------------------------------- main loop
    def _engine(self, env: simpy.Environment):
        if self.wl.closed_loop:
            for _ in range(int(self.wl.concurrency)):
                self._issue_user(0.0)
        ended_by = None
        last_report = 0.0
        while True:
            now = env.now
            if self.duration is not None and now >= self.duration:
                ended_by = "duration"
                break
            if not self.wl.closed_loop:
                self._pull_arrivals(now)
            self._admit(now)
            if not self.running:
                if self.waiting:  # cannot happen: unservable requests are rejected on arrival
                    raise RuntimeError("requests wait but nothing runs: admission deadlock")
                nxt = self._next_arrival()
                if nxt is None:
                    if self.num_requests is not None:
                        ended_by = "all_requests_done"
                    elif self.wl.closed_loop:
                        ended_by = "workload_exhausted"  # closed-loop pool ran dry: an error, raised in run()
                    else:
                        # Open loop, no arrival left before the horizon: the engine idles until it.
                        self.notes["arrivals_ended_before_horizon"] = True
                        yield env.timeout(self.duration - now)
                        ended_by = "duration"
                    break
                yield env.timeout(nxt - now)
                continue
            cut = yield from self._step(env, now)
            if cut:
                ended_by = "duration"
                break
            if self.progress is not None and env.now - last_report >= 1.0:
                self.progress(env.now)
                last_report = env.now
        self.ended_by = ended_by

    def _step(self, env: simpy.Environment, now: float):
        """One engine step as SimPy timeouts; returns True if the horizon cut it (the real runner overrides this)."""
        dt, plan = self._plan_step()
        if self.duration is not None and now + dt > self.duration:
            # This step would end after the horizon: it never completes inside the measured run.
            yield env.timeout(self.duration - now)
            return True
        yield env.timeout(dt)
        self._apply_step(env.now, now, dt, plan)
        return False

    def run(self) -> SimResult:
        env = simpy.Environment()
        proc = env.process(self._engine(env))
        env.run(until=proc)
        if self.progress is not None:
            self.progress(env.now)
        m = self.issued
        ended_by = self.ended_by
        if self.wl.closed_loop and self.duration is not None and ended_by != "duration":
            raise ConfigError("config", "traffic.pool_size",
                              f"the closed-loop request pool ({self.n_rows} rows) ran out at t={env.now:.2f}s before "
                              f"the {self.duration}s duration: raise the pool size (or leave it unset: unlimited)")
        if m and self.n_admitted == 0 and self.n_rejected == m:
            self._nothing_fits()
        steps = {k: np.asarray(v) for k, v in self.log.items()}
        return SimResult(
            arrival_s=self.arrival[:m], admitted_s=self.admitted[:m], first_token_s=self.first_tok[:m],
            finish_s=self.finish[:m], prompt_tokens=self.prompt[:m], output_tokens=self.out[:m],
            emitted_tokens=self.gen[:m], decode_steps=self.dsteps[:m], verify_tokens=self.vtok[:m],
            accepted_tokens=self.atok[:m], domain=self.domain[:m].copy(), steps=steps,
            sim_time_s=float(env.now),
            ended_by=ended_by, kv_capacity_tokens=self.kv_cap, max_batched_tokens=self.max_tokens,
            block_size=self.K, drafter=self.drafter, notes=self.notes, reject_reason=self.reject[:m].copy(),
            step_accepted_per_pos=(np.vstack(self.acc_pos_log) if self.acc_pos_log
                                   else np.zeros((0, self.K), np.int64)),
        )
