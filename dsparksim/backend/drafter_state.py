"""Per-slot decoding state of the drafters, fed with the target's hidden states.

One state object holds every request ("slot") a decoder serves: the single-process speculative decoder
(:mod:`.specdec`, request b = slot b, through :func:`batch_runtime`) and the batched real engine
(:mod:`dsparksim.runner.live`, flat variable-length updates) both use it, so drafting has one implementation.

``observe`` consumes a flat run of tokens per updated slot: the target's features of tokens at (slot, pos), the
token that follows each, and the flat index of each slot's last token (its successor becomes the next anchor).
``propose`` drafts K tokens for a set of slots.
"""
from __future__ import annotations

import torch

from dsparksim.backend.drafters import ARDrafter, ParallelDrafter, propose_ar, propose_parallel


def _grow(x: torch.Tensor | None, old: int, new: int, shape, dtype, dev) -> torch.Tensor:
    """A (new, *shape) zero tensor with x's first ``old`` slots copied in (per-slot state grows on demand)."""
    y = torch.zeros((new, *shape), dtype=dtype, device=dev)
    if x is not None and old:
        y[:old] = x
    return y


class ParallelState:
    """Per-slot state of a dflash/dspark drafter: context keys/values per drafter layer (slots, Hkv, T, hd) from
    the target's fused features, the anchor (pending) token and its position t0 (context j < t0 visible)."""

    def __init__(self, m: ParallelDrafter, target, slots: int, T: int, dev, dtype):
        c = target.cfg
        self.m, self.t, self.T, self.dev, self.dtype = m, target, T, dev, dtype
        self.shape = (c.n_kv_heads, T, c.head_dim)
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []
        self.slots = 0
        self.anchor = torch.zeros(0, dtype=torch.long, device=dev)
        self.t0 = torch.zeros(0, dtype=torch.long, device=dev)
        self.last_logits = None        # (n, K, V) of the last propose (inspection)
        self.ensure(slots)

    def ensure(self, slots: int) -> None:
        if slots <= self.slots:
            return
        old, new = self.slots, max(slots, 2 * self.slots)
        nl = len(self.m.blocks)
        self.k = [_grow(self.k[i] if self.k else None, old, new, self.shape, self.dtype, self.dev) for i in range(nl)]
        self.v = [_grow(self.v[i] if self.v else None, old, new, self.shape, self.dtype, self.dev) for i in range(nl)]
        self.anchor = _grow(self.anchor, old, new, (), torch.long, self.dev)
        self.t0 = _grow(self.t0, old, new, (), torch.long, self.dev)
        self.slots = new

    def fake_prefill(self, slots: torch.Tensor, lens: torch.Tensor, pending: torch.Tensor) -> None:
        """Profiling: pretend ``lens`` context tokens were observed (cache values do not change the cost)."""
        self.anchor[slots] = pending
        self.t0[slots] = lens

    def observe(self, hs: list[torch.Tensor], slot_tok, pos, next_tok, last_idx, last_slot) -> None:
        """Features of tokens at (slot_tok, pos) (flat hs [(m, d)] per target layer); the token after each is
        next_tok; last_idx (r,) flat index of each updated slot's last token (its next token becomes the anchor)."""
        c = self.m.ctx(self.t, hs)[None]                                  # (1, m, d)
        for blk, ck, cv in zip(self.m.blocks, self.k, self.v):
            k, v = blk.attn.kv(blk.n1(c), pos[None])                      # (1, Hkv, m, hd)
            ck[slot_tok, :, pos] = k[0].transpose(0, 1).to(ck.dtype)
            cv[slot_tok, :, pos] = v[0].transpose(0, 1).to(cv.dtype)
        self.anchor[last_slot] = next_tok[last_idx]
        self.t0[last_slot] = pos[last_idx] + 1

    def propose(self, slots: torch.Tensor, K: int, temperature: float, gen):
        t0 = self.t0[slots]
        Tc = int(t0.max())
        cache = [(ck[slots, :, :Tc], cv[slots, :, :Tc]) for ck, cv in zip(self.k, self.v)]
        d, q, conf, self.last_logits = propose_parallel(self.m, self.t, self.anchor[slots], t0, cache, K,
                                                        temperature, gen)
        return d, q, conf


