"""The frontier tells the truth at a glance: saturated points never Pareto, gains carry their range and a
narrow-overlap flag, one column per SLA, fixed policy colours, SLA lines and a legend that explains the marks."""
from __future__ import annotations

import os
import subprocess
import sys

import matplotlib.colors as mcolors
import numpy as np
import pandas as pd
import pytest

from dsparksim.cli.main import _comparison_text, main
from dsparksim.errors import ConfigError
from dsparksim.results.frontier import DEFAULT_POLICIES, X, Y, comparison_table, frontier_table
from dsparksim.results.plots import POLICY_COLORS, frontier_figure, plot_frontier, policy_color, verify_budget_figure


def _summ(policy, load, x, y, saturated=False, L=3.0):
    return {"policy": policy, "load": load, X: x, Y: y, "saturated": saturated, "mean_verify_len": L,
            "saturation_detail": {"x": 1}}


def test_saturated_point_is_never_pareto_even_when_it_dominates():
    # The saturated point at load 64 beats every other point on both axes; it must not be Pareto, and it must not
    # knock the honest points off the frontier either.
    s = [_summ("a", 1, 100.0, 50.0), _summ("a", 8, 500.0, 30.0), _summ("a", 32, 900.0, 10.0),
         _summ("a", 64, 2000.0, 60.0, saturated=True)]
    df = frontier_table(s)
    assert df["pareto"].tolist() == [True, True, True, False]
    assert "saturation_detail" not in df.columns


def test_saturated_points_do_not_stretch_a_comparison_range():
    s = [_summ("b", l, x, 100 - x / 10) for l, x in ((1, 0.0), (2, 250.0), (4, 500.0))]
    s += [_summ("a", l, x, 1.5 * (100 - x / 10)) for l, x in ((1, 100.0), (2, 300.0), (4, 500.0))]
    s += [_summ("a", 8, 5000.0, 500.0, saturated=True)]  # would widen the range to 500 and dominate everything
    comp = comparison_table(frontier_table(s), baseline="b")
    r = comp[(comp["policy"] == "a") & (comp["metric"] == "tps_user_gain_at_matched_throughput")].iloc[0]
    assert (r["range_lo"], r["range_hi"]) == (100.0, 500.0)
    assert r["gain_mean"] == pytest.approx(0.5)


def _two_frontiers(xa, ya, xb, yb):
    rows = [{"policy": "base", "load": i, X: x, Y: y, "pareto": True, "saturated": False}
            for i, (x, y) in enumerate(zip(xb, yb))]
    rows += [{"policy": "new", "load": i, X: x, Y: y, "pareto": True, "saturated": False}
             for i, (x, y) in enumerate(zip(xa, ya))]
    return pd.DataFrame(rows)


BASE_X = np.array([100.0, 300.0, 500.0, 700.0, 900.0, 1100.0])
BASE_Y = np.array([250.0, 200.0, 150.0, 100.0, 60.0, 30.0])


def test_sliver_overlap_is_flagged_and_wide_overlap_is_not():
    # The policy's frontier only touches the baseline's at the fast-user end: per-user speeds 224..250 out of the
    # baseline's 30..250 (10%) -- the "+724% @SLA" case. Its throughput there is huge, so the gain looks best.
    sliver = _two_frontiers(np.array([800.0, 1600.0]), np.array([250.0, 224.0]), BASE_X, BASE_Y)
    comp = comparison_table(sliver, baseline="base")
    r = comp[comp["metric"] == "throughput_gain_at_matched_slo"].iloc[0]
    assert (r["range_lo"], r["range_hi"]) == (224.0, 250.0)
    assert r["overlap_frac"] == pytest.approx(26 / 220)
    assert bool(r["narrow_overlap"]) and r["gain_mean"] > 3
    assert "narrow overlap" in r["note"]
    # A policy 20% faster per user along the whole baseline range: trusted.
    wide = _two_frontiers(BASE_X, 1.2 * BASE_Y, BASE_X, BASE_Y)
    comp = comparison_table(wide, baseline="base")
    r = comp[comp["metric"] == "tps_user_gain_at_matched_throughput"].iloc[0]
    assert not bool(r["narrow_overlap"]) and r["overlap_frac"] == pytest.approx(1.0)
    assert r["n_points_policy"] == 6 and r["n_points_baseline"] == 6
    assert r["gain_mean"] == pytest.approx(0.2)


