"""Studies early-exit (2.5), ablation (2.6) and fig8-production (2.7) of issue 29: each FAST run through
``dsparksim study`` (structure, intervals, and the report's numbers are the run's own tables), the ExitCap wrapper.

Their full-mode runs are part of ``dsparksim study all`` (tests/test_study.py, slow marker)."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from dsparksim.cli.main import main
from dsparksim.sim.simulate import simulate
from dsparksim.study import ablation, early_exit, fig8
from dsparksim.study.common import PRODUCTION, run_config
from dsparksim.study.run import settings_for

NAMES = ("early-exit", "ablation", "fig8-production")


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    d = tmp_path_factory.mktemp("studies")
    for name in NAMES:
        assert main(["study", name, "--fast", "--out", str(d), "--quiet"]) == 0
    return d


def _intervals_hold(df: pd.DataFrame, mean: str, lo: str, hi: str) -> int:
    ok = df[[mean, lo, hi]].notna().all(axis=1)
    sub = df[ok]
    assert ((sub[lo] <= sub[mean] + 1e-12) & (sub[mean] <= sub[hi] + 1e-12)).all()
    return int(ok.sum())


def test_structure(out):
    rep = (out / "REPORT.md").read_text()
    for name in NAMES:
        meta = json.loads((out / name / "study.json").read_text())
        assert meta["mode"] == "fast" and meta["seeds"] == [0, 1]
        assert meta["headline"] and meta["headline"] in rep
        sec = (out / name / "section.md").read_text()
        for part in ("**Question.**", "**Setup.**", "**Answer.**", "**Limits.**"):
            assert part in sec
        for t in meta["tables"]:
            assert len(pd.read_csv(out / name / t)) > 0
        for f in meta["figures"]:
            assert (out / name / f).stat().st_size > 1000


def test_early_exit_numbers(out):
    d = out / "early-exit"
    runs = pd.read_csv(d / "runs.csv")
    assert len(runs) == len(early_exit.plan(settings_for("fast")))
    off = runs[runs["mode"] == "off"]
    assert (off["draft_saved_share"] == 0).all() and (off["drafted_per_request"] == 5).all()
    ex = runs[runs["mode"] == "exit"]
    # an autoregressive drafter saves a real share of its drafting; a parallel one at most its Markov head's 0.8%
    ar, par = ex[ex["drafter"] == "eagle3"], ex[ex["drafter"] == "dspark"]
    assert (ar["draft_saved_share"] > 0.05).all() and (par["draft_saved_share"] <= 0.008 + 1e-12).all()
    assert (ex["drafted_per_request"] < 5).all()
    # the cap arm stops the same way (same positions verifiable) but pays all K positions' drafting
    cap = runs[runs["mode"] == "cap"]
    assert (cap["draft_saved_share"] == 0).all()
    fx = runs[runs["policy"] == "fixed:5"].set_index(["drafter", "mode", "seed"])
    for drafter in ("eagle3", "dspark"):
        for seed in (0, 1):   # fixed length verifies every drafted position: exit and cap verify alike per request
            assert fx.loc[(drafter, "exit", seed), "mean_verify_len"] < 5
    paired = pd.read_csv(d / "paired_vs_no_exit.csv")
    assert _intervals_hold(paired, "diff", "diff_lo", "diff_hi") >= 20
    r = paired[(paired["drafter"] == "eagle3") & (paired["policy"] == "fixed:5") & (paired["mode"] == "exit") &
               (paired["metric"] == "output_throughput_tok_s")].iloc[0]
    assert f"| `eagle3` | `fixed:5` | 0.3 | {100 * r['diff']:+.1f}% [" in (d / "section.md").read_text()
    vc = pd.read_csv(d / "exit_vs_cap.csv")
    assert set(vc["arm"]) == {"exit"} and _intervals_hold(vc, "diff", "diff_lo", "diff_hi") >= 4


def test_ablation_numbers(out):
    d = out / "ablation"
    runs = pd.read_csv(d / "runs.csv")
    assert len(runs) == len(ablation.plan(settings_for("fast")))
    # a fixed length pads nothing: padded and variable-length runs are the same run
    fixed = runs[runs["policy"] == "fixed:5"]
    assert (fixed["pad_share"] == 0).all()
    for (arm, seed), g in fixed.groupby(["arm", "seed"]):
        assert g["output_throughput_tok_s"].nunique() == 1
    pad = runs[(runs["arm"] == "sar-async") & runs["pad"]]
    assert (pad["pad_share"] > 0).all()
    contrib = pd.read_csv(d / "contributions.csv")
    assert _intervals_hold(contrib, "diff", "diff_lo", "diff_hi") >= 20
    # total = drafter x scheduler, per seed and so in the mean log ratio
    c = contrib[(contrib["metric"] == "output_throughput_tok_s") & ~contrib["pad"]].set_index("numerator")
    tot = c[c["denominator"] == "ar-fixed"].loc["sar-async", "log_ratio"]
    dr = c[c["denominator"] == "ar-fixed"].loc["sar-fixed", "log_ratio"]
    sch = c[c["denominator"] == "sar-fixed"].loc["sar-async", "log_ratio"]
    assert tot == pytest.approx(dr + sch, rel=1e-5)   # the CSV keeps 6 significant digits
    row = contrib[(contrib["contribution"] == "total (sar-async / ar-fixed)") & ~contrib["pad"] &
                  (contrib["metric"] == "output_throughput_tok_s")].iloc[0]
    assert f"| total (sar-async / ar-fixed) | {100 * row['diff']:+.1f}% [" in (d / "section.md").read_text()
    assert len(pd.read_csv(d / "padding_cost.csv")) == len(ablation.FAST.arms)


def test_fig8_numbers(out):
    d = out / "fig8-production"
    runs = pd.read_csv(d / "runs.csv")
    assert len(runs) == len(fig8.plan(settings_for("fast")))
    assert (runs.loc[runs["policy"] == "mtp1", "mean_verify_len"] == 1).all()
    paired = pd.read_csv(d / "paired_vs_mtp1.csv")
    assert _intervals_hold(paired, "diff", "diff_lo", "diff_hi") >= 4
    vl = paired[(paired["policy"] == "confidence-async:2") & (paired["metric"] == "mean_verify_len")]
    assert len(vl) == 2 and ((vl["value"] > 1) & (vl["value"] <= 5)).all()
    r = paired[(paired["policy"] == "confidence-async:2") & (paired["metric"] == "output_throughput_tok_s") &
               (paired["load"] == 256)].iloc[0]
    sec = (d / "section.md").read_text()
    assert f"{100 * r['diff']:+.1f}% [" in sec
    assert len(pd.read_csv(d / "frontier_gains.csv")) >= 1


def test_fig8_full_plan_has_the_fitted_profile_beside():
    cells = fig8.plan(settings_for("full"))
    profiles = {c.regime.profile for c in cells}
    assert {"built-h200x8-deepseek-v3-tp8", fig8.FITTED, "h100-llama2-7b-tp1"} <= profiles
    # --profile FITTED: the fitted profile is the primary one, not run twice
    one = fig8.plan(settings_for("full", profile=fig8.FITTED))
    assert sum(c.regime.name.endswith("-fitted") for c in one) == 0


def test_exit_cap_stops_like_the_engine():
    """ExitCap verifies exactly what --draft-exit lets a fixed-length policy verify, step by step, while the engine
    prices drafting in full."""
    base = {"concurrency": 24, "duration_s": 2.0, "warmup_s": 0.5, "acceptance": "eagle3"}
    a = simulate(run_config(PRODUCTION, "fixed:5", 1, base | {"draft_exit": 0.3})).result
    b = simulate(run_config(PRODUCTION, "fixed:5", 1, base),
                 wrap_policy=lambda p: early_exit.ExitCap(p, 0.3)).result
    n = min(len(a.steps["verify_tokens"]), len(b.steps["verify_tokens"]), 40)
    # the first steps run the same requests (the stop shortens drafting, so timings drift apart later)
    np.testing.assert_array_equal(np.asarray(a.steps["verify_tokens"])[:5], np.asarray(b.steps["verify_tokens"])[:5])
    assert n >= 5
    assert "draft_s" in a.steps and "draft_s" not in b.steps
