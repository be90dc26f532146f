"""Studies (issue 29 part 1): the closed-loop user schedule, the study policy wrappers, and each study's FAST run
through ``dsparksim study`` (structure, intervals, the numbers in the report come from the run's own tables).

The full-mode run (``dsparksim study all``, tens of minutes on 2 cores) is marked ``slow`` and skipped unless
DSPARKSIM_SLOW=1.
"""
from __future__ import annotations

import json
import math
import os

import numpy as np
import pandas as pd
import pytest

from dsparksim.cli.main import main
from dsparksim.errors import ConfigError
from dsparksim.sim.simulate import simulate
from dsparksim.study import spikes
from dsparksim.study.common import DENSE, BudgetRecorder, MinVerify, recorded_steps, recovery_time, run_config
from dsparksim.traffic.config import TrafficConfig

SLOW = os.environ.get("DSPARKSIM_SLOW") == "1"


def _in_system(res, t: float) -> int:
    """Requests issued and not finished at time t (arrived at or before t)."""
    fin = np.where(np.isfinite(res.finish_s), res.finish_s, np.inf)
    return int(((res.arrival_s <= t) & (fin > t)).sum())


# --------------------------------------------------------------------------------------- user schedule
def test_user_steps_validation():
    ok = TrafficConfig(mode="closed", concurrency=4, duration_s=5.0, user_steps=((1.0, 8), (2.5, 2)))
    assert ok.user_steps == ((1.0, 8), (2.5, 2))
    for bad in (((2.0, 8), (1.0, 2)), ((0.0, 8),), ((1.0, 0),), ((1.0, 2.5),), ()):
        with pytest.raises(ConfigError, match="user_steps"):
            TrafficConfig(mode="closed", concurrency=4, duration_s=5.0, user_steps=bad)
    with pytest.raises(ConfigError, match="user_steps.*warmup"):
        TrafficConfig(mode="closed", concurrency=4, num_requests=50, num_warmup_prompts=4, user_steps=((1.0, 8),))
    with pytest.raises(ConfigError, match="user_steps.*closed"):
        TrafficConfig(mode="poisson", rate=2.0, duration_s=5.0, user_steps=((1.0, 8),))


def test_user_steps_hold_the_user_count():
    """Zero think time: exactly `users` requests are in the system between changes; after a fall the count only
    drops (users retire as their requests finish), never below the new target, and reaches it."""
    cfg = run_config(DENSE, "confidence-async:2", 3, {"concurrency": 4, "duration_s": 12.0, "warmup_s": 0.5},
                     user_steps=((1.0, 24), (4.0, 3)))
    res = simulate(cfg).result
    assert res.rejected.sum() == 0
    for t in np.linspace(0.05, 0.95, 7):
        assert _in_system(res, t) == 4
    for t in np.linspace(1.0, 3.95, 12):
        assert _in_system(res, t) == 24
    after = [_in_system(res, t) for t in np.linspace(4.0, 11.9, 60)]
    assert all(a >= b for a, b in zip(after, after[1:]))
    assert min(after) == 3 and after[0] > 3


def test_user_steps_after_the_run_change_nothing():
    base = {"concurrency": 6, "duration_s": 3.0, "warmup_s": 0.5}
    a = simulate(run_config(DENSE, "confidence", 1, base)).result
    b = simulate(run_config(DENSE, "confidence", 1, base, user_steps=((3.0, 40),))).result
    np.testing.assert_array_equal(a.finish_s, b.finish_s)
    np.testing.assert_array_equal(a.steps["verify_tokens"], b.steps["verify_tokens"])


# --------------------------------------------------------------------------------------- policy wrappers
def _recorded(policy: str, seed: int = 0):
    cfg = run_config(DENSE, policy, seed, {"concurrency": 12, "duration_s": 3.0, "warmup_s": 0.5})
    holder = []
    out = simulate(cfg, wrap_policy=lambda p: holder.append(BudgetRecorder(p)) or holder[0])
    return out, recorded_steps(out.result.steps, holder[0])


