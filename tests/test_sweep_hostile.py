"""Hostile-user findings on sweep, capacity, regress and plan (2026-12-05). One spec format serves sweep, capacity
and regress; what the command at hand does not read is named in one stderr line (it was silently ignored: `sweep`
of a file with a [capacity] table), and anything else is refused; so is a backend option the backend would not
read; a spec saved with a UTF-8 BOM is read."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from dsparksim.cli.main import main
from dsparksim.errors import ConfigError
from dsparksim.sweep import spec_from_dict
from dsparksim.sweep.spec import unread_note

BASE = {"base": {"duration_s": 1.0, "domain": "math", "concurrency": 2}, "axes": {"policy": ["mtp1"]}}
CAP = {"load": "concurrency", "min": 1, "max": 4, "slo": ["tps_user_median >= 1"]}


def _spec(**tables):
    return spec_from_dict({**BASE, **tables}, source="s.toml", check_inputs=False)


def test_each_command_names_exactly_the_tables_it_does_not_read():
    s = _spec(capacity=CAP, regress={"seeds": 2}, sweep={"save_requests": True})
    sw, cap, reg = (unread_note(s, c) for c in ("sweep", "capacity", "regress"))
    assert sw == ("dsparksim: note: s.toml: `dsparksim sweep` does not read [capacity] (read by `dsparksim "
                  "capacity`) or [regress] (read by `dsparksim regress`); ignored here")
    assert "[regress]" in cap and "sweep.save_requests" in cap and "[capacity]" not in cap
    assert "[capacity]" in reg and "sweep.save_requests" in reg and "[regress] (" not in reg
    assert unread_note(_spec(), "sweep") is None and unread_note(_spec(capacity=CAP), "capacity") is None


def test_an_unknown_table_is_refused_naming_it_and_the_known_ones():
    with pytest.raises(ConfigError, match=r"s.toml.*capacty.*unknown table \[capacty\]; expected some of the tables "
                                          r"sweep, base, axes, capacity, regress"):
        _spec(capacty=CAP)
    with pytest.raises(ConfigError, match=r"unknown top-level key 'foo' \(keys belong in a table\)"):
        _spec(foo=1)


def test_cli_sweep_says_it_ignores_capacity_in_one_line(tmp_path, capsys):
    p = tmp_path / "s.toml"
    p.write_text('[base]\nduration_s = 1.0\ndomain = "math"\nconcurrency = 2\n[axes]\npolicy = ["mtp1"]\n'
                 '[capacity]\nload = "concurrency"\nmax = 4\n')
    assert main(["sweep", str(p), "--out", str(tmp_path / "o"), "--backend", "serial", "--quiet"]) == 0
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert err == [f"dsparksim: note: {p}: `dsparksim sweep` does not read [capacity] (read by `dsparksim "
                   "capacity`); ignored here"]


@pytest.mark.parametrize("command", [["sweep", "SPEC"], ["capacity", "SPEC"], ["plan", "PLAN"], ["regress"],
                                     ["frontier", "--policies", "mtp1", "--concurrency-levels", "1,2"]])
def test_a_backend_option_the_backend_would_not_read_is_refused(tmp_path, capsys, command):
    """--ray-address without --backend ray and --workers with --backend serial were ignored silently."""
    repo = Path(__file__).resolve().parents[1]
    spec = {"SPEC": str(repo / "sweeps" / "capacity.toml"), "PLAN": str(repo / "sweeps" / "plan-example.toml")}
    argv = [spec.get(a, a) for a in command] + (["--baseline", str(repo / "tests" / "golden" / "regress_baseline.json")]
                                               if command == ["regress"] else ["--out", str(tmp_path / "o")])
    for extra, flag in ((["--ray-address", "auto"], "--ray-address"), (["--backend", "serial", "--workers", "2"],
                                                                       "--workers")):
        assert main(argv + extra) == 2
        err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
        assert len(err) == 1 and f"'{flag}': would be ignored" in err[0], err
    assert not (tmp_path / "o").exists()


def test_a_spec_saved_with_a_bom_is_read_and_a_non_utf8_one_names_its_line(tmp_path):
    from dsparksim.errors import InputError
    from dsparksim.sweep import load_spec
    text = '[base]\nduration_s = 1.0\ndomain = "math"\nconcurrency = 2\n[axes]\npolicy = ["mtp1"]\n'
    p = tmp_path / "bom.toml"
    p.write_bytes(b"\xef\xbb\xbf" + text.encode())
    assert load_spec(p).axes == {"policy": ("mtp1",)}      # was 'not valid TOML: Invalid statement (line 1, col 1)'
    p.write_bytes(text.encode() + b"# caf\xe9\n")
    with pytest.raises(InputError, match=r"bom.toml:7: not UTF-8 text: byte 0xe9"):
        load_spec(p)


def test_sweep_says_which_cells_rejected_requests_or_finished_none(tmp_path, capsys):
    """`run` and `frontier` warn when requests were rejected on arrival (metrics cover only the admitted ones) or a
    cell finished no request; a sweep left both to its results.csv columns, silently with --quiet."""
    p = tmp_path / "s.toml"
    p.write_text('[base]\ndomain = "math"\nconcurrency = 2\n[axes]\npolicy = ["mtp1"]\n'
                 'kv_capacity_tokens = [100, 100000]\nduration_s = [0.05, 2.0]\n')
    assert main(["sweep", str(p), "--out", str(tmp_path / "o"), "--backend", "serial", "--quiet"]) == 0
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 2, err
    assert err[0].startswith("dsparksim: warning: requests were rejected on arrival in 2 cell(s)") \
        and "(policy=mtp1, kv_capacity_tokens=100, duration_s=2.0)" in err[0] and "100000" not in err[0], err
    assert err[1].startswith("dsparksim: warning: 2 cell(s) finished no request") \
        and "duration_s=0.05" in err[1] and "duration_s=2.0" not in err[1], err


def test_regress_refuses_exact_with_update_and_quiet_silences_a_pass(tmp_path, capsys, monkeypatch):
    """--exact beside --update (which compares nothing) and --quiet (no report to silence) were ignored silently."""
    import dsparksim.sweep.regress as reg
    repo = Path(__file__).resolve().parents[1]
    base = ["regress", "--baseline", str(repo / "tests" / "golden" / "regress_baseline.json")]
    assert main([*base, "--update", "--exact"]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and "'--exact': would be ignored" in err[0], err
    monkeypatch.setattr(reg, "regress", lambda *a, **k: (True, "frontiers match the baseline", {}))
    assert main([*base, "--quiet"]) == 0 and capsys.readouterr().out == ""
    assert main(base) == 0 and "frontiers match" in capsys.readouterr().out
    monkeypatch.setattr(reg, "regress", lambda *a, **k: (False, "mtp1: regressed", {}))
    assert main([*base, "--quiet"]) == 1 and "mtp1: regressed" in capsys.readouterr().err


@pytest.mark.parametrize("base,field,msg", [
    ({"max_batched_tokens": 4}, "cell policy=fixed:7", "4 cannot hold even one request's 1+K=8 verify tokens"),
    ({"tensor_parallel_size": 3, "profile": "h100-llama2-7b-tp1"}, "cell policy=fixed:7", "prices TP 1"),
    ({"rate": 1e9, "concurrency": None}, "cell policy=fixed:7", "expected arrivals, above the limit")])
def test_a_config_no_cell_can_run_is_refused_before_any_cell(tmp_path, base, field, msg):
    """Each ran every cell to a failure listed as 'rerun to retry' (a deterministic config error, not a failure
    of the run); now refused with the spec, naming the cell, as `run` refuses it before its run."""
    d = {"base": {k: v for k, v in {**BASE["base"], **base}.items() if v is not None},
         "axes": {"policy": ["fixed:7"]}}
    with pytest.raises(ConfigError, match=rf"s.toml.*{re.escape(field)}.*{re.escape(msg)}"):
        spec_from_dict(d, source="s.toml")


def test_a_sweep_above_the_cell_limit_is_refused_at_once_naming_the_axes():
    """2 x 1000 x 1000 cells: two minutes of checking, 2 GB, no word (then the cells); refused before any check."""
    from dsparksim.sweep.spec import MAX_CELLS
    d = {"base": {"duration_s": 1.0, "domain": "math"},
         "axes": {"policy": ["mtp1", "confidence"], "concurrency": list(range(1, 1001)), "seed": list(range(1000))}}
    with pytest.raises(ConfigError, match=r"s.toml.*'axes'.*2 policy x 1000 concurrency x 1000 seed = 2,000,000 "
                                          rf"cells, above the limit of {MAX_CELLS:,} per sweep"):
        spec_from_dict(d, source="s.toml")


def test_rejected_and_empty_cell_warnings_name_a_dozen_cells_then_count_the_rest():
    """A 300-cell sweep whose cells all finished nothing printed one 300-cell line (and the same for rejections);
    the short-window warning beside them names SHORT_LIST cells and counts the rest."""
    import pandas as pd

    from dsparksim.results.notes import SHORT_LIST
    from dsparksim.sweep.table import incomplete_notes

    n = 300
    table = pd.DataFrame({"cell": range(n), "cfg.concurrency": range(1, n + 1), "num_requests_completed": [0] * n,
                          "num_requests_rejected": [3] * n, "num_requests_issued": [5] * n})
    rej, empty = incomplete_notes(table)
    for line in (rej, empty):
        assert f"cell {SHORT_LIST - 1} (concurrency={SHORT_LIST})" in line and f"cell {SHORT_LIST} " not in line
        assert f"and {n - SHORT_LIST} more (results.csv" in line and len(line) < 2000, line
    assert rej.startswith(f"dsparksim: warning: requests were rejected on arrival in {n} cell(s)")
    assert empty.startswith(f"dsparksim: warning: {n} cell(s) finished no request") and "lengthen duration_s" in empty


def test_frontier_empty_cell_warning_names_a_dozen_cells_then_counts_the_rest(tmp_path, capsys):
    """frontier listed every empty cell in its warning (20 cells here; 360 at 8 policies x 9 loads x 5 seeds)."""
    from dsparksim.results.notes import SHORT_LIST

    loads = ",".join(str(c) for c in range(1, 11))
    assert main(["frontier", "--profile", "cpu-tiny", "--policies", "none,mtp1", "--concurrency", loads,
                 "--duration", "0.05", "--backend", "serial", "--out", str(tmp_path / "f"), "--quiet"]) == 0
    err = [ln for ln in capsys.readouterr().err.splitlines() if "finished no request" in ln]
    assert len(err) == 1 and err[0].startswith("dsparksim: warning: 20 cell(s) finished no request"), err
    assert "none@10; mtp1@1; mtp1@2; and 8 more (frontier.csv" in err[0] and "mtp1@3" not in err[0], err
    assert SHORT_LIST == 12
