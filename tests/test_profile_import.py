"""Importers from engine SPS tables (vLLM/SGLang SpsCostTable, SGLang additive, TensorRT-LLM sps_table.json)
and the ``dsparksim profile`` CLI."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest

from dsparksim.cli import profile as cli_profile
from dsparksim.errors import ConfigError, InputError
from dsparksim.cost.profile import ProfileRangeError, load_profile, profile_to_dict, save_profile
from dsparksim.cost.profile_import import import_sps_dict, import_sps_table

DATA = Path(__file__).resolve().parent / "data"


# ------------------------------------------------------------------ vLLM / SGLang SpsCostTable
@pytest.mark.parametrize("fmt", ["vllm", "sglang"])
def test_sps_cost_table_floor_import(fmt):
    p = import_sps_table(DATA / "profile_vllm_sps.json", fmt)
    np.testing.assert_array_equal(p.verify_M, [8, 16, 32, 64])
    np.testing.assert_array_equal(p.verify_time_s, 1.0 / np.array([100.0, 90.0, 50.0, 40.0]))
    assert p.fixed_overhead_s == 0.0 and p.batch_overhead is None and p.drafters == {}
    assert p.context_model == "none"
    # engine semantics = floor over probes
    assert p.verify_time(31) == 1 / 90.0 and p.verify_time(32) == 1 / 50.0
    md = p.metadata
    assert md["imported"]["max_batch_tokens"] == 128 and len(md["imported"]["sha256_16"]) == 16
    assert any("fixed_overhead_s = 0" in n for n in md["import_notes"])
    assert any(m.startswith("drafter costs") for m in md["missing"])
    # strict range by default: below the first probe / above the last is an error, not a clamp
    with pytest.raises(ProfileRangeError):
        p.verify_time(4)
    with pytest.raises(ProfileRangeError):
        p.verify_time(100)


def test_engine_clamp_reproduces_engine_lookup_and_is_recorded():
    p = import_sps_table(DATA / "profile_vllm_sps.json", "vllm", engine_clamp=True)
    np.testing.assert_array_equal(p.verify_M, [1, 8, 16, 32, 64, 128])
    assert p.verify_time(4) == 1 / 100.0 and p.verify_time(100) == 1 / 40.0 and p.max_tokens == 128
    notes = " ".join(p.metadata["import_notes"])
    assert "breakpoint 1 added" in notes and "NOT measured" in notes


def test_no_drafters_means_clear_error_and_drafters_from_copies():
    p = import_sps_table(DATA / "profile_vllm_sps.json", "vllm")
    with pytest.raises(ConfigError) as ei:
        p.draft_time("dspark", 4, 7)
    assert "no drafter costs" in str(ei.value) and "--drafters-from" in str(ei.value)
    q = import_sps_table(DATA / "profile_trt_sps_table.json", "trt", drafters_from=DATA / "profile_small.json")
    assert set(q.drafters) == {"dspark", "eagle3", "mtp1"}
    assert q.draft_time("dspark", 2, 4) == pytest.approx(0.0006 * 1.008, rel=1e-12)
    df = q.metadata["drafters_from"]
    assert df["profile"] == "small" and "warning" not in df
    assert not any(m.startswith("drafter costs") for m in q.metadata["missing"])
    # whole-step SPS + copied drafters may double count: said in metadata
    r = import_sps_table(DATA / "profile_vllm_sps.json", "vllm", drafters_from=DATA / "profile_small.json")
    assert "twice" in r.metadata["drafters_from"]["warning"]
    with pytest.raises(InputError, match="no drafters to copy"):
        import_sps_table(DATA / "profile_vllm_sps.json", "vllm", drafters_from=DATA / "profile_2d.json")


# ------------------------------------------------------------------ SGLang additive
def test_sglang_additive_table_is_densified_exactly():
    raw = json.loads((DATA / "profile_sglang_additive.json").read_text())
    p = import_sps_table(DATA / "profile_sglang_additive.json", "sglang")
    assert p.fixed_overhead_s == 0.002
    M = np.arange(1, 65)
    np.testing.assert_allclose(p.verify_time(M), np.interp(M, raw["m_probes"], raw["theta_seconds"]), rtol=1e-15)
    n = np.arange(1, 33)
    np.testing.assert_allclose(p.batch_overhead_time(n), np.interp(n, raw["bs_probes"], raw["alpha_seconds"]),
                               rtol=1e-15)
    # the engine's T(R, M) = bias + alpha(R) + theta(M); with no drafting that is our step time
    assert p.step_time(40, 10, None, 7) == pytest.approx(
        0.002 + np.interp(10, [1, 8, 32], [0.0001, 0.0005, 0.0013]) + np.interp(40, [1, 16, 64], [0.010, 0.011, 0.020]),
        rel=1e-12)
    assert p.metadata["imported"]["table"] == "SpsAdditiveCostTable"


# ------------------------------------------------------------------ TensorRT-LLM
def test_trt_floor_table_with_overheads():
    p = import_sps_table(DATA / "profile_trt_sps_table.json", "trt")
    # token_counts [0, 64, 128, 256]: 0 moves to 1 (same floor value for every M >= 1)
    np.testing.assert_array_equal(p.verify_M, [1, 64, 128, 256])
    assert p.verify_time(63) == 0.008 and p.verify_time(64) == 0.009 and p.verify_time(255) == 0.012
    assert p.fixed_overhead_s == 0.0015
    assert p.batch_overhead_time(7) == pytest.approx(0.0001) and p.batch_overhead_time(8) == pytest.approx(0.0004)
    assert p.nontrimmable_time(None, 8, 7) == pytest.approx(0.0015 + 0.0004, rel=1e-12)
    assert p.metadata["imported"]["lookup_used"] == "floor"
    assert any("breakpoint 0 moved to 1" in n for n in p.metadata["import_notes"])


def test_trt_interp_marker_follows_engine_interpolation():
    p = import_sps_table(DATA / "profile_trt_interp.json", "trt")
    assert p.metadata["imported"]["lookup_used"] == "interp"
    assert p.metadata["imported"]["engine_meta"]["tp"] == 1
    M = np.arange(8, 129)
    np.testing.assert_allclose(p.verify_time(M), np.interp(M, [8, 64, 128], [0.008, 0.008, 0.012]), rtol=1e-15)
    assert p.verify_time(96) == pytest.approx(0.010, rel=1e-12)
    # forcing floor reproduces the old reading of the same file
    f = import_sps_table(DATA / "profile_trt_interp.json", "trt", lookup="floor")
    assert f.verify_time(96) == 0.008


def test_trt_zero_breakpoint_dropped_when_one_is_present():
    p = import_sps_dict({"token_counts": [0, 1, 8], "step_time_ms": [5.0, 6.0, 7.0]}, "trt", source="mem.json")
    np.testing.assert_array_equal(p.verify_M, [1, 8])
    assert p.verify_time(1) == 0.006


@pytest.mark.parametrize("fmt,fname", [("vllm", "profile_vllm_sps.json"), ("sglang", "profile_sglang_additive.json"),
                                       ("trt", "profile_trt_sps_table.json"), ("trt", "profile_trt_interp.json")])
def test_import_round_trip(tmp_path, fmt, fname):
    p = import_sps_table(DATA / fname, fmt, name="imp", metadata={"device": "H100", "model": "m"})
    q = load_profile(save_profile(p, tmp_path / "imp.json"))
    assert profile_to_dict(q) == profile_to_dict(p)
    assert q.metadata["device"] == "H100" and q.name == "imp"
    M = np.arange(q.min_tokens, q.max_tokens + 1)
    np.testing.assert_array_equal(q.verify_time(M), p.verify_time(M))


# ------------------------------------------------------------------ malformed inputs
@pytest.mark.parametrize("fmt,fname,field,needle", [
    ("vllm", "profile_vllm_bad_unsorted.json", "sample_batch_tokens", "index 2"),
    ("vllm", "profile_vllm_bad_missing.json", "sample_steps_per_sec", "missing"),
    ("sglang", "profile_vllm_bad_maxtokens.json", "max_batch_tokens", ">= the largest probe 16"),
    ("trt", "profile_trt_bad_negative.json", "step_time_ms", "index 1"),
    ("trt", "profile_trt_bad_length.json", "step_time_ms", "length mismatch"),
    ("trt", "profile_vllm_sps.json", "token_counts", "missing"),  # wrong --format
    ("vllm", "profile_trt_sps_table.json", "sample_batch_tokens", "missing"),
])
def test_malformed_engine_tables(fmt, fname, field, needle):
    with pytest.raises(InputError) as ei:
        import_sps_table(DATA / fname, fmt)
    msg = str(ei.value)
    assert fname in msg and f"'{field}'" in msg and needle in msg, msg


def test_malformed_json_and_bad_arguments(tmp_path):
    with pytest.raises(InputError, match=r"profile_trt_bad_json.json:\d+: not valid JSON"):
        import_sps_table(DATA / "profile_trt_bad_json.json", "trt")
    with pytest.raises(InputError, match="unknown import format"):
        import_sps_table(DATA / "profile_vllm_sps.json", "onnx")
    with pytest.raises(InputError, match="lookup"):
        import_sps_table(DATA / "profile_vllm_sps.json", "vllm", lookup="cubic")
    with pytest.raises(InputError, match="not found"):
        import_sps_table(tmp_path / "missing.json", "vllm")
    with pytest.raises(InputError, match="sample_steps_per_sec.*index 0"):
        import_sps_dict({"sample_batch_tokens": [1], "sample_steps_per_sec": [0.0], "max_batch_tokens": 1}, "vllm")


# ------------------------------------------------------------------ CLI
def _parse(*argv: str) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="dsparksim")
    cli_profile.register(ap.add_subparsers(dest="cmd"))
    return ap.parse_args(["profile", *argv])


def test_cli_import_then_show(tmp_path, capsys):
    out = tmp_path / "trt-imported.json"
    a = _parse("import", "--format", "trt", str(DATA / "profile_trt_sps_table.json"), "--out", str(out),
               "--drafters-from", str(DATA / "profile_small.json"), "--device", "H200", "--tensor-parallel", "2")
    assert a.func(a) == 0
    assert "wrote" in capsys.readouterr().out
    p = load_profile(out)
    assert p.name == "trt-imported" and p.metadata["device"] == "H200" and p.metadata["tensor_parallel"] == 2
    a = _parse("show", str(out), "--json")
    assert a.func(a) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["verify"]["M_max"] == 256 and s["context_model"] == "none"
    assert s["verify"]["sps_at"]["64"] == pytest.approx(1 / 0.009)
    assert s["drafters"]["dspark"]["kind"] == "parallel"
    assert s["fixed_overhead_s"] == 0.0015


def test_cli_show_text_and_plot(tmp_path, capsys):
    png = tmp_path / "stair.png"
    a = _parse("show", "h100-llama2-7b-tp1", "--plot", str(png))
    assert a.func(a) == 0
    text = capsys.readouterr().out
    assert "context model: linear" in text and "drafter dspark (parallel" in text and "SPS" in text
    assert png.stat().st_size > 1000 and png.read_bytes()[:4] == b"\x89PNG"


def test_cli_errors_and_list(tmp_path, capsys):
    a = _parse("show", "no-such-profile")
    assert a.func(a) == 2
    assert "shipped" in capsys.readouterr().err
    a = _parse("import", "--format", "vllm", str(DATA / "profile_vllm_bad_unsorted.json"), "--out",
               str(tmp_path / "x.json"))
    assert a.func(a) == 2
    assert "sample_batch_tokens" in capsys.readouterr().err and not (tmp_path / "x.json").exists()
    a = _parse("list")
    assert a.func(a) == 0
    out = capsys.readouterr().out
    assert "h100-llama2-7b-tp1" in out and "h100-llama2-70b-tp4" in out
