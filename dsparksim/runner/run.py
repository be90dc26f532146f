"""A real run of one configuration: the same RunConfig, workload, policy and acceptance as ``simulate``, served
by :class:`RealEngine`; returns the simulator's :class:`RunOutput`, so ``write_run``, the frontier table and the
plots work unchanged."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..acceptance import load_acceptance
from ..config import RunConfig
from ..errors import ConfigError
from ..metrics import summarize
from ..policies import make_policy
from ..profile import load_profile
from ..simulate import RunOutput, _streams, load_label
from ..traffic import build_workload
from .engine import RealEngine
from .executor import Executor, ExecutorConfig, build_models, torch_dtype
from .models import device_key, kv_capacity_tokens, load_target, model_key


@dataclass(frozen=True)
class RunnerConfig:
    """The real side of a run: which target (see :func:`~dsparksim.runner.models.parse_model`) on which device."""

    model: str = "tiny"
    executor: ExecutorConfig = field(default_factory=ExecutorConfig)
    check_profile: bool = True   # the profile must have been measured for this model on this device


def _check_profile(profile, mkey: str, dkey: str) -> None:
    meta = profile.metadata
    for k, want in (("runner_model", mkey), ("runner_device", dkey)):
        got = meta.get(k)
        if got != want:
            raise ConfigError(f"profile '{profile.name}' ({profile.source})", f"metadata.{k}",
                              f"the profile was measured for {got!r} but this run is {want!r}; measure a profile "
                              f"for this model/device (`dsparksim measure`) or pass --no-profile-check")


def real_run(cfg: RunConfig, rcfg: RunnerConfig = RunnerConfig(), *, target=None, proxy=None,
             progress: Callable[[float], None] | None = None) -> RunOutput:
    """Serve ``cfg`` for real (trace-replay acceptance). ``target``/``proxy`` reuse already built models."""
    ex = rcfg.executor
    rngs = _streams(cfg.seed)
    profile = load_profile(cfg.profile)
    mcfg, tmodel, ck = load_target(rcfg.model, ex.device, ex.dtype)
    mkey = model_key(mcfg, ck, ex.drafter_layers, ex.dtype)
    dkey = device_key(ex.device, ex.threads, ex.clock_name())
    if rcfg.check_profile:
        _check_profile(profile, mkey, dkey)
    policy = make_policy(cfg.policy)
    K = int(policy.block_size or cfg.engine.block_size)
    if policy.needs_oracle:
        raise ConfigError("config", "policy", f"{policy.spec} reads the true accepted length: it exists only in the "
                          "simulator")
    spec = cfg.mtp1_acceptance if policy.drafter == "mtp1" else cfg.acceptance
    acceptance = load_acceptance(spec, K)
    tK = acceptance.describe().get("trace_K")
    if tK is not None and tK != K:
        raise ConfigError(spec, "K", f"K mismatch: the run uses K={K} but the acceptance trace was recorded with "
                          f"K={tK}; a validation must replay blocks of the same size (record a K={K} trace)")
    drafter = policy.drafter or cfg.engine.drafter or acceptance.drafter
    if drafter not in profile.drafters:
        raise ConfigError(profile.source, "drafters", f"profile '{profile.name}' has no drafting cost for '{drafter}'")
    policy.reset(K, rngs["policy"])
    workload = build_workload(cfg.traffic, rngs["workload"])
    kv_cap = cfg.engine.kv_capacity_tokens or profile.metadata.get("kv_capacity_tokens")
    if not kv_cap:
        raise ConfigError(profile.source, "metadata.kv_capacity_tokens", "profile states no KV capacity")
    bits = torch_dtype(ex.dtype).itemsize * 8
    dev_cap = kv_capacity_tokens(mcfg, ex.device, bits)
    if kv_cap > dev_cap:
        raise ConfigError("config", "kv_capacity_tokens", f"{kv_cap} KV tokens requested but {ex.device} can hold "
                          f"about {dev_cap} for this model ({bits}-bit KV); lower --kv-capacity")
    max_tok = cfg.engine.max_batched_tokens or profile.max_tokens
    T = int((workload.prompt_tokens + workload.output_tokens).max()) + K + 2
    conc = workload.concurrency or cfg.engine.max_num_seqs
    slots = min(cfg.engine.max_num_seqs, conc)
    if slots * T > dev_cap:
        raise ConfigError("config", "max_num_seqs", f"{slots} KV slots of {T} tokens exceed the device's "
                          f"{dev_cap}-token KV capacity")
    if target is None or proxy is None:
        target, proxy = build_models(mcfg, ex, tmodel)
    executor = Executor(target, proxy, ex, T=T, slots=slots)
    duration = cfg.traffic.duration_s if cfg.traffic.num_requests is None else None
    eng = RealEngine(executor=executor, profile=profile, acceptance=acceptance, policy=policy, workload=workload,
                     block_size=K, drafter=drafter, kv_capacity_tokens=int(kv_cap),
                     max_num_seqs=cfg.engine.max_num_seqs, max_batched_tokens=int(max_tok),
                     prefill_chunk_tokens=cfg.engine.prefill_chunk_tokens, rng=rngs["acceptance"],
                     duration_s=duration, num_requests=cfg.traffic.num_requests, progress=progress)
    res = eng.run()
    warmup = cfg.warmup_s if cfg.warmup_s is not None else (0.1 * duration if duration else 0.0)
    summary = summarize(res, policy=policy.spec, load=load_label(cfg), warmup_s=warmup,
                        closed_loop=workload.closed_loop)
    summary["context_model"] = profile.context_model
    summary["engine"] = "real"
    st = res.steps
    summary["step_time_model_vs_real"] = {
        "sum_dt_s": float(np.sum(st["dt"])), "sum_dt_model_s": float(np.sum(st["dt_model"])),
        "sum_t_target_s": float(np.sum(st["t_target"])), "sum_t_draft_s": float(np.sum(st["t_draft"])),
        "sum_t_host_s": float(np.sum(st["t_host"]))}
    inputs = {
        "profile": {"name": profile.name, "source": str(profile.source), "context_model": profile.context_model,
                    "max_tokens": int(profile.max_tokens), "metadata": profile.metadata},
        "acceptance": acceptance.describe(),
        "workload": workload.metadata,
        "policy": {"spec": policy.spec, "block_size": K, "drafter": drafter},
        "engine": {"kind": "real", "model": mkey, "device": dkey, "kv_capacity_tokens": int(kv_cap),
                   "max_batched_tokens": int(max_tok), "kv_slot_tokens": T,
                   "admission": "FIFO; reserve prompt+output+K KV tokens at admission (no preemption)",
                   "acceptance_mode": "trace-replay: a = min(L, A) with A from the acceptance source"},
    }
    return RunOutput(config=cfg, summary=summary, result=res, inputs=inputs)
