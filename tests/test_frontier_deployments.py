"""`frontier --replicas 1,2 --router a,b`: every policy x deployment (replicas x router) x load is a cell, one Pareto
frontier per (deployment, policy), gains compared with the baseline at the same deployment, bad lists refused up
front, and a one-deployment frontier unchanged."""
from __future__ import annotations

import csv
import json

import matplotlib.colors as mcolors
import numpy as np
import pandas as pd
import pytest

import dsparksim.results.frontier as frontier_mod
from dsparksim.cli.main import _comparison_text, main
from dsparksim.results.frontier import X, Y, comparison_table, frontier_table, pareto_mask
from dsparksim.results.plots import frontier_figure, policy_color, verify_budget_figure

FAST = ["--duration", "6", "--backend", "serial", "--jobs", "1", "--quiet"]


def _run(out, *extra):
    return main(["frontier", "--policies", "mtp1,fixed:7", "--concurrency-levels", "2,8", *FAST, "--out", str(out),
                 *extra])


def _csv_rows(path):
    with open(path, newline="") as f:
        return list(csv.reader(f))


@pytest.fixture(scope="module")
def two_deployments(tmp_path_factory):
    """One frontier over replicas 1,2 (round-robin) and, for comparison, the replicas-2 deployment alone."""
    d = tmp_path_factory.mktemp("deploy")
    assert _run(d / "both", "--replicas", "1,2", "--router", "round-robin") == 0
    assert _run(d / "x2", "--replicas", "2") == 0
    return d


def test_list_form_runs_every_policy_deployment_and_load_with_deployment_columns(two_deployments):
    df = pd.read_csv(two_deployments / "both" / "frontier.csv")
    cols = list(df.columns)
    assert cols[cols.index("replicas") + 1] == "router"  # router sits next to replicas
    got = sorted(zip(df["replicas"], df["router"], df["policy"], df["load"]))
    assert got == sorted((r, "round-robin", p, c) for r in (1, 2) for p in ("mtp1", "fixed:7") for c in (2, 8))
    # Pareto flags are computed per series (deployment, policy), never across deployments.
    for _, g in df.groupby(["replicas", "router", "policy"]):
        want = pareto_mask(g[X].to_numpy(float), g[Y].to_numpy(float), ~g["saturated"].astype(bool).to_numpy())
        assert g["pareto"].tolist() == want.tolist()
    cfg = json.loads((two_deployments / "both" / "config.json").read_text())
    assert cfg["replicas"] == [1, 2] and cfg["routers"] == ["round-robin"]
    assert cfg["deployments"] == ["x1 round-robin", "x2 round-robin"]
    comp = pd.read_csv(two_deployments / "both" / "comparison.csv")
    assert comp["deployment"].unique().tolist() == ["x1 round-robin", "x2 round-robin"]
    assert (comp["policy"] == "fixed:7").all() and (comp["baseline"] == "mtp1").all()


def test_a_deployment_inside_a_larger_frontier_equals_that_deployment_alone(two_deployments):
    # The same cells, Pareto flags and gains whether replicas 2 is swept alone or next to replicas 1.
    both, alone = _csv_rows(two_deployments / "both" / "frontier.csv"), _csv_rows(two_deployments / "x2" /
                                                                                   "frontier.csv")
    assert both[0] == alone[0]
    i = both[0].index("replicas")
    assert [r for r in both[1:] if r[i] == "2"] == alone[1:]
    cb, ca = _csv_rows(two_deployments / "both" / "comparison.csv"), _csv_rows(two_deployments / "x2" /
                                                                             "comparison.csv")
    j = cb[0].index("deployment")
    assert [r for r in cb[1:] if r[j] == "x2 round-robin"] == ca[1:]


def test_one_deployment_given_explicitly_is_byte_identical_to_no_deployment_flags(tmp_path, capsys):
    assert main(["frontier", "--policies", "mtp1,fixed:7", "--concurrency-levels", "2,8", "--duration", "6",
                 "--backend", "serial", "--jobs", "1", "--out", str(tmp_path / "plain")]) == 0
    plain = capsys.readouterr().out
    assert main(["frontier", "--policies", "mtp1,fixed:7", "--concurrency-levels", "2,8", "--duration", "6",
                 "--backend", "serial", "--jobs", "1", "--replicas", "1",
                 "--out", str(tmp_path / "flags")]) == 0
    flags = capsys.readouterr().out
    for name in ("frontier.csv", "comparison.csv"):
        assert (tmp_path / "plain" / name).read_bytes() == (tmp_path / "flags" / name).read_bytes(), name
    df = pd.read_csv(tmp_path / "plain" / "frontier.csv")
    assert (df["replicas"] == 1).all() and (df["router"] == "round-robin").all()
    # The printed table of a single deployment has no deployment column (as before deployments existed).
    strip = [ln for ln in plain.splitlines() if " in " not in ln and "/plain/" not in ln]
    assert strip == [ln for ln in flags.splitlines() if " in " not in ln and "/flags/" not in ln]
    assert "deployment" not in plain.splitlines()[1]


def _summ(policy, load, x, y, replicas, router="round-robin"):
    return {"policy": policy, "load": load, X: x, Y: y, "saturated": False, "mean_verify_len": 2.0,
            "replicas": replicas, "router": router}


