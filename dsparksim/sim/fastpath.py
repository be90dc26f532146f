"""The compiled fast path: a supported run's steps in the numba kernel (:mod:`dsparksim.sim.kernel`), the same
decisions, prices and results as the numpy engine, bit for bit (tests/test_kernel_agreement.py).

Supported: engines priced by the profile (no real executor), one or more replicas routed by ``least-outstanding``,
``round-robin`` or ``pinned`` (a shard of a pinned run too; no DP ranks or disaggregation), a closed loop bounded
by a duration, of at most ``cluster.MAX_WAITING`` users (no warm-up, client cap or user steps), mixed prefill without batch waiting, early exit or padding,
paged or reserved KV, keyed pre-drawn acceptance draws, the ``confidence``, ``fixed``, ``mtp1`` and ``threshold``
policies, and a price from the dense verify table (with or without the long-context term; without the drafter's
context term or a measured prefill-only price). Anything else runs on the numpy engine, as does every run when
numba is not installed (``pip install -e ".[fast]"``), is installed but cannot be imported (:func:`import_failure`:
a warning says why) or ``DSPARKSIM_KERNEL=0`` is set. :func:`refusal` says why a run is not supported.

The kernel stops when it needs Python; :func:`run_kernel` does there what the numpy engine does at that point
(loads a request row, draws a block of acceptance steps, looks up a price term) and steps on. The first run
compiles the kernel (about 20 s) and caches it (numba ``cache=True``, beside the module or in numba's cache
directory); later processes load it.
"""
from __future__ import annotations

import functools
import logging
import os
from collections import deque
from typing import Any, Callable

import numpy as np

from dsparksim.policies import confidence, fixed
from dsparksim.policies.confidence import Confidence
from dsparksim.policies.fixed import Fixed
from dsparksim.policies.mtp1 import MTP1
from dsparksim.policies.threshold import Threshold
from dsparksim.sim import jit
from dsparksim.sim.contract import CostExecutor
from dsparksim.cost.price import DecodeQKStepTime, DenseStepTime
from dsparksim.sim.driver import Driver, PriceClock
from dsparksim.sim.scheduler import LOG_KEYS

log = logging.getLogger(__name__)

ENV = jit.ENV                     # "0" / "off": always the numpy engine
CHECK_EVERY = 2048                # steps per kernel call at most (progress, Ctrl-C)
POLICIES = (Confidence, Fixed, MTP1, Threshold)   # the policies the kernel decides as (kernel.P_* order)
ROUTERS = ("least-outstanding", "round-robin", "pinned")   # the routers the kernel routes as (kernel.R_* order)
# cluster.MAX_WAITING (not imported: cluster imports this module): an engine with more requests outstanding stops the
# numpy run with an error the kernel does not check, so a run with more users than that takes the numpy engine
MAX_USERS = 500_000


def enabled() -> bool:
    """The kernel may run: numba is installed and ``DSPARKSIM_KERNEL`` is not 0/off (:mod:`dsparksim.sim.jit`)."""
    return jit.enabled()


def _mirrored(sim: Any = None) -> dict[str, Any]:
    """The Python code the kernel mirrors, by name (looked up now: a patched function counts): the policies, and
    with ``sim`` its scheduler, KV manager, driver, closed loop, router, price and draws."""
    code = {"Confidence.choose": Confidence.choose, "Confidence.observe": Confidence.observe,
            "algorithm1": confidence.algorithm1, "early_stop_ranked": confidence.early_stop_ranked,
            "Ranking": confidence.Ranking, "first_drop": confidence.first_drop,
            "candidate_budget": confidence.candidate_budget, "draft_budget": fixed.draft_budget,
            "existing": fixed.existing, "cap_lowest_index_first": fixed.cap_lowest_index_first,
            "Fixed.choose": Fixed.choose, "Fixed.observe": Fixed.observe, "MTP1.choose": MTP1.choose,
            "MTP1.observe": MTP1.observe, "Threshold.choose": Threshold.choose, "Threshold.observe": Threshold.observe,
            "Driver.run": Driver.run, "Driver.schedule": Driver.schedule, "Driver.admit": Driver.admit,
            "Driver.execute": Driver.execute, "Driver.update": Driver.update,
            "CostExecutor.execute": CostExecutor.execute, "DenseStepTime": DenseStepTime,
            "DecodeQKStepTime": DecodeQKStepTime}
    if sim is None:
        return code
    eng = sim.engines[0]
    parts = [(type(sim), ("_issue", "_route", "_issue_user", "_issue_pinned", "_has_row", "_on_finish",
                          "_maybe_done")),
             (type(eng), ("drain", "enqueue", "reject_reason", "admit", "_grow", "_preempt", "plan_step", "_choose",
                          "_chunks", "apply", "record", "_finish")),
             (type(eng.kv), ("need", "never_fits", "take", "release") + (
                 ("grow_decoding", "release_row") if eng.kv.paged else ())),
             (type(eng.pricer), ("step_time", "charge", "with_decode_qk")),
             (type(eng.profile), ("step_overhead", "prefill_time")),
             (type(eng._pre), ("admit", "take", "_refill"))]
    if len(sim.engines) > 1:
        parts.append((type(sim.router), ("route", "turn") + (("user_row",) if sim.pinned else ())))
    for cls, names in parts:
        for name in names:
            code[f"{cls.__name__}.{name}"] = getattr(cls, name)
    return code


