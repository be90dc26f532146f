"""``vllm:PATH`` ``sglang:PATH``: engine-log importers (:mod:`dsparksim.acceptance.importers`); extra params
``drafter=``, ``draft_len=`` (sglang)."""
from __future__ import annotations

from pathlib import Path

from dsparksim.acceptance.parametric import ParametricParams
from dsparksim.acceptance.registry import AcceptanceKind, src
from dsparksim.errors import ConfigError


def pop_int(spec: str, params: dict[str, str], name: str) -> int | None:
    if name not in params:
        return None
    v = params.pop(name)
    try:
        return int(v)
    except ValueError:
        raise ConfigError(src(spec), name, f"expected an integer, got {v!r}") from None


def importer_options(ps, params: dict[str, str]) -> dict:
    """The importers' keywords from the spec's parameters (``drafter=`` and the parametric ones)."""
    drafter = params.pop("drafter", "dspark")
    return dict(params=ParametricParams.from_strings(params, src(ps.text)), drafter=drafter)


class VLLMLog(AcceptanceKind):
    kind = "vllm"
    names = ("vllm",)
    takes_arg = True
    usage = "'vllm:PATH'"

    @classmethod
    def path(cls, ps) -> Path:
        return Path(ps.arg)

    @classmethod
    def load(cls, ps, K, domain_default, confidence):
        from dsparksim.acceptance import importers  # heavy: pandas, on use only
        return importers.import_vllm(ps.arg, K, domain_default=domain_default,
                                     **importer_options(ps, dict(ps.params)))


class SGLangLog(AcceptanceKind):
    kind = "sglang"
    names = ("sglang",)
    takes_arg = True
    usage = "'sglang:PATH'"

    @classmethod
    def path(cls, ps) -> Path:
        return Path(ps.arg)

    @classmethod
    def load(cls, ps, K, domain_default, confidence):
        params = dict(ps.params)
        draft_len = pop_int(ps.text, params, "draft_len")   # before the parametric parameters are read
        from dsparksim.acceptance import importers  # heavy: pandas, on use only
        return importers.import_sglang(ps.arg, K, draft_len=draft_len, domain_default=domain_default,
                                       **importer_options(ps, params))
