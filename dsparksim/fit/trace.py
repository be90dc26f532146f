"""One simulated benchmark run with the step log needed to re-price it (the fit's adapter to the simulator).

A closed-loop, non-speculative, ``ignore_eos`` run has step shapes that do not depend on step prices: admission,
chunking and finishing are token-based, and a user sends its next request at the end of the step that finished
its last one. Such a run is simulated ONCE (:func:`simulate_trace`) and re-priced for any cost parameters by
:mod:`dsparksim.fit.reprice`. Requests are indexed by steps: ``arrival_step`` is the step at whose end the request
arrived (-1 = at t = 0), ``first_token_step`` and ``finish_step`` the steps that emitted its first and last token.

This module drives :class:`~dsparksim.sim.cluster.Simulation` directly, with the benchmark client's workload as
``sglang.bench_serving`` / ``vllm bench serve`` draw it (random lengths uniform in [int(R*L), L], all prompts
released at once, at most ``concurrency`` in flight). It is the swap point for the benchmark client
(``dsparksim.bench.client``) once that lands.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from dsparksim.errors import ConfigError
from dsparksim.sim.engine import CostExecutor, StepOutcome, StepPlan

__all__ = ["ClientSpec", "Trace", "simulate_trace", "client_workload", "PRICE_COLUMNS"]

# step-log columns a step's price is a function of (with the profile): the trace keeps exactly these
PRICE_COLUMNS = ("M", "n_decode", "kv_read", "n_prefill_tokens", "prefill_qk", "prefill_chunks", "decode_qk")


@dataclass(frozen=True)
class ClientSpec:
    """The benchmark client's workload and the server settings that shape the steps of one run."""

    concurrency: int
    num_prompts: int
    input_len: int
    output_len: int
    range_ratio: float = 1.0
    gpus: int = 1
    max_num_seqs: int = 1024
    prefill_chunk_tokens: int = 16384
    seed: int = 0

    def __post_init__(self) -> None:
        for k in ("concurrency", "num_prompts", "input_len", "output_len", "gpus", "max_num_seqs",
                  "prefill_chunk_tokens"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ConfigError("ClientSpec", k, f"expected an integer >= 1, got {v!r}")
        if not 0 < self.range_ratio <= 1:
            raise ConfigError("ClientSpec", "range_ratio", f"expected a fraction in (0, 1], got {self.range_ratio!r}")


@dataclass
class Trace:
    """Step log (``steps``: PRICE_COLUMNS + ``dt``, one row per step) and per-request step indices of one run."""

    spec: ClientSpec
    steps: dict[str, np.ndarray]
    arrival_step: np.ndarray
    first_token_step: np.ndarray
    finish_step: np.ndarray
    output_len: np.ndarray
    prompt_len: np.ndarray
    policy: str = "none"

    @property
    def n_steps(self) -> int:
        return int(len(self.steps["M"]))


def client_workload(spec: ClientSpec) -> Any:
    """The client's requests: lengths uniform in [max(int(R*L), 1), L] (sglang.bench_serving's draw), closed loop."""
    from dsparksim.traffic.base import Workload
    rng = np.random.default_rng(np.random.SeedSequence([int(spec.seed), 30]))

    def draw(L: int) -> np.ndarray:
        return rng.integers(max(int(L * spec.range_ratio), 1), L + 1, size=spec.num_prompts).astype(np.int64)
    p, o = draw(spec.input_len), draw(spec.output_len)
    return Workload(prompt_tokens=p, output_tokens=o, domain=np.full(spec.num_prompts, "chat", dtype=object),
                    concurrency=int(spec.concurrency),
                    metadata={"source": "benchmark client (random dataset)", "input_len": spec.input_len,
                              "output_len": spec.output_len, "range_ratio": spec.range_ratio})


class _RecordingExecutor(CostExecutor):
    """The simulator's executor, also logging the plan's query-key and chunk counts (absent from older logs)."""

    def execute(self, plan: StepPlan) -> StepOutcome:
        out = super().execute(plan)
        out.extra.update({"_fit_prefill_qk": plan.prefill_qk, "_fit_prefill_chunks": len(plan.prefill),
                          "_fit_decode_qk": plan.decode_qk})
        return out


def simulate_trace(profile: Any, spec: ClientSpec, policy: str = "none", acceptance: str = "dspark") -> Trace:
    """Simulate one benchmark run on ``profile`` (a CostProfile) and keep what re-pricing needs."""
    from dsparksim.config import EngineConfig, RunConfig
    from dsparksim.sim.cluster import Simulation
    from dsparksim.sim.inputs import resolve_inputs
    from dsparksim.sim.simulate import _streams

    cfg = RunConfig(policy=policy, profile=str(profile.source), acceptance=acceptance, seed=spec.seed,
                    engine=EngineConfig(max_num_seqs=int(spec.max_num_seqs), kv_policy="paged",
                                        prefill_chunk_tokens=int(spec.prefill_chunk_tokens)))
    ri = resolve_inputs(cfg, profile=profile)
    rngs = _streams(spec.seed)
    ri.policy.reset(ri.K, rngs["policy"])
    wl = client_workload(spec)
    sim = Simulation(profile=profile, acceptance=ri.acceptance, policy=ri.policy, workload=wl, block_size=ri.K,
                     drafter=ri.drafter, kv_capacity_tokens=int(ri.kv_cap), max_num_seqs=int(spec.max_num_seqs),
                     max_batched_tokens=int(ri.max_tokens), prefill_chunk_tokens=int(spec.prefill_chunk_tokens),
                     streams=rngs["acceptance"], num_requests=int(spec.num_prompts),
                     max_model_len=ri.max_model_len, kv_policy="paged")
    sim.executor = _RecordingExecutor()
    res = sim.run()
    s = res.steps
    steps = {k: np.asarray(s[k] if k in s else s["_fit_" + k], np.int64) for k in PRICE_COLUMNS}
    steps["dt"] = np.asarray(s["dt"], float)
    steps["t_start"] = np.asarray(s["t_start"], float)
    t_end = steps["t_start"] + steps["dt"]

    def step_of(t: np.ndarray) -> np.ndarray:
        t = np.asarray(t, float)
        i = np.searchsorted(t_end, t)
        i = np.minimum(i, len(t_end) - 1)
        hit = t_end[i] == t
        out = np.where(hit, i, -1)
        if not np.all(hit | (t == 0.0)):
            raise RuntimeError("a request time is not a step end (the trace is not a closed-loop step log)")
        return out.astype(np.int64)
    if int((res.finish_s >= 0).sum()) != spec.num_prompts and not np.all(np.isfinite(res.finish_s)):
        raise RuntimeError("not every request finished")
    return Trace(spec=spec, steps=steps, arrival_step=step_of(res.arrival_s),
                 first_token_step=step_of(res.first_token_s), finish_step=step_of(res.finish_s),
                 output_len=np.asarray(res.output_tokens, np.int64), prompt_len=np.asarray(res.prompt_tokens, np.int64),
                 policy=policy)
