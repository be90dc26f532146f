"""Distribution audit: do the generated tokens follow the target's sampling distribution under a policy?

A batch of B requests decodes for ``steps`` speculative steps with a known Markov target p(x | prev) and a
known Markov drafter q(x | prev) over a small vocabulary. Each step: the drafter samples K tokens per request
from q; the confidences follow the DSpark head's form — c[i,k] is a function of the token at position k-1 (the
anchor for k=1), known before token k is sampled; the policy under audit picks L[i] from the very StepContext
the engines build (survival, base_tokens, step_time from an SPS table); rejection sampling then verifies the
first L[i] drafts exactly as :func:`dsparksim.backend.specdec.verify` does (accept d with prob min(1, p/q);
at the first rejection sample the normalised residual max(0, p - q); if all L accepted, the bonus from p).

Test: every emitted token x_t follows p(. | x_{t-1}) if and only if the pipeline is lossless. The transition
counts (prev -> next) pooled over the run are compared with p by Pearson's chi-square (sum over prev contexts,
V-1 degrees of freedom each); ``p_value`` small = biased.

Settings: ``appendix_a`` is the paper's counterexample (one request, K=2, c1 = 0.8, c2 high only when token 1
came out as the drafter's favourite, SPS(1)=1.0, SPS(2)=0.5, SPS(3)=0.45): a global search on current
confidences admits token 1 only when its own realisation makes c2 high, which skews the output towards that
token. ``batch`` is a richer lossless check (3 requests, K=3, V=3, a jagged staircase).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

from dsparksim.policies import make_policy
from dsparksim.policies.base import StepContext
from dsparksim.policies.recalibrate import Recalibrating


@dataclass(frozen=True)
class AuditSetting:
    name: str
    p: np.ndarray          # (V, V) target p(next | prev)
    q: np.ndarray          # (V, V) drafter q(next | prev)
    conf: np.ndarray       # (V, K) c_k as a function of the token at position k-1
    B: int
    K: int
    sps: np.ndarray        # SPS at M = 1..len(sps)


def appendix_a() -> AuditSetting:
    # token 0 = the drafter's favourite: q(0) = 0.9 but p(0) = 0.5; c1 = 0.8; c2 = 0.9 if token 1 == 0 else 0.1
    p = np.array([[0.5, 0.5], [0.5, 0.5]])
    q = np.array([[0.9, 0.1], [0.9, 0.1]])
    conf = np.array([[0.8, 0.9], [0.8, 0.1]])   # row = token at k-1; for k=1 the anchor, whose row has c1=0.8
    return AuditSetting("appendix_a", p, q, conf, B=1, K=2, sps=np.array([1.0, 0.5, 0.45]))


def batch_setting() -> AuditSetting:
    p = np.array([[0.6, 0.3, 0.1], [0.2, 0.5, 0.3], [0.3, 0.3, 0.4]])
    q = np.array([[0.8, 0.1, 0.1], [0.1, 0.8, 0.1], [0.2, 0.2, 0.6]])
    conf = np.array([[0.9, 0.6, 0.3], [0.5, 0.9, 0.7], [0.7, 0.4, 0.8]])
    M = np.arange(1, 3 * 4 + 1)
    sps = 1.0 / (1.0 + 0.15 * np.ceil(M / 3) + 0.05 * (M % 2))   # a jagged staircase
    return AuditSetting("batch", p, q, conf, B=3, K=3, sps=sps)


SETTINGS = {"appendix_a": appendix_a, "batch": batch_setting}


def _sample_rows(P: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One categorical draw per row of P (rows sum to 1)."""
    u = rng.random(P.shape[0])[:, None]
    return np.minimum((np.cumsum(P, 1) < u).sum(1), P.shape[1] - 1)


def run_audit(policy_spec: str, setting: AuditSetting, steps: int, seed: int, recalibrate: bool = False) -> dict:
    """Decode ``steps`` steps under the policy (wrapped in online recalibration when ``recalibrate``: the
    ``--recalibrate`` of a run); return counts, chi-square statistic, dof and p-value."""
    rng = np.random.default_rng(seed)
    S = setting
    V, K, B = S.p.shape[0], S.K, S.B
    pol = make_policy(policy_spec)
    if recalibrate:
        pol = Recalibrating(pol)
        policy_spec = pol.spec
    Kp = int(pol.block_size or K)
    pol.reset(Kp, np.random.default_rng(seed + 1))
    T = 1.0 / S.sps

    def step_time(M: np.ndarray) -> np.ndarray:
        return T[np.asarray(M) - 1]

    counts = np.zeros((V, V), np.int64)
    prev = rng.integers(0, V, B)                # last emitted token of each request (the anchor)
    ids = np.arange(B)
    Ls = []
    for _ in range(steps):
        d = np.zeros((B, Kp), np.int64)
        qd = np.zeros((B, Kp))
        conf = np.zeros((B, Kp))
        last = prev.copy()
        for k in range(Kp):
            conf[:, k] = S.conf[last, k]         # known before token k is sampled
            d[:, k] = _sample_rows(S.q[last], rng)
            qd[:, k] = S.q[last, d[:, k]]
            last = d[:, k]
        ctx = StepContext(conf=conf, survival=np.cumprod(conf, 1), request_ids=ids, base_tokens=B,
                          step_time=step_time, max_tokens=len(S.sps))
        L = np.asarray(pol.choose(ctx), np.int64)
        Ls.append(L.mean())
        a = np.zeros(B, np.int64)
        for i in range(B):
            x = prev[i]
            out = []
            acc = 0
            for k in range(L[i]):
                pk = S.p[x, d[i, k]]
                if rng.random() * qd[i, k] < pk:   # accept with prob min(1, p/q)
                    out.append(d[i, k])
                    x = d[i, k]
                    acc += 1
                    continue
                resid = np.maximum(S.p[x] - S.q[x], 0.0)
                out.append(int(_sample_rows((resid / resid.sum())[None], rng)[0]))
                break
            else:
                out.append(int(_sample_rows(S.p[x][None], rng)[0]))   # bonus from p
            a[i] = acc
            y = prev[i]
            for tok in out:
                counts[y, tok] += 1
                y = tok
            prev[i] = y
        pol.observe(ids, L, a)
    n_ctx = counts.sum(1)
    exp = n_ctx[:, None] * S.p
    live = n_ctx > 0
    chi2 = float((((counts - exp) ** 2) / np.where(exp > 0, exp, 1))[live].sum())
    dof = int(live.sum() * (V - 1))
    return {"policy": policy_spec, "setting": S.name, "steps": steps, "seed": seed, "tokens": int(counts.sum()),
            "chi2": chi2, "dof": dof, "p_value": float(stats.chi2.sf(chi2, dof)), "mean_L": float(np.mean(Ls)),
            "freq": (counts / np.maximum(n_ctx[:, None], 1)).round(4).tolist(), "target": S.p.tolist()}


LOSSLESS = ("mtp1", "fixed:7", "fixed:2", "threshold:0.5", "goodput", "confidence", "confidence-async:2")


RECALIBRATED = ("threshold:0.5", "confidence", "confidence-async:2")   # the lossless confidence readers


def audit_all(steps: int = 6000, seed: int = 0, policies=LOSSLESS + ("confidence-global",),
              settings=("appendix_a", "batch"), recalibrate: bool = False) -> list[dict]:
    """Every policy in every setting (mtp1 runs with K=1 by construction); ``recalibrate``: each wrapped in
    online recalibration (dsparksim.policies.recalibrate)."""
    return [run_audit(p, SETTINGS[s](), steps, seed, recalibrate) for s in settings for p in policies]
