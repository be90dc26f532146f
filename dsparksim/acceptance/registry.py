"""The acceptance-source registry: a spec string -> its kind, which parses, loads and names the drafter.

The lowest module of the spec syntax (it imports no kind): :mod:`dsparksim.acceptance` fills :data:`REGISTRY` with one
line per kind after importing the kind modules (:mod:`dsparksim.acceptance.kinds`). Adding a kind = one small module
with an :class:`AcceptanceKind` subclass and one registry line. Error messages list the registered kinds."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Mapping

from dsparksim.errors import ConfigError

if TYPE_CHECKING:
    from dsparksim.acceptance.base import AcceptanceModel

REGISTRY: dict[str, type["AcceptanceKind"]] = {}   # kind -> class; filled by dsparksim.acceptance (in order)


def src(spec: str) -> str:
    return f"acceptance spec {spec!r}"


@dataclass(frozen=True)
class AcceptanceSpec:
    """A parsed acceptance spec string (see :mod:`dsparksim.acceptance`).

    kind:   a key of :data:`REGISTRY` ("parametric" | "mtp" | "trace" | "vllm" | "sglang" | "tau").
    name:   the parametric drafter (dspark, dflash, eagle3, mtp1); else the kind.
    arg:    the path (trace, vllm, sglang) or number (tau) as written; for mtp1-v3 / mtp1-v4 the named source
            (v3, v4); "" for a plain parametric name (mtp1 = the default source, v3).
    params: the ``?name=value&...`` parameters (a trace path takes none), still strings.
    """

    text: str
    kind: str
    name: str
    arg: str = ""
    params: Mapping[str, str] = field(default_factory=dict)

    @property
    def path(self) -> Path | None:
        """The file the source reads (a shipped ``traces/NAME`` resolved), or None for a model without one."""
        return REGISTRY[self.kind].path(self)


class AcceptanceKind:
    """One kind of acceptance source. ``names``: the spec names that select it, bare (``dspark``) or, with
    ``takes_arg``, as ``name:ARG``; ``usage``: how the error message lists it."""

    kind: ClassVar[str] = ""
    names: ClassVar[tuple[str, ...]] = ()
    takes_arg: ClassVar[bool] = False
    usage: ClassVar[str] = ""

    @classmethod
    def match_text(cls, text: str) -> AcceptanceSpec | None:
        """A spec this kind recognises whole, before any ``?`` or ``:`` is split off (a trace path), else None."""
        return None

    @classmethod
    def parse(cls, text: str, name: str, arg: str, params: dict[str, str]) -> AcceptanceSpec:
        return AcceptanceSpec(text, cls.kind, cls.kind, arg, params)

    @classmethod
    def path(cls, ps: AcceptanceSpec) -> Path | None:
        return None

    @classmethod
    def load(cls, ps: AcceptanceSpec, K: int, domain_default: str, confidence: str) -> "AcceptanceModel":
        raise NotImplementedError

    @classmethod
    def drafter(cls, ps: AcceptanceSpec) -> str:
        """The drafter (draft-cost class) the source runs with, without building it."""
        return ps.params.get("drafter", "dspark")


def spec_text(spec) -> str:
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError("acceptance spec", None, f"expected a non-empty string, got {spec!r}")
    return spec.strip()


def split_query(spec: str) -> tuple[str, dict[str, str]]:
    if "?" not in spec:
        return spec, {}
    base, query = spec.rsplit("?", 1)
    params: dict[str, str] = {}
    for part in query.split("&"):
        if not part:
            continue
        if "=" not in part:
            raise ConfigError(src(spec), part, "expected name=value parameters after '?'")
        k, v = part.split("=", 1)
        if k in params:
            raise ConfigError(src(spec), k, "parameter given twice")
        params[k] = v
    return base, params


def arg_names() -> tuple[str, ...]:
    """The spec names written ``name:ARG`` (a trace path with such a prefix is that kind's, not a trace)."""
    return tuple(n for c in REGISTRY.values() if c.takes_arg for n in c.names)


def parse_spec(spec: str) -> AcceptanceSpec:
    """Parse an acceptance spec string (no file is read): ConfigError naming the spec when it is malformed."""
    text = spec_text(spec)
    for cls in REGISTRY.values():
        whole = cls.match_text(text)
        if whole is not None:
            return whole
    base, params = split_query(text)
    name, colon, arg = base.partition(":")
    for cls in REGISTRY.values():
        # a bare name takes no ':' ('dspark:' is a typo, not 'dspark'); 'name:ARG' needs its ARG
        if name in cls.names and (bool(arg) if cls.takes_arg else not colon):
            return cls.parse(text, name, arg, params)
    raise ConfigError(src(text), None, "unknown acceptance source; expected one of "
                      + ", ".join(c.usage for c in REGISTRY.values()))
