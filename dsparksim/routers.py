"""Routers: which engine (replica, or DP rank) an arriving request goes to.

A router sees the engines' public state at the request's arrival time (running, waiting and inbox counts, free KV)
and returns an engine index. Adding a router means one small class and one registry line.

===================  =========================================================================================
``round-robin``      engines in turn
``random``           uniform, keyed by the request (request i goes to the same engine whatever else runs)
``least-outstanding``  fewest running + waiting + queued requests (ties: lowest index)
``least-kv``         most free KV (capacity - reserved - what queued requests will reserve; ties: fewest
                     outstanding, then lowest index)
``session``          affinity: every request of a session / prefix goes where its first one went (the first is
                     placed least-outstanding); needs session or prefix ids (Mooncake ``hash_ids``)
===================  =========================================================================================
"""
from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from dsparksim.errors import ConfigError

__all__ = ["ROUTER_NAMES", "Router", "make_router"]


class Router:
    name: ClassVar[str] = "base"
    needs_session: ClassVar[bool] = False

    def __init__(self, n: int, seed: int = 0) -> None:
        self.n = int(n)
        self.seed = int(seed)

    def route(self, row: int, engines: list[Any], table: Any) -> int:
        raise NotImplementedError


class RoundRobin(Router):
    name = "round-robin"

    def __init__(self, n: int, seed: int = 0) -> None:
        super().__init__(n, seed)
        self._next = 0

    def route(self, row, engines, table) -> int:
        e = self._next
        self._next = (e + 1) % self.n
        return e


class Random(Router):
    name = "random"

    def __init__(self, n: int, seed: int = 0) -> None:
        super().__init__(n, seed)
        from dsparksim.streams import RequestStreams
        self._streams = RequestStreams(seed, purpose=7)

    def route(self, row, engines, table) -> int:
        u = self._streams.rows(self._streams.request_keys(np.array([row])), -1, 1).random(1)[0]
        return min(int(u * self.n), self.n - 1)


class LeastOutstanding(Router):
    name = "least-outstanding"

    def route(self, row, engines, table) -> int:
        best, best_v = 0, None
        for i, e in enumerate(engines):
            v = e.outstanding
            if best_v is None or v < best_v:
                best, best_v = i, v
        return best


class LeastKV(Router):
    name = "least-kv"

    def route(self, row, engines, table) -> int:
        best, best_v = 0, None
        for i, e in enumerate(engines):
            v = (-e.free_kv, e.outstanding)
            if best_v is None or v < best_v:
                best, best_v = i, v
        return best


class Session(Router):
    name = "session"
    needs_session = True

    def __init__(self, n: int, seed: int = 0) -> None:
        super().__init__(n, seed)
        self._home: dict[int, int] = {}
        self._first = LeastOutstanding(n, seed)

    def route(self, row, engines, table) -> int:
        s = int(table.session[row])
        if s < 0:
            return self._first.route(row, engines, table)
        e = self._home.get(s)
        if e is None:
            e = self._home[s] = self._first.route(row, engines, table)
        return e


_REGISTRY: dict[str, type[Router]] = {c.name: c for c in (RoundRobin, Random, LeastOutstanding, LeastKV, Session)}
ROUTER_NAMES = tuple(_REGISTRY)


def make_router(name: str, n: int, seed: int = 0) -> Router:
    """The router called ``name`` over ``n`` engines."""
    cls = _REGISTRY.get(name)
    if cls is None:
        raise ConfigError("config", "router", f"unknown router {name!r}; expected one of {', '.join(ROUTER_NAMES)}")
    return cls(n, seed)
