"""The target model: a small decoder-only transformer of a current architecture.

RMSNorm (pre-norm), rotary position embeddings, grouped-query attention, SwiGLU MLP, tied input/output
embeddings. Two ways to run it:

* :meth:`TargetModel.forward` — a full causal pass over ``tokens`` (B, T) for training and feature extraction;
* :meth:`TargetModel.forward_cached` — new tokens (B, n) at absolute positions ``pos`` (B, n) against a KV cache
  indexed by absolute position. Every key written at position j is visible to a query at position p iff j <= p,
  so stale entries (rejected draft tokens) beyond a request's current length are never read: they are
  overwritten before any query reaches their position. This is what makes batched speculative decoding with a
  different accepted length per request simple.

Both return the per-layer hidden states (the drafters' features) and the logits.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from dsparksim.errors import InputError


@dataclass(frozen=True)
class ModelConfig:
    """Target architecture."""

    vocab_size: int = 2048
    d_model: int = 128
    n_layers: int = 3
    n_heads: int = 4
    n_kv_heads: int = 2
    d_ff: int = 352
    max_seq: int = 256
    rope_base: float = 10000.0
    norm_eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def feature_layers(self) -> tuple[int, int, int]:
        """Low / middle / high layer indices whose outputs the EAGLE-3 / DFlash-style drafters fuse."""
        L = self.n_layers
        return (0, L // 2, L - 1)


def check_model_config(cfg: ModelConfig, source: str, option: str) -> None:
    """A target shape the engine can build: positive sizes, heads that divide d_model and are a multiple of the KV
    heads, an even head dimension (rotary halves), a finite rope_base > 0 and norm_eps >= 0 (hostile-tester
    findings 2026-12-05: d_model=-1, n_layers=0, vocab_size=0, rope_base=-1 ended in tracebacks, some only with
    --no-profile-check)."""
    def bad(field: str, msg: str) -> InputError:
        return InputError(source, f"{option}.{field}", msg)

    for f in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff", "max_seq"):
        v = getattr(cfg, f)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise bad(f, f"expected an integer >= 1, got {v!r}")
    if cfg.d_model % cfg.n_heads:
        raise bad("n_heads", f"{cfg.n_heads} heads do not divide d_model {cfg.d_model}")
    if cfg.n_heads % cfg.n_kv_heads:
        raise bad("n_kv_heads", f"{cfg.n_kv_heads} KV heads do not divide n_heads {cfg.n_heads}")
    if cfg.head_dim % 2:
        raise bad("d_model", f"head dimension d_model / n_heads = {cfg.head_dim} is odd; rotary positions need "
                  "an even one")
    if not (math.isfinite(cfg.rope_base) and cfg.rope_base > 0):
        raise bad("rope_base", f"expected a finite number > 0, got {cfg.rope_base}")
    if not (math.isfinite(cfg.norm_eps) and cfg.norm_eps >= 0):
        raise bad("norm_eps", f"expected a finite number >= 0, got {cfg.norm_eps}")


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope(x: torch.Tensor, pos: torch.Tensor, base: float) -> torch.Tensor:
    """Rotate x (B, H, n, hd) by absolute positions pos (B, n) (half-split rotary embedding)."""
    hd = x.shape[-1]
    inv = base ** (-torch.arange(0, hd // 2, device=x.device, dtype=torch.float32) * 2.0 / hd)
    ang = pos.to(torch.float32)[:, None, :, None] * inv            # (B, 1, n, hd/2)
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class Attention(nn.Module):
    """Grouped-query attention; qkv() and out() are separate so drafters can splice in extra keys."""

    def __init__(self, d: int, n_heads: int, n_kv: int, rope_base: float):
        super().__init__()
        if d % n_heads or n_heads % n_kv:
            raise ValueError(f"d_model {d} must divide by n_heads {n_heads}, and n_heads by n_kv_heads {n_kv}")
        self.h, self.hkv, self.hd, self.base = n_heads, n_kv, d // n_heads, rope_base
        self.q = nn.Linear(d, n_heads * self.hd, bias=False)
        self.k = nn.Linear(d, n_kv * self.hd, bias=False)
        self.v = nn.Linear(d, n_kv * self.hd, bias=False)
        self.o = nn.Linear(n_heads * self.hd, d, bias=False)

    def kv(self, x: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        B, n, _ = x.shape
        k = self.k(x).view(B, n, self.hkv, self.hd).transpose(1, 2)
        v = self.v(x).view(B, n, self.hkv, self.hd).transpose(1, 2)
        return rope(k, pos, self.base), v

    def qkv(self, x: torch.Tensor, pos: torch.Tensor):
        B, n, _ = x.shape
        q = self.q(x).view(B, n, self.h, self.hd).transpose(1, 2)
        k, v = self.kv(x, pos)
        return rope(q, pos, self.base), k, v

    def out(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """q (B,H,n,hd); k, v (B,Hkv,m,hd); mask bool (B or 1, 1, n, m), True = may attend."""
        rep = self.h // self.hkv
        if rep > 1:
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        B, _, n, _ = y.shape
        return self.o(y.transpose(1, 2).reshape(B, n, self.h * self.hd))


class SwiGLU(nn.Module):
    def __init__(self, d: int, d_ff: int):
        super().__init__()
        self.gate = nn.Linear(d, d_ff, bias=False)
        self.up = nn.Linear(d, d_ff, bias=False)
        self.down = nn.Linear(d_ff, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    """Pre-norm transformer block (attention + SwiGLU)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n1 = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.rope_base)
        self.n2 = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = SwiGLU(cfg.d_model, cfg.d_ff)

    def forward(self, x, pos, mask, k_extra=None, v_extra=None, k_first=True):
        """Self-attention over this block's own tokens, optionally with extra keys/values concatenated."""
        q, k, v = self.attn.qkv(self.n1(x), pos)
        if k_extra is not None:
            k = torch.cat([k_extra, k], 2) if k_first else torch.cat([k, k_extra], 2)
            v = torch.cat([v_extra, v], 2) if k_first else torch.cat([v, v_extra], 2)
        x = x + self.attn.out(q, k, v, mask)
        return x + self.mlp(self.n2(x))

    def forward_cached(self, x, pos, cache_k, cache_v):
        """Write this step's keys at ``pos`` into the cache, attend over the cache with key_pos <= query_pos."""
        q, k, v = self.attn.qkv(self.n1(x), pos)
        write(cache_k, pos, k)
        write(cache_v, pos, v)
        x = x + self.attn.out(q, cache_k, cache_v, cache_mask(pos, cache_k.shape[2]))
        return x + self.mlp(self.n2(x))


