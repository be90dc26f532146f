"""bench_result.json: exactly the keys and meanings of `vllm bench serve --save-result --save-detailed`."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dsparksim.results.bench_json import ALL_KEYS, bench_result
from dsparksim.cli.main import main
from dsparksim.sim.cluster import SimResult

# Written out from vllm/benchmarks/serve.py (vllm-project/vllm @ 009e6d4a): main_async's setup keys, benchmark()'s
# result dict, the spec_decode_* keys, and process_one_metric for ttft,tpot,itl,e2el at --metric-percentiles 99.
VLLM_KEYS = {
    "date", "endpoint_type", "backend", "label", "model_id", "tokenizer_id", "num_prompts", "request_rate",
    "burstiness", "max_concurrency",
    "duration", "completed", "failed", "total_input_tokens", "total_output_tokens", "request_throughput",
    "request_goodput", "output_throughput", "total_token_throughput", "input_lens", "output_lens", "ttfts", "itls",
    "latencies", "start_times", "queue_times", "generated_texts", "errors", "max_output_tokens_per_s",
    "max_concurrent_requests", "rtfx",
    "spec_decode_acceptance_rate", "spec_decode_acceptance_length", "spec_decode_num_drafts",
    "spec_decode_draft_tokens", "spec_decode_accepted_tokens", "spec_decode_per_position_acceptance_rates",
    "mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "p99_ttft_ms",
    "mean_tpot_ms", "median_tpot_ms", "std_tpot_ms", "p99_tpot_ms",
    "mean_itl_ms", "median_itl_ms", "std_itl_ms", "p99_itl_ms",
    "mean_e2el_ms", "median_e2el_ms", "std_e2el_ms", "p99_e2el_ms",
}
LISTS = ("input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times", "queue_times", "generated_texts",
         "errors")


def _hand_built() -> SimResult:
    """Three requests, four steps, K=2. C arrives in the warm-up (0.1 s); A completes; B is cut off by the end."""
    nan = np.nan
    steps = {
        "t_start": np.array([0.0, 1.0, 2.0, 3.0]), "dt": np.array([1.0, 1.0, 1.0, 1.5]),
        "verify_tokens": np.array([0, 2, 4, 1]), "drafts": np.array([0, 1, 2, 1]),
        "accepted": np.array([0, 1, 3, 0]),
    }
    return SimResult(
        arrival_s=np.array([0.0, 0.2, 0.5]), admitted_s=np.array([0.0, 0.2, 0.5]),
        first_token_s=np.array([1.0, 1.0, 2.0]), finish_s=np.array([1.0, 3.0, nan]),
        prompt_tokens=np.array([7, 10, 20]), output_tokens=np.array([1, 5, 9]), emitted_tokens=np.array([1, 5, 3]),
        decode_steps=np.array([0, 2, 2]), verify_tokens=np.array([0, 3, 4]), accepted_tokens=np.array([0, 2, 2]),
        domain=np.array(["chat"] * 3), steps=steps, sim_time_s=4.5, ended_by="duration", kv_capacity_tokens=1000,
        max_batched_tokens=64, block_size=2, drafter="dspark",
        step_accepted_per_pos=np.array([[0, 0], [1, 0], [2, 1], [0, 0]]))


def test_hand_built_run_gives_vllm_values_in_closed_form():
    d = bench_result(_hand_built(), warmup_s=0.1, duration_s=4.4, model_id="m", request_rate="inf",
                     burstiness=1.0, max_concurrency=2)
    assert set(d) == VLLM_KEYS == set(ALL_KEYS)
    # Prompts = requests issued in the window (A, B); C arrived in the warm-up.
    # B was still being served when the run stopped: listed, neither completed nor failed (nothing was refused)
    assert d["num_prompts"] == 2 and d["completed"] == 1 and d["failed"] == 0
    assert d["start_times"] == [0.2, 0.5] and d["input_lens"] == [10, 20]
    assert d["output_lens"] == [5, 0]  # a failed request's output length is 0, as in vLLM
    assert d["ttfts"] == pytest.approx([0.8, 1.5])  # B received its first token before the cut
    assert d["itls"] == [[1.0, 1.0], [1.0, 1.5]]  # one chunk per step after the first token
    assert d["latencies"] == pytest.approx([2.8, 0.0])
    assert d["errors"][0] == "" and d["errors"][1].startswith("unfinished") and "3 of 9" in d["errors"][1]
    assert d["total_input_tokens"] == 10 and d["total_output_tokens"] == 5
    assert d["request_throughput"] == pytest.approx(1 / 4.4) and d["output_throughput"] == pytest.approx(5 / 4.4)
    assert d["total_token_throughput"] == pytest.approx(15 / 4.4)
    # Statistics over completed requests only, in milliseconds.
    assert d["median_ttft_ms"] == pytest.approx(800.0) and d["std_ttft_ms"] == pytest.approx(0.0)
    assert d["mean_tpot_ms"] == pytest.approx((2.8 - 0.8) / 4 * 1000)
    assert d["mean_itl_ms"] == pytest.approx(1000.0) and d["p99_itl_ms"] == pytest.approx(1000.0)
    assert d["p99_e2el_ms"] == pytest.approx(2800.0)
    assert d["max_concurrent_requests"] == 1 and d["max_output_tokens_per_s"] == 1.0
    # Spec decode counters over the window's steps: 4 drafts, 7 draft tokens, 4 accepted.
    assert d["spec_decode_num_drafts"] == 4 and d["spec_decode_draft_tokens"] == 7
    assert d["spec_decode_accepted_tokens"] == 4
    assert d["spec_decode_acceptance_rate"] == pytest.approx(100 * 4 / 7)
    assert d["spec_decode_acceptance_length"] == pytest.approx(2.0)
    assert d["spec_decode_per_position_acceptance_rates"] == pytest.approx([0.75, 0.25])


def _run(tmp_path: Path, *args: str) -> tuple[dict, dict, pd.DataFrame, pd.DataFrame]:
    out = tmp_path / "out"
    assert main(["run", *args, "--save-steps", "--quiet", "--out", str(out)]) == 0
    return (json.loads((out / "bench_result.json").read_text()), json.loads((out / "summary.json").read_text()),
            pd.read_csv(out / "requests.csv"), pd.read_csv(out / "steps.csv"))


def _check_consistent(d: dict) -> None:
    assert set(d) == VLLM_KEYS
    n = d["num_prompts"]
    for k in LISTS:
        assert len(d[k]) == n, k
    cut = sum(e.startswith(("unfinished", "not admitted")) for e in d["errors"])
    assert d["completed"] + d["failed"] + cut == n   # failed = refused; cut off by a duration: neither
    assert d["failed"] == sum(e.startswith("rejected") for e in d["errors"])
    ok = [e == "" for e in d["errors"]]
    assert sum(ok) == d["completed"]
    assert all(o == 0 for o, g in zip(d["output_lens"], ok) if not g)
    assert d["total_output_tokens"] == sum(d["output_lens"])
    assert d["total_input_tokens"] == sum(i for i, g in zip(d["input_lens"], ok) if g)
    assert d["output_throughput"] == pytest.approx(d["total_output_tokens"] / d["duration"])


def test_duration_run_lists_every_window_request_and_counts_failures(tmp_path):
    d, s, req, steps = _run(tmp_path, "--policy", "confidence", "--concurrency", "8", "--duration", "6")
    _check_consistent(d)
    win = req[req["arrival_s"] >= s["warmup_s"]].sort_values("arrival_s", kind="stable")
    # The bug this replaces: num_prompts counted every request, `completed` the window, lists all completed ones.
    assert d["num_prompts"] == len(win) and d["completed"] == int(win["completed"].sum())
    # a duration-bounded closed loop always cuts requests off at the end; they are not failed requests
    assert d["failed"] == 0 and any(e.startswith("unfinished") for e in d["errors"])
    assert d["completed"] == s["num_requests_completed"]
    assert d["duration"] == pytest.approx(s["window_s"])
    assert d["max_concurrency"] == 8 and d["request_rate"] == "inf"
    # Units: seconds in the lists, milliseconds in the statistics; same TTFT set as summary.json.
    ok = np.array([e == "" for e in d["errors"]])
    ttft = np.array(d["ttfts"])[ok]
    assert d["median_ttft_ms"] == pytest.approx(1000 * np.median(ttft), rel=1e-9)
    assert d["median_ttft_ms"] == pytest.approx(1000 * s["ttft_median_s"], rel=1e-6)
    assert d["p99_e2el_ms"] == pytest.approx(1000 * np.percentile(np.array(d["latencies"])[ok], 99), rel=1e-9)
    # One ITL per decode step of each completed request; the gaps add up to its decode time.
    done = win[win["completed"]]
    itls = [x for x, g in zip(d["itls"], ok) if g]
    assert [len(x) for x in itls] == done["decode_steps"].tolist()
    for x, r in zip(itls, done.itertuples()):
        assert sum(x) == pytest.approx(r.finish_s - r.first_token_s, rel=1e-6)  # CSV keeps 9 digits
    # Spec decode counters agree with the per-step log over the window.
    in_win = (steps["t_start"] + steps["dt"]) > s["warmup_s"]
    assert d["spec_decode_draft_tokens"] == int(steps.loc[in_win, "verify_tokens"].sum())
    rates = d["spec_decode_per_position_acceptance_rates"]
    assert len(rates) == 7 and all(a >= b for a, b in zip(rates, rates[1:]))
    assert sum(rates) * d["spec_decode_num_drafts"] == pytest.approx(d["spec_decode_accepted_tokens"])
    assert d["spec_decode_acceptance_length"] == pytest.approx(
        1 + d["spec_decode_accepted_tokens"] / d["spec_decode_num_drafts"])


def test_num_requests_run_completes_every_prompt(tmp_path):
    d, s, req, _ = _run(tmp_path, "--policy", "fixed:3", "--rate", "6", "--num-requests", "40")
    _check_consistent(d)
    assert d["num_prompts"] == 40 and d["completed"] == 40 and d["failed"] == 0
    assert d["request_rate"] == 6.0 and d["max_concurrency"] is None
    assert d["duration"] == pytest.approx(s["sim_time_s"])
    assert d["total_output_tokens"] == int(req["output_tokens"].sum())
    rates = d["spec_decode_per_position_acceptance_rates"]
    # K=7 drafted, 3 verified: positions never verified are never accepted.
    assert len(rates) == 7 and min(rates[:3]) > 0 and rates[3:] == [0.0] * 4
    assert d["spec_decode_draft_tokens"] == 3 * d["spec_decode_num_drafts"]  # fixed:3 verifies all 3 drafts
    assert not any(math.isnan(v) for k, v in d.items() if k.endswith("_ms"))


def test_itl_lists_json_items_are_json_dumps_of_each_list(tmp_path):
    import json

    from dsparksim.results.bench_json import ItlLists, write_bench_json

    rng = np.random.default_rng(3)
    dt = np.concatenate([rng.uniform(1e-4, 0.3, 500), [0.1, 1e-7, 123.456789012345678, 5e-324, 1.0, 2.5e16]])
    lo = rng.integers(0, len(dt), 300)
    hi = np.minimum(lo + rng.integers(0, 40, 300), len(dt))
    itls = ItlLists(dt, lo, hi)
    items = list(itls.json_items())
    assert items == [json.dumps(itls[i], allow_nan=False) for i in range(len(itls))]
    assert "[]" in items  # empty lists too
    write_bench_json(tmp_path / "b.json", {"a": 1, "itls": itls, "z": [0.5]})
    text = (tmp_path / "b.json").read_text()
    assert json.loads(text)["itls"] == [itls[i] for i in range(len(itls))]
    assert '"itls": [' + ", ".join(items) + "]" in text
    bad = ItlLists(np.array([0.1, np.nan]), np.array([0]), np.array([2]))
    with pytest.raises(ValueError):  # json's own refusal of NaN, as before
        list(bad.json_items())
    # a preempted prompt's own list (its missed steps merged into one gap) replaces its slice, in every path
    own = {3: [0.25, 1.5, 0.125], 7: []}
    gapped = ItlLists(dt, lo, hi, own)
    items = list(gapped.json_items())
    assert items[3] == "[0.25, 1.5, 0.125]" and items[7] == "[]" and items[4] == json.dumps(itls[4])
    assert gapped[3] == own[3] and gapped[-len(gapped) + 3] == own[3] and gapped[5] == itls[5]
    assert gapped.n_samples() == itls.n_samples() - (hi[3] - lo[3]) - (hi[7] - lo[7]) + 3
    write_bench_json(tmp_path / "g.json", {"itls": gapped})
    assert json.loads((tmp_path / "g.json").read_text())["itls"] == [gapped[i] for i in range(len(gapped))]


def test_stats_of_repeats_equal_numpys_stats_of_the_pool():
    # ITL statistics read from (step dt, samples per step): bitwise the numbers numpy gives on the pooled samples
    from dsparksim.results.bench_json import _stats, _stats_of_repeats

    rng = np.random.default_rng(11)
    for trial in range(600):
        m = int(rng.integers(1, 30))
        vals = [rng.uniform(0, 1, m), np.round(rng.uniform(0, 1, m), 1), rng.lognormal(-3, 2, m)][trial % 3]
        counts = rng.integers(0, 5, m)
        counts[int(rng.integers(m))] += 1                       # at least one sample
        pool = np.repeat(vals, counts)
        rng.shuffle(pool)
        pct = [(99,), (50, 90, 99.9), (0, 100, 25, 12.5, 99.99)][trial % 3]
        want, got = _stats("itl", pool, pct), _stats_of_repeats("itl", pool, vals, counts, pct)
        assert list(got) == list(want)
        assert [np.float64(v).tobytes() for v in got.values()] == [np.float64(v).tobytes() for v in want.values()]
    # not that sample (counts do not add up), NaN: numpy's own path, the same result
    pool = np.array([0.3, 0.1, 0.2])
    assert _stats_of_repeats("itl", pool, np.array([0.1, 0.2]), np.array([1, 1])) == _stats("itl", pool)
    nan = _stats_of_repeats("itl", np.array([0.1, np.nan]), np.array([0.1, np.nan]), np.array([1, 1]))
    assert math.isnan(nan["median_itl_ms"])


def test_a_preempted_requests_missed_steps_are_one_itl_gap_in_closed_form():
    # Six 1-s steps (dt 1, 1, 1, 1, 1, 0.5). A: first token at 1.0 (end of step 0); preempted before step 2, its
    # re-prefill streams the next token at the end of step 3; finishes at the end of step 5 (5.5). vLLM's client sees
    # chunks at 1, 2, 4, 5, 5.5: ITLs [1, 2, 1, 0.5] (not one per step: [1, 1, 1, 1, 0.5]). B is never preempted.
    nan = np.nan
    steps = {"t_start": np.array([0.0, 1.0, 2.0, 3.0, 4.0, 5.0]), "dt": np.array([1.0, 1.0, 1.0, 1.0, 1.0, 0.5]),
             "verify_tokens": np.zeros(6, np.int64), "drafts": np.zeros(6, np.int64),
             "accepted": np.zeros(6, np.int64)}
    res = SimResult(
        arrival_s=np.array([0.0, 0.0]), admitted_s=np.array([0.0, 0.0]), first_token_s=np.array([1.0, 1.0]),
        finish_s=np.array([5.5, 3.0]), prompt_tokens=np.array([4, 4]), output_tokens=np.array([5, 3]),
        emitted_tokens=np.array([5, 3]), decode_steps=np.array([3, 2]), verify_tokens=np.array([0, 0]),
        accepted_tokens=np.array([0, 0]), domain=np.array(["chat"] * 2), steps=steps, sim_time_s=6.0,
        ended_by="all_requests_done", kv_capacity_tokens=100, max_batched_tokens=64, block_size=2,
        drafter="dspark", kv_policy="paged", preemptions=np.array([1, 0]), recomputed_tokens=np.array([6, 0]),
        gap_request=np.array([0]), gap_steps=np.array([[2, 3]]))
    d = bench_result(res, warmup_s=0.0, duration_s=5.5, model_id="m", request_rate="inf", burstiness=1.0,
                     max_concurrency=2)
    assert d["itls"] == [[1.0, 2.0, 1.0, 0.5], [1.0, 1.0]]
    pool = [1.0, 2.0, 1.0, 0.5, 1.0, 1.0]
    assert d["mean_itl_ms"] == pytest.approx(1000 * np.mean(pool))
    assert d["median_itl_ms"] == pytest.approx(1000.0) and d["p99_itl_ms"] == pytest.approx(
        1000 * np.percentile(pool, 99))


def test_itl_lists_write_json_is_the_items_joined():
    # the streamed file text is exactly "[" + ", ".join(json_items()) + "]": no prompts, prompts without steps at
    # either end of the log, own (preempted) lists, and more prompts than one write holds
    import io

    from dsparksim.results.bench_json import ItlLists

    rng = np.random.default_rng(5)
    dt = rng.uniform(1e-4, 0.3, 900)
    n = 9000
    lo = rng.integers(0, len(dt), n)
    hi = np.minimum(lo + rng.integers(0, 5, n), len(dt))
    lo[:3], hi[:3] = [0, 0, len(dt)], [0, 2, len(dt)]
    for own in ({}, {0: [0.5], 1: [], 4500: [1e-9, 2.0], n - 1: [0.25]}):
        for m in (0, 1, 2, 3, 4097, n):
            itls = ItlLists(dt, lo[:m], hi[:m], {k: v for k, v in own.items() if k < m})
            f = io.BytesIO()
            itls.write_json(f)
            assert f.getvalue().decode("ascii") == "[" + ", ".join(itls.json_items()) + "]"


def test_pooled_samples_are_each_requests_slice_in_order_and_numpys_mean_and_std_bitwise():
    # the ITL pool is never built: its mean and std are summed part by part in numpy's pairwise order
    from dsparksim.results.bench_json import PooledSamples, _stats_of_repeats

    rng = np.random.default_rng(8)
    dt = rng.uniform(0, 1, 200)
    lo = rng.integers(0, 200, 50)
    hi = np.minimum(lo + rng.integers(0, 9, 50), 200)
    own = {2: [7.0, 8.0], 10: [], 99: [1.0]}    # 99: no such request, ignored
    want = np.concatenate([np.asarray(own[j]) if j in own else dt[a:b] for j, (a, b) in enumerate(zip(lo, hi))])
    assert np.array_equal(PooledSamples(dt, lo, hi, own).array(), want)
    assert PooledSamples(dt, lo[:0], hi[:0]).array().size == 0
    for trial in range(40):
        n_steps, n_req = int(rng.integers(1, 3000)), int(rng.integers(1, 400))
        dt = rng.lognormal(-3, 2, n_steps) * [1, 1e-6, 1e6][trial % 3]
        lo = rng.integers(0, n_steps, n_req)
        hi = np.minimum(lo + rng.integers(0, 2 * n_steps, n_req), n_steps)
        pool = PooledSamples(dt, lo, hi, {int(rng.integers(n_req)): rng.uniform(0, 1, 30).tolist()})
        if trial % 4:
            pool.CHUNK = int(rng.integers(8, 3000))       # many parts: the pairwise split exercised
        a = pool.array()
        assert pool.size == a.size
        got = pool.mean_std()
        assert [np.float64(v).tobytes() for v in got] == [np.float64(v).tobytes() for v in (a.mean(), a.std())]
    dt = rng.lognormal(-3, 2, 1001)
    big = PooledSamples(dt, rng.integers(0, 3, 600), rng.integers(998, 1002, 600))   # default CHUNK: ~9 parts
    assert big.size > 8 * PooledSamples.CHUNK
    assert big.mean_std() == (float(big.array().mean()), float(big.array().std()))
    vals, counts = np.unique(big.array(), return_counts=True)
    assert _stats_of_repeats("itl", big, vals, counts) == _stats_of_repeats("itl", big.array(), vals, counts)


def test_clean_list_is_clean_of_each_item():
    from dsparksim.results.metrics import _clean, _clean_list

    cases = [[], [1, 2, 3], ["", "x"], [0.5, 1e300, -0.0], [0.5, float("nan"), 2.0], [1, "a", 0.5],
             [np.float64(0.5), np.int64(3), np.bool_(True)], [True, 2, None], [{"a": np.nan}, [np.nan]]]
    for v in cases:
        got, want = _clean_list(v), [_clean(x) for x in v]
        assert got == want and [type(x) for x in got] == [type(x) for x in want] and got is not v
