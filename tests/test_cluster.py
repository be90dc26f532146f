"""The engine among many: keyed streams (paired draws), the public step contract, replicas, routers, DP ranks."""
from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from dsparksim.acceptance import load_acceptance
from dsparksim.cli.main import main
from dsparksim.sim.cluster import Simulation
from dsparksim.config import EngineConfig, RunConfig
from dsparksim.sim.contract import CostExecutor
from dsparksim.sim.scheduler import Scheduler
from dsparksim.policies import make_policy
from dsparksim.cost.profile import load_profile
from dsparksim.sim.requests import RequestTable
from dsparksim.sim.simulate import simulate
from dsparksim.sim.streams import RequestStreams
from dsparksim.traffic import TrafficConfig
from dsparksim.traffic.base import Workload
from sim_kit import make_scheduler, make_sim  # noqa: E402

PROFILE = "h100-llama2-7b-tp1"


def _cfg(policy="confidence", seed=1, **kw) -> RunConfig:
    eng = {k: kw.pop(k) for k in ("replicas", "router", "dp_ranks", "kv_capacity_tokens", "max_num_seqs") if k in kw}
    cfg = RunConfig(policy=policy, traffic=TrafficConfig(**kw), seed=seed)
    e = cfg.engine
    for k, v in eng.items():                      # set through the dataclass API when the field exists
        if k in {f.name for f in dataclasses.fields(e)}:
            e = dataclasses.replace(e, **{k: v})
        else:
            object.__setattr__(e, k, v)
    return cfg.replace(engine=e)


# ------------------------------------------------------------------------------------------------ keyed streams
def test_keyed_draws_are_a_function_of_request_and_step_only():
    rs = RequestStreams(5)
    keys = rs.request_keys(np.arange(10))
    both = rs.rows(keys[[3, 7]], np.array([2, 9]))
    z, u = both.standard_normal((2, 7)), both.random((2, 3))
    for r, (i, j) in enumerate([(3, 2), (7, 9)]):
        one = rs.rows(rs.request_keys(np.array([i])), j)
        np.testing.assert_array_equal(one.standard_normal((1, 7))[0], z[r])
        np.testing.assert_array_equal(one.random((1, 3))[0], u[r])
    # another seed, another step, another request: different draws
    assert not np.array_equal(RequestStreams(6).rows(RequestStreams(6).request_keys(np.array([3])), 2)
                              .standard_normal((1, 7))[0], z[0])
    assert not np.array_equal(rs.rows(keys[[3]], 3).standard_normal((1, 7))[0], z[0])


def test_keyed_uniforms_and_normals_have_the_right_distribution_and_no_correlation():
    rs = RequestStreams(0)
    n = 100_000
    r = rs.rows(rs.request_keys(np.arange(n)), 4)
    u = r.random((n, 4))
    z = r.standard_normal((n, 7))
    z_next = rs.rows(rs.request_keys(np.arange(n)), 5).standard_normal(n)
    # fixed seed; thresholds far from where a correct generator lands (p-values, 5-sigma moments)
    assert stats.kstest(u.ravel(), "uniform").pvalue > 1e-3
    assert stats.kstest(z.ravel(), "norm").pvalue > 1e-3
    se = 1 / np.sqrt(z.size)
    assert abs(z.mean()) < 5 * se and abs(z.var() - 1) < 5 * np.sqrt(2) * se
    assert abs(stats.kurtosis(z.ravel())) < 5 * np.sqrt(24) * se
    lim = 5 / np.sqrt(n)
    for a, b in ((z[:, 0], z[:, 1]), (z[:-1, 0], z[1:, 0]), (z[:, 0], z_next), (u[:, 0], z[:, 0])):
        assert abs(np.corrcoef(a, b)[0, 1]) < lim


def _draw_log(monkeypatch):
    """Record (request, step) -> (confidences, true accepted) of every acceptance draw."""
    seen: dict[tuple[int, int], tuple[tuple, int]] = {}
    orig = Scheduler.draw

    def spy(self, dec, slots):
        blk = orig(self, dec, slots)
        for r, row in enumerate(dec):
            seen[(int(row), int(self.req.dsteps[row]))] = (tuple(blk.conf[r]), int(blk.accepted[r]))
        return blk
    monkeypatch.setattr(Scheduler, "draw", spy)
    return seen


