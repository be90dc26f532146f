"""The four drafters, each conditioned on the target's hidden states as its published design is.

Notation: the target has processed tokens x_0..x_{t-1} (hidden states / features f_0..f_{t-1}) and sampled the
pending token x_t that it has not processed yet. A drafter proposes x_{t+1}..x_{t+K}.

* ``mtp1`` (DeepSeek-V3 multi-token prediction, depth 1): ``h'_i = W[RMSNorm(f_i); RMSNorm(Emb(x_{i+1}))]`` ->
  one transformer block (causal over positions) -> the target's (shared) output embedding -> predicts x_{i+2}.
  At position t-1 that is x_{t+1}: one draft token (K = 1).
* ``eagle3`` (EAGLE-3 style): the same one-layer autoregressive shape, but the feature is a fused projection of
  the target's low/middle/high layer outputs and the drafter has its own LM head. Later draft steps feed the
  drafter's own output hidden state back in place of the (unknown) target feature; training unrolls that
  ("training-time test") so the drafter learns on its own features.
* ``dflash`` (DFlash style, parallel): the fused target features are projected into every drafter layer's keys
  and values (the context); the drafter's own tokens are the block ``[x_t, MASK x K]`` at positions t..t+K with
  bidirectional attention inside the block. One forward pass yields all K distributions; output embedding shared
  with the target.
* ``dspark``: the dflash backbone plus (a) a Markov head: a low-rank bias ``U V^T e(prev)`` added to the logits
  of position k that depends only on the token at position k-1 (the anchor for k=1, the sampled draft token
  after that) and (b) a confidence head ``sigmoid(w . [s_k; Markov-embedding(prev)] + b)`` on the backbone state
  s_k, trained towards the analytic acceptance ``1 - 0.5 ||p_draft - p_target||_1``.

Every drafter exposes ``loss(target, tokens, hs, tlogits)`` (distillation against the frozen target's
distributions); it decodes through ``drafter_state.batch_runtime(drafter, target, B, T)`` (see :mod:`.specdec`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from dsparksim.backend.model import Block, ModelConfig, RMSNorm, TargetModel, init_weights, cache_mask

DRAFTERS = ("mtp1", "eagle3", "dflash", "dspark")


@dataclass(frozen=True)
class DrafterConfig:
    kind: str
    K: int
    n_layers: int = 1            # parallel drafters; the AR drafters have one block by design
    markov_rank: int = 32        # dspark
    ttt_steps: int = 3           # eagle3 training-time-test unroll (inference runs K steps)
    anchors: int = 16            # parallel drafters: blocks trained per sequence per step

    def __post_init__(self):
        if self.kind not in DRAFTERS:
            raise ValueError(f"unknown drafter kind {self.kind!r}; expected one of {DRAFTERS}")
        if self.kind == "mtp1" and self.K != 1:
            raise ValueError("mtp1 drafts exactly one token (K=1)")


def soft_ce(logits: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the drafter's logits against the target's probabilities (distillation)."""
    return -(p * F.log_softmax(logits, -1)).sum(-1).mean()


