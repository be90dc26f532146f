"""What the CLI says to a new user (hostile-tester findings 2026-12-03): errors name the flag that was typed, the
help lists what it promises, a bare command shows the command list, shipped model configs go by name."""
from __future__ import annotations

import json

import pytest

from dsparksim.cli.main import build_parser, main
from dsparksim.policies import REGISTRY


@pytest.mark.parametrize("argv, flag", [(["-K", "0"], "--num-speculative-tokens"),
                                        (["--max-num-seqs", "0"], "--max-num-seqs")])
def test_engine_value_errors_name_the_flag_not_the_dataclass_field(tmp_path, capsys, argv, flag):
    assert main(["run", *argv, "--duration", "2", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert f"field '{flag}'" in err and "block_size" not in err and "max_num_seqs" not in err
    assert not (tmp_path / "o").exists()


def test_run_help_lists_every_registered_policy(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for cls in REGISTRY.values():
        assert cls.usage in out, cls.usage


def test_bare_command_prints_the_command_list(capsys):
    assert main([]) == 2
    err = capsys.readouterr().err
    assert "usage: dsparksim" in err and "frontier" in err and "validate" in err


def test_profile_build_takes_a_shipped_model_name(tmp_path, capsys):
    out = tmp_path / "p.json"
    assert main(["profile", "build", "--model", "llama-3-8b", "--gpu", "H100", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["verify"]["M"]
    assert main(["profile", "build", "--model", "llama-9", "--gpu", "H100", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "not a shipped model name" in err and "llama-3-8b" in err


@pytest.mark.parametrize("cmd", ["run", "frontier"])
def test_a_fitted_request_latency_left_out_of_engine_side_ttft_is_said(tmp_path, capsys, cmd):
    """A fitted profile's request_latency_s (client-side, added by bench replay) is not in run/frontier's TTFT: the
    command says so; a profile without one says nothing of it."""
    from dsparksim.cost.profile import load_profile
    fitted = "fitted-h200x8-deepseek-r1-sglang-0.5.12"
    ms = load_profile(fitted).request_latency_s * 1000
    assert ms > 0
    load = ["--concurrency", "2"] if cmd == "run" else ["--concurrency-levels", "2", "--policies", "none"]
    for profile, said in ((fitted, True), ("h100-llama2-7b-tp1", False)):
        argv = [cmd, "--profile", profile, *load, "--duration", "2", "--out", str(tmp_path / profile), "--quiet"]
        if cmd == "run":
            argv += ["--policy", "none"]
        assert main(argv) == 0
        err = capsys.readouterr().err
        assert (f"request_latency_s = {ms:.1f} ms" in err and "engine-side" in err) == said, err