# sha256 (first 16 hex digits) of the source of each mirrored function or class when the kernel was last checked
# against it (tests/test_kernel_agreement.py): code that differs -- edited, or patched at run time, as a CI
# pipeline's regress check of a policy or scheduler change does -- sends its runs to the numpy engine, which runs
# the code as it is. After a change to one of them, make the kernel follow it and update its entry here (the test
# prints them all; tests/test_kernel_agreement.py's _every_mirror builds a run of each kind).
MIRRORED = {
    "Confidence.choose": "2d28b0a7e92e5dd4",
    "Confidence.observe": "1c761cc4e67148bf",
    "algorithm1": "bd96b004a3624550",
    "early_stop_ranked": "f286cf5983259fcc",
    "Ranking": "606d4b2fa39ce12f",
    "first_drop": "0112ddb027bdacfe",
    "candidate_budget": "f8ef3f20f45b84f9",
    "draft_budget": "e1c8bd7afb49317d",
    "existing": "008e58b117186cca",
    "cap_lowest_index_first": "b47a898a134badbe",
    "Fixed.choose": "232867b72bee1cc0",
    "Fixed.observe": "1c761cc4e67148bf",
    "MTP1.choose": "8c8b2211ce4501db",
    "MTP1.observe": "1c761cc4e67148bf",
    "Threshold.choose": "59360a2d762ca25e",
    "Threshold.observe": "1c761cc4e67148bf",
    "Driver.run": "b70f32771378c2c3",
    "Driver.schedule": "c9cf0333e1e0466b",
    "Driver.admit": "13959d6bff604c02",
    "Driver.execute": "ede5360910385bd4",
    "Driver.update": "2642029714b83541",
    "CostExecutor.execute": "4e78617cf34dd75c",
    "DenseStepTime": "45f4588f5785c37a",
    "DecodeQKStepTime": "c881060b6dbc0ac6",
    "Simulation._issue": "d8b6a03c5ed40e88",
    "Simulation._route": "129ab9f29f0db8e6",
    "Simulation._issue_user": "725e45b2759457f2",
    "Simulation._issue_pinned": "b3182fc78d17b52f",
    "Simulation._has_row": "0a05983523fdcc52",
    "Simulation._on_finish": "9384bbd38759a6c2",
    "Simulation._maybe_done": "266c16f859ad96b7",
    "Scheduler.drain": "93f803072dd1fbb2",
    "Scheduler.enqueue": "aefa7e0af14cd589",
    "Scheduler.reject_reason": "c24df4d3d4633994",
    "Scheduler.admit": "5e5a0568a10c7329",
    "Scheduler._grow": "266e8a8255727da6",
    "Scheduler._preempt": "dbb71e554817a056",
    "Scheduler.plan_step": "9df68e7afa6e21c6",
    "Scheduler._choose": "8e9bd54e2e6865ba",
    "Scheduler._chunks": "c23a668bad62f142",
    "Scheduler.apply": "ba25236ee1d1c1a8",
    "Scheduler.record": "11504dcfc6127f2d",
    "Scheduler._finish": "b0f89d0adbd4ea82",
    "PagedKV.need": "80aba4c99860fa59",
    "PagedKV.never_fits": "a2a55ceaa8db9e42",
    "PagedKV.take": "dc0758a4b3419d6b",
    "PagedKV.release": "6ad7c436022c048a",
    "PagedKV.grow_decoding": "0f258b4871c7bd35",
    "PagedKV.release_row": "50debb3c33e2bcb6",
    "StepPricer.step_time": "a4b5a39190819600",
    "StepPricer.charge": "f7a2e8aff4dd7493",
    "StepPricer.with_decode_qk": "877844b841f63e9b",
    "CostProfile.step_overhead": "bec6ee81b362c254",
    "CostProfile.prefill_time": "e32e471d4314d29d",
    "PredrawnDraws.admit": "ec7d8379f3f70023",
    "PredrawnDraws.take": "37603eb61ee2ca87",
    "PredrawnDraws._refill": "0396370e8cf72715",
    "ReserveKV.need": "50f7770a34729425",
    "ReserveKV.never_fits": "8d6d5babdd8bf040",
    "ReserveKV.take": "28af9e1a8a02470b",
    "ReserveKV.release": "9b6c5b1ed1391419",
    "LeastOutstanding.route": "f57b7e5fabae84d2",
    "LeastOutstanding.turn": "9de5c470dbe1c6d6",
    "RoundRobin.route": "b7c829d7b659e8b0",
    "RoundRobin.turn": "9de5c470dbe1c6d6",
    "Pinned.route": "4afda349238f1673",
    "Pinned.turn": "9de5c470dbe1c6d6",
    "Pinned.user_row": "1621c43372f96b90",
}


