"""``session-hash``: affinity by a keyed hash of the session / prefix id (a request without one: keyed by the
request, as ``random``). Decides from the request alone. Needs session or prefix ids."""
from __future__ import annotations

from dsparksim.sim.routers.keyed_random import keyed_choice
from dsparksim.sim.routers.registry import Router
from dsparksim.sim.streams import RequestStreams


class SessionHash(Router):
    name = usage = "session-hash"
    request_only = True
    needs_session = True

    def __init__(self, n: int, seed: int = 0) -> None:
        super().__init__(n, seed)
        self._by_session = RequestStreams(seed, purpose=8)
        self._by_row = RequestStreams(seed, purpose=7)

    def route(self, row, engines, table) -> int:
        s = int(table.session[row])
        return keyed_choice(self._by_row, row, self.n) if s < 0 else keyed_choice(self._by_session, s, self.n)