def test_two_policies_at_one_load_see_identical_requests_and_draws(monkeypatch):
    runs = {}
    for pol in ("fixed:7", "confidence"):
        seen = _draw_log(monkeypatch)
        out = simulate(_cfg(pol, mode="poisson", rate=4.0, duration_s=20.0))
        runs[pol] = (out.requests(), dict(seen))
        monkeypatch.undo()
    (ra, da), (rb, db) = runs["fixed:7"], runs["confidence"]
    n = min(len(ra), len(rb))
    assert n > 50
    for c in ("arrival_s", "prompt_tokens", "output_tokens", "domain"):
        assert (ra[c].to_numpy()[:n] == rb[c].to_numpy()[:n]).all(), c
    common = set(da) & set(db)
    assert len(common) > 1000
    assert all(da[k] == db[k] for k in common)
    # the policies did walk different paths (else the check above says nothing)
    assert not ra["finish_s"].iloc[:n].equals(rb["finish_s"].iloc[:n])


def test_a_request_gets_the_same_draws_on_any_replica_count(monkeypatch):
    logs = []
    for reps in (1, 3):
        seen = _draw_log(monkeypatch)
        simulate(_cfg("fixed:7", mode="closed", concurrency=12, num_requests=60, replicas=reps))
        logs.append(dict(seen))
        monkeypatch.undo()
    a, b = logs
    assert set(a) == set(b)          # fixed:7 verifies every block: each request takes the same steps
    assert all(a[k] == b[k] for k in a)


