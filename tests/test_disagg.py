"""Decode-only engines behind a prefill pool (--disaggregated): TTFT parts against closed forms, files, errors."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from dsparksim.cli.main import main
from dsparksim.sim.disagg import PrefillPool
from dsparksim.errors import ConfigError
from dsparksim.cost.profile import profile_from_dict

from test_engine import FlatProfile
from test_kv_paged import _sim, _wl

META = {"device": "d", "model": "m", "source": "test", "method": "test"}


def _profile(**extra):
    d = {"format": "dsparksim-profile/1", "name": "t", "metadata": dict(META),
         "verify": {"M": [1, 1000, 4096], "time_s": [0.01, 0.02, 0.05]},
         "attention": {"model": "kv_bandwidth", "seconds_per_kv_token": 1e-8},
         "prefill": {"seconds_per_token": 2e-6, "seconds_per_query_key": 3e-10, "seconds_per_chunk": 1e-4},
         "fixed_overhead_s": 0.002,
         "drafters": {"dspark": {"kind": "parallel", "tokens": [1, 10000], "time_s": [0.001, 0.002],
                                 "prefill_s_per_token": 1e-7}}}
    d.update(extra)
    return profile_from_dict(d)


def test_prefill_time_is_the_chunked_closed_form():
    # 5000 tokens in chunks of 2048: (2048 after 0), (2048 after 2048), (904 after 4096); each chunk a prefill-only
    # step: verify staircase at c (floor) + kv term over s + c + fixed + per-token + query-key + per-chunk terms
    # + the drafter's per-token prompt update
    prof = _profile()
    pool = PrefillPool(profile=prof, drafter="dspark", K=7, replicas=1, chunk_tokens=2048, gbps=100.0,
                       bytes_per_token=1000.0)
    want = 0.0
    for s, c in ((0, 2048), (2048, 2048), (4096, 904)):
        stair = 0.02 if c >= 1000 else 0.01
        qk = c * s + c * (c + 1) // 2
        want += stair + 1e-8 * (s + c) + 0.002 + 2e-6 * c + 3e-10 * qk + 1e-4 + 1e-7 * c
    assert pool.prefill_s(5000) == pytest.approx(want, rel=1e-12)
    assert pool.transfer_s(5000) == pytest.approx(5000 * 1000.0 * 8 / 100e9, rel=1e-12)


def test_ttft_parts_fifo_pool_closed_form():
    # FlatProfile: a prefill of P tokens costs c + per_token * P (one chunk, no fixed overhead, no prefill term).
    # Three requests arrive at t=0, 0, 0.001 with 2 prefill instances: the first two start at once, the third
    # waits for the first free instance. Transfer: P * bytes * 8 / (gbps * 1e9).
    c, per = 0.01, 1e-5
    prof = FlatProfile(c, per_token=per)
    prof.metadata.update({"kv_bytes_per_token": 2.0e5})
    P = np.array([100, 300, 50])
    sim = _sim(_wl(P, [5, 5, 1], arrivals=[0.0, 0.0, 0.001]), K=2, profile=prof, disaggregated=True,
               prefill_replicas=2, kv_transfer_gbps=8.0)
    res = sim.run()
    pf = c + per * P
    q = np.array([0.0, 0.0, pf[0] - 0.001])
    tx = P * 2.0e5 * 8 / 8e9
    np.testing.assert_allclose(res.ttft_queue_s, q, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(res.ttft_prefill_s, pf, rtol=1e-12)
    np.testing.assert_allclose(res.ttft_transfer_s, tx, rtol=1e-12)
    # TTFT adds the wait for the decode engine (its step in flight; KV room is ample here) and its first step
    np.testing.assert_allclose(res.first_token_s - res.arrival_s,
                               q + pf + tx + res.ttft_decode_wait_s + res.ttft_first_step_s, rtol=1e-9)
    np.testing.assert_allclose(res.admitted_s - res.arrival_s, q + pf + tx + res.ttft_decode_wait_s, rtol=1e-9)
    assert (res.ttft_first_step_s >= c).all()
    # decode-only: a step holds one prompt token per newly admitted request (its last, which samples the first
    # token); every token (first ones included) is emitted once
    assert res.steps["n_prefill_tokens"].sum() == 3
    assert int(res.steps["emitted"].sum()) == 11 and res.completed.all()
    np.testing.assert_array_equal(res.emitted_tokens, [5, 5, 1])
    assert (res.first_token_s > res.admitted_s).all()


def test_cli_disaggregated_run_reports_the_parts(tmp_path):
    out = tmp_path / "d"
    assert main(["run", "--policy", "fixed:3", "--rate", "4", "--num-requests", "40", "--disaggregated",
                 "--prefill-replicas", "2", "--kv-transfer-gbps", "400", "--kv-bytes-per-token", "524288",
                 "--quiet", "--out", str(out)]) == 0
    s = json.loads((out / "summary.json").read_text())
    req = pd.read_csv(out / "requests.csv")
    assert s["disaggregated"] is True and s["num_requests_completed"] == 40
    parts = ("queue", "prefill", "transfer", "decode_wait", "first_step")
    for part in parts:
        assert s[f"ttft_{part}_median_s"] == pytest.approx(float(np.median(req[f"ttft_{part}_s"])), rel=1e-6)
    np.testing.assert_allclose(req["ttft_s"], sum(req[f"ttft_{p}_s"] for p in parts), rtol=1e-6)
    np.testing.assert_allclose(req["ttft_transfer_s"], req["prompt_tokens"] * 524288 * 8 / 400e9, rtol=1e-6)
    assert (req["emitted_tokens"] == req["output_tokens"]).all()
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["config"]["engine"]["disaggregated"] is True and "decode-only" in cfg["inputs"]["engine"][
        "disaggregated"]


@pytest.mark.parametrize("extra,field", [
    ([], "kv_transfer_gbps"),                                       # no link bandwidth
    (["--kv-transfer-gbps", "100"], "metadata.kv_bytes_per_token"),  # shipped 7B profile has no KV bytes
])
def test_disaggregated_refuses_without_the_link_figures(tmp_path, capsys, extra, field):
    rc = main(["run", "--concurrency", "2", "--duration", "1", "--disaggregated", *extra, "--quiet",
               "--out", str(tmp_path / "o")])
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and field in err


def test_pool_flags_without_disaggregated_are_an_error(tmp_path, capsys):
    assert main(["run", "--concurrency", "2", "--duration", "1", "--prefill-replicas", "3", "--quiet",
                 "--out", str(tmp_path / "o")]) == 2
    assert "--disaggregated" in capsys.readouterr().err


def test_profile_kv_bytes_per_token_is_checked():
    prof = FlatProfile()
    prof.metadata.update({"kv_bytes_per_token": -1})
    with pytest.raises(ConfigError, match="kv_bytes_per_token"):
        _sim(_wl([4], [4], arrivals=[0.0]), profile=prof, disaggregated=True, kv_transfer_gbps=1.0)


def test_sweep_refuses_a_disaggregated_cell_without_transfer_terms_before_any_cell_runs(tmp_path, monkeypatch,
                                                                                      capsys):
    # found by a hostile test: the sweep ran the other cells, then failed the disaggregated one at run time
    import dsparksim.sweep.backends as backends
    from dsparksim.cli.main import main

    def boom(*a, **k):
        raise AssertionError("a cell ran for a bad spec")
    monkeypatch.setattr(backends, "execute_cell", boom)
    spec = tmp_path / "s.toml"
    spec.write_text('[sweep]\nname = "x"\n[base]\nconcurrency = 4\nduration_s = 3.0\n'
                    '[axes]\ndisaggregated = [false, true]\n')
    assert main(["sweep", str(spec), "--out", str(tmp_path / "o"), "--backend", "serial"]) == 2
    err = capsys.readouterr().err
    assert "disaggregated=True" in err and "kv_transfer_gbps" in err
    # with the link but a profile without kv_bytes_per_token: also refused up front, naming the field
    spec.write_text('[sweep]\nname = "x"\n[base]\nconcurrency = 4\nduration_s = 3.0\nkv_transfer_gbps = 400.0\n'
                    'disaggregated = true\n[axes]\npolicy = ["mtp1"]\n')
    assert main(["sweep", str(spec), "--out", str(tmp_path / "o2"), "--backend", "serial"]) == 2
    assert "kv_bytes_per_token" in capsys.readouterr().err


def test_closed_loop_saturation_counts_the_prefill_pool_queue(tmp_path):
    # found by a hostile test: 256 users queued ~10 s at one prefill instance while the decode engine never had a
    # waiting request, so the point read as unsaturated (and could be Pareto)
    import json

    from dsparksim.cli.main import main

    def sat(n_pool):
        out = tmp_path / f"o{n_pool}"
        assert main(["run", "--profile", "built-h200x8-deepseek-v3-tp8", "--disaggregated", "--kv-transfer-gbps",
                     "400", "--prefill-replicas", str(n_pool), "--concurrency", "128", "--duration", "12",
                     "--quiet", "--out", str(out)]) == 0
        return json.loads((out / "summary.json").read_text())

    s = sat(1)
    assert s["ttft_queue_median_s"] > 1.0
    assert s["saturated"] is True and s["saturation_detail"]["frac_steps_with_prefill_pool_waiting"] > 0.5
    s = sat(16)   # enough prefill instances: nobody waits anywhere
    assert s["saturated"] is False and s["saturation_detail"]["frac_steps_with_prefill_pool_waiting"] < 0.5
