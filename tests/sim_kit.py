"""Tests' shorthand for a Simulation (or one Scheduler) built from hand-made inputs: EngineConfig fields go to the
config (reserve KV unless ``kv_policy`` is given: the fixed reservation these tests were written against), the
resolved inputs to ResolvedInputs, the rest to Simulation. And the hand-made inputs the step-loop tests share: a
linear stand-in profile, a flat acceptance source, a chat workload."""
from __future__ import annotations

import dataclasses

import numpy as np

from dsparksim.acceptance.base import AcceptanceModel, Block
from dsparksim.config import EngineConfig
from dsparksim.sim.cluster import Simulation
from dsparksim.sim.inputs import ResolvedInputs
from dsparksim.sim.scheduler import Scheduler
from dsparksim.traffic.base import Workload
from stand_in_profile import stand_in_profile

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


# ---------------------------------------------------------------- hand-made inputs
def linear_profile():
    """verify_time = 1 ms + 10 us per token up to 4096 tokens, 0.2 ms drafting (dspark): a stand-in profile."""
    return stand_in_profile(lambda M: 1e-3 + 1e-5 * M, 4096, draft=2e-4, name="lin", drafters=("dspark",))


class FlatAcceptance(AcceptanceModel):
    """Every draft position accepted with probability ``p`` independently (the accepted prefix ends at the first
    rejection), confidence ``p`` everywhere; draws from the rng it is given."""

    drafter = "dspark"

    def __init__(self, K, p=0.6):
        self.K, self.p, self.metadata = K, p, {"source": "test"}

    def start(self, slots, domains, rng):
        pass

    def draw(self, slots, rng):
        ok = rng.random((len(slots), self.K)) < self.p
        A = np.where(ok.all(1), self.K, np.argmin(ok, 1))
        return Block(conf=np.full((len(slots), self.K), self.p), accepted=A.astype(np.int64))


def chat_workload(n, users, prompt=10, out=20):
    """n closed-loop chat requests of ``prompt`` prompt and ``out`` output tokens, ``users`` at a time."""
    return Workload(prompt_tokens=np.full(n, prompt), output_tokens=np.full(n, out),
                    domain=np.full(n, "chat", dtype=object), concurrency=users)


def assert_same_result(a, b) -> None:
    """Two SimResults are the same bit for bit: every per-request array (dtype and bytes; object arrays by value)
    and every step-log column."""
    for f in dataclasses.fields(a):
        va, vb = getattr(a, f.name), getattr(b, f.name)
        if isinstance(va, np.ndarray) and va.dtype == object:
            assert va.tolist() == vb.tolist(), f.name
        elif isinstance(va, np.ndarray):
            assert va.dtype == vb.dtype and va.tobytes() == vb.tobytes(), f.name
    assert a.steps.keys() == b.steps.keys()
    for k in a.steps:
        assert a.steps[k].tobytes() == b.steps[k].tobytes(), k
