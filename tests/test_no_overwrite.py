"""Issue 31 items 5-7: nothing the user wrote is ever overwritten. One rule for every command that writes
(dsparksim.results.outputs.claim_out_file / claim_result_set / check_out_dir): replace only what dsparksim wrote,
never an input, never a file it did not write (not even with --force); an earlier single-file result of dsparksim's
only with --force (the user means it); a replaced default folder is announced."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from dsparksim.cli.main import main
from dsparksim.errors import ConfigError
from dsparksim.results.outputs import claim_out_file, claim_result_set, write_result_set

REPO = Path(__file__).resolve().parents[1]
MODEL = REPO / "dsparksim" / "data" / "models" / "llama-3-8b.json"
USER = b'{"mine": "a file the user wrote"}\n'


def _err(capsys) -> str:
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("dsparksim: error: "), err
    return err[0]


def _user_file(p: Path, data: bytes = USER) -> Path:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)
    return p


def _build(out: Path, *extra: str, model: str = str(MODEL)) -> int:
    return main(["profile", "build", "--model", model, "--gpu", "H100", "--date", "2026-01-01", "--out", str(out),
                 *extra])


# ------------------------------------------------------------------ item 5: single files
def test_profile_build_never_overwrites_its_model_input(tmp_path, capsys):
    cfg = tmp_path / "config.json"
    cfg.write_bytes(MODEL.read_bytes())
    before = cfg.read_bytes()
    for extra in ((), ("--force",)):
        assert _build(cfg, *extra, model=str(cfg)) == 2
        assert "also an input of this command" in _err(capsys)
        assert cfg.read_bytes() == before
    link = tmp_path / "link.json"
    link.symlink_to(cfg)
    assert _build(link, "--force", model=str(cfg)) == 2 and "input" in _err(capsys)
    assert cfg.read_bytes() == before


def test_profile_build_never_replaces_a_user_file_and_its_own_only_with_force(tmp_path, capsys):
    out = _user_file(tmp_path / "p.json")
    for extra in ((), ("--force",)):
        assert _build(out, *extra) == 2
        line = _err(capsys)
        assert "dsparksim did not write it" in line and "even with --force" in line and str(out) in line
        assert out.read_bytes() == USER
    mine = tmp_path / "mine.json"
    assert _build(mine) == 0
    assert json.loads(mine.read_text())["metadata"]["written_by"].startswith("dsparksim ")
    capsys.readouterr()
    assert _build(mine) == 2 and "add --force" in _err(capsys)   # an earlier result: not silently replaced
    mine.write_text(mine.read_text().replace('"2026-01-01"', '"2000-01-01"'))
    assert _build(mine, "--force") == 0                          # the user means it
    assert "2026-01-01" in mine.read_text()


def test_profile_import_never_overwrites_its_input_or_a_user_file(tmp_path, capsys):
    table = tmp_path / "profile_vllm_sps.json"
    table.write_bytes((REPO / "tests" / "data" / "profile_vllm_sps.json").read_bytes())
    before = table.read_bytes()
    assert main(["profile", "import", str(table), "--format", "vllm", "--out", str(table), "--force"]) == 2
    assert "input" in _err(capsys) and table.read_bytes() == before
    user = _user_file(tmp_path / "u.json")
    assert main(["profile", "import", str(table), "--format", "vllm", "--out", str(user), "--force"]) == 2
    assert "did not write" in _err(capsys) and user.read_bytes() == USER


def test_profile_show_plot_refuses_an_existing_image_it_did_not_write(tmp_path, capsys):
    png = _user_file(tmp_path / "existing.png", b"\x89PNG\r\n\x1a\nnot ours")
    for extra in ((), ("--force",)):
        assert main(["profile", "show", "h100-llama2-7b-tp1", "--plot", str(png), *extra]) == 2
        assert "did not write" in _err(capsys) and png.read_bytes().endswith(b"not ours")
    for fmt in ("png", "svg", "pdf"):
        fresh = tmp_path / f"fresh.{fmt}"
        assert main(["profile", "show", "h100-llama2-7b-tp1", "--plot", str(fresh)]) == 0
        capsys.readouterr()
        assert main(["profile", "show", "h100-llama2-7b-tp1", "--plot", str(fresh)]) == 2   # not silently
        assert "add --force" in _err(capsys)
        assert main(["profile", "show", "h100-llama2-7b-tp1", "--plot", str(fresh), "--force"]) == 0   # ours


def test_audit_out_refuses_an_existing_file_it_did_not_write(tmp_path, capsys, monkeypatch):
    import dsparksim.runner.audit as audit
    monkeypatch.setattr(audit, "audit_all", lambda **k: (_ for _ in ()).throw(AssertionError("audit ran")))
    out = _user_file(tmp_path / "existing.json")
    assert main(["audit", "--steps", "10", "--out", str(out), "--force"]) == 2
    assert "did not write" in _err(capsys) and out.read_bytes() == USER


def test_claim_out_file_recognises_each_kind(tmp_path):
    rows = tmp_path / "audit.json"
    rows.write_text(json.dumps([{"policy": "mtp1", "setting": "a", "p_value": 0.5}]))
    assert claim_out_file(rows, "audit", force=True) == rows
    with pytest.raises(ConfigError, match="add --force"):
        claim_out_file(rows, "audit")
    with pytest.raises(ConfigError, match="even with --force"):
        claim_out_file(rows, "profile", force=True)   # an audit file is not a profile dsparksim wrote
    marked = tmp_path / "doc.json"
    marked.write_text(json.dumps({"written_by": "dsparksim 9.9", "x": 1}))
    assert claim_out_file(marked, "json", force=True) == marked
    marked.write_text(json.dumps({"written_by": "dsparksimX 9.9", "x": 1}))
    with pytest.raises(ConfigError, match="did not write"):
        claim_out_file(marked, "json", force=True)
    with pytest.raises(ConfigError, match="not a regular file|directory"):
        claim_out_file(tmp_path, "json")
    with pytest.raises(ValueError):
        claim_out_file(tmp_path / "new.json", "no-such-kind")


# ------------------------------------------------------------------ item 6: result sets in a folder
SPEC = """[sweep]
name = "tiny"
[base]
profile = "h100-llama2-7b-tp1"
duration_s = 20.0
concurrency = 2
[axes]
policy = ["none"]
"""


def test_sweep_refuses_a_user_results_csv_and_updates_its_own(tmp_path, capsys):
    spec = tmp_path / "s.toml"
    spec.write_text(SPEC)
    out = tmp_path / "out"
    user = _user_file(out / "results.csv", b"my,own\n1,2\n")
    assert main(["sweep", str(spec), "--out", str(out), "--backend", "serial", "--quiet"]) == 2
    line = _err(capsys)
    assert "results.csv" in line and "did not write" in line and user.read_bytes() == b"my,own\n1,2\n"
    assert not (out / "cells").exists()                                 # refused before any cell ran
    mine = tmp_path / "mine"
    assert main(["sweep", str(spec), "--out", str(mine), "--backend", "serial", "--quiet"]) == 0
    assert main(["sweep", str(spec), "--out", str(mine), "--backend", "serial", "--quiet"]) == 0  # its own set


@pytest.mark.parametrize("cmd,name", [("plan", "plan.json"), ("plan", "spec.json"), ("plan", "probes.csv"),
                                      ("capacity", "capacity.csv"), ("capacity", "capacity.json")])
def test_plan_and_capacity_refuse_same_named_user_files_before_any_probe(tmp_path, capsys, monkeypatch, cmd, name):
    import dsparksim.plan as plan
    import dsparksim.sweep.capacity as cap
    monkeypatch.setattr(plan, "run_plan", lambda *a, **k: (_ for _ in ()).throw(AssertionError("probes ran")))
    monkeypatch.setattr(cap, "capacity_search", lambda *a, **k: (_ for _ in ()).throw(AssertionError("probes ran")))
    spec = REPO / "sweeps" / ("plan-example.toml" if cmd == "plan" else "capacity.toml")
    user = _user_file(tmp_path / "out" / name)
    assert main([cmd, str(spec), "--out", str(tmp_path / "out")]) == 2
    assert name in _err(capsys) and user.read_bytes() == USER



@pytest.mark.parametrize("cmd", ["sweep", "plan", "capacity"])
def test_a_file_named_cells_in_out_is_refused_before_any_probe(tmp_path, capsys, monkeypatch, cmd):
    """OUT/cells is the cell cache: a file there was a traceback (NotADirectoryError) after the first cell had run."""
    import dsparksim.plan as plan
    import dsparksim.sweep.capacity as cap
    import dsparksim.sweep.runner as runner
    boom = (lambda *a, **k: (_ for _ in ()).throw(AssertionError("probes ran")))
    for mod, name in ((plan, "run_plan"), (cap, "capacity_search"), (runner, "run_cells_cached")):
        monkeypatch.setattr(mod, name, boom)
    spec = tmp_path / "s.toml"
    spec.write_text(SPEC)
    spec = {"sweep": spec, "plan": REPO / "sweeps" / "plan-example.toml",
            "capacity": REPO / "sweeps" / "capacity.toml"}[cmd]
    user = _user_file(tmp_path / "out" / "cells")
    assert main([cmd, str(spec), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    line = _err(capsys)
    assert "cells" in line and "not a folder" in line and user.read_bytes() == USER

def test_a_file_in_place_of_a_cell_folder_is_refused_before_any_cell_runs(tmp_path, capsys):
    """OUT/cells/<hash> is one cell's folder: a file there was a traceback (FileExistsError) after the other cells
    had run; now one line naming it, nothing run, the file kept."""
    spec = tmp_path / "s.toml"
    spec.write_text(SPEC)
    out = tmp_path / "out"
    assert main(["sweep", str(spec), "--out", str(out), "--backend", "serial", "--quiet"]) == 0
    (cell,) = (out / "cells").iterdir()
    for f in cell.iterdir():
        f.unlink()
    cell.rmdir()
    user = _user_file(cell)
    spec.write_text(SPEC.replace('policy = ["none"]', 'policy = ["none", "confidence"]'))
    assert main(["sweep", str(spec), "--out", str(out), "--backend", "serial", "--quiet"]) == 2
    line = _err(capsys)
    assert cell.name in line and "not a folder" in line and user.read_bytes() == USER
    assert [p.name for p in (out / "cells").iterdir()] == [cell.name]      # the other cell did not run


def test_result_set_manifest_keeps_its_names_claimed_while_writing(tmp_path):
    write_result_set(tmp_path, {"a.csv": lambda p: p.write_text("1\n")}, "x.manifest.json")
    claim_result_set(tmp_path, ["a.csv"], "x.manifest.json")          # ours: may be replaced

    def killed(p):
        raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        write_result_set(tmp_path, {"a.csv": lambda p: p.write_text("2\n"), "b.csv": killed}, "x.manifest.json")
    doc = json.loads((tmp_path / "x.manifest.json").read_text())
    assert doc["complete"] is False and set(doc["files"]) == {"a.csv", "b.csv"}
    claim_result_set(tmp_path, ["a.csv", "b.csv"], "x.manifest.json")  # an interrupted write stays ours
    (tmp_path / "c.csv").write_text("user\n")
    with pytest.raises(ConfigError, match="c.csv"):
        claim_result_set(tmp_path, ["a.csv", "c.csv"], "x.manifest.json")


# ------------------------------------------------------------------ run / frontier: --force; item 7
RUN = ["run", "--duration", "1", "--concurrency", "2", "--quiet"]


def test_run_never_replaces_a_folder_of_result_files_it_did_not_write(tmp_path, capsys):
    out = tmp_path / "r"
    _user_file(out / "summary.json")
    assert main([*RUN, "--out", str(out)]) == 2 and "no dsparksim run or frontier wrote" in _err(capsys)
    assert (out / "summary.json").read_bytes() == USER


def test_run_without_out_says_it_replaced_results_run(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(RUN) == 0
    assert "replaced" not in capsys.readouterr().err                    # nothing was there
    assert main(RUN) == 0
    err = capsys.readouterr().err
    assert "dsparksim: note: replaced results/run" in err and "--out" in err
    assert main([*RUN, "--out", "results/run"]) == 0                    # the user named it: no note
    assert "replaced" not in capsys.readouterr().err


@pytest.mark.parametrize("cmd", ["sweep", "plan", "capacity", "run"])
def test_an_empty_out_is_refused_not_the_working_directory(tmp_path, capsys, monkeypatch, cmd):
    """--out '' (an unset shell variable) was Path('') = '.': sweep, plan and capacity wrote their result set and
    cell cache into the working directory."""
    monkeypatch.chdir(tmp_path)
    spec = tmp_path / "s.toml"
    spec.write_text(SPEC)
    args = {"sweep": [str(spec)], "plan": [str(REPO / "sweeps" / "plan-example.toml")],
            "capacity": [str(REPO / "sweeps" / "capacity.toml")], "run": ["--duration", "1"]}[cmd]
    assert main([cmd, *args, "--out", "", "--quiet"]) == 2
    line = _err(capsys)
    assert "field '--out': empty path ''" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.toml"]   # nothing written here


def test_a_dangling_symlink_out_is_named_as_one(tmp_path, capsys):
    """It was called 'a file', which it is not (nothing is there)."""
    link = tmp_path / "out"
    link.symlink_to(tmp_path / "nowhere")
    spec = tmp_path / "s.toml"
    spec.write_text(SPEC)
    assert main(["sweep", str(spec), "--out", str(link), "--quiet"]) == 2
    line = _err(capsys)
    assert "is a dangling symbolic link" in line and "nowhere" in line and "is a file" not in line
    assert not (tmp_path / "nowhere").exists()



def test_a_listed_result_file_changed_since_is_not_replaced(tmp_path, capsys):
    """The manifest listed results.csv / sweep.json by name only: a results.csv the user had edited, or a spec saved
    as OUT/sweep.json and swept into OUT (the command's own input), was overwritten by the rerun."""
    spec = tmp_path / "s.toml"
    spec.write_text(SPEC)
    out = tmp_path / "out"
    assert main(["sweep", str(spec), "--out", str(out), "--backend", "serial", "--quiet"]) == 0
    assert main(["sweep", str(spec), "--out", str(out), "--backend", "serial", "--quiet"]) == 0   # unchanged: ours
    edited = (out / "results.csv").read_bytes() + b"my notes\n"
    (out / "results.csv").write_bytes(edited)
    assert main(["sweep", str(spec), "--out", str(out), "--backend", "serial", "--quiet"]) == 2
    assert "results.csv" in _err(capsys) and (out / "results.csv").read_bytes() == edited
    (out / "results.csv").unlink()
    (out / "sweep.json").write_text(SPEC)          # the spec itself, under a result file's name
    assert main(["sweep", str(out / "sweep.json"), "--out", str(out), "--backend", "serial", "--quiet"]) == 2
    assert "sweep.json" in _err(capsys) and (out / "sweep.json").read_text() == SPEC
