"""dsparksim plan: the search equals a brute-force scan; cost arithmetic; no-feasible reports; seed intervals.

Most tests drive the search with a synthetic runner (``run_cells`` replaced by closed-form summaries, so the
search logic is checked on many shapes in milliseconds); one test runs the real simulator on a tiny grid.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from dsparksim.plan import brute_force, cost_per_hour, cost_per_mtok, plan_from_dict, run_plan, write_plan
from dsparksim.plan import search as search_mod
from dsparksim.plan.report import summarize_plan, text_report
from dsparksim.plan.search import evaluate, interval
from dsparksim.plan.spec import gpus_per_replica

H100, A100 = "NVIDIA H100 SXM 80GB", "NVIDIA A100 SXM 80GB"
PRICES = {H100: 3.0, A100: 1.8}


def spec_dict(**over):
    d = {"plan": {"name": "t", "slo": ["tps_user_p50 >= 60", "ttft_p99_s <= 2"]},
         "traffic": {"rate": 10.0, "scales": [1.0, 2.0, 3.5], "duration_s": 2.0},
         "prices": dict(PRICES),
         "candidates": [
             {"name": "a", "profile": "h100-llama2-7b-tp1", "replicas": [1, 9],
              "policies": ["mtp1", "confidence", "fixed:3"], "K": [3, 7]},
             {"name": "b", "profile": "a100-llama3-8b-tp1", "replicas": [2, 12], "policies": ["mtp1", "confidence"]},
             {"name": "c", "profile": "h100-llama2-70b-tp4", "replicas": [1, 3], "policies": ["confidence"]}]}
    for k, v in over.items():
        d[k] = {**d[k], **v} if isinstance(v, dict) else v
    return d


def fake_summary(cfg, params):
    """Closed-form stand-in for a run: per-user speed falls and TTFT rises with the load per replica, each
    deployment with its own capacity (monotone in replicas by construction)."""
    e, t = cfg.engine, cfg.traffic
    cap = params[(cfg.profile, cfg.policy, e.block_size)]
    per = t.rate / e.replicas
    noise = 1.0 + 0.03 * ((cfg.seed * 7919) % 5 - 2)
    speed = 150.0 * cap / (cap + per) * noise
    return {"tps_user_median": speed, "ttft_p99_s": 0.2 * per / cap * noise, "saturated": per > 3 * cap,
            "output_throughput_tok_s": 40.0 * t.rate, "tpot_p99_s": 1.0 / speed}


@pytest.fixture
def fake(monkeypatch):
    calls = []

    def install(params):
        def run_cells(cells, out_dir, backend, workers, ray_address, bar):
            calls.extend(c.config for c in cells)
            return {c.index: fake_summary(c.config, params) for c in cells}, [], 0, len(cells)
        monkeypatch.setattr(search_mod, "run_cells", run_cells)
        return calls
    return install


def params_for(spec, rng):
    return {(d.options.get("profile"), d.policy, d.K): float(rng.uniform(1.0, 12.0)) for d in spec.deployments}


def brute(spec, params):
    from dsparksim.sweep.cells import build_config

    def summaries(d, scale, r):
        return [fake_summary(build_config(spec.options(d, scale, r, s)), params) for s in spec.seeds]
    return brute_force(spec, summaries)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("prune", [True, False])
def test_plan_equals_brute_force_scan(tmp_path, fake, seed, prune):
    spec = plan_from_dict(spec_dict(plan={"prune": prune, "seeds": [0, 1, 2]}))
    params = params_for(spec, np.random.default_rng(seed))
    calls = fake(params)
    run = run_plan(spec, tmp_path, backend="serial", progress=False)
    doc = summarize_plan(run)
    ref = brute(spec, params)
    n_fam = 0
    for sc in doc["scales"]:
        for fam, c in sc["cheapest"].items():
            want = ref[(fam, sc["scale"])]
            if want is None:
                assert not c["feasible"]
            else:
                n_fam += 1
                d, p = want
                assert (c["deployment"], c["replicas"], c["cost_per_hour"]) == (d.label, p.replicas, p.cost_per_hour)
    assert n_fam > 0
    # bisection runs fewer probes than the scan would (every replica count x deployment x scale)
    full = sum(d.hi - d.lo + 1 for d in spec.deployments) * len(spec.scales) * len(spec.seeds)
    assert len(calls) < full / 2


def test_pruning_skips_deployments_that_cannot_win(tmp_path, fake):
    spec = plan_from_dict(spec_dict())
    params = params_for(spec, np.random.default_rng(1))
    on = len(fake(params)) or None
    calls = fake(params)
    run_plan(spec, tmp_path / "on", backend="serial", progress=False)
    on = len(calls)
    calls.clear()
    run_plan(plan_from_dict(spec_dict(plan={"prune": False})), tmp_path / "off", backend="serial", progress=False)
    assert on < len(calls)


def test_cost_arithmetic():
    assert cost_per_hour(3, 4, 2.5) == 30.0
    assert cost_per_hour(2, 8, 2.0, prefill_gpus=8) == 48.0
    assert cost_per_mtok(30.0, 1000.0) == pytest.approx(30.0 / (3600 * 1000.0) * 1e6)
    assert cost_per_mtok(30.0, 0.0) is None
    # GPUs per replica from profile metadata
    assert gpus_per_replica({"tensor_parallel": 4}) == (4, "metadata: tensor_parallel 4")
    assert gpus_per_replica({"tensor_parallel": 8, "gpus": 8})[0] == 8
    assert gpus_per_replica({"tensor_parallel": 1, "data_parallel": 8, "expert_parallel": 8}, dp_ranks=8)[0] == 8
    # a profile pricing one of 8 DP ranks run as 1 rank (or a TP8 profile run as 2 ranks) is priced honestly
    with pytest.raises(ValueError, match="set dp_ranks = 8"):
        gpus_per_replica({"tensor_parallel": 1, "data_parallel": 8, "expert_parallel": 8})
    assert gpus_per_replica({"tensor_parallel": 8, "data_parallel": 1}, dp_ranks=2)[0] == 16
    assert gpus_per_replica({"tensor_parallel": 2, "expert_parallel": 4})[0] == 4
    assert gpus_per_replica({"tensor_parallel": 2}, dp_ranks=4)[0] == 8
    assert gpus_per_replica({})[0] == 0


def test_cost_in_the_plan_output(tmp_path, fake):
    spec = plan_from_dict(spec_dict())
    fake(params_for(spec, np.random.default_rng(2)))
    doc, _ = write_plan(run_plan(spec, tmp_path, backend="serial", progress=False), tmp_path)
    deps = {d.label: d for d in spec.deployments}
    seen = 0
    for sc in doc["scales"]:
        for c in sc["cheapest"].values():
            if not c["feasible"]:
                continue
            d = deps[c["deployment"]]
            price = PRICES[d.device]
            assert c["gpus"] == c["replicas"] * d.gpus_per_replica
            assert c["cost_per_hour"] == pytest.approx(c["replicas"] * d.gpus_per_replica * price)
            assert c["cost_per_mtok"] == pytest.approx(c["cost_per_hour"] / (3600 * c["output_throughput_tok_s"]) * 1e6)
            seen += 1
    assert seen
    assert {d.gpus_per_replica for d in spec.deployments if d.candidate == "c"} == {4}   # 70B TP4
    for name in ("plan.json", "spec.json", "cheapest.csv", "pareto.csv", "pareto.json", "probes.csv", "plan.png",
                 "plan.manifest.json"):
        assert (tmp_path / name).is_file(), name
    saved = json.loads((tmp_path / "spec.json").read_text())
    assert saved["prices_per_gpu_hour"] == PRICES and saved["slo"] == ["tps_user_p50 >= 60", "ttft_p99_s <= 2"]



def test_a_plan_with_a_failed_probe_is_not_marked_complete(tmp_path, fake):
    """plan.manifest.json said complete: true after probes had failed (sweep and capacity say false)."""
    spec = plan_from_dict(spec_dict())
    fake(params_for(spec, np.random.default_rng(2)))
    run = run_plan(spec, tmp_path, backend="serial", progress=False)
    write_plan(run, tmp_path)
    assert json.loads((tmp_path / "plan.manifest.json").read_text())["complete"] is True
    run.failures.append({"deployment": spec.deployments[0].label, "scale": 1.0, "replicas": 1, "error": "boom"})
    write_plan(run, tmp_path)
    man = json.loads((tmp_path / "plan.manifest.json").read_text())
    assert man["complete"] is False and man["n_failed"] == 1

def test_pareto_set_is_undominated(tmp_path, fake):
    spec = plan_from_dict(spec_dict(plan={"prune": False}))
    fake(params_for(spec, np.random.default_rng(3)))
    doc = summarize_plan(run_plan(spec, tmp_path, backend="serial", progress=False))
    for sc in doc["scales"]:
        rows = sc["pareto"]["all"]
        assert rows
        costs = [r["cost_per_hour"] for r in rows]
        speeds = [r["tps_user_median"] for r in rows]
        assert costs == sorted(costs) and speeds == sorted(speeds) and len(set(speeds)) == len(speeds)
        feas = [p for s in sc["searches"] for p in s["probes"] if p["feasible"]]
        for p in feas:   # no feasible probe beats a Pareto point on both axes
            assert not any(p["cost_per_hour"] < r["cost_per_hour"] and p["tps_user_median"] > r["tps_user_median"]
                           for r in rows)


def test_no_feasible_deployment_names_the_binding_slo(tmp_path, fake):
    d = spec_dict(plan={"slo": ["tps_user_p50 >= 1", "ttft_p99_s <= 0.0001"], "require_unsaturated": False})
    spec = plan_from_dict(d)
    fake(params_for(spec, np.random.default_rng(4)))
    doc = summarize_plan(run_plan(spec, tmp_path, backend="serial", progress=False))
    for sc in doc["scales"]:
        assert not sc["feasible"]
        assert sc["binding_slo"]["term"] == "ttft_p99_s <= 0.0001"
        assert sc["binding_slo"]["violated_by"] == len(spec.deployments)
        for c in sc["cheapest"].values():
            assert not c["feasible"] and c["binding_slo"]["term"] == "ttft_p99_s <= 0.0001"
        # each deployment was probed at its largest replica count, and that settled it (no bisection)
        for s in sc["searches"]:
            assert s["status"] == "infeasible" and max(p["replicas"] for p in s["probes"]) == \
                next(x.hi for x in spec.deployments if x.label == s["deployment"])
    txt = text_report(doc)
    assert "NO FEASIBLE DEPLOYMENT" in txt and "binding SLO ttft_p99_s <= 0.0001" in txt


def test_binding_slo_is_the_one_most_deployments_miss(tmp_path, fake):
    # speed is met nowhere for mtp1 only; ttft everywhere: ttft binds (missed by all), speed by some
    d = spec_dict(plan={"slo": ["tps_user_p50 >= 149.9", "ttft_p99_s <= 0.0001"], "require_unsaturated": False})
    spec = plan_from_dict(d)
    fake(params_for(spec, np.random.default_rng(5)))
    doc = summarize_plan(run_plan(spec, tmp_path, backend="serial", progress=False))
    b = doc["scales"][-1]["binding_slo"]
    assert b["term"] == "ttft_p99_s <= 0.0001"
    assert b["all"]["tps_user_p50 >= 149.9"]["violated_by"] <= b["violated_by"]


def test_feasibility_on_the_pessimistic_end_of_the_seed_interval():
    spec = plan_from_dict(spec_dict(plan={"slo": ["tps_user_p50 >= 95", "ttft_p99_s <= 2"], "seeds": [0, 1, 2]}))
    d = spec.deployments[0]
    runs = [{"tps_user_median": v, "ttft_p99_s": 1.0, "output_throughput_tok_s": 100.0} for v in (100, 110, 90)]
    m, lo, hi = interval([100, 110, 90], 0.95)
    assert m == 100 and lo == pytest.approx(100 - 4.302653 * 10 / math.sqrt(3), rel=1e-6) and hi > 110
    p = evaluate(spec, d, 2, runs, [], 1)
    assert not p.feasible   # mean 100 >= 95, but the lower end (75.2) is not
    assert p.metrics["tps_user_p50"]["mean"] == 100
    assert p.metrics["tps_user_p50"]["headroom"] == pytest.approx((lo - 95) / 95)
    tight = [{**r, "tps_user_median": v} for r, v in zip(runs, (100, 101, 99))]
    assert evaluate(spec, d, 2, tight, [], 1).feasible
    one = plan_from_dict(spec_dict(plan={"slo": ["tps_user_p50 >= 95"], "seeds": [0]}))
    assert evaluate(one, d, 2, runs[:1], [], 1).feasible   # one seed: the value itself
    # a saturated seed fails the probe; a missing value is a violation, not an error
    assert not evaluate(one, d, 2, [{**runs[0], "saturated": True}], [], 1).feasible
    p = evaluate(one, d, 2, [{**runs[0], "tps_user_median": None}], [], 1)
    assert not p.feasible and p.violations[0]["why"] == "no value"


def test_a_probe_that_rejected_requests_on_arrival_does_not_serve_its_traffic():
    """Requests beyond the KV capacity are rejected on arrival and the metrics cover only the admitted ones: a
    probe rejecting 94% of its requests met the SLO on the rest and was a feasible deployment."""
    one = plan_from_dict(spec_dict(plan={"slo": ["tps_user_p50 >= 95"], "seeds": [0]}))
    d = one.deployments[0]
    run = {"tps_user_median": 200.0, "output_throughput_tok_s": 100.0, "num_requests_issued": 364}
    assert evaluate(one, d, 2, [run], [], 1).feasible
    p = evaluate(one, d, 2, [{**run, "num_requests_rejected": 341, "rejected_by_reason": {"kv_capacity": 341,
                                                                                        "max_model_len": 0}}], [], 1)
    assert not p.feasible and p.violations == [{"term": "no request rejected on arrival (341 of 364 were; "
                                                        "kv_capacity: 341)", "headroom": None}]


def test_real_simulator_small_grid_equals_brute_force_and_is_monotone(tmp_path):
    """The real simulator on a tiny grid: the plan's answer equals running every replica count, feasibility is
    monotone in replicas, and a rerun is served from the cache."""
    from dsparksim.sim.simulate import simulate
    from dsparksim.sweep.cells import build_config

    d = {"plan": {"name": "real", "slo": ["tps_user_p50 >= 120", "ttft_p99_s <= 1"]},
         # rate 32: confidence needs 2 replicas, mtp1 3 (at 24 one replica read feasible under the old saturation
         # rule while its held requests grew; a 30 s run of it is saturated by queue and held counts alike)
         "traffic": {"rate": 32.0, "scales": [1.0], "duration_s": 3.0},
         "prices": {H100: 2.0},
         "candidates": [{"profile": "h100-llama2-7b-tp1", "replicas": [1, 4], "policies": ["mtp1", "confidence"],
                         "K": [7]}]}
    spec = plan_from_dict(d)
    run = run_plan(spec, tmp_path, backend="serial", progress=False)
    doc = summarize_plan(run)
    cache = {}

    def summaries(dep, scale, r):
        key = (dep.index, r)
        if key not in cache:
            cache[key] = [simulate(build_config(spec.options(dep, scale, r, s))).summary for s in spec.seeds]
        return cache[key]
    ref = brute_force(spec, summaries)
    for dep in spec.deployments:
        ok = [evaluate(spec, dep, r, summaries(dep, 1.0, r), [], 0).feasible for r in range(dep.lo, dep.hi + 1)]
        assert ok == sorted(ok), f"{dep.label}: feasibility not monotone in replicas: {ok}"
    for fam, c in doc["scales"][0]["cheapest"].items():
        want = ref[(fam, 1.0)]
        assert want is not None, "the case is chosen so both families are feasible within the range"
        assert (c["replicas"], c["cost_per_hour"]) == (want[1].replicas, want[1].cost_per_hour)
        assert c["tps_user_median"] == pytest.approx(want[1].speed)
    mt, cf = doc["scales"][0]["cheapest"]["mtp1"], doc["scales"][0]["cheapest"]["confidence"]
    assert mt["replicas"] > cf["replicas"]   # the saving line has something to say
    assert doc["scales"][0]["saving"]["saving_frac"] == pytest.approx(1 - cf["cost_per_hour"] / mt["cost_per_hour"])
    again = run_plan(spec, tmp_path, backend="serial", progress=False)
    assert again.n_ran == 0 and again.n_cached == run.n_cells
    assert summarize_plan(again)["scales"][0]["cheapest"] == doc["scales"][0]["cheapest"]


def test_built_profile_path_gpus_and_price_from_its_metadata(tmp_path, fake):
    """A profile given by path (e.g. one `dsparksim profile build` wrote) is priced by its own device and GPU
    count: here TP2 with 4-way expert parallelism -> 4 GPUs per replica."""
    from dsparksim.cost.profile import shipped_dir

    d = json.loads((shipped_dir() / "h100-llama2-7b-tp1.json").read_text())
    d["metadata"].update(device="NVIDIA H200", tensor_parallel=2, expert_parallel=4)
    d["name"] = "built-moe"
    path = tmp_path / "built.json"
    path.write_text(json.dumps(d))
    spec = plan_from_dict({"plan": {"slo": ["ttft_p99_s <= 2"]}, "traffic": {"rate": 4.0, "duration_s": 2.0},
                           "prices": {"NVIDIA H200": 4.5},
                           "candidates": [{"profile": str(path), "replicas": [1, 3], "policies": ["mtp1"]}]})
    dep = spec.deployments[0]
    assert (dep.gpus_per_replica, dep.price, dep.device) == (4, 4.5, "NVIDIA H200")
    assert "expert_parallel 4" in dep.gpus_note
    fake({(str(path), "mtp1", 1): 2.0})
    doc = summarize_plan(run_plan(spec, tmp_path / "o", backend="serial", progress=False))
    c = doc["scales"][0]["cheapest"]["mtp1"]
    assert c["cost_per_hour"] == c["replicas"] * 4 * 4.5


def test_cli_plan_prints_the_answer_and_writes_the_set(tmp_path, fake, capsys):
    from dsparksim.cli.main import main

    d = spec_dict()
    spec = plan_from_dict(d)
    fake(params_for(spec, np.random.default_rng(7)))
    p = tmp_path / "plan.toml"
    from plan_toml import toml
    p.write_text(toml(d))
    rc = main(["plan", str(p), "--out", str(tmp_path / "out"), "--backend", "serial"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "traffic x3.5 (rate 35 req/s):" in out and "saving at rate 35 req/s:" in out
    doc = json.loads((tmp_path / "out" / "plan.json").read_text())
    for fam, c in doc["scales"][0]["cheapest"].items():
        line = next(ln for ln in out.splitlines() if ln.strip().startswith(fam + " "))
        n, g = c["replicas"], c["gpus"]
        assert (f"{n} replica{'s' * (n != 1)}, {g} GPU{'s' * (g != 1)}, ${c['cost_per_hour']:.2f}/h" in line) \
            if c["feasible"] \
            else "no feasible deployment" in line



def test_cli_plan_says_how_many_failed_probes_it_did_not_print(tmp_path, monkeypatch, capsys):
    """Only the first 20 failed probes are printed; the rest were dropped without a word."""
    from dsparksim.cli.main import main
    from plan_toml import toml

    def run_cells(cells, out_dir, backend, workers, ray_address, bar):
        return {}, [{"cell": c.index, "error": "boom"} for c in cells], 0, len(cells)
    monkeypatch.setattr(search_mod, "run_cells", run_cells)
    p = tmp_path / "plan.toml"
    p.write_text(toml(spec_dict()))
    assert main(["plan", str(p), "--out", str(tmp_path / "out"), "--backend", "serial", "--quiet"]) == 1
    err = capsys.readouterr().err.splitlines()
    n = len(json.loads((tmp_path / "out" / "plan.json").read_text())["failures"])
    assert n > 20 and sum(ln.startswith("dsparksim: probe failed:") for ln in err) == 20
    assert f"dsparksim: ... and {n - 20} more failed probe(s) (plan.json: failures)" in err

def test_non_monotone_feasibility_is_reported(tmp_path, monkeypatch):
    """A deployment feasible at 1 replica but not at 4 (a router artefact, say) breaks the bisection's
    assumption: the report says so instead of passing it over."""
    spec = plan_from_dict({"plan": {"slo": ["ttft_p99_s <= 1"]}, "traffic": {"rate": 4.0, "duration_s": 2.0},
                           "prices": {H100: 1.0},
                           "candidates": [{"profile": "h100-llama2-7b-tp1", "replicas": [1, 4],
                                           "policies": ["mtp1"]}]})
    ttft = {1: 0.5, 2: 0.5, 3: 0.5, 4: 2.0}   # the first round probes both ends: 1 meets the SLO, 4 does not

    def run_cells(cells, out_dir, backend, workers, ray_address, bar):
        return ({c.index: {"ttft_p99_s": ttft[c.config.engine.replicas], "output_throughput_tok_s": 10.0,
                           "tps_user_median": 50.0} for c in cells}, [], 0, len(cells))
    monkeypatch.setattr(search_mod, "run_cells", run_cells)
    doc = summarize_plan(run_plan(spec, tmp_path, backend="serial", progress=False))
    se = doc["scales"][0]["searches"][0]
    assert se["replicas"] == 1
    assert se["monotonicity_violations"] == ["feasible at 1 replicas but not at 4"]
    assert "feasibility not monotone in replicas" in text_report(doc)
