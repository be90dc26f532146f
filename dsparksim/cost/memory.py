"""KV capacity from a serving engine's memory setting and the profile's memory metadata."""
from __future__ import annotations

from typing import Any

from dsparksim.errors import ConfigError

__all__ = ["kv_capacity_at_fraction"]


def kv_capacity_at_fraction(profile: Any, fraction: float) -> tuple[int, str]:
    """(KV tokens, how) at SGLang's ``--mem-fraction-static`` ``fraction``: (GPU memory x fraction - weights per
    GPU) / KV bytes per token per GPU (the static pool holds weights and KV; activations live outside it). Needs
    the profile's metadata.build.memory (weights_GiB_per_gpu, kv_bytes_per_token_per_gpu) and
    metadata.build.gpu_figures.memory_GiB, as `profile build` writes them; else a ConfigError naming the missing
    field."""
    b = (profile.metadata or {}).get("build") if isinstance(getattr(profile, "metadata", None), dict) else None
    mem = b.get("memory") if isinstance(b, dict) else None
    gpu = b.get("gpu_figures") if isinstance(b, dict) else None
    need = {"metadata.build.memory.weights_GiB_per_gpu": (mem or {}).get("weights_GiB_per_gpu"),
            "metadata.build.memory.kv_bytes_per_token_per_gpu": (mem or {}).get("kv_bytes_per_token_per_gpu"),
            "metadata.build.gpu_figures.memory_GiB": (gpu or {}).get("memory_GiB")}
    missing = [k for k, v in need.items() if v is None]
    if missing:
        raise ConfigError(str(getattr(profile, "source", profile)), missing[0],
                          f"--mem-fraction-static needs the GPU memory, the weights per GPU and the KV bytes per "
                          f"token, which profile '{getattr(profile, 'name', '?')}' does not state (missing: "
                          f"{', '.join(missing)}); give --kv-capacity TOKENS instead")
    weights = float(sum(need["metadata.build.memory.weights_GiB_per_gpu"].values()))
    total = float(need["metadata.build.gpu_figures.memory_GiB"])
    per_tok = float(need["metadata.build.memory.kv_bytes_per_token_per_gpu"])
    free = (total * fraction - weights) * 2**30
    if free < per_tok:
        raise ConfigError("config", "mem_fraction_static", f"{fraction} of {total:g} GiB leaves no room for KV "
                          f"after {weights:.3f} GiB of weights per GPU")
    how = (f"({total:g} GiB x mem_fraction_static {fraction} - {weights:.3f} GiB weights per GPU) / "
           f"{per_tok:g} KV bytes per token per GPU (profile metadata.build.memory; weights rounded to 1 MiB)")
    return int(free // per_tok), how
