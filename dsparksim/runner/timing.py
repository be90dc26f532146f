"""Timing the cells of `dsparksim measure` on the real engine: a profiling engine per cell (requests prefilled
untimed, a forced uniform verify length, every block rejected), the paired prefill cells and the drift reference
cell. Returns raw records; :mod:`.fitting` turns them into a profile."""
from __future__ import annotations

import gc
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar

import numpy as np
import torch

from dsparksim.acceptance.base import AcceptanceModel, Block
from dsparksim.backend.checkpoint import load_drafter
from dsparksim.backend.collect import load_models
from dsparksim.cost.price import chunk_query_keys
from dsparksim.cost.profile import FORMAT, profile_from_dict
from dsparksim.policies import draft_budget, rank_candidates, ratio_curve
from dsparksim.policies.base import Policy, StepContext
from dsparksim.runner.engine import MeasuredClock
from dsparksim.runner.executor import Executor, ExecutorConfig
from dsparksim.runner.live import LiveExecutor, PromptSource
from dsparksim.runner.grid import (PREFILL_CHUNKS, PREFILL_DECODE_ROWS, PREFILL_PREFIXES, REFERENCE_CELL, cell_contexts,
                                   slot_tokens)
from dsparksim.config import EngineConfig
from dsparksim.errors import ConfigError, InputError
from dsparksim.sim.driver import Driver
from dsparksim.sim.inputs import ResolvedInputs
from dsparksim.sim.scheduler import Scheduler
from dsparksim.sim.requests import RequestTable
from dsparksim.traffic.base import Workload

@dataclass
class LiveDrafters:
    """The trained drafters a live-mode profile is measured with (kind -> module / STS temperatures)."""

    drafters: dict
    temps: dict
    prompts: Any

    @classmethod
    def load(cls, models: str, kinds, target, K: int | None = None) -> "LiveDrafters":
        """``K``: the block size the drafters must have been trained for (mtp1: 1), checked with the calibration
        (measure --live -K 7 on K=3 drafters ended in a numpy broadcast traceback)."""
        _, _, tcpu, tmeta, cal = load_models(models)
        dev, dt = target.embed.weight.device, target.embed.weight.dtype
        ds, ts = {}, {}
        for k in kinds:
            m, ck = load_drafter(Path(models) / f"{k}.pt", k, tcpu, tmeta["sha256"])
            want = None if K is None else (1 if k == "mtp1" else K)
            if want is not None and ck["config"].get("K") != want:
                raise ConfigError(Path(models) / f"{k}.pt", "K", f"the drafter was trained for K="
                                  f"{ck['config'].get('K')} but this measurement uses K={want} (-K)")
            if k not in cal:
                raise InputError(Path(models) / "calibration.json", k, "no STS temperatures for this drafter")
            if want is not None and len(cal[k]["temperatures"]) != want:
                raise InputError(Path(models) / "calibration.json", k, f"{len(cal[k]['temperatures'])} "
                                 f"temperatures for block size {want}")
            m = m.to(device=dev, dtype=dt).eval()
            for p in m.parameters():
                p.requires_grad_(False)
            ds[k], ts[k] = m, np.asarray(cal[k]["temperatures"], float)
        # prompt content does not change a step's cost; a fixed token stream avoids needing the prompt files
        return cls(ds, ts, PromptSource({d: [[1, 2, 3]] for d in ("math", "code", "chat")}, sep=0))



class UniformL(Policy):
    """Profiling policy: every request verifies exactly ``L`` (settable between steps)."""

    name: ClassVar[str] = "uniform"
    usage: ClassVar[str] = "uniform"

    def __init__(self) -> None:
        super().__init__()
        self.L = 0

    def choose(self, ctx: StepContext) -> np.ndarray:
        # A representative scheduler cost stays in the measured floor: rank all n*K candidates and price the
        # batch as Algorithm 1 does, then force the uniform L being measured.
        order, values = rank_candidates(ctx.survival)
        b = min(draft_budget(ctx), ctx.n * ctx.K)
        ratio_curve(float(ctx.n), values, ctx.base_tokens, ctx.step_time, b)
        return np.full(ctx.n, min(self.L, ctx.K), dtype=np.int64)


class RejectAll(AcceptanceModel):
    """Profiling acceptance: every block is rejected at position 1 (context grows 1 token per step)."""

    def __init__(self, K: int, drafter: str):
        self.K, self.drafter, self.metadata = K, drafter, {"source": "profiling: accepted=0"}

    def start(self, slots, domains, rng) -> None:
        pass

    def draw(self, slots, rng) -> Block:
        n = len(slots)
        conf = rng.uniform(0.3, 1.0, (n, self.K))   # drawn like a real source (cost), never used for outcomes
        return Block(conf=conf, accepted=np.zeros(n, np.int64))

