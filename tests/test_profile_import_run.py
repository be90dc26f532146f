"""``dsparksim profile import`` writes a profile ``dsparksim run --profile`` accepts as is; its options and paths."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from dsparksim.cli.main import main
from dsparksim.cost.profile import load_profile

DATA = Path(__file__).resolve().parent / "data"
TABLES = [("vllm", "profile_vllm_sps.json"), ("sglang", "profile_sglang_additive.json"),
          ("trt", "profile_trt_sps_table.json")]
LENGTHS = str(DATA / "traffic_lengths_domain.csv")   # prompts of 10..40 tokens: a run of a few steps
RUNNABLE = ["--kv-capacity-tokens", "20000", "--max-model-len", "4096",
            "--drafter-cost", "dspark=0.001", "--drafter-cost", "mtp1=0.0005"]


def _import(fmt: str, fname: str, out: Path, *extra: str) -> int:
    return main(["profile", "import", "--format", fmt, str(DATA / fname), "--out", str(out), *extra])


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err and err.startswith("dsparksim: error:"), err
    return err


@pytest.mark.parametrize("fmt,fname", TABLES)
def test_imported_profile_runs_as_is(tmp_path, capsys, fmt, fname):
    out = tmp_path / "not" / "yet" / f"{fmt}.json"          # a missing directory is created
    assert _import(fmt, fname, out, *RUNNABLE) == 0
    assert f"ready: dsparksim run --profile {out}" in capsys.readouterr().out
    p = load_profile(out)
    assert p.metadata["kv_capacity_tokens"] == 20000 and p.metadata["max_model_len"] == 4096
    assert p.min_tokens == 1                                 # small batches priced (engine clamp below the probes)
    for policy in ("confidence", "mtp1"):
        run = tmp_path / f"run-{policy}"
        assert main(["run", "--profile", str(out), "--policy", policy, "--concurrency", "4", "--num-requests", "12",
                     "--lengths", LENGTHS, "--quiet", "--out", str(run)]) == 0
        summary = json.loads((run / "summary.json").read_text())
        assert summary["num_requests_completed"] == 12
        engine = json.loads((run / "config.json").read_text())["inputs"]["engine"]
        assert engine["kv_capacity_tokens"] == 20000 and engine["max_batched_tokens"] == p.max_tokens


def test_sps_table_max_batch_tokens_is_the_run_budget(tmp_path, capsys):
    # profile_vllm_sps.json: probes 8..64, max_batch_tokens 128. The engine prices 65..128 at the last probe's SPS,
    # so the imported profile does too (recorded as not measured) and a run's default budget is 128 tokens.
    out = tmp_path / "v.json"
    assert _import("vllm", "profile_vllm_sps.json", out, *RUNNABLE) == 0
    assert "the range 64..128 was NOT measured" in capsys.readouterr().out
    p = load_profile(out)
    assert p.max_tokens == 128 and p.verify_time(128) == p.verify_time(64) == pytest.approx(1 / 40.0)
    assert p.verify_time(1) == pytest.approx(1 / 100.0)
    run = tmp_path / "run"
    assert main(["run", "--profile", str(out), "--concurrency", "16", "--num-requests", "32", "--lengths", LENGTHS,
                 "--quiet", "--out", str(run)]) == 0
    assert json.loads((run / "config.json").read_text())["inputs"]["engine"]["max_batched_tokens"] == 128
    # without the clamp the profile keeps the measured range only, and says what that means for runs
    out2 = tmp_path / "v2.json"
    assert _import("vllm", "profile_vllm_sps.json", out2, *RUNNABLE, "--no-engine-clamp") == 0
    text = capsys.readouterr().out
    assert "max_batch_tokens 128 is above the last probe 64" in text
    assert "not runnable as is" in text and "costs below M=8" in text
    assert load_profile(out2).max_tokens == 64


def test_batch_axis_clamped_up_to_the_verify_range(tmp_path, capsys):
    # trt batch_sizes 1..32: a run of 48 users (48 x 2 tokens fits the 256-token budget at K=1) needs alpha(48),
    # which the engine clamps to alpha(32) = 0.9 ms.
    out = tmp_path / "t.json"
    assert _import("trt", "profile_trt_sps_table.json", out, *RUNNABLE) == 0
    p = load_profile(out)
    assert p.batch_overhead_time(256) == p.batch_overhead_time(48) == pytest.approx(0.0009)
    lengths = tmp_path / "long_outputs.csv"   # 48 users decoding 50 tokens each: 48 requests in one decode step
    lengths.write_text("num_prefill_tokens,num_decode_tokens\n8,50\n")
    run = tmp_path / "run"
    assert main(["run", "--profile", str(out), "--policy", "mtp1", "--concurrency", "48", "--num-requests", "48",
                 "--lengths", str(lengths), "--quiet", "--save-steps", "--out", str(run)]) == 0
    with open(run / "steps.csv") as fh:
        assert max(int(r["n_decode"]) for r in csv.DictReader(fh)) == 48


def test_drafter_costs_are_flat_and_recorded(tmp_path, capsys):
    out = tmp_path / "d.json"
    assert _import("trt", "profile_trt_sps_table.json", out, "--kv-capacity-tokens", "5000",
                   "--drafter-cost", "dspark=0.002", "--drafter-cost", "eagle3=0.0005",
                   "--drafter-cost", "mtp1=0", "--drafter-cost", "mine:parallel=0.003") == 0
    p = load_profile(out)
    assert {k: d.kind for k, d in p.drafters.items()} == {"dspark": "parallel", "eagle3": "autoregressive",
                                                          "mtp1": "mtp", "mine": "parallel"}
    n = np.array([1, 8, 32])
    np.testing.assert_allclose(p.draft_time("dspark", n, 7), 0.002)        # one parallel forward, any batch
    np.testing.assert_allclose(p.draft_time("eagle3", n, 7), 7 * 0.0005)   # K sequential forwards
    np.testing.assert_allclose(p.draft_time("mtp1", n, 1), 0.0)            # drafting folded into the step
    md = p.metadata["drafter_costs"]
    assert md["drafters"]["dspark"] == {"kind": "parallel", "seconds_per_forward": 0.002}
    assert "not measured" in md["note"]
    assert not any(m.startswith("drafter costs") for m in p.metadata["missing"])


def test_without_kv_capacity_import_says_what_run_needs(tmp_path, capsys):
    out = tmp_path / "k.json"
    assert _import("trt", "profile_trt_sps_table.json", out) == 0
    text = capsys.readouterr().out
    assert "not runnable as is" in text and "--kv-capacity-tokens" in text and "--drafter-cost dspark" in text
    assert main(["run", "--profile", str(out), "--concurrency", "2", "--num-requests", "4", "--lengths", LENGTHS,
                 "--quiet", "--out", str(tmp_path / "run")]) == 2
    assert "kv" in _one_line_error(capsys).lower()


@pytest.mark.parametrize("bad,needle", [
    (["--drafter-cost", "dspark"], "NAME=SECONDS"),
    (["--drafter-cost", "dspark=fast"], "'fast'"),
    (["--drafter-cost", "dspark=-1"], "'-1'"),
    (["--drafter-cost", "dspark=nan"], "'nan'"),
    (["--drafter-cost", "medusa=0.1"], "medusa:KIND=SECONDS"),
    (["--drafter-cost", "medusa:tree=0.1"], "'tree'"),
    (["--drafter-cost", "dspark=0.1", "--drafter-cost", "dspark=0.2"], "given twice"),
    (["--kv-capacity-tokens", "0"], ">= 1, got 0"),
    (["--max-model-len", "-5"], ">= 1, got -5"),
    (["--kv-capacity-tokens", "1000", "--max-model-len", "4096"], "4096 exceeds the KV capacity 1000"),
])
def test_bad_import_options_fail_in_one_line(tmp_path, capsys, bad, needle):
    out = tmp_path / "x.json"
    assert _import("trt", "profile_trt_sps_table.json", out, *bad) == 2
    assert needle in _one_line_error(capsys)
    assert not out.exists()


def test_import_out_paths(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert _import("trt", "profile_trt_sps_table.json", blocker / "sub" / "p.json", *RUNNABLE) == 2
    assert "cannot create" in _one_line_error(capsys)       # checked before the table is read
    assert _import("trt", "profile_trt_sps_table.json", tmp_path, *RUNNABLE) == 2
    assert "is a directory" in _one_line_error(capsys)


@pytest.mark.parametrize("where,needle", [("file/sub/x.png", "cannot create"),   # before the profile is read
                                          ("x.nosuchformat", "unknown image format '.nosuchformat'"),
                                          (".", "is a directory")])
def test_show_plot_to_a_bad_path_fails_in_one_line(tmp_path, capsys, monkeypatch, where, needle):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "file").write_text("")
    assert main(["profile", "show", "h100-llama2-7b-tp1", "--plot", where]) == 2
    assert needle in _one_line_error(capsys)


def test_show_plot_creates_its_directory(tmp_path, capsys):
    png = tmp_path / "new" / "stair.png"
    assert main(["profile", "show", "h100-llama2-7b-tp1", "--plot", str(png)]) == 0
    assert png.read_bytes()[:4] == b"\x89PNG"
