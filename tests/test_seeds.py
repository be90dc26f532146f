"""`frontier --seeds N`: t-intervals that cover at their nominal rate, per-seed rows equal to single-seed runs,
paired gains (a policy against itself: exactly 0, zero width), error bars, and N=1 output unchanged."""
from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from dsparksim.cli.main import main
from dsparksim.results.frontier import X, Y, cells, comparison_table, frontier_table, run_cells
from dsparksim.results.frontier_seeds import comparison_with_intervals, seed_means
from dsparksim.results.plots import frontier_figure, verify_budget_figure
from dsparksim.results.stats import seed_list, t_interval, t_quantile

FAST = ["--duration", "4", "--backend", "serial", "--quiet"]


def test_t_interval_covers_the_true_mean_at_its_nominal_rate():
    # Known answer: normal per-seed values (mean 3, sd 2), n = 5 seeds, 4000 fixed-seed replications. The t-interval
    # is exact for normal data, so coverage ~ Binomial(4000, 0.95)/4000: sd 0.0034; tolerance 4 sd = 0.014.
    rng = np.random.default_rng(20261201)
    reps, n, mu = 4000, 5, 3.0
    hits = sum(iv.lo <= mu <= iv.hi for iv in (t_interval(rng.normal(mu, 2.0, n)) for _ in range(reps)))
    assert abs(hits / reps - 0.95) <= 4 * math.sqrt(0.95 * 0.05 / reps), hits / reps
    # and a z-interval (no t correction) would visibly under-cover at n = 5: the t quantile matters
    assert t_quantile(5) == pytest.approx(2.7764, abs=1e-4)


def test_t_interval_edge_cases():
    assert t_interval([2.0, 2.0, 2.0]) == (2.0, 2.0, 2.0, 3)  # constant: zero width, exactly
    one = t_interval([4.0])
    assert one.mean == 4.0 and math.isnan(one.lo) and math.isnan(one.hi)
    miss = t_interval([1.0, None, 3.0])  # a seed without a value: no mean of the others
    assert math.isnan(miss.mean) and miss.n == 3
    iv = t_interval([1.0, 2.0, 3.0])
    assert iv.mean == 2.0 and iv.hi - 2.0 == pytest.approx(t_quantile(3) * 1.0 / math.sqrt(3))
    assert seed_list(11, 3) == [11, 12, 13]
    with pytest.raises(ValueError):
        seed_list(0, 0)


def _read(d, name):
    return pd.read_csv(d / name)


@pytest.fixture(scope="module")
def seeded(tmp_path_factory):
    d = tmp_path_factory.mktemp("seeds")
    args = ["frontier", "--policies", "mtp1,fixed:7", "--concurrency-levels", "1,8,32", *FAST]
    assert main([*args, "--seed", "5", "--seeds", "3", "--out", str(d / "n3")]) == 0
    assert main([*args, "--seed", "6", "--out", str(d / "s6")]) == 0
    return d


def test_per_seed_rows_are_the_single_seed_runs_and_means_their_average(seeded):
    per = _read(seeded / "n3", "frontier_seeds.csv")
    assert sorted(per["seed"].unique()) == [5, 6, 7]
    one = _read(seeded / "s6", "frontier.csv")
    s6 = per[per["seed"] == 6].drop(columns="seed").reset_index(drop=True)
    pd.testing.assert_frame_equal(s6[one.columns], one)  # seed 6 of 3 is exactly `--seed 6` alone
    mean = _read(seeded / "n3", "frontier.csv")
    assert (mean["n_seeds"] == 3).all()
    for m in (X, Y, "tau", "ttft_median_s"):
        want = per.groupby(["policy", "load"], sort=False)[m].mean().to_numpy()
        np.testing.assert_allclose(mean[m].to_numpy(), want, rtol=1e-8)  # CSV: 9 significant digits
        assert (mean[f"{m}_lo"] <= mean[m]).all() and (mean[m] <= mean[f"{m}_hi"]).all()
    r = mean[(mean["policy"] == "mtp1") & (mean["load"] == 8)].iloc[0]
    v = per[(per["policy"] == "mtp1") & (per["load"] == 8)][X].to_numpy()
    h = t_quantile(3) * v.std(ddof=1) / math.sqrt(3)
    # rel 1e-7: the interval is recomputed from per-seed values the CSV rounds to 9 significant digits, and the
    # sample sd amplifies that rounding (seen: 1.1e-8)
    assert r[f"{X}_hi"] == pytest.approx(v.mean() + h, rel=1e-7)
    assert r[f"{X}_lo"] == pytest.approx(v.mean() - h, rel=1e-7)
    cfg = json.loads((seeded / "n3" / "config.json").read_text())
    assert cfg["seeds"] == [5, 6, 7] and cfg["base_config"]["seed"] == 5


def test_gains_carry_paired_intervals(seeded):
    comp = _read(seeded / "n3", "comparison.csv")
    per = _read(seeded / "n3", "frontier_seeds.csv")
    gains = [comparison_table(per[per["seed"] == s].drop(columns="seed")).set_index("metric")["gain_mean"]
             for s in (5, 6, 7)]
    for _, r in comp.iterrows():
        iv = t_interval([g[r["metric"]] for g in gains])
        assert r["gain_seed_mean"] == pytest.approx(iv.mean) and r["gain_lo"] == pytest.approx(iv.lo)
        assert r["gain_hi"] == pytest.approx(iv.hi) and r["n_seeds"] == 3
        assert r["gain_lo"] < r["gain_seed_mean"] < r["gain_hi"]


