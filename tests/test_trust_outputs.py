"""Issue 14, defect 6: result directories are complete or absent, replaced whole, with normal permissions."""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pandas as pd
import pytest

import dsparksim.sim.simulate as simulate_mod
from dsparksim.cli.main import main
from dsparksim.errors import ConfigError

RUN = ["run", "--policy", "fixed:3", "--concurrency", "2", "--duration", "3", "--quiet"]


def _run(out: Path, *extra: str) -> None:
    assert main([*RUN, *extra, "--out", str(out)]) == 0


def _siblings(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir() if p.name != out.name)


def test_rerun_replaces_the_directory_whole(tmp_path):
    out = tmp_path / "out"
    _run(out, "--save-steps")
    assert (out / "steps.csv").is_file()
    _run(out)
    assert not (out / "steps.csv").exists()  # old code left the first run's steps.csv beside new results
    assert sorted(p.name for p in out.iterdir()) == ["bench_result.json", "config.json", "requests.csv",
                                                      "summary.json"]
    assert _siblings(out) == []  # no staging folder left behind


def test_a_crash_while_writing_leaves_the_previous_run_intact(tmp_path, monkeypatch):
    out = tmp_path / "out"
    _run(out, "--seed", "1")
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def boom(path, df):
        raise RuntimeError("disk full (simulated)")

    monkeypatch.setattr(simulate_mod, "write_table", boom)  # config.json is written before the table
    with pytest.raises(RuntimeError, match="disk full"):
        main([*RUN, "--seed", "2", "--out", str(out)])
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # old code: a seed-2 config.json
    assert _siblings(out) == []
    # a crash on the very first run leaves no directory at all
    with pytest.raises(RuntimeError):
        main([*RUN, "--out", str(tmp_path / "fresh")])
    assert not (tmp_path / "fresh").exists() and _siblings(out) == []


def test_frontier_crash_keeps_the_previous_complete_frontier(tmp_path, monkeypatch):
    import dsparksim.results.plots as plots

    out = tmp_path / "f"
    args = ["frontier", "--policies", "mtp1,fixed:3", "--concurrency-levels", "1,2", "--duration", "3", "--workers",
            "1", "--quiet", "--out", str(out)]
    assert main(args) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert "frontier.csv" in before

    def boom(*a, **k):
        raise RuntimeError("plot failed (simulated)")

    monkeypatch.setattr(plots, "plot_verify_budget", boom)
    with pytest.raises(RuntimeError, match="plot failed"):
        main([*args[:-2], "--seed", "5", "--out", str(out)])
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # old code: new config.json/comparison.csv
    assert _siblings(out) == []


@pytest.mark.parametrize("umask, fmode, dmode", [(0o022, 0o644, 0o755), (0o027, 0o640, 0o750)])
def test_result_files_follow_the_umask(tmp_path, umask, fmode, dmode):
    old = os.umask(umask)
    try:
        out = tmp_path / "out"
        _run(out)
    finally:
        os.umask(old)
    assert stat.S_IMODE(out.stat().st_mode) == dmode
    for p in out.iterdir():
        assert stat.S_IMODE(p.stat().st_mode) == fmode, p.name  # old code: 0600 (mkstemp)


def test_stale_staging_folders_of_dead_runs_are_removed(tmp_path):
    from dsparksim.results.outputs import staged_dir

    out = tmp_path / "out"
    dead = tmp_path / ".out.tmp-999999999"  # no such pid
    dead.mkdir()
    (dead / "config.json").write_text("{}")
    with staged_dir(out) as d:
        (d / "x.json").write_text("{}")
    assert not dead.exists() and (out / "x.json").is_file()


def test_an_existing_directory_with_other_things_is_never_replaced(tmp_path):
    from dsparksim.results.outputs import check_out_dir

    d = tmp_path / "project"
    (d / "src").mkdir(parents=True)
    (d / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="--out.*holds other things"):
        check_out_dir(d)
    check_out_dir(d, replace=False)  # a sweep writes into it (its cache), never replaces it
    assert main([*RUN, "--out", str(d)]) == 2
    assert (d / "notes.txt").read_text() == "mine"


def _spec(tmp_path: Path) -> Path:
    p = tmp_path / "s.toml"
    p.write_text('[base]\nduration_s = 3.0\n[axes]\npolicy = ["mtp1", "fixed:3"]\nconcurrency = [1, 2]\n')
    return p


