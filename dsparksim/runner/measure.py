"""Measure a cost profile (format ``dsparksim-profile/1``) on the real engine.

Sweep: for each context length c and number of decoding requests n, the real engine (the scheduler's
:class:`~dsparksim.sim.engine.Engine` stepped on the real clock by :class:`~.engine.RealStepper`, the very code that
serves runs) is loaded with n requests whose prompts of c tokens are prefilled (untimed), then a
uniform verify length L = 0..K is forced on every request; after ``warmup`` discarded steps, ``reps`` steps are
timed. Each timed step yields its measured split: drafter forward, target forward at M = n(1+L) with the KV
tokens it read, and the rest (host: acceptance draw, policy, tensor building, sampling, bookkeeping).

Separation (as TensorRT-LLM's DSpark profiler does, the floor from the verify term):
* verify term: target-forward time = V0(M) + B(n) + s * kv_tokens + q * query_key_pairs, fitted by non-negative
  least squares over the cell medians (:func:`decompose_target`; s and q need >= 2 contexts, otherwise no context
  term; q, written as ``attention.seconds_per_query_kv`` when > 0, prices a request's 1 + L queries each scoring
  its whole cache, which the engine charges per request at its own context). V0 is the profile's
  staircase (floor lookup); B(n), what the forward costs per request whatever is verified, joins the floor.
* non-trimmable floor: drafter forward per n (median; parallel drafter tokens n*K), host time per n (median,
  including a representative scheduler workload: Algorithm 1's ranking and pricing of the n*K candidates) and
  B(n); the minimum over n is ``fixed_overhead_s`` and the rest ``batch_overhead(n)``.
* a cell's contexts are spread over [c/2, 3c/2] (mean c), as in a served batch (:func:`cell_contexts`), or, with
  ``context_spread``, follow a workload's own context distribution scaled to mean c (:func:`context_spread`;
  ``validate --cell-spread workload`` passes its own workload's, so the cells' attention padding is the served
  batches').
* drafter context: with >= 2 contexts, least squares of the drafter time per cell on D(n) + s_d * kv_tokens
  (:func:`fit_drafter_context`) gives ``drafters.<name>.seconds_per_kv_token`` (its attention over the context),
  written when > 0; the drafter table is then D(n), the time at no context. A negative slope is clipped to 0
  (no term) with a logged note.
* mtp1: a K=1 sweep over n and the same contexts gives its one-forward cost (kind "mtp"), with its own
  context term fitted as the block drafter's.
* anchor context: unless a measured context is at most ``anchor_context`` (32) tokens, the cells are also
  measured there (:attr:`MeasureConfig.grid_contexts`), so V0(M) is measured at (almost) no context (fitted
  jointly with the other contexts; ``decompose_target(v0_at_shortest=True)``, V0 from the anchor cells alone, is
  an option that measured no reliable gain).

A result whose verify term does not grow with M (ratio of the largest to the smallest M's time < min_growth) is
refused as flat, and any non-positive or non-finite median as inert: neither is ever written. An out-of-memory
error is recorded per cell under ``metadata.failed_cells`` and that cell contributes no measurement.
"""
from __future__ import annotations

import datetime as _dt
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar

import numpy as np
import torch
from scipy.optimize import isotonic_regression, nnls

from dsparksim.acceptance.base import AcceptanceModel, Block
from dsparksim.errors import ConfigError
from dsparksim.policies import draft_budget, rank_candidates, ratio_curve
from dsparksim.policies.base import Policy, StepContext
from dsparksim.cost.price import chunk_query_keys
from dsparksim.cost.profile import FORMAT, profile_from_dict
from dsparksim.traffic.base import Workload
from dsparksim.sim.engine import Engine
from dsparksim.sim.requests import RequestTable
from dsparksim.runner.drift import CALIBRATION_PROBES, DEFAULT_GATE, DEFAULT_THRESHOLD, Bracket, DriftMonitor
from dsparksim.runner.engine import RealStepper, connect
from dsparksim.runner.executor import Executor, ExecutorConfig, build_models, torch_dtype
from dsparksim.runner.models import device_key, kv_capacity_tokens, load_target, model_key


@dataclass
class LiveDrafters:
    """The trained drafters a live-mode profile is measured with (kind -> module / STS temperatures)."""

    drafters: dict
    temps: dict
    prompts: Any

    @classmethod
    def load(cls, models: str, kinds, target) -> "LiveDrafters":
        from dsparksim.backend.checkpoint import load_drafter
        from dsparksim.backend.collect import load_models
        from dsparksim.runner.live import PromptSource
        _, _, tcpu, tmeta, cal = load_models(models)
        dev, dt = target.embed.weight.device, target.embed.weight.dtype
        ds, ts = {}, {}
        for k in kinds:
            m, _ = load_drafter(Path(models) / f"{k}.pt", k, tcpu, tmeta["sha256"])
            m = m.to(device=dev, dtype=dt).eval()
            for p in m.parameters():
                p.requires_grad_(False)
            ds[k], ts[k] = m, np.asarray(cal[k]["temperatures"], float)
        # prompt content does not change a step's cost; a fixed token stream avoids needing the prompt files
        return cls(ds, ts, PromptSource({d: [[1, 2, 3]] for d in ("math", "code", "chat")}, sep=0))


class MeasurementError(ConfigError):
    """A measurement that must not be written (flat, inert, or nothing measured)."""


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


ANCHOR_CONTEXT = 32    # tokens: the short context the cells are also measured at (MeasureConfig.grid_contexts)


