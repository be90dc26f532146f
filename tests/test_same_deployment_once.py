"""Issue 31 item 11: the same deployment is run once -- cells that differ only in options their run never reads are
collapsed (and said so) in sweep, frontier and plan; an option that no policy of the command reads is refused, alike
in run, frontier, sweep and plan."""
from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pandas as pd
import pytest

from dsparksim.cli.main import main
from dsparksim.config import RunConfig
from dsparksim.errors import ConfigError
from dsparksim.sim.reads import identity, same_as
from dsparksim.sim.simulate import simulate
from dsparksim.sweep.spec import spec_from_dict

sys.path.insert(0, str(Path(__file__).parent))
from plan_toml import toml  # noqa: E402


def _cfg(**kw) -> RunConfig:
    eng = {k: kw.pop(k) for k in ("block_size", "router", "replicas") if k in kw}
    base = RunConfig.from_options({"concurrency": 4, "duration_s": 3.0, **kw})
    return base.replace(engine=dataclasses.replace(base.engine, **eng)) if eng else base


@pytest.mark.parametrize("a,b", [
    (dict(policy="mtp1", acceptance="dspark", block_size=4), dict(policy="mtp1", acceptance="dflash", block_size=7)),
    (dict(policy="none", acceptance="dflash", block_size=3, confidence="raw"), dict(policy="none")),
    (dict(policy="fixed:7", confidence="raw"), dict(policy="fixed:7", confidence="sts")),
    (dict(policy="fixed:7", mtp1_acceptance="mtp1-v4"), dict(policy="fixed:7")),
    (dict(policy="fixed:7", router="least-outstanding"), dict(policy="fixed:7", router="round-robin")),
])
def test_configs_with_one_identity_are_the_same_run(a, b):
    # the claim the collapsing rests on: equal identity -> bit-identical summaries
    ca, cb = _cfg(**a), _cfg(**b)
    assert ca != cb and identity(ca) == identity(cb) and same_as([ca, cb]) == [None, 0]
    assert simulate(ca).summary == simulate(cb).summary


def test_options_that_are_read_keep_cells_apart():
    cfgs = [_cfg(policy="fixed:7", acceptance="dspark"), _cfg(policy="fixed:7", acceptance="dflash"),
            _cfg(policy="confidence", confidence="raw"), _cfg(policy="confidence"),
            _cfg(policy="fixed:7", router="least-outstanding", replicas=2), _cfg(policy="fixed:7", replicas=2)]
    assert same_as(cfgs) == [None] * 6


SWEEP = {"sweep": {"name": "dup"}, "base": {"duration_s": 2.0},
         "axes": {"policy": ["mtp1", "fixed:7"], "acceptance": ["dspark", "dflash"], "concurrency": [2]}}


def test_sweep_runs_an_identical_cell_once_and_says_so(tmp_path, capsys):
    spec = tmp_path / "s.toml"
    spec.write_text('[sweep]\nname = "dup"\n[base]\nduration_s = 2.0\n[axes]\npolicy = ["mtp1", "fixed:7"]\n'
                    'acceptance = ["dspark", "dflash"]\nconcurrency = [2]\n')
    out = tmp_path / "out"
    assert main(["sweep", str(spec), "--out", str(out), "--backend", "serial"]) == 0
    printed = capsys.readouterr().out
    assert "4 cells (3 runs" in printed and "1 repeat" in printed and "mtp1 reads no acceptance" in printed
    t = pd.read_csv(out / "results.csv")
    assert len(t) == 4 and "same_as" in t
    mtp1 = t[t["cfg.policy"] == "mtp1"]
    assert list(mtp1["same_as"].isna()) == [True, False] and mtp1["same_as"].dropna().iloc[0] == mtp1["cell"].iloc[0]
    assert mtp1["output_throughput_tok_s"].nunique() == 1        # the repeat carries the one run's result
    assert len(list((out / "cells").rglob("*.json"))) <= 3 * 2   # three runs cached, not four
    assert json.loads((out / "sweep.json").read_text())["n_runs"] == 3


