"""Metric definitions checked in closed form: every expected number below is worked out by hand in the comments.

A hand-built SimResult (no engine) pins the summary metrics; a tiny deterministic engine run pins the step price
(context term included) and the KV bookkeeping. Each test names the plausible bug it kills.
"""
from __future__ import annotations

import numpy as np
import pytest

from dsparksim.acceptance.base import AcceptanceModel, Block
from dsparksim.sim.cluster import SimResult, Simulation
from dsparksim.results.metrics import per_request_table, summarize
from dsparksim.policies import make_policy
from dsparksim.cost.profile import FORMAT, profile_from_dict
from dsparksim.traffic.base import Workload
from sim_kit import make_sim  # noqa: E402

NAN = float("nan")
WARMUP, END = 2.0, 10.0           # measurement window [2, 10]: 8 s


def _result(steps: dict[str, list] | None = None) -> SimResult:
    """Six requests and five steps, chosen so every plausible mis-definition gives a different number.

    row  arrival  first  finish  out   ttft  e2e   decode  after-1  tpot   tps_user
    r0   1.0      1.2    2.2     6     0.2   1.2   1.0     5        0.2    5.0       (arrived in warm-up)
    r1   2.0      2.6    4.6     5     0.6   2.6   2.0     4        0.5    2.0
    r2   3.0      4.0    7.0     3     1.0   4.0   3.0     2        1.5    2/3
    r3   5.0      5.2    -       10    (not completed)
    r4   6.0      6.5    6.5     1     0.5   0.5   0.0     0        -      -         (one token: no TPOT)
    r5   7.0      -      -       4     (not completed)
    """
    arr = np.array([1.0, 2.0, 3.0, 5.0, 6.0, 7.0])
    first = np.array([1.2, 2.6, 4.0, 5.2, 6.5, NAN])
    fin = np.array([2.2, 4.6, 7.0, NAN, 6.5, NAN])
    out = np.array([6, 5, 3, 10, 1, 4])
    emitted = np.array([6, 5, 3, 4, 1, 0])
    n = len(arr)
    # steps: (t_start, dt, n_decode, emitted, decode_emitted, verify_tokens)
    rows = [(0.0, 1.5, 2, 10, 8, 14),    # ends at 1.5: entirely in warm-up
            (1.5, 1.0, 3, 8, 8, 9),      # ends at 2.5: straddles the window edge, half of it inside
            (2.5, 0.5, 1, 6, 5, 7),
            (3.0, 2.0, 4, 12, 12, 20),
            (5.0, 0.25, 2, 2, 2, 4)]
    st = steps or {k: [r[i] for r in rows] for i, k in enumerate(
        ("t_start", "dt", "n_decode", "emitted", "decode_emitted", "verify_tokens"))}
    m = len(st["dt"])
    full = {k: np.zeros(m, np.int64) for k in ("n_prefill_tokens", "M", "n_waiting", "n_running", "kv_used",
                                                "kv_read")}
    full.update({k: np.asarray(v) for k, v in st.items()})
    full["t_start"] = full["t_start"].astype(float)
    full["dt"] = full["dt"].astype(float)
    return SimResult(arrival_s=arr, admitted_s=arr.copy(), first_token_s=first, finish_s=fin,
                     prompt_tokens=np.full(n, 10), output_tokens=out, emitted_tokens=emitted,
                     decode_steps=np.ones(n, np.int64), verify_tokens=np.ones(n, np.int64),
                     accepted_tokens=np.zeros(n, np.int64), domain=np.array(["chat"] * n, dtype=object),
                     steps=full, sim_time_s=END, ended_by="duration", kv_capacity_tokens=1000,
                     max_batched_tokens=64, block_size=3, drafter="dspark")


@pytest.fixture(scope="module")
def summ():
    return summarize(_result(), policy="fixed:3", load=1, warmup_s=WARMUP, closed_loop=False)