@dataclass(frozen=True)
class MeasureConfig:
    model: str = "tiny"
    executor: ExecutorConfig = field(default_factory=ExecutorConfig)
    K: int = 7
    n_reqs: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 24, 28, 32)
    contexts: tuple[int, ...] = (32, 96, 160)
    warmup: int = 2
    reps: int = 5
    block_drafter: str = "dspark"
    mtp1: bool = True
    min_growth: float = 1.05
    name: str | None = None
    live_models: str | None = None   # time live-drafter steps with the trained drafters of this models dir
    prefill: bool = True             # also fit the prefill term (prefill-only cells)
    drift: bool = True               # re-time the reference cell beside every cell and normalise by it
    drift_threshold: float = DEFAULT_THRESHOLD   # a cell whose bracketing reference moved more is re-measured
    drift_attempts: int = 3          # measurements of one cell while the machine drifts past the threshold
    drift_gate: float | None = DEFAULT_GATE   # cells start and end in the machine's fast state (drift.py); None: off
    anchor_context: int = ANCHOR_CONTEXT   # also measured when every context is longer (0: off); see grid_contexts
    # a cell's contexts relative to their mean (quantiles of a workload's context distribution, :func:`context_spread`);
    # None: evenly over [c/2, 3c/2]
    context_spread: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if self.K < 1:
            raise ConfigError("measure", "K", f"must be >= 1, got {self.K}")
        if not self.n_reqs or min(self.n_reqs) < 1 or list(self.n_reqs) != sorted(set(self.n_reqs)):
            raise ConfigError("measure", "n_reqs", f"expected strictly increasing integers >= 1, got {self.n_reqs}")
        if 1 not in self.n_reqs:
            raise ConfigError("measure", "n_reqs", "must include 1 (the staircase must start at M=1)")
        if not self.contexts or min(self.contexts) < 1:
            raise ConfigError("measure", "contexts", f"expected context lengths >= 1, got {self.contexts}")
        if not self.drift_threshold > 0 or self.drift_attempts < 1:
            raise ConfigError("measure", "drift_threshold/drift_attempts", f"need a threshold > 0 and >= 1 attempt, "
                              f"got {self.drift_threshold}/{self.drift_attempts}")
        if self.warmup < 1 or self.reps < 3:
            raise ConfigError("measure", "warmup/reps", f"need warmup >= 1 and reps >= 3, got {self.warmup}/{self.reps}")
        if self.anchor_context < 0:
            raise ConfigError("measure", "anchor_context", f"expected >= 0 (0: off), got {self.anchor_context}")
        if self.context_spread is not None:
            check_spread(self.context_spread, "measure")

    @property
    def grid_contexts(self) -> tuple[int, ...]:
        """The contexts the cells are measured at: ``contexts`` plus ``anchor_context`` when every context is
        longer. V0(M) is the forward's cost with no context, which prefill chunks (from the first one of every
        prompt) and short requests pay; fitted from long contexts only it is an extrapolation to kv = 0, and on
        this CPU it came out 1.5-2x too high at M >= 72 (2026-12-02, contexts 512-1536: the dense part absorbed
        the 24-request cells' 12k-37k KV tokens; prefill-only steps were priced +41%, validation -7% pessimistic)."""
        a = self.anchor_context
        return (a,) + tuple(self.contexts) if a and min(self.contexts) > a else tuple(self.contexts)


PLACEHOLDER_PROFILE = {"format": FORMAT, "name": "profiling-placeholder",
          "metadata": {"device": "-", "model": "-", "source": "-", "method": "-"},
          "verify": {"M": [1, 1 << 30], "time_s": [1e-3, 1e-3]}, "fixed_overhead_s": 0.0,
          "drafters": {"dspark": {"kind": "parallel", "tokens": [1, 1 << 30], "time_s": [1e-4, 1e-4]},
                       "dflash": {"kind": "parallel", "tokens": [1, 1 << 30], "time_s": [1e-4, 1e-4]},
                       "eagle3": {"kind": "autoregressive", "tokens": [1, 1 << 30], "time_s": [1e-4, 1e-4]},
                       "mtp1": {"kind": "mtp", "tokens": [1, 1 << 30], "time_s": [1e-4, 1e-4]}}}


def _is_oom(e: BaseException) -> bool:
    return isinstance(e, getattr(torch, "OutOfMemoryError", ())) or "out of memory" in str(e).lower()


def slot_tokens(ctx: int, K: int, warmup: int, reps: int, nL: int | None = None,
                 spread: tuple[float, ...] | None = None) -> int:
    """KV positions one profiling request needs: its longest context + one token per step + the draft block."""
    nL = K + 1 if nL is None else nL
    top = (3 * ctx) // 2 if spread is None else int(np.ceil(ctx * max(spread) / np.mean(spread))) + 1
    return top + 2 + nL * (warmup + reps) + 6 + K + 2


def profiling_engine(exe: Any, *, n: int, ctx: int, out_len: int, T: int, K: int, drafter: str, policy: Policy,
                     acceptance: AcceptanceModel, profile: Any, max_batched_tokens: int, prefill_chunk_tokens: int,
                     live: bool, rng: np.random.Generator, spread: tuple[float, ...] | None = None) -> RealStepper:
    """One engine with n requests admitted and prefilled (untimed, :func:`_fast_prefill`) at contexts spread around
    ctx (:func:`cell_contexts`, with ``spread``), ready to be stepped on the executor's clock."""
    wl = Workload(prompt_tokens=np.full(n, ctx, np.int64), output_tokens=np.full(n, out_len, np.int64),
                  domain=np.full(n, "chat", dtype=object), concurrency=n)
    table = RequestTable(wl, n, None)
    table.load(n - 1)
    eng = Engine(table=table, profile=profile, acceptance=acceptance, policy=policy, K=K, drafter=drafter,
                 kv_capacity_tokens=n * T, max_num_seqs=n, max_batched_tokens=max_batched_tokens,
                 prefill_chunk_tokens=prefill_chunk_tokens, rng=rng)
    connect(eng, exe)
    for i in range(n):
        eng.enqueue(i)
    if len(eng.admit(0.0)) != n:
        raise RuntimeError(f"profiling engine admitted fewer than its {n} requests")
    _fast_prefill(eng, exe, n, ctx, spread)
    return RealStepper(eng, exe, live=live)


def cell_executor(target, proxy, ex: ExecutorConfig, T: int, slots: int, drafter: str,
                  live: "LiveDrafters | None" = None):
    """The executor a profiling cell runs on: the drafter proxy's (trace replay), or with ``live`` the trained
    drafter's live step with every block rejected after position 1 (the context grows one token per step)."""
    if live is None:
        return Executor(target, proxy, ex, T=T, slots=slots)
    from dsparksim.runner.live import LiveExecutor
    return LiveExecutor(target, live.drafters[drafter], drafter, live.temps[drafter], live.prompts, ex, T=T,
                        slots=slots, force_reject=True)


