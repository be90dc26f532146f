"""Routers: which engine (replica, or DP rank) an arriving request goes to.

A router sees the engines' public state at the request's arrival time (running, waiting and inbox counts, free KV)
and returns an engine index. Adding a router means one small class and one registry line.

===================  =========================================================================================
``round-robin``      engines in turn
``random``           uniform, keyed by the request (request i goes to the same engine whatever else runs)
``least-outstanding``  fewest running + waiting + queued requests (ties: in turn, round-robin)
``least-kv``         most free KV (capacity - reserved - what queued requests will reserve; ties: fewest
                     outstanding, then in turn)
``session``          affinity: every request of a session / prefix goes where its first one went (the first is
                     placed least-outstanding, ties by the session id); needs session or prefix ids (Mooncake
                     ``hash_ids``: the first block not every request shares)
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
        self._next = 0

    def _turn(self) -> int:
        """The engine whose turn it is (cycles 0..n-1): round-robin order and the routers' tie-break."""
        e = self._next
        self._next = (e + 1) % self.n
        return e

    def route(self, row: int, engines: list[Any], table: Any) -> int:
        raise NotImplementedError


class RoundRobin(Router):
    name = "round-robin"

    def route(self, row, engines, table) -> int:
        return self._turn()


class Random(Router):
    name = "random"

    def __init__(self, n: int, seed: int = 0) -> None:
        super().__init__(n, seed)
        from dsparksim.sim.streams import RequestStreams
        self._streams = RequestStreams(seed, purpose=7)

    def route(self, row, engines, table) -> int:
        u = self._streams.rows(self._streams.request_keys(np.array([row])), -1, 1).random(1)[0]
        return min(int(u * self.n), self.n - 1)


def _argmin_from(values: list, start: int) -> int:
    """Index of the smallest value; ties go to the first one at or after ``start`` (cyclically), so an idle
    cluster spreads requests instead of piling them on engine 0."""
    n = len(values)
    best = start % n
    for k in range(1, n):
        i = (start + k) % n
        if values[i] < values[best]:
            best = i
    return best


class LeastOutstanding(Router):
    name = "least-outstanding"

    def route(self, row, engines, table, start: int | None = None) -> int:
        if start is None:
            start = self._turn()
        return _argmin_from([e.outstanding for e in engines], start)


class LeastKV(Router):
    name = "least-kv"

    def route(self, row, engines, table) -> int:
        start = self._turn()
        return _argmin_from([(-e.free_kv, e.outstanding) for e in engines], start)


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
            e = self._home[s] = self._first.route(row, engines, table, start=s % self.n)
        return e


_REGISTRY: dict[str, type[Router]] = {c.name: c for c in (RoundRobin, Random, LeastOutstanding, LeastKV, Session)}
ROUTER_NAMES = tuple(_REGISTRY)


def make_router(name: str, n: int, seed: int = 0) -> Router:
    """The router called ``name`` over ``n`` engines."""
    cls = _REGISTRY.get(name)
    if cls is None:
        raise ConfigError("config", "router", f"unknown router {name!r}; expected one of {', '.join(ROUTER_NAMES)}")
    return cls(n, seed)
