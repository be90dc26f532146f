"""``mtp`` ``mtp?a1=..&tau2=..&decay=..``: DeepSeek's MTP module reused for K = 1..4 positions (:mod:`..mtp`)."""
from __future__ import annotations

from dsparksim.acceptance.mtp import load_mtp
from dsparksim.acceptance.registry import AcceptanceKind, AcceptanceSpec


class MTPChain(AcceptanceKind):
    kind = "mtp"
    names = ("mtp",)
    usage = "'mtp' (?a1=..&tau2=..&decay=..)"

    @classmethod
    def parse(cls, text, name, arg, params) -> AcceptanceSpec:
        return AcceptanceSpec(text, cls.kind, "mtp", "", params)

    @classmethod
    def load(cls, ps, K, domain_default, confidence):
        return load_mtp(ps.text, K, dict(ps.params), domain_default=domain_default, confidence=confidence)

    @classmethod
    def drafter(cls, ps) -> str:
        return ps.name
