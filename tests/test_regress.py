"""`dsparksim regress` on the committed baseline: passes as is, fails readably on a perturbed policy."""
from __future__ import annotations

import json
import resource
import time
from pathlib import Path

import numpy as np

from dsparksim.cli.main import main
from dsparksim.policies.fixed import Fixed
from dsparksim.sweep.regress import compare, load_baseline, regress

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
    # Deliberate scheduler change: fixed:K verifies no draft token at all. Every seed of its points moves (paired
    # changes far beyond the 2% threshold), and only fixed:7 is named.
    monkeypatch.setattr(Fixed, "choose", lambda self, ctx: np.zeros(ctx.n, dtype=np.int64))
    rc = main(["regress", "--baseline", str(BASELINE), "--backend", "serial"])
    err = capsys.readouterr().err
    assert rc == 1
    assert "frontier regression" in err and "  fixed:7:" in err and "paired 95% CI" in err
    assert "mean_verify_len 7 -> 0 (-100.00%" in err and "output_throughput_tok_s" in err
    block, _, notes = err.partition("\nnote: ")
    policies = [ln.strip()[:-1] for ln in block.splitlines() if ln.startswith("  ") and not ln.startswith("    ")]
    assert policies == ["fixed:7"], policies
    assert all(ln.startswith("  fixed:7: ") for ln in notes.splitlines()[1:])  # notes: the same policy only


def _point(doc, policy, load):
    return next(r for r in doc["frontier"] if r["policy"] == policy and r["load"] == load)


def test_compare_is_paired_per_seed_with_a_practical_threshold():
    base = load_baseline(BASELINE)
    assert len(base["seeds"]) == 3 and base["tolerances"]["threshold"] == 0.02
    cur = json.loads(json.dumps(base))
    assert compare(base, cur) == {}  # a re-run on the same seeds reproduces the baseline exactly
    m = "output_throughput_tok_s"
    vals = _point(base, "oracle", 8)[m]
    assert len(set(vals)) == 3      # the seeds differ...
    _point(cur, "oracle", 8)[m] = [v * 0.99 for v in vals]
    assert compare(base, cur) == {}  # ...a 1% change at every seed is below the threshold
    _point(cur, "oracle", 8)[m] = [v * 0.97 for v in vals]
    d = compare(base, cur)
    assert list(d) == ["oracle"] and m in d["oracle"][0] and "-3.00%" in d["oracle"][0]
    # --exact: any per-seed difference beyond the floor
    cur = json.loads(json.dumps(base))
    _point(cur, "oracle", 8)[m] = [vals[0] * 1.001, *vals[1:]]
    assert compare(base, cur) == {} and m in compare(base, cur, exact=True)["oracle"][0]


def test_compare_flags_and_missing_points():
    base = load_baseline(BASELINE)
    cur = json.loads(json.dumps(base))
    row = _point(cur, "oracle", 8)
    row["pareto"] = [not x for x in row["pareto"]]
    cur["frontier"] = [r for r in cur["frontier"] if not (r["policy"] == "mtp1" and r["load"] == 1)]
    notes: dict = {}
    d = compare(base, cur, notes)
    # a flag flip is a note, a missing point a failure
    assert "oracle" not in d and any("pareto" in m for m in notes["oracle"])
    assert any("missing now" in m for m in d["mtp1"])


def test_a_baseline_with_a_non_numeric_value_is_one_error_line(tmp_path, capsys):
    doc = json.loads(BASELINE.read_text())
    doc["frontier"][0]["tau"] = ["x", 1.0, 1.0]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    assert main(["regress", "--baseline", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "frontier[0].tau" in err[0]


def test_an_old_format_baseline_is_refused_with_the_command_that_migrates_it(tmp_path, capsys):
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"format": "dsparksim-regress/1", "spec": "x.toml", "tolerances": {},
                               "frontier": [], "comparison": []}))
    assert main(["regress", "--baseline", str(old)]) == 2
    err = capsys.readouterr().err
    assert "dsparksim-regress/1" in err and f"dsparksim regress --baseline {old} --update" in err
    old.write_text(json.dumps({"format": "dsparksim-regress/2", "spec": "x.toml", "tolerances": {}, "seeds": [1],
                               "frontier": [], "comparison": []}))
    assert main(["regress", "--baseline", str(old)]) == 2
    assert "no per-seed values" in capsys.readouterr().err


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
    assert ok and json.loads(bl.read_text())["format"] == "dsparksim-regress/3"


def test_update_into_an_unwritable_baseline_path_is_refused_before_any_cell(tmp_path, capsys, monkeypatch):
    """--update --baseline FILE/x.json (under a file) or a directory: one error line naming --baseline before any
    cell runs (it was a FileExistsError traceback after the whole sweep)."""
    import dsparksim.sweep.regress as reg
    monkeypatch.setattr(reg, "compute", lambda *a, **k: (_ for _ in ()).throw(AssertionError("cells ran")))
    (tmp_path / "afile").write_text("x")
    for bl, why in ((tmp_path / "afile" / "b.json", "is a file"), (tmp_path, "is a directory")):
        rc = main(["regress", "--baseline", str(bl), "--update", "--spec", str(REPO / "sweeps" / "regress.toml")])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and err[0].startswith("dsparksim: error: ") and "'--baseline'" in err[0] \
            and why in err[0], err


