"""A cluster of engines in one SimPy environment: arrivals, closed-loop users, a router, replicas, DP ranks.

:class:`Simulation` builds ``replicas x dp_ranks`` :class:`~dsparksim.sim.scheduler.Scheduler` objects over one shared
request table. Requests arrive from an arrival process (open loop and trace replay: one SimPy timeout per arrival)
or from closed-loop users (each finished request makes its user send the next at once), are checked servable
(rejected on arrival otherwise), routed (:mod:`dsparksim.sim.routers`) and put into the chosen engine's inbox.

Each replica is one SimPy process, a :class:`~dsparksim.sim.driver.Driver` running the step contract. With
``dp_ranks`` R > 1 a replica is one MoE engine with R data-parallel attention ranks stepped in lockstep: every
rank plans its own batch, and the step takes as long as the slowest rank (max of the ranks' prices), which is
what DP imbalance in context and verify lengths costs. The router assigns requests to ranks.

KV memory (``kv_policy``): ``"reserve"`` reserves prompt + output + K at admission (never preempts);
``"paged"`` allocates pages as tokens are written and preempts by recompute (see :mod:`dsparksim.sim.kv` and :mod:`dsparksim.sim.scheduler`). The
result counts preemptions and recomputed tokens per request (``SimResult.preemptions``/``recomputed_tokens``).

Disaggregated (``disaggregated=True``): every engine is decode-only. An arriving request that can be served first
goes through the prefill pool (:class:`dsparksim.sim.disagg.PrefillPool`: ``prefill_replicas`` FIFO instances, then
the KV transfer); when its KV lands it is routed to a decode engine, waits there for admission (KV room) and gets
its first token from that engine's first step. TTFT = queue + prefill + transfer + decode wait + first step,
reported per request (``SimResult.ttft_queue_s`` ... ``ttft_first_step_s``).

The benchmark client (``client_cap``, ``warmup_requests``; open loop only), as ``vllm bench serve`` and SGLang's
``bench_serving`` run it: requests arrive at their arrival times (all at t = 0 for request rate inf) and a
semaphore of ``client_cap`` caps those in flight: an arrival that finds the cap reached waits in the client, FIFO,
and is sent when an earlier request finishes (or is rejected). A request's arrival time is the time it is sent
(the clients start a request's clock after acquiring the semaphore). The first ``warmup_requests`` rows are
warm-up: all sent at t = 0 (under the same cap; a closed loop's users send them first), and the other rows'
arrival times count from the moment the last warm-up request finished (``SimResult.notes["benchmark_start_s"]``:
row i >= W arrives at that moment + its arrival time - row W's), as the clients start the benchmark after their
warm-up; a closed loop's users send the measured rows from that moment on. A closed loop of c users over N requests is this client at rate inf with cap c (same requests,
same steps: tested).

Stop rules: ``duration_s`` stops the clock there (requests still running are reported as not completed; a step
that would end after it never completes); ``num_requests`` issues that many requests and runs until all of them
finish. Exactly one must be given.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import simpy

from dsparksim.config import EngineConfig
from dsparksim.errors import ConfigError
from dsparksim.sim.contract import Executor
from dsparksim.sim.disagg import PrefillPool, kv_transfer_terms
from dsparksim.sim import fastpath
from dsparksim.sim.dp_balance import DPBalance
from dsparksim.sim.driver import Driver, StepClock
from dsparksim.sim.inputs import ResolvedInputs
from dsparksim.sim.kv import R_LEN
from dsparksim.sim.requests import REJECTED, RequestTable
from dsparksim.sim.scheduler import Scheduler
from dsparksim.sim.routers import make_router
from dsparksim.sim.streams import RequestStreams
from dsparksim.traffic.base import Workload
from dsparksim.traffic.config import check_duration_s

# Memory bound: an open-loop queue this long is far past saturation; the run stops with a ConfigError.
MAX_WAITING = 500_000
# Closed loop: this many rejections in a row without one admission means nothing in the workload fits.
MAX_REJECT_STREAK = 10_000


@dataclass
class SimResult:
    """Raw outcome of one simulation: per-request rows (index = workload row) and a per-step log.

    ``steps`` holds every engine's steps, engine by engine (column ``replica``; ``rank`` for DP ranks), each engine's
    in time order. ``replica`` per request: the replica that served it (-1: rejected before routing)."""

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
    replica: np.ndarray | None = None        # per request: serving replica (-1 = never routed)
    dp_rank: np.ndarray | None = None        # per request: DP rank inside its replica (-1 = never routed)
    replicas: int = 1
    dp_ranks: int = 1
    kv_policy: str = "reserve"
    kv_page_tokens: int = 0                   # paged KV: tokens per page
    preemptions: np.ndarray | None = None     # per request: times preempted (paged KV)
    recomputed_tokens: np.ndarray | None = None  # per request: KV tokens discarded by preemption, computed again
    disaggregated: bool = False
    ttft_queue_s: np.ndarray | None = None    # per request (disaggregated): prefill-pool queueing
    ttft_prefill_s: np.ndarray | None = None  # per request (disaggregated): prefill time
    ttft_transfer_s: np.ndarray | None = None  # per request (disaggregated): KV transfer time
    ttft_decode_wait_s: np.ndarray | None = None  # per request (disaggregated): KV landed -> admitted (room)
    ttft_first_step_s: np.ndarray | None = None   # per request (disaggregated): admitted -> first token
    # per request: tokens emitted by its decode steps (None: emitted - 1, the first token excluded)
    decode_emitted_tokens: np.ndarray | None = None
    # per request: its workload row (None: rows 0..n-1; closed-loop users pinned to engines send other rows)
    request_id: np.ndarray | None = None
    # paged KV, one row per preemption of a request that had streamed its first token: the request (index into
    # the per-request arrays) and the steps (indices into ``steps``, its engine's) it missed, from the first to
    # the one whose re-prefill streamed its next token (-1: not back before the run ended); bench ITLs
    gap_request: np.ndarray | None = None
    gap_steps: np.ndarray | None = None

    @property
    def completed(self) -> np.ndarray:
        return np.isfinite(self.finish_s)

    @property
    def rejected(self) -> np.ndarray:
        if self.reject_reason is None:
            return np.zeros(len(self.arrival_s), bool)
        return self.reject_reason > 0

    def for_replica(self, r: int) -> "SimResult":
        """The requests and steps of replica ``r`` alone (its per-replica summary is summarize() on this).
        Requests rejected before routing belong to no replica and are left out."""
        if self.replica is None:
            if r != 0:
                raise ValueError(f"single-engine result has no replica {r}")
            return self
        keep = self.replica == r
        sk = self.steps["replica"] == r
        per_req = {k: getattr(self, k)[keep] for k in (
            "arrival_s", "admitted_s", "first_token_s", "finish_s", "prompt_tokens", "output_tokens",
            "emitted_tokens", "decode_steps", "verify_tokens", "accepted_tokens", "domain")}
        for k in ("preemptions", "recomputed_tokens", "ttft_queue_s", "ttft_prefill_s", "ttft_transfer_s",
                  "ttft_decode_wait_s", "ttft_first_step_s", "decode_emitted_tokens", "request_id"):
            v = getattr(self, k)
            per_req[k] = None if v is None else v[keep]
        gaps: dict[str, Any] = {}
        if self.gap_request is not None and self.gap_steps is not None:
            g = keep[self.gap_request]
            # old step index -> this replica's: its steps before it. A gap opened by a preemption after the
            # replica's last logged step starts one past it (in the merged log that index is the next replica's
            # first step, or the end)
            before = np.concatenate([[0], np.cumsum(sk)])
            gs = self.gap_steps[g]
            gaps = {"gap_request": (np.cumsum(keep) - 1)[self.gap_request[g]],
                    "gap_steps": np.where(gs >= 0, before[np.maximum(gs, 0)], -1)}
        return SimResult(**per_req, **gaps, steps={k: v[sk] for k, v in self.steps.items()},
                         sim_time_s=self.sim_time_s,
                         ended_by=self.ended_by, kv_capacity_tokens=self.kv_capacity_tokens,
                         max_batched_tokens=self.max_batched_tokens, block_size=self.block_size,
                         drafter=self.drafter, notes=self.notes,
                         reject_reason=None if self.reject_reason is None else self.reject_reason[keep],
                         step_accepted_per_pos=(None if self.step_accepted_per_pos is None
                                                else self.step_accepted_per_pos[sk]),
                         replica=self.replica[keep], dp_rank=None if self.dp_rank is None else self.dp_rank[keep],
                         replicas=1, dp_ranks=self.dp_ranks, kv_policy=self.kv_policy,
                         kv_page_tokens=self.kv_page_tokens, disaggregated=self.disaggregated)


class Simulation:
    """Simulate one policy on one workload, on ``engine.replicas`` engines of ``engine.dp_ranks`` ranks (see the
    module doc).

    ``engine``: the engine's options (:class:`~dsparksim.config.EngineConfig`, checked there); ``inputs``: the resolved
    profile, policy, acceptance source, K, drafter, KV capacity, token budget and ``max_model_len``
    (:class:`~dsparksim.sim.inputs.ResolvedInputs`; they win over the config's unresolved fields). ``streams`` keys
    every acceptance draw by (request, step) so runs are paired; without it the draws come from ``rng`` in step
    order (legacy: unpaired).

    Each replica is stepped by one :class:`~dsparksim.sim.driver.Driver` running ``executor`` on ``clock`` (default:
    :class:`~dsparksim.sim.contract.CostExecutor` on the profile's price; the real runner executes on the model and
    measures). ``duration_s`` / ``num_requests`` (exactly one), ``client_cap`` and ``warmup_requests``: the run's
    stop rule and benchmark client (``TrafficConfig`` checks them; ``duration_s`` is checked here too, as there);
    ``router_seed``: the random routers' seed;
    ``shard``: simulate only replicas lo..hi-1 (:mod:`dsparksim.sim.shard`).
    """

    def __init__(self, engine: EngineConfig, inputs: ResolvedInputs, workload: Workload,
                 streams: RequestStreams | None, *, executor: Executor | None = None, clock: StepClock | None = None,
                 rng: np.random.Generator | None = None, duration_s: float | None = None,
                 num_requests: int | None = None, progress: Callable[[float], None] | None = None,
                 router_seed: int = 0, client_cap: int | None = None, warmup_requests: int = 0,
                 shard: tuple[int, int] | None = None) -> None:
        if not isinstance(engine, EngineConfig):
            raise TypeError(f"Simulation takes an EngineConfig, got {type(engine).__name__}")
        if (duration_s is None) == (num_requests is None):
            raise ConfigError("config", "duration_s/num_requests", "give exactly one of duration or number of requests")
        check_duration_s(duration_s, "Simulation")   # TrafficConfig's bound, for a Simulation built from Python
        if streams is None and rng is None:
            raise ValueError("Simulation needs streams (keyed, paired draws) or rng")
        K, acceptance = int(inputs.K), inputs.acceptance
        # checks of the resolved inputs against the engine (each value itself is checked by its config dataclass)
        if acceptance.K < K:
            raise ConfigError("config", "block_size", f"acceptance source yields K={acceptance.K} < block size {K}")
        if inputs.max_tokens < 1 + K:
            raise ConfigError("config", "max_batched_tokens",
                              f"{inputs.max_tokens} cannot hold even one request's 1+K={1 + K} verify tokens")
        if engine.kv_policy == "paged" and int(inputs.kv_cap) < engine.kv_page_tokens:
            raise ConfigError("config", "kv_capacity_tokens", f"{inputs.kv_cap} KV tokens hold no page of "
                              f"{engine.kv_page_tokens} tokens")
        self.config, self.inputs = engine, inputs
        self.client_cap = client_cap
        self.warmup_requests = int(warmup_requests)
        self.client_waiting = 0   # requests arrived at the client, waiting for the cap (FIFO: rows issued..)
        self.bench_start = 0.0
        self.kv_policy, self.kv_page_tokens = engine.kv_policy, engine.kv_page_tokens
        self.disagg = engine.disaggregated
        self.pool = self._prefill_pool(engine, inputs) if self.disagg else None
        self.in_prefill = 0   # requests in the prefill pool or on the link (disaggregated)
        self.wl, self.K, self.drafter, self.policy = workload, K, inputs.drafter, inputs.policy
        self.duration, self.num_requests, self.progress = duration_s, num_requests, progress
        self.kv_cap, self.max_tokens = int(inputs.kv_cap), int(inputs.max_tokens)
        self.max_model_len = inputs.max_model_len
        self.replicas, self.dp_ranks = engine.replicas, engine.dp_ranks
        self.dp_balance = (engine.dp_balance_timeout_iters, engine.dp_balance_wait_iters)
        limit = workload.limit
        if num_requests is not None and limit is not None and num_requests > limit:
            raise ConfigError("config", "num_requests", f"{num_requests} requested but the workload has only {limit} "
                              "rows")
        self.n_rows = limit if num_requests is None else num_requests  # None = unbounded (duration ends the run)
        self.req = RequestTable(workload, self.n_rows, streams)
        n_eng = self.replicas * self.dp_ranks
        self.engines: list[Scheduler] = []
        for e in range(n_eng):
            # Each engine keeps its own policy state (batch-level estimates); one engine uses the given object.
            pol = inputs.policy if n_eng == 1 else copy.deepcopy(inputs.policy)
            self.engines.append(Scheduler(engine, inputs, self.req, streams=streams, rng=rng, policy=pol, index=e,
                                          slot_base=e * engine.max_num_seqs))
        router = engine.router
        self.router = make_router(router, n_eng, seed=router_seed)
        if self.router.needs_session and not self._has_sessions():
            raise ConfigError("config", "router", f"router '{router}' needs session or prefix ids, which this "
                              "workload does not carry (Mooncake traces carry hash_ids)")
        # closed loop with users pinned to engines: engine e's users send its rows router.user_row(e, 0, 1, ...)
        self.pinned = bool(self.router.pins_users and workload.closed_loop)
        if self.pinned and (self.warmup_requests or getattr(workload, "user_steps", None)):
            raise ConfigError("config", "router", f"router '{router}' pins closed-loop users to engines; it takes "
                              "no warm-up requests and no user-count steps (user_steps)")
        self._cursor = [0] * n_eng      # pinned: requests each engine's users have sent
        self._streak = [0] * n_eng      # pinned: rejections in a row per engine
        self.shard = self._check_shard(shard)
        self.local = [self.shard is None or self.shard[0] <= e // self.dp_ranks < self.shard[1]
                      for e in range(n_eng)]
        self.owned: list[int] = []      # shard: rows routed here, or rejected here (dsparksim.sim.shard merges)
        self.executor, self.clock = executor, clock
        self.notes: dict[str, Any] = dict(self.notes_kv) if self.disagg else {}
        self.issued = 0
        self.n_rejected = 0
        self._reject_streak = 0
        self.n_finished = 0
        self.ended_by: str | None = None

    def _prefill_pool(self, engine: EngineConfig, inputs: ResolvedInputs) -> Any:
        """The disaggregated prefill pool (:mod:`dsparksim.sim.disagg`); its link terms go into the notes."""
        gbps, bpt = kv_transfer_terms(inputs.profile, engine.kv_transfer_gbps, engine.kv_bytes_per_token)
        self.notes_kv = {"kv_transfer_gbps": gbps, "kv_bytes_per_token": bpt}
        return PrefillPool(profile=inputs.profile, drafter=inputs.drafter, K=int(inputs.K),
                           replicas=engine.prefill_replicas,
                           chunk_tokens=min(engine.prefill_chunk_tokens, int(inputs.max_tokens)), gbps=gbps,
                           bytes_per_token=bpt)

    def _check_shard(self, shard: tuple[int, int] | None) -> tuple[int, int] | None:
        """A shard runs replicas lo..hi-1 of this cluster alone (see :mod:`dsparksim.sim.shard`)."""
        if shard is None:
            return None
        lo, hi = (int(x) for x in shard)
        if not 0 <= lo < hi <= self.replicas:
            raise ConfigError("config", "shard", f"expected replicas lo..hi-1 with 0 <= lo < hi <= {self.replicas}, "
                              f"got {shard!r}")
        if not self.router.request_only or self.disagg or self.client_cap is not None or self.warmup_requests \
                or (self.wl.closed_loop and not self.pinned):
            raise ConfigError("config", "shard", "replicas of this run interact; see dsparksim.sim.shard.refusal")
        return lo, hi

    def _has_sessions(self) -> bool:
        self.req.load(0)
        return self.req.has_session

    # ---------------------------------------------------------------- compatibility views (single engine)
    @property
    def known(self) -> int:
        return self.req.known

    @property
    def _cap(self) -> int:
        return self.req.cap

    @property
    def running(self) -> list[int]:
        return [r for e in self.engines for r in e.running]

    @property
    def waiting(self) -> list[int]:
        return [r for e in self.engines for r in e.waiting]

    @property
    def n_admitted(self) -> int:
        return sum(e.n_admitted for e in self.engines)

    # ---------------------------------------------------------------- arrivals and routing
    def _issue(self, row: int, t: float) -> bool:
        """Request ``row`` arrives at ``t``: routed to an engine's inbox, or rejected if it can never be served."""
        r = self.req
        r.load(row)
        r.arrival[row] = t
        self.issued += 1
        reason = self.engines[0].reject_reason(row)   # every engine has the same limits
        if reason:
            r.phase[row] = REJECTED
            r.reject[row] = reason
            self.n_rejected += 1
            self._reject_streak += 1
            if self.shard is not None:
                self.owned.append(row)
            self._check_warmup(t)
            return False
        self._reject_streak = 0
        if self.pool is not None:
            # disaggregated: the prefill pool first; the request reaches a decode engine when its KV lands
            q, pf, tx = self.pool.serve(t, int(r.prompt[row]))
            r.ttft_q[row], r.ttft_pf[row], r.ttft_tx[row] = q, pf, tx
            self.in_prefill += 1
            if self.in_prefill > MAX_WAITING:
                raise ConfigError("config", "traffic", f"{self.in_prefill:,} requests wait in the prefill pool at "
                                  f"t={t:.3f}s, above the limit of {MAX_WAITING:,}: the prefill pool is far past "
                                  "saturation (add --prefill-replicas or lower the load)")
            ev = self.env.timeout(q + pf + tx)
            ev.callbacks.append(lambda _ev, row=row: self._route(row, self.env.now))
            return True
        self._route(row, t)
        return True

    def _route(self, row: int, t: float) -> None:
        """Put servable request ``row`` into its engine's inbox at ``t`` (disaggregated: its KV has landed)."""
        r = self.req
        if self.pool is not None:
            self.in_prefill -= 1
            r.landed[row] = t
        e = self.router.route(row, self.engines, r)
        if self.shard is not None:
            if not self.local[e]:
                return      # another shard's replica serves it
            self.owned.append(row)
        eng = self.engines[e]
        eng.inbox.put(row)
        drv = self._driver_of[e]
        if drv.wake is not None and not drv.wake.triggered:
            drv.wake.succeed()
        if eng.outstanding > MAX_WAITING:
            raise ConfigError("config", "traffic", f"{eng.outstanding:,} requests wait for admission at "
                              f"t={t:.3f}s, above the limit of {MAX_WAITING:,}: the load is far past saturation "
                              + ("(lower --concurrency)" if self.wl.closed_loop else
                                 "(lower --rate / --time-scale, or shorten the run)"))

    def _starting(self, users: int) -> int:
        """Users that can send at t = 0: each one sends at least one row (or waits for the warm-up) before the next
        starts, so users beyond the request count send nothing and are not walked (--concurrency 10**9)."""
        return users if self.n_rows is None else min(users, self.n_rows)

    def _issue_user(self, t: float) -> None:
        """Closed loop: a free user sends requests until one is queued (rejected ones are answered at once).
        With a warm-up, a user that reaches the first measured row waits for the warm-up's end."""
        while self.n_rows is None or self.issued < self.n_rows:
            if self.issued == self.warmup_requests and self.warmup_requests and not self._warm_done.triggered:
                self._users_waiting += 1
                return
            if not self.req.load(self.issued):
                return
            if self._issue(self.issued, t):
                return
            idle = not self.in_prefill and not any(e.outstanding for e in self.engines)
            if self._reject_streak >= MAX_REJECT_STREAK or (self.n_admitted == 0 and self.n_rejected >= 1000
                                                            and idle):
                self._nothing_fits()

    def _issue_pinned(self, t: float, e: int) -> None:
        """Closed loop, users pinned: a free user of engine ``e`` sends that engine's next rows until one is queued
        (the rejection guard counts per engine, so a shard decides as the whole cluster does)."""
        while self._has_row(e):
            row = self.router.user_row(e, self._cursor[e])
            self._cursor[e] += 1
            if self._issue(row, t):
                self._streak[e] = 0
                return
            self._streak[e] += 1
            if self._streak[e] >= MAX_REJECT_STREAK or (self.engines[e].n_admitted == 0 and self._streak[e] >= 1000
                                                       and not self.engines[e].outstanding):
                self._nothing_fits()

    def _has_row(self, e: int) -> bool:
        """Pinned: engine ``e``'s users have a row left to send."""
        row = self.router.user_row(e, self._cursor[e])
        return (self.n_rows is None or row < self.n_rows) and self.req.load(row)

    def _nothing_fits(self) -> None:
        raise nothing_fits(self.n_rejected, self.kv_cap, self.max_model_len,
                           bool(np.any(self.req.reject[: self.req.known] == R_LEN)))

    def _arrivals(self, env: simpy.Environment):
        """Open loop: one timeout per arrival; each request is routed at its arrival time (with the client's cap:
        sent when a slot frees; after a warm-up: arrival times count from the benchmark's start)."""
        r = self.req
        nxt = 0   # next row to arrive (rows issued .. nxt-1 wait in the client for the cap)
        w = self.warmup_requests
        while r.load(nxt):
            if nxt == w and w:
                if not self._warm_done.triggered:
                    yield self._warm_done
            t = (0.0 if nxt < w else
                 float(r.arr_time[nxt]) + (self.bench_start - float(r.arr_time[w]) if w else 0.0))
            if self.duration is not None and t >= self.duration:
                return
            if t > env.now:
                yield env.timeout(t - env.now)
            nxt += 1
            if self.client_cap is None:
                self._issue(self.issued, t)
            else:
                self.client_waiting += 1
                self._release(t)
        if self.duration is not None:
            self.notes["arrivals_ended_before_horizon"] = True
        self._arrivals_finished = True
        self._maybe_done()

    def _in_flight(self) -> int:
        return self.issued - self.n_finished - self.n_rejected

    def _release(self, t: float) -> None:
        """The client: send waiting requests (FIFO) while fewer than ``client_cap`` are in flight."""
        while self.client_waiting and self._in_flight() < self.client_cap:
            self.client_waiting -= 1
            self._issue(self.issued, t)

    def _check_warmup(self, t: float) -> None:
        """Trigger the end of the warm-up when every warm-up request has finished or been rejected."""
        w = self.warmup_requests
        if w and not self._warm_done.triggered and self.issued >= w and self.n_finished + self.n_rejected >= w:
            self.bench_start = t
            self._warm_done.succeed()
            users, self._users_waiting = self._users_waiting, 0
            for _ in range(users):   # closed loop: the users that finished their warm-up start the benchmark
                self._issue_user(t)

    def _on_finish(self, rows: np.ndarray, now: float) -> None:
        self.n_finished += len(rows)
        self._check_warmup(now)
        if self.client_cap is not None:
            self._release(now)
        if self.pinned:
            for row in rows:   # the user of each finished request sends its engine's next row
                self._issue_pinned(now, int(self.req.replica[row]))
        elif self.wl.closed_loop:
            # Each finished user immediately sends its next request (zero think time), unless the user count
            # has been lowered (user_steps): then the user retires.
            for _ in range(len(rows)):
                if self.users > self.users_target:
                    self.users -= 1
                    continue
                self._issue_user(now)
        self._maybe_done()

    def _user_schedule(self, env: simpy.Environment, steps):
        """Closed loop with ``user_steps``: change the target user count at each step's time. New users send
        their first request at once; surplus users retire when their current request finishes (_on_finish)."""
        for t, users in steps:
            if self.duration is not None and t >= self.duration:
                return
            if t > env.now:
                yield env.timeout(t - env.now)
            self.users_target = int(users)
            while self.users < self.users_target:
                self.users += 1
                self._issue_user(env.now)

    def _maybe_done(self) -> None:
        """Count-bound runs (and a closed-loop pool that ran dry) end when nothing is left to serve."""
        if self._done.triggered or self.in_prefill or any(e.outstanding for e in self.engines):
            return
        if self.pinned:
            more = any(self._has_row(e) for e in range(len(self.engines)) if self.local[e])
        else:
            more = (self.n_rows is None or self.issued < self.n_rows) and self.req.load(self.issued)
        if more:
            return
        if self.wl.closed_loop:
            self.ended_by = "all_requests_done" if self.num_requests is not None else "workload_exhausted"
            self._done.succeed()
        elif self.num_requests is not None and self._arrivals_finished:
            self.ended_by = "all_requests_done"
            self._done.succeed()

    # ---------------------------------------------------------------- engine processes
    def run(self) -> SimResult | ShardPart:
        """Simulate to the end: the SimResult (a shard: its :class:`ShardPart`)."""
        env = simpy.Environment()
        self.env = env
        self._done = env.event()
        self._warm_done = env.event()
        self._users_waiting = 0
        self._error: BaseException | None = None
        self._driver_of: list[Driver | None] = []
        drivers = []
        for rep in range(self.replicas):
            ranks = self.engines[rep * self.dp_ranks: (rep + 1) * self.dp_ranks]
            if not self.local[rep * self.dp_ranks]:     # a shard steps its own replicas only
                self._driver_of += [None] * len(ranks)
                continue
            timeout, wait = self.dp_balance
            drv = Driver(env, ranks, self.executor, self.clock, done=self._on_finish,
                         balance=DPBalance(timeout, wait) if timeout is not None and len(ranks) > 1 else None)
            drivers.append(drv)
            self._driver_of += [drv] * len(ranks)
        self._arrivals_finished = self.wl.closed_loop
        if self.pinned:
            c, n = int(self.wl.concurrency), len(self.engines)
            self.users = self.users_target = c
            for e in range(n):   # user u sits on engine u mod n
                for _ in range(self._starting(c // n + (e < c % n)) if self.local[e] else 0):
                    self._issue_pinned(0.0, e)
        elif self.wl.closed_loop:
            self.users = self.users_target = int(self.wl.concurrency)
            for _ in range(self._starting(int(self.wl.concurrency))):
                self._issue_user(0.0)
            steps = getattr(self.wl, "user_steps", None)
            if steps:
                env.process(self._guard(self._user_schedule(env, steps)))
        else:
            env.process(self._guard(self._arrivals(env)))
        if self.wl.closed_loop and fastpath.enabled() and fastpath.refusal(self) is None:
            # the compiled kernel: the same steps, bit for bit (sim/fastpath.py)
            self.ended_by, end = fastpath.run_kernel(self, self.progress, MAX_REJECT_STREAK)
        else:
            end = self._run_simpy(env, drivers)
        if self.progress is not None:
            self.progress(end)
        if self.shard is not None:   # the end checks belong to the whole cluster: dsparksim.sim.shard.merge
            ended = self.duration is not None and self.ended_by == "duration"
            return self._part(float(self.duration) if ended else float(end))
        if self.wl.closed_loop and self.duration is not None and self.ended_by != "duration":
            raise pool_ran_out(self.n_rows, end, self.duration)
        if self.warmup_requests or self.client_cap is not None:
            self.notes["benchmark_start_s"] = float(self.bench_start)
            self.notes["warmup_requests"] = self.warmup_requests
            self.notes["client_cap"] = self.client_cap
        m = self.issued
        if m and self.n_admitted == 0 and self.n_rejected == m:
            self._nothing_fits()
        if self.duration is not None and self.ended_by == "duration":
            sim_time = float(self.duration)
        else:
            sim_time = float(end)
        return self._result(m, sim_time)

    def _run_simpy(self, env: simpy.Environment, drivers: list[Driver]) -> float:
        """Run the engines' SimPy processes to the end; the time it ended."""
        for drv in drivers:
            drv.proc = env.process(self._guard(drv.run()))
        if self.progress is not None:
            env.process(self._guard(self._progress(env)))
        if self.duration is not None:
            stop = env.timeout(self.duration)
            env.run(until=env.any_of([stop, self._done]))
            if not self._done.triggered:
                self.ended_by = "duration"
        else:
            self._maybe_done()
            env.run(until=self._done)
        if self._error is not None:
            raise self._error
        return env.now

    def _guard(self, gen):
        """Run a process; an exception in it ends the run and is re-raised by run() as itself (SimPy would rebuild
        it from its args, which our errors' constructors do not take)."""
        try:
            yield from gen
        except Exception as e:   # noqa: BLE001 - re-raised unchanged by run()
            self._error = e
            if not self._done.triggered:
                self._done.succeed()

    def _progress(self, env: simpy.Environment):
        while True:
            yield env.timeout(1.0)
            self.progress(env.now)

    def _result(self, m: int, sim_time: float) -> SimResult:
        idx, request_id = (slice(0, m), None)
        if self.pinned:   # the rows each engine's users sent (not a prefix of the workload): by row
            request_id = np.sort(np.concatenate([np.array([self.router.user_row(e, k) for k in range(c)], np.int64)
                                                 for e, c in enumerate(self._cursor)]))
            idx = request_id
        gaps = [np.array(e.gaps, np.int64).reshape(-1, 3) for e in self.engines]
        if request_id is not None:      # rows -> positions in the result
            for g in gaps:
                g[:, 0] = np.searchsorted(request_id, g[:, 0])
        return result_of(self.req, idx, [e.log for e in self.engines], [e.acc_pos_log for e in self.engines],
                         request_id=request_id, sim_time_s=sim_time, ended_by=self.ended_by, notes=self.notes,
                         gaps=gaps, **self._meta())

    def _meta(self) -> dict[str, Any]:
        return dict(K=self.K, dp_ranks=self.dp_ranks, replicas=self.replicas, kv_capacity_tokens=self.kv_cap,
                    max_batched_tokens=self.max_tokens, drafter=self.drafter, kv_policy=self.kv_policy,
                    kv_page_tokens=self.kv_page_tokens, disaggregated=self.disagg)

    def _part(self, sim_time: float) -> "ShardPart":
        rows = np.array(sorted(set(self.owned)), np.int64)
        r = self.req
        local = [e for e in range(len(self.engines)) if self.local[e]]
        return ShardPart(
            shard=self.shard, rows=rows, columns={k: getattr(r, k)[rows].copy() for k in TABLE_COLUMNS},
            logs={e: {k: np.asarray(v) for k, v in self.engines[e].log.items()} for e in local},
            acc={e: (np.vstack(self.engines[e].acc_pos_log) if len(self.engines[e].acc_pos_log) else None)
                 for e in local},
            gaps={e: np.array(self.engines[e].gaps, np.int64).reshape(-1, 3) for e in local},
            sim_time_s=sim_time, ended_by=self.ended_by, notes=dict(self.notes), n_admitted=self.n_admitted,
            pinned=self.pinned, issued=self.issued, n_rows=self.n_rows, duration_s=self.duration,
            closed_loop=bool(self.wl.closed_loop), max_model_len=self.max_model_len, meta=self._meta())


# The request-table columns a result is built from (result_of); a shard sends them for the rows it owns.
TABLE_COLUMNS = ("arrival", "admitted", "first_tok", "finish", "prompt", "out", "gen", "dsteps", "vtok", "atok",
                 "domain", "reject", "replica", "preempt", "recomp", "demit", "ttft_q", "ttft_pf", "ttft_tx",
                 "landed")


@dataclass
class ShardPart:
    """What one shard of a cluster (replicas ``shard[0]..shard[1]-1``) brings back: the table columns of the rows
    it owns (routed to its replicas, or rejected), the step logs of its engines, and its end; merged by
    :func:`dsparksim.sim.shard.merge`."""

    shard: tuple[int, int]
    rows: np.ndarray
    columns: dict[str, np.ndarray]
    logs: dict[int, dict[str, np.ndarray]]
    acc: dict[int, np.ndarray | None]
    sim_time_s: float
    ended_by: str | None
    notes: dict[str, Any]
    n_admitted: int
    pinned: bool
    issued: int
    n_rows: int | None
    duration_s: float | None
    closed_loop: bool
    max_model_len: int | None
    meta: dict[str, Any]
    gaps: dict[int, np.ndarray] = field(default_factory=dict)   # each engine's Scheduler.gaps (rows: table rows)


def nothing_fits(n_rejected: int, kv_cap: int, max_model_len: int | None, any_too_long: bool) -> ConfigError:
    """The error of a run in which no request could be admitted."""
    lim = f" or max_model_len {max_model_len}" if max_model_len is not None else ""
    return ConfigError("config", "max_model_len" if any_too_long else "kv_capacity_tokens",
                       f"{n_rejected} requests were rejected (prompt+output+K beyond the KV capacity {kv_cap}{lim}) "
                       "and none could be admitted: no request of this workload fits this engine")


def pool_ran_out(n_rows: int | None, now: float, duration: float) -> ConfigError:
    """The error of a duration-bound closed loop whose ``pool_size`` requests ran out at ``now``."""
    return ConfigError("config", "traffic.pool_size",
                       f"the closed-loop request pool ({n_rows} rows) ran out at t={now:.2f}s before the {duration}s "
                       "duration: raise the pool size (or leave it unset: unlimited)")


def result_of(tab: Any, idx: Any, logs: list[dict[str, Any]], accs: list[Any], *, request_id: np.ndarray | None,
              sim_time_s: float, ended_by: str | None, notes: dict[str, Any], K: int, dp_ranks: int, replicas: int,
              kv_capacity_tokens: int, max_batched_tokens: int, drafter: str, kv_policy: str, kv_page_tokens: int,
              disaggregated: bool, gaps: list[np.ndarray] | None = None) -> SimResult:
    """A SimResult from request-table columns (``tab.<column>[idx]``) and every engine's step log (engine order;
    ``accs``: each engine's accepted-per-position rows, a list of 1-d arrays or one 2-d array or None; ``gaps``:
    each engine's preemption gaps, [position in the result, first missed step, streaming step] with steps in that
    engine's log)."""
    cols = list(logs[0])
    for lg in logs[1:]:
        cols += [k for k in lg if k not in cols]
    steps: dict[str, np.ndarray] = {}
    for k in cols:
        parts = [np.asarray(lg[k]) if k in lg else np.full(len(lg["dt"]), np.nan) for lg in logs]
        steps[k] = np.concatenate(parts) if len(parts) > 1 else parts[0]
    lens = [len(lg["dt"]) for lg in logs]
    steps["replica"] = np.repeat(np.arange(len(logs)) // dp_ranks, lens).astype(np.int64)
    steps["rank"] = np.repeat(np.arange(len(logs)) % dp_ranks, lens).astype(np.int64)
    pos = [np.vstack(a) if isinstance(a, list) else a for a in accs if a is not None and len(a)]
    r, disagg = tab, disaggregated
    eng_idx = r.replica[idx]
    gap_req, gap_steps = None, None
    if kv_policy == "paged" and gaps is not None:
        off = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
        g = [np.asarray(x, np.int64).reshape(-1, 3) for x in gaps]
        gap_req = np.concatenate([x[:, 0] for x in g]) if g else np.zeros(0, np.int64)
        gap_steps = (np.concatenate([np.where(x[:, 1:] >= 0, x[:, 1:] + o, -1) for x, o in zip(g, off)])
                     if g else np.zeros((0, 2), np.int64))
    return SimResult(
        arrival_s=r.arrival[idx], admitted_s=r.admitted[idx], first_token_s=r.first_tok[idx],
        finish_s=r.finish[idx], prompt_tokens=r.prompt[idx], output_tokens=r.out[idx],
        emitted_tokens=r.gen[idx], decode_steps=r.dsteps[idx], verify_tokens=r.vtok[idx],
        accepted_tokens=r.atok[idx], domain=r.domain[idx].copy(), steps=steps, sim_time_s=sim_time_s,
        ended_by=ended_by, kv_capacity_tokens=kv_capacity_tokens, max_batched_tokens=max_batched_tokens,
        block_size=K, drafter=drafter, notes=notes, reject_reason=r.reject[idx].copy(),
        step_accepted_per_pos=(np.vstack(pos) if pos else np.zeros((0, K), np.int64)),
        replica=np.where(eng_idx >= 0, eng_idx // dp_ranks, -1).astype(np.int64),
        dp_rank=np.where(eng_idx >= 0, eng_idx % dp_ranks, -1).astype(np.int64),
        replicas=replicas, dp_ranks=dp_ranks, kv_policy=kv_policy,
        kv_page_tokens=kv_page_tokens if kv_policy == "paged" else 0,
        preemptions=r.preempt[idx].copy(), recomputed_tokens=r.recomp[idx].copy(), disaggregated=disagg,
        ttft_queue_s=r.ttft_q[idx].copy() if disagg else None,
        ttft_prefill_s=r.ttft_pf[idx].copy() if disagg else None,
        ttft_transfer_s=r.ttft_tx[idx].copy() if disagg else None,
        ttft_decode_wait_s=(r.admitted[idx] - r.landed[idx]) if disagg else None,
        ttft_first_step_s=(r.first_tok[idx] - r.admitted[idx]) if disagg else None,
        decode_emitted_tokens=r.demit[idx].copy(), request_id=request_id, gap_request=gap_req, gap_steps=gap_steps,
    )
