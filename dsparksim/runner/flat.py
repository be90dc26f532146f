"""One flattened target forward over a step's variable-length token groups, against a pooled KV cache.

The step's tokens (every decoding request's anchor + its L[i] verified draft tokens, plus prefill chunks) are
concatenated into ONE sequence of M tokens: embeddings, the q/k/v/o projections, the MLPs and the LM head run
once over those M tokens with no padding. Only the attention kernel is per request: each request's queries attend
to its own KV-cache slot with the causal rule key_pos <= query_pos (the per-request causal mask). Queries are
packed per request into a (rows, H, Lq, hd) tensor where Lq is the longest query run of the group (<= K+1 for
decode), so attention scores cost rows*Lq*T — padding exists only inside the attention scores, never in the
matmuls that dominate a step. Decode rows and prefill chunks form separate attention groups so a long prefill
chunk does not pad the decode rows.

The KV cache is a pool (slots, Hkv, T, hd) per layer indexed by absolute position, like
:meth:`dsparksim.backend.model.TargetModel.forward_cached`: stale entries past a request's length (rejected
draft tokens) are overwritten before any query reaches their position, so they are never read.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from dsparksim.backend.model import TargetModel, rope


class KVPool:
    """Per-layer key/value pools of shape (slots, Hkv, T, hd); grows its slot count on demand."""

    def __init__(self, model: TargetModel, slots: int, T: int, device: torch.device, dtype: torch.dtype):
        c = model.cfg
        self.n_layers, self.hkv, self.hd, self.T = c.n_layers, c.n_kv_heads, c.head_dim, int(T)
        self.device, self.dtype = device, dtype
        self.slots = 0
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []
        self.ensure(max(1, slots))

    def ensure(self, slots: int) -> None:
        if slots <= self.slots:
            return
        new = max(slots, 2 * self.slots)
        shape = (new, self.hkv, self.T, self.hd)
        ks = [torch.zeros(shape, device=self.device, dtype=self.dtype) for _ in range(self.n_layers)]
        vs = [torch.zeros(shape, device=self.device, dtype=self.dtype) for _ in range(self.n_layers)]
        for i in range(len(self.k)):
            ks[i][: self.slots] = self.k[i]
            vs[i][: self.slots] = self.v[i]
        self.k, self.v, self.slots = ks, vs, new

    def bytes_per_token(self) -> int:
        return 2 * self.n_layers * self.hkv * self.hd * torch.finfo(self.dtype).bits // 8


@dataclass
class Group:
    """One attention group: the flat tokens [lo, hi) belong to ``rows`` requests (KV slots ``slot``);
    token j of the group is query ``off[j]`` of group row ``rid[j]``. Lq = longest query run, Tk = keys to read."""

    lo: int
    hi: int
    slot: torch.Tensor   # (rows,) long
    rid: torch.Tensor    # (hi-lo,) long
    off: torch.Tensor    # (hi-lo,) long
    Lq: int
    Tk: int


def make_group(lo: int, slots, lengths, starts, device) -> tuple[Group, torch.Tensor]:
    """Group for rows with query runs of ``lengths`` starting at absolute positions ``starts``.

    Returns the group and the (sum(lengths),) absolute positions of its tokens.
    """
    lens = torch.as_tensor(lengths, dtype=torch.long)
    st = torch.as_tensor(starts, dtype=torch.long)
    rows = lens.numel()
    rid = torch.repeat_interleave(torch.arange(rows), lens)
    first = torch.cumsum(lens, 0) - lens
    off = torch.arange(int(lens.sum())) - first[rid]
    pos = st[rid] + off
    Lq = int(lens.max()) if rows else 0
    Tk = int(pos.max()) + 1 if rows else 0
    g = Group(lo, lo + int(lens.sum()), torch.as_tensor(slots, dtype=torch.long).to(device), rid.to(device),
              off.to(device), Lq, Tk)
    return g, pos


class FlatForward:
    """Runs a :class:`TargetModel`'s weights over flattened groups (see module docstring)."""

    def __init__(self, model: TargetModel):
        self.m = model
        c = model.cfg
        self.h, self.hkv, self.hd = c.n_heads, c.n_kv_heads, c.head_dim

    @torch.no_grad()
    def __call__(self, tokens: torch.Tensor, pos: torch.Tensor, groups: list[Group], pool: KVPool,
                 logits_at: torch.Tensor | None = None, hidden: bool = False):
        """tokens, pos: (M,) long. Returns logits (len(logits_at) or M, V) at the flat indices ``logits_at``;
        with ``hidden`` also every layer's output [(M, d)] * n_layers first (the drafters' features)."""
        m = self.m
        x = m.embed(tokens)                                         # (M, d)
        M = x.shape[0]
        # absolute slot of every flat token, for the cache writes
        slot_tok = torch.cat([g.slot[g.rid] for g in groups]) if groups else torch.zeros(0, dtype=torch.long)
        hs: list[torch.Tensor] = []
        for li, blk in enumerate(m.blocks):
            a = blk.attn
            hx = blk.n1(x)
            q = rope(a.q(hx).view(1, M, self.h, self.hd).transpose(1, 2), pos[None], a.base)[0]    # (H, M, hd)
            k = rope(a.k(hx).view(1, M, self.hkv, self.hd).transpose(1, 2), pos[None], a.base)[0]  # (Hkv, M, hd)
            v = a.v(hx).view(M, self.hkv, self.hd)
            ck, cv = pool.k[li], pool.v[li]
            ck[slot_tok, :, pos] = k.transpose(0, 1).to(ck.dtype)
            cv[slot_tok, :, pos] = v.to(cv.dtype)
            y = torch.empty(M, self.h, self.hd, dtype=x.dtype, device=x.device)
            qt = q.transpose(0, 1)                                  # (M, H, hd)
            for g in groups:
                rows = g.slot.numel()
                qp = torch.zeros(rows, self.Lq_pad(g), self.h, self.hd, dtype=x.dtype, device=x.device)
                qp[g.rid, g.off] = qt[g.lo:g.hi]
                qpos = torch.zeros(rows, qp.shape[1], dtype=torch.long, device=x.device)
                qpos[g.rid, g.off] = pos[g.lo:g.hi]
                kk = ck[g.slot, :, : g.Tk].to(x.dtype)                # (rows, Hkv, Tk, hd)
                vv = cv[g.slot, :, : g.Tk].to(x.dtype)
                mask = torch.arange(g.Tk, device=x.device)[None, None, None, :] <= qpos[:, None, :, None]
                o = F.scaled_dot_product_attention(qp.transpose(1, 2), kk, vv, attn_mask=mask,
                                                   enable_gqa=self.h != self.hkv)    # (rows, H, Lq, hd)
                y[g.lo:g.hi] = o.transpose(1, 2)[g.rid, g.off]
            x = x + a.o(y.reshape(M, self.h * self.hd))
            x = x + blk.mlp(blk.n2(x))
            if hidden:
                hs.append(x)
        if logits_at is not None:
            x = x[logits_at]
        return (hs, m.head(x)) if hidden else m.head(x)

    @staticmethod
    def Lq_pad(g: Group) -> int:
        return g.Lq