@pytest.mark.parametrize("change,field", [
    ({"base": {"duration_s": 2.0, "block_size": 4}, "axes": {"policy": ["mtp1", "none"], "concurrency": [2]}},
     "base.block_size"),
    ({"base": {"duration_s": 2.0}, "axes": {"policy": ["mtp1"], "acceptance": ["dspark", "dflash"],
                                            "concurrency": [2]}}, "axes.acceptance"),
    ({"base": {"duration_s": 2.0, "confidence": "raw"}, "axes": {"policy": ["fixed:7", "mtp1"], "concurrency": [2]}},
     "base.confidence"),
    ({"base": {"duration_s": 2.0}, "axes": {"policy": ["fixed:7"], "router": ["round-robin", "least-outstanding"],
                                            "concurrency": [2]}}, "axes.router"),
])
def test_sweep_refuses_an_option_no_policy_reads(change, field):
    with pytest.raises(ConfigError) as e:
        spec_from_dict({"sweep": {"name": "x"}, **change})
    assert e.value.field == field and "no effect" in str(e.value)


FRONTIER = ["frontier", "--concurrency-levels", "2", "--duration", "2", "--workers", "1", "--quiet"]


def test_frontier_runs_one_replica_once_whatever_the_router(tmp_path, capsys):
    out = tmp_path / "f"
    assert main([*FRONTIER, "--policies", "fixed:7", "--replicas", "1,2", "--router",
                 "round-robin,least-outstanding", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "dsparksim: note:" in err and "x1 least-outstanding" in err and "x1 round-robin" in err
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["deployments"] == ["x1 round-robin", "x2 round-robin", "x2 least-outstanding"]
    assert len(pd.read_csv(out / "frontier.csv")) == 3


@pytest.mark.parametrize("args,flag", [
    (["--policies", "mtp1,none", "-K", "3"], "--num-speculative-tokens"),
    (["--policies", "mtp1,none", "--acceptance", "dflash"], "--acceptance"),
])
def test_frontier_refuses_an_option_no_policy_reads_as_run_does(tmp_path, capsys, args, flag):
    rc = main([*FRONTIER, *args, "--out", str(tmp_path / "g")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("dsparksim: error:") and flag in err[0]
    assert "no effect" in err[0]
    rc = main(["run", "--policy", "none", *args[2:], "--out", str(tmp_path / "h")])   # run: the same rule
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and flag in err[0] and "no effect" in err[0]


def _plan(tmp_path, *cands: dict):
    from dsparksim.plan import load_plan
    p = tmp_path / "plan.toml"
    p.write_text(toml({"plan": {"slo": ["tps_user_p50 >= 10"]}, "traffic": {"rate": 2.0, "duration_s": 2.0},
                       "prices": {"H100": 3.0}, "candidates": list(cands)}))
    return load_plan(p)


C = {"name": "a", "profile": "h100-llama2-7b-tp1", "replicas": [1, 2]}


def test_plan_runs_none_once_not_once_per_k(tmp_path):
    spec = _plan(tmp_path, {**C, "policies": ["none", "fixed:3", "confidence"], "K": [3, 7]})
    labels = [d.label for d in spec.deployments]
    assert sum(d.policy == "none" for d in spec.deployments) == 1
    assert not any("none K=" in x for x in labels)
    assert sum(d.policy == "confidence" for d in spec.deployments) == 2


def test_plan_collapses_identical_deployments_and_says_so(tmp_path):
    spec = _plan(tmp_path, {**C, "policies": ["mtp1", "fixed:7"], "acceptance": ["dspark", "dflash"]})
    assert sum(d.policy == "mtp1" for d in spec.deployments) == 1
    assert len(spec.collapsed) == 1 and "mtp1" in spec.collapsed[0]["label"]
    assert "same run as" in spec.to_dict()["collapsed"][0]["why"]


def test_plan_refuses_duplicate_candidate_names_and_unread_options(tmp_path):
    c = {**C, "policies": ["mtp1"]}
    with pytest.raises(ConfigError, match="candidates\\[1\\].name"):
        _plan(tmp_path, c, c)
    with pytest.raises(ConfigError) as e:
        _plan(tmp_path, {**c, "K": [3, 7]})
    assert e.value.field == "candidates[0].K" and "no effect" in str(e.value)
