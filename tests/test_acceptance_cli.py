"""``dsparksim trace inspect`` on trace files and parametric specs."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest

from dsparksim.cli import trace as cli_trace
from dsparksim.acceptance import load_acceptance
from dsparksim.acceptance.trace_format import read_trace

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "traces" / "sample_dspark_k7.csv"


def run(argv, capsys):
    parser = argparse.ArgumentParser(prog="dsparksim")
    cli_trace.register(parser.add_subparsers(dest="cmd"))
    args = parser.parse_args(argv)
    rc = args.func(args)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_inspect_trace_json_matches_direct_computation(capsys):
    rc, out, _ = run(["trace", "inspect", str(SAMPLE), "--json"], capsys)
    assert rc == 0
    s = json.loads(out)
    tr = read_trace(SAMPLE)
    assert s["metadata"]["drafter"] == "dspark" and s["K"] == 7
    for d in ("math", "code", "chat"):
        sel = tr.domain == d
        v = s["domains"][d]
        assert v["blocks"] == int(sel.sum()) and v["requests"] == len(set(tr.request_id[sel]))
        assert v["tau_all_verified"] == pytest.approx(1 + tr.accepted[sel].mean())
        lo, hi = v["tau_ci95"]
        assert lo < v["tau_all_verified"] < hi
        A = tr.accepted[sel]
        for p in v["positions"]:
            k = p["k"]
            assert p["conditional"] == pytest.approx((A >= k).sum() / (A >= k - 1).sum())
            assert 0 <= p["ci95"][0] <= p["conditional"] <= p["ci95"][1] <= 1
            assert p["mean_conf_at_risk"] == pytest.approx(tr.conf[sel][A >= k - 1, k - 1].mean())
        assert 0 <= v["ece"] < 0.2 and set(v["auc_by_position"]) == {str(k) for k in range(1, 8)}
    assert s["domains"]["all"]["blocks"] == tr.n_blocks


def test_inspect_trace_text_and_truncation(capsys):
    rc, out, _ = run(["trace", "inspect", str(SAMPLE), "--K", "4"], capsys)
    assert rc == 0 and "K=4" in out and "cond.acc" in out and "ECE" in out
    assert "[chat] per position" in out
    rc, _, err = run(["trace", "inspect", str(SAMPLE), "--K", "9"], capsys)
    assert rc == 2 and "K mismatch" in err and "sample_dspark_k7.csv" in err


def test_inspect_parametric_spec_simulates(capsys):
    rc, out, _ = run(["trace", "inspect", "dflash", "--blocks", "4000", "--json", "--seed", "1"], capsys)
    assert rc == 0
    s = json.loads(out)
    assert s["kind"] == "simulated" and s["metadata"]["drafter"] == "dflash"
    model = load_acceptance("dflash", 7)
    for d in ("math", "code", "chat"):
        v = s["domains"][d]
        # 4000 blocks in 200 requests of 20: compare with the exact tau within 4 cluster-robust SE
        se = (v["tau_ci95"][1] - v["tau_ci95"][0]) / (2 * 1.96)
        assert abs(v["tau_all_verified"] - model.expected_tau(d)) < 4 * se
    rc, out, _ = run(["trace", "inspect", "mtp1", "--blocks", "2000", "--json"], capsys)
    s = json.loads(out)
    assert s["K"] == 1 and abs(s["domains"]["math"]["positions"][0]["conditional"] - 0.87) < 0.03


def test_inspect_mtp_reports_no_confidence_statistics(capsys):
    # an MTP module has no confidence head: the blocks carry the parametric model's confidences, which no policy
    # may read, so inspect reports none of ECE / AUC / mean confidence (json null, text '-'), while dspark does
    rc, out, _ = run(["trace", "inspect", "mtp", "--K", "2", "--blocks", "400", "--json"], capsys)
    s = json.loads(out)
    assert rc == 0 and s["confidence_head"] is False
    for v in s["domains"].values():
        assert v["ece"] is None and v["mean_auc"] is None and set(v["auc_by_position"].values()) == {None}
        assert all(p[f] is None for p in v["positions"]
                   for f in ("mean_conf_at_risk", "mean_conf", "ece_survival", "auc_survival"))
        assert 0 < v["positions"][0]["conditional"] < 1
    rc, out, _ = run(["trace", "inspect", "mtp", "--K", "2", "--blocks", "400"], capsys)
    assert rc == 0 and "no confidence head" in out
    rc, out, _ = run(["trace", "inspect", "dspark", "--K", "2", "--blocks", "400", "--json"], capsys)
    s = json.loads(out)
    assert s["confidence_head"] is True and 0 <= s["domains"]["math"]["ece"] < 0.2


def test_inspect_bad_inputs_exit_2(capsys, tmp_path):
    rc, _, err = run(["trace", "inspect", str(tmp_path / "nope.csv")], capsys)
    assert rc == 2 and "nope.csv" in err and "not found" in err
    rc, _, err = run(["trace", "inspect", "medusa"], capsys)
    assert rc == 2 and "'medusa'" in err


def test_inspect_refuses_more_simulated_blocks_than_it_can_hold(capsys):
    """--blocks 10**12 (or a huge --blocks-per-request, rounded up to whole requests) was a MemoryError traceback."""
    for extra in (["--blocks", str(10**12)], ["--blocks", "10", "--blocks-per-request", str(10**12)]):
        rc, _, err = run(["trace", "inspect", "dspark", *extra], capsys)
        assert rc == 2 and "--blocks" in err and "1,000,000" in err and len(err.strip().splitlines()) == 1, err
