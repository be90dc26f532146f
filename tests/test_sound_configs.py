"""Issue 31 items 8-9: a model config that is physically impossible is refused in one line naming the config file
and the key (never a ZeroDivisionError, never blamed on --out), and nothing is written."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsparksim.cli.main import main
from dsparksim.cost.analytic.arch import arch_from_dict
from dsparksim.errors import ConfigError

MODELS = Path(__file__).resolve().parents[1] / "dsparksim" / "data" / "models"

# (shipped model, keys changed, key the error must name)
BAD = [
    ("llama-2-7b", {"hidden_size": 16}, "head_dim"),              # 16 // 32 heads = head dim 0
    ("qwen3-30b-a3b", {"head_dim": 0}, "head_dim"),
    ("llama-2-7b", {"num_key_value_heads": 5}, "num_key_value_heads"),   # 32 heads in 5 KV groups
    ("llama-2-7b", {"num_key_value_heads": 64}, "num_key_value_heads"),  # more KV heads than heads
    ("llama-3-8b", {"num_key_value_heads": 0}, "num_key_value_heads"),
    ("qwen3-30b-a3b", {"num_experts_per_tok": 1000}, "num_experts_per_tok"),
    ("mixtral-8x7b", {"num_experts_per_tok": 9}, "num_experts_per_tok"),
    ("deepseek-v3", {"num_experts_per_tok": 257}, "num_experts_per_tok"),
    ("deepseek-v3", {"first_k_dense_replace": 1000}, "first_k_dense_replace"),
    ("deepseek-v3", {"first_k_dense_replace": 62}, "first_k_dense_replace"),   # 61 layers
]


def _config(tmp_path: Path, model: str, change: dict) -> Path:
    d = json.loads((MODELS / f"{model}.json").read_text())
    d.update(change)
    p = tmp_path / f"{model}-bad.json"
    p.write_text(json.dumps(d))
    return p


@pytest.mark.parametrize("model,change,key", BAD)
def test_impossible_config_is_refused_naming_config_and_key(tmp_path, capsys, model, change, key):
    cfg = _config(tmp_path, model, change)
    out = tmp_path / "o.json"
    rc = main(["profile", "build", "--model", str(cfg), "--gpu", "H100", "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1 and err[0].startswith("dsparksim: error: "), err
    assert str(cfg) in err[0] and f"'{key}'" in err[0], err
    assert str(out) not in err[0]          # the output file is not the culprit
    assert not out.exists()


@pytest.mark.parametrize("model,change,key", BAD)
def test_arch_from_dict_raises_config_error(model, change, key):
    d = {**json.loads((MODELS / f"{model}.json").read_text()), **change}
    with pytest.raises(ConfigError) as e:
        arch_from_dict(d, "cfg.json")
    assert e.value.field == key


@pytest.mark.parametrize("model", sorted(p.stem for p in MODELS.glob("*.json")))
def test_every_shipped_model_config_is_possible(model):
    arch_from_dict(json.loads((MODELS / f"{model}.json").read_text()), model)
