"""Executes one planned engine step for real: drafter forward, ONE flattened target forward, sampling.

Trace-replay mode (the only mode here): the accepted prefix a[i] = min(L[i], A[i]) comes from the plan (the
acceptance trace replayed by the engine, exactly as the simulator draws it); everything else is real work of the
right shapes:

* drafting: a random-weight "drafter proxy" (a TargetModel-shaped decoder with its own KV pool) runs the step's
  block the way the drafter would — a parallel drafter (dspark/dflash) one forward over n*K tokens, ``mtp1`` one
  forward over n tokens (K = 1) — and K draft tokens per request are sampled from its logits;
* verification: the anchor + the first L[i] drafts of every decoding request, plus this step's prefill chunks,
  in ONE target forward (:class:`~dsparksim.runner.flat.FlatForward`, no padding to K);
* sampling: the correction/bonus token of request i is sampled from the target's distribution at its flat index
  anchor + a[i]; a completing prefill samples the first output token from the chunk's last position.

Every request owns a KV slot; positions are absolute. After a decode step the request's cache is valid through
its anchor + a[i] accepted drafts; the sampled token becomes the next step's anchor.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from dsparksim.backend.model import ModelConfig, TargetModel
from dsparksim.sim.contract import NewRequest, Prefilled, StepOutcome, StepPlan
from dsparksim.errors import ConfigError
from dsparksim.runner.flat import FlatForward, KVPool, make_group
from dsparksim.runner.engine import step_extra


@dataclass
class StepTiming:
    draft_s: float = 0.0
    target_s: float = 0.0
    sample_s: float = 0.0


def split_rows(lens: np.ndarray, tk: np.ndarray, penalty: float, max_groups: int) -> list[np.ndarray]:
    """Partition rows into <= max_groups attention groups minimising the padded attention work
    sum_g rows_g * max(lens_g) * max(tk_g) + penalty * groups: the better of contiguous groups in query-length
    order (split only between distinct lengths) and in key-length order. A group pads every row's keys to its
    longest context, so a batch mixing fresh and long requests would pay rows x max context where a varlen kernel
    (and the profile's KV term) charges the sum of contexts; grouping by context too bounds that padding."""
    lens, tk = np.asarray(lens), np.asarray(tk)
    if len(lens) < 2 or max_groups < 2:
        return [np.arange(len(lens))]
    best = None
    for key in (lens, tk):
        order = np.argsort(key, kind="stable")
        ks = key[order]
        starts = np.concatenate([[0], np.flatnonzero(np.diff(ks)) + 1])     # units: runs of equal key
        ends = np.concatenate([starts[1:], [len(ks)]])
        cnt = (ends - starts).astype(float)
        lmax = np.maximum.reduceat(lens[order], starts).astype(float)
        tmax = np.maximum.reduceat(tk[order], starts).astype(float)
        cost, cuts = _best_partition(cnt, lmax, tmax, penalty, max_groups)
        if best is None or cost < best[0]:
            b = [0] + [int(starts[c]) for c in cuts] + [len(ks)]
            best = (cost, [order[x:y] for x, y in zip(b[:-1], b[1:])])
    return best[1]


def _best_partition(cnt: np.ndarray, lmax: np.ndarray, tmax: np.ndarray, penalty: float,
                    max_groups: int) -> tuple[float, tuple[int, ...]]:
    """Best split of u ordered units into <= max_groups contiguous groups; group cost = rows * max L * max tk +
    penalty. Returns (cost, unit indices where groups 2.. start). Dynamic programme over the last group's start,
    each stage one numpy min over an (u, u) cost matrix: O(max_groups * u^2)."""
    u = len(cnt)
    i, j = np.arange(u)[:, None], np.arange(u)[None, :]
    valid = j >= i
    rows = np.cumsum(cnt)
    R = np.where(valid, rows[j] - rows[i] + cnt[i], 0.0)                      # rows of units i..j
    Lm = np.maximum.accumulate(np.where(valid, lmax[j], 0.0), axis=1)        # max over i..j (0 before i)
    Tm = np.maximum.accumulate(np.where(valid, tmax[j], 0.0), axis=1)
    C = np.where(valid, R * Lm * Tm + penalty, np.inf)                       # C[i, j]: one group of units i..j
    f = C[0].copy()                                 # f[j]: best cost of units 0..j in <= g groups
    back: list[np.ndarray] = []                     # per stage: start of the last group (0 = one group)
    for _ in range(1, min(max_groups, u)):
        # last group i..j (i >= 1) after the best split of 0..i-1
        T = np.where(valid[1:], f[:-1, None] + C[1:], np.inf)               # (u-1, u): i-1 = row index
        arg = np.argmin(T, axis=0)
        cand = T[arg, np.arange(u)]
        better = cand < f
        back.append(np.where(better, arg + 1, -1))
        f = np.where(better, cand, f)
    cuts, j = [], u - 1
    for bk in reversed(back):                       # walk back through the stages that improved on fewer groups
        if j < 0:
            break
        s = int(bk[j])
        if s > 0:
            cuts.append(s)
            j = s - 1
    return float(f[u - 1]), tuple(sorted(cuts))


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass(frozen=True)
class ExecutorConfig:
    """Device/dtype of the real engine and the drafter proxy's shape (layers of the target's width)."""

    device: str = "cpu"
    dtype: str = "float32"
    drafter_layers: int = 1
    temperature: float = 1.0
    seed: int = 0
    threads: int | None = 1      # CPU: torch threads (1 = steady timings on a shared machine)
    # Decode rows are split into at most ``max_groups`` attention groups by verify length so that queries are
    # padded only to their group's longest run; a split is taken when it saves more than ``group_penalty``
    # padded (row x query x key) cells, the rough cost of one more group's kernel launches (tuned on CPU).
    max_groups: int = 3
    group_penalty: float = 3000.0
    # Step clock: "wall" (perf_counter), "thread" (this thread's CPU time: immune to preemption by other
    # processes on a shared machine; valid only when all work runs on this thread, i.e. CPU with threads=1) or
    # "auto" (thread for CPU with threads=1, else wall; a GPU is always timed by the wall clock after a sync).
    clock: str = "auto"

    def __post_init__(self) -> None:
        if self.clock not in ("auto", "wall", "thread"):
            raise ConfigError("runner", "clock", f"expected auto, wall or thread, got {self.clock!r}")
        if self.clock == "thread" and (torch.device(self.device).type != "cpu" or self.threads != 1):
            raise ConfigError("runner", "clock", "the thread CPU-time clock needs device cpu with threads=1 "
                              f"(got {self.device}, threads={self.threads})")

    def clock_name(self) -> str:
        if self.clock != "auto":
            return self.clock
        return "thread" if torch.device(self.device).type == "cpu" and self.threads == 1 else "wall"

    def clock_fn(self):
        return time.thread_time if self.clock_name() == "thread" else time.perf_counter


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def torch_dtype(name: str) -> torch.dtype:
    if name not in _DTYPES:
        raise ConfigError("runner", "dtype", f"expected one of {sorted(_DTYPES)}, got {name!r}")
    return _DTYPES[name]


def build_models(cfg: ModelConfig, ex: ExecutorConfig, target: TargetModel | None = None):
    """(target, drafter proxy) on the executor's device/dtype; random weights unless ``target`` is given."""
    dev, dt = torch.device(ex.device), torch_dtype(ex.dtype)
    g = torch.random.fork_rng(devices=[])
    with g:
        torch.manual_seed(ex.seed)
        if target is None:
            with torch.device(dev):
                target = TargetModel(cfg)
        dcfg = ModelConfig(vocab_size=cfg.vocab_size, d_model=cfg.d_model, n_layers=ex.drafter_layers,
                           n_heads=cfg.n_heads, n_kv_heads=cfg.n_kv_heads, d_ff=cfg.d_ff, max_seq=cfg.max_seq,
                           rope_base=cfg.rope_base)
        with torch.device(dev):
            proxy = TargetModel(dcfg)
    for m in (target, proxy):
        m.to(device=dev, dtype=dt).eval()
        for p in m.parameters():
            p.requires_grad_(False)
    return target, proxy


class Executor:
    """Real per-step work for the engine's rows (row = workload index, slot = KV slot)."""

    def __init__(self, target: TargetModel, proxy: TargetModel, ex: ExecutorConfig, T: int, slots: int = 8):
        if ex.threads and torch.device(ex.device).type == "cpu":
            torch.set_num_threads(int(ex.threads))
        self.ex = ex
        self.dev = torch.device(ex.device)
        self.dtype = torch_dtype(ex.dtype)
        self.target, self.proxy = target, proxy
        self.tf = FlatForward(target)
        self.pf = FlatForward(proxy) if proxy is not None else None
        self.T = int(T)
        self.pool = KVPool(target, slots, self.T, self.dev, self.dtype)
        self.dpool = KVPool(proxy, slots, self.T, self.dev, self.dtype) if proxy is not None else None
        self.V = target.cfg.vocab_size
        self.gen = torch.Generator(device=self.dev)
        self.gen.manual_seed(ex.seed)
        self.np_rng = np.random.default_rng(ex.seed)
        # per row: prompt token ids, cache length (tokens valid in the slot), pending (anchor) token
        self.prompt: dict[int, np.ndarray] = {}
        self.cache_len: dict[int, int] = {}
        self.pending: dict[int, int] = {}
        self.timing = StepTiming()
        self.clock = ex.clock_fn()
        # measure's profiling cells: the contexts the next admitted requests are prefilled to, untimed (used once)
        self.untimed_contexts: np.ndarray | None = None

    # ---------------------------------------------------------------- request lifecycle (the step contract's)
    tracks_requests = True

    def start(self, new: Sequence[NewRequest]) -> Prefilled | None:
        """Admitted requests: each gets its KV slot and prompt tokens; with ``untimed_contexts`` set, they are
        prefilled to those contexts outside the loop (:meth:`fast_prefill`) and returned as such."""
        for q in new:
            self.start_request(q.row, q.slot, q.prompt_tokens, q.domain)
        if self.untimed_contexts is None:
            return None
        lens, self.untimed_contexts = self.untimed_contexts, None
        return self.fast_prefill(new, lens)

    def fast_prefill(self, new: Sequence[NewRequest], lens: np.ndarray) -> Prefilled:
        """The admitted requests ``new`` prefilled to contexts ``lens`` without running the prefill.

        Decode timing does not depend on the cached values, only on how many positions are read, so the KV slots
        are left as allocated; this makes long contexts (8k, 32k tokens) measurable without a quadratic prefill.
        """
        if len(lens) != len(new):
            raise RuntimeError(f"profiling engine admitted {len(new)} of its {len(lens)} requests")
        rows = np.array([q.row for q in new], np.int64)
        for r, ln in zip(rows, lens):
            self.cache_len[int(r)] = int(ln)
            self.pending[int(r)] = int(self.np_rng.integers(0, self.V))
        return Prefilled(rows, np.asarray(lens, np.int64))

    def finish(self, rows: np.ndarray) -> None:
        """Finished requests: their state is freed."""
        for row in rows:
            self.finish_request(int(row))

    def start_request(self, row: int, slot: int, prompt_len: int, domain: str | None = None) -> None:
        if prompt_len + 1 > self.T:
            raise ConfigError("runner", "max_seq_tokens", f"request row {row} needs {prompt_len} prompt tokens but "
                              f"the KV slots hold {self.T}")
        self.pool.ensure(slot + 1)
        self.dpool.ensure(slot + 1)
        self.prompt[row] = self.np_rng.integers(0, self.V, prompt_len)
        self.cache_len[row] = 0

    def finish_request(self, row: int) -> None:
        self.prompt.pop(row, None)
        self.cache_len.pop(row, None)
        self.pending.pop(row, None)

    # ---------------------------------------------------------------- sampling
    def _sample(self, logits: torch.Tensor) -> torch.Tensor:
        if self.ex.temperature == 0:
            return logits.argmax(-1)
        p = torch.softmax(logits.float() / self.ex.temperature, -1)
        return torch.multinomial(p, 1, generator=self.gen)[:, 0]

    # ---------------------------------------------------------------- one step
    def _flat_inputs(self, pend, drafts, L, starts, dec_slots, K: int, chunks):
        """One step's flat target input: every decoding request's anchor + its first L[i] drafts (rows grouped
        by :func:`split_rows`), then the prefill chunks (their own attention group).

        Returns (tokens (M,), pos (M,), groups, order, lens, n_dec_tokens); ``order[j]`` = plan index of flat
        decode row j, ``lens`` = 1 + L.
        """
        dev = self.dev
        toks, poss, groups, lo = [], [], [], 0
        order = lens = None
        if starts is not None and len(starts):
            lens = 1 + np.asarray(L, np.int64)
            parts = split_rows(lens, starts + lens, self.ex.group_penalty, self.ex.max_groups)
            order = np.concatenate(parts)
            sd = drafts.device
            seq = torch.cat([pend[:, None].to(sd), drafts], 1)[torch.as_tensor(order, device=sd)]
            keep = torch.arange(K + 1, device=sd)[None, :] < torch.as_tensor(lens[order], device=sd)[:, None]
            toks.append(seq[keep])
            for idx in parts:
                g, pos = make_group(lo, dec_slots[idx], lens[idx], starts[idx], dev)
                poss.append(pos)
                groups.append(g)
                lo = g.hi
        if chunks:
            g, pos = make_group(lo, [c[1] for c in chunks], [c[3] for c in chunks], [c[2] for c in chunks], dev)
            for row, _, st, ln in chunks:
                toks.append(torch.as_tensor(self.prompt[row][st:st + ln], dtype=torch.long))
            poss.append(pos)
            groups.append(g)
        tokens = torch.cat([t.to(dev) for t in toks])
        return tokens, torch.cat(poss).to(dev), groups, order, lens, lo

    def execute(self, plan: StepPlan) -> StepOutcome:
        """The step contract: run ``plan`` for real; accepted prefix a = min(L, A) replayed from the plan's drawn
        truth. ``duration_s`` is the measured execution time (the engine's driver adds planning and apply time)."""
        t0 = self.clock()
        a = (np.minimum(plan.verify, plan.true_accepted) if plan.n_decode else np.zeros(0, np.int64))
        tm = self.run_step(plan.decode, plan.slots, plan.verify, a, plan.K, plan.prefill)
        return StepOutcome(duration_s=self.clock() - t0, accepted=a, extra=step_extra(plan, tm.draft_s, tm.target_s))

    @torch.no_grad()
    def run_step(self, dec_rows: np.ndarray, dec_slots: np.ndarray, L: np.ndarray, a: np.ndarray, K: int,
                 chunks: list[tuple[int, int, int, int]]) -> StepTiming:
        """Run a step given as arrays (``execute``'s work; profiling cells call it directly). chunks: (row, slot,
        start, length) prefill pieces. Returns the timing split."""
        tm = StepTiming()
        dev = self.dev
        n = len(dec_rows)
        drafts = starts = pend = None
        clock = self.clock
        if n:
            starts = np.array([self.cache_len[int(r)] for r in dec_rows], np.int64)
            pend = torch.tensor([self.pending[int(r)] for r in dec_rows], dtype=torch.long)
            drafts = torch.empty(n, 0, dtype=torch.long)     # K = 0 (policy none): nothing is drafted
        if n and K:
            t0 = clock()
            # drafter proxy: the anchor + K-1 mask ids at positions start+1..start+K, one forward for all rows,
            # its attention grouped by context like the target's (split_rows) so no row pays the longest context
            parts = split_rows(np.full(n, K), starts + 1 + K, self.ex.group_penalty, self.ex.max_groups)
            order = np.concatenate(parts)
            groups, poss, lo = [], [], 0
            for idx in parts:
                g, pos = make_group(lo, dec_slots[idx], np.full(len(idx), K), starts[idx] + 1, dev)
                groups.append(g)
                poss.append(pos)
                lo = g.hi
            blk = torch.zeros(n, K, dtype=torch.long)
            blk[:, 0] = pend[torch.as_tensor(order)]
            dl = self.pf(blk.reshape(-1).to(dev), torch.cat(poss).to(dev), groups, self.dpool)
            drafts = torch.empty(n, K, dtype=torch.long)
            drafts[torch.as_tensor(order)] = self._sample(dl).view(n, K).cpu()      # back to plan order
            sync(dev)
            tm.draft_s = clock() - t0
        t0 = clock()
        tokens, pos, groups, order, lens, n_dec_tok = self._flat_inputs(pend, drafts, L, starts, dec_slots, K, chunks)
        last_pf = [int(e) for e in n_dec_tok + np.cumsum([c[3] for c in chunks]) - 1] if chunks else []
        M = tokens.numel()
        logits = self.tf(tokens, pos, groups, self.pool)          # logits at all M positions
        sync(dev)
        tm.target_s = clock() - t0
        t0 = clock()
        # bonus/correction token per decoding request, first token of each completing prefill
        pick = []
        if n:
            lo_flat = np.cumsum(lens[order]) - lens[order]       # flat start of each row, in flat order
            first = np.empty(n, np.int64)
            first[order] = lo_flat
            pick.extend((first + np.asarray(a, np.int64)).tolist())
        done_pf = [(row, e) for (row, _, st, ln), e in zip(chunks, last_pf) if st + ln == len(self.prompt[row])]
        pick.extend(e for _, e in done_pf)
        if pick:
            new = self._sample(logits[torch.as_tensor(pick, device=dev)]).cpu().tolist()
        for j, r in enumerate(dec_rows):
            r = int(r)
            self.cache_len[r] += int(a[j]) + 1
            self.pending[r] = new[j]
        for (row, _, st, ln) in chunks:
            self.cache_len[row] = st + ln
        for j, (row, _) in enumerate(done_pf):
            self.pending[row] = new[n + j]
        tm.sample_s = clock() - t0
        self.last_M = M
        return tm
