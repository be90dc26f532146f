"""``dspark`` ``dflash`` ``eagle3`` ``mtp1`` ``mtp1-v3`` ``mtp1-v4``: the paper-calibrated parametric model."""
from __future__ import annotations

from dsparksim.acceptance.parametric import ParametricAcceptance, ParametricParams
from dsparksim.acceptance.registry import AcceptanceKind, AcceptanceSpec, src
from dsparksim.errors import ConfigError
from dsparksim.acceptance.headshift import HeadShift

PARAMETRIC_DRAFTERS = ("dspark", "dflash", "eagle3", "mtp1")
# Named MTP-1 acceptance sources -> the reference source they read (:func:`.reference.mtp1_alpha`; "" = default v3)
MTP1_NAMES = {"mtp1": "", "mtp1-v3": "v3", "mtp1-v4": "v4"}


class Parametric(AcceptanceKind):
    kind = "parametric"
    names = PARAMETRIC_DRAFTERS + tuple(n for n in MTP1_NAMES if n not in PARAMETRIC_DRAFTERS)
    usage = ", ".join(f"'{n}'" for n in names)

    @classmethod
    def parse(cls, text, name, arg, params) -> AcceptanceSpec:
        if name in MTP1_NAMES:
            return AcceptanceSpec(text, cls.kind, "mtp1", MTP1_NAMES[name], params)
        return AcceptanceSpec(text, cls.kind, name, "", params)

    @classmethod
    def load(cls, ps, K, domain_default, confidence):
        if ps.name == "mtp1" and K != 1:
            raise ConfigError(src(ps.text), "K", f"mtp1 drafts exactly one token: K must be 1, got {K}")

        params = dict(ps.params)
        shift = HeadShift.pop_from(params, src(ps.text))      # head_blind, head_mix, sts_mix (study 2.2)
        p = ParametricParams.from_strings(params, src(ps.text))
        kw = {"mtp1_source": ps.arg} if ps.name == "mtp1" and ps.arg else {}
        return ParametricAcceptance.from_paper(ps.name, K, p, domain_default=domain_default, source=ps.text,
                                              confidence=confidence, shift=shift, **kw)

    @classmethod
    def drafter(cls, ps) -> str:
        return ps.name
