"""Sweeps: spec validation, cell hashing/caching, serial vs pool identity, failures, kill-and-resume, CLI."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from dsparksim.cli.main import main
from dsparksim.errors import ConfigError, InputError
from dsparksim.sweep import expand, load_spec, run_sweep, spec_from_dict
from dsparksim.sweep.cells import build_config, cell_hash

REPO = Path(__file__).resolve().parents[1]

SMALL = {"sweep": {"name": "small"},
         "base": {"duration_s": 3.0, "domain": "mix:math=1,code=1,chat=1"},
         "axes": {"policy": ["mtp1", "confidence"], "concurrency": [2, 16], "seed": [0, 1]}}


def _write_spec(tmp_path: Path, d: dict, name: str = "spec.toml") -> Path:
    def val(v):
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, list):
            return "[" + ", ".join(val(x) for x in v) + "]"
        return repr(v)

    lines = []
    for table, kv in d.items():
        lines.append(f"[{table}]")
        lines += [f"{k} = {val(v)}" for k, v in kv.items()]
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n")
    return p


# ---- validation: a clear error naming the field, before any work ----

@pytest.mark.parametrize("patch, field, words", [
    ({"axes": {"polcy": ["mtp1"]}}, "axes.polcy[0]", "unknown key"),
    ({"axes": {"seed": []}}, "axes.seed", "empty axis"),
    ({"axes": {"policy": ["mtp1", "fixed:abc"]}}, "axes.policy[1]", "invalid policy"),
    ({"axes": {"profile": ["no/such/profile.json"]}}, "axes.profile[0]", "not found"),
    ({"axes": {"acceptance": ["dspark", "missing_trace.csv"]}}, "axes.acceptance[1]", "not found"),
    ({"base": {"lengths": "nope/lengths.csv"}}, "base.lengths", "cannot be read"),
    ({"axes": {"seed": [0, 0]}}, "axes.seed[1]", "duplicate"),
    ({"axes": {"concurrency": 8}}, "axes.concurrency", "list"),
    ({"base": {"seed": 1.5}}, "base.seed", "expected int"),
    ({"base": {"rate": 2.0}}, "rate", "only one load key"),
    ({"tables": {"x": 1}}, "tables", "unknown table"),
    # TOML integers are 64-bit; a larger one used to run every cell, then crash writing results.parquet
    ({"base": {"batch_wait_max_tokens_ratio": 0.5}, "axes": {"batch_wait_timeout_iters": [5, 10**20]}},
     "axes.batch_wait_timeout_iters[1]", "expected a 64-bit integer"),
    ({"base": {"kv_capacity_tokens": 2**63}}, "base.kv_capacity_tokens", "got 9223372036854775808"),
])
def test_spec_validation_names_the_field(tmp_path, patch, field, words):
    d = json.loads(json.dumps(SMALL))
    for t, kv in patch.items():
        d.setdefault(t, {}).update(kv)
    p = _write_spec(tmp_path, d)
    with pytest.raises(ConfigError) as ei:
        load_spec(p)
    msg = str(ei.value)
    assert str(p) in msg and f"field '{field}'" in msg and words in msg, msg


def test_cli_sweep_refuses_an_integer_beyond_64_bits_before_any_cell(tmp_path, capsys):
    d = json.loads(json.dumps(SMALL))
    d["axes"]["dp_balance_wait_iters"] = [1, 10**20]
    d["base"].update(dp_ranks=2, dp_balance_timeout_iters=5)
    out = tmp_path / "out"
    assert main(["sweep", str(_write_spec(tmp_path, d)), "--out", str(out), "--backend", "serial", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "axes.dp_balance_wait_iters[1]" in err[0] and str(10**20) in err[0], err
    assert not out.exists()


def test_unreadable_spec_and_bad_toml_are_input_errors(tmp_path):
    with pytest.raises(InputError, match="cannot read sweep spec"):
        load_spec(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[axes\npolicy = 1\n")
    with pytest.raises(InputError, match="not valid TOML"):
        load_spec(bad)


def test_cell_config_matches_dsparksim_run_defaults():
    # A cell is exactly the run `dsparksim run` builds: lazy closed-loop requests, default domain, engine defaults.
    from dsparksim.cli.main import _run_config, _traffic, build_parser

    args = build_parser().parse_args(["run", "--concurrency", "16", "--duration", "3", "--policy", "mtp1"])
    want = _run_config(args, _traffic(args, "closed", concurrency=16))
    got = build_config({"policy": "mtp1", "concurrency": 16, "duration_s": 3.0})
    assert got == want
    assert got.traffic.pool_size is None  # no pool sized from the load: requests are generated as users need them


def test_cell_order_and_count_follow_the_axes():
    cells = expand(spec_from_dict(SMALL))
    assert len(cells) == 8
    assert [c.key for c in cells[:3]] == [{"policy": "mtp1", "concurrency": 2, "seed": 0},
                                          {"policy": "mtp1", "concurrency": 2, "seed": 1},
                                          {"policy": "mtp1", "concurrency": 16, "seed": 0}]
    assert len({c.hash for c in cells}) == 8


def test_cell_hash_covers_input_file_bytes(tmp_path):
    src = REPO / "profiles" / "h100-llama2-7b-tp1.json"
    prof = tmp_path / "p.json"
    shutil.copy(src, prof)
    cfg = build_config({"profile": str(prof), "duration_s": 3.0})
    h1 = cell_hash(cfg)
    assert cell_hash(build_config({"profile": str(prof), "duration_s": 3.0})) == h1  # stable
    d = json.loads(prof.read_text())
    d["fixed_overhead_s"] = d["fixed_overhead_s"] + 1e-4
    prof.write_text(json.dumps(d))
    os.utime(prof, ns=(1, 1))  # a different mtime too, as any edit gives
    assert cell_hash(cfg) != h1  # same path, same config, different bytes -> different cell
    assert cell_hash(cfg.replace(seed=1)) != cell_hash(cfg)


# ---- running: identity across backends, cache, failures ----

def test_serial_and_pool_give_identical_tables_and_cache_skips(tmp_path):
    spec = spec_from_dict(SMALL)
    a = run_sweep(spec, tmp_path / "serial", backend="serial", progress=False)
    b = run_sweep(spec, tmp_path / "pool", backend="local", workers=2, progress=False)
    assert a.ok and b.ok and a.n_ran == 8 and len(a.table) == 8
    pd.testing.assert_frame_equal(a.table, b.table, check_exact=True)
    # the policies really differ (the identity is not vacuous)
    assert a.table["output_throughput_tok_s"].nunique() == 8
    # files on disk: the table round-trips exactly through Parquet
    pq = pd.read_parquet(tmp_path / "pool" / "results.parquet")
    pd.testing.assert_frame_equal(pq, b.table, check_exact=True)
    # rerun: every cell is cached, nothing runs, same table
    c = run_sweep(spec, tmp_path / "pool", backend="local", workers=2, progress=False)
    assert (c.n_cached, c.n_ran) == (8, 0)
    pd.testing.assert_frame_equal(c.table, b.table, check_exact=True)
    # extending an axis only runs the new cells
    d = run_sweep(spec.with_axes(seed=[0, 1, 2]), tmp_path / "pool", backend="serial", progress=False)
    assert (d.n_cached, d.n_ran) == (8, 4)


def test_a_failing_cell_is_reported_and_the_rest_complete(tmp_path):
    # max_output_tokens=40 is valid config, but sampled requests exceed it: the workload build raises at run time.
    spec = spec_from_dict({"base": {"duration_s": 3.0, "policy": "mtp1"},
                           "axes": {"max_output_tokens": [100000, 40], "concurrency": [2, 8]}})
    for backend in ("serial", "local"):
        out = tmp_path / backend
        res = run_sweep(spec, out, backend=backend, workers=2, progress=False)
        assert not res.ok and [f["cell"] for f in res.failures] == [2, 3]
        assert all("max_output_tokens" in f["error"] or "output" in f["error"] for f in res.failures)
        assert list(res.table["cell"]) == [0, 1]  # the others completed; failures are not results
        assert json.loads((out / "failures.json").read_text())[0]["cfg.max_output_tokens"] == 40
        for f in res.failures:
            d = out / "cells" / f["cell_hash"]
            assert (d / "error.json").is_file() and not (d / "summary.json").exists()
    again = run_sweep(spec, tmp_path / "serial", backend="serial", progress=False)
    assert (again.n_cached, again.n_ran, len(again.failures)) == (2, 2, 2)  # failed cells are retried, not cached


def test_cli_sweep_exit_code_and_failure_summary(tmp_path, capsys):
    d = {"base": {"duration_s": 3.0, "policy": "mtp1"}, "axes": {"max_output_tokens": [100000, 40]}}
    p = _write_spec(tmp_path, d)
    rc = main(["sweep", str(p), "--out", str(tmp_path / "o"), "--backend", "serial", "--quiet"])
    err = capsys.readouterr().err
    assert rc == 1 and "1 cell(s) failed" in err and "max_output_tokens=40" in err
    assert len(pd.read_csv(tmp_path / "o" / "results.csv")) == 1
    rc = main(["sweep", str(tmp_path / "nope.toml"), "--out", str(tmp_path / "o2")])
    assert rc == 2 and "cannot read sweep spec" in capsys.readouterr().err


def test_kill_and_resume_gives_the_uninterrupted_table(tmp_path):
    d = {"base": {"duration_s": 10.0, "domain": "mix:math=1,code=1,chat=1"},
         "axes": {"policy": ["mtp1", "confidence", "oracle"], "concurrency": [4, 16, 32, 48]}}
    p = _write_spec(tmp_path, d)
    out = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "dsparksim.cli.main", "sweep", str(p), "--out", str(out),
                             "--backend", "serial", "--quiet"], cwd=REPO, start_new_session=True)
    deadline = time.time() + 60
    try:
        while time.time() < deadline and len(list(out.glob("cells/*/summary.json"))) < 3:
            time.sleep(0.02)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # only the process group this test started
        proc.wait()
    finished = len(list(out.glob("cells/*/summary.json")))
    assert 3 <= finished < 12, finished
    assert not (out / "results.csv").exists()  # the killed run never got to write a table
    for f in out.glob("cells/*/summary.json"):
        json.loads(f.read_text())  # whatever landed is complete (atomic writes)
    resumed = run_sweep(load_spec(p), out, backend="local", workers=2, progress=False)
    assert resumed.n_cached == finished and resumed.n_ran == 12 - finished
    assert not list(out.rglob(".*.tmp"))
    full = run_sweep(load_spec(p), tmp_path / "full", backend="serial", progress=False)
    pd.testing.assert_frame_equal(resumed.table, full.table, check_exact=True)
    assert (out / "results.csv").read_bytes() == (tmp_path / "full" / "results.csv").read_bytes()


def test_importing_dsparksim_sweep_does_not_import_ray():
    code = "import dsparksim.sweep, dsparksim.cli.main, sys; sys.exit(1 if 'ray' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO).returncode == 0


@pytest.mark.parametrize("path", sorted((REPO / "sweeps").glob("*.toml")), ids=lambda p: p.name)
def test_shipped_specs_validate(path):
    if "\n[plan]" in path.read_text():
        from dsparksim.plan import load_plan   # a `dsparksim plan` spec, not a sweep

        assert load_plan(path).deployments
        return
    spec = load_spec(path)
    assert spec.n_cells() == len(expand(spec)) >= 1


def test_save_requests_keeps_each_cells_request_table(tmp_path):
    spec = spec_from_dict({"sweep": {"save_requests": True}, "base": {"duration_s": 3.0, "policy": "mtp1"},
                           "axes": {"concurrency": [2, 4]}})
    res = run_sweep(spec, tmp_path, backend="local", workers=2, progress=False)
    for _, row in res.table.iterrows():
        req = pd.read_parquet(tmp_path / "cells" / row["cell_hash"] / "requests.parquet")
        cfg = json.loads((tmp_path / "cells" / row["cell_hash"] / "config.json").read_text())
        assert cfg["key"] == {"concurrency": row["cfg.concurrency"]} and cfg["input_hashes"]["profile"]
        assert len(req) >= row["num_requests_completed"] > 0