def fingerprints(sim: Any = None) -> dict[str, str]:
    """The fingerprint of each mirrored function or class as it is now (see :data:`MIRRORED`; ``sim``: also the
    code of its scheduler, KV manager, ... as :func:`_mirrored` lists)."""
    return {name: jit.fingerprint(obj) for name, obj in _mirrored(sim).items()}


def mirror_changes(sim: Any = None) -> list[str]:
    """The mirrored functions or classes whose code differs from the kernel's copy (empty: none)."""
    return jit.changed(_mirrored(sim), MIRRORED)


def refusal(sim: Any) -> str | None:
    """Why ``sim`` cannot run on the kernel (None: it can); the module doc lists what is supported."""
    eng = sim.engines[0]
    router = sim.router.name if len(sim.engines) > 1 else ROUTERS[0]
    checks = (
        (sim.dp_ranks == 1, "DP ranks"),
        (router in ROUTERS, f"router {router}"),
        (not sim.disagg, "disaggregated"),
        (sim.shard is None or sim.pinned, "a shard of an open loop"),
        (sim.executor is None or type(sim.executor) is CostExecutor, "a real executor"),
        (sim.clock is None or type(sim.clock) is PriceClock, "a measured clock"),
        (sim.duration is not None and sim.num_requests is None, "a request-count stop rule"),
        (bool(sim.wl.closed_loop), "not a closed loop"),
        (int(getattr(sim.wl, "concurrency", 0) or 0) <= MAX_USERS, "more users than an engine's queue limit"),
        (not getattr(sim.wl, "user_steps", None), "user steps"),
        (not sim.warmup_requests and sim.client_cap is None, "a benchmark client"),
        (eng.mixed and eng.batch_wait is None, "prefill-only steps or batch waiting"),
        (eng.draft_exit is None and not eng.pad_verify, "early exit or padded verification"),
        (eng.streams is not None and eng._pre is not None, "acceptance draws not pre-drawn"),
        (all(type(e.policy) is type(eng.policy) for e in sim.engines) and type(eng.policy) in POLICIES,
         f"policy {getattr(eng.policy, 'spec', '?')}"),
        (eng.pricer.dense is not None, "no dense verify table"),
        (not eng.pricer.drafter_reads_kv(eng.drafter), "a drafter context term"),
        (eng.profile.prefill_only is None, "a measured prefill-only price"),
    )
    for ok, why in checks:
        if not ok:
            return why
    changed = mirror_changes(sim)
    if changed:
        return f"code differs from the kernel's copy ({', '.join(changed)})"
    return import_failure()