def test_sweep_results_are_replaced_as_a_set_and_keep_the_cache(tmp_path, monkeypatch, capsys):
    import dsparksim.sweep.runner as runner
    from dsparksim.results.outputs import result_set_complete
    from dsparksim.sweep import load_spec

    spec, out = _spec(tmp_path), tmp_path / "sw"
    assert main(["sweep", str(spec), "--out", str(out), "--backend", "serial", "--quiet"]) == 0
    assert result_set_complete(out, "sweep.manifest.json")
    manifest = json.loads((out / "sweep.manifest.json").read_text())
    assert set(manifest["files"]) >= {"sweep.json", "failures.json", "results.csv"}
    n_cells = len(list((out / "cells").iterdir()))
    assert n_cells == 4

    # interrupted while writing the final files: the manifest is pending (names, no sha256), so the set reads as
    # incomplete and its names stay claimed for the rerun
    real = pd.DataFrame.to_csv

    def boom(self, *a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(pd.DataFrame, "to_csv", boom)
    with pytest.raises(KeyboardInterrupt):
        runner.run_sweep(load_spec(spec), out, backend="serial", progress=False)
    assert not result_set_complete(out, "sweep.manifest.json")
    # through the CLI: exit 130 and one line naming the folder and the manifest that marks the set incomplete
    capsys.readouterr()
    assert main(["sweep", str(spec), "--out", str(out), "--backend", "serial", "--quiet"]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("dsparksim: interrupted while writing the result files in"), err
    assert str(out) in err[0] and "sweep.manifest.json marks the set incomplete" in err[0], err
    assert json.loads((out / "sweep.manifest.json").read_text())["complete"] is False
    monkeypatch.setattr(pd.DataFrame, "to_csv", real)
    # the rerun resumes from the kept cache and completes the set; a results.parquet it no longer writes goes
    monkeypatch.setattr(runner, "have_parquet", lambda: False)
    (out / "results.parquet").write_bytes(b"stale")
    assert main(["sweep", str(spec), "--out", str(out), "--backend", "serial", "--quiet"]) == 0
    assert result_set_complete(out, "sweep.manifest.json") and not (out / "results.parquet").exists()
    assert len(list((out / "cells").iterdir())) == n_cells
    assert stat.S_IMODE((out / "results.csv").stat().st_mode) & 0o044 == 0o044  # readable by group and others


def test_sigkill_while_writing_leaves_the_previous_run_and_the_next_run_cleans_up(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "out"
    _run(out, "--seed", "1")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    # The child is killed (no cleanup handlers run) right after it wrote its config.json.
    code = ("import os, signal, sys; import dsparksim.sim.simulate as s; from dsparksim.cli.main import main\n"
            "def kill(path, df): os.kill(os.getpid(), signal.SIGKILL)\n"
            "s.write_table = kill\n"
            f"sys.exit(main({[*RUN, '--seed', '2', '--out', str(out)]!r}))\n")
    import dsparksim

    env = {**os.environ, "PYTHONPATH": str(Path(dsparksim.__file__).resolve().parents[1])}  # the code under test
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, timeout=300)
    assert r.returncode == -9, r.stderr.decode()[-2000:]
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out.tmp-")]  # the killed run's staging
    _run(out, "--seed", "3")
    assert _siblings(out) == []  # removed by the next run (its pid is gone)


def test_a_folder_of_the_users_own_result_like_files_is_never_replaced(tmp_path, capsys):
    # hostile-tester finding (2026-12-03): a folder holding only .json/.csv files counted as "results" and was
    # deleted, the run's own profile and lengths files with it, and a model's config.json was overwritten
    d = tmp_path / "mydata"
    d.mkdir()
    (d / "my_measured_profile.json").write_text('{"name": "mine"}')
    (d / "my_lengths.csv").write_text("prompt_tokens,output_tokens\n100,200\n")
    assert main([*RUN, "--out", str(d)]) == 2
    assert sorted(p.name for p in d.iterdir()) == ["my_lengths.csv", "my_measured_profile.json"]
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text('{"hidden_size": 4096}')
    assert main([*RUN, "--out", str(hf)]) == 2
    assert "no dsparksim run or frontier wrote (config.json" in capsys.readouterr().err
    assert (hf / "config.json").read_text() == '{"hidden_size": 4096}'


def test_results_of_earlier_runs_and_frontiers_are_still_replaced(tmp_path):
    from dsparksim.results.outputs import check_out_dir

    out = tmp_path / "out"
    _run(out)
    _run(out, "--seed", "3")             # a rerun into its own results
    assert json.loads((out / "config.json").read_text())["config"]["seed"] == 3
    old = tmp_path / "old_frontier"      # frontier folders written before their config.json named the version
    old.mkdir()
    (old / "config.json").write_text(json.dumps({"base_config": {}, "policies": ["mtp1"]}))
    (old / "frontier.csv").write_text("a\n1\n")
    check_out_dir(old)
    empty = tmp_path / "empty"
    empty.mkdir()
    check_out_dir(empty)


def test_the_working_directory_or_a_folder_above_it_is_refused_before_any_work(tmp_path, monkeypatch, capsys):
    from dsparksim.results.outputs import check_out_dir

    # `--out .` used to simulate, then fail renaming '.' (a traceback, results lost); `--out "$PWD"` renamed the
    # shell's working directory away
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    called = []
    monkeypatch.setattr(simulate_mod, "simulate", lambda *a, **k: called.append(1))
    for out in (".", str(work), str(tmp_path / "a"), ".."):
        assert main([*RUN, "--out", out]) == 2
        assert "is the working directory or holds it" in capsys.readouterr().err
        with pytest.raises(ConfigError, match="working directory"):
            check_out_dir(out)
        check_out_dir(out, replace=False)   # a sweep writes into a folder, never replaces it: allowed
    assert not called and sorted(p.name for p in tmp_path.iterdir()) == ["a"] and list(work.iterdir()) == []
    check_out_dir("sub")                    # a new folder below the working directory is fine


def test_a_sweep_with_failed_cells_is_not_marked_complete_and_its_table_stays_readable(tmp_path, capsys):
    # hostile-tester finding (2026-12-03): "complete": true beside failed cells, and an all-failed sweep wrote a
    # 1-byte results.csv that pandas could not read
    spec = tmp_path / "t.toml"
    spec.write_text('[sweep]\nname = "t"\n[base]\nduration_s = 3.0\nkv_capacity_tokens = 20\n'
                    '[axes]\npolicy = ["confidence", "mtp1"]\nconcurrency = [2]\n')
    out = tmp_path / "o"
    assert main(["sweep", str(spec), "--out", str(out), "--backend", "serial", "--quiet"]) == 1
    m = json.loads((out / "sweep.manifest.json").read_text())
    assert m["complete"] is False and m["n_failed"] == 2 and m["n_cells"] == 2
    df = pd.read_csv(out / "results.csv")
    assert len(df) == 0 and list(df.columns) == ["cell", "cell_hash", "cfg.policy", "cfg.concurrency", "same_as"]
    # a sweep whose every cell finished is complete
    spec.write_text('[sweep]\nname = "t"\n[base]\nduration_s = 3.0\n[axes]\npolicy = ["mtp1"]\nconcurrency = [2]\n')
    assert main(["sweep", str(spec), "--out", str(tmp_path / "o2"), "--backend", "serial", "--quiet"]) == 0
    m = json.loads((tmp_path / "o2" / "sweep.manifest.json").read_text())
    assert m["complete"] is True and m["n_failed"] == 0


def test_frontier_config_records_the_version_and_the_inputs_bytes(tmp_path):
    import hashlib

    from dsparksim import __version__
    from dsparksim.cost.profile import shipped_dir

    out = tmp_path / "f"
    assert main(["frontier", "--policies", "mtp1,fixed:3", "--concurrency-levels", "1,2", "--duration", "3",
                 "--workers", "1", "--quiet", "--profile", "h100-llama2-7b-tp1", "--out", str(out)]) == 0
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["dsparksim_version"] == __version__
    sha = hashlib.sha256((Path(shipped_dir()) / "h100-llama2-7b-tp1.json").read_bytes()).hexdigest()
    assert cfg["input_sha256"]["profile"] == sha and cfg["policies"] == ["mtp1", "fixed:3"]


def test_a_user_file_in_a_result_directory_is_never_deleted_by_the_next_run(tmp_path, capsys):
    # OUT is replaced whole: a file no dsparksim command writes there (a user's notes, a copied profile) makes the
    # folder refused with one line, before anything runs, and the file survives; a --result-filename copy of the
    # run being repeated is its own output and is replaced
    out = tmp_path / "out"
    _run(out)
    mine = out / "mine.json"
    mine.write_text('{"keep": true}\n')
    before = sorted(p.name for p in out.iterdir())
    assert main([*RUN, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "mine.json" in err[0] and "would be deleted" in err[0]
    assert mine.read_text() == '{"keep": true}\n' and sorted(p.name for p in out.iterdir()) == before
    mine.unlink()
    _run(out, "--result-filename", "copy.json")
    _run(out, "--result-filename", "copy.json")
    assert (out / "copy.json").is_file()
    assert main([*RUN, "--out", str(out)]) == 2      # without the option, copy.json is not this command's file
    assert (out / "copy.json").is_file()


def test_ctrl_c_while_the_result_set_is_hashed_still_says_the_set_is_incomplete(tmp_path, monkeypatch):
    """Ctrl-C after the last file was written but before the manifest was (stale names removed, every file hashed:
    as long as writing them for a big results table) came out as a plain interrupt."""
    import dsparksim.results.outputs as outputs
    from dsparksim.results.outputs import WriteInterrupted, result_set_complete, write_result_set

    def ctrl_c(p):
        raise KeyboardInterrupt

    files = {"a.csv": lambda p: p.write_text("a\n"), "b.csv": lambda p: p.write_text("b\n")}
    monkeypatch.setattr(outputs, "_sha256", ctrl_c)
    with pytest.raises(WriteInterrupted, match=r"x\.manifest\.json marks the set incomplete .*2 of 2 files replaced"):
        write_result_set(tmp_path, files, "x.manifest.json")
    assert json.loads((tmp_path / "x.manifest.json").read_text())["complete"] is False
    monkeypatch.undo()
    with pytest.raises(WriteInterrupted, match=r"1 of 2 files replaced"):
        write_result_set(tmp_path / "o", {**files, "b.csv": ctrl_c}, "x.manifest.json")
    assert (tmp_path / "o" / "a.csv").is_file() and not (tmp_path / "o" / "b.csv").exists()
    write_result_set(tmp_path, files, "x.manifest.json")
    assert result_set_complete(tmp_path, "x.manifest.json")