def test_lag0_uses_the_fresh_capacity_on_a_constant_load():
    out, rec = _recorded("confidence-global")
    assert len(rec["used"]) > 50
    np.testing.assert_array_equal(rec["used"], rec["fresh"])


@pytest.mark.parametrize("lag", [1, 3])
def test_async_budget_is_the_fresh_one_lag_steps_earlier(lag):
    """confidence-async:LAG verifies min(b_{t-LAG}, n_t K) at step t (the token budget does not bind here)."""
    out, rec = _recorded(f"confidence-async:{lag}")
    st = out.result.steps
    n = np.asarray(st["n_decode"])[np.asarray(st["n_decode"]) > 0]
    expect = np.minimum(rec["fresh"][:-lag], n[lag:] * 5)
    np.testing.assert_array_equal(rec["used"][lag:], expect)
    assert (rec["used"][lag:] != rec["fresh"][lag:]).any()   # stale: it does differ from the fresh budget


def test_min_verify_floor_holds_per_request():
    cfg = run_config(DENSE, "confidence-async:2", 0, {"concurrency": 12, "duration_s": 3.0, "warmup_s": 0.5})
    holder = []
    res = simulate(cfg, wrap_policy=lambda p: holder.append(MinVerify(p, 7)) or holder[0]).result
    plain = simulate(cfg).result
    assert holder[0].overflow_steps == 0 and holder[0].spec == "confidence-async:2+min7"
    dec = res.decode_steps > 0    # a floor above K = 5 verifies every draft token
    np.testing.assert_array_equal(res.verify_tokens[dec], 5 * res.decode_steps[dec])
    assert (plain.verify_tokens[plain.decode_steps > 0] < 5 * plain.decode_steps[plain.decode_steps > 0]).any()


def test_recovery_time_on_a_known_series():
    starts = np.arange(0.0, 20.0, 0.25)
    thr = np.where(starts < 5.0, 100.0, np.where(starts < 7.0, 150.0, 200.0))
    # the trailing 1 s mean is within 5% of 200 once the window lies after t = 7: its end is 8 s, 3 s after 5 s
    assert recovery_time(starts, thr, 5.0, (12.0, 20.0), window_s=1.0, band=0.05) == pytest.approx(3.0)
    assert math.isnan(recovery_time(starts, np.zeros_like(thr), 5.0, (12.0, 20.0), 1.0, 0.05))


# --------------------------------------------------------------------------------------- FAST study runs
@pytest.fixture(scope="module")
def fast_out(tmp_path_factory):
    out = tmp_path_factory.mktemp("studies")
    (out / "notes.ipynb").write_text("{}")          # a user's file in the folder: left alone
    assert main(["study", "all", "--fast", "--out", str(out), "--quiet"]) == 0
    return out


def _intervals_hold(df: pd.DataFrame, mean: str, lo: str, hi: str) -> int:
    ok = df[[mean, lo, hi]].notna().all(axis=1)
    sub = df[ok]
    assert ((sub[lo] <= sub[mean] + 1e-12) & (sub[mean] <= sub[hi] + 1e-12)).all()
    return int(ok.sum())


def test_fast_report_structure(fast_out):
    rep = (fast_out / "REPORT.md").read_text()
    assert rep.splitlines()[0].startswith("<!-- written by `dsparksim study`")
    assert (fast_out / "notes.ipynb").read_text() == "{}"
    for name in ("load-spikes", "p99-tails"):
        meta = json.loads((fast_out / name / "study.json").read_text())
        assert meta["mode"] == "fast" and meta["seeds"] == [0, 1]
        assert meta["headline"] and meta["headline"] in rep
        for part in ("**Question.**", "**Setup.**", "**Answer.**", "**Limits.**"):
            assert part in (fast_out / name / "section.md").read_text()
        for t in meta["tables"]:
            assert len(pd.read_csv(fast_out / name / t)) > 0


