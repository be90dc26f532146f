"""Issue 31 item 16: `run` defaults to the paper's production policy, and a run that verifies almost nothing says so."""
from __future__ import annotations

import json

from dsparksim.cli.main import main
from dsparksim.config import RunConfig
from dsparksim.results.notes import low_verify_note


def test_run_without_policy_runs_confidence_async_2(tmp_path):
    out = tmp_path / "out"
    assert main(["run", "--concurrency", "4", "--duration", "4", "--quiet", "--out", str(out)]) == 0
    assert json.loads((out / "summary.json").read_text())["policy"] == "confidence-async:2"
    assert RunConfig().policy == "confidence-async:2"


def _summary(**kw):
    s = {"policy": "confidence", "block_size": 7, "mean_verify_len": 0.02, "tau": 1.02, "mean_running": 242.0}
    return {**s, **kw}


def test_low_verify_note_below_a_tenth_of_k_under_load():
    note = low_verify_note(_summary())
    assert note is not None and "0.02" in note and "K=7" in note and "10%" in note
    assert "verify" in note and "cost" in note            # says why: the verify cost outweighs the acceptance
    # boundary: exactly 10% of K is not below it; just under is
    assert low_verify_note(_summary(mean_verify_len=0.7)) is None
    assert low_verify_note(_summary(mean_verify_len=0.69)) is not None
    # not under load (one request running): no note; plain decoding (K=0) never gets one
    assert low_verify_note(_summary(mean_running=1.0)) is None
    assert low_verify_note(_summary(policy="none", block_size=0, mean_verify_len=0.0)) is None
    assert low_verify_note(_summary(mean_verify_len=None)) is None


def test_run_prints_the_note_on_a_collapsed_moe_run(tmp_path, capsys):
    # The README's disaggregated DeepSeek command with Algorithm 1: mean verify length ~0.04 of K=7 at ~240 running.
    out = tmp_path / "out"
    rc = main(["run", "--policy", "confidence", "--profile", "built-h200x8-deepseek-v3-tp8", "--disaggregated",
               "--kv-transfer-gbps", "400", "--prefill-replicas", "8", "--concurrency", "256", "--duration", "6",
               "--quiet", "--out", str(out)])
    assert rc == 0
    err = capsys.readouterr().err
    assert "dsparksim: note: mean verify length" in err and "below 10% of K=7" in err
    # the production default on the same deployment keeps verifying: no note
    out2 = tmp_path / "out2"
    assert main(["run", "--profile", "built-h200x8-deepseek-v3-tp8", "--disaggregated", "--kv-transfer-gbps", "400",
                 "--prefill-replicas", "8", "--concurrency", "256", "--duration", "6", "--quiet",
                 "--out", str(out2)]) == 0
    assert "mean verify length" not in capsys.readouterr().err
