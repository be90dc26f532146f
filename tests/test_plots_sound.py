"""Issue 31 item 18: plots -- the legend never hides a point, one colour per policy family everywhere (plan.png
included), the Pareto key is not mtp1's grey, overlapping policies stay visible, plan.png draws its SLO line and
labels replica counts, a deployments frontier is readable per GPU, verify_budget.png names its profile."""
from __future__ import annotations

import matplotlib.colors as mcolors
import pandas as pd
import pytest

from dsparksim.cli.main import main
from dsparksim.plan.report import plan_figure
from dsparksim.results.plots import POLICY_COLORS, frontier_figure, policy_color, verify_budget_figure


def _df(policies=("mtp1", "fixed:7", "goodput", "confidence"), same=("fixed:7", "goodput")):
    rows = []
    for k, pol in enumerate(policies):
        f = 1.0 if pol in same else 1.0 + 0.1 * k      # fixed:7 and goodput: the very same points
        for i, load in enumerate((1, 8, 32, 64)):
            rows.append({"policy": pol, "load": load, "output_throughput_tok_s": 200.0 * (i + 1) * f,
                         "tps_user_median": 150.0 / (i + 1) * f, "mean_verify_len": 6.0 - i, "saturated": False,
                         "pareto": True})
    return pd.DataFrame(rows)


def _disjoint(fig, ax) -> bool:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    r = FigureCanvasAgg(fig).get_renderer()
    fig.draw(r)
    leg, box = ax.get_legend().get_window_extent(r), ax.get_window_extent(r)
    return leg.x0 >= box.x1 or leg.x1 <= box.x0 or leg.y0 >= box.y1 or leg.y1 <= box.y0


@pytest.mark.parametrize("make", [lambda: frontier_figure(_df(), slos=[60.0]), lambda: verify_budget_figure(_df())])
def test_legend_is_outside_the_data_area(make):
    fig = make()
    assert _disjoint(fig, fig.axes[0])


def test_one_colour_per_family_and_families_distinct():
    assert policy_color("fixed:3") == policy_color("fixed:7") == policy_color("fixed")
    assert policy_color("threshold:0.3") == policy_color("threshold:0.5")
    assert policy_color("confidence-async:4") == policy_color("confidence-async:2") != policy_color("confidence")
    assert len(set(POLICY_COLORS.values())) == len(POLICY_COLORS)


def test_pareto_key_is_not_mtp1_grey_and_overlaps_stay_visible():
    fig = frontier_figure(_df())
    ax = fig.axes[0]
    key = next(h for h in ax.get_legend().legend_handles if "Pareto" in (h.get_label() or ""))
    assert mcolors.to_hex(key.get_color()) != policy_color("mtp1")
    lines = {ln.get_gid(): ln for ln in ax.get_lines()}
    under, over = lines["pareto:fixed:7"], lines["pareto:goodput"]
    assert list(under.get_xdata()) == list(over.get_xdata())      # the same points...
    assert under.get_linewidth() > over.get_linewidth()          # ...the one drawn first shows around the other
    assert under.get_markersize() > over.get_markersize()


def _plan_doc():
    rows = [{"cost_per_hour": 3.0 * r, "tps_user_median": 40.0 + 15 * r, "replicas": r, "feasible": True}
            for r in (1, 2, 3)]
    return {"plan": "t", "scales": [{"scale": 1.0, "feasible": True, "pareto": {"all": rows, "fixed": rows},
                                     "cheapest": {"fixed": rows[1]}}],
            "spec": {"deployments": [{"family": "fixed", "policy": "fixed:3"}],
                     "slo": ["tps_user_p50 >= 60", "ttft_p99_s <= 2"],
                     "slo_metrics": {"tps_user_p50": "tps_user_median", "ttft_p99_s": "ttft_p99_s"}}}


def test_plan_figure_family_colour_slo_line_replica_labels_and_legend():
    fig = plan_figure(_plan_doc())
    ax = fig.axes[0]
    line = next(ln for ln in ax.get_lines() if ln.get_gid() == "pareto:fixed")
    assert mcolors.to_hex(line.get_color()) == policy_color("fixed:7")    # the family's colour, as elsewhere
    slo = next(ln for ln in ax.get_lines() if ln.get_gid() == "slo:tps_user_p50")
    assert list(slo.get_ydata()) == [60.0, 60.0]
    texts = {t.get_text() for t in ax.texts}
    assert {"x1", "x2", "x3"} <= texts and any("SLO" in t for t in texts)
    assert _disjoint(fig, ax)


def test_frontier_of_deployments_per_gpu_and_verify_budget_names_its_profile(tmp_path):
    out = tmp_path / "f"
    assert main(["frontier", "--policies", "fixed:7", "--replicas", "1,2", "--concurrency-levels", "2,8",
                 "--duration", "2", "--workers", "1", "--quiet", "--out", str(out)]) == 0
    df = pd.read_csv(out / "frontier.csv")
    assert list(df["gpus"]) == [1, 1, 2, 2]                         # h100-llama2-7b-tp1: one GPU per replica
    assert list(df["output_throughput_tok_s_per_gpu"]) == pytest.approx(list(df["output_throughput_tok_s"] / df["gpus"]))
    assert (out / "frontier_per_gpu.png").stat().st_size > 10_000
    fig = verify_budget_figure(df, load_name="users", profile="h100-llama2-7b-tp1")
    assert "h100-llama2-7b-tp1" in fig.axes[0].get_title()


def _y_labels(ys):
    """The y tick labels frontier_figure shows inside its view for one series of per-user speeds ``ys``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    df = pd.DataFrame([{"policy": "mtp1", "load": i, "output_throughput_tok_s": 100.0 * (i + 1),
                        "tps_user_median": y, "saturated": False, "pareto": True} for i, y in enumerate(ys)])
    fig = frontier_figure(df)
    ax = fig.axes[0]
    FigureCanvasAgg(fig).draw()
    lo, hi = sorted(ax.get_ylim())
    assert ax.get_yscale() == "log"
    return [t.label1.get_text() for t in ax.yaxis.get_major_ticks() + ax.yaxis.get_minor_ticks()
            if lo <= t.get_loc() <= hi and t.label1.get_visible() and t.label1.get_text()]


@pytest.mark.parametrize("ys, want", [((6, 12, 30, 42), ["7", "10", "20", "30"]),
                                      ((5.5, 44), ["5", "7", "10", "20", "30"]),
                                      ((1, 50, 300, 1000), ["1", "2", "5", "10", "20", "50", "100", "200", "500",
                                                            "1,000"])])
def test_a_narrow_log_speed_axis_still_labels_several_plain_ticks(ys, want):
    # frontier.png with per-user speeds 6..42 labelled only 10 and 20 on its log y axis
    assert _y_labels(ys) == want
