"""Requests rejected on arrival are said out loud by `run` and `frontier` (hostile-tester finding 2026-12-03: more
requests were rejected than served and both commands printed normal summaries)."""
from __future__ import annotations

import json

import pandas as pd

from dsparksim.cli.main import main


def _lengths(tmp_path, big_every: int):
    p = tmp_path / "lengths.csv"
    rows = [(200000 if i % big_every == 0 else 500, 200) for i in range(100)]
    pd.DataFrame(rows, columns=["num_prefill_tokens", "num_decode_tokens"]).to_csv(p, index=False)
    return p


def test_run_warns_with_the_count_share_and_reason(tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["run", "--lengths", str(_lengths(tmp_path, 2)), "--duration", "5", "--concurrency", "4", "--quiet",
                 "--out", str(out)]) == 0
    s = json.loads((out / "summary.json").read_text())
    n, issued = s["num_requests_rejected"], s["num_requests_issued"]
    assert n > 0
    err = capsys.readouterr().err
    assert f"warning: {n} of {issued} issued requests ({100 * n / issued:.0f}%) were rejected on arrival" in err
    assert f"kv_capacity: {s['rejected_by_reason']['kv_capacity']}" in err


def test_run_without_rejections_says_nothing(tmp_path, capsys):
    p = tmp_path / "ok.csv"
    pd.DataFrame([(500, 200)] * 20, columns=["num_prefill_tokens", "num_decode_tokens"]).to_csv(p, index=False)
    assert main(["run", "--lengths", str(p), "--duration", "3", "--concurrency", "2", "--quiet",
                 "--out", str(tmp_path / "r")]) == 0
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["num_requests_rejected"] == 0
    assert "rejected" not in capsys.readouterr().err


def test_frontier_names_every_cell_with_rejections(tmp_path, capsys):
    out = tmp_path / "f"
    assert main(["frontier", "--policies", "mtp1,fixed:3", "--concurrency-levels", "1,4", "--lengths",
                 str(_lengths(tmp_path, 2)), "--duration", "5", "--workers", "1", "--quiet", "--out", str(out)]) == 0
    df = pd.read_csv(out / "frontier.csv")
    err = capsys.readouterr().err
    bad = df[df["num_requests_rejected"] > 0]
    assert len(bad) == 4 and f"in {len(bad)} cell(s)" in err
    for _, r in bad.iterrows():
        assert f"{r['policy']}@{r['load']:g}: {int(r['num_requests_rejected'])} rejected" in err
