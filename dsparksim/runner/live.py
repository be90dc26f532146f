"""Live-drafter mode of the real engine: the trained drafters decide acceptance online.

Trace-replay (:mod:`.executor`) replays accepted lengths; here every decoding request is served by the committed
[models] pair for real, inside the same continuous-batching loop and with the same policy objects:

1. draft: the trained drafter proposes K tokens per decoding request from its per-slot state (one batched
   forward for the parallel drafters, K sequential steps for eagle3, one for mtp1) and its raw confidences are
   STS-calibrated (``models/calibration.json``) — the scheduler sees exactly what the traces store;
2. the policy picks L[i] from those confidences (``Scheduler.plan_step(draft=executor.propose)``);
3. verify: anchor + first L[i] drafts of every request and the step's prefill chunks in ONE flattened target
   forward (:class:`~.flat.FlatForward`), then exact rejection sampling of the first L[i] drafts
   (:func:`~dsparksim.backend.specdec.verify_prefix`): the accepted prefix a[i] <= L[i] and the correction/bonus
   token come from the target itself, so the output follows the target's distribution whatever L is;
4. the drafter's per-slot state is advanced with the target's hidden states of the accepted tokens (and of every
   prefill chunk), as in :func:`~dsparksim.backend.specdec.speculative_generate`.

Prompts are real text: each request's prompt is its domain's held-out eval prompts (the split ``dsparksim collect``
decodes), tokenised and packed to the workload's prompt length (see :class:`PromptSource`).
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from dsparksim.acceptance.base import AcceptanceModel, Block
from dsparksim.backend.calibration import apply_sts
from dsparksim.backend.drafter_state import state_for
from dsparksim.backend.specdec import verify_prefix
from dsparksim.sim.contract import NewRequest, Prefilled, StepOutcome, StepPlan
from dsparksim.errors import ConfigError
from dsparksim.runner.engine import step_extra
from dsparksim.runner.executor import Executor, ExecutorConfig, StepTiming, sync
from dsparksim.backend.data import build_corpus, EOT
from dsparksim.backend.train import encode_prompts, PROMPT_KEEP


# ---------------------------------------------------------------------------------------------- prompts
class PromptSource:
    """Real prompt token ids per domain, packed to any requested length.

    A request of domain d and prompt length n gets, in turn, one of the eval prompts of exactly n tokens when there
    is one (its native length: what ``dsparksim collect`` decoded, so acceptance matches the traces; validation
    draws its lengths from :meth:`native_lengths`). Otherwise eval prompt j = (admission index) mod |prompts_d|
    is used and, when shorter than n, the preceding prompts of the same domain are prepended, each followed by
    the end-of-text token (documents packed back to back, as in training); the last n tokens are kept, so every
    prompt ends where a real prompt ends. Packing changes the context and with it the acceptance (markedly for
    the short math prompts), which is why validation uses native lengths.
    """

    def __init__(self, encoded: dict[str, list[list[int]]], sep: int):
        for d, seqs in encoded.items():
            if not seqs or not any(len(s) for s in seqs):
                raise ConfigError("live prompts", d, "no prompt tokens for this domain")
        self.enc = encoded
        self.sep = int(sep)
        self.count: dict[str, int] = {d: 0 for d in encoded}
        self.by_len: dict[str, dict[int, list[int]]] = {}
        for d, seqs in encoded.items():
            for i, s in enumerate(seqs):
                self.by_len.setdefault(d, {}).setdefault(len(s), []).append(i)
        self.exact_count: dict[tuple[str, int], int] = {}

    def native_lengths(self) -> list[tuple[str, int]]:
        """(domain, token length) of every eval prompt."""
        return [(d, len(s)) for d, seqs in self.enc.items() for s in seqs]

    @classmethod
    def from_models(cls, models: str | Path, prompts_dir=None) -> "PromptSource":
        """Fresh counters over the eval prompts of ``models``' preset, tokenised once per process."""
        enc, sep = _eval_prompts(str(Path(models).resolve()), None if prompts_dir is None else str(prompts_dir))
        return cls({d: [list(x) for x in seqs] for d, seqs in enc.items()}, sep)

    def tokens(self, domain: str, n: int) -> np.ndarray:
        if domain not in self.enc:
            raise ConfigError("workload", "domain", f"live mode has prompts for {sorted(self.enc)}, got {domain!r}")
        seqs = self.enc[domain]
        exact = self.by_len[domain].get(int(n))
        if exact:
            c = self.exact_count.get((domain, int(n)), 0)
            self.exact_count[(domain, int(n))] = c + 1
            return np.asarray(seqs[exact[c % len(exact)]], np.int64)
        j = self.count[domain]
        self.count[domain] += 1
        out: list[int] = list(seqs[j % len(seqs)])
        while len(out) < n:
            j -= 1
            out = list(seqs[j % len(seqs)]) + [self.sep] + out
        return np.asarray(out[-n:], np.int64)


