"""Pipeline presets: ``smoke`` (CI, seconds), ``quick`` (the committed checkpoints, ~20 min on 2 cores) and
``full`` (bigger target, longer training; sized from measured step times to fit <= 45 min on 2 cores)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from dsparksim.errors import ConfigError
from dsparksim.backend.data import DataConfig
from dsparksim.backend.model import ModelConfig


@dataclass(frozen=True)
class TrainConfig:
    steps: int
    batch: int = 16
    seq_len: int = 256
    lr: float = 3e-3
    warmup: int = 50


@dataclass(frozen=True)
class CollectConfig:
    K: int = 7
    blocks: int = 20             # blocks per response at K (mtp1: blocks * K / 1 ... see blocks_mtp1)
    blocks_mtp1: int = 80
    samples_per_prompt: int = 4          # eval (trace) responses per prompt
    calib_samples_per_prompt: int = 2    # STS calibration responses per calib prompt
    max_prompt_tokens: int = 96
    temperature: float = 1.0
    seed: int = 7


@dataclass(frozen=True)
class PipelineConfig:
    name: str
    model: ModelConfig
    data: DataConfig
    target: TrainConfig
    drafter: TrainConfig
    eagle3_ttt: int = 3
    dflash_layers: int = 1
    markov_rank: int = 32
    collect: CollectConfig = field(default_factory=CollectConfig)
    domain_weights: tuple[float, float, float] = (0.35, 0.4, 0.25)    # math, code, chat
    seed: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


PRESETS = {
    "smoke": PipelineConfig(
        "smoke", ModelConfig(vocab_size=384, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64, max_seq=96),
        DataConfig(code_train_chars=150_000, templated_train=300, eval_prompts=4, calib_prompts=4),
        TrainConfig(steps=4, batch=4, seq_len=64, warmup=2), TrainConfig(steps=3, batch=4, seq_len=64, warmup=1),
        eagle3_ttt=2, markov_rank=8,
        collect=CollectConfig(K=3, blocks=3, blocks_mtp1=6, samples_per_prompt=1, calib_samples_per_prompt=1,
                              max_prompt_tokens=24)),
    "quick": PipelineConfig(
        "quick", ModelConfig(vocab_size=2048, d_model=128, n_layers=3, n_heads=4, n_kv_heads=2, d_ff=352,
                             max_seq=256),
        DataConfig(), TrainConfig(steps=1200, lr=3e-3, warmup=60), TrainConfig(steps=400, lr=2e-3, warmup=30)),
    "full": PipelineConfig(
        "full", ModelConfig(vocab_size=2048, d_model=192, n_layers=4, n_heads=6, n_kv_heads=2, d_ff=512,
                            max_seq=256),
        DataConfig(code_train_chars=6_000_000, templated_train=16000),
        TrainConfig(steps=2000, lr=2.5e-3, warmup=100), TrainConfig(steps=450, lr=2e-3, warmup=40)),
}


def preset(name: str, **overrides) -> PipelineConfig:
    if name not in PRESETS:
        raise ConfigError("--preset", "preset", f"unknown preset {name!r}; expected one of {sorted(PRESETS)}")
    cfg = PRESETS[name]
    return replace(cfg, **overrides) if overrides else cfg
