"""Exact speculative decoding (batched over independent requests; one request = batch of one).

Each step: the drafter proposes K tokens with the distributions q_k they were sampled from; the target scores
``[pending, d_1..d_K]`` in one cached forward pass; standard rejection sampling accepts d_k with probability
min(1, p_k(d_k) / q_k(d_k)) left to right; at the first rejection the correction token is drawn from the
normalised residual max(0, p_k - q_k); if all K are accepted the bonus token is drawn from p_{K+1}.
Temperature 0: drafts are argmax, a draft is accepted iff it equals the target's argmax, and the
correction/bonus is the target's argmax, so the output is the target's greedy decode token for token.

All K draft tokens are always verified, so each step records the accepted prefix length A (0..K) "had all K
been verified" — exactly what an acceptance trace stores — together with the drafter's K confidences.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from dsparksim.backend.drafter_state import batch_runtime
from dsparksim.backend.drafters import sample


@dataclass
class DecodeResult:
    accepted: np.ndarray        # (B, steps) int: A per block
    conf: np.ndarray            # (B, steps, K) raw confidences
    tokens: list[list[int]]     # generated tokens per request (prompt excluded)


def verify(logits: torch.Tensor, d: torch.Tensor, q: torch.Tensor, temperature: float,
           gen: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Rejection sampling. logits (B, K+1, V) of the target at [pending, d_1..d_K]; d (B, K) drafts drawn from
    q (B, K, V). Returns (A (B,), the correction/bonus token (B,))."""
    return verify_prefix(logits, d, q, torch.full((d.shape[0],), d.shape[1], dtype=torch.long, device=d.device),
                         temperature, gen)


def verify_prefix(logits: torch.Tensor, d: torch.Tensor, q: torch.Tensor, L: torch.Tensor, temperature: float,
                  gen: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Rejection sampling of only the first L[i] drafts of request i (the scheduler's verify length, 0..K).

    logits (B, K+1, V): the target at [pending, d_1..d_K] (rows past L[i] are never read); d (B, K); q (B, K, V).
    Returns (a (B,) accepted prefix <= L, the correction token at the first rejection, or the bonus token drawn
    from the target at position L[i] when all L[i] drafts pass). Verifying a prefix is still exact: the drafts
    past L are simply not proposed, so the bonus position sees q = 0 and samples the target itself.
    """
    B, K = d.shape
    b = torch.arange(B, device=d.device)
    live = torch.arange(K, device=d.device)[None, :] < L[:, None]
    if temperature == 0:
        g = logits.argmax(-1)
        A = ((d == g[:, :K]) & live).long().cumprod(1).sum(1)
        return A, g[b, A]
    p = torch.softmax(logits.float() / temperature, -1)
    pd = p[:, :K].gather(-1, d[..., None])[..., 0]
    qd = q.float().gather(-1, d[..., None])[..., 0]
    u = torch.rand(B, K, generator=gen, device=d.device)
    acc = (u * qd < pd) & live                          # u < p/q without dividing (q(d) > 0: d was drawn from q)
    A = acc.long().cumprod(1).sum(1)
    qpad = torch.cat([q.float(), torch.zeros_like(q[:, :1], dtype=torch.float32)], 1)
    qA = qpad[b, A] * (A < L)[:, None]                  # past the verified prefix q = 0: the bonus comes from p
    resid = (p[b, A] - qA).clamp_min(0)
    z = resid.sum(-1, keepdim=True)
    # p == q exactly at a rejected position has probability 0; fall back to p to stay well defined
    dist = torch.where(z > 0, resid / z.clamp_min(1e-30), p[b, A])
    new = torch.multinomial(dist, 1, generator=gen)[:, 0]
    return A, new


@torch.no_grad()
def speculative_generate(target, drafter, prompts: list[list[int]], K: int, steps: int, temperature: float,
                         gen: torch.Generator | None = None) -> DecodeResult:
    """Run ``steps`` speculative-decoding steps for each prompt (independent requests decoded side by side)."""
    if K < 1:
        raise ValueError("K must be >= 1")
    B = len(prompts)
    lens = torch.tensor([len(p) for p in prompts])
    if (lens < 1).any():
        raise ValueError("every prompt needs at least one token")
    P = int(lens.max())
    T = P + steps * (K + 1) + K + 2
    tok = torch.zeros(B, P, dtype=torch.long)
    for i, p in enumerate(prompts):
        tok[i, : len(p)] = torch.tensor(p)
    cache = target.new_cache(B, T)
    b = torch.arange(B)
    hs, logits = target.forward_cached(tok, torch.arange(P)[None].expand(B, P), cache)
    pending, _ = sample(logits[b, lens - 1], temperature, gen)
    nxt = torch.cat([tok[:, 1:], torch.zeros(B, 1, dtype=torch.long)], 1)
    nxt[b, lens - 1] = pending
    rt = batch_runtime(drafter, target, B, T)
    rt.update(hs, nxt, torch.zeros(B, dtype=torch.long), lens - 1)
    t = lens.clone()                                     # position of the pending token
    out = [[int(x)] for x in pending]
    acc = np.zeros((B, steps), np.int64)
    confs = np.zeros((B, steps, K))
    for s in range(steps):
        d, q, conf = rt.propose(K, temperature, gen)
        vt = torch.cat([pending[:, None], d], 1)
        hs, logits = target.forward_cached(vt, t[:, None] + torch.arange(K + 1)[None], cache)
        A, new = verify(logits, d, q, temperature, gen)
        nxt = torch.cat([d, torch.zeros(B, 1, dtype=torch.long)], 1)
        nxt[b, A] = new
        rt.update(hs, nxt, t, A)
        acc[:, s] = A.numpy()
        confs[:, s] = conf.double().numpy()
        dl = d.tolist()
        for i in range(B):
            a = int(A[i])
            out[i].extend(dl[i][:a] + [int(new[i])])
        pending = new
        t = t + A + 1
    return DecodeResult(acc, confs, out)


@torch.no_grad()
def greedy_reference(target, prompt: list[int], n: int) -> list[int]:
    """The target's greedy decode by full recomputation (no cache): the reference for temperature 0."""
    seq = list(prompt)
    for _ in range(n):
        _, logits = target(torch.tensor([seq]))
        seq.append(int(logits[0, -1].argmax()))
    return seq[len(prompt):]