@functools.lru_cache(maxsize=4)
def _eval_prompts(models: str, prompts_dir: str | None) -> tuple[dict[str, tuple[tuple[int, ...], ...]], int]:
    """Token ids of the eval split per domain and the end-of-text id (building the corpus reads the stdlib:
    a validation's many runs share one read)."""
    from dsparksim.backend.collect import load_models  # lazy: pulls in pandas, pyarrow

    cfg, tok, _, _, _ = load_models(models)
    corpus = build_corpus(cfg.data, prompts_dir)
    enc = {d: tuple(tuple(x) for x in encode_prompts(tok, texts, cfg.collect.max_prompt_tokens, PROMPT_KEEP[d]))
           for d, texts in corpus.prompts["eval"].items()}
    return enc, tok.token_to_id(EOT)


# ---------------------------------------------------------------------------------------------- acceptance stand-in
class LiveAcceptance(AcceptanceModel):
    """Stands in for the acceptance source in live mode: nothing is drawn, the drafter decides."""

    def __init__(self, drafter: str, K: int, metadata: dict[str, Any]):
        self.drafter, self.K, self.metadata = drafter, int(K), dict(metadata)

    def start(self, slots, domains, rng) -> None:
        pass

    def draw(self, slots, rng) -> Block:
        raise RuntimeError("live mode: acceptance is decided by the drafter, not drawn")


