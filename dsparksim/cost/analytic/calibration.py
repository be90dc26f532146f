"""Calibration of a built profile: one scale per cost family and the per-step fixed overhead (``profile fit``).

The builder's forward is a sum of named terms (:meth:`ForwardModel.terms`); each term belongs to exactly one
family below, and a family's scale multiplies the seconds of all its terms wherever the builder prices them (the
target's verify staircase, the drafters' tables, the context and prefill terms). Every roofline ``max()`` of the
builder sits inside one term of one family, so a priced table is EXACTLY linear in the scales:
``time(M) = sum_f s_f * F_f(M)``. A scale is therefore "this family's kernels run s times as long as the
datasheet roofline says", not a change of bandwidth or peak FLOP/s (that would move the roofline knees and be
nonlinear); the fit estimates the former, stated as such in ``metadata.fit``.

The ``floor`` family is the M-independent part of every term: each kernel's launch floor (the efficiency fit's
``t0_gemm_s`` / ``t0_ew_s``, measured per operator in eager mode) and each per-call latency (collectives, MoE
top-k/align/unpermute kernels); the other verify families keep the rest of their terms
(:meth:`ForwardModel.floorless`). Engines replay decode steps as CUDA graphs, where these floors are not what an
eager per-operator measurement sees, so the floor gets its own scale. It is exactly constant over M, hence
collinear with ``fixed_overhead_s`` in runs without a drafter (the fit's identifiability rule holds one of them).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from dsparksim.errors import InputError

__all__ = ["FAMILIES", "VERIFY_FAMILIES", "TERM_FAMILY", "Calibration", "family_tables"]

# verify-staircase families (terms of ForwardModel.terms), then the context and prefill families
VERIFY_FAMILIES = ("dense", "moe", "comm", "floor")
FAMILIES = VERIFY_FAMILIES + ("attention", "prefill")
FAMILY_NOTES = {
    "dense": "dense GEMMs and their elementwise work: attention projections, dense MLPs, norms/rope/residual "
             "and the attention-kernel launch, embedding, LM head GEMM, sampling",
    "moe": "MoE layers: router GEMM, fixed top-k/align/permute/unpermute kernels, routed and shared expert GEMMs",
    "comm": "communication: TP all-reduces, EP all-to-all, the LM head's vocabulary gather (bytes over the links)",
    "floor": "M-independent floors of the forward: every kernel's launch floor (efficiency fit t0_gemm_s, t0_ew_s) "
             "and every per-call latency (all-reduce, all-to-all, MoE top-k/align/unpermute kernels)",
    "attention": "attention over the context: KV bytes read per context token (attention.seconds_per_kv_token) "
                 "and decode query-key FLOPs (attention.seconds_per_query_kv)",
    "prefill": "prefill chunks' causal query-key FLOPs (prefill.seconds_per_query_key)",
}
TERM_FAMILY = {"attention_proj": "dense", "norms_rope_add_attnlaunch": "dense", "dense_mlp": "dense",
               "embedding": "dense", "lm_head": "dense", "sampling": "dense",
               "moe_router": "moe", "moe_fixed": "moe", "moe_routed": "moe", "moe_shared": "moe",
               "tp_allreduce": "comm", "ep_alltoall": "comm"}


@dataclass(frozen=True)
class Calibration:
    """Scales per family (absent = 1), the per-step fixed overhead in seconds (None = the builder's) and the
    request latency outside the step loop in seconds (None = none: the profile's ``request_latency_s``)."""

    scales: Mapping[str, float] = field(default_factory=dict)
    fixed_overhead_s: float | None = None
    request_latency_s: float | None = None

    def __post_init__(self) -> None:
        for k, v in self.scales.items():
            if k not in FAMILIES:
                raise InputError("calibration", f"scales.{k}", f"unknown cost family; expected one of "
                                 f"{', '.join(FAMILIES)}")
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise InputError("calibration", f"scales.{k}", f"expected a finite number > 0, got {v!r}")
        f = self.fixed_overhead_s
        if f is not None and (isinstance(f, bool) or not isinstance(f, (int, float)) or not math.isfinite(f)
                              or f < 0):
            raise InputError("calibration", "fixed_overhead_s", f"expected a finite number >= 0, got {f!r}")
        r = self.request_latency_s
        if r is not None and (isinstance(r, bool) or not isinstance(r, (int, float)) or not math.isfinite(r)
                              or r < 0):
            raise InputError("calibration", "request_latency_s", f"expected a finite number >= 0, got {r!r}")

    def scale(self, family: str) -> float:
        return float(self.scales.get(family, 1.0))

    @property
    def is_identity(self) -> bool:
        return (self.fixed_overhead_s is None and not self.request_latency_s
                and all(float(v) == 1.0 for v in self.scales.values()))

    def as_dict(self) -> dict[str, Any]:
        return {"scales": {f: self.scale(f) for f in FAMILIES}, "fixed_overhead_s": self.fixed_overhead_s,
                "request_latency_s": self.request_latency_s}


def family_tables(fm: Any, M: Any, **terms_kw: Any) -> dict[str, np.ndarray]:
    """Seconds per verify family over M (``dense``, ``moe``, ``comm``, ``floor``) for the stack ``terms_kw``
    selects (:meth:`ForwardModel.terms`); their sum is the builder's forward to rounding. ``floor`` is each term
    minus the same term of the floorless model; the LM head's vocabulary gather (inside the ``lm_head`` term) is
    moved to ``comm`` (its latency stays in ``floor``)."""
    terms = fm.terms(M, **terms_kw)
    bare_fm = fm.floorless()
    bare = bare_fm.terms(M, **terms_kw)
    out = {f: np.zeros(np.shape(M), dtype=float) for f in VERIFY_FAMILIES}
    for k, v in terms.items():
        fam = TERM_FAMILY.get(k)
        if fam is None:
            raise KeyError(f"cost term {k!r} has no family (dsparksim/cost/analytic/calibration.py TERM_FAMILY)")
        b = np.asarray(bare[k], dtype=float)
        out[fam] = out[fam] + b
        out["floor"] = out["floor"] + (np.asarray(v, dtype=float) - b)
    g = np.asarray(bare_fm.vocab_gather(M), dtype=float)
    out["dense"] = out["dense"] - g
    out["comm"] = out["comm"] + g
    return out



def calibrated_sum(tables: Mapping[str, np.ndarray], cal: Calibration) -> np.ndarray:
    """sum_f s_f * F_f in the fixed family order (the order the fit's re-pricing uses too)."""
    t = cal.scale(VERIFY_FAMILIES[0]) * tables[VERIFY_FAMILIES[0]]
    for f in VERIFY_FAMILIES[1:]:
        t = t + cal.scale(f) * tables[f]
    return t
