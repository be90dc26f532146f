"""Ray backend: the same sweep on a local 2-CPU Ray instance gives the serial results bit for bit."""
from __future__ import annotations

import os

import pandas as pd
import pytest

from dsparksim.sweep import expand, run_sweep, spec_from_dict
from dsparksim.sweep.backends import RayBackend, Task

ray = pytest.importorskip("ray", reason="Ray is an optional extra (pip install 'dsparksim[ray]'); not installed")

# 3 policies x 2 loads x 2 output limits: the max_output_tokens=40 cells raise at run time (sampled requests exceed
# it), so the same run also checks that failures come back per cell.
SPEC = {"base": {"duration_s": 3.0, "domain": "mix:math=1,code=1,chat=1"},
        "axes": {"max_output_tokens": [100000, 40], "policy": ["mtp1", "confidence", "oracle"],
                 "concurrency": [2, 16]}}


def test_ray_matches_serial_bit_for_bit(tmp_path):
    assert not ray.is_initialized()
    spec = spec_from_dict(SPEC)
    a = run_sweep(spec, tmp_path / "serial", backend="serial", progress=False)
    b = run_sweep(spec, tmp_path / "ray", backend="ray", workers=2, progress=False)  # starts a local instance
    assert not ray.is_initialized()  # ... and shuts it down
    assert b.n_ran == 12 and len(b.table) == 6
    pd.testing.assert_frame_equal(a.table, b.table, check_exact=True)
    assert a.table["output_throughput_tok_s"].nunique() == 6
    assert [f["cell"] for f in b.failures] == [f["cell"] for f in a.failures] == list(range(6, 12))
    assert all("max_output_tokens" in f["error"] for f in b.failures)


@pytest.fixture()
def local_ray():
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_ray_reuses_a_running_instance_and_runs_in_workers(local_ray):
    cells = expand(spec_from_dict({"base": {"duration_s": 3.0, "policy": "mtp1"}, "axes": {"concurrency": [2, 4]}}))
    got = {}
    RayBackend(workers=2).run([Task(c.index, c.config) for c in cells], lambda r: got.__setitem__(r["index"], r))
    assert got[0]["ok"] and got[1]["ok"] and got[0]["pid"] != os.getpid()
    assert ray.is_initialized()  # an instance the backend did not start is left running


def test_fleet_shards_on_ray_equal_one_process(local_ray):
    # issue 28 part 7: a fleet's replicas sharded across Ray workers merge into the one-process result
    import dataclasses

    from dsparksim.config import RunConfig
    from dsparksim.sim.simulate import simulate
    from dsparksim.sweep.fleet import run_fleet
    from dsparksim.traffic import TrafficConfig

    cfg = RunConfig(policy="confidence", traffic=TrafficConfig(mode="closed", concurrency=12, duration_s=5.0), seed=4)
    cfg = cfg.replace(engine=dataclasses.replace(cfg.engine, replicas=4, router="pinned"))
    one, split = simulate(cfg), run_fleet(cfg, backend="ray", workers=2)
    assert split.summary == one.summary and split.summary["num_requests_completed"] > 0
    pd.testing.assert_frame_equal(split.requests(), one.requests(), check_exact=True)
    pd.testing.assert_frame_equal(pd.DataFrame(split.result.steps), pd.DataFrame(one.result.steps), check_exact=True)
