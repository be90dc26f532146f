"""``round-robin``: engines in turn, in the order requests are routed (a rejected request takes no turn)."""
from __future__ import annotations

from dsparksim.sim.routers.registry import Router


class RoundRobin(Router):
    name = usage = "round-robin"
    request_only = True

    def route(self, row, engines, table) -> int:
        return self.turn()
