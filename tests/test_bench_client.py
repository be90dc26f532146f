"""The benchmark client simulated as it runs (dsparksim.bench.client): closed-form checks of its semantics."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from dsparksim.bench.client import (ClientWorkload, ServerSettings, client_arrivals, random_lengths, run_client,
                                    server_kv_capacity)
from dsparksim.cost.profile import load_profile
from dsparksim.errors import ConfigError
from dsparksim.sim.scheduler import reprice_steps
from sim_kit import make_sim  # noqa: E402

SMALL = "h100-llama2-7b-tp1"      # fast: short steps, many requests per second
MOE = "built-h200x8-deepseek-v3-tp8"   # long-context (query-key) and prefill terms


def test_random_lengths_bounds_and_uniformity():
    rng = np.random.default_rng(123)
    L, R, n = 1000, 0.8, 60_000
    x = random_lengths(L, R, n, rng)
    assert x.min() == 800 and x.max() == 1000          # [int(R*L), L], both ends reached
    # chi-square against the discrete uniform over the 201 values (fixed seed; 5% level)
    counts = np.bincount(x - 800, minlength=201)
    assert stats.chisquare(counts).pvalue > 0.05
    # R = 0 never draws a zero length; R = 1 is the fixed length
    assert random_lengths(7, 0.0, 5000, rng).min() == 1
    assert set(random_lengths(7, 1.0, 100, rng)) == {7}


def test_arrivals_inf_and_rate():
    rng = np.random.default_rng(0)
    assert not client_arrivals(ClientWorkload(8, 8, num_prompts=5), 5, rng).any()
    t = client_arrivals(ClientWorkload(8, 8, request_rate=4.0), 20_000, rng)
    assert t[0] == 0 and (np.diff(t) >= 0).all()
    gaps = np.diff(t)
    assert abs(gaps.mean() - 0.25) < 0.25 * 0.03                  # ~1% standard error; 3% bound
    assert abs(gaps.std() / gaps.mean() - 1.0) < 0.03             # Poisson: CV 1


def _in_flight_max(req) -> int:
    """Most measured requests sent and not finished at any instant (from the per-request times)."""
    ev = np.concatenate([np.c_[req["arrival_s"], np.ones(len(req))], np.c_[req["finish_s"], -np.ones(len(req))]])
    ev = ev[np.lexsort((ev[:, 1], ev[:, 0]))]   # a finish before a send at the same instant (slot freed first)
    return int(np.cumsum(ev[:, 1]).max())


@pytest.mark.parametrize("rate", [math.inf, 50.0])
def test_cap_never_exceeded_and_reached(rate):
    w = ClientWorkload(200, 60, 0.5, num_prompts=120, max_concurrency=8, request_rate=rate, num_warmup_prompts=5)
    run = run_client(SMALL, w, seed=3)
    assert run.metrics["completed"] == 120 and run.metrics["failed"] == 0
    st = run.steps
    # every request in the engine (running or queued) is in flight at the client
    assert (st["n_running"] + st["n_waiting"]).max() <= 8
    assert st["n_running"].max() == 8           # the cap binds (so the check above could fail)
    assert _in_flight_max(run.requests) == 8


def test_uncapped_rate_inf_sends_everything_at_once():
    run = run_client(SMALL, ClientWorkload(64, 16, num_prompts=30), seed=1)
    assert not run.requests["arrival_s"].any()
    assert _in_flight_max(run.requests) == 30


def test_warmup_excluded_from_metrics_and_duration():
    base = ClientWorkload(300, 40, 0.8, num_prompts=40, max_concurrency=6)
    a = run_client(SMALL, base, seed=5)
    b = run_client(SMALL, ClientWorkload(300, 40, 0.8, num_prompts=40, max_concurrency=6, num_warmup_prompts=12),
                   seed=5)
    # the server is empty when the benchmark starts, so the measured run is the same with or without warm-up
    assert b.notes["benchmark_start_s"] > 0
    assert len(b.requests) == 40
    assert b.metrics == pytest.approx(a.metrics, rel=1e-9)   # times shifted by the start: last bits only
    assert (b.requests["arrival_s"] >= 0).all()
    w = b.steps[b.steps["warmup"]]
    assert len(w) and (w["t_end"] <= 0).all() and (b.steps.loc[~b.steps["warmup"], "t_start"] >= 0).all()
    assert b.metrics["duration_s"] == b.requests["finish_s"].max()


def test_tpot_and_throughput_definitions():
    run = run_client(SMALL, ClientWorkload(128, 32, 0.0, num_prompts=60, max_concurrency=10), seed=2)
    r, m = run.requests, run.metrics
    assert (r["output_len"] == 1).any()              # R = 0 draws some one-token outputs: no TPOT for them
    two = r["output_len"] > 1
    tpot = ((r["finish_s"] - r["first_token_s"]) / (r["output_len"] - 1) * 1e3)[two]
    assert r.loc[~two, "tpot_ms"].isna().all()
    assert m["mean_tpot_ms"] == pytest.approx(tpot.mean(), rel=1e-12)
    assert m["median_tpot_ms"] == pytest.approx(np.median(tpot), rel=1e-12)
    assert m["p99_tpot_ms"] == pytest.approx(np.percentile(tpot, 99), rel=1e-12)
    assert m["mean_ttft_ms"] == pytest.approx(((r["first_token_s"] - r["arrival_s"]) * 1e3).mean(), rel=1e-12)
    assert m["duration_s"] == r["finish_s"].max()
    assert m["output_throughput"] == pytest.approx(r["output_len"].sum() / m["duration_s"], rel=1e-12)
    run8 = run_client(SMALL, ClientWorkload(128, 32, 0.0, num_prompts=60, max_concurrency=10),
                      ServerSettings(gpus=8), seed=2)
    assert run8.metrics["output_throughput_per_gpu"] == pytest.approx(m["output_throughput"] / 8, rel=1e-12)


def test_request_latency_is_added_to_ttft_and_e2e_not_tpot_nor_the_engine():
    """The profile's request_latency_s (outside the step loop): +d on every TTFT and E2E and on the duration,
    TPOT and the engine's steps unchanged (a closed-loop client's next request reaches the engine at the finish)."""
    import dataclasses
    wl = ClientWorkload(128, 32, 0.5, num_prompts=40, max_concurrency=6, num_warmup_prompts=4)
    prof = load_profile(SMALL)
    a = run_client(prof, wl, seed=3)
    b = run_client(dataclasses.replace(prof, request_latency_s=0.05), wl, seed=3)
    assert np.array_equal(a.steps["dt"], b.steps["dt"]) and np.array_equal(a.requests["finish_s"],
                                                                            b.requests["finish_s"])
    np.testing.assert_allclose(b.requests["ttft_ms"], a.requests["ttft_ms"] + 50.0, rtol=0, atol=1e-9)
    np.testing.assert_allclose(b.requests["e2el_ms"], a.requests["e2el_ms"] + 50.0, rtol=0, atol=1e-9)
    np.testing.assert_allclose(b.requests["tpot_ms"], a.requests["tpot_ms"], rtol=1e-9)
    assert b.metrics["duration_s"] == pytest.approx(a.metrics["duration_s"] + 0.05, rel=1e-12)
    from dsparksim.cost.profile import profile_from_dict, profile_to_dict
    from dsparksim.errors import InputError
    d = profile_to_dict(dataclasses.replace(prof, request_latency_s=0.05))
    assert d["request_latency_s"] == 0.05 and profile_from_dict(d).request_latency_s == 0.05
    assert "request_latency_s" not in profile_to_dict(prof)          # absent = 0: older profiles unchanged
    with pytest.raises(InputError, match="request_latency_s"):
        profile_from_dict({**d, "request_latency_s": -0.01})


def test_step_indices_point_at_the_steps():
    run = run_client(SMALL, ClientWorkload(256, 24, 0.5, num_prompts=30, max_concurrency=4, num_warmup_prompts=3),
                     seed=4)
    r, st = run.requests, run.steps
    t_end, t_start = st["t_end"].to_numpy(), st["t_start"].to_numpy()
    assert np.array_equal(t_end[r["finish_step"]], r["finish_s"].to_numpy())
    assert np.array_equal(t_end[r["first_token_step"]], r["first_token_s"].to_numpy())
    a = r["arrival_step"].to_numpy()
    assert (a >= -1).all()
    assert (t_start[a[a >= 0]] < r["arrival_s"].to_numpy()[a >= 0]).all()
    nxt = a + 1
    assert (t_start[nxt] >= r["arrival_s"].to_numpy()).all()


@pytest.mark.parametrize("profile,policy,chunk", [(SMALL, "confidence", 512), (MOE, "fixed:3", 4096),
                                                  (MOE, "none", 32768)])
def test_repricing_the_logged_shapes_reproduces_dt(profile, policy, chunk):
    prof = load_profile(profile)
    run = run_client(prof, ClientWorkload(3000, 20, 0.5, num_prompts=24, max_concurrency=12),
                     ServerSettings(chunked_prefill_size=chunk), policy=policy, seed=0)
    st = run.steps
    assert (st["prefill_chunks"] > 1).any() or chunk < 3000      # multi-chunk or split prompts are exercised
    assert (st["n_prefill_tokens"] > 0).any() and (st["n_decode"] > 0).any()
    t = reprice_steps(prof, st, run.notes["drafter"], run.notes["block_size"], run.notes["max_batched_tokens"])
    assert np.array_equal(t, st["dt"].to_numpy())                  # bit for bit
    # and the shape matters: dropping the prefill query-keys changes the price of the prefill steps
    if getattr(prof, "prefill_note", None) is not None:
        t2 = reprice_steps(prof, st.assign(prefill_qk=0), run.notes["drafter"], run.notes["block_size"])
        assert not np.array_equal(t2, t)


def test_capped_client_at_rate_inf_is_the_closed_loop():
    """A closed loop of c users over N requests is the client at rate inf with cap c: identical steps."""
    from dsparksim.acceptance.nodraft import NoDraftAcceptance
    from dsparksim.policies import make_policy
    from dsparksim.sim.streams import RequestStreams
    from dsparksim.traffic.base import Workload

    prof = load_profile(SMALL)
    rng = np.random.default_rng(9)
    p, o = rng.integers(50, 400, 80), rng.integers(5, 60, 80)
    dom = np.full(80, "chat", dtype=object)
    out = []
    for closed in (True, False):
        wl = Workload(p, o, dom, concurrency=7) if closed else Workload(p, o, dom, arrival_s=np.zeros(80))
        pol = make_policy("none")
        pol.reset(0, np.random.default_rng(0))
        sim = make_sim(profile=prof, acceptance=NoDraftAcceptance(), policy=pol, workload=wl, block_size=0,
                         drafter=None, kv_capacity_tokens=100_000, max_num_seqs=256, max_batched_tokens=4096,
                         prefill_chunk_tokens=512, streams=RequestStreams(np.random.SeedSequence(1)),
                         num_requests=80, client_cap=None if closed else 7)
        out.append(sim.run())
    a, b = out
    assert np.array_equal(a.steps["dt"], b.steps["dt"]) and np.array_equal(a.finish_s, b.finish_s)
    assert np.array_equal(a.arrival_s, b.arrival_s)


def test_server_settings_shape_the_run():
    w = ClientWorkload(2000, 16, 1.0, num_prompts=16)
    a = run_client(SMALL, w, ServerSettings(chunked_prefill_size=256, max_running_requests=4), seed=0)
    assert a.steps["n_running"].max() <= 4 and a.steps["n_prefill_tokens"].max() <= 256
    assert a.notes["max_num_seqs"] == 4 and a.notes["prefill_chunk_tokens"] == 256
    b = run_client(SMALL, w, ServerSettings(cuda_graph_max_bs=8), seed=0)
    assert "not priced" in b.notes["cuda_graph_max_bs"]


def test_mem_fraction_static():
    prof = load_profile(MOE)
    lo, _ = server_kv_capacity(prof, 0.7)
    hi, how = server_kv_capacity(prof, 0.82)
    per_tok = prof.metadata["build"]["memory"]["kv_bytes_per_token_per_gpu"]
    # 12% of 141 GiB more memory is that many more KV tokens (the weights cancel)
    assert hi - lo == pytest.approx(0.12 * 141 * 2**30 / per_tok, abs=2)
    assert "mem_fraction_static" in how
    with pytest.raises(ConfigError, match="metadata.build.memory.weights_GiB_per_gpu"):
        server_kv_capacity(load_profile(SMALL), 0.8)
    with pytest.raises(ConfigError, match="mem_fraction_static"):
        server_kv_capacity(prof, 0.5)    # less than the weights


@pytest.mark.parametrize("kw,field", [({"random_range_ratio": 1.5}, "random_range_ratio"),
                                      ({"num_prompts": 0}, "num_prompts"), ({"max_concurrency": 0}, "max_concurrency"),
                                      ({"request_rate": 0.0}, "request_rate"), ({"ignore_eos": False}, "ignore_eos"),
                                      ({"dataset_name": "sharegpt"}, "dataset_name"),
                                      ({"burstiness": 0.5}, "burstiness")])
def test_bad_workloads_refused(kw, field):
    with pytest.raises(ConfigError, match=field):
        ClientWorkload(128, 16, **kw)
