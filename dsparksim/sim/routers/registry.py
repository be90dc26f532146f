"""The router registry and spec parsing: ``name`` or ``name:arg`` -> a router class and its argument.

The lowest module of ``dsparksim.sim.routers`` (it imports no router): the package fills :data:`REGISTRY` with one
line per router after importing the router modules. Error messages list the registered names."""
from __future__ import annotations

from typing import Any, ClassVar

from dsparksim.errors import ConfigError

REGISTRY: dict[str, type["Router"]] = {}  # name -> Router subclass; filled by dsparksim.sim.routers (in order)


class Router:
    """Chooses the engine (replica, or DP rank) of an arriving request: ``route(row, engines, table) -> index``.

    ``request_only``: the choice is a function of the request alone (its row, key or session) and of the requests
    routed before it, never of the engines' state, so replicas never interact and a run can be sharded across
    processes (:mod:`dsparksim.sim.shard`). ``pins_users``: in a closed loop each user is pinned to one engine and
    sends that engine's rows (:meth:`user_row`), so users of different engines never share a request pool.
    ``needs_session``: the workload must carry session or prefix ids."""

    name: ClassVar[str] = "base"
    usage: ClassVar[str] = "base"          # the spec as the help lists it
    request_only: ClassVar[bool] = False
    pins_users: ClassVar[bool] = False
    needs_session: ClassVar[bool] = False

    def __init__(self, n: int, seed: int = 0) -> None:
        self.n = int(n)
        self.seed = int(seed)
        self._next = 0

    @classmethod
    def check_arg(cls, arg: str | None) -> None:
        """Refuse an argument (a router that takes one overrides this and ``__init__``)."""
        if arg is not None:
            raise spec_error(cls.name, arg, f"'{cls.name}' takes no argument")

    def turn(self) -> int:
        """The engine whose turn it is (cycles 0..n-1): round-robin order and the routers' tie-break."""
        e = self._next
        self._next = (e + 1) % self.n
        return e

    def route(self, row: int, engines: list[Any], table: Any) -> int:
        raise NotImplementedError

    def user_row(self, engine: int, k: int) -> int:
        """``pins_users`` routers: the workload row of the ``k``-th request engine ``engine``'s users send."""
        raise NotImplementedError


def names() -> tuple[str, ...]:
    return tuple(REGISTRY)


def request_only_names() -> list[str]:
    """The registered routers that decide from the request alone (shardable)."""
    return [n for n, c in REGISTRY.items() if c.request_only]


def spec_error(name: str, arg: str | None, why: str) -> ConfigError:
    spec = name if arg is None else f"{name}:{arg}"
    return ConfigError("config", "router", f"bad router {spec!r}: {why}; expected one of {', '.join(REGISTRY)}")


def router_class(spec: str) -> tuple[type[Router], str | None]:
    """The class and argument (None: none given) of router spec ``name`` or ``name:arg``."""
    if not isinstance(spec, str) or not spec.strip():
        raise spec_error(str(spec), None, "empty")
    name, sep, arg = spec.strip().partition(":")
    cls = REGISTRY.get(name)
    if cls is None:
        raise spec_error(name, arg if sep else None, f"unknown router {name!r}")
    cls.check_arg(arg if sep else None)
    return cls, (arg if sep else None)


def make_router(spec: str, n: int, seed: int = 0) -> Router:
    """The router ``spec`` over ``n`` engines."""
    cls, _ = router_class(spec)
    return cls(n, seed)


def argmin_from(values: list, start: int) -> int:
    """Index of the smallest value; ties go to the first one at or after ``start`` (cyclically), so an idle
    cluster spreads requests instead of piling them on engine 0."""
    n = len(values)
    best = start % n
    for k in range(1, n):
        i = (start + k) % n
        if values[i] < values[best]:
            best = i
    return best
