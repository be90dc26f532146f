"""``vllm:PATH`` ``sglang:PATH``: engine-log importers (:mod:`dsparksim.acceptance.importers`); extra params
``drafter=``, ``draft_len=`` (sglang)."""
from __future__ import annotations

from pathlib import Path
from typing import ClassVar

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


class EngineLog(AcceptanceKind):
    """``ENGINE:PATH``: an engine's log, read by ``importers.import_ENGINE`` into a parametric model.
    :meth:`of` makes the kind of one engine; ``int_params``: the integer parameters its importer takes
    (sglang: ``draft_len``), read before the parametric ones."""

    takes_arg = True
    int_params: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def of(cls, engine: str, *int_params: str) -> type["EngineLog"]:
        """The kind ``engine:PATH`` (one ``REGISTRY`` line each)."""
        return type(f"EngineLog_{engine}", (cls,), {"kind": engine, "names": (engine,), "usage": f"'{engine}:PATH'",
                                                    "int_params": tuple(int_params)})

    @classmethod
    def path(cls, ps) -> Path:
        return Path(ps.arg)

    @classmethod
    def load(cls, ps, K, domain_default, confidence):
        params = dict(ps.params)
        ints = {name: pop_int(ps.text, params, name) for name in cls.int_params}   # before the parametric ones
        from dsparksim.acceptance import importers  # heavy: pandas, on use only
        read = getattr(importers, f"import_{cls.kind}")
        return read(ps.arg, K, **ints, domain_default=domain_default, **importer_options(ps, params))
