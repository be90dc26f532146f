"""TensorRT-LLM's attention-DP context balance (dsparksim/sim/dp_balance.py): the rule step by step, and what it
does to a lockstep DP replica's steps."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dsparksim.config import EngineConfig, RunConfig
from dsparksim.errors import ConfigError
from dsparksim.sim.dp_balance import DPBalance
from dsparksim.sim.simulate import simulate
from dsparksim.traffic import TrafficConfig

DP_PROFILE = "built-h200x8-deepseek-v3-dp8ep8"   # one of 8 DP ranks
RANKS = 8


class _Rank:
    def __init__(self, n_dec: int, n_pf: int, max_seqs: int = 8) -> None:
        self.counts, self.max_seqs = (n_dec, n_pf), max_seqs

    def phase_counts(self) -> tuple[int, int]:
        return self.counts


def _ranks(*counts: tuple[int, int]) -> list[_Rank]:
    return [_Rank(d, p) for d, p in counts]


def test_prefills_wait_for_every_rank_or_the_timeout():
    b = DPBalance(timeout_iters=3)
    one_ctx = _ranks((2, 1), (2, 0))           # every rank decodes, only rank 0 has a prefill
    assert [b.hold(one_ctx) for _ in range(7)] == [True, True, False, True, True, False, True]
    assert b.held == 5
    # every rank has one (and a free slot): released at once, and the timeout count starts again
    assert b.hold(_ranks((2, 1), (2, 1))) is False and b.waiting == 0
    assert [b.hold(one_ctx) for _ in range(3)] == [True, True, False]


def test_a_rank_with_nothing_to_decode_or_no_free_slot():
    b = DPBalance(timeout_iters=100)
    # a rank with nothing to decode: nothing to stall, the prefills run (and the timeout count resets)
    assert b.hold(_ranks((2, 1), (0, 0))) is False and b.waiting == 0
    # every rank has a prefill, but rank 1's batch is full (decoding == max_seqs): no free slot -> held
    full = [_Rank(2, 1), _Rank(8, 1, max_seqs=8)]
    assert b.hold(full) is True and b.waiting == 1
    # timeout 0: the count reaches it at once, so nothing is ever held
    z = DPBalance(timeout_iters=0)
    assert not any(z.hold(_ranks((2, 1), (2, 0))) for _ in range(5))


def test_the_batching_wait_holds_ready_ranks_a_few_more_iterations():
    b = DPBalance(timeout_iters=60, batching_wait_iters=2)
    ready = _ranks((2, 1), (3, 1))
    assert [b.hold(ready) for _ in range(6)] == [True, True, False, True, True, False]
    # ready but a rank has nothing to decode: no batching wait (TensorRT-LLM leaves the batching count as it is)
    b2 = DPBalance(timeout_iters=60, batching_wait_iters=2)
    assert b2.hold(ready) is True and b2.hold(_ranks((2, 1), (0, 1))) is False and b2.batching == 1
    with pytest.raises(ValueError, match="iteration counts must be >= 0"):
        DPBalance(-1)


def _run(balance: int | None, seed: int = 0):
    eng = EngineConfig(block_size=1, dp_ranks=RANKS, router="least-outstanding", dp_balance_timeout_iters=balance)
    tr = TrafficConfig(mode="closed", concurrency=32, num_requests=96, dataset_name="random",
                       random_input_len=2048, random_output_len=64, random_range_ratio=0.5)
    out = simulate(RunConfig(policy="none", profile=DP_PROFILE, engine=eng, traffic=tr, seed=seed))
    st = pd.DataFrame({k: np.asarray(v) for k, v in out.result.steps.items() if np.ndim(v) == 1})
    return out, st


def _lone_prefills(st: pd.DataFrame) -> int:
    """Lockstep steps where some rank prefills while every rank decodes and some rank does not prefill (a rank
    with nothing running has no row in the step)."""
    n = 0
    for _, g in st.groupby("t_start"):
        pf = g.n_prefill_tokens > 0
        if len(g) == RANKS and pf.any() and not pf.all() and (g.n_decode > 0).all():
            n += 1
    return n


def test_with_the_balance_ranks_prefill_together_and_decoding_stalls_less():
    (base, st0), (held, st1) = _run(None), _run(10**6)
    assert sorted(st0["rank"].unique()) == list(range(RANKS))
    # without the balance a rank prefills alone while the others decode; with it (timeout never reached) a step
    # carries prefills only when every rank prefills or some rank has nothing to decode
    assert _lone_prefills(st0) > 10
    assert _lone_prefills(st1) == 0
    # fewer lockstep stalls: the decoding requests' TPOT falls, their TTFT rises (prefills wait)
    assert held.summary["tpot_mean_s"] < 0.9 * base.summary["tpot_mean_s"]
    assert held.summary["ttft_median_s"] > base.summary["ttft_median_s"]
    # a finite timeout releases held prefills: between the two
    mid, st2 = _run(5)
    assert 0 < _lone_prefills(st2) <= _lone_prefills(st0)


def test_the_balance_needs_dp_ranks_and_the_wait_needs_the_balance():
    with pytest.raises(ConfigError, match="dp_balance_timeout_iters.*nothing reads it"):
        EngineConfig(dp_balance_timeout_iters=60)
    with pytest.raises(ConfigError, match="dp_balance_wait_iters.*set --attention-dp-timeout-iters"):
        EngineConfig(dp_ranks=2, dp_balance_wait_iters=3)
    with pytest.raises(ConfigError, match="expected an integer >= 0"):
        EngineConfig(dp_ranks=2, dp_balance_timeout_iters=-1)
    with pytest.raises(ConfigError, match="dp_balance_timeout_iters.*--disaggregated decode ranks"):
        EngineConfig(dp_ranks=2, dp_balance_timeout_iters=60, disaggregated=True, kv_transfer_gbps=100.0)
    e = EngineConfig(dp_ranks=2, dp_balance_timeout_iters=0, dp_balance_wait_iters=2)
    assert (e.dp_balance_timeout_iters, e.dp_balance_wait_iters) == (0, 2)
