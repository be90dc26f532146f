"""``random``: a uniform choice keyed by the request (request i goes to the same engine whatever else runs)."""
from __future__ import annotations

import numpy as np

from dsparksim.sim.routers.registry import Router
from dsparksim.sim.streams import RequestStreams


def keyed_choice(streams: RequestStreams, key_id: int, n: int) -> int:
    """A uniform engine index in 0..n-1, a pure function of (the streams' seed, ``key_id``)."""
    u = streams.rows(streams.request_keys(np.array([key_id])), -1, 1).random(1)[0]
    return min(int(u * n), n - 1)


class Random(Router):
    name = usage = "random"
    request_only = True

    def __init__(self, n: int, seed: int = 0) -> None:
        super().__init__(n, seed)
        self._streams = RequestStreams(seed, purpose=7)

    def route(self, row, engines, table) -> int:
        return keyed_choice(self._streams, row, self.n)
