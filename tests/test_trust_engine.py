"""Issue 14, simulation semantics: request streams keyed per request (a cell never depends on its bystanders),
bounded memory, rejection of unservable requests on arrival, and the saturation flag from queueing."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dsparksim.sim import cluster as engine_mod
from dsparksim.acceptance.base import AcceptanceModel, Block
from dsparksim.cli.main import main
from dsparksim.config import RunConfig
from dsparksim.sim.cluster import SimResult, Simulation
from dsparksim.errors import ConfigError
from dsparksim.results.metrics import per_request_table, saturation, summarize
from dsparksim.policies import make_policy
from dsparksim.sim.simulate import simulate
from dsparksim.traffic import TrafficConfig, build_workload
from dsparksim.traffic.base import Workload
from sim_kit import make_sim  # noqa: E402
from stand_in_profile import stand_in_profile


# ------------------------------------------------------------------ small stand-ins (closed-form engine)
def FlatProfile(c: float = 0.01, max_tokens: int = 4096):
    """verify_time = c for every M, no drafting cost, no overhead."""
    return stand_in_profile(lambda M: np.full(M.shape, c), max_tokens, drafters=("dspark",))


class RejectAll(AcceptanceModel):
    """Nothing accepted: every decode step emits exactly one token per request."""

    drafter = "dspark"

    def __init__(self, K: int = 1):
        self.K, self.metadata = K, {"source": "test"}

    def start(self, slots, domains, rng):
        pass

    def draw(self, slots, rng):
        n = len(slots)
        return Block(conf=np.zeros((n, self.K)), accepted=np.zeros(n, np.int64))


def _sim(wl, *, duration=None, num_requests=None, kv=10**9, max_seqs=4, max_model_len=None, c=0.01) -> Simulation:
    pol = make_policy("fixed:1")
    pol.reset(1, np.random.default_rng(0))
    return make_sim(profile=FlatProfile(c), acceptance=RejectAll(), policy=pol, workload=wl, block_size=1,
                      drafter="dspark", kv_capacity_tokens=kv, max_num_seqs=max_seqs, max_batched_tokens=4096,
                      prefill_chunk_tokens=4096, rng=np.random.default_rng(0), duration_s=duration,
                      num_requests=num_requests, max_model_len=max_model_len)


def _wl(prompt, out, arrival=None, users=None) -> Workload:
    n = len(prompt)
    return Workload(prompt_tokens=np.asarray(prompt, np.int64), output_tokens=np.asarray(out, np.int64),
                    domain=np.full(n, "chat", dtype=object), arrival_s=None if arrival is None else
                    np.asarray(arrival, float), concurrency=users)


def _summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


# ------------------------------------------------------------------ defect 5: request streams, bystanders
def test_frontier_cell_equals_run_whatever_the_other_load_levels(tmp_path):
    # Old code: the closed-loop pool was sized from max(loads), so 8 users saw other requests next to 1,8,32.
    common = ["--duration", "4", "--seed", "3", "--quiet"]
    rows = []
    for levels in ("1,8", "1,8,32"):
        out = tmp_path / levels
        assert main(["frontier", "--policies", "confidence", "--baseline", "confidence", "--concurrency-levels", levels,
                     "--jobs", "1",
                     *common, "--out", str(out)]) == 0
        rows.append(pd.read_csv(out / "frontier.csv").set_index("load").loc[8])
    cols = [c for c in rows[0].index if c != "pareto"]
    pd.testing.assert_series_equal(rows[0][cols], rows[1][cols])
    assert main(["run", "--policy", "confidence", "--concurrency", "8", *common, "--out", str(tmp_path / "r")]) == 0
    s = _summary(tmp_path / "r")
    for k in ("output_throughput_tok_s", "tps_user_median", "ttft_median_s", "num_requests_completed", "tau"):
        assert s[k] == pytest.approx(float(rows[0][k]), rel=1e-8, abs=0), k


def test_frontier_cells_are_bit_identical_to_a_lone_run():
    from dsparksim.cli.main import _run_config, _traffic, build_parser
    from dsparksim.results.frontier import cells

    # Built the way `run` (one load) and `frontier` (base config at the largest load) build them.
    args = build_parser().parse_args(["frontier", "--duration", "3", "--seed", "5", "--domain",
                                      "mix:math=1,code=1,chat=1"])
    # frontier parses --replicas/--router as lists (deployments); its one default deployment, as cmd_frontier takes it
    (args.replicas,), (args.router,) = args.replicas, args.router
    alone = simulate(_run_config(args, _traffic(args, "closed", concurrency=8)).replace(policy="goodput")).summary
    base = _run_config(args, _traffic(args, "closed", concurrency=64))
    among = [simulate(c).summary for c in cells(base, ["goodput"], [2, 8, 64])][1]
    assert alone == among


@pytest.mark.parametrize("small,large", [
    (TrafficConfig(concurrency=4, duration_s=10, domain="mix:math=1,code=1,chat=1"),
     TrafficConfig(concurrency=512, duration_s=600, domain="mix:math=1,code=1,chat=1")),
    (TrafficConfig(mode="poisson", rate=2.0, duration_s=60, domain="mix:math=1,chat=1"),
     TrafficConfig(mode="poisson", rate=2.0, duration_s=900, domain="mix:math=1,chat=1")),
    (TrafficConfig(mode="gamma", rate=5.0, burstiness=0.5, num_requests=40, domain="mix:code=1,chat=1"),
     TrafficConfig(mode="gamma", rate=5.0, burstiness=0.5, num_requests=3000, domain="mix:code=1,chat=1")),
])
def test_request_i_is_the_same_whatever_the_run_length(small, large):
    a = build_workload(small, np.random.default_rng(11))
    b = build_workload(large, np.random.default_rng(11))
    blocks_a, blocks_b = a.iter_blocks(), b.iter_blocks()
    pa, oa, da, ta = next(blocks_a)
    pb, ob, db, tb = next(blocks_b)
    n = min(len(pa), 40)
    np.testing.assert_array_equal(pa[:n], pb[:n])
    np.testing.assert_array_equal(oa[:n], ob[:n])
    np.testing.assert_array_equal(da[:n], db[:n])
    if ta is not None:
        np.testing.assert_array_equal(ta[:n], tb[:n])
    assert len(set(da[:n])) > 1  # the domain stream really is drawn


# ------------------------------------------------------------------ defect 2: bounded memory
def test_absurd_rate_is_refused_before_it_runs(tmp_path, capsys):
    rc = main(["run", "--rate", "1e9", "--duration", "1", "--quiet", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2 and "'rate'" in err and "2,000,000" in err and "Traceback" not in err


def test_waiting_queue_cap_is_a_config_error(monkeypatch):
    monkeypatch.setattr(engine_mod, "MAX_WAITING", 200)
    n = 5000
    wl = _wl([10] * n, [50] * n, arrival=np.arange(n) / 1000.0)  # 1000 req/s against ~8 req/s of service
    with pytest.raises(ConfigError, match="wait for admission.*limit of 200"):
        _sim(wl, duration=10.0).run()


def test_closed_loop_state_grows_with_requests_issued_not_users_times_duration():
    cfg = RunConfig(policy="fixed:7", traffic=TrafficConfig(concurrency=256, duration_s=20.0), seed=1)
    wl = build_workload(cfg.traffic, np.random.default_rng(0))
    assert wl.limit is None  # nothing pre-built: requests are generated as users need them
    sim = _sim(build_workload(TrafficConfig(concurrency=64, duration_s=30.0), np.random.default_rng(0)),
               duration=30.0, max_seqs=64)
    res = sim.run()
    # The old pre-built pool held 64 * (8 + 300) + 64 = 19,776 rows; the engine now holds what it issued.
    assert len(res.arrival_s) == sim.issued and sim._cap <= max(2048, 2 * sim.known)
    assert sim.issued < 64 * (8 + 300) // 4


# ------------------------------------------------------------------ defect 3: rejection on arrival
def test_unservable_rows_are_rejected_and_the_run_goes_on():
    # K=1, KV capacity 1000: a request fits iff prompt + output + 1 <= 1000; max_model_len 2000 (checked first).
    prompt = [100, 990, 100, 2000, 100, 600, 998, 1500]
    out = [10, 10, 10, 30, 10, 100, 1, 10]
    # row 1: 1000 + 1 > 1000 -> kv_capacity; row 3: 2030 > 2000 -> max_model_len; row 6: 999 + 1 = 1000 fits
    # exactly (served); row 7: 1510 <= 2000 but beyond the KV -> kv_capacity
    wl = _wl(prompt, out, arrival=np.arange(8) * 0.5)
    res = _sim(wl, num_requests=8, kv=1000, max_model_len=2000).run()
    assert res.reject_reason.tolist() == [0, 2, 0, 1, 0, 0, 0, 2]
    assert np.all(np.isnan(res.admitted_s[res.rejected])) and res.completed[~res.rejected].all()
    assert res.ended_by == "all_requests_done"
    req = per_request_table(res)
    assert req["rejected"].tolist() == [False, True, False, True, False, False, False, True]
    assert req["reject_reason"].tolist() == ["", "kv_capacity", "", "max_model_len", "", "", "", "kv_capacity"]
    s = summarize(res, policy="fixed:1", load=1.0, warmup_s=0.0, closed_loop=False)
    assert s["num_requests_rejected"] == 3 and s["rejected_by_reason"] == {"max_model_len": 1, "kv_capacity": 2}
    assert s["num_requests_completed"] == 5 and s["num_requests_issued"] == 8
    # latency metrics only from served requests
    assert req.loc[req["rejected"], ["ttft_s", "e2e_s", "tps_user"]].isna().all().all()
    served = req[~req["rejected"]]
    assert s["ttft_mean_s"] == pytest.approx(served["ttft_s"].mean(), rel=1e-12)
    assert s["e2e_mean_s"] == pytest.approx(served["e2e_s"].mean(), rel=1e-12)


def test_closed_loop_user_sends_next_request_after_a_rejection():
    prompt = [10, 5000, 10, 10, 5000, 5000, 10, 10]
    wl = _wl(prompt, [20] * 8, users=2)
    res = _sim(wl, num_requests=8, kv=1000).run()
    assert res.rejected.tolist() == [False, True, False, False, True, True, False, False]
    # the user whose request 1 was rejected sent request 2 at the same instant (t = 0)
    assert res.arrival_s[1] == res.arrival_s[2] == 0.0
    assert res.completed.sum() == 5 and res.ended_by == "all_requests_done"


def _profiles() -> list[str]:
    from dsparksim.cost.profile import list_profiles
    return sorted(list_profiles())


@pytest.mark.parametrize("trace,n", [("azure-conv-window", 40), ("azure-code-window", 40), ("mooncake-window", 170)])
def test_every_shipped_trace_replays_on_every_shipped_profile(trace, n):
    # mooncake-window row 157 needs 121,311 KV tokens: more than the 7B profile holds (old code aborted the run).
    rejected = {}
    for prof in _profiles():
        cfg = RunConfig(policy="fixed:7", profile=prof, seed=0,
                        traffic=TrafficConfig(mode="trace", trace=trace, num_requests=n, time_scale=50.0))
        s = simulate(cfg).summary
        assert s["num_requests_completed"] + s["num_requests_rejected"] == n, prof
        assert s["num_requests_rejected"] == sum(s["rejected_by_reason"].values())
        rejected[prof] = s["num_requests_rejected"]
    if trace == "mooncake-window":
        assert rejected["h100-llama2-7b-tp1"] >= 1
        assert rejected["cpu-tiny"] == 0  # 4.1M KV tokens hold every row


def test_cli_mooncake_replay_finishes_and_marks_rejections(tmp_path):
    out = tmp_path / "o"
    assert main(["run", "--trace", "mooncake-window", "--num-requests", "170", "--time-scale", "50", "--quiet",
                 "--out", str(out)]) == 0
    s = _summary(out)
    assert s["num_requests_rejected"] >= 1 and s["rejected_by_reason"]["kv_capacity"] == s["num_requests_rejected"]
    req = pd.read_csv(out / "requests.csv", keep_default_na=False)
    rej = req[req["rejected"]]
    assert len(rej) == s["num_requests_rejected"] and set(rej["reject_reason"]) == {"kv_capacity"}
    assert (rej["prompt_tokens"] + rej["output_tokens"] + 7 > s["kv_capacity_tokens"]).all()
    assert 157 in set(rej["request_id"])
    # bench_result.json: a rejected prompt is failed with the reason by name, like vLLM's error text
    bench = json.loads((out / "bench_result.json").read_text())
    assert bench["failed"] >= s["num_requests_rejected"]
    assert sum(e == "rejected: kv_capacity" for e in bench["errors"]) == s["num_requests_rejected"]


# ------------------------------------------------------------------ defect 4: saturation from queueing
def _service_rate(max_seqs: int = 4) -> float:
    """Measured: completed requests per second of a closed loop that keeps every slot busy."""
    wl = _wl([10] * 4000, [50] * 4000, users=max_seqs)
    res = _sim(wl, duration=30.0, max_seqs=max_seqs).run()
    s = summarize(res, policy="fixed:1", load=max_seqs, warmup_s=3.0, closed_loop=True)
    return s["request_throughput_req_s"]


@pytest.mark.parametrize("factor,expect", [(3.0, True), (0.3, False)])
def test_open_loop_saturation_against_measured_service_rate(factor, expect):
    mu = _service_rate()
    assert mu == pytest.approx(4 / 0.5, rel=0.05)  # 4 slots, 50 steps of 10 ms per request
    rate = factor * mu
    n = int(rate * 60)
    wl = _wl([10] * n, [50] * n, arrival=np.random.default_rng(1).exponential(1 / rate, n).cumsum())
    res = _sim(wl, duration=60.0).run()
    sat, info = saturation(res, warmup_s=6.0, closed_loop=False)
    assert sat is expect, info
    assert info["arrival_rate_rps"] == pytest.approx(rate, rel=0.15)
    if expect:
        assert info["admission_rate_rps"] == pytest.approx(mu, rel=0.05)


@pytest.mark.parametrize("users,expect", [(64, True), (1, False)])
def test_closed_loop_saturation(users, expect):
    # 4 slots: 64 users always queue; one user never waits.
    wl = _wl([10] * 20000, [50] * 20000, users=users)
    res = _sim(wl, duration=20.0).run()
    sat, info = saturation(res, warmup_s=2.0, closed_loop=True)
    assert sat is expect and info["frac_steps_with_waiting"] == (1.0 if expect else 0.0)


def test_closed_loop_kv_bound_saturation_on_real_profile():
    # 7B profile holds 113,534 KV tokens: 512 users of ~1-2k-token conversations cannot all be admitted.
    big = RunConfig(policy="fixed:7", traffic=TrafficConfig(concurrency=512, duration_s=4.0), seed=0)
    assert simulate(big).summary["saturated"] is True
    one = RunConfig(policy="fixed:7", traffic=TrafficConfig(concurrency=1, duration_s=4.0), seed=0)
    assert simulate(one).summary["saturated"] is False


def _hand_result(n_wait_steps: np.ndarray, arrival=None, admitted=None, end=None) -> SimResult:
    k = len(n_wait_steps)
    n = 0 if arrival is None else len(arrival)
    arrival = np.zeros(0) if arrival is None else np.asarray(arrival, float)
    admitted = np.zeros(0) if admitted is None else np.asarray(admitted, float)
    z = np.zeros(n, np.int64)
    steps = {"t_start": np.arange(k) * 1.0, "dt": np.ones(k), "n_waiting": np.asarray(n_wait_steps)}
    return SimResult(arrival_s=arrival, admitted_s=admitted, first_token_s=admitted + 0.5, finish_s=admitted + 1.0,
                     prompt_tokens=z + 1, output_tokens=z + 1, emitted_tokens=z + 1, decode_steps=z, verify_tokens=z,
                     accepted_tokens=z, domain=np.full(n, "chat", dtype=object), steps=steps,
                     sim_time_s=float(end if end is not None else k), ended_by="duration", kv_capacity_tokens=1,
                     max_batched_tokens=1, block_size=1, drafter="dspark", reject_reason=np.zeros(n, np.int8))


@pytest.mark.parametrize("frac,expect", [(0.7, True), (0.6, True), (0.4, False), (0.3, False)])
def test_closed_loop_rule_is_more_than_half_of_the_steps(frac, expect):
    # 100 window steps, waiting in exactly frac of them: the rule (documented in metrics.saturation) is > 0.5.
    q = np.zeros(100, np.int64)
    q[np.random.default_rng(0).permutation(100)[: int(frac * 100)]] = 3
    sat, info = saturation(_hand_result(q), warmup_s=0.0, closed_loop=True)
    assert sat is expect and info["frac_steps_with_waiting"] == pytest.approx(frac)


@pytest.mark.parametrize("stuck,expect", [(0, False), (5, False), (9, False), (12, True), (40, True)])
def test_open_loop_rule_queue_growth_against_arrivals(stuck, expect):
    # 100 arrivals over [0, 99] s, each admitted on arrival except the last `stuck` ones (never admitted by the end
    # at 100 s): queue growth = stuck. Rule: growth > max(5, 0.1 * arrivals) = 10.
    arrival = np.arange(100.0)
    admitted = arrival.copy()
    if stuck:
        admitted[-stuck:] = np.nan
    sat, info = saturation(_hand_result(np.zeros(100), arrival, admitted, end=100.0), warmup_s=0.0,
                           closed_loop=False)
    assert info["queue_growth"] == stuck and info["arrivals_in_window"] == 100
    assert sat is expect


def test_replay_compressed_into_an_instant_is_saturated():
    cfg = RunConfig(policy="fixed:7", traffic=TrafficConfig(mode="trace", trace="azure-conv-window",
                                                           time_scale=1e5, num_requests=400), seed=0)
    s = simulate(cfg).summary
    assert s["saturated"] is True and s["saturation_detail"]["queue_end"] > 40


def test_issue_example_azure_conv_time_scale_20_is_saturated():
    cfg = RunConfig(policy="confidence", traffic=TrafficConfig(mode="trace", trace="azure-conv-window",
                                                              time_scale=20.0, num_requests=800), seed=0)
    s = simulate(cfg).summary
    assert s["ttft_median_s"] > 5 and s["saturated"] is True
    d = s["saturation_detail"]
    assert d["arrival_rate_rps"] > 2 * d["admission_rate_rps"]


def test_light_replay_is_not_saturated():
    cfg = RunConfig(policy="confidence", traffic=TrafficConfig(mode="trace", trace="azure-conv-window",
                                                              duration_s=30.0), seed=0)
    s = simulate(cfg).summary
    assert s["saturated"] is False and s["saturation_detail"]["arrivals_in_window"] > 100


# ------------------------------------------------------------------ load knobs outside their stated ranges
@pytest.mark.parametrize("kw, field", [
    (dict(mode="poisson", rate=1e-15, num_requests=2), "rate"),
    (dict(mode="poisson", rate=5.0, time_scale=1e9, num_requests=2), "time_scale"),
    (dict(mode="poisson", rate=1e8, time_scale=100.0, num_requests=2), "rate"),
    (dict(mode="gamma", rate=5.0, burstiness=1e-320, num_requests=2), "burstiness"),
    (dict(mode="gamma", rate=5.0, burstiness=1e4, num_requests=2), "burstiness"),
])
def test_load_knobs_outside_their_range_are_refused(kw, field):
    from dsparksim.traffic import TrafficConfig
    with pytest.raises(ConfigError, match=field):
        TrafficConfig(**kw)


def test_low_rate_bench_result_peaks_use_sparse_bins(tmp_path):
    # One request per ~1000 s: the old dense 1-second bins were sized by the span; sparse bins give the same peaks.
    out = tmp_path / "o"
    assert main(["run", "--rate", "0.001", "--num-requests", "3", "--quiet", "--out", str(out)]) == 0
    bench = json.loads((out / "bench_result.json").read_text())
    assert bench["completed"] == 3 and bench["max_concurrent_requests"] == 1
    assert bench["max_output_tokens_per_s"] >= 1


def test_a_closed_loop_without_a_request_count_stops_at_the_request_cap(tmp_path, capsys, monkeypatch):
    # open loop is capped at 2M expected arrivals; a closed loop had no cap: `run --concurrency 4096 --duration
    # 100000` would issue tens of millions of request rows (~2.4 KiB each at run's peak, measured) until memory ran out
    import dsparksim.traffic.base as base
    assert base.MAX_CLOSED_LOOP_REQUESTS == 10_000_000   # the stated limit (docs/outputs.md, the error's words)
    monkeypatch.setattr(base, "MAX_CLOSED_LOOP_REQUESTS", 2 * base.CHUNK)
    argv = ["run", "--profile", "h100-llama2-7b-tp1", "--policy", "none", "--concurrency", "512",
            "--dataset-name", "random", "--random-input-len", "64", "--random-output-len", "16", "--quiet"]
    assert main(argv + ["--duration", "0.5", "--out", str(tmp_path / "short")]) == 0    # under the cap: runs
    assert 0 < len(pd.read_csv(tmp_path / "short" / "requests.csv")) < 2 * base.CHUNK
    capsys.readouterr()
    assert main(argv + ["--duration", "60", "--out", str(tmp_path / "long")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "the closed-loop users need more than 2,048 requests " \
        "(warm-up aside), past the limit of 2,048 per run (checked every 1,024 requests)" in err, err
    assert "~2.4 KiB each" in err and "shorten --duration or lower --concurrency" in err, err
    assert not (tmp_path / "long").exists()
    # a limit between block boundaries fires at the next one: the message says the rows drawn then, which
    # are more than the limit (it said "have issued 1,048 requests" with 2,048 drawn)
    monkeypatch.setattr(base, "MAX_CLOSED_LOOP_REQUESTS", 2 * base.CHUNK - 1000)
    assert main(argv + ["--duration", "60", "--out", str(tmp_path / "long2")]) == 2
    err = capsys.readouterr().err.strip()
    assert "the closed-loop users need more than 2,048 requests (warm-up aside), past the limit of 1,048" in err, err
    monkeypatch.setattr(base, "MAX_CLOSED_LOOP_REQUESTS", 10 ** 9)
    assert main(argv + ["--num-requests", "3000", "--out", str(tmp_path / "n")]) == 0   # a count: never this cap
