"""`dsparksim audit` checks its options before any sampling (hostile-tester finding 2026-12-03: --steps 0 reported
every lossless policy as biased at p = nan, --alpha 2 failed them all, an unwritable --out raised after the audit)."""
from __future__ import annotations

import json

import pytest

import dsparksim.runner.audit as audit_mod
from dsparksim.cli.main import main


@pytest.fixture
def no_sampling(monkeypatch):
    calls = []
    monkeypatch.setattr(audit_mod, "audit_all", lambda **k: calls.append(k) or [])
    return calls


@pytest.mark.parametrize("argv, field, expected", [
    (["--steps", "0"], "--steps", "at least 1 engine step"),
    (["--steps", "-5"], "--steps", "got -5"),
    (["--alpha", "2"], "--alpha", "in (0, 1), got 2"),
    (["--alpha", "0"], "--alpha", "in (0, 1), got 0"),
])
def test_bad_numbers_are_refused_before_any_sampling(no_sampling, capsys, argv, field, expected):
    assert main(["audit", *argv]) == 2
    err = capsys.readouterr().err
    assert f"'{field}'" in err and expected in err and not no_sampling


def test_an_out_path_that_cannot_be_written_is_refused_before_any_sampling(no_sampling, tmp_path, capsys):
    assert main(["audit", "--steps", "10", "--out", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err
    f = tmp_path / "file"
    f.write_text("x")
    assert main(["audit", "--steps", "10", "--out", str(f / "a.json")]) == 2
    assert "is a file" in capsys.readouterr().err and not no_sampling


def test_a_good_audit_writes_its_rows(tmp_path):
    out = tmp_path / "sub" / "audit.json"
    rc = main(["audit", "--steps", "200", "--out", str(out)])
    rows = json.loads(out.read_text())
    assert {r["policy"] for r in rows} >= {"confidence", "confidence-global"} and rc in (0, 1)
    assert all(r["tokens"] > 0 for r in rows)