def test_a_baseline_naming_a_metric_this_version_does_not_compute_is_refused(tmp_path, capsys):
    """A baseline written by a newer dsparksim (summary.json and the compared metrics gain keys) or edited by hand:
    a metric listed in its `metrics` that this version does not compute was compared against nothing and the check
    passed (exit 0); an empty `metrics` list compared nothing and passed. Both are one error line, exit 2."""
    doc = json.loads(BASELINE.read_text())
    doc["spec"] = str(REPO / "sweeps" / "regress.toml")
    doc["dsparksim_version"] = "9.9.9"
    doc["metrics"] = [*doc["metrics"], "tps_user_p10"]
    for r in doc["frontier"]:
        r["tps_user_p10"] = [1.0] * len(doc["seeds"])
    newer = tmp_path / "newer.json"
    newer.write_text(json.dumps(doc))
    assert main(["regress", "--baseline", str(newer), "--backend", "serial"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'metrics'" in err[0] and "tps_user_p10" in err[0] and "9.9.9" in err[0], err
    doc["metrics"] = []
    newer.write_text(json.dumps(doc))
    assert main(["regress", "--baseline", str(newer), "--backend", "serial"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'metrics'" in err[0] and "empty" in err[0], err
    # --update (which the message names) rewrites such a baseline with this version's metrics
    doc["metrics"] = [*json.loads(BASELINE.read_text())["metrics"], "tps_user_p10"]
    newer.write_text(json.dumps(doc))
    spec = tmp_path / "small.toml"
    spec.write_text((REPO / "sweeps" / "regress.toml").read_text().replace(
        '"none", "mtp1", "fixed:7", "threshold:0.5", "goodput", "confidence", "confidence-async:2", "oracle"',
        '"fixed:7"').replace("concurrency = [1, 8, 32, 96]", "concurrency = [2]"))
    assert main(["regress", "--baseline", str(newer), "--spec", str(spec), "--update", "--backend", "serial"]) == 0
    assert json.loads(newer.read_text())["metrics"] == json.loads(BASELINE.read_text())["metrics"]


def test_an_edit_outside_what_regress_reads_is_a_note_and_a_run_change_a_failure(tmp_path):
    """One spec file serves sweep, capacity and regress (docs/sweeps.md): a [capacity] table added for `capacity`,
    a comment or the sweep's name failed regress as 'spec changed' (exit 1) while its note said the table was
    ignored and every run was the same. Only [base], [axes] and [regress] count now; the rest is a note."""
    text = (REPO / "sweeps" / "regress.toml").read_text().replace(
        '"none", "mtp1", "fixed:7", "threshold:0.5", "goodput", "confidence", "confidence-async:2", "oracle"',
        '"fixed:7"').replace("concurrency = [1, 8, 32, 96]", "concurrency = [2]")
    spec = tmp_path / "small.toml"
    spec.write_text(text)
    bl = tmp_path / "baseline.json"
    assert regress(bl, spec_path=spec, backend="serial", update=True)[0]
    spec.write_text("# edited\n" + text.replace('name = "regress"', 'name = "renamed"')
                    + '\n[capacity]\nslo = ["tps_user_median>=50"]\nmin = 1\nmax = 64\n')
    ok, msg, _ = regress(bl, backend="serial")
    assert ok and "frontiers match" in msg and "outside what regress reads" in msg, msg
    spec.write_text(text.replace("duration_s = 6.0", "duration_s = 6.5"))
    ok, msg, _ = regress(bl, backend="serial")
    assert not ok and "changed since the baseline was made (sha256 differs)" in msg, msg


def test_json_report_is_one_object_on_stdout_pass_or_fail(monkeypatch, capsys):
    """`regress --json`: what a CI step parses -- stdout is one JSON object (passed, failed_policies, per policy its
    difference lines), the exit status is the readable report's (0 pass, 1 regression)."""
    assert main(["regress", "--baseline", str(BASELINE), "--workers", "2", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["passed"] is True and rep["failed_policies"] == [] and rep["differences"] == {}
    assert rep["seeds"] == [11, 12, 13] and rep["points"] == 32 and "2%" in rep["rule"]
    monkeypatch.setattr(Fixed, "choose", lambda self, ctx: np.zeros(ctx.n, dtype=np.int64))
    assert main(["regress", "--baseline", str(BASELINE), "--backend", "serial", "--json"]) == 1
    out = capsys.readouterr().out
    rep = json.loads(out)
    assert rep["passed"] is False and rep["failed_policies"] == ["fixed:7"]
    assert any("mean_verify_len 7 -> 0 (-100.00%" in d for d in rep["differences"]["fixed:7"])


def test_the_specs_regress_threshold_is_applied_over_a_baseline_edited_to_another(tmp_path, monkeypatch):
    """The rule's settings are the defaults, then the baseline's, then the spec's [regress] table (tolerances());
    the comparison read the baseline's alone, so a baseline edited to threshold 10 (1000%) passed a policy that
    verifies nothing while sweeps/regress.toml says threshold = 0.02. The spec's value is applied, with a note."""
    text = (REPO / "sweeps" / "regress.toml").read_text().replace(
        '"none", "mtp1", "fixed:7", "threshold:0.5", "goodput", "confidence", "confidence-async:2", "oracle"',
        '"fixed:7"').replace("concurrency = [1, 8, 32, 96]", "concurrency = [8]")
    assert "threshold = 0.02" in text
    spec = tmp_path / "small.toml"
    spec.write_text(text)
    bl = tmp_path / "baseline.json"
    assert regress(bl, spec_path=spec, backend="serial", update=True)[0]
    doc = json.loads(bl.read_text())
    doc["tolerances"]["threshold"] = 10.0
    bl.write_text(json.dumps(doc))
    monkeypatch.setattr(Fixed, "choose", lambda self, ctx: np.zeros(ctx.n, dtype=np.int64))
    ok, msg, _ = regress(bl, backend="serial")
    assert not ok and "mean_verify_len 7 -> 0 (-100.00%" in msg and "exceeds 2%" in msg, msg
    assert "threshold 10 in the baseline" in msg, msg


def test_a_policy_that_now_crashes_is_a_regression_under_it_not_bad_input(monkeypatch, capsys):
    """A scheduler change that makes a policy raise failed the check as bad input (exit 2, `sweeps/regress.toml:
    field 'cells'`), blaming the spec for the code; its cells ran for the baseline, so it is a regression (exit 1,
    as `sweep` exits 1 on failed cells), named under that policy, the other policies compared as usual."""
    def boom(self, ctx):
        raise ValueError("injected crash")
    monkeypatch.setattr(Fixed, "choose", boom)
    assert main(["regress", "--baseline", str(BASELINE), "--backend", "serial", "--json"]) == 1
    rep = json.loads(capsys.readouterr().out)
    assert rep["failed_policies"] == ["fixed:7"], rep["failed_policies"]
    assert "load 8: cell failed at seed(s) 11, 12, 13: ValueError: injected crash" in rep["differences"]["fixed:7"]


def test_a_spec_given_that_is_not_the_baselines_is_named_as_such(tmp_path):
    """--spec OTHER.toml against a baseline of sweeps/regress.toml said 'spec ../../sweeps/regress.toml changed
    since the baseline was made', naming a file nobody edited; it now names the given spec as not the baseline's."""
    base = load_baseline(BASELINE)
    cur = json.loads(json.dumps(base))
    cur["spec"], cur["spec_sha256"], cur["runs_sha256"] = "../../k5.toml", "x", "y"
    d = compare(base, cur)
    assert list(d) == ["(spec)"] and "k5.toml" in d["(spec)"][0] and "is not the baseline's" in d["(spec)"][0], d
    cur["spec"] = base["spec"]
    assert "changed since the baseline was made" in compare(base, cur)["(spec)"][0]


def test_a_flagged_change_prints_the_new_runs_mean_after_the_arrow():
    """'A -> B (x%)': B was A x (1 + mean per-seed change), a figure neither run has where seeds move unequally
    (num_requests_completed '37.3333 -> 31.7293' over three integer counts). B is the new run's mean now; x stays
    the mean paired change the rule judges."""
    base = load_baseline(BASELINE)
    cur = json.loads(json.dumps(base))
    m = "num_requests_completed"
    vals = _point(base, "oracle", 32)[m]
    new = [round(v * f) for v, f in zip(vals, (0.8, 0.85, 0.9))]
    _point(cur, "oracle", 32)[m] = new
    line = next(x for x in compare(base, cur)["oracle"] if m in x)
    assert f"-> {sum(new) / 3:.6g} (" in line, (vals, new, line)


def test_a_baseline_with_a_point_twice_is_refused(tmp_path, capsys):
    """An edited (or merged) baseline holding one policy x load twice: the last copy was compared and the first
    dropped without a word. One error line naming both entries, exit 2."""
    doc = json.loads(BASELINE.read_text())
    doc["spec"] = str(REPO / "sweeps" / "regress.toml")
    doc["frontier"].append(json.loads(json.dumps(doc["frontier"][5])))
    bad = tmp_path / "dup.json"
    bad.write_text(json.dumps(doc))
    assert main(["regress", "--baseline", str(bad), "--backend", "serial"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    n = len(doc["frontier"]) - 1
    assert len(err) == 1 and f"frontier[{n}]" in err[0] and "frontier[5]" in err[0], err
