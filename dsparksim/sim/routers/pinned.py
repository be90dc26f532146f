"""``pinned``: request row i goes to engine i mod n (round-robin by arrival index, a rejected request included).
In a closed loop every user is pinned to one engine (user u on engine u mod n) and sends that engine's rows in
order (e, e+n, e+2n, ...), so each engine keeps its share of the users and engines never share a request pool."""
from __future__ import annotations

from dsparksim.sim.routers.registry import Router


class Pinned(Router):
    name = usage = "pinned"
    request_only = True
    pins_users = True

    def route(self, row, engines, table) -> int:
        return row % self.n

    def user_row(self, engine: int, k: int) -> int:
        return engine + k * self.n