@functools.cache
def import_failure() -> str | None:
    """Why the kernel cannot be imported though numba is installed (a numba built for another NumPy, a missing
    LLVM library), None if it can; a warning says it once per process, and such runs take the numpy engine."""
    try:
        _kernel_module()
    except (ImportError, OSError) as e:
        why = f"numba cannot be imported ({type(e).__name__}: {e})"
        log.warning("dsparksim: the step kernel is off: %s; the numpy engine runs (the same results, slower); "
                    "reinstall numba (pip install -e \".[fast]\") or set %s=0 to silence this", why, ENV)
        return why
    return None


def _mute(record: logging.LogRecord) -> bool:
    """A logging filter that drops every record (the probe profile's lookups)."""
    return False


def _ring(rows: list[int], cap: int) -> np.ndarray:
    a = np.zeros(cap, np.int64)
    a[: len(rows)] = rows
    return a


class _State:
    """The kernel's arrays for one cluster (see :mod:`dsparksim.sim.kernel`) and their sync with the Python
    objects."""

    def __init__(self, sim: Any, k: Any, max_streak: int) -> None:
        self.sim, self.k = sim, k
        engs = sim.engines
        eng, n_eng = engs[0], len(engs)
        self.engs = engs
        prof, kv, pricer = eng.profile, eng.kv, eng.pricer
        G, GF = np.zeros(k.N_G, np.int64), np.zeros(k.N_GF)
        SS, FF = np.zeros((n_eng, k.N_SS), np.int64), np.zeros((n_eng, k.N_FF))
        cap = 1 << max(4, int(int(sim.wl.concurrency) + 2).bit_length())   # a queue holds every user's request
        n = eng.max_seqs + 1
        self.RUN, self.FS = np.zeros((n_eng, n), np.int64), np.zeros((n_eng, n), np.int64)
        self.WQ, self.IB = np.zeros((n_eng, cap), np.int64), np.zeros((n_eng, cap), np.int64)
        for e, en in enumerate(engs):
            S = SS[e]
            S[k.N_RUN], self.RUN[e, : len(en.running_rows())] = len(en.running_rows()), en.running_rows()
            S[k.WQ_LEN], self.WQ[e] = len(en.waiting), _ring(list(en.waiting), cap)
            S[k.IB_LEN], self.IB[e] = len(en.inbox.items), _ring(en.inbox.items, cap)
            S[k.N_FREE], self.FS[e] = len(en.free_slots), _ring(en.free_slots, n)
            S[k.PAGES_USED] = en.kv.pages_used if kv.paged else 0
            S[k.RESERVED] = 0 if kv.paged else en.kv.reserved
            S[k.N_ADMITTED], S[k.N_PREEMPTIONS], S[k.WAITING_NEED] = en.n_admitted, en.n_preemptions, en.waiting_need
            S[k.LOCAL] = int(sim.local[e])
            if sim.pinned:
                S[k.CURSOR], S[k.PSTREAK] = sim._cursor[e], sim._streak[e]
            # every engine's first event: its process starting at t = 0, in engine order (a shard's own engines)
            S[k.PHASE], S[k.EV_EID] = (k.WAKE, G[k.EID]) if sim.local[e] else (k.IDLE, -1)
            G[k.EID] += S[k.LOCAL]
        G[k.CUR], G[k.CUT] = -1, -1
        # pinned users route as pinned on one engine too (Simulation._issue_pinned: each engine's own rows)
        G[k.ROUTER] = ROUTERS.index(sim.router.name) if n_eng > 1 or sim.pinned else 0
        G[k.TURN] = sim.router._next if n_eng > 1 else 0
        self.cursor0 = list(sim._cursor)
        G[k.PAGED] = int(kv.paged)
        if kv.paged:
            G[k.N_PAGES], G[k.WM_PAGES], G[k.PAGE] = kv.n_pages, kv.wm_pages, kv.page
        else:
            G[k.PAGE] = 1
        G[k.KV_CAP], G[k.KK], G[k.MAX_TOK], G[k.CHUNK] = kv.cap, eng.K, eng.max_tokens, eng.chunk
        G[k.ISSUED], G[k.N_ROWS] = sim.issued, -1 if sim.n_rows is None else sim.n_rows
        G[k.N_REJECTED], G[k.STREAK], G[k.N_FINISHED] = sim.n_rejected, sim._reject_streak, sim.n_finished
        G[k.MAX_MODEL_LEN] = -1 if eng.max_model_len is None else eng.max_model_len
        G[k.ONCE_N], G[k.CHECK_EVERY], G[k.MAX_STREAK] = -1, CHECK_EVERY, max_streak
        G[k.POLICY] = POLICIES.index(type(eng.policy))
        if isinstance(eng.policy, Fixed):
            G[k.FIXED_K] = eng.policy.k
        if isinstance(eng.policy, Threshold):
            GF[k.THRESHOLD] = eng.policy.t
        pre = eng._pre
        G[k.RING], G[k.WRAP] = pre.R, pre._wrap
        GF[k.SPK], GF[k.DENSE_HI], GF[k.SQ] = pricer.spk, pricer._dense_hi, pricer.sq
        if prof.prefill_note is not None:
            G[k.PF_NOTE] = 1
            GF[k.PF_TOK], GF[k.PF_QK], GF[k.PF_CH] = (prof.prefill_s_per_token, prof.prefill_s_per_query_key,
                                                      prof.prefill_s_per_chunk)
            GF[k.PF_TOK_DEC], GF[k.PF_CH_DEC] = (prof.prefill_s_per_token_per_decode,
                                                 prof.prefill_s_per_chunk_per_decode)
            if eng.drafter is not None and eng.drafter in prof.drafters:
                G[k.PF_DRAFTER], GF[k.PF_DR_TOK] = 1, prof.drafters[eng.drafter].prefill_s_per_token
        GF[k.NOW], GF[k.DURATION] = sim.env.now, float(sim.duration)
        self.G, self.GF, self.SS, self.FF = G, GF, SS, FF
        self.NT, self.NTok = np.zeros(n), np.zeros(n, np.int8)
        self.probe = prof.with_extrapolation(prof.extrapolate)   # a copy: tells which terms extrapolate or raise
        self.LI = np.zeros((n_eng, 1024, len(k.LOG_INT)), np.int64)
        self.LF = np.zeros((n_eng, 1024, 2))
        self.LA = np.zeros((n_eng, 1024, max(eng.K, 1)), np.int64)
        self.GAPS = np.zeros((n_eng, max(64, 2 * n), 3), np.int64)
        self.gapo = np.full(0, -1, np.int64)
        for name in ("DEC", "LL", "AA", "CHR", "CHL"):     # each engine's planned step
            setattr(self, name, np.zeros((n_eng, n), np.int64))
        for name in ("pos", "fin", "newbuf"):
            setattr(self, name, np.zeros(n, np.int64))
        self.keys, self.sbuf = np.zeros(n * max(eng.K, 1)), np.zeros(n * max(eng.K, 1))
        self.Tb = np.zeros(eng.max_tokens + 1)

    def args(self) -> tuple:
        """The kernel's arguments, re-read from the table and the draws (both grow between calls)."""
        r, k, pre = self.sim.req, self.k, self.engs[0]._pre
        pre._sized()
        if self.gapo.size < r.cap:
            g = np.full(r.cap, -1, np.int64)
            g[: self.gapo.size] = self.gapo
            self.gapo = g
        self.G[k.AVAIL], self.G[k.AHEAD_UPTO] = r.known, pre.ahead_upto
        T = tuple(getattr(r, c) for c in k.TABLE_INT)
        TF = tuple(getattr(r, c) for c in k.TABLE_FLOAT)
        return (self.G, self.GF, self.SS, self.FF, T, TF, r.phase, r.reject, r.replica, pre.entry, pre._cs, pre._acc,
                pre._filled, self.RUN, self.WQ, self.IB, self.FS, self.newbuf, self.GAPS, self.gapo,
                self.engs[0].pricer.dense, self.NT, self.NTok, self.LI, self.LF, self.LA, self.DEC, self.pos, self.LL,
                self.AA, self.CHR, self.CHL, self.fin, self.keys, self.sbuf, self.Tb)

    def grow(self, name: str) -> None:
        """Double a per-engine table's second axis (steps or gaps)."""
        a = getattr(self, name)
        b = np.zeros((a.shape[0], 2 * a.shape[1], a.shape[2]), a.dtype)
        b[:, : a.shape[1]] = a
        setattr(self, name, b)

    def step_overhead(self, n: int) -> None:
        """The numpy engine's price term for n decoding rows (CostProfile.step_overhead): kept for every later step
        when it neither raises nor extrapolates (a probe copy says), else looked up again each step it is needed."""
        eng, k = self.engs[0], self.k
        # the probe's own "extrapolating" warning is muted: the real lookup below logs it, once, as the numpy engine
        profile_log = logging.getLogger(type(eng.profile).__module__)
        profile_log.addFilter(_mute)
        try:
            before = self.probe.extrapolation_report()["extrapolated"]
            float(self.probe.step_overhead(eng.drafter, n, eng.K))
            clean = not before and not self.probe.extrapolation_report()["extrapolated"]
        except Exception:   # noqa: BLE001 - the real lookup below raises it as the numpy engine would
            clean = False
        finally:
            profile_log.removeFilter(_mute)
        v = float(eng.profile.step_overhead(eng.drafter, n, eng.K))
        if clean:
            self.NT[n], self.NTok[n] = v, 1
        else:
            self.G[k.ONCE_N], self.GF[k.ONCE_VAL] = n, v

    def write_back(self) -> None:
        """Leave the engines, the run's counters and the logs as the numpy engine would have left them."""
        sim, G, k = self.sim, self.G, self.k
        for e, eng in enumerate(self.engs):
            self._write_engine(e, eng)
        sim.issued, sim.n_rejected, sim._reject_streak = int(G[k.ISSUED]), int(G[k.N_REJECTED]), int(G[k.STREAK])
        sim.n_finished = int(G[k.N_FINISHED])
        if len(self.engs) > 1:
            sim.router._next = int(G[k.TURN])
        if sim.pinned:
            n = len(self.engs)
            for e in range(n):
                end = int(self.SS[e, k.CURSOR])
                sim._cursor[e], sim._streak[e] = end, int(self.SS[e, k.PSTREAK])
                if sim.shard is not None:   # the rows its users sent, routed here or rejected (Simulation._issue)
                    sim.owned.extend(range(e + self.cursor0[e] * n, e + end * n, n))
            self.cursor0 = list(sim._cursor)

    def _write_engine(self, e: int, eng: Any) -> None:
        S, k = self.SS[e], self.k
        n_run, n_steps = int(S[k.N_RUN]), int(S[k.N_STEPS])
        eng._run_arr, eng._run_list = self.RUN[e, :n_run].copy(), None
        cap = self.WQ.shape[1]
        eng.waiting = deque(int(self.WQ[e, (S[k.WQ_HEAD] + i) & (cap - 1)]) for i in range(S[k.WQ_LEN]))
        eng.inbox.items = [int(self.IB[e, (S[k.IB_HEAD] + i) & (cap - 1)]) for i in range(S[k.IB_LEN])]
        eng.waiting_need, eng.free_slots = int(S[k.WAITING_NEED]), self.FS[e, : S[k.N_FREE]].tolist()
        eng.n_admitted, eng.n_preemptions = int(S[k.N_ADMITTED]), int(S[k.N_PREEMPTIONS])
        if eng.kv.paged:
            eng.kv.pages_used = int(S[k.PAGES_USED])
        else:
            eng.kv.reserved = int(S[k.RESERVED])
        log: dict[str, Any] = {"t_start": self.LF[e, :n_steps, 0].copy(), "dt": self.LF[e, :n_steps, 1].copy()}
        if n_steps == 1 and log["t_start"][0] == 0:
            # the numpy engine logs SimPy's start time, the int 0: a log of that one step is an int64 column
            log["t_start"] = np.zeros(1, np.int64)
        for j, name in enumerate(k.LOG_INT):
            log[name] = self.LI[e, :n_steps, j].copy()
        # an engine that never stepped keeps the numpy engine's empty lists (np.asarray([]) is float64, which
        # result_of's concatenation carries into every replica's column)
        eng.log = {name: log[name] if n_steps else [] for name in LOG_KEYS}
        if eng.kv.paged and n_steps:
            eng.log["kv_pages"], eng.log["preempted"] = log["kv_pages"], log["preempted"]
        eng.acc_pos_log = self.LA[e, :n_steps, : eng.K].copy() if n_steps else []
        eng.gaps = self.GAPS[e, : S[k.N_GAPS]].tolist()
        eng._gap_open = {g[0]: g for g in eng.gaps if g[2] < 0 and self.gapo[g[0]] >= 0}
        eng._preempted = []


