"""Fleet runs sharded across processes (issue 28 part 7): the merged shards equal the one-process run bit for bit,
for every request-only router, open and closed loop; load-aware routers and shared resources refuse, in one line."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest

from dsparksim.config import RunConfig
from dsparksim.errors import ConfigError
from dsparksim.sim.routers import REGISTRY, request_only_names
from dsparksim.sim.shard import merge, refusal, shard_ranges, simulate_part, simulate_sharded
from dsparksim.sim.simulate import simulate, write_run
from dsparksim.sweep.fleet import run_fleet
from dsparksim.traffic import TrafficConfig


def _cfg(router: str, replicas: int = 4, policy: str = "confidence", **traffic) -> RunConfig:
    c = RunConfig(policy=policy, traffic=TrafficConfig(**traffic), seed=3)
    return c.replace(engine=dataclasses.replace(c.engine, replicas=replicas, router=router))


def _serial(cfg, ranges):
    return [simulate_part(cfg, lo, hi) for lo, hi in ranges]


def _files(out, d) -> dict[str, bytes]:
    write_run(out, d, steps=True)
    files = {p.name: p.read_bytes() for p in sorted(d.iterdir())}
    bench = json.loads(files.pop("bench_result.json"))
    bench.pop("date")            # the wall-clock date of writing, the one field that is not the run's
    files["bench_result.json"] = json.dumps(bench).encode()
    return files


def _sessions_trace(tmp_path) -> str:
    rng = np.random.default_rng(0)
    conv = rng.integers(0, 12, 150)                    # 12 conversations behind one shared system block
    p = tmp_path / "t.jsonl"
    p.write_text("".join(json.dumps({"timestamp": 60 * i, "input_length": 200, "output_length": 30,
                                     "hash_ids": [0, 100 + int(c), 1000 + i]}) + "\n" for i, c in enumerate(conv)))
    return str(p)


OPEN = [dict(mode="poisson", rate=14.0, duration_s=8.0), dict(mode="gamma", rate=14.0, burstiness=0.5,
                                                               num_requests=70)]
CLOSED = [dict(mode="closed", concurrency=23, duration_s=8.0), dict(mode="closed", concurrency=9, num_requests=60)]


def _cases(tmp_path):
    for router in request_only_names():
        if REGISTRY[router].needs_session:
            yield router, dict(mode="trace", trace=_sessions_trace(tmp_path), duration_s=8.0)
            continue
        yield from ((router, t) for t in OPEN)
        if REGISTRY[router].pins_users:
            yield from ((router, t) for t in CLOSED)


def test_sharded_run_writes_the_same_bytes_for_every_request_only_router(tmp_path):
    cases = list(_cases(tmp_path))
    assert {r for r, _ in cases} == set(request_only_names()) >= {"round-robin", "random", "pinned", "session-hash"}
    assert any(t["mode"] == "closed" for _, t in cases)
    for i, (router, traffic) in enumerate(cases):
        cfg = _cfg(router, **traffic)
        one = simulate(cfg)
        assert len(set(one.requests()["replica"])) >= 3, (router, traffic)      # the fleet is really used
        split = simulate_sharded(cfg, 3, _serial)          # replicas 0 | 1 | 2-3
        assert _files(split, tmp_path / f"s{i}") == _files(one, tmp_path / f"o{i}"), (router, traffic)


@pytest.mark.parametrize("router, traffic", [("round-robin", OPEN[0]), ("pinned", CLOSED[1])])
def test_sharded_run_with_rejections_writes_the_same_bytes(router, traffic, tmp_path):
    # a small KV cache rejects some requests on arrival: never routed, they belong to no replica (open loop: every
    # shard sees them alike; closed loop: the pinned user's shard)
    cfg = _cfg(router, **traffic)
    cfg = cfg.replace(engine=dataclasses.replace(cfg.engine, kv_capacity_tokens=2500))
    one = simulate(cfg)
    assert one.requests()["rejected"].sum() >= 5
    assert _files(simulate_sharded(cfg, 3, _serial), tmp_path / "s") == _files(one, tmp_path / "o")


def test_local_pool_shards_equal_one_process_with_dp_ranks(tmp_path):
    c = _cfg("pinned", replicas=3, mode="closed", concurrency=12, duration_s=10.0)
    c = c.replace(engine=dataclasses.replace(c.engine, dp_ranks=2))
    one = simulate(c)
    pool = run_fleet(c, backend="local", workers=2)
    assert _files(pool, tmp_path / "p") == _files(one, tmp_path / "o")


def test_pinned_users_stay_on_their_engine(tmp_path):
    # 10 users on 4 engines: 3, 3, 2, 2 users; an engine never serves more requests at once than its users
    out = simulate(_cfg("pinned", mode="closed", concurrency=10, duration_s=15.0))
    st = out.result.steps
    busy = st["n_running"] + st["n_waiting"]
    for e, users in enumerate((3, 3, 2, 2)):
        assert busy[st["replica"] == e].max() == users
    req = out.requests()
    assert (req["replica"] == req["request_id"] % 4).all()
    assert (np.diff(req["request_id"]) > 0).all()


@pytest.mark.parametrize("router", sorted(set(REGISTRY) - set(request_only_names())))
def test_load_aware_routers_refuse_sharding_in_one_line(router):
    assert not REGISTRY[router].request_only
    cfg = _cfg(router, mode="poisson", rate=4.0, duration_s=5.0)
    why = refusal(cfg)
    assert why is not None and "reads the replicas' load" in why and "\n" not in why
    with pytest.raises(ConfigError, match="cannot shard"):
        run_fleet(cfg, backend="serial", workers=2)


@pytest.mark.parametrize("router, traffic, engine, needle", [
    ("round-robin", dict(mode="closed", concurrency=8, duration_s=5.0), {}, "use --router pinned"),
    ("random", dict(mode="poisson", rate=4.0, num_requests=20, max_concurrency=4), {}, "concurrency cap"),
    ("pinned", dict(mode="poisson", rate=4.0, num_requests=20, num_warmup_prompts=2), {}, "warm-up"),
    ("pinned", dict(mode="poisson", rate=4.0, duration_s=5.0), dict(disaggregated=True, kv_transfer_gbps=100.0),
     "prefill pool"),
])
def test_shared_resources_refuse_sharding(router, traffic, engine, needle):
    cfg = _cfg(router, **traffic)
    cfg = cfg.replace(engine=dataclasses.replace(cfg.engine, **engine))
    assert needle in (refusal(cfg) or "")
    with pytest.raises(ConfigError, match="cannot shard"):
        run_fleet(cfg, backend="serial", workers=2)


def test_request_only_routers_never_read_the_engines():
    class Table:
        session = np.arange(50) % 23
    for name in request_only_names():
        a, b = REGISTRY[name](5, seed=2), REGISTRY[name](5, seed=2)
        got = [a.route(row, None, Table) for row in range(50)]   # engines=None: any read would fail
        assert got == [b.route(row, None, Table) for row in range(50)]
        assert set(got) == set(range(5))


def test_shard_ranges_and_merge_checks_cover_every_replica():
    assert shard_ranges(10, 3) == [(0, 3), (3, 6), (6, 10)]
    assert shard_ranges(2, 16) == [(0, 1), (1, 2)]
    cfg = _cfg("pinned", mode="poisson", rate=6.0, duration_s=4.0)
    with pytest.raises(ValueError, match="do not cover"):
        merge([simulate_part(cfg, 0, 2), simulate_part(cfg, 3, 4)])


def test_cli_refusal_is_one_line_exit_2(tmp_path):
    r = subprocess.run([sys.executable, "-m", "dsparksim.cli.main", "run", "--replicas", "4", "--router",
                        "least-outstanding", "--duration", "5", "--workers", "2", "--out", str(tmp_path / "o")],
                       capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "least-outstanding' reads the replicas' load" in r.stderr
    assert not (tmp_path / "o").exists()


def test_ray_address_without_ray_backend_names_what_was_given(tmp_path, capsys):
    from dsparksim.cli.main import main

    base = ["run", "--replicas", "2", "--router", "pinned", "--concurrency", "2", "--duration", "1", "--quiet"]
    assert main([*base, "--ray-address", "auto", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "got no --backend" in err and "None" not in err, err
    assert main([*base, "--backend", "serial", "--ray-address", "auto", "--out", str(tmp_path / "o")]) == 2
    assert "got --backend serial" in capsys.readouterr().err and not (tmp_path / "o").exists()