def test_per_request_tpot_is_after_the_first_token_and_speed_is_its_inverse():
    # Kills "TPOT over all tokens" (r1 would be 2.0/5 = 0.4 or 2.6/5 = 0.52) and "per-user speed over all
    # tokens" (r1 would be 5/2.0 = 2.5).
    req = per_request_table(_result())
    np.testing.assert_allclose(req["tpot_s"], [0.2, 0.5, 1.5, NAN, NAN, NAN])
    np.testing.assert_allclose(req["tps_user"], [5.0, 2.0, 2 / 3, NAN, NAN, NAN])
    np.testing.assert_allclose(req["ttft_s"], [0.2, 0.6, 1.0, 0.2, 0.5, NAN])
    np.testing.assert_allclose(req["e2e_s"], [1.2, 2.6, 4.0, NAN, 0.5, NAN])
    assert req["completed"].tolist() == [True, True, True, False, True, False]


def test_tpot_summary_after_first_token(summ):
    # Requests in the window that completed: r1, r2, r4; r4 has one token, so no TPOT (vllm bench serve skips it).
    # TPOT samples [0.5, 1.5]: mean 1.0, median 1.0, p99 = 0.5 + 0.99 * (1.5 - 0.5) = 1.49 (linear percentile).
    assert summ["tpot_mean_s"] == pytest.approx(1.0)
    assert summ["tpot_median_s"] == pytest.approx(1.0)
    assert summ["tpot_p99_s"] == pytest.approx(1.49)


def test_per_user_speed_summary(summ):
    # tps_user samples [2.0, 2/3]: mean = median = 4/3; p10 = 2/3 + 0.1 * 4/3 = 0.8; p90 = 2/3 + 0.9 * 4/3.
    assert summ["tps_user_mean"] == pytest.approx(4 / 3)
    assert summ["tps_user_median"] == pytest.approx(4 / 3)
    assert summ["tps_user_p10"] == pytest.approx(0.8)
    assert summ["tps_user_p90"] == pytest.approx(2 / 3 + 1.2)


# DESIGN.md section 7: mean / median / p10 / p90 / p99 of each per-request metric, per run.
STATS = {"tps_user": ("tps_user_mean", "tps_user_median", "tps_user_p10", "tps_user_p90", "tps_user_p99"),
         **{m: tuple(f"{m}_{q}_s" for q in ("mean", "median", "p10", "p90", "p99"))
            for m in ("ttft", "tpot", "itl", "e2e")}}


def test_every_per_request_metric_has_the_full_statistic_set(summ):
    # Kills a statistic computed for some metrics only (summary.json had no tps_user p99, no ttft/tpot/e2e p10/p90,
    # no itl mean/p10/p90), and one the cache check, the SLO vocabulary or the frontier columns do not know.
    from dsparksim.results.metrics import SUMMARY_FIELDS
    from dsparksim.sweep.capacity import SLO_METRICS

    for keys in STATS.values():
        for k in keys:
            assert k in summ and k in SUMMARY_FIELDS and k in SLO_METRICS, k


def test_added_percentiles_are_linear_over_the_same_samples(summ):
    # Same samples as the existing keys (np.percentile linear: h = (N - 1) q / 100 between sorted neighbours).
    # tps_user [2/3, 2.0]: p99 = 2/3 + 0.99 * 4/3. TTFT [0.5, 0.6, 1.0]: p10 h = 0.2 -> 0.5 + 0.2 * 0.1 = 0.52,
    # p90 h = 1.8 -> 0.6 + 0.8 * 0.4 = 0.92. TPOT [0.5, 1.5]: p10 0.6, p90 1.4. E2E [0.5, 2.6, 4.0]: p10
    # 0.5 + 0.2 * 2.1 = 0.92, p90 2.6 + 0.8 * 1.4 = 3.72. (Nearest rank would give 0.5 / 1.0, 0.5 / 1.5, ...)
    assert summ["tps_user_p99"] == pytest.approx(2 / 3 + 0.99 * 4 / 3)
    assert summ["ttft_p10_s"] == pytest.approx(0.52)
    assert summ["ttft_p90_s"] == pytest.approx(0.92)
    assert summ["tpot_p10_s"] == pytest.approx(0.6)
    assert summ["tpot_p90_s"] == pytest.approx(1.4)
    assert summ["e2e_p10_s"] == pytest.approx(0.92)
    assert summ["e2e_p90_s"] == pytest.approx(3.72)