def test_gains_are_measured_against_the_baseline_at_the_same_deployment():
    # Deployment x1: the policy is 1.5x the baseline. Deployment x2: the baseline is 2x faster than at x1, the
    # policy the same as at x1, so there the policy is 0.75x the baseline. Comparing across deployments (either
    # baseline for either policy, or one merged frontier per policy) would give neither +50% nor -25%.
    xs = np.array([100.0, 300.0, 500.0, 700.0])
    base = 200.0 - xs / 10
    s = [_summ("base", i, x, y, 1) for i, (x, y) in enumerate(zip(xs, base))]
    s += [_summ("new", i, x, 1.5 * y, 1) for i, (x, y) in enumerate(zip(xs, base))]
    s += [_summ("base", i, x, 2.0 * y, 2, "least-outstanding") for i, (x, y) in enumerate(zip(xs, base))]
    s += [_summ("new", i, x, 1.5 * y, 2, "least-outstanding") for i, (x, y) in enumerate(zip(xs, base))]
    df = frontier_table(s)
    assert df["pareto"].all()  # per series every point is Pareto; merged per policy, x1 points would be dominated
    comp = comparison_table(df, baseline="base", slos=[150.0])
    g = comp[comp["metric"] == "tps_user_gain_at_matched_throughput"].set_index("deployment")["gain_mean"]
    assert g["x1 round-robin"] == pytest.approx(0.5)
    assert g["x2 least-outstanding"] == pytest.approx(-0.25)
    assert len(comp) == 2 * 3
    txt = _comparison_text(df, comp, "base")
    row = next(ln for ln in txt.splitlines() if ln.startswith("new") and "x2 least-outstanding" in ln)
    assert "-25% [-25..-25]" in row
    assert "deployment" in txt.splitlines()[0]


def test_a_baseline_missing_at_one_deployment_is_an_error():
    s = [_summ("base", 1, 100.0, 50.0, 1), _summ("new", 1, 100.0, 60.0, 1), _summ("new", 1, 100.0, 60.0, 2)]
    with pytest.raises(Exception, match="--baseline.*x2 round-robin"):
        comparison_table(frontier_table(s), baseline="base")


@pytest.mark.parametrize("flag,value,bad", [
    ("--replicas", "1,0", "'0'"), ("--replicas", "1,two", "'two'"), ("--replicas", "1,,2", "'1,,2'"),
    ("--replicas", "2,2", "2 more than once"), ("--router", "round-robin,nosuch", "'nosuch'"),
    ("--router", "random,random", "random more than once"),
])
def test_bad_deployment_lists_are_one_line_exit_2_before_any_cell(tmp_path, capsys, monkeypatch, flag, value, bad):
    def no_cells(*a, **k):
        raise AssertionError("a cell ran")

    monkeypatch.setattr(frontier_mod, "run_cells", no_cells)
    with pytest.raises(SystemExit) as e:
        _run(tmp_path / "o", flag, value)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and flag in err and bad in err, err
    assert not (tmp_path / "o").exists()


def test_run_keeps_single_values_only(capsys):
    with pytest.raises(SystemExit) as e:
        main(["run", "--replicas", "1,2", "--duration", "1"])
    assert e.value.code == 2 and "--replicas" in capsys.readouterr().err


def _deploy_df():
    s = []
    for reps, router in ((1, "round-robin"), (2, "least-outstanding")):
        for pol in ("mtp1", "confidence"):
            s += [_summ(pol, load, 100.0 * load * reps, 200.0 / load, reps, router) for load in (1, 2, 4)]
    return frontier_table(s)


def test_plots_show_every_series_coloured_by_policy_styled_by_deployment():
    df = _deploy_df()
    fig = frontier_figure(df, load_name="concurrent users")
    try:
        ax = fig.axes[0]
        lines = {ln.get_gid(): ln for ln in ax.get_lines() if str(ln.get_gid()).startswith("pareto:")}
        assert set(lines) == {f"pareto:{p}@{d}" for p in ("mtp1", "confidence")
                              for d in ("x1 round-robin", "x2 least-outstanding")}
        for gid, ln in lines.items():
            assert mcolors.to_hex(ln.get_color()) == policy_color(gid.split(":", 1)[1].split("@")[0])
            assert len(ln.get_xdata()) == 3
        a, b = lines["pareto:mtp1@x1 round-robin"], lines["pareto:mtp1@x2 least-outstanding"]
        assert (a.get_linestyle(), a.get_marker()) != (b.get_linestyle(), b.get_marker())
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
        assert "confidence | x2 least-outstanding" in legend and "mtp1 | x1 round-robin" in legend
        assert "per deployment" in ax.get_xlabel()
    finally:
        fig.clear()
    fig = verify_budget_figure(df, load_name="concurrent users")
    try:
        gids = {ln.get_gid() for ln in fig.axes[0].get_lines()}
        assert "verify:confidence@x2 least-outstanding" in gids and "verify:confidence@x1 round-robin" in gids
    finally:
        fig.clear()


def test_a_session_router_on_a_workload_without_sessions_fails_before_any_cell(tmp_path, capsys, monkeypatch):
    def no_cells(*a, **k):
        raise AssertionError("a cell ran")

    monkeypatch.setattr(frontier_mod, "run_cells", no_cells)
    assert _run(tmp_path / "o", "--router", "round-robin,session") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--router" in err and "session" in err, err