def test_fast_spikes_numbers(fast_out):
    d = fast_out / "load-spikes"
    runs = pd.read_csv(d / "runs.csv")
    plan = spikes.plan(__import__("dsparksim.study.run", fromlist=["settings_for"]).settings_for("fast"))
    assert len(runs) == len(plan)
    lag0 = runs[runs["lag"] == 0]
    assert (lag0["all_over"] == 0).all() and (lag0["all_under"] == 0).all()   # LAG 0 is the fresh capacity
    stale = runs[(runs["lag"] == 8) & (runs["scenario"] == "step")]
    assert (stale["up_under_rel"] > 0).all()   # a stale budget lags the rising batch: it under-verifies
    paired = pd.read_csv(d / "paired_vs_lag0.csv")
    assert _intervals_hold(paired, "diff", "diff_lo", "diff_hi") > 10
    assert (paired.loc[paired["lag"] == 0, "diff"].fillna(0) == 0).all()
    # the report's spike-loss cell for LAG 8 is the table's paired loss (numbers come from the run)
    r = paired[(paired["lag"] == 8) & (paired["scenario"] == "step") &
               (paired["metric"] == "spike_throughput_tok_s")].iloc[0]
    assert f"| 8 | {-100 * r['diff']:+.2f} [" in (d / "section.md").read_text()
    err = pd.read_csv(d / "budget_error.csv")
    assert _intervals_hold(err, "mean", "lo", "hi") > 5


def test_fast_tails_numbers(fast_out):
    d = fast_out / "p99-tails"
    runs = pd.read_csv(d / "runs.csv")
    assert set(runs["policy"]) == {"mtp1", "confidence-async:2", "confidence-async:2+min1"}
    knob = runs[runs["policy"] == "confidence-async:2+min1"]
    # the floor holds on every step (mean verify length per decoding request >= 1; the per-request check is
    # test_min_verify_floor_holds_per_request), and it never had to give way to the token budget here
    assert (knob["mean_verify_len"] >= 1.0).all() and (knob["knob_overflow_steps"] == 0).all()
    paired = pd.read_csv(d / "paired_vs_base.csv")
    assert _intervals_hold(paired, "diff", "diff_lo", "diff_hi") >= 10
    assert _intervals_hold(paired, "value", "value_lo", "value_hi") >= 15
    r = paired[(paired["policy"] == "mtp1") & (paired["metric"] == "tpot_p99_s")].iloc[0]
    assert f"{1e3 * r['value']:.1f} [" in (d / "section.md").read_text()