# ---------------------------------------------------------------------------------------------- executor
class LiveExecutor(Executor):
    """Real per-step work with a trained drafter/target pair (see module docstring)."""

    def __init__(self, target, drafter, kind: str, temps, prompts: PromptSource, ex: ExecutorConfig, T: int,
                 slots: int = 8, record_outputs: bool = False, force_reject: bool = False):
        super().__init__(target, None, ex, T=T, slots=slots)      # no drafter proxy: the real drafter drafts
        self.kind = kind
        self.temps = np.asarray(temps, float)
        self.prompts = prompts
        self.dstate = state_for(drafter, target, slots, self.T, self.dev, self.dtype)
        self.record = record_outputs
        # profiling: do all the real work, then keep only the correction token (context grows 1 per step)
        self.force_reject = force_reject
        self.outputs: dict[int, list[int]] = {}
        self.prompt_log: dict[int, np.ndarray] = {}
        self._draft: dict[str, Any] | None = None

    def start_request(self, row: int, slot: int, prompt_len: int, domain: str = "chat") -> None:
        if prompt_len + 1 > self.T:
            raise ConfigError("runner", "max_seq_tokens", f"request row {row} needs {prompt_len} prompt tokens but "
                              f"the KV slots hold {self.T}")
        self.pool.ensure(slot + 1)
        self.dstate.ensure(slot + 1)
        self.prompt[row] = self.prompts.tokens(domain, prompt_len)
        self.cache_len[row] = 0
        if self.record:
            self.outputs[row] = []
            self.prompt_log[row] = self.prompt[row]

    def fast_prefill(self, new: Sequence[NewRequest], lens: np.ndarray) -> Prefilled:
        """As :meth:`Executor.fast_prefill`; the drafter's per-slot state points at the contexts too."""
        pre = super().fast_prefill(new, lens)
        slots = torch.as_tensor([q.slot for q in new], device=self.dev)
        self.dstate.fake_prefill(slots, torch.as_tensor(lens, device=self.dev),
                                 torch.as_tensor([self.pending[int(r)] for r in pre.rows], device=self.dev))
        return pre

    @torch.no_grad()
    def propose(self, dec_rows: np.ndarray, dec_slots: np.ndarray, K: int) -> Block:
        """Draft K tokens for each decoding request; returns the calibrated confidences (accepted unknown)."""
        t0 = self.clock()
        slots = torch.as_tensor(dec_slots, dtype=torch.long, device=self.dev)
        d, q, conf = self.dstate.propose(slots, K, self.ex.temperature, self.gen)
        raw = conf.double().cpu().numpy()
        sync(self.dev)
        self._draft = {"rows": dec_rows, "d": d, "q": q, "raw": raw, "t": self.clock() - t0}
        return Block(conf=apply_sts(raw, self.temps[:K]), accepted=None)

    def execute(self, plan: StepPlan) -> StepOutcome:
        """The step contract: the plan's drafts (this executor's :meth:`propose`, called by ``plan_step``) are
        verified for real; ``outcome.accepted`` is what rejection sampling accepted."""
        t0 = self.clock()
        tm, a = self.run_step(plan.decode, plan.slots, plan.verify, None, plan.K, plan.prefill)
        return StepOutcome(duration_s=self.clock() - t0, accepted=a, extra=step_extra(plan, tm.draft_s, tm.target_s))

    @torch.no_grad()
    def _prefill_next(self, chunks: list[tuple[int, int, int, int]], off: int, logits: torch.Tensor,
                      sel_idx: list, sel_next: list, sel_runs: list) -> None:
        """Prefill chunks (flat tokens from ``off`` on): each prompt token's successor for the drafter update, and
        the first output token of each completing prefill (sampled from its last position's logits)."""
        dev = self.dev
        done_pf = []
        for row, slot, st, ln in chunks:
            e = off + ln - 1
            nx = torch.as_tensor(self.prompt[row][st + 1: st + ln + 1], dtype=torch.long, device=dev)
            if st + ln == len(self.prompt[row]):
                done_pf.append((row, e, len(sel_next)))
                nx = torch.cat([nx, torch.zeros(1, dtype=torch.long, device=dev)])   # filled below
            sel_idx.append(torch.arange(off, off + ln, device=dev))
            sel_next.append(nx)
            sel_runs.append(torch.tensor([ln], device=dev))
            self.cache_len[row] = st + ln
            off += ln
        if done_pf:
            first_tok = self._sample(logits[torch.as_tensor([e for _, e, _ in done_pf], device=dev)])
            for (row, _, k), t in zip(done_pf, first_tok.tolist()):
                sel_next[k][-1] = t
                self.pending[row] = t
                if self.record:
                    self.outputs[row].append(t)

    def run_step(self, dec_rows: np.ndarray, dec_slots: np.ndarray, L: np.ndarray, a_unused, K: int,
                 chunks: list[tuple[int, int, int, int]]) -> tuple[StepTiming, np.ndarray]:
        """Verify + prefill in one target forward, rejection-sample, advance the drafter. Returns (timing, a)."""
        tm = StepTiming()
        dev, clock = self.dev, self.clock
        n = len(dec_rows)
        a = np.zeros(0, np.int64)
        t0 = clock()
        dr, drafts, starts, pend = self._draft, None, None, None
        if n:
            if dr is None or not np.array_equal(dr["rows"], dec_rows):
                raise RuntimeError("live mode: execute() without a matching propose() for this step")
            tm.draft_s = dr["t"]
            drafts = dr["d"]
            starts = np.array([self.cache_len[int(r)] for r in dec_rows], np.int64)
            pend = torch.tensor([self.pending[int(r)] for r in dec_rows], dtype=torch.long, device=dev)
        tokens, pos, groups, order, lens, n_dec_tok = self._flat_inputs(pend, drafts, L, starts, dec_slots, K,
                                                                        chunks)
        hs, logits = self.tf(tokens, pos, groups, self.pool, hidden=True)   # [(M, d)] * layers, (M, V)
        sync(dev)
        tm.target_s = clock() - t0
        t0 = clock()
        # ---- rejection sampling of each request's verified prefix
        sel_idx, sel_next, sel_runs = [], [], []
        if n:
            lo_flat = np.cumsum(lens[order]) - lens[order]
            first = np.empty(n, np.int64)
            first[order] = lo_flat                                           # flat start per plan row
            fi = torch.as_tensor(first, device=dev)
            Lt = torch.as_tensor(np.asarray(L, np.int64), device=dev)
            j = torch.arange(K + 1, device=dev)
            idx = fi[:, None] + torch.minimum(j[None], Lt[:, None])          # (n, K+1), clamped inside each run
            A, new = verify_prefix(logits[idx], drafts, dr["q"], Lt, self.ex.temperature, self.gen)
            if self.force_reject:
                A = torch.zeros_like(A)
            a = A.cpu().numpy().astype(np.int64)
            # drafter update: tokens 0..a[i] of each run; the token after each is d_{j+1}, and `new` after the last
            nxt = torch.cat([drafts, torch.zeros_like(drafts[:, :1])], 1)
            nxt[torch.arange(n, device=dev), A] = new
            perm = torch.as_tensor(np.argsort(first, kind="stable"), device=dev)   # flat order of the runs
            keep = j[None] <= A[perm][:, None]                                  # (n, K+1): tokens 0..a[i]
            sel_idx.append((fi[perm][:, None] + j[None])[keep])
            sel_next.append(nxt[perm][keep])
            sel_runs = [A[perm] + 1]
            newl = new.cpu().tolist()
            for i, r in enumerate(dec_rows):
                r = int(r)
                self.cache_len[r] += int(a[i]) + 1
                self.pending[r] = newl[i]
                if self.record:
                    self.outputs[r].extend(drafts[i, : int(a[i])].cpu().tolist() + [newl[i]])
        self._prefill_next(chunks, n_dec_tok, logits, sel_idx, sel_next, sel_runs)
        # ---- advance the drafter with the target's features of every processed (kept) token (drafting work)
        sync(dev)
        t_obs = clock()
        if sel_idx:
            flat = torch.cat(sel_idx)
            last = torch.cumsum(torch.cat(sel_runs), 0) - 1                   # each run's last flat token
            slot_flat = torch.cat([g.slot[g.rid] for g in groups])
            st = slot_flat[flat]
            self.dstate.observe([h[flat] for h in hs], st, pos[flat], torch.cat(sel_next), last, st[last])
        sync(dev)
        t_obs = clock() - t_obs
        tm.draft_s += t_obs
        tm.sample_s = clock() - t0 - t_obs
        self.last_M = int(tokens.numel())
        self._draft = None
        return tm, a
