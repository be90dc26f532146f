"""Paged KV (vLLM-style pages, watermark admission, preemption by recompute) against reserve-at-admission."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsparksim.cli.main import main
from dsparksim.config import EngineConfig
from dsparksim.sim.kv import R_KV
from dsparksim.errors import ConfigError
from dsparksim.policies import make_policy
from dsparksim.cost.profile import load_profile
from dsparksim.traffic.base import Workload
from sim_kit import make_sim  # noqa: E402

from test_engine import FlatProfile, Homogeneous


def _sim(wl: Workload, *, K=3, policy=None, kv=10**6, page=16, watermark=0.01, kv_policy="paged", seed=0,
         profile=None, alpha=0.7, max_seqs=1024, chunk=2048, max_tokens=8192, **kw):
    pol = make_policy(policy or f"fixed:{K}")
    pol.reset(K, np.random.default_rng(seed))
    n = None if "duration_s" in kw else len(wl)
    return make_sim(profile=profile or FlatProfile(), acceptance=Homogeneous(alpha, K), policy=pol, workload=wl,
                      block_size=K, drafter="dspark", kv_capacity_tokens=kv, max_num_seqs=max_seqs,
                      max_batched_tokens=max_tokens, prefill_chunk_tokens=chunk, rng=np.random.default_rng(seed),
                      num_requests=n, kv_policy=kv_policy, kv_page_tokens=page, kv_watermark=watermark, **kw)


def _wl(prompts, outs, arrivals=None, concurrency=None) -> Workload:
    p = np.asarray(prompts, np.int64)
    return Workload(prompt_tokens=p, output_tokens=np.asarray(outs, np.int64), domain=np.array(["chat"] * len(p),
                    dtype=object), arrival_s=None if arrivals is None else np.asarray(arrivals, float),
                    concurrency=concurrency)


def test_two_requests_preemption_by_recompute_step_by_step():
    # Pages of 1 token, 20 pages, no watermark, K=1 and every draft accepted (2 tokens per decode step).
    # A and B (prompt 4, output 10) prefill together (4 pages each) and emit their first token. Each decode step
    # holds context + K: 6, 8, 10 pages each -> 20 pages in use after 3 decode steps (gen 7 each). The next step
    # needs 12 each: B (admitted last) is preempted, its 4 + 7 = 11 KV tokens thrown away (recomputed), A grows to
    # 12 and reaches gen 9; A's last step emits 1 token and finishes (nothing is admitted in a step that preempted,
    # and then 11 pages > 6 free). B is readmitted at the front, re-prefills 4 + 7 = 11 tokens (emitting its 8th
    # token; its first token's time is kept) and finishes after one more decode step.
    sim = _sim(_wl([4, 4], [10, 10], concurrency=2), K=1, kv=20, page=1, watermark=0.0, alpha=1.0)
    res = sim.run()
    np.testing.assert_array_equal(res.preemptions, [0, 1])
    np.testing.assert_array_equal(res.recomputed_tokens, [0, 11])
    np.testing.assert_array_equal(res.emitted_tokens, [10, 10])
    st_ = res.steps
    np.testing.assert_array_equal(st_["kv_pages"], [8, 12, 16, 20, 12, 14, 11, 13])
    np.testing.assert_array_equal(st_["preempted"], [0, 0, 0, 0, 1, 0, 0, 0])
    np.testing.assert_array_equal(st_["n_prefill_tokens"], [8, 0, 0, 0, 0, 0, 11, 0])
    np.testing.assert_array_equal(st_["emitted"], [2, 4, 4, 4, 2, 1, 1, 2])
    assert int(st_["emitted"].sum()) == 20
    t_end = np.cumsum(st_["dt"])
    assert res.first_token_s[1] == pytest.approx(t_end[0])       # kept across the preemption
    assert res.finish_s[1] == pytest.approx(t_end[-1])
    # reserve at the same capacity holds one request at a time (4 + 10 + 1 = 15 of 20 tokens each)
    rr = _sim(_wl([4, 4], [10, 10], concurrency=2), K=1, kv=20, kv_policy="reserve", alpha=1.0).run()
    assert rr.steps["n_running"].max() == 1 and res.steps["n_running"].max() == 2


@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(4, 30), seed=st.integers(0, 10**6), page=st.sampled_from([1, 4, 16]),
       K=st.integers(1, 5), closed=st.booleans(), slack=st.floats(1.0, 4.0), wm=st.sampled_from([0.0, 0.01, 0.2]),
       disagg=st.booleans())
def test_preemption_loses_no_tokens_and_pages_never_overflow(n, seed, page, K, closed, slack, wm, disagg):
    rng = np.random.default_rng(seed)
    prompts = rng.integers(1, 200, n)
    outs = rng.integers(1, 300, n)
    # capacity between the largest request alone and a few of them: KV-limited, preemptions happen
    kv = int(page * (-(-(int((prompts + outs).max()) + K) // page)) * slack)
    if closed:
        wl = _wl(prompts, outs, concurrency=int(rng.integers(2, 12)))
    else:
        wl = _wl(prompts, outs, arrivals=np.sort(rng.uniform(0, 0.5, n)))
    extra = dict(disaggregated=True, prefill_replicas=2, kv_transfer_gbps=100.0, kv_bytes_per_token=1e5) \
        if disagg else {}
    sim = _sim(wl, K=K, kv=kv, page=page, watermark=wm, seed=seed, alpha=0.6, max_seqs=16, chunk=64,
               max_tokens=256, **extra)
    res = sim.run()
    assert res.ended_by == "all_requests_done"
    assert not res.rejected.any()
    # every request finished with exactly its output, each token emitted once in total (step log), never more
    assert res.completed.all()
    np.testing.assert_array_equal(res.emitted_tokens, outs)
    assert int(res.steps["emitted"].sum()) == int(outs.sum())
    # KV never overflows, at any step
    n_pages = kv // page
    assert res.steps["kv_pages"].max() <= n_pages
    assert (res.steps["kv_used"] <= kv).all()
    assert (res.recomputed_tokens >= 0).all() and (res.preemptions >= 0).all()
    assert int(res.steps["preempted"].sum()) == int(res.preemptions.sum())
    # preempted requests keep their first token and finish after it
    pre = res.preemptions > 0
    assert (res.finish_s[pre] >= res.first_token_s[pre]).all()
    if disagg:
        # decode-only engines prefill each request's last prompt token (its first token) and the recompute of
        # preempted requests; TTFT = its five parts, the first token after admission
        if not pre.any():
            assert res.steps["n_prefill_tokens"].sum() == n
        np.testing.assert_allclose(res.first_token_s - res.arrival_s,
                                   res.ttft_queue_s + res.ttft_prefill_s + res.ttft_transfer_s
                                   + res.ttft_decode_wait_s + res.ttft_first_step_s, rtol=1e-9)
        assert (res.first_token_s > res.admitted_s).all() and (res.ttft_decode_wait_s >= 0).all()


def test_property_workloads_do_preempt():
    # the property test above must exercise preemption: one of its KV-limited shapes, checked explicitly
    rng = np.random.default_rng(3)
    prompts, outs = rng.integers(1, 200, 30), rng.integers(100, 300, 30)
    res = _sim(_wl(prompts, outs, concurrency=10), K=3, kv=900, page=16, alpha=0.6, max_seqs=16, chunk=64,
               max_tokens=256).run()
    assert res.preemptions.sum() >= 5 and res.completed.all()
    np.testing.assert_array_equal(res.emitted_tokens, outs)


def test_paged_admits_more_than_reserve_on_the_7b_profile_and_preempts_when_memory_runs_out():
    # 7B on one H100 (113,534 KV tokens), prompts of 500 and outputs of 2,000 tokens, 120 users: reserve admits
    # floor(113534 / 2508) = 45 at a time; paged admits on prompt pages, runs out as outputs grow and preempts.
    prof = load_profile("h100-llama2-7b-tp1")
    kv = int(prof.metadata["kv_capacity_tokens"])
    wl = _wl(np.full(400, 500), np.full(400, 2000), concurrency=120)
    out = {}
    for pol in ("reserve", "paged"):
        res = _sim(wl, K=3, kv=kv, kv_policy=pol, profile=prof, duration_s=20.0, max_tokens=prof.max_tokens).run()
        out[pol] = res
    assert out["reserve"].steps["n_running"].max() == kv // 2503 == 45
    assert out["paged"].steps["n_running"].max() > 100
    assert out["paged"].preemptions.sum() > 0 and out["reserve"].preemptions.sum() == 0
    assert out["paged"].steps["kv_pages"].max() <= kv // 16


def test_watermark_keeps_pages_free_at_admission_but_not_for_a_lone_request():
    # 100 pages of 1 token, watermark 10%: the second request (40 pages) is admitted only if 10 stay free
    wl = _wl([50, 45, 5], [5, 5, 5], arrivals=[0.0, 0.0, 0.0])
    res = _sim(wl, K=1, kv=100, page=1, watermark=0.1, alpha=1.0).run()
    # A takes 50 (alone: fine); B would leave 100 - 50 - 45 = 5 < 10 free: waits for A
    assert res.admitted_s[1] > res.admitted_s[0]
    res0 = _sim(wl, K=1, kv=100, page=1, watermark=0.0, alpha=1.0).run()
    assert res0.admitted_s[1] == res0.admitted_s[0]
    # a request needing 95 of 100 pages runs alone although 95 > 100 - watermark
    res1 = _sim(_wl([90], [4], arrivals=[0.0]), K=1, kv=100, page=1, watermark=0.1, alpha=1.0).run()
    assert res1.completed.all()


def test_request_that_never_fits_in_pages_is_rejected_on_arrival():
    # 6 pages of 16 = 96 tokens: prompt 80 + output 10 + K 7 = 97 tokens need 7 pages
    res = _sim(_wl([80, 10], [10, 10], arrivals=[0.0, 0.0]), K=7, kv=96, page=16).run()
    assert res.reject_reason[0] == R_KV and res.completed[1]


def test_options_and_errors():
    with pytest.raises(ConfigError, match="kv_policy"):
        EngineConfig(kv_policy="swap")
    with pytest.raises(ConfigError, match="kv_watermark"):
        EngineConfig(kv_watermark=1.0)
    assert EngineConfig().kv_policy == "paged" and EngineConfig().kv_page_tokens == 16
    with pytest.raises(ConfigError, match="no page"):
        _sim(_wl([1], [1], arrivals=[0.0]), kv=8, page=16)


def test_cli_paged_run_reports_preemptions_and_reserve_keeps_the_old_files(tmp_path, capsys):
    base = ["run", "--policy", "fixed:3", "--concurrency", "48", "--num-requests", "60", "--kv-capacity", "30000",
            "--quiet"]
    assert main([*base, "--out", str(tmp_path / "p")]) == 0
    s = json.loads((tmp_path / "p" / "summary.json").read_text())
    req = pd.read_csv(tmp_path / "p" / "requests.csv")
    assert s["kv_policy"] == "paged" and s["kv_page_tokens"] == 16
    assert s["num_preemptions"] == int(req["preemptions"].sum()) > 0
    assert s["recomputed_tokens"] == int(req["recomputed_tokens"].sum()) > 0
    assert s["num_requests_preempted"] == int((req["preemptions"] > 0).sum())
    assert (req["emitted_tokens"] == req["output_tokens"]).all() and s["num_requests_completed"] == 60
    assert s["kv_peak_used_pages"] <= 30000 // 16
    cfg = json.loads((tmp_path / "p" / "config.json").read_text())
    assert cfg["config"]["engine"]["kv_policy"] == "paged" and "preempts" in cfg["inputs"]["engine"]["admission"]
    assert main([*base, "--kv-policy", "reserve", "--out", str(tmp_path / "r")]) == 0
    s = json.loads((tmp_path / "r" / "summary.json").read_text())
    req = pd.read_csv(tmp_path / "r" / "requests.csv")
    assert "num_preemptions" not in s and "preemptions" not in req.columns


def test_reserve_refuses_paged_only_options():
    # found by a hostile test: --kv-policy reserve --kv-watermark 0.5 --kv-page-tokens 7 ran, with no effect
    import pytest as _pytest

    from dsparksim.config import EngineConfig
    from dsparksim.errors import ConfigError

    with _pytest.raises(ConfigError, match="describes paged KV, which --kv-policy reserve does not use"):
        EngineConfig(kv_policy="reserve", kv_watermark=0.5)
    with _pytest.raises(ConfigError, match="describes paged KV, which --kv-policy reserve does not use"):
        EngineConfig(kv_policy="reserve", kv_page_tokens=7)
    EngineConfig(kv_policy="reserve")   # the defaults are fine