PLACEHOLDER_PROFILE = {"format": FORMAT, "name": "profiling-placeholder",
          "metadata": {"device": "-", "model": "-", "source": "-", "method": "-"},
          "verify": {"M": [1, 1 << 30], "time_s": [1e-3, 1e-3]}, "fixed_overhead_s": 0.0,
          "drafters": {"dspark": {"kind": "parallel", "tokens": [1, 1 << 30], "time_s": [1e-4, 1e-4]},
                       "dflash": {"kind": "parallel", "tokens": [1, 1 << 30], "time_s": [1e-4, 1e-4]},
                       "eagle3": {"kind": "autoregressive", "tokens": [1, 1 << 30], "time_s": [1e-4, 1e-4]},
                       "mtp1": {"kind": "mtp", "tokens": [1, 1 << 30], "time_s": [1e-4, 1e-4]}}}


def is_oom(e: BaseException) -> bool:
    return isinstance(e, getattr(torch, "OutOfMemoryError", ())) or "out of memory" in str(e).lower()


def profiling_engine(exe: Any, *, n: int, ctx: int, out_len: int, T: int, K: int, drafter: str, policy: Policy,
                     acceptance: AcceptanceModel, profile: Any, max_batched_tokens: int, prefill_chunk_tokens: int,
                     live: bool, rng: np.random.Generator, spread: tuple[float, ...] | None = None) -> Driver:
    """One engine with n requests admitted and prefilled (untimed, the executor's ``fast_prefill``) at contexts
    spread around ctx (:func:`cell_contexts`, with ``spread``), ready to be stepped (``Driver.step``) on the
    executor's clock."""
    wl = Workload(prompt_tokens=np.full(n, ctx, np.int64), output_tokens=np.full(n, out_len, np.int64),
                  domain=np.full(n, "chat", dtype=object), concurrency=n)
    table = RequestTable(wl, n, None)
    table.load(n - 1)
    cfg = EngineConfig(kv_policy="reserve", max_num_seqs=n, prefill_chunk_tokens=prefill_chunk_tokens)
    inputs = ResolvedInputs(profile=profile, policy=policy, K=K, acceptance=acceptance, drafter=drafter,
                            kv_cap=n * T, max_tokens=max_batched_tokens)
    eng = Scheduler(cfg, inputs, table, rng=rng)
    for i in range(n):
        eng.inbox.put(i)
    exe.untimed_contexts = cell_contexts(n, ctx, spread)
    st = Driver(None, [eng], exe, MeasuredClock(exe, live=live))
    if len(st.admit(eng, 0.0)) != n:
        raise RuntimeError(f"profiling engine admitted fewer than its {n} requests")
    return st


def cell_executor(target, proxy, ex: ExecutorConfig, T: int, slots: int, drafter: str,
                  live: "LiveDrafters | None" = None):
    """The executor a profiling cell runs on: the drafter proxy's (trace replay), or with ``live`` the trained
    drafter's live step with every block rejected after position 1 (the context grows one token per step)."""
    if live is None:
        return Executor(target, proxy, ex, T=T, slots=slots)
    return LiveExecutor(target, live.drafters[drafter], drafter, live.temps[drafter], live.prompts, ex, T=T,
                        slots=slots, force_reject=True)


def time_cell(target, proxy, ex: ExecutorConfig, K: int, drafter: str, n: int, ctx: int, Ls: list[int],
          warmup: int, reps: int, live: "LiveDrafters | None" = None,
          spread: tuple[float, ...] | None = None) -> list[dict[str, float]]:
    """Timed steps for n requests at context ctx, for each L in Ls (one engine, prefilled once).

    With ``live`` the step is the live-drafter step (trained drafter proposes, rejection sampling, drafter state
    update), every block then rejected at position 1 so the context still grows one token per step."""
    out_len = len(Ls) * (warmup + reps) + 6
    T = slot_tokens(ctx, K, warmup, reps, len(Ls), spread)
    exe = cell_executor(target, proxy, ex, T, n, drafter, live)
    pol = UniformL()
    pol.reset(K, np.random.default_rng(0))
    st = profiling_engine(exe, n=n, ctx=ctx, out_len=out_len, T=T, K=K, drafter=drafter, policy=pol,
                          acceptance=RejectAll(K, drafter), profile=profile_from_dict(PLACEHOLDER_PROFILE),
                          max_batched_tokens=n * (K + 1) + n * ctx, prefill_chunk_tokens=n * ctx,
                          live=live is not None, rng=np.random.default_rng(0), spread=spread)
    now = 0.0
    recs = []
    # verify lengths interleaved step by step (a fresh shuffled order every round): consecutive steps change
    # shape as in a served batch, and a speed change inside the cell hits every L alike instead of bending the
    # staircase; the first ``warmup`` rounds are discarded
    order = np.random.default_rng(1000 * n + ctx)
    for s in range(warmup + reps):
        for L in order.permutation(Ls):
            L = int(L)
            pol.L = L
            plans, outs, now = st.step(now)
            plan, out = plans[0][1], outs[0]
            if s >= warmup:
                x = out.extra
                recs.append({"n": n, "L": L, "ctx": ctx, "M": int(plan.M), "kv": int(plan.kv_read),
                             "qk": int(plan.decode_qk),
                             "t_step": float(out.duration_s), "t_target": float(x["t_target"]),
                             "t_draft": float(x["t_draft"]), "t_host": float(x["t_host"])})
    return recs


