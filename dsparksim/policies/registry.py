"""The policy registry and spec parsing: ``name`` or ``name:arg`` -> a policy class and its argument.

The lowest module of ``dsparksim.policies`` (it imports no policy): the package fills :data:`REGISTRY` with one
line per policy after importing the policy modules, and the policies' ``from_arg`` parse their argument with the
helpers here, whose errors list the valid specs."""
from __future__ import annotations

from dsparksim.errors import ConfigError

REGISTRY: dict[str, type] = {}  # spec name -> Policy subclass; filled by dsparksim.policies (definition order)


def list_specs() -> list[str]:
    """Spec patterns, e.g. ['mtp1', 'fixed:K', ...]."""
    return [cls.usage for cls in REGISTRY.values()]


def spec_error(name: str, arg: str | None, why: str) -> ConfigError:
    """A ConfigError naming the spec as written and listing the valid specs."""
    spec = name if arg is None else f"{name}:{arg}"
    return ConfigError(None, "policy", f"bad spec {spec!r}: {why}; valid specs: {', '.join(list_specs())}")


def no_arg(name: str, arg: str | None) -> None:
    if arg is not None:
        raise spec_error(name, arg, f"'{name}' takes no argument")


def int_arg(name: str, arg: str | None, lo: int, what: str) -> int:
    if arg is None or arg.strip() == "":
        raise spec_error(name, arg, f"'{name}' needs an integer {what} >= {lo}, e.g. '{name}:{max(lo, 2)}'")
    try:
        v = int(arg)
    except ValueError:
        raise spec_error(name, arg, f"{what} must be an integer >= {lo}, got {arg!r}") from None
    if v < lo:
        raise spec_error(name, arg, f"{what} must be an integer >= {lo}, got {v}")
    return v


def unit_float_arg(name: str, arg: str | None, what: str) -> float:
    if arg is None or arg.strip() == "":
        raise spec_error(name, arg, f"'{name}' needs a {what} in [0, 1], e.g. '{name}:0.5'")
    try:
        v = float(arg)
    except ValueError:
        raise spec_error(name, arg, f"{what} must be a number in [0, 1], got {arg!r}") from None
    if not 0.0 <= v <= 1.0:  # also rejects nan
        raise spec_error(name, arg, f"{what} must be in [0, 1], got {v}")
    return v
