"""Routers that spread requests over engine replicas (``--replicas N --router NAME``).

``ROUTER_NAMES`` is the list the configuration validates ``EngineConfig.router`` against; the routers themselves
live here too.
"""
from __future__ import annotations

ROUTER_NAMES = ("round-robin", "random", "least-outstanding", "least-kv", "session")
