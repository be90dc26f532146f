"""An independent audit of the figures `dsparksim run` publishes: every summary.json and bench_result.json number
recomputed from the raw requests.csv / steps.csv with short code written from the definitions (docs/outputs.md and
vLLM's vllm/benchmarks/serve.py `calculate_metrics`), never by calling dsparksim's metric code.

Configurations: closed and open loop, a warm-up, requests rejected on arrival, preemptions (paged KV tight),
several replicas, the policies none / mtp1 / fixed / confidence / oracle, a run cut at its horizon with unfinished
requests, a --num-requests run, --num-warmup-prompts, no request in the window, one request, and one-token
outputs (no TPOT).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dsparksim.cli.main import main

RUNS = {
    "closed": ["--policy", "confidence", "--concurrency", "6", "--duration", "6"],
    "open_warmup": ["--policy", "fixed:3", "--rate", "5", "--duration", "8", "--warmup", "3"],
    "rejected": ["--policy", "oracle", "--concurrency", "8", "--duration", "6", "--kv-capacity", "6000",
                 "--dataset-name", "random", "--random-input-len", "7000", "--random-output-len", "64",
                 "--random-range-ratio", "0.5"],
    "preempt": ["--policy", "confidence", "--concurrency", "32", "--duration", "6", "--kv-capacity", "20000"],
    "replicas": ["--policy", "none", "--concurrency", "8", "--replicas", "3", "--duration", "5"],
    "num_requests": ["--policy", "mtp1", "--num-requests", "20", "--rate", "8"],
    "zero_finished": ["--policy", "confidence", "--rate", "0.05", "--duration", "5"],   # one request, in the warm-up
    "one_request": ["--policy", "confidence", "--num-requests", "1", "--rate", "1"],
    "warmup_prompts": ["--policy", "confidence", "--num-prompts", "12", "--num-warmup-prompts", "3",
                       "--max-concurrency", "3"],
    "one_token": ["--policy", "fixed:7", "--concurrency", "3", "--duration", "3", "--dataset-name", "random",
                  "--random-input-len", "50", "--random-output-len", "1"],
}


@pytest.fixture(scope="module", params=sorted(RUNS))
def run(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(request.param) / "out"
    gaps = _gap_record(lambda: main(["run", *RUNS[request.param], "--save-steps", "--quiet", "--out", str(out)]))
    text = {f: (out / f).read_text() for f in ("summary.json", "bench_result.json")}
    return (request.param, text, json.loads(text["summary.json"]), json.loads(text["bench_result.json"]),
            pd.read_csv(out / "requests.csv"), pd.read_csv(out / "steps.csv"), gaps)


def _gap_record(call):
    """Run ``call`` (a `dsparksim run` exiting 0) and return the engine's raw preemption record no file shows:
    per preemption resumed by a re-prefill, [first step the request sat out, step whose end streamed its next
    token] (-1: never resumed), as rows of steps.csv. A spy on the result handed to the summary, not its metrics."""
    import dsparksim.sim.simulate as simulate

    seen = []
    real = simulate.summarize

    def spy(res, **kw):
        seen.append(np.zeros((0, 2), np.int64) if res.gap_steps is None else np.asarray(res.gap_steps).copy())
        return real(res, **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(simulate, "summarize", spy)
        assert call() == 0
    assert len(seen) == 1, len(seen)       # one summary per run (a cluster's per-replica ones go through metrics)
    return seen[0].reshape(-1, 2)


def _same(mine, published, rel=1e-6):
    if mine is None or (isinstance(mine, float) and math.isnan(mine)):
        return published is None
    return published is not None and abs(mine - published) <= 1e-12 + rel * abs(mine)


def _pct(x, q):
    return float(np.percentile(x, q)) if len(x) else None


def _mean(x):
    return float(np.mean(x)) if len(x) else None


def test_json_is_strict_no_nan_or_infinity(run):
    _, text, *_ = run
    for name, t in text.items():
        json.loads(t, parse_constant=lambda c: pytest.fail(f"{name}: {c} is not valid JSON"))


def test_summary_figures_equal_an_independent_recomputation(run):
    name, _, s, _, req, st, gaps = run
    w, end = s["warmup_s"], s["sim_time_s"]
    window = end - w
    bad = {}

    def check(key, mine):
        if not _same(mine, s[key]):
            bad[key] = (mine, s[key])

    check("window_s", window)
    t_end = st["t_start"] + st["dt"]
    inside = ((t_end - w) / st["dt"]).clip(0, 1)          # a step straddling the warm-up counts pro rata
    check("output_throughput_tok_s", float((st["emitted"] * inside).sum()) / window)
    done = req[req["completed"].astype(bool) & _measured(s, req)]
    check("num_requests_completed", len(done))
    check("num_requests_rejected", int(req["rejected"].sum()))
    check("request_throughput_req_s", len(done) / window)
    ttft = (done["first_token_s"] - done["arrival_s"]).to_numpy()
    e2e = (done["finish_s"] - done["arrival_s"]).to_numpy()
    after_first = done["output_tokens"].to_numpy() - 1
    decode = (done["finish_s"] - done["first_token_s"]).to_numpy()
    multi = after_first > 0                                # TPOT excludes the first token: undefined for one
    tpot = decode[multi] / after_first[multi]
    speed = after_first[multi & (decode > 0)] / decode[multi & (decode > 0)]
    for key, x in (("ttft", ttft), ("tpot", tpot), ("e2e", e2e)):
        check(f"{key}_mean_s", _mean(x))
        for q, p in (("median", 50), ("p10", 10), ("p90", 90), ("p99", 99)):
            check(f"{key}_{q}_s", _pct(x, p))
    check("tps_user_mean", _mean(speed))
    for key, q in (("median", 50), ("p10", 10), ("p90", 90), ("p99", 99)):
        check(f"tps_user_{key}", _pct(speed, q))
    win = t_end > w
    n_dec = st["n_decode"][win].sum()
    check("mean_verify_len", st["verify_tokens"][win].sum() / n_dec if n_dec else None)
    check("tau", st["decode_emitted"][win].sum() / n_dec if n_dec else None)
    check("mean_running", _mean(st["n_running"][win]))
    check("mean_batch_tokens", _mean(st["M"][win]))
    # the summary's ITL pool: each window step's dt once per request decoding in it, and one sample per preemption
    # resumed in a window step: the client's wait from its last chunk (the start of the first step it sat out) to
    # the re-prefill's chunk (that step's end) -- the record of which steps those were is the engine's (_gap_record)
    pool = np.repeat(st["dt"][win].to_numpy(), st["n_decode"][win].to_numpy())
    t_end_a, t_start_a, win_a = t_end.to_numpy(), st["t_start"].to_numpy(), win.to_numpy()
    pool = np.concatenate([pool, [t_end_a[q] - t_start_a[p] for p, q in gaps.tolist() if q >= 0 and win_a[q]]])
    check("itl_mean_s", _mean(pool))
    for q, p in (("median", 50), ("p10", 10), ("p90", 90), ("p99", 99)):
        check(f"itl_{q}_s", _pct(pool, p))
    assert not bad, f"{name}: (recomputed, published): {bad}"
    assert int(st["emitted"].sum()) == int(req["emitted_tokens"].sum())   # the step log and the requests agree
    # requests.csv's own per-request columns (s, tok/s): NaN where undefined (one token, not finished); to the
    # rounding of the file's times (9 significant digits: a difference of two is off by ~1e-9 x the run's length)
    n1 = req["output_tokens"] - 1
    dec = req["finish_s"] - req["first_token_s"]
    for col, want in (("ttft_s", req["first_token_s"] - req["arrival_s"]), ("e2e_s", req["finish_s"] - req["arrival_s"]),
                      ("tpot_s", (dec / n1).where(n1 > 0)), ("tps_user", (n1 / dec).where((n1 > 0) & (dec > 0))),
                      ("mean_verify_len", (req["verify_tokens"] / req["decode_steps"]).where(req["decode_steps"] > 0))):
        np.testing.assert_allclose(req[col].to_numpy(float), want.to_numpy(float), rtol=1e-5,
                                   atol=1e-8 * max(1.0, end),
                                   err_msg=f"{name}: requests.csv {col}")


def _measured(s, req):
    """The window's requests (arrived at or after the warm-up): requests.csv's ``measured`` flag, checked against
    arrival_s >= warmup_s wherever the files' rounding (requests.csv %.9g, summary.json 10 digits) cannot tie them
    (a --num-warmup-prompts run issues its prompts exactly at the warm-up's end)."""
    m = req["measured"].astype(bool)
    clear = (req["arrival_s"] - s["warmup_s"]).abs() > 1e-6 * max(1.0, s["warmup_s"])
    assert (m[clear] == (req["arrival_s"] >= s["warmup_s"])[clear]).all()
    return m


def _bench_prompts(s, req):
    p = req[_measured(s, req)].sort_values("arrival_s", kind="stable")
    return p, p["finish_s"].notna().to_numpy()


def test_bench_result_equals_vllm_definitions_recomputed(run):
    name, _, s, b, req, st, _ = run
    p, ok = _bench_prompts(s, req)
    dur = s["window_s"]
    bad = {}

    def check(key, mine):
        if not _same(mine, b[key]):
            bad[key] = (mine, b[key])

    check("num_prompts", len(p))
    check("completed", int(ok.sum()))
    check("failed", int(p["rejected"].sum()))
    check("duration", dur)
    out_tok, in_tok = int(p["output_tokens"][ok].sum()), int(p["prompt_tokens"][ok].sum())
    check("total_output_tokens", out_tok)
    check("total_input_tokens", in_tok)
    check("output_throughput", out_tok / dur)
    check("request_throughput", ok.sum() / dur)
    check("total_token_throughput", (in_tok + out_tok) / dur)
    ttft = (p["first_token_s"] - p["arrival_s"]).to_numpy()[ok]
    lat = (p["finish_s"] - p["arrival_s"]).to_numpy()[ok]
    n_out = p["output_tokens"].to_numpy()[ok]
    tpot = (lat - ttft)[n_out > 1] / (n_out[n_out > 1] - 1)
    itl = [x for j in np.flatnonzero(ok) for x in b["itls"][j]]
    for m, x in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2el", lat)):
        check(f"mean_{m}_ms", _mean(x) * 1000 if len(x) else None)
        check(f"median_{m}_ms", _pct(x, 50) * 1000 if len(x) else None)
        check(f"std_{m}_ms", float(np.std(x)) * 1000 if len(x) else None)
        check(f"p99_{m}_ms", _pct(x, 99) * 1000 if len(x) else None)
    win = st["t_start"] + st["dt"] > s["warmup_s"]
    verified, accepted, drafts = (int(st[c][win].sum()) for c in ("verify_tokens", "accepted", "drafts"))
    if verified:
        check("spec_decode_acceptance_rate", 100 * accepted / verified)
        check("spec_decode_acceptance_length", 1 + accepted / drafts)
        check("spec_decode_num_drafts", drafts)
    assert not bad, f"{name}: (recomputed, published): {bad}"
    # each completed request's ITLs add up to its decode time (first token to finish)
    for j in np.flatnonzero(ok):
        r = p.iloc[j]
        assert sum(b["itls"][j]) == pytest.approx(r["finish_s"] - r["first_token_s"], rel=1e-6, abs=1e-9)


def test_one_itl_per_streamed_chunk_after_the_first(run):
    """vLLM's ITLs are the gaps between a request's streamed chunks: one per decode step, plus one per re-prefill
    after a preemption (its forward streams the next token; the steps the request sat out are one gap, not one
    sample each)."""
    name, _, s, b, req, _, _ = run
    p, ok = _bench_prompts(s, req)
    for j in np.flatnonzero(ok):
        r = p.iloc[j]
        decode_emitted = round(r["tau"] * r["decode_steps"]) if r["decode_steps"] else 0
        resumed = int(r["output_tokens"]) - 1 - decode_emitted       # tokens streamed by re-prefills
        assert 0 <= resumed <= r.get("preemptions", 0)
        assert len(b["itls"][j]) == r["decode_steps"] + resumed, (name, int(r["request_id"]))
    if name == "preempt":   # the configuration exercises it
        assert (p["preemptions"].to_numpy()[ok] > 0).sum() >= 2


def _vllm_peaks(b):
    """vLLM's calculate_metrics: 1-second buckets from the earliest send of a successful request; a token in the
    bucket of start + ttft (+ cumulative ITLs), a request in every bucket from int(start) to int(start + latency)."""
    ok = [i for i, e in enumerate(b["errors"]) if e == ""]
    if not ok:
        return 0.0, 0
    start = [b["start_times"][i] for i in ok]
    lat = [b["latencies"][i] for i in ok]
    t0 = min(start)
    n = int(np.ceil(max(s + x for s, x in zip(start, lat)) - t0)) + 1
    tokens, conc = np.zeros(n), np.zeros(n)
    for i, s, x in zip(ok, start, lat):
        t = s + b["ttfts"][i]
        times = [t]
        for gap in b["itls"][i]:
            t += gap
            times.append(t)
        for t in times:
            if 0 <= int(t - t0) < n:
                tokens[int(t - t0)] += 1
        for sec in range(int(s - t0), int(s + x - t0) + 1):
            conc[sec] += 1
    return float(tokens.max()), int(conc.max())


def test_bench_peaks_are_vllms_one_second_buckets(run):
    name, _, _, b, _, _, _ = run
    tok, conc = _vllm_peaks(b)
    assert b["max_output_tokens_per_s"] == tok, name
    assert b["max_concurrent_requests"] == conc, name


def test_each_configuration_exercises_what_it_is_named_for(run):
    name, _, s, b, req, _, _ = run
    expect = {
        "rejected": lambda: s["num_requests_rejected"] >= 1 and b["failed"] >= 1,
        "preempt": lambda: s["num_preemptions"] >= 2,
        "replicas": lambda: s["replicas"] == 3 and len(s["per_replica"]) == 3,
        "one_token": lambda: s["tpot_median_s"] is None and b["median_tpot_ms"] is None and s["num_requests_completed"],
        "zero_finished": lambda: s["num_requests_completed"] == 0 and b["completed"] == 0,
        "closed": lambda: s["ended_by"] == "duration" and any(e.startswith("unfinished") for e in b["errors"]),
        "warmup_prompts": lambda: b["num_prompts"] == 12 and s["warmup_s"] > 0,
        "open_warmup": lambda: s["warmup_s"] == 3 and (req["arrival_s"] < 3).any(),
    }
    assert expect.get(name, lambda: True)(), name


# ------------------------------------------------------------------ frontier: Pareto sets, gains, seed intervals
X, Y = "output_throughput_tok_s", "tps_user_median"


def _pareto(g):
    """Rows of ``g`` no other unsaturated row beats on both axes (one strictly); saturated rows never count."""
    ok = ~g["saturated"].astype(bool).to_numpy() & g[X].notna().to_numpy() & g[Y].notna().to_numpy()
    x, y = g[X].to_numpy(float), g[Y].to_numpy(float)
    keep = [ok[i] and not any(ok[j] and x[j] >= x[i] and y[j] >= y[i] and (x[j] > x[i] or y[j] > y[i])
                              for j in range(len(g))) for i in range(len(g))]
    return g[np.array(keep, bool)]


def _gains(df, policy, baseline, slo):
    """Mean gain over 64 evenly spaced points of the overlap (per-user speed at matched throughput, throughput at
    matched per-user speed), and the throughput gain at the per-user speed ``slo``: linear interpolation."""
    a, b = _pareto(df[df["policy"] == policy]), _pareto(df[df["policy"] == baseline])

    def mean_gain(xa, ya, xb, yb):
        lo, hi = max(xa.min(), xb.min()), min(xa.max(), xb.max())
        if hi < lo:
            return math.nan
        grid = np.linspace(lo, hi, 64)
        return float(np.mean(np.interp(grid, xa, ya) / np.interp(grid, xb, yb) - 1))
    a_x, b_x = a.sort_values(X), b.sort_values(X)
    a_y, b_y = a.sort_values(Y), b.sort_values(Y)
    at_slo = math.nan
    if a[Y].min() <= slo <= a[Y].max() and b[Y].min() <= slo <= b[Y].max():
        at_slo = float(np.interp(slo, a_y[Y], a_y[X]) / np.interp(slo, b_y[Y], b_y[X]) - 1)
    return {"tps_user_gain_at_matched_throughput": mean_gain(a_x[X].to_numpy(), a_x[Y].to_numpy(),
                                                             b_x[X].to_numpy(), b_x[Y].to_numpy()),
            "throughput_gain_at_matched_slo": mean_gain(a_y[Y].to_numpy(), a_y[X].to_numpy(),
                                                        b_y[Y].to_numpy(), b_y[X].to_numpy()),
            f"throughput_gain_at_slo:{slo:g}": at_slo}


def _t95(v):
    from scipy.stats import t   # lazy: scipy, only this test's interval
    v = np.asarray(v, float)
    h = t.ppf(0.975, len(v) - 1) * v.std(ddof=1) / math.sqrt(len(v))
    return v.mean() - h, v.mean() + h


def test_frontier_pareto_gains_and_paired_seed_intervals_recomputed(tmp_path):
    out = tmp_path / "fr"
    assert main(["frontier", "--policies", "mtp1,confidence", "--concurrency-levels", "2,8,32", "--duration", "4",
                 "--seeds", "3", "--slo", "tps_user_median>=200", "--backend", "serial", "--quiet",
                 "--out", str(out)]) == 0
    per, mean = pd.read_csv(out / "frontier_seeds.csv"), pd.read_csv(out / "frontier.csv")
    comp = pd.read_csv(out / "comparison.csv")
    for _, r in mean.iterrows():                      # each cell: mean over its 3 seeds and their t-interval
        v = per[(per["policy"] == r["policy"]) & (per["load"] == r["load"])][X]
        lo, hi = _t95(v)
        assert r[X] == pytest.approx(v.mean(), rel=1e-8) and r["n_seeds"] == 3
        assert r[f"{X}_lo"] == pytest.approx(max(lo, 0.0), rel=1e-6) and r[f"{X}_hi"] == pytest.approx(hi, rel=1e-6)
    for s, g in per.groupby("seed"):                  # Pareto flags per policy and seed
        for _, gp in g.groupby("policy"):
            assert set(_pareto(gp).index) == set(gp.index[gp["pareto"].astype(bool)]), s
    per_seed = [_gains(per[per["seed"] == s], "confidence", "mtp1", 200.0) for s in sorted(per["seed"].unique())]
    of_means = _gains(mean, "confidence", "mtp1", 200.0)
    assert sorted(comp["metric"]) == sorted(of_means) and comp["gain_lo"].notna().all()
    for _, r in comp.iterrows():                      # gains of the mean frontiers; paired per-seed intervals
        g = [p[r["metric"]] for p in per_seed]
        assert r["gain_mean"] == pytest.approx(of_means[r["metric"]], rel=1e-6)
        assert r["gain_seed_mean"] == pytest.approx(np.mean(g), rel=1e-6)
        lo, hi = _t95(g)
        assert (r["gain_lo"], r["gain_hi"]) == pytest.approx((lo, hi), rel=1e-6)
