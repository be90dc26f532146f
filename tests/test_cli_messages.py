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
