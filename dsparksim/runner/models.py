"""Which target the runner builds: named shapes, explicit parameters, or a trained checkpoint; device facts."""
from __future__ import annotations

import os
import platform
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import torch

from dsparksim.backend.model import ModelConfig, TargetModel, check_model_config
from dsparksim.errors import ConfigError, InputError
from dsparksim.backend.checkpoint import load_target as _lt

# Published decoder shapes (random weights: timing only). Qwen3-8B: config.json of Qwen/Qwen3-8B
# (hidden 4096, 36 layers, 32 query / 8 KV heads of 128, intermediate 12288, vocab 151936); the q/k RMSNorm of
# Qwen3 is not modelled (a negligible share of a step).
SHAPES: dict[str, ModelConfig] = {
    "tiny": ModelConfig(),  # the [models] 'quick' target shape
    "small": ModelConfig(vocab_size=2048, d_model=192, n_layers=4, n_heads=6, n_kv_heads=2, d_ff=512),
    "qwen3-8b": ModelConfig(vocab_size=151936, d_model=4096, n_layers=36, n_heads=32, n_kv_heads=8, d_ff=12288,
                            max_seq=40960, rope_base=1000000.0),
}


def parse_model(spec: str) -> tuple[ModelConfig, str | None]:
    """``NAME`` (see SHAPES), ``NAME,field=value,...`` overrides, or ``ckpt:PATH`` (a trained target).

    Returns (config, checkpoint path or None).
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError("--model", "model", f"expected a shape name {sorted(SHAPES)} or ckpt:PATH, got {spec!r}")
    spec = spec.strip()
    if spec.startswith("ckpt:"):
        path = spec[5:]
        # with --live the target is MODELS/target.pt: name --models, the option the user typed
        opt = "--models" if Path(path).name == "target.pt" else "--model"
        if not Path(path).is_file():
            raise ConfigError(opt, "model", f"checkpoint file not found: {path}")
        try:
            ck = torch.load(path, map_location="cpu", weights_only=True)
            cfg = ModelConfig(**ck["config"])
        except Exception as e:  # noqa: BLE001 - zip, pickle, key and type errors all mean "not our checkpoint"
            raise InputError(path, opt, f"not a readable target checkpoint (`dsparksim train` writes them): "
                             f"{type(e).__name__}: {str(e)[:200]}") from None
        check_model_config(cfg, path, "config")
        return cfg, path
    name, *over = spec.split(",")
    if name not in SHAPES:
        raise ConfigError("--model", "model", f"unknown shape {name!r}; expected one of {sorted(SHAPES)} or ckpt:PATH")
    kw = asdict(SHAPES[name])
    types = {f.name: f.type for f in fields(ModelConfig)}
    for o in over:
        k, eq, v = o.partition("=")
        if not eq or k not in kw:
            raise ConfigError("--model", "model", f"override {o!r}: expected FIELD=VALUE with FIELD in {sorted(kw)}")
        try:
            kw[k] = float(v) if "float" in str(types[k]) else int(v)
        except ValueError:
            raise ConfigError("--model", k, f"expected a number, got {v!r}") from None
    cfg = ModelConfig(**kw)
    check_model_config(cfg, "--model", "model")
    return cfg, None


def model_key(cfg: ModelConfig, ckpt: str | None, drafter_layers: int, dtype: str, live: bool = False) -> str:
    """A stable identity string for a profile's metadata and the run-vs-profile check."""
    c = cfg
    w = f"ckpt:{Path(ckpt).name}" if ckpt else "random-init"
    d = "trained drafters (live)" if live else f"drafter proxy {drafter_layers} layer(s)"
    return (f"TargetModel(vocab={c.vocab_size},d={c.d_model},layers={c.n_layers},heads={c.n_heads}/"
            f"{c.n_kv_heads},ff={c.d_ff}) {w} {dtype}; {d}")


def device_key(device: str, threads: int | None, clock: str = "wall") -> str:
    d = torch.device(device)
    if d.type == "cuda":
        return f"cuda:{torch.cuda.get_device_name(d)}"
    return f"cpu:{_cpu_name()} threads={threads or torch.get_num_threads()} clock={clock}"


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def kv_capacity_tokens(cfg: ModelConfig, device: str, dtype_bits: int, weights_bytes: int = 0,
                       frac: float = 0.8) -> int:
    """KV tokens the device can hold: CUDA free memory * frac (the weights, already loaded, are not free; the
    caching allocator's freed blocks are released first, e.g. the fp32 copy a bf16 model was built from); CPU 25%
    of RAM less ``weights_bytes``."""
    per_tok = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * dtype_bits // 8
    d = torch.device(device)
    if d.type == "cuda":
        torch.cuda.empty_cache()
        free, _ = torch.cuda.mem_get_info(d)
        return int(max(0.0, free * frac) // per_tok)
    budget = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * 0.25
    return int(max(0, budget - weights_bytes) // per_tok)


def load_target(spec: str, device: str, dtype: str) -> tuple[ModelConfig, TargetModel | None, str | None]:
    cfg, ck = parse_model(spec)
    if ck is None:
        return cfg, None, None
    m, _ = _lt(ck)
    return cfg, m, ck


def describe(cfg: ModelConfig) -> dict[str, Any]:
    return asdict(cfg)