def test_itl_mean_and_tails_are_over_the_pooled_chunks(summ):
    # Pool [0.25 x2, 0.5, 1.0 x3, 2.0 x4] (see test_itl_percentiles_are_weighted_by_chunks): mean 12 / 10 = 1.2,
    # p10 h = 0.9 -> 0.25, p90 h = 8.1 -> 2.0. Over the four step durations instead: mean 0.9375, p10 0.325,
    # p90 1.7.
    assert summ["itl_mean_s"] == pytest.approx(1.2)
    assert summ["itl_p10_s"] == pytest.approx(0.25)
    assert summ["itl_p90_s"] == pytest.approx(2.0)


def test_no_sample_gives_null_for_every_statistic():
    # Warm-up 9 s: no request arrived in the window [9, 10] and no step ends in it. Every statistic of every
    # per-request metric is null (NaN in, None in summary.json), the new ones as the old ones.
    s = summarize(_result(), policy="fixed:3", load=1, warmup_s=9.0, closed_loop=False)
    assert s["num_requests_completed"] == 0 and s["num_steps"] == 0
    for keys in STATS.values():
        assert [s[k] for k in keys] == [None] * len(keys), keys


def test_warmup_excludes_requests_that_arrived_before_it(summ):
    # r0 arrived at 1.0 < warm-up 2.0: out of every per-request statistic; r1 arrived exactly at 2.0: in.
    # Without the filter: 4 completed, TPOT mean (0.2+0.5+1.5)/3, TTFT mean (0.2+0.6+1.0+0.5)/4.
    assert summ["num_requests_completed"] == 3
    assert summ["num_requests_completed_total"] == 4
    assert summ["num_requests_issued"] == 6
    assert summ["window_s"] == pytest.approx(8.0)
    assert summ["request_throughput_req_s"] == pytest.approx(3 / 8)
    assert summ["ttft_mean_s"] == pytest.approx((0.6 + 1.0 + 0.5) / 3)
    assert summ["ttft_median_s"] == pytest.approx(0.6)
    assert summ["e2e_mean_s"] == pytest.approx((2.6 + 4.0 + 0.5) / 3)
    assert summ["e2e_median_s"] == pytest.approx(2.6)


def test_throughput_counts_window_tokens_pro_rata(summ):
    # Step 0 (ends 1.5) is all warm-up: 0 of its 10 tokens. Step 1 runs 1.5..2.5: half inside, 8 * 0.5 = 4.
    # Steps 2..4 are inside: 6 + 12 + 2. Total 24 tokens over the 8 s window = 3.0 tok/s.
    # (Counting step 1 whole gives 3.5; counting everything over the whole run gives 3.8.)
    assert summ["output_throughput_tok_s"] == pytest.approx(3.0)
    # Per-step means use steps that end inside the window (1..4): verify 9+7+20+4 = 40 over 3+1+4+2 = 10
    # decoding request-steps; decode tokens 8+5+12+2 = 27 over 10.
    assert summ["num_steps"] == 4
    assert summ["mean_verify_len"] == pytest.approx(4.0)
    assert summ["tau"] == pytest.approx(2.7)


def test_pro_rata_share_follows_the_overlap():
    # One step of 10 tokens over 1.0..3.0 with warm-up 2.5: a quarter of it (0.5 s of 2 s) is in the window
    # [2.5, 10]: 2.5 tokens / 7.5 s.
    st = {"t_start": [1.0], "dt": [2.0], "n_decode": [1], "emitted": [10], "decode_emitted": [10],
          "verify_tokens": [3]}
    s = summarize(_result(st), policy="fixed:3", load=1, warmup_s=2.5, closed_loop=False)
    assert s["output_throughput_tok_s"] == pytest.approx(2.5 / 7.5)


def test_itl_percentiles_are_weighted_by_chunks(summ):
    # One ITL sample per decoding request per step: steps 1..4 give dt 1.0 x3, 0.5 x1, 2.0 x4, 0.25 x2, pooled
    # [0.25, 0.25, 0.5, 1, 1, 1, 2, 2, 2, 2]: median 1.0, p99 2.0. Unweighted over the four step durations the
    # median would be 0.75 and p99 1.97.
    assert summ["itl_median_s"] == pytest.approx(1.0)
    assert summ["itl_p99_s"] == pytest.approx(2.0)


