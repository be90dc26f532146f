"""Issue 31 item 21: step-by-step and boundary tests for seven bugs a mutation check found no test for (the two
saturation boundaries are in test_sound_saturation.py). Each test names the mutation it catches."""
from __future__ import annotations

import numpy as np
import pytest

from dsparksim.policies import make_policy
from dsparksim.sim.contract import CostExecutor
from dsparksim.sim.requests import WAITING, RequestTable

from test_engine import FlatProfile, Homogeneous
from test_kv_paged import _sim, _wl
from sim_kit import make_scheduler


def _engine(prompts, outs, *, kv, K=3, page=1, watermark=0.0, alpha=1.0):
    """One paged engine over requests 0..n-1 (not yet queued), stepped by hand."""
    wl = _wl(prompts, outs, arrivals=np.zeros(len(prompts)))
    table = RequestTable(wl, len(prompts), None)
    for row in range(len(prompts)):
        table.load(row)
    pol = make_policy(f"fixed:{K}")
    pol.reset(K, np.random.default_rng(0))
    return make_scheduler(table=table, profile=FlatProfile(), acceptance=Homogeneous(alpha, K), policy=pol, K=K,
                  drafter="dspark", kv_capacity_tokens=kv, max_num_seqs=8, max_batched_tokens=256,
                  prefill_chunk_tokens=64, rng=np.random.default_rng(0), kv_policy="paged", kv_page_tokens=page,
                  kv_watermark=watermark)


def _step(eng, t):
    plan = eng.plan_step()
    out = CostExecutor().execute(plan)
    eng.apply(plan, out, t + out.duration_s)
    eng.record(plan, out, t)
    return plan, t + out.duration_s


def _preempting_engine(extra_waiting=()):
    # 20 one-token pages, K = 3, no watermark, every draft accepted. A (prompt 8) and B (prompt 7) are admitted
    # (15 pages) and prefill in one step, each emitting its first token: contexts 9 and 8. The next step wants
    # 9 + 3 = 12 and 8 + 3 = 11 pages: 23 > 20, so B (admitted last) is preempted; A grows to 12 and 8 pages are
    # free -- exactly B's readmission (prompt 7 + 1 generated token).
    eng = _engine([8, 7, 30], [100, 100, 5], kv=20)
    eng.enqueue(0)
    eng.enqueue(1)
    assert eng.admit(0.0) == [0, 1]
    for row in extra_waiting:
        eng.enqueue(row)
    _, t = _step(eng, 0.0)
    assert eng.req.gen[[0, 1]].tolist() == [1, 1]
    return eng, t


def test_nothing_is_admitted_in_a_step_that_preempted():
    # mutation: admit() goes on admitting after _grow_pages preempted (B would be readmitted at once: it fits)
    eng, t = _preempting_engine()
    assert eng.admit(t) == []
    assert list(eng.waiting) == [1] and eng.req.phase[1] == WAITING and eng.running == (0,)
    assert eng.kv.pages_used == 12 and eng.kv.n_pages - eng.kv.pages_used == 8 == eng.kv.need(1)   # it would fit
    plan, t = _step(eng, t)
    assert plan.preempted.tolist() == [1] and plan.n_running == 1 and plan.kv_pages == 12


def test_a_preempted_request_goes_back_to_the_front_of_the_queue():
    # mutation: the preempted request is appended at the back (behind C, which waited before it)
    eng, t = _preempting_engine(extra_waiting=[2])
    assert list(eng.waiting) == [2]
    eng.admit(t)
    assert list(eng.waiting) == [1, 2]


@pytest.mark.parametrize("prompt_b,admitted", [(45, True), (46, False), (44, True)])
def test_watermark_boundary_admits_when_exactly_the_watermark_stays_free(prompt_b, admitted):
    # mutation: free - pages < watermark_pages -> <= . 100 one-token pages, watermark 5% = 5 pages. A (prompt 50)
    # runs; B leaves free - pages = 50 - prompt_b pages: 5 is vLLM's boundary, still admitted (free - required >=
    # watermark_blocks); 4 is not.
    eng = _engine([50, prompt_b], [10, 10], kv=100, watermark=0.05)
    assert eng.kv.wm_pages == 5
    eng.enqueue(0)
    eng.enqueue(1)
    got = eng.admit(0.0)
    assert got == ([0, 1] if admitted else [0])


def test_kv_read_counts_a_recomputed_request_once_step_by_step():
    # mutation: kv_read = prefilled + gen (without - regen): a re-prefilled request's regenerated tokens counted
    # twice. The two-request preemption of test_kv_paged (1-token pages, 20 pages, K = 1, all accepted): the
    # context read per step is the prompt + generated tokens of each running request (+ this step's chunks):
    # 8 (two 4-token prefills), 5 + 5, 7 + 7, 9 + 9, A alone 11 (B preempted), 13, B's re-prefill of 4 + 7 = 11
    # tokens, then B's context 4 + 8 = 12.
    res = _sim(_wl([4, 4], [10, 10], concurrency=2), K=1, kv=20, page=1, watermark=0.0, alpha=1.0).run()
    np.testing.assert_array_equal(res.steps["preempted"], [0, 0, 0, 0, 1, 0, 0, 0])
    np.testing.assert_array_equal(res.steps["kv_read"], [8, 10, 14, 18, 11, 13, 11, 12])


def test_disaggregated_pool_chunks_are_capped_by_the_token_budget():
    # mutation: the pool chunks prompts by prefill_chunk_tokens alone. Chunk 2048 but a 512-token step budget: a
    # 1000-token prompt takes 2 chunks of the flat profile's c (each a prefill-only step), not 1.
    c = 0.01
    prof = FlatProfile(c, max_tokens=512)
    prof.metadata.update({"kv_bytes_per_token": 1.0})
    res = _sim(_wl([1000], [2], arrivals=[0.0]), K=1, profile=prof, chunk=2048, max_tokens=512, disaggregated=True,
               kv_transfer_gbps=1e3).run()
    assert res.ttft_prefill_s[0] == pytest.approx(2 * c, rel=1e-12)
