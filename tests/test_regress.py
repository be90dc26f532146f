"""`dsparksim regress` on the committed baseline: passes as is, fails readably on a perturbed policy."""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from dsparksim.cli import main
from dsparksim.policies.fixed import Fixed
from dsparksim.sweep.regress import compare, load_baseline, regress

REPO = Path(__file__).resolve().parents[1]
BASELINE = REPO / "tests" / "golden" / "regress_baseline.json"


def test_regress_passes_on_the_committed_baseline(capsys):
    # This is the project's CI frontier check (pytest runs it). Budget: well under a minute on 2 cores.
    t0 = time.perf_counter()
    rc = main(["regress", "--baseline", str(BASELINE), "--workers", "2"])
    wall = time.perf_counter() - t0
    assert rc == 0, capsys.readouterr().err
    assert "frontiers match the baseline" in capsys.readouterr().out
    assert wall < 40, wall


def test_regress_fails_on_a_perturbed_policy(monkeypatch, capsys):
    # Deliberate scheduler change: fixed:K verifies one draft token fewer than it should.
    orig = Fixed.choose
    monkeypatch.setattr(Fixed, "choose", lambda self, ctx: np.maximum(orig(self, ctx) - 1, 0))
    rc = main(["regress", "--baseline", str(BASELINE), "--backend", "serial"])
    err = capsys.readouterr().err
    assert rc == 1
    assert "frontier regression" in err and "  fixed:7:" in err
    assert "mean_verify_len" in err and "output_throughput_tok_s" in err
    # only the perturbed policy's own points moved (comparison gains are per policy too)
    policies = [ln.strip()[:-1] for ln in err.splitlines() if ln.startswith("  ") and not ln.startswith("    ")]
    assert policies == ["fixed:7"], policies


def test_compare_reports_missing_points_flag_flips_and_tolerance(tmp_path):
    base = load_baseline(BASELINE)
    cur = json.loads(json.dumps(base))
    assert compare(base, cur) == {}
    row = next(r for r in cur["frontier"] if r["policy"] == "oracle")
    row["tps_user_median"] *= 1 + 0.5 * base["tolerances"]["rtol"]  # inside the stated tolerance
    assert compare(base, cur) == {}
    row["tps_user_median"] *= 1.01
    row["pareto"] = not row["pareto"]
    cur["frontier"] = [r for r in cur["frontier"] if not (r["policy"] == "mtp1" and r["load"] == 1)]
    d = compare(base, cur)
    assert any("tps_user_median" in m and "%" in m for m in d["oracle"])
    assert any(m.startswith("load") and "pareto" in m for m in d["oracle"])
    assert any("missing now" in m for m in d["mtp1"])


def test_update_writes_a_baseline_that_then_passes(tmp_path):
    spec = REPO / "sweeps" / "regress.toml"
    full = ('policy = ["none", "mtp1", "fixed:7", "threshold:0.5", "goodput", "confidence", "confidence-async:2", '
            '"oracle"]')
    assert full in spec.read_text()   # else the replace below would silently run the whole sweep
    text = spec.read_text().replace(full, 'policy = ["mtp1", "oracle"]')
    text = text.replace("concurrency = [1, 8, 32, 96]", "concurrency = [2, 16]")
    small = tmp_path / "small.toml"
    small.write_text(text)
    bl = tmp_path / "b" / "baseline.json"
    bl.parent.mkdir()
    ok, msg, _ = regress(bl, spec_path=small, backend="serial", update=True)
    assert ok and bl.is_file() and json.loads(bl.read_text())["spec"] == "../small.toml"
    ok, msg, _ = regress(bl, backend="serial")
    assert ok, msg
    small.write_text(text.replace("seed = 11", "seed = 12"))
    ok, msg, _ = regress(bl, backend="serial")
    assert not ok and "changed since the baseline" in msg
