"""Pre-drawn acceptance draws (dsparksim.sim.predraw) and the dense-price fast path give the very same run.

Both are speed paths (issue 28 part 6): the draws of a request's steps are made in blocks ahead of time, and the
confidence policy reads only the prefix of a checked price table. Neither may change a single bit of a result.
"""
from __future__ import annotations


import numpy as np
import pytest

from dsparksim.acceptance import load_acceptance
from dsparksim.config import EngineConfig, RunConfig
from dsparksim.policies.base import StepContext
from dsparksim.policies.confidence import algorithm1
from dsparksim.sim import predraw as predraw_mod
from dsparksim.cost.price import DenseStepTime
from dsparksim.sim.requests import RequestTable
from dsparksim.sim.simulate import simulate
from dsparksim.sim.streams import RequestStreams
from dsparksim.traffic import TrafficConfig
from dsparksim.traffic.base import Workload
from sim_kit import assert_same_result

K = 7


def _run(monkeypatch, predraw: bool, policy: str, **engine):
    monkeypatch.setattr(predraw_mod, "BLOCK_STEPS", 3)   # short blocks: many refills, ring wraps and reuses
    monkeypatch.setattr(predraw_mod, "AHEAD", 5)
    if not predraw:
        monkeypatch.setattr("dsparksim.sim.scheduler.supports_predraw", lambda acc: False)
    cfg = RunConfig(policy=policy, profile="h100-llama2-7b-tp1", acceptance="dspark",
                    engine=EngineConfig(block_size=K, **engine),
                    traffic=TrafficConfig(mode="closed", concurrency=40, duration_s=12.0), seed=7)
    out = simulate(cfg)
    monkeypatch.undo()
    return out.result


@pytest.mark.parametrize("policy, engine", [
    ("confidence", {"kv_capacity_tokens": 12_000}),              # paged KV under pressure: preemptions
    ("threshold:0.5", {"replicas": 2, "router": "round-robin", "kv_capacity_tokens": 40_000}),
])
def test_predrawn_run_is_bit_identical(monkeypatch, policy, engine):
    a = _run(monkeypatch, True, policy, **engine)
    b = _run(monkeypatch, False, policy, **engine)
    if "kv_capacity_tokens" in engine and policy == "confidence":
        assert a.preemptions.sum() > 0          # the case exercises preemption (re-admission keeps the draws)
    assert_same_result(a, b)


def test_take_matches_one_draw_per_step():
    """Rows decoding at scattered steps, reused rings, a refill mid-run: every (row, step) as acc.draw gives it."""
    acc = load_acceptance("dspark", K)
    streams = RequestStreams(11)
    n = 30
    wl = Workload(prompt_tokens=np.full(200, 10), output_tokens=np.full(200, 50),
                  domain=np.array(["chat", "math"] * 100, object), concurrency=n)
    table = RequestTable(wl, None, streams)
    table.load(199)
    pre = predraw_mod.PredrawnDraws(acc, streams, table, K, acc.words_per_step, steps=4, ahead=7)
    rng = np.random.default_rng(0)
    slots = np.arange(200)
    acc.start(slots, table.domain[:200], streams.rows(table.key[:200], -1, 1))
    live = np.arange(n)
    for _ in range(60):
        rows = np.sort(rng.choice(live, size=12, replace=False))
        pre.admit(rows)
        conf, surv, a = pre.take(rows)
        ref = acc.draw(slots[rows], streams.rows(table.key[rows], table.dsteps[rows], acc.words_per_step))
        assert conf.tobytes() == np.ascontiguousarray(ref.conf[:, :K]).tobytes()
        assert surv.tobytes() == np.cumprod(ref.conf[:, :K], axis=1).tobytes()
        assert (a == ref.accepted).all()
        table.dsteps[rows] += rng.integers(1, 3, rows.size)       # some steps skipped (never drawn twice)
        gone = rng.choice(live, size=2, replace=False)            # finished requests free their rings
        table.phase[gone] = 4
        live = np.setdiff1d(live, gone)
        live = np.concatenate([live, np.arange(live.max() + 1, live.max() + 3)])
    assert pre.refills > 5


def test_dense_price_prefix_gives_the_same_lengths():
    rng = np.random.default_rng(3)
    dense = np.full(4097, np.nan)
    dense[1:] = 0.01 + np.cumsum(rng.uniform(0, 2e-5, 4096))
    for n in (1, 5, 64, 300):
        conf = rng.uniform(0.05, 1.0, (n, K))
        st = DenseStepTime(dense, 0.003, float(dense[1:].min()), float(dense[1:].max()))
        assert st.checked

        def plain(M, st=st):
            return dense[M] + 0.003
        ctx = dict(conf=conf, survival=np.cumprod(conf, axis=1), request_ids=np.arange(n), base_tokens=n + 17,
                   max_tokens=4096)
        fast = algorithm1(StepContext(step_time=st, **ctx))
        ref = algorithm1(StepContext(step_time=plain, **ctx))
        assert fast.tolist() == ref.tolist()
    # a negative per-step term could make a price non-positive: not checked, so the policy checks every price
    assert not DenseStepTime(dense, -0.5, float(dense[1:].min()), float(dense[1:].max())).checked


def test_a_request_is_drawn_no_more_steps_than_it_has_tokens_left():
    """A decode step emits at least one token: a request with t tokens left is drawn at most t more steps (the
    same values where drawn), and one with none left is not drawn."""
    acc = load_acceptance("dspark", K)
    streams = RequestStreams(5)
    wl = Workload(prompt_tokens=np.full(4, 10), output_tokens=np.array([3, 50, 1, 20]),
                  domain=np.array(["chat", "math", "chat", "code"], object), concurrency=4)
    table = RequestTable(wl, None, streams)
    table.load(3)
    pre = predraw_mod.PredrawnDraws(acc, streams, table, K, acc.words_per_step, steps=8, ahead=4)
    rows = np.arange(4)
    pre.admit(rows)
    filled = pre._filled
    assert filled[pre.entry[rows]].tolist() == [3, 8, 1, 8]
    table.gen[rows] = [1, 45, 1, 3]
    table.dsteps[rows] = [2, 8, 0, 8]          # rows 1 and 3 ran out: 5 and 17 tokens left
    acc.start(rows, table.domain[rows], streams.rows(table.key[rows], -1, 1))
    conf, _, a = pre.take(rows[[1, 3]])
    assert filled[pre.entry[rows]].tolist() == [3, 13, 1, 16]
    ref = acc.draw(rows[[1, 3]], streams.rows(table.key[[1, 3]], table.dsteps[[1, 3]], acc.words_per_step))
    assert conf.tobytes() == np.ascontiguousarray(ref.conf[:, :K]).tobytes() and (a == ref.accepted).all()
