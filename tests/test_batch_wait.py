"""TensorRT-LLM's batch waiting (dsparksim/sim/batch_wait.py): the rule step by step, what it does to an engine's
steps, and how its two values are refused when given alone or where TensorRT-LLM does not apply it."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dsparksim.bench.client import ServerSettings
from dsparksim.config import EngineConfig, RunConfig
from dsparksim.errors import ConfigError
from dsparksim.sim.batch_wait import BatchWait
from dsparksim.sim.simulate import simulate
from dsparksim.traffic import TrafficConfig

PROFILE = "h100-llama2-7b-tp1"


def test_contexts_wait_for_the_token_threshold_or_the_timeout():
    # TensorRT-LLM's own example: max_num_tokens 1000, ratio 0.5 -> 100 scheduled tokens wait, 500 do not
    b = BatchWait(timeout_iters=3, max_tokens_ratio=0.5, max_num_tokens=1000)
    assert b.threshold == 500.0
    assert [b.hold(100) for _ in range(5)] == [True, True, True, False, True]   # the 4th call: count 3 >= 3
    assert b.count == 1 and b.held == 4
    assert b.hold(500) is False and b.count == 0                                 # at the threshold: runs, resets
    assert b.hold(499) is True and b.count == 1
    # a timeout of one: every other step with contexts holds them
    one = BatchWait(1, 1.0, 8192)
    assert [one.hold(10) for _ in range(4)] == [True, False, True, False]
    for bad in ((0, 0.5, 10), (2, 0.0, 10), (2, 1.5, 10), (2, 0.5, 0)):
        with pytest.raises(ValueError, match="BatchWait: expected"):
            BatchWait(*bad)


def test_the_rule_counts_against_the_smaller_of_token_budget_and_prefill_chunk():
    """TensorRT-LLM's max_num_tokens bounds both a step and the contexts it schedules: a threshold on the token
    budget alone (16384 on the DeepSeek profiles) could never be reached by chunks of 2048."""
    from sim_kit import FlatAcceptance, chat_workload, linear_profile, make_scheduler

    from dsparksim.policies import make_policy
    from dsparksim.sim.requests import RequestTable
    for budget, chunk, basis in ((4096, 1024, 1024), (2048, 8192, 2048), (8192, 8192, 8192)):
        table = RequestTable(chat_workload(4, 3), 4, None)
        eng = make_scheduler(table=table, profile=linear_profile(), acceptance=FlatAcceptance(3),
                             policy=make_policy("fixed:3"), K=3, drafter="dspark", kv_capacity_tokens=10_000,
                             max_batched_tokens=budget, prefill_chunk_tokens=chunk, batch_wait_timeout_iters=40,
                             batch_wait_max_tokens_ratio=0.5, rng=np.random.default_rng(0))
        assert eng.batch_wait.threshold == 0.5 * basis


def _run(wait: tuple[int, float] | None, seed: int = 0):
    t, r = wait if wait else (None, None)
    eng = EngineConfig(block_size=3, max_batched_tokens=4096, prefill_chunk_tokens=4096, kv_capacity_tokens=10**7,
                       batch_wait_timeout_iters=t, batch_wait_max_tokens_ratio=r)
    tr = TrafficConfig(mode="closed", concurrency=24, num_requests=120, dataset_name="random",
                       random_input_len=600, random_output_len=80, random_range_ratio=0.5)
    out = simulate(RunConfig(policy="fixed:3", profile=PROFILE, engine=eng, traffic=tr, seed=seed))
    st = pd.DataFrame({k: np.asarray(v) for k, v in out.result.steps.items() if np.ndim(v) == 1})
    return out, st


def _kinds(st: pd.DataFrame) -> np.ndarray:
    """Per step: 'R' contexts ran beside decoding requests, 'H' contexts were waiting and none ran while requests
    decoded (held), '.' anything else (no context waiting, or a step without decoding requests)."""
    dec, pf, waiting_ctx = st.n_decode > 0, st.n_prefill_tokens > 0, st.n_running > st.n_decode
    return np.where(dec & pf, "R", np.where(dec & ~pf & waiting_ctx, "H", "."))


def test_held_steps_between_releases_equal_the_timeout():
    """With the ratio at 1 the token threshold (the whole budget) is out of reach here, so contexts that would share
    a step with decoding requests run exactly every T+1-th such step: T held steps between two releases."""
    T = 4
    out, st = _run((T, 1.0))
    k = "".join(_kinds(st))
    runs = k.replace(".", "").split("R")[1:-1]           # held steps between consecutive releases
    assert len(runs) > 10 and set(map(len, runs)) == {T}, runs[:10]
    # without it no context waits while requests decode
    _, st0 = _run(None)
    assert "H" not in "".join(_kinds(st0))


def test_batch_waiting_trades_first_tokens_for_fewer_prefill_steps():
    """Paired (same seed, same requests): contexts held and released together -> fewer steps that carry prefill and
    a later first token."""
    base, st0 = _run(None, seed=3)
    held, st1 = _run((8, 1.0), seed=3)
    pf0, pf1 = int((st0.n_prefill_tokens > 0).sum()), int((st1.n_prefill_tokens > 0).sum())
    assert pf1 < 0.6 * pf0, (pf0, pf1)
    assert held.summary["ttft_mean_s"] > 1.5 * base.summary["ttft_mean_s"]
    assert held.summary["num_requests_completed"] == base.summary["num_requests_completed"] == 120


def test_a_reachable_token_threshold_releases_early():
    """Contexts are released before the timeout once their whole prompts and the decode tokens reach the ratio of
    the budget: with a low ratio after a step or two; with the ratio at 1 only when the waiting prompts outgrow the
    budget (a prompt cut to fit still counts whole, as TensorRT-LLM counts a context's tokens) or at the timeout."""
    _, st_hi = _run((30, 1.0), seed=1)
    _, st_lo = _run((30, 0.2), seed=1)               # 0.2 x 4096 = 819 tokens: about one prompt plus the decodes
    hi = [len(s) for s in "".join(_kinds(st_hi)).replace(".", "").split("R")[1:-1]]
    lo = [len(s) for s in "".join(_kinds(st_lo)).replace(".", "").split("R")[1:-1]]
    assert max(hi) <= 30 and max(lo) <= 30 and min(hi) > 0
    assert np.mean(lo) < 0.25 * np.mean(hi), (np.mean(lo), np.mean(hi))


def test_half_a_setting_or_an_engine_without_it_is_refused():
    with pytest.raises(ConfigError, match="batch_wait_timeout_iters.*40 without --batch-wait-max-tokens-ratio"):
        EngineConfig(batch_wait_timeout_iters=40)
    with pytest.raises(ConfigError, match="batch_wait_max_tokens_ratio.*0.8 without --batch-wait-timeout-iters"):
        EngineConfig(batch_wait_max_tokens_ratio=0.8)
    with pytest.raises(ConfigError, match="skips batch waiting under attention DP"):
        EngineConfig(batch_wait_timeout_iters=40, batch_wait_max_tokens_ratio=0.8, dp_ranks=2)
    with pytest.raises(ConfigError, match="--disaggregated decode engines"):
        EngineConfig(batch_wait_timeout_iters=40, batch_wait_max_tokens_ratio=0.8, disaggregated=True,
                     kv_transfer_gbps=100.0)
    with pytest.raises(ConfigError, match="expected a fraction in \\(0, 1\\], got 1.5"):
        EngineConfig(batch_wait_timeout_iters=40, batch_wait_max_tokens_ratio=1.5)
    with pytest.raises(ConfigError, match="expected an integer >= 1, got 0"):
        EngineConfig(batch_wait_timeout_iters=0, batch_wait_max_tokens_ratio=0.5)
    with pytest.raises(ConfigError, match="server: field 'batch_wait_timeout_iters'.*give both"):
        ServerSettings(batch_wait_timeout_iters=40)
    e = EngineConfig(batch_wait_timeout_iters=40, batch_wait_max_tokens_ratio=0.8)
    assert (e.batch_wait_timeout_iters, e.batch_wait_max_tokens_ratio) == (40, 0.8)


def test_bench_replay_names_its_batch_wait_flags_and_the_runs_they_cannot_apply_to(tmp_path):
    from cli_guard import classify, run_cli, sample_replay_argv

    replay = sample_replay_argv(tmp_path)
    o = run_cli([*replay, "--batch-wait-max-tokens-ratio", "0.8"])
    assert classify(o) == "error", o.describe()
    assert "field '--batch-wait-max-tokens-ratio': 0.8 without --batch-wait-timeout-iters" in o.stderr, o.stderr
    o = run_cli([*replay, "--batch-wait-timeout-iters", "40", "--batch-wait-max-tokens-ratio", "1.2"])
    assert classify(o) == "error" and "expected a fraction in (0, 1], got 1.2" in o.stderr, o.stderr
    o = run_cli([*replay, "--batch-wait-timeout-iters", "40", "--batch-wait-max-tokens-ratio", "0.8"])
    assert classify(o) == "error", o.describe()
    assert "field '--batch-wait-timeout-iters': 40 given, but run" in o.stderr and "'sglang'" in o.stderr, o.stderr
    assert not (tmp_path / "rp").exists()
