"""``session``: affinity; every request of a session / prefix goes where its first one went (the first is placed
least-outstanding, ties by the session id, so it is load-aware). Needs session or prefix ids."""
from __future__ import annotations

from dsparksim.sim.routers.least_outstanding import LeastOutstanding
from dsparksim.sim.routers.registry import Router


class Session(Router):
    name = usage = "session"
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