def fused(target: TargetModel, hs: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([hs[i] for i in target.cfg.feature_layers()], -1)


def sample(logits: torch.Tensor, temperature: float, gen: torch.Generator | None):
    """(token, probability vector it was drawn from); temperature 0 = argmax with a one-hot distribution."""
    if temperature == 0:
        tok = logits.argmax(-1)
        return tok, F.one_hot(tok, logits.shape[-1]).to(logits.dtype)
    p = torch.softmax(logits / temperature, -1)
    tok = torch.multinomial(p.reshape(-1, p.shape[-1]), 1, generator=gen).reshape(p.shape[:-1])
    return tok, p


# ---- autoregressive drafters: mtp1, eagle3 ---------------------------------------------------------------------
class ARDrafter(nn.Module):
    def __init__(self, tcfg: ModelConfig, dcfg: DrafterConfig):
        super().__init__()
        d = tcfg.d_model
        self.tcfg, self.dcfg = tcfg, dcfg
        self.is_eagle = dcfg.kind == "eagle3"
        self.fc = nn.Linear(3 * d, d, bias=False) if self.is_eagle else None
        self.nf, self.ne = RMSNorm(d), RMSNorm(d)
        self.inp = nn.Linear(2 * d, d, bias=False)
        self.block = Block(tcfg)
        self.norm = RMSNorm(d)
        self.lm = nn.Linear(d, tcfg.vocab_size, bias=False) if self.is_eagle else None
        self.apply(init_weights)

    def feat(self, target, hs):
        return self.fc(fused(target, hs)) if self.is_eagle else hs[-1]

    def step_in(self, target, tok, f):
        return self.inp(torch.cat([self.ne(target.embed(tok)), self.nf(f)], -1))

    def logits(self, target, h):
        w = self.lm.weight if self.is_eagle else target.embed.weight
        return F.linear(self.norm(h), w)

    def loss(self, target, tokens, hs, tlogits):
        B, T = tokens.shape
        p = torch.softmax(tlogits, -1)
        f = self.feat(target, hs)
        x = self.step_in(target, tokens[:, 1:], f[:, :-1])           # origins i = 0..T-2
        n1 = T - 1
        pos1 = torch.arange(n1)[None].expand(B, n1)
        q1, k1, v1 = self.block.attn.qkv(self.block.n1(x), pos1)
        causal = torch.ones(n1, n1, dtype=torch.bool).tril()
        h = x + self.block.attn.out(q1, k1, v1, causal[None, None])
        h = h + self.block.mlp(self.block.n2(h))
        total = soft_ce(self.logits(target, h), p[:, 1:])
        steps = self.dcfg.ttt_steps if self.is_eagle else 1
        ks, vs = [], []
        for s in range(2, steps + 1):
            n = T - s                                                  # origins i = 0..T-s-1
            if n < 2:
                break
            xs = self.step_in(target, tokens[:, s:s + n], h[:, :n])
            pos = (torch.arange(n) + s - 1)[None].expand(B, n)
            q, k, v = self.block.attn.qkv(self.block.n1(xs), pos)
            ks = [kk[:, :, :n] for kk in ks] + [k]
            vs = [vv[:, :, :n] for vv in vs] + [v]
            # keys: step-1 keys j <= origin, then the chain's own keys from steps 2..s (diagonal)
            eye = torch.eye(n, dtype=torch.bool)
            mask = torch.cat([causal[:n, :]] + [eye] * len(ks), 1)[None, None]
            kall = torch.cat([k1] + ks, 2)
            vall = torch.cat([v1] + vs, 2)
            hs_ = xs + self.block.attn.out(q, kall, vall, mask)
            h = hs_ + self.block.mlp(self.block.n2(hs_))
            total = total + soft_ce(self.logits(target, h), p[:, s:s + n])
        return total / steps, {}

def propose_ar(m: ARDrafter, target, h, origin, logits1, ck, cv, K, temperature, gen):
    """K autoregressive draft steps for B requests: h (B, d) drafter state at ``origin`` (B,), logits1 (B, V) its
    first-step logits, ck/cv (B, Hkv, T, hd) the drafter's cache (read only). Returns (d (B,K), q (B,K,V), conf)."""
    blk = m.block
    toks, probs = [], []
    tok, p = sample(logits1, temperature, gen)
    toks.append(tok)
    probs.append(p)
    ks, vs = [], []
    base_mask = cache_mask(origin[:, None], ck.shape[2])                      # j <= origin
    for s in range(2, K + 1):
        x = m.step_in(target, tok[:, None], h[:, None])
        pos = (origin + s - 1)[:, None]
        q, k, v = blk.attn.qkv(blk.n1(x), pos)
        ks.append(k)
        vs.append(v)
        mask = torch.cat([base_mask, torch.ones(x.shape[0], 1, 1, len(ks), dtype=torch.bool, device=x.device)], -1)
        y = x + blk.attn.out(q, torch.cat([ck] + ks, 2), torch.cat([cv] + vs, 2), mask)
        y = y + blk.mlp(blk.n2(y))
        h = y[:, 0]
        tok, p = sample(m.logits(target, h), temperature, gen)
        toks.append(tok)
        probs.append(p)
    d, q = torch.stack(toks, 1), torch.stack(probs, 1)
    conf = q.gather(-1, d[..., None])[..., 0]          # no confidence head: the draft's own probability
    return d, q, conf


# ---- parallel drafters: dflash, dspark -------------------------------------------------------------------------
class ParallelDrafter(nn.Module):
    def __init__(self, tcfg: ModelConfig, dcfg: DrafterConfig):
        super().__init__()
        d = tcfg.d_model
        self.tcfg, self.dcfg = tcfg, dcfg
        self.fc = nn.Linear(3 * d, d, bias=False)
        self.nctx = RMSNorm(d)
        self.mask_emb = nn.Parameter(torch.zeros(d))
        self.blocks = nn.ModuleList(Block(tcfg) for _ in range(dcfg.n_layers))
        self.norm = RMSNorm(d)
        self.spark = dcfg.kind == "dspark"
        if self.spark:
            r = dcfg.markov_rank
            self.mk_emb = nn.Embedding(tcfg.vocab_size, r)
            self.mk_out = nn.Linear(r, tcfg.vocab_size, bias=False)
            self.conf = nn.Linear(d + r, 1)
        self.apply(init_weights)
        nn.init.normal_(self.mask_emb, std=0.02)
        if self.spark:
            nn.init.zeros_(self.mk_out.weight)     # starts as the plain dflash backbone

    def ctx(self, target, hs):
        return self.nctx(self.fc(fused(target, hs)))

    def backbone(self, target, anchor_emb, pos, ctx_kv, ctx_mask):
        """Block states (B, nb, K+1, d) for anchors; ctx_kv[l] = (k, v) context keys of layer l."""
        B, nb, K1 = pos.shape
        x = torch.cat([anchor_emb[:, :, None], self.mask_emb.expand(B, nb, K1 - 1, -1)], 2).reshape(B, nb * K1, -1)
        same = torch.block_diag(*[torch.ones(K1, K1, dtype=torch.bool, device=pos.device)] * nb)[None, None]
        mask = torch.cat([ctx_mask, same.expand(ctx_mask.shape[0], 1, -1, -1)], -1)
        p = pos.reshape(B, nb * K1)
        for blk, (k, v) in zip(self.blocks, ctx_kv):
            x = blk(x, p, mask, k_extra=k, v_extra=v, k_first=True)
        return x.reshape(B, nb, K1, -1)

    def base_logits(self, target, s):
        return F.linear(self.norm(s), target.embed.weight)

    def markov_bias(self, prev):
        """Logit bias of a position from the previous token only (low rank)."""
        return self.mk_out(self.mk_emb(prev))

    def conf_logit(self, s, prev):
        # detached inputs: the confidence head reads the drafter, it must not reshape it
        return self.conf(torch.cat([s.detach(), self.mk_emb(prev).detach()], -1))[..., 0]

    def loss(self, target, tokens, hs, tlogits):
        B, T = tokens.shape
        K = self.dcfg.K
        nb = min(self.dcfg.anchors, T - K - 1)
        anchors = torch.randperm(T - K - 1)[:nb].sort().values + 1          # t in 1..T-K-1
        c = self.ctx(target, hs)
        cpos = torch.arange(T)[None].expand(B, T)
        ctx_kv = [blk.attn.kv(blk.n1(c), cpos) for blk in self.blocks]
        qpos = anchors[:, None] + torch.arange(K + 1)[None]                  # (nb, K+1)
        ctx_mask = (torch.arange(T)[None, None, :] < anchors[:, None, None]).expand(nb, K + 1, T)
        ctx_mask = ctx_mask.reshape(1, 1, nb * (K + 1), T)
        s = self.backbone(target, target.embed(tokens[:, anchors]), qpos[None].expand(B, nb, K + 1),
                          ctx_kv, ctx_mask)[:, :, 1:]                       # (B, nb, K, d)
        logits = self.base_logits(target, s)
        tpos = anchors[:, None] + torch.arange(K)[None]                      # teacher predicts x_{t+j} at t+j-1
        p = torch.softmax(tlogits[:, tpos], -1)                              # (B, nb, K, V)
        extra = {}
        if self.spark:
            prev = tokens[:, tpos]                                           # x_{t+j-1}: anchor, then data
            logits = logits + self.markov_bias(prev)
            with torch.no_grad():
                alpha = 1.0 - 0.5 * (torch.softmax(logits, -1) - p).abs().sum(-1)
            cl = F.binary_cross_entropy_with_logits(self.conf_logit(s, prev), alpha.clamp(0, 1))
            extra["conf_bce"] = cl
        loss = soft_ce(logits, p)
        if self.spark:
            loss = loss + extra["conf_bce"]
        return loss, extra

def propose_parallel(m: ParallelDrafter, target, anchor, t0, cache, K, temperature, gen):
    """One parallel block for B requests: anchor (B,) pending token at position t0 (B,), cache[l] = (k, v) context
    keys (B, Hkv, Tc, hd) of drafter layer l (positions j < t0 visible). Returns (d (B,K), q (B,K,V), conf (B,K),
    logits (B,K,V)); dspark samples left to right because of the Markov bias (the only sequential part)."""
    B = anchor.shape[0]
    Tc = cache[0][0].shape[2]
    dev = anchor.device
    pos = (t0[:, None] + torch.arange(K + 1, device=dev)[None])[:, None]                 # (B, 1, K+1)
    ctx_mask = (torch.arange(Tc, device=dev)[None, None, None, :] < t0[:, None, None, None]).expand(B, 1, K + 1, Tc)
    s = m.backbone(target, target.embed(anchor)[:, None], pos, cache, ctx_mask)[:, 0, 1:]
    base = m.base_logits(target, s)                                                      # (B, K, V)
    if not m.spark:
        d, q = sample(base, temperature, gen)
        conf = q.gather(-1, d[..., None])[..., 0]
        return d, q, conf, base
    toks, probs, confs, logits = [], [], [], []
    prev = anchor
    for k in range(K):
        logits.append(base[:, k] + m.markov_bias(prev))
        tok, p = sample(logits[-1], temperature, gen)
        confs.append(torch.sigmoid(m.conf_logit(s[:, k], prev)))
        toks.append(tok)
        probs.append(p)
        prev = tok
    return torch.stack(toks, 1), torch.stack(probs, 1), torch.stack(confs, 1), torch.stack(logits, 1)


def build_drafter(tcfg: ModelConfig, dcfg: DrafterConfig) -> nn.Module:
    return ARDrafter(tcfg, dcfg) if dcfg.kind in ("mtp1", "eagle3") else ParallelDrafter(tcfg, dcfg)
