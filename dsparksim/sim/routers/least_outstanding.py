"""``least-outstanding``: fewest running + waiting + queued requests (ties: in turn, round-robin). Load-aware."""
from __future__ import annotations

from dsparksim.sim.routers.registry import Router, argmin_from


class LeastOutstanding(Router):
    name = usage = "least-outstanding"

    def route(self, row, engines, table, start: int | None = None) -> int:
        if start is None:
            start = self.turn()
        return argmin_from([e.outstanding for e in engines], start)