def test_overlap_with_one_point_of_a_frontier_is_flagged():
    # The overlap covers all of the baseline's throughput range, but only one measured point of the policy lies
    # in it: the whole gain is an interpolation from that point to a far-away one.
    df = _two_frontiers(np.array([100.0, 5000.0]), np.array([300.0, 10.0]), BASE_X, BASE_Y)
    r = comparison_table(df, baseline="base").iloc[0]
    assert r["metric"] == "tps_user_gain_at_matched_throughput"
    assert r["overlap_frac"] == pytest.approx(1.0) and r["n_points_policy"] == 1
    assert bool(r["narrow_overlap"])


def test_unknown_baseline_is_an_error_naming_the_option():
    with pytest.raises(ConfigError, match="--baseline.*nosuch"):
        comparison_table(_two_frontiers(BASE_X, BASE_Y, BASE_X, BASE_Y), baseline="nosuch")


def test_comparison_text_shows_ranges_flags_and_one_column_per_sla():
    df = pd.concat([_two_frontiers(BASE_X, 1.2 * BASE_Y, BASE_X, BASE_Y),
                    _two_frontiers(np.array([800.0, 1600.0]), np.array([250.0, 224.0]), BASE_X, BASE_Y)
                    .query("policy == 'new'").assign(policy="edge")], ignore_index=True)
    comp = comparison_table(df, baseline="base", slos=[50.0, 120.0])
    txt = _comparison_text(df, comp, "base")
    lines = txt.splitlines()
    header = lines[0]
    assert "@50 tok/s/user" in header and "@120 tok/s/user" in header
    new = next(line for line in lines if line.startswith("new"))
    edge = next(line for line in lines if line.startswith("edge"))
    # Matched-throughput gain of +20% over the whole 100-1100 tok/s range, SLA gains per column.
    assert "+20% [+20..+20] over 100-1100" in new and "!" not in new
    r50 = comp[(comp["policy"] == "new") & (comp["metric"] == "throughput_gain_at_slo:50")].iloc[0]
    r120 = comp[(comp["policy"] == "new") & (comp["metric"] == "throughput_gain_at_slo:120")].iloc[0]
    assert f"{100 * r50['gain_mean']:+.0f}%" in new and f"{100 * r120['gain_mean']:+.0f}%" in new
    # The sliver gain is shown with its 224-250 range and flagged, with the footnote explaining the flag.
    assert "over 224-250 !" in edge
    assert any(line.startswith("! narrow overlap") for line in lines)
    # Without a flagged gain, no footnote.
    txt2 = _comparison_text(df[df["policy"] != "edge"], comp[comp["policy"] != "edge"], "base")
    assert "! narrow overlap" not in txt2 and "!" not in txt2.splitlines()[2]


def test_frontier_cli_prints_every_sla_column_and_writes_flags(tmp_path, capsys):
    out = tmp_path / "f"
    assert main(["frontier", "--policies", "mtp1,fixed:7", "--concurrency-levels", "1,4,8", "--duration", "3",
                 "--jobs", "1", "--slo", "100,200", "--out", str(out)]) == 0
    txt = capsys.readouterr().out
    assert "@100 tok/s/user" in txt and "@200 tok/s/user" in txt and "over " in txt
    comp = pd.read_csv(out / "comparison.csv")
    assert {"range_lo", "range_hi", "overlap_frac", "narrow_overlap", "axis"} <= set(comp.columns)
    assert {"throughput_gain_at_slo:100", "throughput_gain_at_slo:200"} <= set(comp["metric"])


# ------------------------------------------------------------------------------------------------ colours
def test_policy_colours_are_fixed_distinct_and_deterministic_across_processes():
    assert policy_color("mtp1") == POLICY_COLORS["mtp1"] and policy_color("oracle") == "#000000"
    assert len({policy_color(p) for p in DEFAULT_POLICIES}) == len(DEFAULT_POLICIES)
    specs = ["fixed:3", "threshold:0.7", "confidence-async:4", "my-policy", *DEFAULT_POLICIES]
    here = [policy_color(p) for p in specs]
    assert here == [policy_color(p) for p in specs]
    code = ("import sys; from dsparksim.results.plots import policy_color; "
            "print(','.join(policy_color(p) for p in sys.argv[1:]))")
    for seed in ("1", "12345"):  # str hashing differs per process; the colours must not
        env = dict(os.environ, PYTHONHASHSEED=seed)
        got = subprocess.run([sys.executable, "-c", code, *specs], capture_output=True, text=True, env=env,
                             check=True).stdout.strip().split(",")
        assert got == here


