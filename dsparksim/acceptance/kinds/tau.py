"""``tau:3.2``: a flat acceptance curve with that mean tokens per step (bonus included); ``drafter=`` param."""
from __future__ import annotations

from dsparksim.acceptance.kinds.engine_logs import importer_options
from dsparksim.acceptance.registry import AcceptanceKind, src
from dsparksim.errors import ConfigError


class Tau(AcceptanceKind):
    kind = "tau"
    names = ("tau",)
    takes_arg = True
    usage = "'tau:X'"

    @classmethod
    def load(cls, ps, K, domain_default, confidence):
        kw = importer_options(ps, dict(ps.params))
        try:
            tau = float(ps.arg)
        except ValueError:
            raise ConfigError(src(ps.text), "tau", f"expected a number after 'tau:', got {ps.arg!r}") from None
        from dsparksim.acceptance import importers  # heavy: pandas, on use only
        return importers.from_tau(tau, K, source=ps.text, domain_default=domain_default, **kw)
