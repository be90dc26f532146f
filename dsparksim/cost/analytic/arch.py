"""Model architecture from a Hugging Face config.json (Llama, Qwen/Qwen3, Qwen3-MoE, Mixtral, DeepSeek-V3).

Only the keys that shape the per-forward cost are read. A missing key is a ConfigError naming the key and file.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dsparksim.errors import ConfigError, InputError

__all__ = ["Arch", "load_arch", "arch_from_dict"]


@dataclass(frozen=True)
class Arch:
    """Shapes of one decoder-only model (all counts per whole model, before any parallelism)."""

    name: str
    family: str                  # "dense" | "moe" (routed experts) -- attention kind is separate
    n_layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    head_dim: int                # q/k head dim (GQA); for MLA the qk head dim (nope + rope)
    v_head_dim: int
    ffn: int                     # dense MLP intermediate size (dense layers)
    vocab: int
    max_position: int
    # MoE (0 when dense)
    n_dense_layers: int = 0      # leading dense layers in an MoE model (DeepSeek first_k_dense_replace)
    n_experts: int = 0
    top_k: int = 0
    moe_ffn: int = 0
    n_shared_experts: int = 0
    # MLA (DeepSeek); 0 when the model uses GQA/MHA
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    mtp_layers: int = 0          # DeepSeek num_nextn_predict_layers
    weight_dtype_hint: str = ""  # the config's "quantization" note (e.g. fp8), informational

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def n_moe_layers(self) -> int:
        return self.n_layers - self.n_dense_layers if self.is_moe else 0


def _req(d: dict, key: str, src: str) -> int:
    if key not in d:
        raise ConfigError(src, key, "missing key (needed to build the cost model)")
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise ConfigError(src, key, f"expected a positive integer, got {v!r}")
    return v


def _opt(d: dict, key: str, src: str, default: int) -> int:
    if key not in d or d[key] is None:
        return default
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ConfigError(src, key, f"expected a non-negative integer, got {v!r}")
    return v


def arch_from_dict(d: dict[str, Any], src: str = "<config>", name: str | None = None) -> Arch:
    """Parse the cost-relevant keys of a HF config dict (ConfigError naming the key and `src`)."""
    if not isinstance(d, dict):
        raise ConfigError(src, None, f"expected a JSON object, got {type(d).__name__}")
    archs = d.get("architectures") or [""]
    a0 = str(archs[0]) if isinstance(archs, list) and archs else ""
    name = name or Path(src).stem
    L, h, nh = _req(d, "num_hidden_layers", src), _req(d, "hidden_size", src), _req(d, "num_attention_heads", src)
    nkv = _req(d, "num_key_value_heads", src) if "num_key_value_heads" in d and d["num_key_value_heads"] is not None \
        else nh
    if nkv > nh or nh % nkv:
        raise ConfigError(src, "num_key_value_heads", f"expected a divisor of num_attention_heads ({nh}): each KV "
                          f"head serves a whole group of query heads, got {nkv}")
    if d.get("head_dim") is not None:
        hd = _req(d, "head_dim", src)
    elif h // nh < 1:
        raise ConfigError(src, "head_dim", f"hidden_size {h} / num_attention_heads {nh} gives a head dimension of "
                          "0; a head needs at least one dimension (set head_dim or fix the sizes)")
    else:
        hd = h // nh
    ffn = _req(d, "intermediate_size", src)
    if a0 == "QWenLMHeadModel":
        ffn //= 2   # Qwen-1 counts both gate and up halves in intermediate_size (vidur's n_expanded_embd = half)
    common = dict(name=name, n_layers=L, hidden=h, n_heads=nh, n_kv_heads=nkv, vocab=_req(d, "vocab_size", src),
                  max_position=_req(d, "max_position_embeddings", src), ffn=ffn,
                  weight_dtype_hint=_dtype_hint(d))
    if a0.startswith("Deepseek") or "kv_lora_rank" in d:
        nope, rope = _req(d, "qk_nope_head_dim", src), _req(d, "qk_rope_head_dim", src)
        E = _req(d, "n_routed_experts", src)
        dense = _opt(d, "first_k_dense_replace", src, 0)
        if dense > L:
            raise ConfigError(src, "first_k_dense_replace", f"expected at most num_hidden_layers ({L}) leading "
                              f"dense layers, got {dense}")
        return Arch(family="moe", head_dim=nope + rope, v_head_dim=_req(d, "v_head_dim", src),
                    n_dense_layers=dense, n_experts=E, top_k=_top_k(d, E, src),
                    moe_ffn=_req(d, "moe_intermediate_size", src),
                    n_shared_experts=_opt(d, "n_shared_experts", src, 0), q_lora_rank=_opt(d, "q_lora_rank", src, 0),
                    kv_lora_rank=_req(d, "kv_lora_rank", src), qk_rope_head_dim=rope, qk_nope_head_dim=nope,
                    mtp_layers=_opt(d, "num_nextn_predict_layers", src, 0), **common)
    if "num_experts" in d or "num_local_experts" in d or a0.startswith(("Qwen3Moe", "Mixtral")):
        key = "num_local_experts" if ("num_local_experts" in d or a0.startswith("Mixtral")) else "num_experts"
        E = _req(d, key, src)
        # Mixtral experts are full-size MLPs (intermediate_size); Qwen3-MoE has moe_intermediate_size
        moe_ffn = _req(d, "moe_intermediate_size", src) if key == "num_experts" else ffn
        if _opt(d, "decoder_sparse_step", src, 1) != 1 or d.get("mlp_only_layers"):
            raise ConfigError(src, "decoder_sparse_step", "only MoE in every layer is modelled "
                                                          "(decoder_sparse_step 1, no mlp_only_layers)")
        return Arch(family="moe", head_dim=hd, v_head_dim=hd, n_experts=E, top_k=_top_k(d, E, src),
                    moe_ffn=moe_ffn, **common)
    return Arch(family="dense", head_dim=hd, v_head_dim=hd, **common)


def _top_k(d: dict, n_experts: int, src: str) -> int:
    """num_experts_per_tok: a token is routed to at most every expert."""
    k = _req(d, "num_experts_per_tok", src)
    if k > n_experts:
        raise ConfigError(src, "num_experts_per_tok", f"expected at most the number of routed experts "
                          f"({n_experts}), got {k}")
    return k


def _dtype_hint(d: dict) -> str:
    """The published weight dtype: our configs' "quantization" note, or HF's quantization_config.quant_method."""
    q = d.get("quantization")
    if isinstance(q, str) and q:
        return q
    qc = d.get("quantization_config")
    if isinstance(qc, dict) and isinstance(qc.get("quant_method"), str):
        return qc["quant_method"]
    return ""


def load_arch(path: str | Path) -> Arch:
    """Read a config.json file (InputError when unreadable/not JSON, ConfigError on missing keys)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise InputError(str(path), "--model", f"cannot read the model config: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise InputError(str(path), "--model", f"not UTF-8 text (byte {e.start}): a config.json is UTF-8 "
                         "JSON") from None
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(str(path), "--model", f"not valid JSON: {e.msg}", line=e.lineno) from None
    return arch_from_dict(d, str(path))