def _cell(target, proxy, ex: ExecutorConfig, K: int, drafter: str, n: int, ctx: int, Ls: list[int],
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
            plan, out, dt = st.begin()
            now += dt + st.end(plan, out, dt, now, now + dt)
            if s >= warmup:
                x = out.extra
                recs.append({"n": n, "L": L, "ctx": ctx, "M": int(plan.M), "kv": int(plan.kv_read),
                             "qk": int(plan.decode_qk),
                             "t_step": float(out.duration_s), "t_target": float(x["t_target"]),
                             "t_draft": float(x["t_draft"]), "t_host": float(x["t_host"])})
    return recs


REFERENCE_CELL = {"n_req": 4, "context": 64, "K": 3, "L": 3, "warmup": 2, "reps": 7}


def reference_probe(target, proxy, ex, drafter: str = "dspark") -> Callable[[], float]:
    """The drift reference cell (REFERENCE_CELL: 4 requests, context 64, every request verifying L=3 of K=3):
    returns a function timing it (median step seconds on the executor's clock). The same cell, whatever the
    command's K, so reference timings from `measure` and `validate` compare."""
    rc = REFERENCE_CELL

    def probe() -> float:
        recs = _cell(target, proxy, ex, rc["K"], drafter, rc["n_req"], rc["context"], [rc["L"]], rc["warmup"],
                     rc["reps"])
        return float(np.median([r["t_step"] for r in recs]))
    return probe


PREFILL_CHUNKS = (16, 32, 64, 128)
PREFILL_PREFIXES = (0, 512)         # tokens already cached before the chunk: its c*s query-key pairs
PREFIX_CAP = 8192                   # (n + 2) KV slots of this many tokens must fit beside the model (GPU: 8B bf16)


def prefill_prefixes(contexts) -> tuple[int, ...]:
    """Cached-prefix lengths of the prefill cells: 0 and the largest measured context (at least 512, at most
    PREFIX_CAP), so the query-key slope is fitted over the contexts the profile will price."""
    return (0, int(min(PREFIX_CAP, max(PREFILL_PREFIXES[1], max(contexts)))))
# decoding requests beside the chunks (the chunk cost's n-dependence). 0 = a prefill-only step, timed whole
# (prefill.only): before, a step with no decoding request was priced as the decode-fitted staircase at its M plus
# an extrapolation of the 1/4/16-request cells to n = 0, and at ~1k-token prompts (6-10 chunks per request) a
# single user's prefill-only steps were priced +17-18% (2026-12-02 c1k validations, runner.refit)
PREFILL_DECODE_ROWS = (0, 1, 4, 16)


def _prefill_cells(target, proxy, ex: ExecutorConfig, K: int, drafter: str, max_M: int, reps: int,
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
            exe.start(r, r, 32 if r < n else s + c, "chat")
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


def fit_prefill_only(recs: list[dict]) -> dict[str, Any] | None:
    """``prefill.only`` from the prefill-only cells (n_dec = 0): NNLS of their whole step time less the drafter's
    part on [1, prompt tokens, query-key pairs, chunks]. None without such cells or when the fit leaves no
    positive per-step part (a step is never free)."""
    rows = [r for r in recs if r.get("n_dec", 4) == 0]
    if len(rows) < 4:
        return None
    A = np.array([[1.0, r["tokens"], r["qk"], r["k"]] for r in rows])
    y = np.array([r["d_step"] - r["d_draft"] for r in rows])
    w = 1.0 / np.maximum(np.abs(y), 1e-9)            # relative errors, as the target fit
    x, _ = nnls(A * w[:, None], y * w)
    if not x[0] > 0:
        return None
    return {"seconds_per_step": float(x[0]), "seconds_per_token": float(x[1]),
            "seconds_per_query_key": float(x[2]), "seconds_per_chunk": float(x[3])}


def prefill_section(pfit: dict[str, Any], note: str) -> dict[str, Any]:
    """The profile's ``prefill`` object from a :func:`fit_prefill` result: the three base terms, the per-decode
    terms when > 0 (absent = 0) and ``only`` when fitted."""
    out = {k: pfit[k] for k in ("seconds_per_token", "seconds_per_query_key", "seconds_per_chunk")}
    out["note"] = note
    for k in ("seconds_per_token_per_decode", "seconds_per_chunk_per_decode"):
        if pfit[k] > 0:
            out[k] = pfit[k]
    if pfit.get("only") is not None:
        out["only"] = pfit["only"]
        out["note"] += ("; prefill-only steps: prefill.only, NNLS of the prefill-only cells' whole step time on "
                        "[1, tokens, query-key pairs, chunks]")
    return out


def fit_prefill(recs: list[dict], prof: dict, relative: bool = True) -> dict[str, Any]:
    """NNLS of what the chunks add to a step beyond the verify term's own growth (target + host) on prompt
    tokens, query-key pairs, chunks, and tokens and chunks times the decoding requests beside them (when the
    cells have more than one n); the drafter's part per prompt token (median). The prefill-only cells (n_dec = 0)
    are left to :func:`fit_prefill_only` when there are enough of them (a step with no decoding request is priced
    by ``prefill.only``, not by the verify term: the decode-shaped staircase at a chunk's M alone was 1.1-1.8x a
    measured prefill-only step here, which no non-negative prefill term can take back); ``"only"`` is that fit
    (None without it).

    ``relative`` (default): each cell weighted by 1 / its added time, i.e. least squares in relative error, as the
    target and prefill-only fits. In absolute seconds the few 2 x 128-token cells after a 512-token prefix ruled
    the fit and 16-32-token chunks (what short-prompt traffic schedules) were priced 15-50% low on this CPU
    (2026-12-02: the cells' mean bias +4.9% -> +1.5%). A cell's weight is capped at twice the median cell's, so one
    noisy cell timed at ~0 s cannot take the fit over."""
    only = fit_prefill_only(recs)
    if only is not None:
        recs = [r for r in recs if r.get("n_dec", 4) != 0]
    p = profile_from_dict(prof | {"name": "fit", "metadata": {k: "-" for k in ("device", "model", "source",
                                                                                  "method")}})
    tok = np.array([r["tokens"] for r in recs], float)
    qk = np.array([r["qk"] for r in recs], float)
    ch = np.array([r["k"] for r in recs], float)
    nd = np.array([r.get("n_dec", 4) for r in recs], float)
    # a prefill-only record (M0 = 0) is a whole step: its verify term is the staircase at the chunks' M
    dv = np.array([float(p.verify_time(r["M1"], r["kv1"]) - (p.verify_time(r["M0"], r["kv0"]) if r["M0"] else 0.0))
                   for r in recs])
    resid = np.array([r["d_step"] - r["d_draft"] for r in recs]) - dv
    cols = [tok, qk, ch] + ([tok * nd, ch * nd] if len(np.unique(nd)) > 1 else [])
    A = np.stack(cols, 1)
    if relative:
        # a noisy cell can time its chunks at ~0 s (or below): its weight is capped at 2x the median cell's
        d = np.abs(np.array([r["d_step"] for r in recs], float))
        w = 1.0 / np.maximum(d, 0.5 * max(float(np.median(d)), 1e-12))
        A, resid = A * w[:, None], resid * w
    x, _ = nnls(A, resid)
    a, b, e = x[:3]
    tn, cn = (x[3], x[4]) if len(x) > 3 else (0.0, 0.0)
    return {"seconds_per_token": float(a), "seconds_per_query_key": float(b), "seconds_per_chunk": float(e),
            "seconds_per_token_per_decode": float(tn), "seconds_per_chunk_per_decode": float(cn),
            "decode_rows": sorted({int(v) for v in nd}), "only": only,
            "drafter_s_per_token": float(max(0.0, np.median([r["d_draft"] / r["tokens"] for r in recs]))),
            "cells": len(recs)}


def _fast_prefill(eng: Engine, exe: Executor, n: int, ctx: int, spread: tuple[float, ...] | None = None) -> None:
    """Mark n admitted requests as prefilled with ctx tokens without running the prefill.

    Decode timing does not depend on the cached values, only on how many positions are read, so the KV slots
    are left as allocated; this makes long contexts (8k, 32k tokens) measurable without a quadratic prefill.
    """
    rows = np.arange(n)
    lens = cell_contexts(n, ctx, spread)
    eng.skip_prefill(rows, lens, 0.0)
    for r in rows:
        exe.cache_len[int(r)] = int(lens[r])
        exe.pending[int(r)] = int(exe.np_rng.integers(0, exe.V))
    if hasattr(exe, "dstate"):                 # live drafter: its per-slot state must point at the context too
        slots = torch.as_tensor(eng.req.slot_of[rows], device=exe.dev)
        exe.dstate.fake_prefill(slots, torch.as_tensor(lens, device=exe.dev),
                                torch.as_tensor([exe.pending[int(r)] for r in rows], device=exe.dev))


def cell_contexts(n: int, ctx: int, spread: tuple[float, ...] | None = None) -> np.ndarray:
    """Per-request contexts of a cell (mean ctx), in a fixed shuffled order: evenly spread over [ctx/2, 3ctx/2], or,
    with ``spread`` (sorted contexts relative to their mean, :func:`context_spread`), ctx times its quantiles at
    (i + 1/2)/n.

    A served batch is heterogeneous, and a batch's attention cost follows its longest contexts, not only their
    sum (the real runner pads each attention group to its longest context): a homogeneous profiling batch would
    under-price real batches with the same total KV tokens, and a batch spread less or more widely than the served
    ones mis-prices them by the difference in padding (2026-12-02: a 32-request step at mean context 88 cost 3-6%
    more spread over 16-160 than over 44-132).
    """
    if n == 1:
        return np.array([ctx], np.int64)
    if spread is None:
        lens = np.rint(np.linspace(0.5 * ctx, 1.5 * ctx, n)).astype(np.int64)
    else:
        q = np.asarray(spread, float) / float(np.mean(spread))
        lens = np.rint(ctx * np.interp((np.arange(n) + 0.5) / n, (np.arange(len(q)) + 0.5) / len(q), q)
                       ).astype(np.int64)
    lens += ctx - int(round(lens.mean()))
    return np.maximum(1, np.random.default_rng(n).permutation(lens))


SPREAD_POINTS = 33


def check_spread(spread, where: str) -> None:
    """A context spread is >= 2 finite positive relative contexts in non-decreasing order."""
    q = np.asarray(spread, float)
    if q.ndim != 1 or len(q) < 2 or not np.all(np.isfinite(q)) or q.min() <= 0 or np.any(np.diff(q) < 0):
        raise ConfigError(where, "context_spread", f"expected >= 2 positive relative contexts in non-decreasing "
                          f"order, got {list(spread)}")


def context_spread(prompt: np.ndarray, output: np.ndarray, points: int = SPREAD_POINTS) -> tuple[float, ...]:
    """The contexts a workload's decoding requests have, relative to their mean: ``points`` quantiles (at
    (j + 1/2)/points) of p + k over every request (p prompt tokens, o output tokens) and every k in [0, o), each
    decode position weighted once, as a served batch samples requests at every stage of their output."""
    p, o = np.asarray(prompt, np.int64), np.asarray(output, np.int64)
    if len(p) == 0 or len(p) != len(o) or p.min() < 1 or o.min() < 1:
        raise ConfigError("measure", "context_spread", "needs >= 1 request with prompt and output tokens >= 1")
    ctx = np.repeat(p, o) + (np.arange(int(o.sum())) - np.repeat(np.cumsum(o) - o, o))
    q = np.quantile(ctx, (np.arange(points) + 0.5) / points)
    return tuple(round(float(x), 4) for x in q / ctx.mean())


def context_spread_from_csv(path: str | Path, points: int = SPREAD_POINTS) -> tuple[float, ...]:
    """:func:`context_spread` of a length-only CSV (num_prefill_tokens/num_decode_tokens, as `dsparksim validate`
    writes lengths.csv), read and checked by the traffic readers (errors name file, line and column)."""
    from dsparksim.traffic.readers import read_lengths
    t = read_lengths(path)
    return context_spread(t.prompt_tokens, t.output_tokens, points)


def _release(ex: ExecutorConfig) -> None:
    """Free a finished cell's KV pools before the next cell allocates its own (matters on a GPU)."""
    if torch.device(ex.device).type == "cuda":
        import gc
        gc.collect()
        torch.cuda.empty_cache()


def _median_by(keys: np.ndarray, vals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-key medians. Medians of times throughout the fit (means of KV and query-key counts): a spike in one of
    a cell's few steps moves a mean by 10%, and validation takes each real step's median over repeated runs too."""
    u = np.unique(keys)
    return u, np.array([np.median(vals[keys == k]) for k in u])


def cell_table(r: dict[str, np.ndarray], time_key: str) -> dict[str, np.ndarray]:
    """One row per measured (n, L, context) cell: ``key`` (n, L, ctx), the median of ``time_key`` and the mean
    KV tokens read (and query-key pairs, when recorded) over the cell's timed steps."""
    uk, inv = np.unique(np.stack([r["n"], r["L"], r["ctx"]], 1), axis=0, return_inverse=True)
    inv = inv.ravel()
    cells = range(len(uk))
    out = {"key": uk, "t": np.array([np.median(r[time_key][inv == i]) for i in cells]),
           "kv": np.array([np.mean(r["kv"][inv == i]) for i in cells])}
    if "qk" in r:
        out["qk"] = np.array([np.mean(r["qk"][inv == i]) for i in cells])
    return out


def cell_medians(recs: list[dict], K: int) -> dict[str, Any]:
    """The profile's raw cell timings for ``metadata.cells`` (validate's paired cells, :mod:`.paired`): one row
    [n, ctx, L, median t_step (s), mean context per request] per measured cell (times as the fit saw them: at the
    baseline speed)."""
    if not recs:
        return {"K": K, "rows": []}
    c = cell_table({k: np.array([x[k] for x in recs], float) for k in ("n", "L", "ctx", "t_step", "kv")}, "t_step")
    return {"K": K, "rows": [[int(n), int(ctx), int(L), float(t), float(kv / n)]
                             for (n, L, ctx), t, kv in zip(c["key"], c["t"], c["kv"])]}


def prefill_cell_rows(recs: list[dict] | None) -> list[list[float]]:
    """The prefill-only cells for ``metadata.prefill_cells`` (validate pairs every real prefill-only step with the
    nearest one, :mod:`.paired`): one row [chunk, k, prefix, median step time (s), KV tokens read] per cell with no
    decoding request beside its chunks (times at the baseline speed, as the fit saw them)."""
    return [[int(r["chunk"]), int(r["k"]), int(r["prefix"]), float(r["d_step"]), float(r["kv1"])]
            for r in recs or [] if r.get("n_dec", 4) == 0]


def decompose_target(r: dict[str, np.ndarray], v0_at_shortest: bool = False
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray, float | None, float | None]:
    """Non-negative least squares t_target = V0(M) + b (n - n_min) + s * kv + q * qk over the cell medians (B(n) =
    b (n - n_min), one per-request slope), then V0 made non-decreasing in M (weighted isotonic regression).

    At one M the target forward still costs more with more requests (per-request attention/KV gathers): that
    per-request part is non-trimmable (it is paid whatever is verified), so it belongs in the floor B(n), and
    V0(M) is the marginal cost of the verified tokens. ``kv`` is the KV tokens read (sum of contexts: the KV
    gathers); ``qk`` (records with a ``qk`` field) the decoding rows' query-key pairs, sum of (1+L) c + L(L+1)/2:
    one request verifying L=7 reads its cache once but scores it 8 times, which a kv-only term prices as 8
    requests' reads would not. Rows are weighted by 1/t (relative errors). With ``v0_at_shortest`` (and two or more
    contexts), V0 at every M the shortest context measured is then what those cells leave after the fitted B, s
    and q terms (see the code comment; :func:`fit_profile` does not use it: no reliable gain measured).
    Returns (M breakpoints, V0, B per
    measured n, s or None when only one context was measured, q or None without qk records or one context).
    """
    c = cell_table(r, "t_target")
    uk, t, kv = c["key"], c["t"], c["kv"]
    n = uk[:, 0].astype(int)
    Mc = (uk[:, 0] * (1 + uk[:, 1])).astype(int)
    Ms, mi = np.unique(Mc, return_inverse=True)
    ns = np.unique(n)
    use_kv = len(np.unique(uk[:, 2])) >= 2
    use_qk = use_kv and "qk" in c and len(np.unique(uk[:, 1])) >= 2
    # columns: V0 per M | b * (n - n_min) | s * kv | q * qk. B(n) is one per-request slope: a free B per n
    # trades off against the free V0 per M (n and M are tied by M = n(1+L)) and zigzagged by +-0.5 ms between
    # neighbouring n on this machine's noise.
    A = np.zeros((len(uk), len(Ms) + 1 + int(use_kv) + int(use_qk)))
    A[np.arange(len(uk)), mi] = 1.0
    A[:, len(Ms)] = n - ns[0]
    if use_kv:
        A[:, len(Ms) + 1] = kv
    if use_qk:
        A[:, -1] = c["qk"]
    w = 1.0 / t
    # Non-negative least squares: every term is a cost (>= 0); unconstrained, background-load noise lets a
    # negative per-request term trade off against an inflated context slope.
    x, _ = nnls(A * w[:, None], t * w)
    V0 = x[: len(Ms)].copy()
    if use_kv and v0_at_shortest:
        # V0(M) is the forward's cost without context: at every M measured at the shortest context, it is what
        # those cells leave after the fitted per-request, KV and query-key terms. Shared with the long contexts
        # in the least squares, V0 also absorbed whatever a linear KV term misses there (attention that costs
        # more per KV token in large long-context batches); prefill chunks and short requests would pay it.
        short = uk[:, 2] == uk[:, 2].min()
        e = (t - A[:, len(Ms):] @ x[len(Ms):])[short]
        ms = mi[short]
        for j in np.unique(ms):
            V0[j] = max(0.0, float(np.median(e[ms == j])))
    # the verify staircase never falls with more tokens: a weighted isotonic fit over M (weights = cells per M)
    # keeps its steps and removes the dips that noise puts between them
    V = isotonic_regression(V0, weights=np.bincount(mi).astype(float)).x
    B = x[len(Ms)] * (ns - ns[0]).astype(float)
    s = float(x[len(Ms) + 1]) if use_kv else None
    q = float(x[-1]) if use_qk else None
    return Ms, V, B, s, q


BLOCK_TIMES = ("t_step", "t_target", "t_draft", "t_host")
PREFILL_TIMES = ("d_step", "d_target", "d_draft")


def normalise_records(recs: list[dict] | None, b: Bracket | None, keys=BLOCK_TIMES,
                      factor: float | None = None) -> list[dict] | None:
    """Cell records with their times brought to the baseline speed (divided by the bracket's factor); the
    factor and drift are kept on every record."""
    if recs is None or b is None:
        return recs
    f = b.factor if factor is None else float(factor)
    return [{**r, **{k: r[k] / f for k in keys}, "speed_factor": f, "drift": b.drift} for r in recs]


def per_request_cost(n: np.ndarray, t: np.ndarray) -> dict[str, float]:
    """Least-squares line t = intercept + per_request * n over per-n medians (a diagnostic of the per-n tables:
    what one more request costs in the drafter or the host loop)."""
    A = np.stack([np.ones(len(n)), np.asarray(n, float)], 1)
    (c0, c1), *_ = np.linalg.lstsq(A, np.asarray(t, float), rcond=None)
    return {"intercept_s": float(c0), "per_request_s": float(c1)}


def context_shape(r: dict[str, np.ndarray], M: np.ndarray, V: np.ndarray, ns: np.ndarray,
                  B: np.ndarray, q: float | None = None) -> dict[str, Any]:
    """The context term's shape: at each measured context, the least-squares seconds per KV token of what the
    target forward costs beyond V0(M) + B(n). A linear (kv_bandwidth) term is right when these agree; a slope
    that grows with the context says attention costs more than linearly (or a 2-D table is needed)."""
    ct = cell_table(r, "t_target")
    uk, t, kv = ct["key"], ct["t"], ct["kv"]
    Mc = (uk[:, 0] * (1 + uk[:, 1])).astype(int)
    e = t - V[np.searchsorted(M, Mc)] - B[np.searchsorted(ns, uk[:, 0].astype(int))]
    if q:
        e = e - q * ct["qk"]
    out = {}
    for c in np.unique(uk[:, 2]):
        m = uk[:, 2] == c
        out[str(int(c))] = float((e[m] * kv[m]).sum() / (kv[m] ** 2).sum()) if (kv[m] > 0).any() else float("nan")
    vals = np.array([v for v in out.values() if np.isfinite(v)])
    return {"s_per_kv_token_by_context": out,
            "max_over_min": float(vals.max() / vals.min()) if len(vals) > 1 and vals.min() > 0 else None}


def fit_drafter_context(r: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, float | None, str]:
    """Least squares t_draft = D(n) + s * kv over the cell medians (one intercept per n, rows weighted by 1/t).

    Returns (ns, D per n, s or None, note). s is None with one context (nothing to fit); a negative s is clipped
    to 0 and then D(n) is the plain median per n, as without the term; so is a fit that would leave some
    D(n) <= 0 (the slope would claim more than the whole drafter time), with the note saying so.
    """
    c = cell_table(r, "t_draft")
    uk, t, kv = c["key"], c["t"], c["kv"]
    ns, D0 = _median_by(r["n"].astype(int), r["t_draft"])
    if len(np.unique(uk[:, 2])) < 2:
        return ns, D0, None, "one context measured: no drafter context term"
    ni = np.searchsorted(ns, uk[:, 0].astype(int))
    A = np.zeros((len(uk), len(ns) + 1))
    A[np.arange(len(uk)), ni] = 1.0
    A[:, -1] = kv
    w = 1.0 / t
    x, *_ = np.linalg.lstsq(A * w[:, None], t * w, rcond=None)
    s, D = float(x[-1]), x[:-1]
    if s < 0:
        return ns, D0, 0.0, (f"fitted drafter slope {s:.3g} s per KV token is negative (noise: the drafter does not "
                             "get cheaper with context); clipped to 0, no term written")
    if s * kv.max() < 1e-9 * t.max():      # a float-noise slope (exact data): nothing measurable to write
        return ns, D0, 0.0, f"fitted drafter slope {s:.3g} s per KV token is below resolution; no term written"
    if not (D > 0).all():
        return ns, D0, 0.0, (f"fitted drafter slope {s:.3g} s per KV token leaves a non-positive drafter time at "
                             f"n={int(ns[np.argmin(D)])}; not used, no term written")
    return ns, D, s, "least squares of drafter time on D(n) + s*kv_tokens over the cell medians"


def fit_profile(recs: list[dict], mtp_recs: list[dict], mc: MeasureConfig,
                v0_at_shortest: bool = False) -> dict[str, Any]:
    """Separate the floor from the verify term (see module doc). Raises MeasurementError if flat or inert.
    ``v0_at_shortest``: see :func:`decompose_target` (off in `measure`; :mod:`.refit` compares it)."""
    if not recs:
        raise MeasurementError("measure", "cells", "no cell was measured (all failed?)")
    r = {k: np.array([x[k] for x in recs], dtype=float) for k in recs[0]}
    for k in ("t_step", "t_target", "t_draft"):
        if not (np.isfinite(r[k]).all() and (r[k] > 0).all()):
            raise MeasurementError("measure", k, "inert measurement: non-positive or non-finite timings "
                                   f"(min {np.nanmin(r[k])}); the timer or the forward did nothing")
    # V0 fitted jointly over all contexts (anchor included). Taking it from the anchor cells alone
    # (v0_at_shortest) was refitted on the same cells and real steps of three long-context validations on
    # 2026-12-02: priced-over-measured bias +3.5 -> -0.3%, +6.1 -> +4.3%, -3.6 -> -8.1% (~1k, ~1k, ~4k): no
    # reliable gain, so not used (validation/README.md); measuring the anchor at all: +1.5/+22.2/+10.0% without it
    M, V, Bn, s, q = decompose_target(r, v0_at_shortest=v0_at_shortest)
    if not (np.isfinite(V).all() and (V > 0).all()):
        raise MeasurementError("measure", "verify.time_s", f"inert: a verify time is non-positive after separating "
                               f"the per-request and context terms ({V.min():.3g} s at M={int(M[np.argmin(V)])})")
    growth = float(np.median(V[-max(1, len(V) // 8):]) / np.median(V[: max(1, len(V) // 8)]))
    if growth < mc.min_growth:
        raise MeasurementError("measure", "verify", f"flat result: the target forward at M={int(M[-1])} is only "
                               f"{growth:.3f}x the time at M={int(M[0])} (need >= {mc.min_growth}); the step is "
                               "dominated by overhead/noise, so no verify term can be separated. Measure larger M "
                               "or a larger model, or reduce background load"
                               + (f". With only {len(mc.n_reqs)} batch sizes ({list(mc.n_reqs)}) every M above "
                                  f"{mc.K + 1} comes from the largest alone and the per-request term can absorb "
                                  "all of the growth: add intermediate --n-req values (e.g. 1,2,4,8)"
                                  if len(mc.n_reqs) < 4 else ""))
    ns, D, s_draft, draft_note = fit_drafter_context(r)
    _, H = _median_by(r["n"].astype(int), r["t_host"])
    H = H + Bn                      # the target forward's per-request term joins the floor
    fixed = float(H.min())
    what = (f"the trained {mc.block_drafter} drafter from {mc.live_models} (propose + state update)"
            if mc.live_models is not None else "random-weight drafter proxy, one forward over n*K tokens (no Markov head)")
    kind = "autoregressive" if mc.block_drafter == "eagle3" else "parallel"
    # an autoregressive drafter is priced per sequential step (K forwards over n tokens)
    drafters = {mc.block_drafter: {"kind": kind, "tokens": [int(n * mc.K) if kind == "parallel" else int(n)
                                                           for n in ns],
                                   "time_s": [float(x) / (mc.K if kind != "parallel" else 1) for x in D],
                                   "note": f"measured: {what}"}}
    if kind == "parallel":
        drafters[mc.block_drafter]["markov_overhead_frac"] = 0.0
    if s_draft:                     # written only when > 0 (absent = 0); once per step, not per sequential forward
        drafters[mc.block_drafter]["seconds_per_kv_token"] = s_draft
    if mtp_recs:
        m = {k: np.array([x[k] for x in mtp_recs], dtype=float) for k in mtp_recs[0]}
        mn, mD, s_mtp, mtp_note = fit_drafter_context(m)
        drafters["mtp1"] = {"kind": "mtp", "tokens": [int(x) for x in mn], "time_s": [float(x) for x in mD],
                            "note": "measured: " + (f"the trained mtp1 drafter from {mc.live_models}"
                                                    if mc.live_models is not None else
                                                    "drafter proxy, one forward over n tokens")}
        if s_mtp:
            drafters["mtp1"]["seconds_per_kv_token"] = s_mtp
    prof: dict[str, Any] = {
        "format": FORMAT,
        "verify": {"M": [int(x) for x in M], "time_s": [float(x) for x in V]},
        "fixed_overhead_s": fixed,
        "batch_overhead": {"n_req": [int(x) for x in ns], "time_s": [float(max(0.0, h - fixed)) for h in H]},
        "drafters": drafters,
    }
    if s is not None:
        prof["attention"] = {"model": "kv_bandwidth", "seconds_per_kv_token": s,
                             "note": "fitted: non-negative least squares of target-forward time on V0(M) + B(n) + "
                                     "s*kv_tokens" + (" + q*query_key_pairs" if q is not None else "")
                                     + f" over cells at contexts {sorted({int(c) for c in r['ctx']})}"}
        if q:                        # written only when > 0 (absent = 0)
            prof["attention"]["seconds_per_query_kv"] = q
    _, H_raw = _median_by(r["n"].astype(int), r["t_host"])
    prof["_fit"] = {"verify_growth": growth, "seconds_per_kv_token": s, "seconds_per_query_kv": q,
                    "drafter_per_request": per_request_cost(ns, D),
                    "drafter_context": {"seconds_per_kv_token": s_draft, "note": draft_note},
                    "mtp1_context": ({"seconds_per_kv_token": s_mtp, "note": mtp_note} if mtp_recs else None),
                    "host_per_request": per_request_cost(ns, H_raw),
                    "context_shape": context_shape(r, M, V, ns, Bn, q) if s is not None else None,
                    "target_per_request_s_by_n": [float(x) for x in Bn], "floor_s_by_n": [float(x) for x in H]}
    return prof


def measure(mc: MeasureConfig, progress: bool = True, log: Callable[[str], None] = print,
            target=None, proxy=None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run the sweep; returns (profile dict validated by the core loader, raw records)."""
    ex = mc.executor
    mcfg, tmodel, ck = load_target(mc.model, ex.device, ex.dtype)
    if target is None or proxy is None:
        target, proxy = build_models(mcfg, ex, tmodel)
    contexts = mc.grid_contexts
    if contexts != tuple(mc.contexts):
        log(f"measure: also measuring context {contexts[0]} (anchor: the verify staircase V0(M) is the forward's cost "
            "without context, which prefill chunks and short requests pay; measured, not extrapolated to it)")
    cells = [(c, n) for c in contexts for n in mc.n_reqs]
    # Shuffled (fixed seed) so a drift in background load does not line up with the n or context axis.
    cells = [cells[i] for i in np.random.default_rng(ex.seed).permutation(len(cells))]
    bits = torch_dtype(ex.dtype).itemsize * 8
    wbytes = sum(p.numel() * p.element_size() for p in target.parameters())
    cap = kv_capacity_tokens(mcfg, ex.device, bits, wbytes)
    for c in contexts:
        # a context no cell of which fits is refused before anything is timed, never written as measured
        need = min(mc.n_reqs) * slot_tokens(c, mc.K, mc.warmup, mc.reps, spread=mc.context_spread)
        if need > cap:
            raise ConfigError("measure", "--contexts", f"context {c}: even {min(mc.n_reqs)} request(s) need {need} "
                              f"KV tokens and {ex.device} holds about {cap} for this model; measure shorter contexts")
    failed: list[dict] = []
    mtp: list[dict] = []
    t_start = time.time()
    try:
        from tqdm import tqdm
        bar = tqdm(total=len(cells) * (2 if mc.mtp1 else 1), desc="measure", disable=not progress)
    except ImportError:  # pragma: no cover
        bar = None
    Ls = list(range(mc.K + 1))
    live = None
    if mc.live_models is not None:
        live = LiveDrafters.load(mc.live_models, [mc.block_drafter] + (["mtp1"] if mc.mtp1 else []), target)
        log(f"measure: live-drafter steps with the trained {mc.block_drafter}"
            + (" and mtp1" if mc.mtp1 else "") + f" from {mc.live_models}")
    # interleaved reference timings: every cell is brought to the speed of the first one (the baseline that
    # validate normalises real runs to) and re-measured while the machine drifts past the threshold
    mon = (DriftMonitor(reference_probe(target, proxy, ex), threshold=mc.drift_threshold, gate=mc.drift_gate)
           if mc.drift else None)
    if mon is not None:
        mon.probe()                    # untimed: the first forward of a process pays one-off allocation costs
        mon.calibrate("before the cells", probes=CALIBRATION_PROBES)

    def timed(fn, label):
        if mon is None:
            return fn(), None
        out, b, kept = mon.measure(fn, label, attempts=mc.drift_attempts)
        if not kept:
            log(f"measure: {label} drifted {100 * b.drift:.1f}% (threshold {100 * mc.drift_threshold:.0f}%) or ran "
                f"outside the fast state (reference x{b.before / b.baseline:.2f}/x{b.after / b.baseline:.2f} of the "
                f"baseline) on all {mc.drift_attempts} attempts; kept the last, normalised")
        return out, b

    def sweep(K: int, drafter: str, Lv: list[int], label: str) -> list[dict]:
        """Every (context, n) cell of one drafter, normalised to the baseline speed; a cell that cannot fit or
        runs out of memory is recorded under failed_cells, never measured."""
        out = []
        for c, n in cells:
            need = n * slot_tokens(c, K, mc.warmup, mc.reps, spread=mc.context_spread)
            if need > cap:
                failed.append({"context": c, "n_req": n, "K": K, "error": f"skipped: needs {need} KV tokens, the "
                               f"device holds about {cap}"})
            else:
                try:
                    cr, b = timed(lambda: _cell(target, proxy, ex, K, drafter, n, c, Lv, mc.warmup, mc.reps, live,
                                                mc.context_spread),
                                  f"{label}ctx={c} n={n}")
                    out += normalise_records(cr, b, factor=mon.speed(b) if b is not None else None)
                except Exception as e:  # noqa: BLE001 - OOM is recorded per cell; anything else is a bug
                    if not _is_oom(e):
                        raise
                    failed.append({"context": c, "n_req": n, "K": K, "error": f"out of memory: {str(e)[:200]}"})
                    log(f"measure: {label}ctx={c} n={n} ran out of memory; recorded as failed, not measured")
                    if torch.cuda.is_available():
                        torch.cuda.empty_cache()
                _release(ex)
            if bar:
                bar.update()
        return out

    recs = sweep(mc.K, mc.block_drafter, Ls, "cell ")
    if mc.mtp1:
        # every context, as the block drafter: mtp1's own attention over the context is a per-step term too
        # (measured at one context only, mtp1 at ~1k contexts was priced 19% under)
        mtp = sweep(1, "mtp1", [0, 1], "mtp1 cell ")
    if bar:
        bar.close()
    lost = sorted(set(contexts) - {int(r["ctx"]) for r in recs})
    if lost:
        # every cell at these contexts ran out of memory: a profile claiming them would price what was never timed
        raise ConfigError("measure", "--contexts", f"no cell at context(s) {lost} could be measured ("
                          + "; ".join(f["error"][:80] for f in failed[:3]) + "); nothing written: measure shorter "
                          "contexts or fewer requests")
    prof = fit_profile(recs, mtp, mc)
    fit = prof.pop("_fit")
    if fit["drafter_context"]["seconds_per_kv_token"] == 0.0:     # clipped or refused: say so, never silently
        log(f"measure: drafter context term: {fit['drafter_context']['note']}")
    if fit["mtp1_context"] and fit["mtp1_context"]["seconds_per_kv_token"] == 0.0:
        log(f"measure: mtp1 context term: {fit['mtp1_context']['note']}")
    pm = None
    if mc.prefill:
        # paired steps: what prompt chunks add to a step beyond the decode-shaped verify term
        try:
            pf, b = timed(lambda: _prefill_cells(target, proxy, ex, mc.K, mc.block_drafter, prof["verify"]["M"][-1],
                                                 mc.reps, live, prefill_prefixes(contexts)), "prefill cells")
            pf = normalise_records(pf, b, PREFILL_TIMES, factor=mon.speed(b) if b is not None else None)
        except Exception as e:  # noqa: BLE001 - OOM: no prefill term (reported), never a partial one
            if not _is_oom(e):
                raise
            failed.append({"cell": "prefill", "error": f"out of memory: {str(e)[:200]}"})
            log("measure: the prefill cells ran out of memory; the profile gets no prefill term")
            pf = None
    if mc.prefill and pf is None:
        fit["prefill"] = {"skipped": "out of memory"}
    elif mc.prefill and not pf:
        log(f"measure: no prefill term: even 4 decoding requests plus one {PREFILL_CHUNKS[0]}-token chunk exceed "
            f"the largest measured M={prof['verify']['M'][-1]}")
        fit["prefill"] = {"skipped": "largest measured M too small for a paired prefill cell"}
    elif mc.prefill:
        pfit = fit_prefill(pf, prof)
        prof["prefill"] = prefill_section(
            pfit, f"fitted: NNLS over {pfit['cells']} paired steps ({pfit['decode_rows']} decoding requests "
                  f"without / with 1-2 prompt chunks of {list(PREFILL_CHUNKS)} tokens after "
                  f"{list(prefill_prefixes(contexts))} cached prompt tokens) of the added step time beyond the verify "
                  "term's growth")
        if live is not None:
            prof["drafters"][mc.block_drafter]["prefill_s_per_token"] = pfit["drafter_s_per_token"]
            if "mtp1" in prof["drafters"] and mc.mtp1:
                pm = _prefill_cells(target, proxy, ex, 1, "mtp1", prof["verify"]["M"][-1], mc.reps, live,
                                    prefill_prefixes(contexts))
                prof["drafters"]["mtp1"]["prefill_s_per_token"] = fit_prefill(pm, prof)["drafter_s_per_token"]
        fit["prefill"] = pfit
    mkey = model_key(mcfg, ck, ex.drafter_layers, ex.dtype, live=mc.live_models is not None)
    dkey = device_key(ex.device, ex.threads, ex.clock_name())
    dev = torch.device(ex.device)
    name = mc.name or f"{'cuda' if dev.type == 'cuda' else 'cpu'}-{mc.model.split(',')[0].replace(':', '-')}"
    prof["name"] = name
    prof["metadata"] = {
        "device": dkey, "model": mkey, "runner_device": dkey, "runner_model": mkey,
        "source": "measured by `dsparksim measure` on the real engine (dsparksim.runner)",
        "method": "n_req x uniform verify length L=0..K x context sweep (a cell's contexts spread over "
                  + ("[c/2, 3c/2], mean c" if mc.context_spread is None else
                     "c x the quantiles of grid.context_spread, mean c")
                  + "); verify lengths interleaved step by step, warm-up rounds discarded, median of timed "
                  "steps; target forward = V0(M) + B(n) + s*kv + q*qk by non-negative least squares over the "
                  "cell medians (V0: verify staircase, made non-decreasing; B(n) = b*(n - n_min): per-request "
                  "part, moved into the floor); drafter forward and host time (incl. a representative "
                  "Algorithm-1 ranking) per n_req; floor = fixed_overhead_s + batch_overhead(n)",
        "dtype": ex.dtype, "tensor_parallel": 1,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "kv_capacity_tokens": cap,
        "torch": torch.__version__, "python": platform.python_version(), "host": platform.node(),
        "target_config": asdict(mcfg), "checkpoint": ck, "drafter_proxy_layers": ex.drafter_layers,
        "drafting": f"live:{mc.live_models}" if mc.live_models is not None else "proxy",
        "grid": {"K": mc.K, "n_req": list(mc.n_reqs), "L": Ls, "contexts": list(contexts),
                 "requested_contexts": list(mc.contexts), "warmup": mc.warmup,
                 "reps": mc.reps,
                 "context_spread": None if mc.context_spread is None else list(mc.context_spread)},
        "fit": fit, "failed_cells": failed, "wall_s": round(time.time() - t_start, 1),
    }
    # the raw cell medians: validate re-times these very cells beside every real step (runner.paired); a live
    # profile's cells are live steps, re-timed as such beside live runs
    prof["metadata"]["cells"] = {mc.block_drafter: cell_medians(recs, mc.K)}
    if mtp:
        prof["metadata"]["cells"]["mtp1"] = cell_medians(mtp, 1)
    pc = prefill_cell_rows(pf if mc.prefill else None)
    if pc:
        # a prefill-only step of the drafter proxy runs no drafter, so its cells serve every drafter; a live
        # step updates the drafter's state over the prompt, so mtp1 has its own (measured with mtp1's state)
        prof["metadata"]["prefill_cells"] = {mc.block_drafter: {"rows": pc}}
        if mtp:
            rows = pc if live is None else prefill_cell_rows(pm)
            if rows:
                prof["metadata"]["prefill_cells"]["mtp1"] = {"rows": rows}
    if mon is not None:
        prof["metadata"]["drift"] = {**mon.summary(), "reference_cell": dict(REFERENCE_CELL),
                                     "note": "every cell started in the machine's fast state (reference within the "
                                             "gate of the baseline, the lower quartile of the calibration probes), "
                                             "timed between two reference-cell timings and divided by their mean "
                                             "over the baseline; cells whose reference moved more than the threshold "
                                             "or left the fast state re-measured"}
    profile_from_dict(prof, source=f"measured:{name}")  # refuse to hand back anything the core cannot load
    return prof, {"block": recs, "mtp1": mtp, "prefill": pf if mc.prefill else None}