def test_itl_percentile_interpolates_like_vllm_bench_serve():
    # Two steps of 1.0 s and 3.0 s with one decoding request each: pooled ITLs [1.0, 3.0]. vllm bench serve reports
    # np.percentile: median 2.0, p99 = 1.0 + 0.99 * 2.0 = 2.98. Today: 1.0 and 3.0.
    st = {"t_start": [2.0, 3.0], "dt": [1.0, 3.0], "n_decode": [1, 1], "emitted": [1, 1], "decode_emitted": [1, 1],
          "verify_tokens": [3, 3]}
    s = summarize(_result(st), policy="fixed:3", load=1, warmup_s=WARMUP, closed_loop=False)
    assert s["itl_median_s"] == pytest.approx(2.0)
    assert s["itl_p99_s"] == pytest.approx(2.98)
    # mean (1 + 3) / 2; p10 = 1 + 0.1 * 2, p90 = 1 + 0.9 * 2
    assert s["itl_mean_s"] == pytest.approx(2.0)
    assert s["itl_p10_s"] == pytest.approx(1.2)
    assert s["itl_p90_s"] == pytest.approx(2.8)


def test_itl_pool_holds_one_gap_per_preemption_resumed_in_the_window():
    # Six 1-s steps in the window; request r1 was preempted before step 1 and its re-prefill streamed its next token
    # at the end of step 2: between two of its chunks the client waited 2 s, one ITL sample (it decoded in neither
    # step, so the steps' n_decode leave it out). Pool: ten 1.0 + one 2.0: median 1.0, p99 = 1 + 0.9 * (2 - 1) = 1.9.
    # Without the gap: p99 1.0. A gap still open at the end of the run (r3, from step 5) streamed nothing: no sample.
    import dataclasses

    st = {"t_start": [2.0, 3.0, 4.0, 5.0, 6.0, 7.0], "dt": [1.0] * 6, "n_decode": [2, 1, 1, 2, 2, 2],
          "emitted": [2, 1, 2, 2, 2, 2], "decode_emitted": [2, 1, 1, 2, 2, 2], "verify_tokens": [3] * 6}
    res = dataclasses.replace(_result(st), kv_policy="paged", preemptions=np.array([0, 1, 0, 1, 0, 0]),
                              recomputed_tokens=np.zeros(6, np.int64), kv_page_tokens=16,
                              gap_request=np.array([1, 3]), gap_steps=np.array([[1, 2], [5, -1]]))
    res.steps["kv_pages"] = np.zeros(6, np.int64)
    s = summarize(res, policy="fixed:3", load=1, warmup_s=WARMUP, closed_loop=False)
    assert s["itl_median_s"] == pytest.approx(1.0)
    assert s["itl_p99_s"] == pytest.approx(1.9)
    # the gap is one of the pool's samples for the mean too: (10 x 1.0 + 2.0) / 11 (without it: 1.0); p10 = p90 = 1.0
    assert s["itl_mean_s"] == pytest.approx(12 / 11)
    assert s["itl_p10_s"] == pytest.approx(1.0)
    assert s["itl_p90_s"] == pytest.approx(1.0)


# ---------------------------------------------------------------------------------------------- engine, by hand
class AcceptExactly(AcceptanceModel):
    """Every step accepts exactly ``a`` of the K drafts (deterministic, so the whole run is hand-computable)."""

    drafter = "dspark"

    def __init__(self, a: int, K: int):
        self.a, self.K, self.metadata = a, K, {"source": "test"}

    def start(self, slots, domains, rng):
        pass

    def draw(self, slots, rng):
        n = len(slots)
        return Block(conf=np.full((n, self.K), 0.5), accepted=np.full(n, self.a, np.int64))


def _profile():
    """verify floor table + 1e-5 s per KV token read + 1 ms fixed + a parallel drafter (2 ms up to 15 tokens)."""
    return profile_from_dict({
        "format": FORMAT, "name": "hand",
        "metadata": {"device": "test", "model": "test", "source": "hand-written", "method": "hand-written"},
        "verify": {"M": [1, 8, 64, 128], "time_s": [0.010, 0.012, 0.016, 0.020]},
        "attention": {"model": "kv_bandwidth", "seconds_per_kv_token": 1e-5, "note": "test"},
        "fixed_overhead_s": 0.001,
        "drafters": {"dspark": {"kind": "parallel", "tokens": [1, 16], "time_s": [0.002, 0.003],
                                "markov_overhead_frac": 0.0}},
    })


