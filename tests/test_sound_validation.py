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


# ------------------------------------------------------------------ item 10: --seeds has a bound; plan's traffic
@pytest.mark.parametrize("argv", [
    ["frontier", "--policies", "none", "--concurrency-levels", "1", "--seeds", "1001"],
    ["frontier", "--policies", "none", "--concurrency-levels", "1", "--seeds", "1000000000"],
    ["capacity", str(REPO / "sweeps" / "capacity.toml"), "--seeds", "5000"],
])
def test_seeds_option_is_bounded(tmp_path, capsys, argv):
    with pytest.raises(SystemExit) as e:
        main([*argv, "--out", str(tmp_path / "o")])
    assert e.value.code == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and "error: argument --seeds" in err[0] and "at most 1000" in err[0], err
    assert not (tmp_path / "o").exists()


def _plan(tmp_path: Path, old: str, new: str) -> Path:
    text = (REPO / "sweeps" / "plan-example.toml").read_text()
    assert old in text
    p = tmp_path / "plan.toml"
    p.write_text(text.replace(old, new))
    return p


@pytest.fixture
def no_probes(monkeypatch):
    import dsparksim.plan as plan
    monkeypatch.setattr(plan, "run_plan", lambda *a, **k: (_ for _ in ()).throw(AssertionError("probes ran")))


@pytest.mark.parametrize("old,new,field,words", [
    ("rate = 12.0 ", "rate = 1e8 ", "traffic.rate", "expected arrivals"),
    ("scales = [1.0, 2.0]", "scales = [1.0, 2e6]", "traffic.rate", "expected arrivals"),
    ("seeds = [0]", "seeds = []", "plan.seeds", "1..1000"),
    ("seeds = [0]", f"seeds = {list(range(1001))}", "plan.seeds", "1..1000"),
])
def test_plan_refuses_impossible_traffic_and_seeds_before_any_probe(tmp_path, capsys, no_probes, old, new, field,
                                                                    words):
    spec = _plan(tmp_path, old, new)
    assert main(["plan", str(spec), "--out", str(tmp_path / "o")]) == 2
    line = _one_error(capsys)
    assert str(spec) in line and f"'{field}'" in line and words in line, line
    assert not (tmp_path / "o").exists()
