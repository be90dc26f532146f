"""Routers: which engine (replica, or DP rank) an arriving request goes to, and their registry.

A router sees the engines' public state at the request's arrival time (running, waiting and inbox counts, free KV)
and returns an engine index. Adding a router = one small module with a :class:`Router` subclass (``name``,
``route``; ``request_only`` when it decides from the request alone) and one line in ``REGISTRY`` below.

=====================  =====================================================================================
``round-robin``        engines in turn (request-only)
``random``             uniform, keyed by the request (request-only)
``pinned``             row i to engine i mod n; closed-loop users pinned to an engine (request-only)
``session-hash``       keyed hash of the session / prefix id (request-only; needs session ids)
``least-outstanding``  fewest running + waiting + queued requests (ties: in turn)
``least-kv``           most free KV (ties: fewest outstanding, then in turn)
``session``            affinity: a session's requests go where its first went, placed least-outstanding
=====================  =====================================================================================

Request-only routers (``Router.request_only``) make replicas independent, so a run can be sharded across
processes (:mod:`dsparksim.sim.shard`); load-aware ones cannot.
"""
from __future__ import annotations

from dsparksim.sim.routers.keyed_random import Random
from dsparksim.sim.routers.least_kv import LeastKV
from dsparksim.sim.routers.least_outstanding import LeastOutstanding
from dsparksim.sim.routers.pinned import Pinned
from dsparksim.sim.routers.registry import REGISTRY, Router, make_router, request_only_names, router_class
from dsparksim.sim.routers.round_robin import RoundRobin
from dsparksim.sim.routers.session import Session
from dsparksim.sim.routers.session_hash import SessionHash

REGISTRY.update({
    "round-robin": RoundRobin,
    "random": Random,
    "least-outstanding": LeastOutstanding,
    "least-kv": LeastKV,
    "session": Session,
    "pinned": Pinned,
    "session-hash": SessionHash,
})
ROUTER_NAMES = tuple(REGISTRY)

__all__ = ["REGISTRY", "ROUTER_NAMES", "Router", "make_router", "request_only_names", "router_class"]
