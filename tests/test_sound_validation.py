"""Issue 31 items 8, 10, 12, 13: bad values in regress baselines and specs, plan traffic and --seeds are refused
with exit 2 and one line naming where the value came from, before any cell runs."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsparksim.cli.main import main

REPO = Path(__file__).resolve().parents[1]
BASELINE = REPO / "tests" / "golden" / "regress_baseline.json"


def _one_error(capsys) -> str:
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("dsparksim: error: "), err
    return err[0]


@pytest.fixture
def no_cells(monkeypatch):
    """Any cell run fails the test: the refusal must come before the first cell."""
    import dsparksim.sweep.regress as rg

    def boom(*a, **k):
        raise AssertionError("cells ran before the bad input was refused")
    monkeypatch.setattr(rg, "compute", boom)


def _baseline(tmp_path: Path, edit) -> Path:
    d = json.loads(BASELINE.read_text())
    edit(d)
    p = tmp_path / "golden" / "b.json"
    p.parent.mkdir(parents=True, exist_ok=True)
    d["spec"] = str(REPO / "sweeps" / "regress.toml")
    p.write_text(json.dumps(d))
    return p


BAD_BASELINES = [
    ("tolerances.rtol", lambda d: d["tolerances"].__setitem__("rtol", -0.1)),
    ("tolerances.atol", lambda d: d["tolerances"].__setitem__("atol", "x")),
    ("tolerances.gain_atol", lambda d: d["tolerances"].pop("gain_atol")),
    ("seeds", lambda d: d.__setitem__("seeds", [])),
    ("seeds", lambda d: d.__setitem__("seeds", [11, "12"])),
    ("frontier[0].tau", lambda d: d["frontier"][0].__setitem__("tau", "fast")),
    ("frontier[3].output_throughput_tok_s_hw", lambda d: d["frontier"][3].__setitem__("output_throughput_tok_s_hw",
                                                                                         [1])),
    ("frontier[1].load", lambda d: d["frontier"][1].__setitem__("load", None)),
    ("frontier[2]", lambda d: d["frontier"].__setitem__(2, 5)),
    ("comparison[0].gain_mean", lambda d: d["comparison"][0].__setitem__("gain_mean", "+3%")),
    ("frontier", lambda d: d.__setitem__("frontier", {})),
]


@pytest.mark.parametrize("field,edit", BAD_BASELINES, ids=[f for f, _ in BAD_BASELINES])
def test_bad_baseline_values_exit_2_naming_file_and_field(tmp_path, capsys, no_cells, field, edit):
    p = _baseline(tmp_path, edit)
    assert main(["regress", "--baseline", str(p)]) == 2
    line = _one_error(capsys)
    assert str(p) in line and f"'{field}'" in line, line


def _spec(tmp_path: Path, regress_table: str) -> Path:
    text = (REPO / "sweeps" / "regress.toml").read_text()
    head, _, _ = text.partition("[regress]")
    p = tmp_path / "r.toml"
    p.write_text(head + "[regress]\n" + regress_table)
    return p


@pytest.mark.parametrize("table,field", [("rtol = -1e-6\n", "regress.rtol"), ("seeds = []\n", "regress.seeds"),
                                         ("atol = \"0\"\n", "regress.atol"), ("gain_atol = nan\n", "regress.gain_atol"),
                                         ("seeds = 100000\n", "regress.seeds")])
def test_bad_regress_table_exits_2_before_any_cell(tmp_path, capsys, monkeypatch, table, field):
    import dsparksim.sweep.backends as be
    monkeypatch.setattr(be, "make_backend", lambda *a, **k: (_ for _ in ()).throw(AssertionError("cells ran")))
    spec = _spec(tmp_path, table)
    assert main(["regress", "--baseline", str(tmp_path / "new.json"), "--spec", str(spec), "--update"]) == 2
    line = _one_error(capsys)
    assert str(spec) in line and f"'{field}'" in line, line
    assert not (tmp_path / "new.json").exists()
