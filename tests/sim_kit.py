"""Tests' shorthand for a Simulation (or one Scheduler) built from hand-made inputs: EngineConfig fields go to the
config (reserve KV unless ``kv_policy`` is given: the fixed reservation these tests were written against), the
resolved inputs to ResolvedInputs, the rest to Simulation."""
from __future__ import annotations

import dataclasses

from dsparksim.config import EngineConfig
from dsparksim.sim.cluster import Simulation
from dsparksim.sim.inputs import ResolvedInputs
from dsparksim.sim.scheduler import Scheduler

ENGINE_FIELDS = {f.name for f in dataclasses.fields(EngineConfig)} - {"block_size", "drafter", "kv_capacity_tokens",
                                                                       "max_batched_tokens"}


def split(kw: dict, *, K: int, kv_capacity_tokens: int, max_batched_tokens: int, profile, acceptance, policy,
          drafter, max_model_len=None) -> tuple[EngineConfig, ResolvedInputs]:
    eng = {k: kw.pop(k) for k in list(kw) if k in ENGINE_FIELDS}
    eng.setdefault("kv_policy", "reserve")
    ri = ResolvedInputs(profile=profile, policy=policy, K=K, acceptance=acceptance, drafter=drafter,
                        kv_cap=int(kv_capacity_tokens), max_tokens=int(max_batched_tokens),
                        max_model_len=max_model_len)
    return EngineConfig(**eng), ri


def make_sim(*, workload, block_size, streams=None, **kw) -> Simulation:
    """Simulation(profile=..., acceptance=..., policy=..., workload=..., block_size=K, drafter=...,
    kv_capacity_tokens=..., max_batched_tokens=..., [max_model_len], EngineConfig fields..., Simulation keywords)."""
    res = {k: kw.pop(k) for k in ("kv_capacity_tokens", "max_batched_tokens", "profile", "acceptance", "policy",
                                  "drafter", "max_model_len") if k in kw}
    cfg, ri = split(kw, K=block_size, **res)
    return Simulation(cfg, ri, workload, streams, **kw)


def make_scheduler(*, table, K, streams=None, rng=None, **kw) -> Scheduler:
    """One Scheduler over ``table`` (the same keywords as make_sim, K instead of block_size)."""
    res = {k: kw.pop(k) for k in ("kv_capacity_tokens", "max_batched_tokens", "profile", "acceptance", "policy",
                                  "drafter", "max_model_len") if k in kw}
    cfg, ri = split(kw, K=K, **res)
    if kw:
        raise TypeError(f"unknown keywords {sorted(kw)}")
    return Scheduler(cfg, ri, table, streams=streams, rng=rng)