def write(cache: torch.Tensor, pos: torch.Tensor, val: torch.Tensor) -> None:
    """cache (B, H, T, hd)[b, :, pos[b, i]] = val (B, H, n, hd)[b, :, i]."""
    B, H, n, hd = val.shape
    idx = pos[:, None, :, None].expand(B, H, n, hd)
    cache.scatter_(2, idx, val)


def cache_mask(pos: torch.Tensor, T: int) -> torch.Tensor:
    """(B, 1, n, T) bool: key at absolute position j visible to the query at pos[b, i] iff j <= pos[b, i]."""
    return (torch.arange(T, device=pos.device)[None, None, None, :] <= pos[:, None, :, None])


def causal_mask(T: int, device=None) -> torch.Tensor:
    return torch.ones(T, T, dtype=torch.bool, device=device).tril()[None, None]


class TargetModel(nn.Module):
    """Decoder-only LM (tied embeddings)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.apply(init_weights)

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """Logits from a last-layer hidden state (final norm + tied output embedding)."""
        return F.linear(self.norm(h), self.embed.weight)

    def forward(self, tokens: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Full causal pass: (per-layer outputs [(B,T,d)] * n_layers, logits (B,T,V))."""
        B, T = tokens.shape
        pos = torch.arange(T, device=tokens.device)[None].expand(B, T)
        mask = causal_mask(T, tokens.device)
        x = self.embed(tokens)
        hs = []
        for blk in self.blocks:
            x = blk(x, pos, mask)
            hs.append(x)
        return hs, self.head(x)

    def new_cache(self, B: int, T: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        c = self.cfg
        shape = (B, c.n_kv_heads, T, c.head_dim)
        return [(torch.zeros(shape), torch.zeros(shape)) for _ in range(c.n_layers)]

    def forward_cached(self, tokens: torch.Tensor, pos: torch.Tensor, cache) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Tokens (B, n) at absolute positions pos (B, n) against ``cache`` (see module docstring)."""
        x = self.embed(tokens)
        hs = []
        for blk, (ck, cv) in zip(self.blocks, cache):
            x = blk.forward_cached(x, pos, ck, cv)
            hs.append(x)
        return hs, self.head(x)


def init_weights(m: nn.Module) -> None:
    """Initialise one module of a model (``model.apply(init_weights)``): Linear and Embedding weights normal(0, 0.02), Linear biases zero."""
    if isinstance(m, nn.Linear):
        nn.init.normal_(m.weight, std=0.02)
        if m.bias is not None:
            nn.init.zeros_(m.bias)
    elif isinstance(m, nn.Embedding):
        nn.init.normal_(m.weight, std=0.02)


def n_params(module: nn.Module, exclude: set[str] = frozenset()) -> int:
    return sum(p.numel() for n, p in module.named_parameters() if n.split(".")[0] not in exclude)


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    """Linear warm-up then cosine decay to 10% of peak."""
    if step < warmup:
        return peak * (step + 1) / warmup
    t = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))