class ARState:
    """Per-slot state of an mtp1/eagle3 drafter: its one block's cache (slots, Hkv, T, hd), the drafter state h at
    the origin (the last processed position) and the origin."""

    def __init__(self, m: ARDrafter, target, slots: int, T: int, dev, dtype):
        c = target.cfg
        self.m, self.t, self.T, self.dev, self.dtype = m, target, T, dev, dtype
        self.shape = (c.n_kv_heads, T, c.head_dim)
        self.d = c.d_model
        self.slots = 0
        self.ck = self.cv = self.h = self.origin = None
        self.ensure(slots)

    def ensure(self, slots: int) -> None:
        if slots <= self.slots:
            return
        old, new = self.slots, max(slots, 2 * self.slots)
        self.ck = _grow(self.ck, old, new, self.shape, self.dtype, self.dev)
        self.cv = _grow(self.cv, old, new, self.shape, self.dtype, self.dev)
        self.h = _grow(self.h, old, new, (self.d,), self.dtype, self.dev)
        self.origin = _grow(self.origin, old, new, (), torch.long, self.dev)
        self.slots = new

    def fake_prefill(self, slots: torch.Tensor, lens: torch.Tensor, pending: torch.Tensor) -> None:
        self.origin[slots] = lens - 1

    def observe(self, hs, slot_tok, pos, next_tok, last_idx, last_slot) -> None:
        m = self.m
        x = m.step_in(self.t, next_tok, m.feat(self.t, hs))               # (m, d)
        lo = torch.cat([torch.zeros(1, dtype=torch.long, device=self.dev), last_idx[:-1] + 1])
        lens = last_idx - lo + 1
        # one padded causal pass per bucket of runs: short (decode) runs together, long (prompt) runs together,
        # so a prompt chunk never pads the decode runs to its length
        short = lens <= 16
        for sel in (torch.nonzero(short)[:, 0], torch.nonzero(~short)[:, 0]):
            if sel.numel():
                self._pass(x, pos, lo[sel], lens[sel], last_idx[sel], last_slot[sel])

    def _pass(self, x, pos, lo, lens, last_idx, last_slot) -> None:
        m = self.m
        r, Lmax = lens.numel(), int(lens.max())
        j = torch.arange(Lmax, device=self.dev)
        src = (lo[:, None] + j[None]).clamp_max(x.shape[0] - 1)
        valid = j[None] < lens[:, None]
        X = x[src] * valid[..., None]
        # pads sit after each run's last position (never visible to a valid query); clamp inside the slot
        P = torch.where(valid, pos[src], pos[last_idx][:, None] + 1 + j[None] - lens[:, None]).clamp_max(self.T - 1)
        ck, cv = self.ck[last_slot], self.cv[last_slot]                    # (r, Hkv, T, hd) copies
        h = m.block.forward_cached(X.to(self.dtype), P, ck, cv)
        self.ck[last_slot], self.cv[last_slot] = ck, cv
        self.h[last_slot] = h[torch.arange(r, device=self.dev), lens - 1]
        self.origin[last_slot] = pos[last_idx]

    def propose(self, slots: torch.Tensor, K: int, temperature: float, gen):
        h = self.h[slots]
        return propose_ar(self.m, self.t, h, self.origin[slots], self.m.logits(self.t, h), self.ck[slots],
                          self.cv[slots], K, temperature, gen)


def state_for(drafter, target, slots: int, T: int, dev=None, dtype=None):
    """The per-slot state matching ``drafter`` (parallel: dflash/dspark; autoregressive: mtp1/eagle3)."""
    w = target.embed.weight
    cls = ARState if isinstance(drafter, ARDrafter) else ParallelState
    return cls(drafter, target, slots, T, dev if dev is not None else w.device, dtype if dtype is not None else w.dtype)


class BatchRuntime:
    """The batch API of the single-process decoder over a per-slot state: request b is slot b.

    ``update(hs, next_tok, start, last_idx)``: hs [(B, n, d)] per target layer for tokens at positions
    start[b] + 0..n-1, next_tok (B, n) the token after each, last_idx (B,) the last valid token of each request
    (later columns are padding and are not consumed).
    """

    def __init__(self, state, B: int):
        self.state = state
        self.slots = torch.arange(B, device=state.dev)

    def update(self, hs, next_tok, start, last_idx) -> None:
        B, n = next_tok.shape
        keep = torch.arange(n, device=next_tok.device)[None] <= last_idx[:, None]      # (B, n)
        b, j = keep.nonzero(as_tuple=True)                                               # request-major runs
        last = torch.cumsum(keep.sum(1), 0) - 1
        self.state.observe([h[b, j] for h in hs], self.slots[b], start[b] + j, next_tok[b, j], last, self.slots)

    def propose(self, K: int, temperature: float, gen):
        return self.state.propose(self.slots, K, temperature, gen)

    # inspection (tests): the state of the B requests
    def __getattr__(self, name):
        st = self.__dict__["state"]
        if name == "logits1":
            return st.m.logits(st.t, st.h[: len(self.slots)])
        if name in ("h", "ck", "cv"):
            return getattr(st, name)[: len(self.slots)]
        if name == "last_logits":
            return st.last_logits
        raise AttributeError(name)


def batch_runtime(drafter, target, B: int, T: int) -> BatchRuntime:
    """Decoding state for B requests of at most T positions of ``drafter`` (request b = slot b)."""
    return BatchRuntime(state_for(drafter, target, B, T), B)
