"""Prefill not mixed with decode (SGLang's default, ``--enable-mixed-chunk`` off), step by step by hand.

With ``mixed_prefill=False`` a step that schedules a prefill chunk carries no decode tokens: the decoding requests
wait it out. Every expected number is worked out in the comments; the mixed (default) run of the same case is the
contrast, so a test that passed by the option being ignored fails.
"""
from __future__ import annotations

import numpy as np
import pytest

from dsparksim.acceptance.base import AcceptanceModel, Block
from dsparksim.cost.profile import FORMAT, profile_from_dict
from dsparksim.policies import make_policy
from dsparksim.results.metrics import per_request_table
from dsparksim.sim.scheduler import reprice_steps
from dsparksim.traffic.base import Workload
from sim_kit import make_sim  # noqa: E402


class AcceptNone(AcceptanceModel):
    """No draft is ever accepted: every decode step emits exactly one token."""

    drafter = "dspark"

    def __init__(self, K: int):
        self.K, self.metadata = K, {"source": "test"}

    def start(self, slots, domains, rng):
        pass

    def draw(self, slots, rng):
        n = len(slots)
        return Block(conf=np.full((n, self.K), 0.5), accepted=np.zeros(n, np.int64))


def _profile():
    """verify floor table (M 1/8/64/128 -> 10/12/16/20 ms) + 1e-5 s per KV token read + 1 ms fixed + a drafter
    that costs 2 ms whatever it drafts (charged only by steps with decoding requests)."""
    return profile_from_dict({
        "format": FORMAT, "name": "hand",
        "metadata": {"device": "test", "model": "test", "source": "hand-written", "method": "hand-written"},
        "verify": {"M": [1, 8, 64, 128], "time_s": [0.010, 0.012, 0.016, 0.020]},
        "attention": {"model": "kv_bandwidth", "seconds_per_kv_token": 1e-5, "note": "test"},
        "fixed_overhead_s": 0.001,
        "drafters": {"dspark": {"kind": "parallel", "tokens": [1, 16], "time_s": [0.002, 0.002],
                                "markov_overhead_frac": 0.0}},
    })


def _run(mixed: bool):
    # r0: prompt 8, 4 output tokens, arrives at 0; r1: prompt 12, 2 output tokens, arrives at 20 ms.
    # K = 1, nothing accepted (one token per decode step); prefill chunks of at most 8 tokens.
    wl = Workload(prompt_tokens=np.array([8, 12]), output_tokens=np.array([4, 2]),
                  domain=np.array(["chat", "chat"], dtype=object), arrival_s=np.array([0.0, 0.020]))
    pol = make_policy("fixed:1")
    pol.reset(1, np.random.default_rng(0))
    sim = make_sim(profile=_profile(), acceptance=AcceptNone(1), policy=pol, workload=wl, block_size=1,
                     drafter="dspark", kv_capacity_tokens=10**6, max_num_seqs=8, max_batched_tokens=128,
                     prefill_chunk_tokens=8, rng=np.random.default_rng(0), num_requests=2, mixed_prefill=mixed)
    return sim.run()