# ------------------------------------------------------------------------------------------------ step contract
def _closed(n_users, prompt, out, n):
    return Workload(prompt_tokens=np.full(n, prompt), output_tokens=np.full(n, out),
                    domain=np.array(["math", "code", "chat"] * (n // 3 + 1), dtype=object)[:n], concurrency=n_users)


def test_one_replica_equals_the_engine_driven_through_the_public_contract():
    prof, K = load_profile(PROFILE), 7
    wl = _closed(6, 64, 40, 30)
    kw = dict(profile=prof, acceptance=load_acceptance("dspark", K), K=K, drafter="dspark",
              kv_capacity_tokens=10**6, max_num_seqs=16, max_batched_tokens=2048, prefill_chunk_tokens=256)

    def policy():
        p = make_policy("confidence")
        p.reset(K, np.random.default_rng(0))
        return p
    sim = make_sim(policy=policy(), workload=wl, block_size=K, streams=RequestStreams(3), num_requests=30,
                     **{k: v for k, v in kw.items() if k != "K"})
    res = sim.run()

    # the same run by hand: the public step contract, a plain clock, zero-think-time users
    table = RequestTable(wl, 30, RequestStreams(3))
    eng = make_scheduler(table=table, policy=policy(), streams=RequestStreams(3), **kw)
    issued = 0

    def issue(now):
        nonlocal issued
        table.load(issued)
        table.arrival[issued] = now
        eng.inbox.put(issued)
        issued += 1
    for _ in range(6):
        issue(0.0)
    ex, now = CostExecutor(), 0.0
    while True:
        eng.drain()
        eng.admit(now)
        plan = eng.plan_step()
        if plan is None:
            break
        out = ex.execute(plan)
        done = eng.apply(plan, out, now + out.duration_s)
        eng.record(plan, out, now)
        for _ in done:
            if issued < 30:
                issue(now + out.duration_s)
        now += out.duration_s
    np.testing.assert_array_equal(res.finish_s, table.finish[:30])
    np.testing.assert_array_equal(res.steps["dt"], eng.log["dt"])
    assert res.sim_time_s == pytest.approx(now, rel=0, abs=0)


# ------------------------------------------------------------------------------------------------ replicas
def test_n_round_robin_replicas_at_n_times_the_load_give_n_times_the_throughput():
    one = simulate(_cfg("confidence", mode="closed", concurrency=16, duration_s=40.0)).summary
    four = simulate(_cfg("confidence", mode="closed", concurrency=64, duration_s=40.0, replicas=4,
                         router="round-robin")).summary
    assert four["output_throughput_tok_s"] / one["output_throughput_tok_s"] == pytest.approx(4.0, rel=0.03)
    assert four["replicas"] == 4 and len(four["per_replica"]) == 4
    routed = [p["num_requests_routed"] for p in four["per_replica"]]
    assert max(routed) - min(routed) <= 0.1 * max(routed)


def test_least_outstanding_beats_random_on_p99_ttft_under_bursty_traffic():
    # gamma arrivals, shape 0.5 (bursty), 4 replicas at ~2/3 of their capacity (60 req/s saturates them); the
    # same requests and draws for both routers (paired). Measured: p99 TTFT 0.23/0.19/0.18 s vs 0.33/0.25/0.19 s.
    p99 = {"least-outstanding": [], "random": []}
    for seed in (1, 2, 3):
        for router in p99:
            s = simulate(_cfg("confidence", seed=seed, mode="gamma", rate=40.0, burstiness=0.5, duration_s=30.0,
                              replicas=4, router=router)).summary
            assert not s["saturated"]
            p99[router].append(s["ttft_p99_s"])
    lo, rnd = np.array(p99["least-outstanding"]), np.array(p99["random"])
    assert lo.mean() <= 0.9 * rnd.mean()
    assert (lo <= 1.05 * rnd).all()


def test_replica_column_and_per_replica_itls(tmp_path):
    cfg = _cfg("fixed:7", mode="poisson", rate=6.0, duration_s=20.0, replicas=3, router="least-kv")
    out = simulate(cfg)
    req = out.requests()
    assert set(req["replica"]) <= {0, 1, 2} and req["replica"].nunique() == 3
    from dsparksim.results.bench_json import bench_result
    b = bench_result(out.result, warmup_s=2.0, duration_s=18.0, model_id="m", request_rate=6.0, burstiness=1.0,
                     max_concurrency=None)
    st = pd.DataFrame(out.result.steps)
    arr = out.result.arrival_s
    idx = np.flatnonzero(np.isfinite(arr) & (arr >= 2.0))
    idx = idx[np.argsort(arr[idx], kind="stable")]
    for k, i in enumerate(idx[:40]):
        if not np.isfinite(out.result.finish_s[i]):
            continue
        mine = st[(st["replica"] == req["replica"][i]) & (st["t_start"] >= out.result.first_token_s[i])
                  & (st["t_start"] < out.result.finish_s[i])]
        assert b["itls"][k] == mine["dt"].tolist()     # its own replica's steps, none of the others'


def test_unknown_router_and_bad_replica_count_are_config_errors():
    from dsparksim.errors import ConfigError
    from dsparksim.sim.routers import make_router
    with pytest.raises(ConfigError, match="router.*'nearest'"):
        make_router("nearest", 2)
    with pytest.raises(ConfigError, match="replicas"):
        simulate(_cfg("fixed:7", mode="closed", concurrency=2, duration_s=1.0, replicas=0))


def test_session_router_needs_session_ids():
    from dsparksim.errors import ConfigError
    with pytest.raises(ConfigError, match="session"):
        simulate(_cfg("fixed:7", mode="closed", concurrency=2, duration_s=1.0, replicas=2, router="session"))


# ------------------------------------------------------------------------------------------------ DP ranks
def test_dp_lockstep_step_takes_the_slowest_ranks_time():
    prof = load_profile(PROFILE)
    out = simulate(_cfg("fixed:7", mode="closed", concurrency=7, duration_s=10.0, dp_ranks=2))
    st = pd.DataFrame(out.result.steps)
    assert set(st["rank"]) == {0, 1}
    both = 0
    for _, g in st.groupby("t_start"):
        assert (g["dt"] == g["dt"].iloc[0]).all()                           # lockstep: one duration
        assert g["dt"].iloc[0] == g["rank_busy_s"].max()                    # ... the slowest rank's
        for _, row in g.iterrows():                                         # each rank priced on its own batch
            if row["n_prefill_tokens"] == 0 and row["n_decode"] > 0:
                want = (float(prof.verify_time(np.array([int(row["M"])]), int(row["kv_read"]))[0])
                        + float(prof.nontrimmable_time("dspark", int(row["n_decode"]), 7)))
                assert row["rank_busy_s"] == pytest.approx(want, rel=1e-12)
        both += len(g) == 2 and g["rank_busy_s"].nunique() == 2
    assert both > 10          # imbalance happened (7 users on 2 ranks) and cost the faster rank its slack
    req = out.requests()
    assert set(req["dp_rank"][req["replica"] >= 0]) == {0, 1}


# ------------------------------------------------------------------------------------------------ frontier cells
def test_frontier_cell_is_identical_alone_and_inside_a_larger_frontier(tmp_path):
    common = ["--duration", "4", "--jobs", "1", "--backend", "serial"]
    assert main(["frontier", "--policies", "fixed:7", "--concurrency-levels", "4", "--out", str(tmp_path / "a"),
                 *common]) == 0
    assert main(["frontier", "--policies", "mtp1,fixed:7,confidence", "--concurrency-levels", "1,4,8",
                 "--out", str(tmp_path / "b"), *common]) == 0
    a = pd.read_csv(tmp_path / "a" / "frontier.csv")
    b = pd.read_csv(tmp_path / "b" / "frontier.csv")
    b = b[(b["policy"] == "fixed:7") & (b["load"] == 4)]
    assert len(a) == 1 and len(b) == 1
    cols = [c for c in a.columns if c not in ("pareto",)]
    assert a[cols].iloc[0].to_dict() == b[cols].iloc[0].to_dict()


def test_session_router_keeps_each_prefix_on_one_replica(tmp_path):
    import json
    rng = np.random.default_rng(0)
    conv = rng.integers(0, 12, 120)                       # 12 conversations behind one shared system block
    p = tmp_path / "t.jsonl"
    p.write_text("".join(json.dumps({"timestamp": 250 * i, "input_length": 200, "output_length": 30,
                                     "hash_ids": [0, 100 + int(c), 1000 + i]}) + "\n" for i, c in enumerate(conv)))
    out = simulate(_cfg("fixed:7", mode="trace", trace=str(p), duration_s=40.0, replicas=3, router="session"))
    req = out.requests()
    served = req["replica"].to_numpy()
    assert (served >= 0).all()
    for c in np.unique(conv[: len(req)]):
        assert len(set(served[conv[: len(req)] == c])) == 1       # a conversation never changes replica
    assert len(set(served)) == 3                                  # and conversations spread over the replicas


def test_parametric_keyed_fast_path_equals_the_generic_generator_path():
    acc = load_acceptance("dspark", 7)
    rs = RequestStreams(11)
    keys = rs.request_keys(np.arange(40))
    acc.start(np.arange(40), np.array(["math", "code", "chat", "chat"] * 10, dtype=object), rs.rows(keys, -1, 1))

    class Proxy:                     # the Generator-like interface only: draw() takes its generic path
        def __init__(self, r):
            self.r = r

        def random(self, size):
            return self.r.random(size)

        def standard_normal(self, size):
            return self.r.standard_normal(size)
    steps = np.arange(40) % 5
    fast = acc.draw(np.arange(40), rs.rows(keys, steps))
    slow = acc.draw(np.arange(40), Proxy(rs.rows(keys, steps)))
    np.testing.assert_array_equal(fast.conf, slow.conf)
    np.testing.assert_array_equal(fast.accepted, slow.accepted)


def test_prefix_ids_skip_the_block_every_row_shares_and_tolerate_empty_rows():
    from dsparksim.traffic.readers import _prefix_ids
    np.testing.assert_array_equal(_prefix_ids([[], [0, 5, 9], [0, 6], [0]]), [-1, 5, 6, 0])
    assert _prefix_ids([[], []]) is None
    np.testing.assert_array_equal(_prefix_ids([[0, 1], [0, 1]]), [1, 1])     # identical rows: their last block


def test_rewritten_engine_reproduces_the_old_engine_on_the_legacy_draw_path(monkeypatch):
    """With acceptance draws from one sequential Generator (the scheme before keyed streams), the cluster of one
    engine reproduces the pre-rewrite engine (c58c5ed) bit for bit: same finish/first-token times, step durations,
    decode steps and accepted tokens (fingerprints in tests/golden/legacy_engine.json)."""
    import hashlib
    import json
    from pathlib import Path

    import dsparksim.sim.simulate as S
    want = json.loads((Path(__file__).parent / "golden" / "legacy_engine.json").read_text())

    def legacy(seed):
        w, a, p = np.random.SeedSequence(seed).spawn(3)
        return {"workload": np.random.default_rng(w), "acceptance": np.random.default_rng(a),
                "policy": np.random.default_rng(p)}

    class LegacySimulation(Simulation):
        def __init__(self, engine, inputs, workload, streams, **kw):
            super().__init__(engine, inputs, workload, None, rng=streams, **kw)
    monkeypatch.setattr(S, "run_streams", legacy)
    monkeypatch.setattr(S, "Simulation", LegacySimulation)
    # The acceptance model of c58c5ed (issue 11 changed the default: step-weighted calibration, fitted confidence
    # parameters, STS): request-weighted calibration, flat noise 0.43, T = 1, raw confidences; draw for draw the same.
    import dsparksim.acceptance as acc_pkg
    from dsparksim.acceptance.parametric import ParametricAcceptance, ParametricParams
    old = ParametricParams(sigma_req=0.8, sigma_block=0.8, sigma_tok=1.4, noise_sd=0.43, noise_sd_end=0.43,
                           raw_gain=1.0, jump=0.0, slope=1.0, offset=0.0, slope_easy=1.0, noise_block=0.0)
    monkeypatch.setattr(acc_pkg, "load_acceptance", lambda spec, K, **kw: ParametricAcceptance.from_paper(
        spec, K, old, confidence="raw", calibration="requests"))
    cases = {"confidence": dict(mode="closed", concurrency=32, duration_s=20.0),
             "fixed:7": dict(mode="poisson", rate=6.0, duration_s=30.0),
             "goodput": dict(mode="closed", concurrency=8, num_requests=40),
             "mtp1": dict(mode="poisson", rate=3.0, num_requests=50)}
    for pol, tr in cases.items():
        # the pre-paging numbers: KV reserved at admission (the run default is now paged KV)
        o = S.simulate(RunConfig(policy=pol, engine=EngineConfig(kv_policy="reserve"), traffic=TrafficConfig(**tr),
                                 seed=want["seed"]))
        r = o.result
        h = hashlib.sha256()
        for a in (r.finish_s, r.first_token_s, np.asarray(r.steps["dt"], float), r.decode_steps, r.accepted_tokens):
            h.update(np.ascontiguousarray(a).tobytes())
        assert h.hexdigest() == want["cases"][pol]["sha256"], pol
        assert o.summary["output_throughput_tok_s"] == want["cases"][pol]["output_throughput_tok_s"]


@pytest.mark.parametrize("argv,field,words", [
    (["run", "--replicas", "100000"], "replicas", "1..4096"),
    (["run", "--replicas", "64", "--dp-ranks", "128"], "replicas", "8192 engines"),
    (["run", "--replicas", "2_0"], "--replicas", "'2_0'"),
    (["run", "--router", "random"], "--router", "no effect on one engine"),
])
def test_deployment_options_out_of_range_or_ignored_are_one_line_errors(tmp_path, capsys, argv, field, words):
    try:
        rc = main([*argv, "--concurrency", "2", "--duration", "1", "--out", str(tmp_path / "o")])
    except SystemExit as e:       # argparse's own type errors exit 2 from the parser
        rc = e.code
    assert rc == 2
    err = capsys.readouterr().err.strip()
    err = "\n".join(ln for ln in err.splitlines() if not ln.startswith("usage:") and not ln.startswith(" "))
    assert len(err.splitlines()) == 1 and field in err and words in err
    assert not (tmp_path / "o").exists()


def test_a_replica_that_finishes_nothing_has_null_metrics_not_nan(tmp_path):
    import json
    assert main(["run", "--replicas", "4", "--concurrency", "1", "--num-requests", "2", "--quiet",
                 "--out", str(tmp_path / "o")]) == 0
    text = (tmp_path / "o" / "summary.json").read_text()
    assert "NaN" not in text
    idle = [p for p in json.loads(text)["per_replica"] if p["num_requests_routed"] == 0]
    assert idle and all(p["tps_user_median"] is None and p["ttft_p99_s"] is None for p in idle)


def test_oracle_bounds_fixed7_at_one_user_on_paired_streams():
    # The 7B H100 staircase is non-monotone (T(1) > T(8)); before the oracle padded, fixed:7 beat it in every paired
    # seed at 1 user. Same requests and draws for both (keyed streams); measured +0.3% for the oracle per seed.
    for seed in (1, 2, 3, 4):
        got = {p: simulate(_cfg(p, seed=seed, mode="closed", concurrency=1, duration_s=60.0)).summary
               ["output_throughput_tok_s"] for p in ("oracle", "fixed:7")}
        assert got["oracle"] >= got["fixed:7"], (seed, got)


def test_a_gap_opened_after_a_replicas_last_step_maps_one_past_it(monkeypatch):
    """A preemption in a replica's last (never logged) step opens a gap at that replica's step count: in the merged
    log the index is the next replica's first step or the end. for_replica maps it one past the replica's own last
    step (it raised IndexError for the last replica and named the step before for the others)."""
    from dsparksim.config import EngineConfig, RunConfig
    from dsparksim.sim.simulate import simulate
    from dsparksim.traffic import TrafficConfig

    monkeypatch.setenv("DSPARKSIM_KERNEL", "0")
    cfg = RunConfig(policy="confidence", profile="h100-llama2-7b-tp1", acceptance="dspark",
                    engine=EngineConfig(kv_capacity_tokens=20_000, replicas=3, router="pinned"),
                    traffic=TrafficConfig(mode="closed", concurrency=60, duration_s=40.0), seed=31)
    res = simulate(cfg).result
    reached = 0
    for r in range(3):
        part = res.for_replica(r)
        n = len(part.steps["dt"])
        first = part.gap_steps[:, 0]
        assert (first <= n).all() and ((part.gap_steps[:, 1] < n)).all()
        reached += int((first == n).sum())
        # every other gap starts at a step of this replica that its request sat out (it was not decoding there)
        for (p, q), k in zip(part.gap_steps.tolist(), part.gap_request.tolist()):
            assert p < n or q == -1
    assert reached >= 1      # this seed reaches the case