def test_a_policy_against_itself_gains_exactly_zero_with_zero_width(tmp_path):
    # fixed:07 is fixed:7 under another name: on paired draws every seed's frontier is identical, so every
    # per-seed gain is 0 and so is the interval's width. Unpaired seeds would give a nonzero spread.
    out = tmp_path / "self"
    assert main(["frontier", "--policies", "fixed:7,fixed:07", "--baseline", "fixed:7", "--concurrency-levels",
                 "1,8,32", "--seeds", "3", *FAST, "--out", str(out), "--sla", "200"]) == 0
    comp = _read(out, "comparison.csv")
    assert len(comp) == 3
    for c in ("gain_mean", "gain_seed_mean", "gain_lo", "gain_hi"):
        assert (comp[c] == 0.0).all(), comp[c]


def test_one_seed_output_is_unchanged(tmp_path, seeded):
    # --seeds 1 (the default) takes the single-seed code path: the same files and the same columns and values as
    # the frontier table built directly from the cells (the pre-seeds code path).
    out = tmp_path / "n1"
    assert main(["frontier", "--policies", "mtp1,fixed:7", "--concurrency-levels", "1,8,32", *FAST, "--seed", "6",
                 "--seeds", "1", "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["comparison.csv", "config.json", "frontier.csv", "frontier.png",
                                                     "verify_budget.png"]
    for f in ("frontier.csv", "comparison.csv"):
        assert (out / f).read_bytes() == (seeded / "s6" / f).read_bytes()
    assert "seeds" not in json.loads((out / "config.json").read_text())
    df = _read(out, "frontier.csv")
    assert not any(c.endswith(("_lo", "_hi")) for c in df.columns) and "n_seeds" not in df


def test_seed_means_and_plots_from_a_table():
    from dsparksim.config import RunConfig

    base = RunConfig.from_options({"duration_s": 3.0, "concurrency": 8})
    cfgs = cells(base, ["mtp1", "fixed:7"], [2, 8], seeds=[1, 2])
    assert [c.seed for c in cfgs[:4]] == [1, 2, 1, 2]
    per = frontier_table(run_cells(cfgs), cfgs, seeded=True)
    mean = seed_means(per)
    assert len(mean) == 4 and list(mean["policy"]) == ["mtp1", "mtp1", "fixed:7", "fixed:7"]
    comp = comparison_with_intervals(mean, per)
    assert {"gain_lo", "gain_hi", "gain_seed_mean", "n_seeds"} <= set(comp.columns)
    fig = frontier_figure(mean)
    ax = fig.axes[0]
    assert len(ax.containers) == 2  # one set of error bars per policy
    assert any("95% t-interval" in t.get_text() for t in ax.get_legend().get_texts())
    assert len(verify_budget_figure(mean).axes[0].containers) == 2
    assert len(frontier_figure(per[per["seed"] == 1].drop(columns="seed")).axes[0].containers) == 0


def test_a_seed_without_a_finished_request_empties_the_cell_and_is_named(tmp_path, capsys):
    out = tmp_path / "f"
    assert main(["frontier", "--policies", "mtp1,fixed:7", "--concurrency-levels", "1,2", "--duration", "1",
                 "--warmup", "0.5", "--backend", "serial", "--quiet", "--seeds", "3", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    per, mean = _read(out, "frontier_seeds.csv"), _read(out, "frontier.csv")
    empty = per[per["num_requests_completed"] == 0]
    assert len(empty) >= 1
    line = next(x for x in err.splitlines() if "finished no request" in x)
    for _, r in empty.iterrows():
        assert f"{r['policy']}@{r['load']:g} seed {r['seed']}" in line
        m = mean[(mean["policy"] == r["policy"]) & (mean["load"] == r["load"])].iloc[0]
        # no mean of the other seeds: that would condition on the seeds that happened to finish a request
        assert pd.isna(m["tps_user_median"]) and pd.isna(m["tps_user_median_lo"]) and not m["pareto"]


def test_gain_cell_keeps_the_narrow_overlap_mark_on_a_single_point_overlap():
    # found by a hostile test: frontiers touching at one value printed '-51%' with no '!' although
    # comparison.csv said narrow_overlap=True
    from dsparksim.cli.main import _gain_cell

    row = {"gain_mean": -0.51, "gain_min": -0.51, "gain_max": -0.51, "range_lo": 788.18, "range_hi": 788.18,
           "narrow_overlap": True, "note": "narrow overlap"}
    assert _gain_cell(row).endswith("at 788.2 !")
    sla = {**row, "narrow_overlap": False, "note": ""}   # an SLA target: one interpolated value, no mark
    assert _gain_cell(sla) == "-51%"


def test_a_metric_missing_in_one_seed_is_empty_while_step_metrics_average_every_seed():
    # a seed that finished no request has no per-request metrics: the cell's are empty (never an average of the
    # other seeds); throughput is step-based and defined in every seed, so it is the mean of all of them
    import math

    import pandas as pd

    from dsparksim.results.frontier_seeds import seed_means

    rows = [{"replicas": 1, "router": "round-robin", "policy": "none", "load": 64, "seed": s,
             "num_requests_completed": n, "output_throughput_tok_s": thr, "tps_user_median": tps,
             "saturated": False, "pareto": False, "kv_page_tokens": 16}
            for s, n, thr, tps in ((0, 10, 1800.0, 30.0), (1, 0, 1700.0, float("nan")), (2, 12, 1760.0, 31.0))]
    out = seed_means(pd.DataFrame(rows)).set_index("load")
    assert math.isnan(out.loc[64, "tps_user_median"]) and math.isnan(out.loc[64, "tps_user_median_hi"])
    assert out.loc[64, "output_throughput_tok_s"] == pytest.approx((1800.0 + 1700.0 + 1760.0) / 3)
    assert "kv_page_tokens_lo" not in out.columns     # a setting, not a metric
