"""Issue 31 item 17: SLO everywhere -- output names, one --slo syntax (METRIC>=X) in frontier and capacity, the old
spellings kept as deprecated aliases."""
from __future__ import annotations

import pandas as pd
import pytest

from dsparksim.cli.main import build_parser, main
from dsparksim.results.frontier import comparison_table
from dsparksim.results.plots import frontier_figure


def _df():
    rows = []
    for pol, k in (("b", 1.0), ("a", 1.2)):
        for i, x in enumerate((100.0, 200.0, 300.0, 400.0)):
            rows.append({"policy": pol, "load": i + 1, "output_throughput_tok_s": x * k,
                         "tps_user_median": 120.0 - 20 * i, "saturated": False, "pareto": True})
    return pd.DataFrame(rows)


def test_comparison_names_say_slo_not_sla():
    comp = comparison_table(_df(), baseline="b", slos=[70.0])
    metrics = set(comp["metric"])
    assert {"throughput_gain_at_matched_slo", "throughput_gain_at_slo:70"} <= metrics
    assert not any("sla" in m for m in metrics)
    # the old keyword still works (deprecated), with the same rows
    with pytest.warns(DeprecationWarning):
        old = comparison_table(_df(), baseline="b", slas=[70.0])
    assert list(old["metric"]) == list(comp["metric"])


def test_frontier_plot_labels_slo():
    import matplotlib.pyplot as plt
    fig = frontier_figure(_df(), slos=[70.0], load_name="users")
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    gids = [ln.get_gid() for ax in fig.axes for ln in ax.get_lines()]
    assert "SLO 70 tok/s/user" in texts and "slo:70" in gids
    assert not any("SLA" in t for t in texts)
    plt.close(fig)


def _help(cmd: str) -> str:
    p = build_parser()
    sub = next(a for a in p._actions if a.dest == "command").choices[cmd]
    return sub.format_help()


def test_help_says_slo_everywhere():
    for cmd in ("frontier", "capacity"):
        h = _help(cmd)
        assert "SLA" not in h and "--slo SLO" in h, cmd


def test_plan_and_capacity_help_name_every_slo_operator():
    """Their help once said `OP >= or <=` (plan) and `METRIC>=X or METRIC<=Y` (capacity), while the SLO parser
    also takes > and <: the help names every operator the parser accepts, and each one parses."""
    from dsparksim.sweep.capacity import SLO_RE, parse_slo
    ops = [">=", "<=", ">", "<"]
    assert all(SLO_RE.match(f"tps_user_p50 {op} 1") for op in ops)
    assert len(parse_slo([f"tps_user_p50 {op} 1" for op in ops])) == 4
    for cmd in ("plan", "capacity"):
        h = " ".join(_help(cmd).split())
        assert "OP >=, <=, > or <" in h, cmd


FRONTIER = ["frontier", "--policies", "mtp1,fixed:7", "--concurrency-levels", "1,4", "--duration", "3",
            "--workers", "1", "--quiet"]


def test_frontier_slo_takes_the_capacity_syntax(tmp_path, capsys):
    out = tmp_path / "a"
    assert main([*FRONTIER, "--slo", "tps_user_median>=100,tps_user_p50>=150", "--out", str(out)]) == 0
    comp = pd.read_csv(out / "comparison.csv")
    assert {"throughput_gain_at_slo:100", "throughput_gain_at_slo:150"} <= set(comp["metric"])
    assert "warning" not in capsys.readouterr().err


@pytest.mark.parametrize("args,warn", [(["--slo", "100"], "--slo 100"), (["--sla", "tps_user_median>=100"], "--sla")])
def test_old_spellings_still_work_with_a_deprecation_warning(tmp_path, capsys, args, warn):
    out = tmp_path / "b"
    assert main([*FRONTIER, *args, "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "dsparksim: warning:" in err and "deprecated" in err and warn in err
    assert "throughput_gain_at_slo:100" in set(pd.read_csv(out / "comparison.csv")["metric"])


def test_frontier_refuses_an_slo_it_cannot_read(tmp_path, capsys):
    rc = main([*FRONTIER, "--slo", "ttft_p99_s<=2", "--out", str(tmp_path / "c")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("dsparksim: error:")
    assert "--slo" in err[0] and "tps_user_median" in err[0]