def _engine(wl: Workload, *, K: int = 3, a: int = 1, kv: int = 10**6, max_seqs: int = 8, **stop) -> Simulation:
    pol = make_policy(f"fixed:{K}")
    pol.reset(K, np.random.default_rng(0))
    return make_sim(profile=_profile(), acceptance=AcceptExactly(a, K), policy=pol, workload=wl, block_size=K,
                      drafter="dspark", kv_capacity_tokens=kv, max_num_seqs=max_seqs, max_batched_tokens=128,
                      prefill_chunk_tokens=2048, rng=np.random.default_rng(0), **stop)


def test_profile_prices_the_context_term_linearly():
    p = _profile()
    # floor(M=4) -> M=1 row: 10 ms; + 101 KV tokens * 1e-5 s
    assert p.verify_time(4, 101) == pytest.approx(0.010 + 101e-5)
    # floor(M=100) -> M=64 row: 16 ms; + 100 * 1e-5
    assert p.verify_time(100, 100) == pytest.approx(0.016 + 100e-5)
    # whole step with one decoding request, K=3: + drafter(1*3 tokens -> 2 ms) + fixed 1 ms
    assert p.step_time(4, 1, "dspark", 3, 101) == pytest.approx(0.010 + 101e-5 + 0.002 + 0.001)


def test_step_price_includes_the_context_term():
    # One request, prompt 100, output 5, K=3, exactly 1 draft accepted per step (2 tokens per decode step).
    #   step 0: prefill only, M=100 -> 16 ms, kv_read 100 -> 1.00 ms, fixed 1 ms (no drafting)   = 18.00 ms
    #   step 1: 1 decode, M=1+3=4 -> 10 ms, kv_read 100+1 -> 1.01 ms, drafter 2 ms + fixed 1 ms  = 14.01 ms
    #   step 2: 1 decode, M=4 -> 10 ms, kv_read 100+3 -> 1.03 ms, + 3 ms                          = 14.03 ms
    # first token at 18 ms, 1 + 2 + 2 = 5 tokens at 18 + 14.01 + 14.03 = 46.04 ms.
    wl = Workload(prompt_tokens=np.array([100]), output_tokens=np.array([5]), domain=np.array(["chat"], dtype=object),
                  arrival_s=np.array([0.0]))
    res = _engine(wl, num_requests=1).run()
    st = res.steps
    assert st["kv_read"].tolist() == [100, 101, 103]
    assert st["M"].tolist() == [100, 4, 4]
    np.testing.assert_allclose(st["dt"], [0.018, 0.01401, 0.01403], rtol=1e-12)
    assert res.first_token_s[0] == pytest.approx(0.018)
    assert res.finish_s[0] == pytest.approx(0.04604)
    req = per_request_table(res)
    assert req["tpot_s"][0] == pytest.approx((0.04604 - 0.018) / 4)
    assert req["tau"][0] == pytest.approx(2.0)


def test_kv_fully_released_at_the_end_of_a_num_requests_run():
    # Six requests of 20 + 6 tokens, K=3: each reserves 20+6+3 = 29 KV tokens; capacity 60 holds two at once.
    n = 6
    wl = Workload(prompt_tokens=np.full(n, 20), output_tokens=np.full(n, 6),
                  domain=np.array(["chat"] * n, dtype=object), arrival_s=np.zeros(n))
    sim = _engine(wl, kv=60, max_seqs=4, num_requests=n)
    res = sim.run()
    assert res.ended_by == "all_requests_done"
    assert res.completed.all() and (res.emitted_tokens == 6).all()
    assert res.steps["n_running"].max() == 2            # 3 * 29 = 87 > 60: never three at once
    assert sim.engines[0].kv.reserved == 0                          # every reservation returned
    assert sorted(sim.engines[0].free_slots) == list(range(4))      # every slot free, none twice
    assert not sim.running and not sim.waiting
    # the log's KV use never exceeds the reservations it is bounded by
    assert res.steps["kv_used"].max() <= 2 * 29
