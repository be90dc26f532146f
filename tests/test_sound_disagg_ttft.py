"""Issue 31 item 1: a disaggregated request's TTFT includes the wait for room on the decode engine and the
decode engine's first step (which computes the last prompt token and samples the first token, as vLLM's P/D)."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from dsparksim.cli.main import main
from dsparksim.results.metrics import per_request_table, summarize

from test_engine import FlatProfile
from test_kv_paged import _sim, _wl

PARTS = ("queue", "prefill", "transfer", "decode_wait", "first_step")


def test_ttft_waits_for_decode_side_kv_room_step_by_step():
    # Flat steps of c = 10 ms, one prefill instance each (2), prefill c, transfer 6 x 1e5 B x 8 / 8 Gbit/s.
    # Decode engine: 10 one-token pages, no watermark, K = 1, every draft accepted. A (arrives 0) and B (arrives
    # 1 ms) have prompt 6 and output 3; their KV lands at T and T + 1 ms. A is admitted at T (6 pages) and its first
    # step computes its last prompt token: first token at T + c. At T + c A grows to 6 + 1 + K = 8 pages: B (6
    # pages) does not fit in the 2 left and waits. A's decode step emits its last 2 tokens (finish T + 2c); B is
    # admitted then and its first token comes at T + 3c: TTFT_B = q + prefill + transfer + (2c - 1 ms) + c.
    c = 0.01
    prof = FlatProfile(c)
    prof.metadata.update({"kv_bytes_per_token": 1.0e5})
    res = _sim(_wl([6, 6], [3, 3], arrivals=[0.0, 0.001]), K=1, kv=10, page=1, watermark=0.0, alpha=1.0,
               profile=prof, disaggregated=True, prefill_replicas=2, kv_transfer_gbps=8.0).run()
    tx = 6 * 1.0e5 * 8 / 8e9
    T = c + tx
    assert res.completed.all() and res.emitted_tokens.tolist() == [3, 3]
    np.testing.assert_allclose(res.admitted_s, [T, T + 2 * c], rtol=1e-12)
    np.testing.assert_allclose(res.first_token_s, [T + c, T + 3 * c], rtol=1e-12)
    np.testing.assert_allclose(res.finish_s, [T + 2 * c, T + 4 * c], rtol=1e-12)
    np.testing.assert_allclose(res.ttft_decode_wait_s, [0.0, 2 * c - 0.001], rtol=1e-9, atol=1e-15)
    np.testing.assert_allclose(res.ttft_first_step_s, [c, c], rtol=1e-9)
    req = per_request_table(res)
    np.testing.assert_allclose(req["ttft_s"], sum(req[f"ttft_{p}_s"] for p in PARTS), rtol=1e-12)
    # the first step carries one prompt token per new request (its last), and emits the first token
    np.testing.assert_array_equal(res.steps["n_prefill_tokens"], [1, 0, 1, 0])
    np.testing.assert_array_equal(res.steps["emitted"], [1, 2, 1, 2])
    s = summarize(res, policy="fixed:1", load=None, warmup_s=0.0, closed_loop=False)
    assert s["ttft_decode_wait_median_s"] == pytest.approx((2 * c - 0.001) / 2, rel=1e-9)
    assert s["ttft_first_step_mean_s"] == pytest.approx(c, rel=1e-9)


def test_ttft_is_never_before_admission_and_parts_sum_to_it():
    # KV-bound decode engine, open loop: many requests wait for room; each TTFT still splits into its parts
    rng = np.random.default_rng(2)
    n = 40
    prompts, outs = rng.integers(20, 120, n), rng.integers(20, 80, n)
    prof = FlatProfile(0.01, per_token=1e-5)
    prof.metadata.update({"kv_bytes_per_token": 1.0e4})
    res = _sim(_wl(prompts, outs, arrivals=np.sort(rng.uniform(0, 0.3, n))), K=2, kv=600, page=4, profile=prof,
               max_seqs=16, chunk=64, max_tokens=256, disaggregated=True, prefill_replicas=4,
               kv_transfer_gbps=100.0).run()
    assert res.completed.all()
    assert (res.first_token_s > res.admitted_s).all()
    assert res.ttft_decode_wait_s.max() > 0.1           # the KV binds: some requests wait long for room
    ttft = res.first_token_s - res.arrival_s
    parts = (res.ttft_queue_s + res.ttft_prefill_s + res.ttft_transfer_s + res.ttft_decode_wait_s
             + res.ttft_first_step_s)
    np.testing.assert_allclose(ttft, parts, rtol=1e-9)
    assert (res.ttft_decode_wait_s >= 0).all() and (res.ttft_first_step_s > 0).all()


def test_cli_disaggregated_run_reports_decode_wait(tmp_path):
    out = tmp_path / "d"
    assert main(["run", "--policy", "fixed:3", "--rate", "4", "--num-requests", "30", "--disaggregated",
                 "--prefill-replicas", "2", "--kv-transfer-gbps", "400", "--kv-bytes-per-token", "524288",
                 "--quiet", "--out", str(out)]) == 0
    s = json.loads((out / "summary.json").read_text())
    req = pd.read_csv(out / "requests.csv")
    for p in PARTS:
        assert f"ttft_{p}_s" in req and s[f"ttft_{p}_median_s"] == pytest.approx(
            float(np.median(req[f"ttft_{p}_s"])), rel=1e-6)
    np.testing.assert_allclose(req["ttft_s"], sum(req[f"ttft_{p}_s"] for p in PARTS), rtol=1e-6)
    assert (req["first_token_s"] > req["admitted_s"]).all()
