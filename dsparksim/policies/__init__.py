"""Verification policies and their registry.

Adding a policy = one module with a :class:`Policy` subclass (``name``, ``usage``, ``choose``; ``from_arg`` if it
takes an argument) and one line in ``REGISTRY``. Specs are ``name`` or ``name:arg`` (see :func:`list_policies`).
"""
from __future__ import annotations

from dsparksim.errors import ConfigError
from dsparksim.policies._common import Ranking, draft_budget, global_best, rank_candidates, ratio_curve
from dsparksim.policies.base import Policy, StepContext
from dsparksim.policies.confidence import Confidence, algorithm1
from dsparksim.policies.confidence_async import ConfidenceAsync
from dsparksim.policies.confidence_async_2d import ConfidenceAsync2D
from dsparksim.policies.confidence_global import ConfidenceGlobal, global_search_current
from dsparksim.policies.fixed import Fixed
from dsparksim.policies.goodput import Goodput
from dsparksim.policies.mtp1 import MTP1
from dsparksim.policies.none import NoSpeculation
from dsparksim.policies.oracle import Oracle
from dsparksim.policies.registry import REGISTRY, list_specs, spec_error
from dsparksim.policies.threshold import Threshold

REGISTRY.update({
    "none": NoSpeculation,  # plain autoregressive decoding (K = 0, no drafter)
    "mtp1": MTP1,
    "fixed": Fixed,
    "threshold": Threshold,
    "goodput": Goodput,
    "confidence": Confidence,
    "confidence-async": ConfidenceAsync,
    "confidence-async-2d": ConfidenceAsync2D,  # each candidate priced at its own request's context
    "confidence-global": ConfidenceGlobal,  # NOT lossless: only for demonstrating the Appendix-A bias
    "oracle": Oracle,
})


def list_policies() -> list[str]:
    """One help line per policy: 'pattern  first docstring line'."""
    width = max(len(u) for u in list_specs())
    return [f"{cls.usage:<{width}}  {(cls.__doc__ or '').strip().splitlines()[0]}" for cls in REGISTRY.values()]


def confidence_readers() -> list[str]:
    """The registered policies that read the confidences (``Policy.reads_confidence``)."""
    return [name for name, cls in REGISTRY.items() if cls.reads_confidence]


def make_policy(spec: str) -> Policy:
    """Build a policy from a spec such as 'confidence', 'fixed:7', 'threshold:0.6', 'confidence-async:2'."""
    if not isinstance(spec, str) or not spec.strip():
        what = "empty" if isinstance(spec, str) else "expected a spec string"
        raise ConfigError(None, "policy", f"bad spec {spec!r}: {what}; valid specs: {', '.join(list_specs())}")
    spec = spec.strip()
    name, sep, arg = spec.partition(":")
    cls = REGISTRY.get(name)
    if cls is None:
        raise spec_error(name, arg if sep else None, f"unknown policy {name!r}")
    policy = cls.from_arg(arg if sep else None)
    policy.spec = spec
    return policy


__all__ = ["REGISTRY", "Policy", "StepContext", "make_policy", "list_policies", "list_specs", "confidence_readers",
           "algorithm1",
           "global_search_current", "MTP1", "Fixed", "Threshold", "Goodput", "Confidence", "ConfidenceAsync",
           "ConfidenceGlobal", "Oracle", "NoSpeculation", "Ranking", "draft_budget", "global_best", "rank_candidates", "ratio_curve"]
