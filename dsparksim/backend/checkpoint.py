"""Checkpoint files (``models/*.pt``): weights in float16 plus the configuration they were built with.

A checkpoint is a dict ``{"format", "kind" ("target" | drafter kind), "config", "tokenizer_sha256",
"target_sha256" (drafters: the target they were distilled from), "meta", "state_dict"}``. Loading checks each of
these and raises :class:`~dsparksim.errors.InputError` naming the file and the field that does not match.
Drafters store only their own weights: the embedding / output head they share with the target is not copied.
"""
from __future__ import annotations

import hashlib
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from dsparksim.errors import InputError
from dsparksim.results.outputs import atomic_write
from dsparksim.backend.drafters import DRAFTERS, DrafterConfig, build_drafter
from dsparksim.backend.model import ModelConfig, TargetModel, check_model_config

FORMAT = "dsparksim-backend-checkpoint/1"


def state_sha(sd: dict[str, torch.Tensor]) -> str:
    """A hash of the (float16) weights: ties a drafter to the exact target it was distilled from."""
    h = hashlib.sha256()
    for k in sorted(sd):
        h.update(k.encode())
        h.update(sd[k].to(torch.float16).contiguous().numpy().tobytes())
    return h.hexdigest()


def save(path: str | Path, kind: str, config: Any, module: torch.nn.Module, *, tokenizer_sha256: str,
         target_sha256: str | None = None, meta: dict | None = None) -> str:
    """Write a checkpoint; returns the sha of the stored weights."""
    sd = {k: v.detach().to(torch.float16).clone() for k, v in module.state_dict().items()}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    ck = {"format": FORMAT, "kind": kind, "config": asdict(config), "tokenizer_sha256": tokenizer_sha256,
          "target_sha256": target_sha256, "meta": meta or {}, "state_dict": sd}
    atomic_write(path, lambda t: torch.save(ck, t))    # Ctrl-C while saving never leaves half a checkpoint
    return state_sha(sd)


def _read(path: Path, kind: str) -> dict:
    if not path.is_file():
        raise InputError(path, None, f"{kind} checkpoint not found (run `dsparksim train` or use the committed "
                         "models/ directory)")
    try:
        ck = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # pickle/zip errors come in many types
        raise InputError(path, None, f"not a readable torch checkpoint: {e}") from None
    if not isinstance(ck, dict) or ck.get("format") != FORMAT:
        got = ck.get("format") if isinstance(ck, dict) else type(ck).__name__
        raise InputError(path, "format", f"expected {FORMAT!r}, got {got!r}")
    if ck.get("kind") != kind:
        raise InputError(path, "kind", f"checkpoint holds a {ck.get('kind')!r} model, expected {kind!r}")
    if not isinstance(ck.get("config"), dict):
        raise InputError(path, "config", f"expected the model configuration (an object), got {ck.get('config')!r:.60}")
    sd = ck.get("state_dict")
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise InputError(path, "state_dict", "expected the weights (a mapping of names to tensors)")
    return ck


def _load_state(path: Path, module: torch.nn.Module, sd: dict) -> None:
    own = module.state_dict()
    missing = sorted(set(own) - set(sd))
    extra = sorted(set(sd) - set(own))
    if missing or extra:
        raise InputError(path, "state_dict", f"weights do not match the configured architecture: missing "
                         f"{missing[:3]}, unexpected {extra[:3]}")
    for k, v in sd.items():
        if tuple(v.shape) != tuple(own[k].shape):
            raise InputError(path, f"state_dict.{k}", f"shape {tuple(v.shape)} but the config needs "
                             f"{tuple(own[k].shape)}")
    module.load_state_dict({k: v.float() for k, v in sd.items()})


def load_target(path: str | Path, tokenizer_sha256: str | None = None) -> tuple[TargetModel, dict]:
    path = Path(path)
    ck = _read(path, "target")
    try:
        cfg = ModelConfig(**ck["config"])
    except TypeError as e:
        raise InputError(path, "config", f"unknown target configuration: {e}") from None
    check_model_config(cfg, path, "config")
    if tokenizer_sha256 is not None and ck.get("tokenizer_sha256") != tokenizer_sha256:
        raise InputError(path, "tokenizer_sha256", "the target was trained with a different tokenizer.json "
                         "than the one given")
    m = TargetModel(cfg)
    _load_state(path, m, ck["state_dict"])
    m.eval()
    for p in m.parameters():
        p.requires_grad_(False)
    return m, {"sha256": state_sha(ck["state_dict"]), **ck}


def load_drafter(path: str | Path, kind: str, target: TargetModel, target_sha256: str) -> tuple[torch.nn.Module, dict]:
    path = Path(path)
    if kind not in DRAFTERS:
        raise InputError(path, "kind", f"unknown drafter {kind!r}; expected one of {DRAFTERS}")
    ck = _read(path, kind)
    try:
        dcfg = DrafterConfig(**ck["config"])
    except (TypeError, ValueError) as e:
        raise InputError(path, "config", f"bad drafter configuration: {e}") from None
    if ck.get("target_sha256") != target_sha256:
        raise InputError(path, "target_sha256", "drafter was distilled from a different target checkpoint "
                         "(retrain the drafters or use the matching target.pt)")
    m = build_drafter(target.cfg, dcfg)
    _load_state(path, m, ck["state_dict"])
    m.eval()
    return m, ck
