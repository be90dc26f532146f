"""Run options as dataclass fields: the :class:`Option` metadata, :func:`option`, the option value parsers.

The lowest layer of configuration: ``dsparksim.config`` (RunConfig, EngineConfig) and ``dsparksim.traffic.config``
(TrafficConfig) both declare their fields with :func:`option`, so it lives here, below both (no import circle)."""
from __future__ import annotations

import argparse
import datetime as _dt
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable

# Value types a sweep spec (TOML) may give for an option; NUM values become floats.
STR: tuple[type, ...] = (str,)
INT: tuple[type, ...] = (int,)
NUM: tuple[type, ...] = (int, float)
BOOL: tuple[type, ...] = (bool,)


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()       # Option.default when the option's default is the field's own
DEFAULT_CONCURRENCY = 32    # closed-loop users of a run that names no load
DEFAULT_DURATION_S = 60.0   # simulated seconds of a run that sets neither duration_s nor num_requests


# ------------------------------------------------------------------------------------------- option parsers
def number(s: str, kind: type, lo: float, lo_open: bool, what: str):
    """Option parser core: ``s`` as ``kind``, finite and >= ``lo`` (> ``lo`` when ``lo_open``), else an
    argparse error naming ``what`` was expected."""
    if "_" in str(s):   # Python's int()/float() read '2_0' as 20: a typo, not a number
        raise argparse.ArgumentTypeError(f"expected {what}, got {s!r}")
    try:
        v = kind(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {s!r}") from None
    if not math.isfinite(v) or v < lo or (lo_open and v == lo):
        raise argparse.ArgumentTypeError(f"expected {what}, got {s!r}")
    return v


def pos_float(s: str) -> float:
    """Option parser: a finite number > 0."""
    return number(s, float, 0.0, True, "a finite number > 0")


def nonneg_float(s: str) -> float:
    """Option parser: a finite number >= 0."""
    return number(s, float, 0.0, False, "a finite number >= 0")


def pos_int(s: str) -> int:
    """Option parser: an integer >= 1."""
    return number(s, int, 1, False, "an integer >= 1")


def nonneg_int(s: str) -> int:
    """Option parser: an integer >= 0."""
    return number(s, int, 0, False, "an integer >= 0")


def iso_date(s: str) -> str:
    """Option parser: an ISO 8601 calendar date (``2026-12-04``) or date and time, returned as written (it goes into
    metadata verbatim, so a typo such as ``2026-13-04`` must not). Python's fromisoformat also takes the basic and
    week forms (``20261204``, ``2026-W49-5``): refused, the metadata's dates are all YYYY-MM-DD."""
    if re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", s[:10]) and (len(s) == 10 or s[10] in "T "):
        for parse in (_dt.date.fromisoformat, _dt.datetime.fromisoformat):
            try:
                parse(s)
                return s
            except ValueError:
                pass
    raise argparse.ArgumentTypeError(f"expected an ISO 8601 date (YYYY-MM-DD), got {s!r}")


# ------------------------------------------------------------------------------------------ option metadata
@dataclass(frozen=True)
class Option:
    """How a configuration field is given as a run option (command line and sweep key).

    flags:       command-line spellings, primary first; () = a sweep key only.
    parse:       argparse type for the flag's string (None: the string itself).
    kinds:       value types a sweep spec may give (NUM values become floats).
    choices:     allowed values, or a function returning them (checked by argparse; the dataclass checks again).
    default:     the value when the option is not given; UNSET = the field's default.
    key:         the option / sweep key and argparse dest; None = the field name.
    group:       command-line help group (inputs | traffic | engine; "" = top level); None = the section's.
    exclusive:   command-line mutually exclusive group this flag belongs to.
    switch:      a flag without value (store_true).
    deprecated:  (flag, why) pairs: spellings that still work but warn.
    load:        a load option (concurrency | rate | time_scale): replaced by load lists in ``frontier``.
    common:      added by the shared run options; False = each command adds it (``--policy``).
    frontier_help: help text in ``frontier`` where it differs.
    """

    flags: tuple[str, ...] = ()
    help: str = ""
    parse: Callable[[str], Any] | None = None
    kinds: tuple[type, ...] = STR
    choices: tuple[str, ...] | Callable[[], tuple[str, ...]] | None = None
    default: Any = UNSET
    key: str | None = None
    group: str | None = None
    exclusive: str | None = None
    switch: bool = False
    metavar: str | None = None
    deprecated: tuple[tuple[str, str], ...] = ()
    load: bool = False
    common: bool = True
    frontier_help: str | None = None

    def choice_list(self) -> tuple[str, ...] | None:
        return self.choices() if callable(self.choices) else self.choices


def option(field_default: Any, /, *flags: str, **kw: Any) -> Any:
    """A dataclass field with ``field_default`` that is also a run option (see :class:`Option`)."""
    return field(default=field_default, metadata={"option": Option(flags=tuple(flags), **kw)})


@dataclass(frozen=True)
class OptionSpec:
    """One run option resolved: its key, the config section and field it sets, its definition and default."""

    key: str
    section: str        # "run" | "engine" | "traffic"
    field: str
    option: Option
    default: Any

    @property
    def group(self) -> str:
        g = self.option.group
        return g if g is not None else {"run": "inputs"}.get(self.section, self.section)

    @property
    def aliases(self) -> tuple[str, ...]:
        """Other spellings of the key: each command-line flag with dashes as underscores (``-K`` -> ``k``)."""
        out = []
        for f in self.option.flags:
            n = f.lstrip("-").replace("-", "_")
            n = n.lower() if not f.startswith("--") else n
            if n != self.key and n not in out:
                out.append(n)
        return tuple(out)
