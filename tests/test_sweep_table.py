"""`dsparksim sweep` prints a result table, as `frontier` does: one row per cell with its axis values and headline
metrics, saturated cells marked (issue 31 item 19)."""
from __future__ import annotations

import math

import pandas as pd

from dsparksim.cli.main import main
from dsparksim.sweep.table import sweep_text


def _table() -> pd.DataFrame:
    return pd.DataFrame({
        "cell": [0, 1, 2], "cfg.policy": ["mtp1", "confidence-async:2", "mtp1"], "cfg.concurrency": [1, 64, 512],
        "output_throughput_tok_s": [236.4, 12345.6, 14000.0], "tps_user_median": [236.8, 90.25, math.nan],
        "ttft_p99_s": [0.014, 0.5, 9.0], "tpot_median_s": [0.00427, 0.011, 0.03], "tau": [1.82, 4.7, 1.8],
        "saturated": [False, False, True]})


def test_one_row_per_cell_with_axes_and_metrics():
    lines = sweep_text(_table()).splitlines()
    assert lines[0].split()[:2] == ["policy", "concurrency"]
    rows = lines[1:4]
    assert [r.split()[:2] for r in rows] == [["mtp1", "1"], ["confidence-async:2", "64"], ["mtp1", "512"]]
    assert rows[1].split()[2:] == ["12,346", "90.2", "0.500", "11.00", "4.70"]
    assert rows[0].split()[5] == "4.27"                   # TPOT in ms


def test_saturated_cells_are_marked_and_missing_metrics_shown():
    text = sweep_text(_table())
    rows = text.splitlines()[1:4]
    assert rows[2].split()[2] == "14,000*" and "*" not in rows[0] + rows[1]
    assert rows[2].split()[3] == "-"                       # no finished request: shown as '-', never dropped
    assert text.splitlines()[-1].startswith("* saturated")
    unsat = _table().assign(saturated=False)
    assert "* saturated" not in sweep_text(unsat)


def test_columns_align():
    lines = sweep_text(_table()).splitlines()[:4]
    assert len({len(ln) for ln in lines}) == 1             # right-aligned metrics end together
    at = lines[0].index("concurrency")
    assert all(ln[at - 2:at] == "  " and ln[at] != " " for ln in lines)


def test_sweep_command_prints_the_table(tmp_path, capsys):
    spec = tmp_path / "s.toml"
    spec.write_text('[sweep]\nname = "t"\nsave_requests = false\n[base]\nprofile = "h100-llama2-7b-tp1"\n'
                    'duration_s = 2.0\n[axes]\npolicy = ["mtp1", "fixed:3"]\nconcurrency = [2]\n')
    assert main(["sweep", str(spec), "--out", str(tmp_path / "out"), "--backend", "serial"]) == 0
    out = capsys.readouterr().out.splitlines()
    i = next(i for i, ln in enumerate(out) if ln.split()[:2] == ["policy", "concurrency"])
    res = pd.read_csv(tmp_path / "out" / "results.csv")
    for j, (_, r) in enumerate(res.iterrows()):
        cells = out[i + 1 + j].split()
        assert cells[:2] == [r["cfg.policy"], str(r["cfg.concurrency"])]
        assert cells[2].rstrip("*") == f"{r['output_throughput_tok_s']:,.0f}"
