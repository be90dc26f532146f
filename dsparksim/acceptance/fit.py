"""Fit the parametric model's heterogeneity, easy/hard link and confidence noise to the paper's Figs. 5 and 6.

Targets (dsparksim/data/dspark_acceptance.json, DSpark on Qwen3-4B, K = 7):

* Fig. 5, static survival threshold t in {0.5, 0.7, 0.9} per domain, read as ratios to t = 0 (the paper's counts
  include the bonus token): accepted tokens per step and verified slots per step;
* Fig. 6, AUC of the survival by position (1, 3, 5, 7), DeepSpec's definition
  (:func:`dsparksim.acceptance.confidence.per_position_metrics`), pooled over the three domains.

Everything is measured the way a long-output run measures it: step-weighted. The request shift u sits on
Gauss-Hermite nodes; at each node ``blocks`` blocks with common random numbers (deterministic in the parameters)
give E[tokens | u] and E[verified | u] for each rule, and a node's steps per output token are 1 / E[tokens | u].
Confidences are the model's own (simulator-applied STS by default), so the fit sees what a run sees.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from dsparksim.acceptance.base import DOMAINS
from dsparksim.errors import ConfigError
from dsparksim.acceptance.calibration import gauss_hermite, link, tau_of_curve
from dsparksim.acceptance.confidence import per_position_metrics
from dsparksim.acceptance.parametric import ParametricAcceptance, ParametricParams, sigmoid
from dsparksim.acceptance.reference import load_reference, paper_curve
from dsparksim.acceptance.rootfind import brentq

THRESHOLDS = (0.5, 0.7, 0.9)
AUC_POSITIONS = (1, 3, 5, 7)
RAW_ECE_TARGET = 0.055          # middle of the paper's raw-confidence ECE range, 3-8%


def fig5_ratio_targets() -> dict[str, dict[str, list[float]]]:
    """{domain: {"accepted": [r(0.5), r(0.7), r(0.9)], "verified": [...]}} as ratios to threshold 0."""
    sw = load_reference()["static_threshold_sweep_dspark_qwen3_4b"]
    out = {}
    for d in DOMAINS:
        out[d] = {k: [v / sw[d][k][0] for v in sw[d][k][1:]] for k in ("accepted", "verified")}
    return out


def fig5_curves(K: int = 7) -> dict[str, np.ndarray]:
    """DSpark's per-domain curves rescaled to the benchmark Fig. 5 was run on.

    Fig. 5's accepted tokens at t = 0 (6.11, 5.38, 3.64) are Table 1's gsm8k, humaneval and mt-bench columns, not
    the domain means (5.57, 5.12, 3.49): the sweep ran on one benchmark per domain. Each domain's rejection
    probabilities 1 - alpha_k are scaled by one factor so that 1 + sum prod alpha equals that tau (the shape of
    Fig. 2's curve kept), and the Fig. 5 ratios are compared on that model."""

    sw = load_reference()["static_threshold_sweep_dspark_qwen3_4b"]
    out = {}
    for d in DOMAINS:
        a = paper_curve("dspark", d, K)[0]
        tau = float(sw[d]["accepted"][0])
        c = brentq(lambda c: tau_of_curve(1.0 - c * (1.0 - a)) - tau, 1e-6, 1.0 / (1.0 - a.min()) - 1e-9)
        out[d] = 1.0 - c * (1.0 - a)
    return out


def fig6_auc_targets() -> dict[int, float]:
    q = load_reference()["confidence_head_quality"]["auc_by_position"]
    return {int(k): float(v) for k, v in q.items()}


class _Sample:
    """Common random numbers for one domain: (n_u nodes, blocks, K)."""

    def __init__(self, K: int, n_u: int, blocks: int, rng: np.random.Generator) -> None:
        self.xu, self.wu = gauss_hermite(n_u)
        self.zb = rng.standard_normal((n_u, blocks))
        self.zt = rng.standard_normal((n_u, blocks, K))
        self.un = rng.random((n_u, blocks, K))
        self.zn = rng.standard_normal((n_u, blocks, K))
        self.znb = rng.standard_normal((n_u, blocks, 1))


def evaluate(params: ParametricParams, *, drafter: str = "dspark", K: int = 7, n_u: int = 16, blocks: int = 1500,
             seed: int = 0, samples: dict | None = None, confidence: str = "sts",
             benchmark_curves: bool = True) -> dict[str, Any]:
    """Step-weighted Fig. 5 ratios per domain and pooled per-position ECE / AUC (fixed:K, all verified), for DSpark
    on the curves of Fig. 5's benchmarks (:func:`fig5_curves`; ``benchmark_curves=False``: the domain means)."""
    if benchmark_curves and drafter == "dspark":
        model = ParametricAcceptance(fig5_curves(K), K, drafter=drafter, params=params, confidence=confidence,
                                     source="Fig. 5 benchmarks")
    else:
        model = ParametricAcceptance.from_paper(drafter, K, params, confidence=confidence)
    if samples is None:
        rng = np.random.default_rng(seed)
        samples = {d: _Sample(K, n_u, blocks, rng) for d in DOMAINS}
    p = params
    ratios, confs, accs, wts = {}, [], [], []
    for d in DOMAINS:
        s = samples[d]
        mu = model.mu(d)
        shift = (p.sigma_req * s.xu)[:, None, None] * model._load + (p.sigma_block * s.zb)[:, :, None]
        x = link(mu + shift + p.sigma_tok * s.zt, p.shape)
        ok = s.un < sigmoid(x)
        A = np.where(ok.all(axis=2), K, ok.argmin(axis=2))                          # (n_u, B)
        conf = sigmoid((x + model._noise * s.zn + p.noise_block * s.znb) * model._scale)
        surv = np.cumprod(conf, axis=2)
        tok0 = (A + 1).mean(axis=1)                                                  # E[tokens | u], all verified
        step_w = s.wu / tok0                                                         # steps per token at u
        pooled = {}
        for t in (0.0, *THRESHOLDS):
            L = (surv >= t).sum(axis=2) if t > 0 else np.full_like(A, K)
            tok = (np.minimum(L, A) + 1).mean(axis=1)
            ver = (L + 1).mean(axis=1)
            w = s.wu / tok
            pooled[t] = (s.wu.sum() / w.sum(), (w * ver).sum() / w.sum())
        ratios[d] = {"accepted": [pooled[t][0] / pooled[0.0][0] for t in THRESHOLDS],
                     "verified": [pooled[t][1] / pooled[0.0][1] for t in THRESHOLDS],
                     "tau": pooled[0.0][0]}
        B = A.shape[1]
        confs.append(conf.reshape(-1, K))
        accs.append(A.ravel())
        wts.append(np.repeat(step_w / step_w.sum() / B, B))                          # equal domain shares
    q = per_position_metrics(np.vstack(confs), np.concatenate(accs), np.concatenate(wts))
    return {"ratios": ratios, "auc_by_position": q["auc_by_position"], "ece_by_position": q["ece_by_position"],
            "ece_mean": float(np.mean(list(q["ece_by_position"].values()))),
            "sts_temperatures": None if model.sts_temperatures is None else list(model.sts_temperatures)}


def residuals(ev: dict[str, Any]) -> dict[str, float]:
    """Model minus paper for every Fig. 5 ratio and Fig. 6 AUC (keys like 'math acc t=0.9', 'AUC pos 7')."""
    out = {}
    for d, tg in fig5_ratio_targets().items():
        for kind, short in (("accepted", "acc"), ("verified", "ver")):
            for t, m, p in zip(THRESHOLDS, ev["ratios"][d][kind], tg[kind]):
                out[f"{d} {short} t={t:g}"] = m - p
    for k, a in fig6_auc_targets().items():
        out[f"AUC pos {k}"] = ev["auc_by_position"][k] - a
    return out


def relative_residuals(ev: dict[str, Any]) -> dict[str, float]:
    """Fig. 5 ratios as model / paper - 1 (same keys as :func:`residuals`, Fig. 5 only)."""
    out = {}
    for d, tg in fig5_ratio_targets().items():
        for kind, short in (("accepted", "acc"), ("verified", "ver")):
            for t, m, p in zip(THRESHOLDS, ev["ratios"][d][kind], tg[kind]):
                out[f"{d} {short} t={t:g}"] = m / p - 1.0
    return out


# The objective. The issue-29 criteria are the t = 0.9 ratios of math and chat (within 10%, relative) and the
# Fig. 6 AUC by position (within 0.05), with STS ECE <= 0.02: each such residual enters as (r / tol)^2 plus a steep
# hinge past 0.8 tol. Code at t = 0.9 and every t = 0.5 / 0.7 ratio enter with small weights: a calibrated head
# cannot keep math's 98% of verified slots at t = 0.5 (the mean survival at position 7 is 0.44, so most of those
# slots would need a survival just above 0.5, and Fig. 6's AUC would collapse); they are reported, not chased.
FIG5_REL_TOL = 0.10
AUC_TOL = 0.05
ECE_TOL = 0.02
HINGE_AT, HINGE_WEIGHT = 0.8, 10.0
W_CODE_T09, W_OTHER_T = 0.3, 0.01
CRITERIA_DOMAINS = ("math", "chat")


def _scaled(r: float, tol: float) -> float:
    q = abs(r) / tol
    return q * q + HINGE_WEIGHT * max(0.0, q - HINGE_AT) ** 2


def _objective(ev: dict[str, Any], auc_weight: float = 1.0) -> float:
    """Tolerance-scaled squared residuals (see the comment above); ``auc_weight`` scales the AUC terms."""
    v = 0.0
    for k, r in relative_residuals(ev).items():
        if k.endswith("t=0.9") and k.split()[0] in CRITERIA_DOMAINS:
            v += _scaled(r, FIG5_REL_TOL)
        else:
            v += (W_CODE_T09 if k.endswith("t=0.9") else W_OTHER_T) * r * r
    v += auc_weight * sum(_scaled(r, AUC_TOL) for k, r in residuals(ev).items() if k.startswith("AUC"))
    return float(v + HINGE_WEIGHT * max(0.0, ev["ece_mean"] / ECE_TOL - HINGE_AT) ** 2)


SHARE_CLIP = (0.02, 0.98)   # request share / loading a fit may start from (their logits stay finite)


def _expit(v: float) -> float:
    return float(1.0 / (1.0 + np.exp(-v)))


def _logit_clipped(v: float) -> float:
    v = float(np.clip(v, *SHARE_CLIP))
    return float(np.log(v / (1.0 - v)))


def _params_of(theta: np.ndarray, base: ParametricParams, fit_share: bool = False,
               fit_load: bool = False) -> ParametricParams:
    """Parameters of a fit vector: 8 coordinates (sigma_req = sigma_block; req_load as in ``base``), then the
    logit of req_load if ``fit_load``, then the logit of the request share sigma_req / sigma_shared if
    ``fit_share`` (sigma_block takes the rest of sigma_shared^2)."""
    sh, st, sl, j, n1, n7, se = np.exp(theta[[0, 1, 3, 4, 5, 6, 7]])
    extra = list(theta[8:])
    load = _expit(extra.pop(0)) if fit_load else base.req_load
    share = _expit(extra.pop(0)) if fit_share else 1.0 / np.sqrt(2.0)
    return replace(base, sigma_req=sh * share, sigma_block=sh * np.sqrt(1.0 - share * share), sigma_tok=st,
                   offset=float(theta[2]), slope=sl, jump=j, noise_sd=n1, noise_sd_end=n7, slope_easy=se,
                   req_load=load)


def _theta_of(p: ParametricParams, fit_share: bool = False, fit_load: bool = False) -> np.ndarray:
    """The fit vector of ``p`` (see :func:`_params_of`)."""
    n7 = p.noise_sd if p.noise_sd_end is None else p.noise_sd_end
    theta = [np.log(p.sigma_shared), np.log(p.sigma_tok), p.offset, np.log(p.slope), np.log(max(p.jump, 0.05)),
             np.log(max(p.noise_sd, 0.05)), np.log(max(n7, 0.05)), np.log(p.slope_easy)]
    if fit_load:
        theta.append(_logit_clipped(p.req_load))
    if fit_share:
        theta.append(_logit_clipped(p.sigma_req / p.sigma_shared if p.sigma_shared > 0 else 0.5))
    return np.array(theta)


def fit(base: ParametricParams | None = None, *, auc_weight: float = 1.0, maxfev: int = 200, seed: int = 0,
        n_u: int = 16, blocks: int = 1500, fit_share: bool = False, fit_load: bool = False,
        log=print) -> tuple[ParametricParams, dict[str, Any]]:
    """Nelder-Mead on (log sigma_shared, log sigma_tok, offset, log slope, log jump, log noise_sd, log noise_sd_end,
    log slope_easy) (sigma_req = sigma_block, the paper cannot separate them; ``fit_load`` / ``fit_share``: the
    request shift's loading req_load at position 1 / the request share sigma_req / sigma_shared fitted too, as
    logits, both seen through the step weighting alone: a hard request takes more steps per token, so the request
    part of the spread tilts the pooled Fig. 5 ratios towards hard requests and the block part does not;
    noise_block stays at ``base``'s value;
    the noise is a poor lever: it lowers the AUC little and raises the STS ECE fast) minimising
    :func:`_objective`, with common random numbers, from ``base``; then raw_gain by bisection so the raw
    confidences' mean per-position ECE is :data:`RAW_ECE_TARGET`. Returns (params, evaluation at the optimum)."""
    from scipy.optimize import minimize  # lazy: scipy

    base = base or ParametricParams()
    rng = np.random.default_rng(seed)
    samples = {d: _Sample(7, n_u, blocks, rng) for d in DOMAINS}
    calls = [0]

    def f(theta: np.ndarray) -> float:
        calls[0] += 1
        try:
            ev = evaluate(_params_of(theta, base, fit_share, fit_load), samples=samples)
        except ConfigError:            # a link that cannot reach some curve value: outside the feasible region
            return 1e3
        v = _objective(ev, auc_weight)
        if calls[0] % 10 == 0:
            log(f"  eval {calls[0]}: objective {v:.5f} at {np.round(theta, 3).tolist()}")
        return v

    x0 = _theta_of(base, fit_share, fit_load)
    step = np.array([0.05, 0.2, 0.2, 0.3, 0.05, 0.2, 0.2, 0.3] + [-1.0] * fit_load + [0.5] * fit_share)
    opt = minimize(f, x0, method="Nelder-Mead", options={"maxfev": maxfev, "xatol": 1e-3, "fatol": 1e-6,
                                                        "initial_simplex": x0 + np.vstack([np.zeros(x0.size),
                                                                                          np.diag(step)])})
    params = _params_of(opt.x, base, fit_share, fit_load)
    lo, hi = 1.0, 6.0
    for _ in range(20):
        mid = 0.5 * (lo + hi)
        e = evaluate(replace(params, raw_gain=mid), samples=samples, confidence="raw")["ece_mean"]
        lo, hi = (mid, hi) if e < RAW_ECE_TARGET else (lo, mid)
    params = replace(params, raw_gain=round(0.5 * (lo + hi), 4))
    ev = evaluate(params, samples=samples)
    ev["raw"] = evaluate(params, samples=samples, confidence="raw")
    ev["objective"] = _objective(ev, auc_weight)
    ev["evaluations"] = calls[0]
    return params, ev
