"""``mtp``: DeepSeek's MTP module reused as a K-token chain drafter (K = 1..4), as SGLang/vLLM/TRT-LLM serve it.

DeepSeek-V3/R1 ship ONE MTP module (``num_nextn_predict_layers: 1``), trained to predict the token after next.
Engines draft K > 1 tokens by feeding the module its own output K times (SGLang: ``--speculative-algorithm
EAGLE`` with the NextN weights, ``--speculative-num-steps K``, top-k 1). Positions beyond the first are outside
what the module was trained for, so conditional acceptance falls along the chain.

Conditional acceptance per position (alpha_k = P(draft k accepted | drafts 1..k-1 accepted)), and where each
number comes from:

====  =========  ===========================================================================================
k     default    status
====  =========  ===========================================================================================
1     0.870      MEASURED (published): DeepSeek-V3 technical report (arXiv 2412.19437, section 5.4.3): the
                 second token's acceptance is 85-90% "across various generation topics"; 0.87 is the value the
                 ``mtp1`` source uses (:func:`.reference.mtp1_alpha`), kept identical so mtp K=1 == mtp1.
2     0.7126     DERIVED: the one published acceptance length in the shared data, 2.49 (InferenceX row 126:
                 DeepSeek-R1-0528 FP8, H200, SGLang v0.5.19, 8k/1k, concurrency 4, EAGLE with the MTP head,
                 num_steps 2, num_draft_tokens 3, topk 1; mean over 4,838 decode batches of the server log).
                 In SGLang at topk 1, ``num_draft_tokens`` is forced to ``num_steps + 1`` (server_args.py): the
                 target verifies the last accepted token plus num_steps = 2 drafts per request per step, so the
                 block size is K = num_steps = 2. SGLang's logged accept length is (accepted drafts + 1 bonus)
                 per request per verify step (scheduler.py: ``spec_num_total_accepted_tokens += accepted + bs``
                 over ``spec_num_total_forward_ct += bs``), maximum 3 -- dsparksim's tau. Hence
                 2.49 = 1 + a1 + a1*a2, a2 = (2.49 - 1 - a1) / a1 = 0.7126 with a1 = 0.87.
3, 4  a_{k-1}*d  ASSUMPTION: no published figure covers reuse beyond 2 steps for this model. Each further reuse
                 multiplies the conditional acceptance by the same factor d as the one observed drop,
                 d = a2 / a1 = 0.819 (a3 = 0.584, a4 = 0.478).
====  =========  ===========================================================================================

Further assumptions (in the model's metadata): R1-0528's MTP position-1 acceptance equals the V3 report's
figure (the 2.49 was measured on R1-0528 with random prompts in a chat template, the 0.87 on V3); the latent
heterogeneity (sigma_req, sigma_block, sigma_tok) is the DSpark-paper fit the other parametric drafters use (no
MTP heterogeneity is published); the step-weighted calibration of :mod:`.parametric` means a long-output
``fixed:K`` run reproduces tau(K) = 1 + sum_k prod_{j<=k} alpha_j. For comparison, DeepSeek-V4's MTP at K=2
(reference JSON ``other_published_tau``) gives unconditional 0.76-0.79 / 0.36-0.38, i.e. a2 ~ 0.48: set it with
``mtp?a1=0.775&a2=0.477``.

No confidence head: an MTP module has none, so the model says so (``metadata["confidence_head"] = False``) and
a run refuses the policies that read confidences (threshold, confidence, confidence-async, confidence-global);
fixed:K, goodput, oracle and none work. The draws (acceptance truth keyed by seed, request and step) are the
parametric model's.

Spec: ``mtp`` or ``mtp?a1=0.88&tau2=2.49&decay=0.8`` (``a2=`` instead of ``tau2=``; the parametric model's
``sigma_req`` etc. also accepted).
"""
from __future__ import annotations

from dataclasses import fields
from typing import Mapping

import numpy as np

from dsparksim.errors import ConfigError
from dsparksim.acceptance.parametric import POOLED, ParametricAcceptance, ParametricParams
from dsparksim.acceptance.reference import mtp1_alpha

K_MAX_MTP = 4            # the chain lengths engines run DeepSeek's single MTP module at (issue 30: K up to 4)
TAU2_SGLANG = 2.49       # InferenceX row 126 (see module docstring)
TAU2_SOURCE = ("InferenceX (../shared/data/inferencex, row 126): accept length 2.49, DeepSeek-R1-0528 FP8, H200, "
               "SGLang v0.5.19, 8k/1k, c=4, EAGLE with the MTP head, num_steps 2 / num_draft_tokens 3 / topk 1")
MTP_PARAMS = ("a1", "a2", "tau2", "decay")


def _num(src: str, params: dict[str, str], name: str) -> float | None:
    if name not in params:
        return None
    v = params.pop(name)
    try:
        x = float(v)
    except ValueError:
        raise ConfigError(src, name, f"expected a number, got {v!r}") from None
    if not np.isfinite(x):
        raise ConfigError(src, name, f"expected a finite number, got {v!r}")
    return x


