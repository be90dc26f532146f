"""`dsparksim run` / `frontier` end to end: result files, golden summary, determinism, errors, comparisons."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dsparksim.cli.main import main
from dsparksim.results.frontier import comparison_table, pareto_mask

GOLDEN = Path(__file__).parent / "golden"
# The default run (paged KV, step-weighted acceptance); reserve is pinned by the legacy fingerprint test in
# test_cluster.py, which reproduces the pre-[engine] code bit for bit.
GOLDEN_ARGS = ["run", "--policy", "confidence-async:2", "--concurrency", "24", "--duration", "20", "--seed", "7",
               "--quiet"]


def _run(tmp_path: Path, *args: str) -> Path:
    out = tmp_path / "out"
    assert main([*args, "--out", str(out)]) == 0
    return out


def test_golden_run_reproduces_saved_summary(tmp_path):
    # Regenerate with: dsparksim run --policy confidence-async:2 --concurrency 24 --duration 20 --seed 7 \
    #                  --out tests/golden/run_confidence_async  (then keep summary.json only)
    out = _run(tmp_path, *GOLDEN_ARGS)
    got = json.loads((out / "summary.json").read_text())
    want = json.loads((GOLDEN / "run_confidence_async" / "summary.json").read_text())
    assert got == want


def test_golden_summary_holds_design_7_statistics_in_order():
    # DESIGN.md section 7: mean/median/p10/p90/p99 of each per-request metric. The golden (regenerated once when
    # tps_user p99, ttft/tpot/e2e p10/p90 and itl mean/p10/p90 were added: a diff of added lines only) holds them
    # all, and percentiles of one population cannot decrease with q.
    want = json.loads((GOLDEN / "run_confidence_async" / "summary.json").read_text())
    for m, u in (("tps_user", ""), ("ttft", "_s"), ("tpot", "_s"), ("itl", "_s"), ("e2e", "_s")):
        v = [want[f"{m}_{q}{u}"] for q in ("p10", "median", "p90", "p99")]
        assert all(isinstance(x, float) for x in v) and v == sorted(v), (m, v)
        assert isinstance(want[f"{m}_mean{u}"], float), m


def test_run_writes_every_result_file_with_required_fields(tmp_path):
    out = _run(tmp_path, "run", "--policy", "threshold:0.5", "--rate", "4", "--num-requests", "60", "--quiet")
    summ = json.loads((out / "summary.json").read_text())
    for k in ("policy", "sim_time_s", "num_requests_completed", "output_throughput_tok_s", "tps_user_mean",
              "tps_user_median", "tps_user_p10", "ttft_median_s", "tpot_median_s", "itl_median_s", "e2e_median_s",
              "mean_verify_len", "tau", "saturated"):
        assert k in summ, k
    assert summ["policy"] == "threshold:0.5"
    assert summ["num_requests_completed"] == 60 and summ["ended_by"] == "all_requests_done"
    assert 0 <= summ["mean_verify_len"] <= 7 and 1 <= summ["tau"] <= 8
    req = pd.read_csv(out / "requests.csv")
    assert len(req) == 60 and (req["emitted_tokens"] == req["output_tokens"]).all()
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["config"]["policy"] == "threshold:0.5" and cfg["config"]["traffic"]["rate"] == 4.0
    assert cfg["inputs"]["profile"]["name"] == "h100-llama2-7b-tp1"
    bench = json.loads((out / "bench_result.json").read_text())
    assert bench["completed"] == 60 and len(bench["ttfts"]) == 60
    assert bench["median_ttft_ms"] == pytest.approx(1000 * summ["ttft_median_s"], rel=1e-6)


def test_same_seed_same_result_and_different_seed_differs(tmp_path):
    a = _run(tmp_path / "a", "run", "--policy", "goodput", "--concurrency", "8", "--duration", "10", "--quiet")
    b = _run(tmp_path / "b", "run", "--policy", "goodput", "--concurrency", "8", "--duration", "10", "--quiet")
    c = _run(tmp_path / "c", "run", "--policy", "goodput", "--concurrency", "8", "--duration", "10", "--seed", "1",
             "--quiet")
    sa, sb, sc = (json.loads((d / "summary.json").read_text()) for d in (a, b, c))
    assert sa == sb
    assert sa["output_throughput_tok_s"] != sc["output_throughput_tok_s"]


def test_mtp1_runs_with_its_own_drafter_and_block_size(tmp_path):
    out = _run(tmp_path, "run", "--policy", "mtp1", "--concurrency", "4", "--duration", "10", "--quiet")
    s = json.loads((out / "summary.json").read_text())
    assert s["block_size"] == 1 and s["drafter"] == "mtp1" and s["mean_verify_len"] == 1.0
    # MTP-1 acceptance 0.87 -> tau = 1.87 (bonus included); sampling tolerance 0.05 over thousands of steps.
    assert s["tau"] == pytest.approx(1.87, abs=0.05)


@pytest.mark.parametrize("args, needle", [
    (["--policy", "fixed:0"], "fixed:0"),
    (["--policy", "nosuch"], "nosuch"),
    (["--profile", "no-such-profile"], "no-such-profile"),
    (["--acceptance", "tests/data/does_not_exist.csv"], "does_not_exist.csv"),
    (["--block-size", "0"], "--num-speculative-tokens"),   # the flag, not the dataclass field
    (["--kv-capacity", "100"], "kv_capacity_tokens"),
])
def test_bad_input_is_one_clear_error_line(tmp_path, capsys, args, needle):
    rc = main(["run", *args, "--concurrency", "2", "--duration", "5", "--quiet", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2 and needle in err and "Traceback" not in err
    assert not (tmp_path / "o" / "summary.json").exists()


def test_frontier_small_sweep(tmp_path):
    out = _run(tmp_path, "frontier", "--policies", "mtp1,fixed:7,confidence-async:2,oracle",
               "--concurrency-levels", "1,4,16", "--duration", "15", "--jobs", "1", "--quiet")
    df = pd.read_csv(out / "frontier.csv")
    assert len(df) == 12 and set(df["load"]) == {1, 4, 16}
    assert {"policy", "load", "output_throughput_tok_s", "tps_user_median", "pareto", "saturated"} <= set(df.columns)
    for _, g in df.groupby("policy"):
        # With more users the engine serves more in total and each user gets less (closed loop, no saturation).
        g = g.sort_values("load")
        assert np.all(np.diff(g["output_throughput_tok_s"]) > 0)
        assert np.all(np.diff(g["tps_user_median"]) < 0)
    comp = pd.read_csv(out / "comparison.csv")
    assert set(comp["policy"]) == {"fixed:7", "confidence-async:2", "oracle"}
    row = comp[(comp["policy"] == "oracle") & (comp["metric"] == "tps_user_gain_at_matched_throughput")].iloc[0]
    assert row["gain_mean"] > 0.3  # K=7 DSpark blocks vs MTP-1: per-user speed well above the baseline
    assert (out / "frontier.png").stat().st_size > 10_000 and (out / "verify_budget.png").stat().st_size > 5_000


def test_pareto_mask_hand_case():
    x = np.array([1.0, 2.0, 3.0, 2.0, 3.0])
    y = np.array([5.0, 4.0, 1.0, 3.0, 1.0])
    # (2,3) is dominated by (2,4); the duplicate (3,1) points do not dominate each other.
    assert pareto_mask(x, y).tolist() == [True, True, True, False, True]
    assert pareto_mask(x, y, eligible=np.array([1, 0, 1, 1, 1], bool)).tolist() == [True, False, True, True, True]


def test_comparison_interpolates_on_overlap():
    # Baseline frontier y = 100 - x/10 on x in [0, 500]; policy A is exactly 1.5x the baseline's per-user speed
    # on x in [100, 800]; the matched-throughput gain must be 0.5 everywhere on the overlap [100, 500].
    xb = np.array([0.0, 250.0, 500.0])
    xa = np.array([100.0, 500.0, 800.0])
    rows = [{"policy": "b", "load": i, "output_throughput_tok_s": x, "tps_user_median": 100 - x / 10, "pareto": True}
            for i, x in enumerate(xb)]
    rows += [{"policy": "a", "load": i, "output_throughput_tok_s": x, "tps_user_median": 1.5 * (100 - x / 10),
              "pareto": True} for i, x in enumerate(xa)]
    comp = comparison_table(pd.DataFrame(rows), baseline="b", slos=[60.0])
    r = comp[comp["metric"] == "tps_user_gain_at_matched_throughput"].iloc[0]
    assert (r["range_lo"], r["range_hi"]) == (100.0, 500.0)
    assert r["gain_min"] == pytest.approx(0.5) and r["gain_max"] == pytest.approx(0.5)
    # At per-user speed 60: baseline x = 400, A: 1.5*(100 - x/10) = 60 -> x = 600; gain 0.5.
    s = comp[comp["metric"] == "throughput_gain_at_slo:60"].iloc[0]
    assert s["gain_mean"] == pytest.approx(0.5)
