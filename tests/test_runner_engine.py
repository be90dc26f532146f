torch = __import__("pytest").importorskip("torch")

import json  # noqa: E402
from dataclasses import replace  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from dsparksim.config import EngineConfig, RunConfig  # noqa: E402
from dsparksim.errors import ConfigError  # noqa: E402
from dsparksim.results.frontier import frontier_table  # noqa: E402
from dsparksim.cost.profile import save_profile  # noqa: E402
from dsparksim.sim.simulate import simulate, write_run  # noqa: E402
from dsparksim.traffic import TrafficConfig  # noqa: E402

from dsparksim.backend.model import ModelConfig, TargetModel  # noqa: E402
from dsparksim.runner.executor import ExecutorConfig  # noqa: E402
from dsparksim.runner.flat import FlatForward, KVPool, make_group  # noqa: E402
from dsparksim.runner.grid import MeasureConfig  # noqa: E402
from dsparksim.runner.measure import measure  # noqa: E402
from dsparksim.runner.run import RunnerConfig, real_run  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TRACE = str(REPO / "traces" / "sample_dspark_k7.csv")
TINY = "tiny,n_layers=1,d_model=32,n_heads=2,n_kv_heads=1,d_ff=64,vocab_size=128"


def test_flat_forward_matches_full_causal_pass():
    torch.manual_seed(0)
    m = TargetModel(ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=48)).eval()
    ff = FlatForward(m)
    pool = KVPool(m, 3, 40, torch.device("cpu"), torch.float32)
    a, b = torch.randint(0, 64, (20,)), torch.randint(0, 64, (13,))
    g, pos = make_group(0, [2, 0], [10, 7], [0, 0], "cpu")         # two prefill chunks in one forward
    ff(torch.cat([a[:10], b[:7]]), pos, [g], pool)
    g, pos = make_group(0, [2, 0], [10, 6], [10, 7], "cpu")        # variable-length runs, one forward
    lg = ff(torch.cat([a[10:], b[7:]]), pos, [g], pool)
    with torch.no_grad():
        ra, rb = m(a[None])[1][0, 10:], m(b[None])[1][0, 7:]
    assert torch.allclose(lg[:10], ra, atol=1e-4) and torch.allclose(lg[10:], rb, atol=1e-4)


@pytest.fixture(scope="module")
def tiny_profile(tmp_path_factory):
    ex = ExecutorConfig(seed=0)
    mc = MeasureConfig(
        model=TINY, drift_gate=None, executor=ex, K=7, n_reqs=(1, 2, 3, 4, 6, 8), contexts=(16, 48), reps=3,
        min_growth=0.0)
    prof, _ = measure(mc, progress=False, log=lambda s: None)
    path = tmp_path_factory.mktemp("prof") / "p.json"
    save_profile(prof, path)
    return str(path), prof


def _cfg(profile, policy="confidence", users=3, n=6, K=7):
    t = TrafficConfig(mode="closed", concurrency=users, num_requests=n, lengths="sharegpt", max_prompt_tokens=None,
                      domain="mix:math=1,code=1,chat=1")
    return RunConfig(policy=policy, profile=profile, acceptance=TRACE, engine=EngineConfig(block_size=K,
                     max_num_seqs=users, max_batched_tokens=64, prefill_chunk_tokens=32), traffic=t, seed=3)


def _short_lengths(tmp_path):
    p = tmp_path / "len.csv"
    rng = np.random.default_rng(0)
    rows = "\n".join(f"{a},{b}" for a, b in zip(rng.integers(4, 20, 30), rng.integers(8, 30, 30)))
    p.write_text("num_prefill_tokens,num_decode_tokens\n" + rows + "\n")
    return str(p)


def test_real_run_matches_simulated_decisions_and_writes_same_files(tiny_profile, tmp_path):
    path, _ = tiny_profile
    cfg = _cfg(path)
    cfg = cfg.replace(traffic=replace(cfg.traffic, lengths=_short_lengths(tmp_path)))
    rc = RunnerConfig(model=TINY)
    real = real_run(cfg, rc)
    sim = simulate(cfg)
    r, s = real.result, sim.result
    # Same scheduler, policy objects, acceptance stream and (closed-loop) order: the per-request decisions agree
    # exactly; only the clock differs.
    assert r.completed.all() and (r.emitted_tokens == r.output_tokens).all()
    np.testing.assert_array_equal(r.decode_steps, s.decode_steps)
    np.testing.assert_array_equal(r.verify_tokens, s.verify_tokens)
    np.testing.assert_array_equal(r.accepted_tokens, s.accepted_tokens)
    assert real.summary["mean_verify_len"] == pytest.approx(sim.summary["mean_verify_len"])
    st = r.steps
    assert np.allclose(st["dt"], st["t_draft"] + st["t_target"] + st["t_host"])
    assert (st["t_target"] > 0).all()
    d = write_run(real, tmp_path / "real")
    assert json.loads(d["summary"].read_text())["engine"] == "real"
    df = frontier_table([real.summary, sim.summary | {"policy": "confidence-sim"}])
    assert set(df["policy"]) == {"confidence", "confidence-sim"}


