"""``least-kv``: most free KV (capacity - reserved - what queued requests will reserve; ties: fewest outstanding,
then in turn). Load-aware."""
from __future__ import annotations

from dsparksim.sim.routers.registry import Router, argmin_from


class LeastKV(Router):
    name = usage = "least-kv"

    def route(self, row, engines, table) -> int:
        start = self.turn()
        return argmin_from([(-e.free_kv, e.outstanding) for e in engines], start)