def _frontier_df() -> pd.DataFrame:
    s = []
    for pol, f in (("mtp1", 1.0), ("confidence", 1.6), ("fixed:3", 1.3)):
        s += [_summ(pol, 1, 300 * f, 200 * f, L=1), _summ(pol, 8, 1500 * f, 120 * f, L=2),
              _summ(pol, 32, 1400 * f, 60 * f, L=3), _summ(pol, 128, 2500 * f, 20 * f, saturated=True, L=4)]
    return frontier_table(s)


def test_frontier_figure_has_sla_lines_policy_colours_legend_and_load_labels():
    df = _frontier_df()
    fig = frontier_figure(df, slos=[50.0, 150.0], load_name="concurrent users")
    try:
        ax = fig.axes[0]
        sla = {ln.get_gid(): ln for ln in ax.get_lines() if str(ln.get_gid()).startswith("slo:")}
        assert set(sla) == {"slo:50", "slo:150"}
        assert list(sla["slo:150"].get_ydata()) == [150.0, 150.0]
        texts = [t.get_text() for t in ax.texts]
        assert "SLO 50 tok/s/user" in texts and "SLO 150 tok/s/user" in texts
        for pol in ("mtp1", "confidence", "fixed:3"):
            line = next(ln for ln in ax.get_lines() if ln.get_gid() == f"pareto:{pol}")
            assert mcolors.to_hex(line.get_color()) == policy_color(pol)
            assert len(line.get_xdata()) == 2  # loads 1 and 8; 32 is dominated, 128 saturated
        sat = next(c for c in ax.collections if c.get_gid() == "saturated:confidence")
        assert sat.get_offsets().shape[0] == 1
        assert mcolors.to_hex(sat.get_facecolor()[0]) == policy_color("confidence")
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
        assert any("saturated" in t for t in legend) and any("dominated" in t for t in legend)
        assert any("concurrent users" in t for t in legend)
        assert {"1", "8", "32", "128"} <= set(texts)  # load levels next to the points
        fig.draw_without_rendering()
        for lab in ax.get_xticklabels() + ax.get_yticklabels():
            t = lab.get_text()
            assert "e" not in t.lower() and "^" not in t and "×" not in t, t
        assert not ax.xaxis.get_offset_text().get_text() and not ax.yaxis.get_offset_text().get_text()
        assert any(lab.get_text() for lab in ax.get_yticklabels())
    finally:
        fig.clear()


def test_verify_budget_figure_is_titled_and_coloured(tmp_path):
    df = _frontier_df()
    fig = verify_budget_figure(df, load_name="concurrent users")
    try:
        ax = fig.axes[0]
        assert "verify" in ax.get_title().lower() and "concurrent users" in ax.get_title()
        line = next(ln for ln in ax.get_lines() if ln.get_gid() == "verify:fixed:3")
        assert mcolors.to_hex(line.get_color()) == policy_color("fixed:3")
        assert list(line.get_ydata()) == [1, 2, 3, 4]
    finally:
        fig.clear()
    plot_frontier(df, tmp_path / "f.png", slos=[100.0])
    assert (tmp_path / "f.png").stat().st_size > 10_000


def test_profile_plot_colours_drafters_like_their_policies(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    from dsparksim.cli.profile import plot_profile
    from dsparksim.cost.profile import load_profile

    seen = []
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: seen.append(self))
    p = load_profile("h100-llama2-7b-tp1")
    plot_profile(p, tmp_path / "p.png")
    lines = {ln.get_label(): ln for ln in seen[0].axes[0].get_lines()}
    for name in p.drafters:
        line = next(ln for lab, ln in lines.items() if lab.startswith(f"drafter {name} "))
        assert mcolors.to_hex(line.get_color()) == policy_color(name)
    assert "mtp1" in p.drafters  # the baseline's drafter is drawn in the baseline's grey


def test_frontier_cli_unknown_baseline_is_one_line_exit_2(tmp_path, capsys):
    out = tmp_path / "f"
    rc = main(["frontier", "--policies", "mtp1,fixed:7", "--concurrency-levels", "1", "--duration", "1",
               "--jobs", "1", "--baseline", "nosuch", "--out", str(out), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "--baseline" in err and "nosuch" in err
    assert not (out / "frontier.csv").exists() and not (out / "comparison.csv").exists()
