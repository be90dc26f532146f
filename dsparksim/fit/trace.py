"""One simulated benchmark run with the step log needed to re-price it (the fit's adapter to the client).

A closed-loop, non-speculative, ``ignore_eos`` run has step shapes that do not depend on step prices: admission,
chunking and finishing are token-based, and the client sends its next request at the end of the step that
finished one. Such a run is simulated ONCE by the benchmark client (:func:`dsparksim.bench.client.run_client`,
warm-up included) and re-priced for any cost parameters by :mod:`dsparksim.fit.reprice`. Requests are indexed by
steps: ``arrival_step`` is the step at whose end the request was sent (-1 = at t = 0), ``first_token_step`` and
``finish_step`` the steps that emitted its first and last token; ``start_step`` ends the warm-up (the benchmark's
clock starts at its end; -1 = no warm-up).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from dsparksim.errors import ConfigError
from dsparksim.bench.client import ClientWorkload, run_client, ServerSettings
from dsparksim.sim.scheduler import PRICE_KEYS

__all__ = ["ClientSpec", "Trace", "simulate_trace", "PRICE_COLUMNS"]

PRICE_COLUMNS = PRICE_KEYS     # step-log columns a step's price is a function of (with the profile)


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
    num_warmup_prompts: int = 0
    mem_fraction_static: float | None = None     # the server's memory fraction (None: the profile's KV capacity)
    mixed_prefill: bool = True                   # prefill chunks share a step with decode (False: SGLang's default)
    batch_wait_timeout_iters: int | None = None  # TensorRT-LLM's batch waiting, both or neither (sim/batch_wait.py)
    batch_wait_max_tokens_ratio: float | None = None

    def __post_init__(self) -> None:
        for k in ("concurrency", "num_prompts", "input_len", "output_len", "gpus", "max_num_seqs",
                  "prefill_chunk_tokens"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ConfigError("ClientSpec", k, f"expected an integer >= 1, got {v!r}")
        if isinstance(self.num_warmup_prompts, bool) or self.num_warmup_prompts < 0:
            raise ConfigError("ClientSpec", "num_warmup_prompts", f"expected an integer >= 0, got "
                              f"{self.num_warmup_prompts!r}")
        if not 0 <= self.range_ratio <= 1:   # 0: lengths uniform in [1, L] (SGLang's default)
            raise ConfigError("ClientSpec", "range_ratio", f"expected a fraction in [0, 1], got {self.range_ratio!r}")


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
    start_step: int = -1
    request_latency_s: float = 0.0     # the profile's, as the client added it (outside the step log)

    @property
    def n_steps(self) -> int:
        return int(len(self.steps["M"]))


def simulate_trace(profile: Any, spec: ClientSpec, policy: str = "none", block_size: int | None = None,
                   acceptance: str | None = None, drafter: str | None = None) -> Trace:
    """Simulate one benchmark run on ``profile`` (a CostProfile) with the benchmark client; keep what re-pricing
    needs. A run with refused requests is an error (the fit compares completed runs)."""

    wl = ClientWorkload(random_input_len=int(spec.input_len), random_output_len=int(spec.output_len),
                        random_range_ratio=float(spec.range_ratio), num_prompts=int(spec.num_prompts),
                        max_concurrency=int(spec.concurrency), request_rate=math.inf,
                        num_warmup_prompts=int(spec.num_warmup_prompts))
    srv = ServerSettings(chunked_prefill_size=int(spec.prefill_chunk_tokens),
                         max_running_requests=int(spec.max_num_seqs), mem_fraction_static=spec.mem_fraction_static,
                         gpus=int(spec.gpus), mixed_chunk=bool(spec.mixed_prefill),
                         batch_wait_timeout_iters=spec.batch_wait_timeout_iters,
                         batch_wait_max_tokens_ratio=spec.batch_wait_max_tokens_ratio)
    run = run_client(profile, wl, srv, policy=policy, block_size=block_size, acceptance=acceptance,
                     drafter=drafter, seed=int(spec.seed))
    rq, st = run.requests, run.steps
    if bool(np.asarray(rq["failed"]).any()):
        raise ConfigError("profile", "kv_capacity_tokens", f"{int(np.asarray(rq['failed']).sum())} of the run's "
                          f"requests were refused by the simulated server ({spec.input_len}/{spec.output_len} at "
                          f"concurrency {spec.concurrency}): the profile's KV capacity or max_model_len is too small")
    steps = {k: np.asarray(st[k], np.int64) for k in PRICE_COLUMNS}
    steps["dt"] = np.asarray(st["dt"], float)
    steps["t_start"] = np.asarray(st["t_start"], float)
    n_warm = int(np.asarray(st["warmup"], bool).sum()) if "warmup" in st else 0
    return Trace(spec=spec, steps=steps, arrival_step=np.asarray(rq["arrival_step"], np.int64),
                 first_token_step=np.asarray(rq["first_token_step"], np.int64),
                 finish_step=np.asarray(rq["finish_step"], np.int64),
                 output_len=np.asarray(rq["output_len"], np.int64), prompt_len=np.asarray(rq["prompt_len"], np.int64),
                 policy=policy, start_step=n_warm - 1,
                 request_latency_s=float(run.notes.get("request_latency_s", 0.0)))
