"""Issue 31 item 3: a preempted request's per-request tau counts decode-step tokens per decode step only (the
recompute's token comes from a prefill forward, as the first token does), so `none` gives exactly 1."""
from __future__ import annotations

import numpy as np

from dsparksim.results.metrics import per_request_table, summarize

from dsparksim.acceptance.base import AcceptanceModel, Block
from dsparksim.policies import make_policy
from sim_kit import make_sim  # noqa: E402
from test_engine import FlatProfile
from test_kv_paged import _sim, _wl


class NoDrafts(AcceptanceModel):
    """K = 0: nothing drafted, nothing accepted."""

    drafter, K, metadata = None, 0, {"source": "test"}

    def start(self, slots, domains, rng):
        pass

    def draw(self, slots, rng):
        n = len(slots)
        return Block(conf=np.zeros((n, 0)), accepted=np.zeros(n, np.int64))


def _none_sim(wl, kv):
    pol = make_policy("none")
    pol.reset(0, np.random.default_rng(0))
    return make_sim(profile=FlatProfile(), acceptance=NoDrafts(), policy=pol, workload=wl, block_size=0,
                      drafter=None, kv_capacity_tokens=kv, max_num_seqs=16, max_batched_tokens=256,
                      prefill_chunk_tokens=64, rng=np.random.default_rng(0), num_requests=len(wl),
                      kv_policy="paged", kv_page_tokens=1, kv_watermark=0.0)


def test_none_tau_is_exactly_one_after_a_preemption():
    # the two-request preemption of test_kv_paged, plain decoding: 1-token pages, 14 pages, K = 0. A and B
    # (prompt 4, output 10) prefill together and then hold 5, 6, 7 pages each: B (admitted last) is preempted
    # when the step needs 16 > 14 pages, re-prefills prompt + its generated tokens and emits its next token
    # from that prefill forward (not a decode step).
    res = _none_sim(_wl([4, 4], [10, 10], concurrency=2), kv=14).run()
    assert res.preemptions.tolist() == [0, 1] and res.completed.all()
    req = per_request_table(res)
    np.testing.assert_array_equal(req["tau"], [1.0, 1.0])
    # B: 10 tokens = first token (prefill) + one from the recompute prefill + 8 decode steps
    assert res.decode_steps.tolist() == [9, 8]
    s = summarize(res, policy="none", load=2, warmup_s=0.0, closed_loop=True)
    assert s["tau"] == 1.0


def test_fixed_k_tau_never_exceeds_k_plus_one_under_preemption():
    # every draft accepted (alpha = 1): each decode step emits K + 1 tokens except a request's clipped last one,
    # so the per-request tau is at most K + 1 whatever the preemptions
    K = 3
    rng = np.random.default_rng(5)
    prompts, outs = rng.integers(5, 60, 24), rng.integers(40, 120, 24)
    res = _sim(_wl(prompts, outs, concurrency=8), K=K, kv=700, page=4, alpha=1.0, max_seqs=16, chunk=64,
               max_tokens=256).run()
    assert res.preemptions.sum() >= 3 and res.completed.all()
    tau = per_request_table(res)["tau"].to_numpy()
    assert (tau <= K + 1 + 1e-12).all(), tau.max()
    # and the per-request figures pool to the summary's tau (the same definition)
    s = summarize(res, policy=f"fixed:{K}", load=8, warmup_s=0.0, closed_loop=True)
    pooled = (tau * res.decode_steps).sum() / res.decode_steps.sum()
    assert pooled == np.float64(s["tau"]) or abs(pooled - s["tau"]) < 1e-12
