"""Issue 31 items 10, 12, 13: plan traffic, --seeds, SLO terms and option messages -- refused with exit 2 and one
line naming where the bad value came from, before any cell runs. (The regress baseline checks of items 8 and 10
are in the format-3 rewrite of dsparksim.sweep.regress, tests/test_regress*.py.)"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsparksim.cli.main import main

REPO = Path(__file__).resolve().parents[1]


def _one_error(capsys) -> str:
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("dsparksim: error: "), err
    return err[0]


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