def _kernel_module() -> Any:
    from dsparksim.sim import kernel   # lazy: numba is optional (the fast extra) and slow to import

    return kernel


@functools.cache
def _note_compiling(k: Any) -> None:
    """Say once per process that the kernel is about to be compiled (no cached machine code newer than its source:
    the first run after an install or an upgrade), so a progress bar sitting at 0 for that time is explained."""
    try:
        index = k.run_steps._cache._cache_file._index_path     # numba's cache index of the entry point
        fresh = os.path.exists(index) and os.path.getmtime(index) >= os.path.getmtime(k.__file__)
    except (AttributeError, OSError):    # another numba's cache layout: say nothing
        return
    if not fresh:
        log.warning("dsparksim: compiling the step kernel (first run after an install or upgrade: ~20-30 s; "
                    "cached for later runs)")


def run_kernel(sim: Any, progress: Callable[[float], None] | None, max_streak: int) -> tuple[str, float]:
    """Run ``sim`` (supported: :func:`refusal` is None; its closed-loop users issued, nothing stepped yet) to its
    end on the kernel: (ended_by, the time it ended). ``max_streak``: rejections in a row that end the run."""
    k = _kernel_module()
    _note_compiling(k)
    st = _State(sim, k, max_streak)
    GF = st.GF
    shown = 0
    while True:
        code = k.run_steps(*st.args())
        if progress is not None:
            # SimPy's progress process: a call at every whole simulated second up to the horizon, included
            upto = GF[k.DURATION] if code == k.X_STOP else min(GF[k.NOW], GF[k.DURATION])
            while shown + 1 <= upto:
                shown += 1
                progress(float(shown))
        if code == k.X_STOP:
            st.write_back()
            return "duration", float(GF[k.DURATION])
        if code == k.X_EXHAUSTED:
            st.write_back()
            return "workload_exhausted", float(GF[k.NOW])
        _handle(st, k, code)


