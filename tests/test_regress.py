"""`dsparksim regress` on the committed baseline: passes as is, fails readably on a perturbed policy."""
from __future__ import annotations

import json
import resource
import time
from pathlib import Path

import numpy as np
import pytest

from dsparksim.cli.main import main
from dsparksim.policies.fixed import Fixed
from dsparksim.sweep.regress import allowed, compare, load_baseline, regress

REPO = Path(__file__).resolve().parents[1]
BASELINE = REPO / "tests" / "golden" / "regress_baseline.json"


def _cpu_s() -> float:
    """CPU seconds of this process and its reaped children (pool workers): a budget that load does not move."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def test_regress_passes_on_the_committed_baseline(capsys):
    # This is the project's CI frontier check (pytest runs it): 28 cells x 3 seeds, about 15 s of simulation CPU
    # (twice the one-seed check). Budgeted in CPU seconds: wall time on a shared 2-core runner depends on its load.
    t0, c0 = time.perf_counter(), _cpu_s()
    rc = main(["regress", "--baseline", str(BASELINE), "--workers", "2"])
    wall, cpu = time.perf_counter() - t0, _cpu_s() - c0
    assert rc == 0, capsys.readouterr().err
    assert "frontiers match the baseline" in capsys.readouterr().out
    assert cpu < 40, (cpu, wall)


def test_regress_fails_on_a_perturbed_policy(monkeypatch, capsys):
    # Deliberate scheduler change: fixed:K verifies no draft token at all. Its throughput falls further than the
    # two runs' seed intervals allow, and its verify length (no spread over seeds) moves past the floor.
    monkeypatch.setattr(Fixed, "choose", lambda self, ctx: np.zeros(ctx.n, dtype=np.int64))
    rc = main(["regress", "--baseline", str(BASELINE), "--backend", "serial"])
    err = capsys.readouterr().err
    assert rc == 1
    assert "frontier regression" in err and "  fixed:7:" in err and "95% t-interval half-widths" in err
    assert "mean_verify_len 7 +-0 -> 0 +-0" in err and "output_throughput_tok_s" in err
    # only the perturbed policy's own points moved (comparison gains are per policy too)
    block, _, notes = err.partition("\nnote: ")
    policies = [ln.strip()[:-1] for ln in block.splitlines() if ln.startswith("  ") and not ln.startswith("    ")]
    assert policies == ["fixed:7"], policies
    assert all(ln.startswith("  fixed:7: ") for ln in notes.splitlines()[1:])  # flag flips: notes, same policy



def _point(doc, policy, load):
    return next(r for r in doc["frontier"] if r["policy"] == policy and r["load"] == load)


def test_compare_tolerance_is_both_intervals_plus_a_floor():
    base = load_baseline(BASELINE)
    tol = base["tolerances"]
    assert len(base["seeds"]) == 3
    cur = json.loads(json.dumps(base))
    assert compare(base, cur) == {}  # a re-run on the same seeds reproduces the baseline exactly
    w, g = _point(base, "oracle", 8), _point(cur, "oracle", 8)
    m = "output_throughput_tok_s"
    assert w[m + "_hw"] > 0
    lim = allowed(w[m], w[m + "_hw"], g[m + "_hw"], tol["rtol"], tol["atol"])
    assert lim == pytest.approx(2 * w[m + "_hw"] + tol["atol"] + tol["rtol"] * w[m])
    g[m] = w[m] + 0.99 * lim  # inside: the two intervals overlap
    assert compare(base, cur) == {}
    g[m] = w[m] - 1.01 * lim
    d = compare(base, cur)
    assert list(d) == ["oracle"] and m in d["oracle"][0] and "%" in d["oracle"][0]
    # a metric with no spread over seeds: the floor absorbs float noise, anything more is flagged
    cur = json.loads(json.dumps(base))
    f = _point(cur, "fixed:7", 8)
    assert f["mean_verify_len_hw"] == 0.0
    f["mean_verify_len"] *= 1 + 0.5 * tol["rtol"]
    assert compare(base, cur) == {}
    f["mean_verify_len"] *= 1.001
    assert "mean_verify_len" in compare(base, cur)["fixed:7"][0]
    # --exact: the floor alone, so a shift inside the seed intervals is flagged too
    cur = json.loads(json.dumps(base))
    _point(cur, "oracle", 8)[m] += 0.5 * _point(base, "oracle", 8)[m + "_hw"]
    assert compare(base, cur) == {} and m in compare(base, cur, exact=True)["oracle"][0]


def test_compare_gains_flags_and_missing_points():
    base = load_baseline(BASELINE)
    cur = json.loads(json.dumps(base))
    gain = next(r for r in cur["comparison"] if r["policy"] == "goodput")
    gain["gain_mean"] += 2 * gain["gain_hw"] + 0.5 * base["tolerances"]["gain_atol"]  # both half-widths: inside
    assert compare(base, cur) == {}
    gain["gain_mean"] += base["tolerances"]["gain_atol"]
    assert any("(mean gain)" in m for m in compare(base, cur)["goodput"])
    cur = json.loads(json.dumps(base))
    row = _point(cur, "oracle", 8)
    row["pareto"] = not row["pareto"]
    cur["frontier"] = [r for r in cur["frontier"] if not (r["policy"] == "mtp1" and r["load"] == 1)]
    notes: dict = {}
    d = compare(base, cur, notes)
    # with several seeds a flag flip on a point within its intervals is a note, a missing point a failure
    assert "oracle" not in d and any("pareto" in m for m in notes["oracle"])
    assert any("missing now" in m for m in d["mtp1"])
    one = json.loads(json.dumps(base))
    one["seeds"] = [11]
    cur["seeds"] = [11]
    assert any("pareto" in m for m in compare(one, cur)["oracle"])  # one seed: exact, a flip fails


def test_an_old_format_baseline_is_refused_with_the_command_that_migrates_it(tmp_path, capsys):
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"format": "dsparksim-regress/1", "spec": "x.toml", "tolerances": {},
                               "frontier": [], "comparison": []}))
    assert main(["regress", "--baseline", str(old)]) == 2
    err = capsys.readouterr().err
    assert "dsparksim-regress/1" in err and f"dsparksim regress --baseline {old} --update" in err


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
    assert not ok and "changed since the baseline" in msg and "seeds [11, 12, 13] -> [12, 13, 14]" in msg
    # --update migrates a baseline of the old format (which plain regress refuses)
    doc = json.loads(bl.read_text())
    bl.write_text(json.dumps({**doc, "format": "dsparksim-regress/1"}))
    ok, msg, _ = regress(bl, backend="serial", update=True)
    assert ok and json.loads(bl.read_text())["format"] == "dsparksim-regress/2"