def test_profile_from_another_model_is_refused(tiny_profile, tmp_path):
    path, prof = tiny_profile
    other = json.loads(json.dumps(prof))
    other["metadata"]["runner_model"] = "something else"
    p2 = tmp_path / "other.json"
    save_profile(other, p2)
    with pytest.raises(ConfigError, match="runner_model"):
        real_run(_cfg(str(p2)), RunnerConfig(model=TINY))


def test_trace_with_other_K_is_refused(tiny_profile):
    path, _ = tiny_profile
    with pytest.raises(ConfigError, match="K mismatch"):
        real_run(_cfg(path, K=5), RunnerConfig(model=TINY))


def test_kv_capacity_beyond_device_is_refused(tiny_profile):
    path, _ = tiny_profile
    cfg = _cfg(path)
    cfg = cfg.replace(engine=replace(cfg.engine, kv_capacity_tokens=10**15))
    with pytest.raises(ConfigError, match="kv_capacity_tokens"):
        real_run(cfg, RunnerConfig(model=TINY))


def test_run_real_cli_writes_the_run_result_files(tiny_profile, tmp_path):
    from dsparksim.cli.main import main
    path, _ = tiny_profile
    out = tmp_path / "rr"
    rc = main(["run-real", "--model", TINY, "--profile", path, "--policy", "fixed:7", "--concurrency", "2",
               "--num-requests", "4", "--lengths", _short_lengths(tmp_path), "--max-batched-tokens", "64",
               "--prefill-chunk", "32", "--out", str(out), "--quiet"])
    assert rc == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["engine"] == "real" and s["num_requests_completed"] == 4 and s["mean_verify_len"] == pytest.approx(7.0)
    for f in ("config.json", "requests.csv", "bench_result.json", "steps.csv"):
        assert (out / f).is_file()


def test_real_engine_refuses_replicas_and_dp_ranks():
    for k in ("replicas", "dp_ranks"):
        cfg = _cfg("unused-profile.json")
        with pytest.raises(ConfigError, match=f"{k}=2"):
            real_run(cfg.replace(engine=replace(cfg.engine, **{k: 2})), RunnerConfig(model=TINY))


def test_open_loop_real_run_waits_for_arrivals_without_sleeping(tiny_profile, tmp_path):
    # Poisson arrivals at 3/s over 6 s on a tiny target: the engine is idle most of the time. An idle engine wakes at
    # the next arrival (the clock jumps there, nothing sleeps), so every step that does not follow the previous one
    # back to back starts exactly at a request's arrival; the run ends at the horizon.
    path, _ = tiny_profile
    t = TrafficConfig(mode="poisson", rate=3.0, duration_s=6.0, lengths=_short_lengths(tmp_path),
                      max_prompt_tokens=None, domain="chat")
    cfg = RunConfig(policy="confidence", profile=path, acceptance=TRACE, engine=EngineConfig(
        block_size=7, max_num_seqs=4, max_batched_tokens=64, prefill_chunk_tokens=32), traffic=t, seed=5)
    r = real_run(cfg, RunnerConfig(model=TINY)).result
    assert r.ended_by == "duration" and r.sim_time_s == 6.0 and len(r.arrival_s) >= 5
    st = r.steps
    start, end = st["t_start"], st["t_start"] + st["dt"]
    gap = np.flatnonzero(~np.isclose(start[1:], end[:-1], rtol=0, atol=1e-9)) + 1
    assert len(gap) >= 3 and start[0] == r.arrival_s[0]
    for i in gap:
        assert start[i] > end[i - 1] and np.isin(start[i], r.arrival_s), (i, start[i])
    assert st["dt"].sum() < 0.5 * r.sim_time_s           # mostly idle: the clock jumped over the gaps