def _handle(st: _State, k: Any, code: int) -> None:
    """Do what the numpy engine does where the kernel stopped (``code``), or raise its error."""
    sim, G = st.sim, st.G
    eng = st.engs[max(int(G[k.CUR]), 0)]
    if code == k.X_ADMIT:
        eng._pre.admit(st.newbuf[: G[k.N_NEW]].copy())
    elif code == k.X_REFILL:
        rows = st.DEC[int(G[k.CUR]), : G[k.AUX]].copy()
        pre, r = eng._pre, sim.req
        pre._sized()
        if np.count_nonzero(pre._filled[pre.entry[rows]] <= r.dsteps[rows]):
            pre._refill(rows, r.dsteps[rows])
    elif code == k.X_NT:
        st.step_overhead(int(G[k.AUX]))
    elif code == k.X_ROWS:
        if not sim.req.load(int(G[k.NEED_ROW])):
            G[k.EXHAUSTED] = 1      # the workload has no more rows than it loaded (RequestTable.load)
    elif code in (k.X_LOG, k.X_GAPS):
        st.grow({k.X_LOG: "LI", k.X_GAPS: "GAPS"}[code])
        if code == k.X_LOG:
            st.grow("LF")
            st.grow("LA")
    elif code == k.X_CHECK:
        pass
    elif code == k.X_NOTHING_FITS:
        st.write_back()
        sim._nothing_fits()
    elif code in (k.X_BUDGET, k.X_DT, k.X_PRICE):
        # a step the numpy engine refuses: plan it there (nothing was changed), which raises its own error
        st.write_back()
        eng.plan_step()
        raise RuntimeError(f"the step kernel stopped with code {code} where the numpy engine planned the step "
                           f"(rerun with {ENV}=0)")
    elif code == k.X_KV:
        raise RuntimeError(f"KV pages overflow on engine {int(G[k.CUR])}")
    else:
        raise RuntimeError(f"the step kernel stopped with code {code} (rerun with {ENV}=0 for the numpy engine)")