def test_out_folder_protection(tmp_path, capsys):
    (tmp_path / "REPORT.md").write_text("# my own report\n")
    assert main(["study", "p99-tails", "--fast", "--out", str(tmp_path), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "REPORT.md" in err[0] and "not written by" in err[0]
    other = tmp_path / "x"
    (other / "load-spikes").mkdir(parents=True)
    assert main(["study", "load-spikes", "--fast", "--out", str(other), "--quiet"]) == 2
    assert "not a study result folder" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["study", "nope", "--out", str(other)])
    assert e.value.code == 2
    assert main(["study", "all", "--fast", "--seeds", "1", "--out", str(other / "n"), "--quiet"]) == 2
    assert main(["study", "all", "--fast", "--profile", "no-such-profile", "--out", str(other / "n"), "--quiet"]) == 2


# --------------------------------------------------------------------------------------- full mode
@pytest.mark.slow
@pytest.mark.skipif(not SLOW, reason="full-mode studies (tens of minutes on 2 cores): set DSPARKSIM_SLOW=1")
def test_full_studies(tmp_path):
    assert main(["study", "all", "--out", str(tmp_path), "--workers", "2", "--quiet"]) == 0
    paired = pd.read_csv(tmp_path / "load-spikes" / "paired_vs_lag0.csv")
    assert set(paired["regime"]) == {"production", "dense"}
    assert _intervals_hold(paired, "diff", "diff_lo", "diff_hi") > 100
    runs = pd.read_csv(tmp_path / "load-spikes" / "runs.csv")
    assert (runs.loc[runs["lag"] == 0, "all_under"] == 0).all()
    tails = pd.read_csv(tmp_path / "p99-tails" / "paired_vs_base.csv")
    assert _intervals_hold(tails, "value", "value_lo", "value_hi") > 100


def test_progress_is_drawn_on_a_terminal_only(tmp_path, capsys, monkeypatch):
    """The carriage-return progress line goes to a terminal (or DSPARKSIM_PROGRESS=1), never into a log."""
    from types import SimpleNamespace

    import dsparksim.study.run as study_run

    def fake_run(name, settings, workers=1, progress=None):
        for i in (1, 2):
            progress(i, 2)
        return SimpleNamespace(headline="h"), [], 0.0

    monkeypatch.setattr(study_run, "run_study", fake_run)
    monkeypatch.setattr(study_run, "write_study", lambda out, name, *a: tmp_path / name)
    monkeypatch.setattr(study_run, "write_report", lambda out: tmp_path / "REPORT.md")
    monkeypatch.delenv("DSPARKSIM_PROGRESS", raising=False)
    assert main(["study", "p99-tails", "--fast", "--out", str(tmp_path / "s")]) == 0
    cap = capsys.readouterr()
    assert "runs" not in cap.err and "p99-tails: 0.0 s" in cap.out
    monkeypatch.setenv("DSPARKSIM_PROGRESS", "1")
    assert main(["study", "p99-tails", "--fast", "--out", str(tmp_path / "s")]) == 0
    assert "p99-tails: 2/2 runs" in capsys.readouterr().err


def test_an_out_that_cannot_be_created_is_refused_before_any_run(tmp_path, capsys, monkeypatch):
    import dsparksim.study.run as study_run

    def no_run(*a, **k):
        raise AssertionError("a study ran")
    monkeypatch.setattr(study_run, "run_study", no_run)
    f = tmp_path / "x.csv"
    f.write_text("mine")
    assert main(["study", "p99-tails", "--fast", "--out", str(f / "sub"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "x.csv" in err[0] and "is a file" in err[0], err
    assert f.read_text() == "mine"


def test_an_empty_out_is_refused_not_the_working_directory(tmp_path, capsys, monkeypatch):
    # --out '' wrote REPORT.md and the study folder into the working directory (Path('') is '.')
    import dsparksim.study.run as study_run

    monkeypatch.setattr(study_run, "run_study", lambda *a, **k: pytest.fail("a study ran"))
    monkeypatch.chdir(tmp_path)
    assert main(["study", "ablation", "--fast", "--out", "", "--quiet"]) == 2
    assert "field '--out': empty path ''" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_seeds_are_capped_as_elsewhere(capsys):
    # --seeds 2000 would start hours of runs; the cap is frontier's and sweep's (results.stats.MAX_SEEDS)
    from dsparksim.results.stats import MAX_SEEDS
    with pytest.raises(SystemExit) as e:
        main(["study", "load-spikes", "--fast", "--seeds", str(MAX_SEEDS + 1), "--out", "never"])
    assert e.value.code == 2 and f"at most {MAX_SEEDS} seeds" in capsys.readouterr().err


def test_study_all_failing_mid_way_regenerates_the_report_from_the_folders(tmp_path, monkeypatch):
    """`study all`: a later study failing left REPORT.md showing the earlier results of studies whose folders it had
    already replaced; the report is now regenerated from the folders as they are, then the error goes on."""
    from types import SimpleNamespace

    import dsparksim.study.run as study_run
    from dsparksim.study.run import STUDIES

    def fake_run(name, settings, workers=1, progress=None):
        if name == list(STUDIES)[1]:
            raise RuntimeError("boom")
        return SimpleNamespace(headline="new headline", tables={"t": [{"a": 1}]}, markdown="new", figures={}), [], 0.0

    monkeypatch.setattr(study_run, "run_study", fake_run)
    out = tmp_path / "s"
    with pytest.raises(RuntimeError, match="boom"):
        main(["study", "all", "--fast", "--out", str(out)])
    first = list(STUDIES)[0]
    assert json.loads((out / first / "study.json").read_text())["headline"] == "new headline"
    assert "new headline" in (out / "REPORT.md").read_text()