def reference_probe(target, proxy, ex, drafter: str = "dspark") -> Callable[[], float]:
    """The drift reference cell (REFERENCE_CELL: 4 requests, context 64, every request verifying L=3 of K=3):
    returns a function timing it (median step seconds on the executor's clock). The same cell, whatever the
    command's K, so reference timings from `measure` and `validate` compare."""
    rc = REFERENCE_CELL

    def probe() -> float:
        recs = time_cell(target, proxy, ex, rc["K"], drafter, rc["n_req"], rc["context"], [rc["L"]], rc["warmup"],
                     rc["reps"])
        return float(np.median([r["t_step"] for r in recs]))
    return probe


def time_prefill_cells(target, proxy, ex: ExecutorConfig, K: int, drafter: str, max_M: int, reps: int,
                   live: "LiveDrafters | None" = None, prefixes=PREFILL_PREFIXES) -> list[dict[str, float]]:
    """What prefill chunks add to a step: paired steps of the same n decoding requests (n in PREFILL_DECODE_ROWS,
    all K drafts verified) without and with k chunks of c fresh prompt tokens; medians over ``reps`` pairs (3 x
    ``reps`` steps for a prefill-only cell) after one warm-up. Each chunk starts after s cached prompt tokens (s in
    ``prefixes``, prefilled untimed), so the fit sees the c*s query-key pairs a chunk of a long prompt attends, not
    only the c(c+1)/2 of a first chunk.

    With n = 0 there is no step without the chunks: the record is the prefill-only step itself (M0 = 0, the
    "without" step costs nothing), fitted on its own (:func:`fit_prefill_only`, the profile's ``prefill.only``)
    and stored for validate's paired prefill-only cells (``metadata.prefill_cells``).

    The differences per timer (target forward, drafter, host) against the verify term's own difference at the two
    M values are what :func:`fit_prefill` fits: the quadratic query-key attention, per-token work (the drafter's
    state update over prompt features; 0 for the proxy, which ignores prompts) and a per-chunk cost (one more
    attention group and its bookkeeping).
    """
    recs = []
    for n, c, k, s in ((n, c, k, s) for n in PREFILL_DECODE_ROWS for c in PREFILL_CHUNKS for k in (1, 2)
                       for s in prefixes):
        if n * (K + 1) + c * k > max_M:
            continue
        T = 32 + 2 * (reps + 1) + K + 4 + c + s
        exe = cell_executor(target, proxy, ex, T, n + k, drafter, live)
        for r in range(n + k):
            exe.start_request(r, r, 32 if r < n else s + c, "chat")
        none = np.zeros(0, np.int64)
        if n:
            exe.run_step(none, none, none, none, K, [(r, r, 0, 32) for r in range(n)])  # decode rows' prompts
        if s:                                                                        # the chunks' cached prefix
            exe.run_step(none, none, none, none, K, [(r, r, 0, s) for r in range(n, n + k)])
        dec = np.arange(n)
        L = np.full(n, K, np.int64)
        chunks = [(r, r, s, c) for r in range(n, n + k)]
        rows = []
        # a prefill-only cell is one step (no pair) of a few ms, and its median is the whole price of such steps
        # and their pairs' reference: 3x the steps (their 5-step medians scattered +-25% around the fit here)
        for i in range((reps if n else 3 * reps) + 1):
            pair = []
            for ch in ([], chunks):
                kv = sum(exe.cache_len[int(r)] for r in dec) + n * (K + 1) + (s + c) * len(ch)
                if n == 0 and not ch:            # a prefill-only cell: no step without the chunks
                    pair.append((0.0, 0.0, 0.0, 0, 0))
                    continue
                t0 = exe.clock()
                if live is None:                    # the proxy drafter runs inside execute
                    tm = exe.run_step(dec, dec, L, np.zeros(n, np.int64), K, ch)
                else:
                    if n:
                        exe.propose(dec, dec, K)
                    tm = exe.run_step(dec, dec, L, None, K, ch)[0]
                dt = exe.clock() - t0
                pair.append((dt, tm.target_s, tm.draft_s, n * (K + 1) + c * len(ch), kv))
            if i:
                rows.append(pair)
        a = np.median(np.array(rows), axis=0)                # (2, 5): without / with the chunks
        recs.append({"n_dec": n, "chunk": c, "k": k, "prefix": s, "tokens": c * k,
                     "qk": k * chunk_query_keys(c, s),
                     "M0": int(a[0, 3]), "M1": int(a[1, 3]), "kv0": float(a[0, 4]), "kv1": float(a[1, 4]),
                     "d_step": float(a[1, 0] - a[0, 0]), "d_target": float(a[1, 1] - a[0, 1]),
                     "d_draft": float(a[1, 2] - a[0, 2])})
    return recs


def release(ex: ExecutorConfig) -> None:
    """Free a finished cell's KV pools before the next cell allocates its own (matters on a GPU)."""
    if torch.device(ex.device).type == "cuda":
        gc.collect()
        torch.cuda.empty_cache()