def mtp_curve(a1: float | None = None, a2: float | None = None, tau2: float | None = None,
              decay: float | None = None, K: int = K_MAX_MTP, source: str = "mtp") -> tuple[np.ndarray, list[str]]:
    """alpha_1..alpha_K and one line per number saying whether it is measured, derived or assumed."""
    if isinstance(K, bool) or not isinstance(K, (int, np.integer)) or not 1 <= K <= K_MAX_MTP:
        raise ConfigError(source, "K", f"the mtp chain drafts 1..{K_MAX_MTP} tokens (DeepSeek's MTP module reused "
                          f"per position), got K={K!r}")
    notes: list[str] = []
    if a1 is None:
        a1, why = mtp1_alpha("v3")
        notes.append(f"a1 = {a1:.4f} MEASURED: {why}")
    else:
        notes.append(f"a1 = {a1:.4f} set by the user")
    if not 0 < a1 <= 1:
        raise ConfigError(source, "a1", f"conditional acceptance must be in (0, 1], got {a1!r}")
    if a2 is not None and tau2 is not None:
        raise ConfigError(source, "a2", "give a2 or tau2 (a2 is derived from tau2), not both")
    if a2 is None:
        user_tau = tau2 is not None
        tau2 = TAU2_SGLANG if tau2 is None else tau2
        if not 1 + a1 < tau2 <= 1 + 2 * a1:
            raise ConfigError(source, "tau2", f"the acceptance length at 2 drafts must be in ({1 + a1:g}, "
                              f"{1 + 2 * a1:g}] for a1={a1:g} (tau2 = 1 + a1 + a1*a2, 0 < a2 <= 1), got {tau2!r}")
        a2 = (tau2 - 1 - a1) / a1
        notes.append(f"a2 = {a2:.4f} DERIVED from tau2 = {tau2:g} = 1 + a1 + a1*a2 ("
                     + ("set by the user)" if user_tau else f"{TAU2_SOURCE})"))
    else:
        notes.append(f"a2 = {a2:.4f} set by the user")
    if not 0 < a2 <= 1:
        raise ConfigError(source, "a2", f"conditional acceptance must be in (0, 1], got {a2!r}")
    if decay is None:
        decay = min(a2 / a1, 1.0)
        how = f"ASSUMED equal to the one observed drop a2/a1 = {decay:.4f} (no published figure beyond 2 steps)"
    else:
        how = "set by the user"
    if not 0 < decay <= 1:
        raise ConfigError(source, "decay", f"must be in (0, 1] (each reuse of the module keeps or lowers the "
                          f"conditional acceptance), got {decay!r}")
    curve = [a1, a2]
    for _ in range(2, K_MAX_MTP):
        curve.append(curve[-1] * decay)
    if K > 2:
        notes.append(f"a3..a{K} = a_(k-1) x decay, decay {decay:.4f} {how}: "
                     + ", ".join(f"{c:.4f}" for c in curve[2:K]))
    return np.array(curve[:K]), notes


def tau_closed_form(curve) -> float:
    """Mean tokens per step with all K verified: 1 + sum_k prod_{j<=k} alpha_j."""
    return float(1.0 + np.cumprod(np.asarray(curve, float)).sum())


def load_mtp(spec: str, K: int, params: Mapping[str, str], *, domain_default: str = "chat",
             confidence: str = "sts") -> ParametricAcceptance:
    """The ``mtp`` acceptance model for block size K from the spec's ``?name=value`` parameters."""
    src = f"acceptance spec {spec!r}"
    rest = dict(params)
    vals = {n: _num(src, rest, n) for n in MTP_PARAMS}
    curve, notes = mtp_curve(vals["a1"], vals["a2"], vals["tau2"], vals["decay"], K=K, source=src)
    known = sorted(MTP_PARAMS + tuple(f.name for f in fields(ParametricParams)))
    for name in rest:
        if name not in known:
            raise ConfigError(src, name, f"unknown parameter; expected one of {known}")
    p = ParametricParams.from_strings(rest, src)
    notes.append("latent heterogeneity (sigma_req/sigma_block/sigma_tok) from the DSpark-paper fit "
                 "(dsparksim/data/acceptance_fit.json): no MTP heterogeneity is published")
    notes.append("no confidence head: policies that read confidences are refused; the confidences in the blocks "
                 "are the parametric model's and unused")
    meta = {"provenance": "DeepSeek-V3 technical report (a1) and " + TAU2_SOURCE + " (a2); decay beyond 2 "
                          "positions assumed",
            "confidence_head": False, "mtp_curve": [round(float(a), 6) for a in curve],
            "tau_closed_form": tau_closed_form(curve)}
    return ParametricAcceptance({POOLED: curve}, K, drafter="mtp", params=p, source=spec, notes=notes,
                                domain_default=domain_default, extra_metadata=meta, confidence=confidence)