def test_prefill_only_steps_stall_decode_by_hand():
    # step  start     what                          M  verify  kv_read        drafter+fixed  dt
    # 0     0         r0 chunk 8 (prefill only)     8  12 ms   8   -> 0.08    0 + 1 ms       13.08 ms -> r0 token 1
    # 1     13.08     r0 decodes (r1 not arrived)   2  10 ms   8+1 -> 0.09    2 + 1 ms       13.09 ms -> r0 token 2
    # 2     26.17     r1 admitted: chunk 8; r0 WAITS 8 12 ms   0+8 -> 0.08    0 + 1 ms       13.08 ms
    # 3     39.25     r1 chunk 4; r0 WAITS          4  10 ms   8+4 -> 0.12    0 + 1 ms       11.12 ms -> r1 token 1
    # 4     50.37     r0 and r1 decode              4  10 ms   10+13 -> 0.23  2 + 1 ms       13.23 ms -> r1 done
    # 5     63.60     r0 decodes                    2  10 ms   8+3 -> 0.11    2 + 1 ms       13.11 ms -> r0 done
    # (kv_read of a prefill-only step is the prefilling rows' context only: r0's 9 tokens are not read in 2, 3.)
    res = _run(mixed=False)
    st = res.steps
    assert st["n_decode"].tolist() == [0, 1, 0, 0, 2, 1]
    assert st["n_prefill_tokens"].tolist() == [8, 0, 8, 4, 0, 0]
    assert st["M"].tolist() == [8, 2, 8, 4, 4, 2]
    assert st["kv_read"].tolist() == [8, 9, 8, 12, 23, 11]
    assert st["n_running"].tolist() == [1, 1, 2, 2, 2, 1]
    np.testing.assert_allclose(st["dt"], [0.01308, 0.01309, 0.01308, 0.01112, 0.01323, 0.01311], rtol=1e-12)
    # r0: first token 13.08 ms, done at 76.71 ms: TTFT 13.08 ms, TPOT (76.71 - 13.08) / 3 = 21.21 ms
    # r1: arrives 20 ms, first token 50.37 ms, done 63.60 ms: TTFT 30.37 ms, TPOT 13.23 ms
    np.testing.assert_allclose(res.first_token_s, [0.01308, 0.05037], rtol=1e-12)
    np.testing.assert_allclose(res.finish_s, [0.07671, 0.06360], rtol=1e-12)
    req = per_request_table(res)
    np.testing.assert_allclose(req["ttft_s"], [0.01308, 0.03037], rtol=1e-9)
    np.testing.assert_allclose(req["tpot_s"], [(0.07671 - 0.01308) / 3, 0.01323], rtol=1e-9)


def test_mixed_default_carries_decode_with_the_chunk():
    # The same case mixed (vLLM): step 2 carries r0's decode with r1's 8-token chunk (budget min(8, 128 - 2)):
    # M = 2 + 8 = 10 -> 12 ms, kv_read 8+2 (r0) + 0+8 (r1) = 18 -> 0.18 ms, drafter 2 + fixed 1: 15.18 ms.
    res = _run(mixed=True)
    st = res.steps
    assert st["n_decode"][:4].tolist() == [0, 1, 1, 1]
    assert st["n_prefill_tokens"][:4].tolist() == [8, 0, 8, 4]
    assert st["dt"][2] == pytest.approx(0.01518, rel=1e-12)
    # r0 never stalls, so it finishes earlier than unmixed (76.71 ms)
    assert res.finish_s[0] < 0.07671


def test_unmixed_steps_reprice_exactly():
    # The logged shape is all a step's price depends on: reprice_steps gives the logged dt bit for bit.
    res = _run(mixed=False)
    np.testing.assert_array_equal(reprice_steps(_profile(), res.steps, "dspark", 1, 128), res.steps["dt"])


def test_unmixed_chunk_takes_the_whole_budget():
    # Unmixed, decode tokens take none of the step's budget: with max_batched_tokens 10 and 4 decoding rows of
    # K=1 (8 tokens) a mixed step leaves 2 prefill tokens; the unmixed one gives the chunk min(8, 10) = 8. The
    # fifth request arrives at 0.3 s, when the first four (60 output tokens each) are all decoding.
    n = 5
    wl = Workload(prompt_tokens=np.full(n, 8), output_tokens=np.full(n, 60),
                  domain=np.array(["chat"] * n, dtype=object), arrival_s=np.array([0.0] * 4 + [0.3]))
    for mixed, chunk in ((True, 2), (False, 8)):
        pol = make_policy("fixed:1")
        pol.reset(1, np.random.default_rng(0))
        sim = make_sim(profile=_profile(), acceptance=AcceptNone(1), policy=pol, workload=wl, block_size=1,
                         drafter="dspark", kv_capacity_tokens=10**6, max_num_seqs=8, max_batched_tokens=10,
                         prefill_chunk_tokens=8, rng=np.random.default_rng(0), num_requests=n, mixed_prefill=mixed)
        st = sim.run().steps
        late = (np.asarray(st["n_running"]) == 5) & (np.asarray(st["n_prefill_tokens"]) > 0)
        first = int(np.argmax(late))
        assert st["n_prefill_tokens"][first] == chunk
        assert st["n_decode"][first] == (4 if mixed else 0)
