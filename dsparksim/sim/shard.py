"""Fleet runs sharded across processes: replicas that never interact are simulated apart and merged.

When the router decides from the request alone (``Router.request_only``: round-robin, random, pinned,
session-hash), which replica serves a request never depends on another replica's state, so each shard (a range of
replicas) simulates its replicas in its own SimPy environment: it replays every arrival (the same timeouts, so its
clock takes the same values), routes every request (a router's state follows the requests routed, not the
engines) and queues only those routed to its replicas. :func:`merge` rebuilds the cluster's result from the
shards' rows and step logs; it equals the one-process result bit for bit (tested).

Replicas interact, and a run is not sharded (:func:`refusal` says why in one line), when the router reads the
engines' load, when a closed loop's users are shared by all replicas (only ``pinned`` pins them to a replica),
with a disaggregated prefill pool, or with the benchmark client's concurrency cap or warm-up."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Callable, Sequence

import numpy as np

from dsparksim.config import RunConfig
from dsparksim.errors import ConfigError
from dsparksim.sim.cluster import TABLE_COLUMNS, ShardPart, SimResult, nothing_fits, pool_ran_out, result_of
from dsparksim.sim.kv import R_LEN
from dsparksim.sim.routers import request_only_names, router_class
from dsparksim.sim.simulate import RunOutput, prepare

__all__ = ["refusal", "interaction", "check_shardable", "shard_ranges", "simulate_part", "merge", "simulate_sharded"]


def refusal(cfg: RunConfig) -> str | None:
    """Why the replicas of ``cfg`` interact (one line), or None when it can be sharded."""
    why = interaction(cfg)
    return None if why is None else why[1]


def interaction(cfg: RunConfig) -> tuple[str, str] | None:
    """(the field, why) when the replicas of ``cfg`` interact, else None."""
    e, t = cfg.engine, cfg.traffic
    cls, _ = router_class(e.router)
    ok = ", ".join(request_only_names())
    if not cls.request_only:
        return "router", (f"router '{e.router}' reads the replicas' load when it routes, so replicas interact; "
                          f"shard with a router that decides from the request alone ({ok})")
    if t.mode == "closed" and not cls.pins_users:
        return "router", (f"in a closed loop under router '{e.router}' a request finished on one replica sends the "
                          "user's next request to any replica, so replicas interact; use --router pinned (users "
                          "pinned to replicas)")
    if e.disaggregated:
        return "disaggregated", "the disaggregated prefill pool is shared by all replicas"
    if t.max_concurrency is not None:
        return "max_concurrency", "the benchmark client's concurrency cap is shared by all replicas"
    if t.num_warmup_prompts:
        return "num_warmup_prompts", ("the benchmark client's warm-up ends when every replica's warm-up requests "
                                      "have finished")
    return None


def check_shardable(cfg: RunConfig) -> None:
    """ConfigError (one line) unless ``cfg`` can be sharded."""
    why = interaction(cfg)
    if why is not None:
        raise ConfigError("config", why[0], f"cannot shard this run across processes: {why[1]}")


def shard_ranges(replicas: int, shards: int) -> list[tuple[int, int]]:
    """Contiguous replica ranges [lo, hi), as even as possible, at most one per replica."""
    k = max(1, min(int(shards), int(replicas)))
    cut = [replicas * i // k for i in range(k + 1)]
    return [(cut[i], cut[i + 1]) for i in range(k)]


def simulate_part(cfg: RunConfig, lo: int, hi: int) -> ShardPart:
    """Simulate replicas lo..hi-1 of ``cfg`` (in a worker process)."""
    part = prepare(cfg, shard=(lo, hi)).sim.run()
    assert isinstance(part, ShardPart)
    return part


def merge(parts: Sequence[ShardPart]) -> SimResult:
    """The cluster's result from its shards' parts (any order; together they cover every replica once)."""
    parts = sorted(parts, key=lambda p: p.shard)
    first = parts[0]
    covered = [r for p in parts for r in range(*p.shard)]
    if covered != list(range(first.meta["replicas"])):
        raise ValueError(f"shards {[p.shard for p in parts]} do not cover replicas 0..{first.meta['replicas'] - 1}")
    rows = np.unique(np.concatenate([p.rows for p in parts]))
    if not first.pinned and not np.array_equal(rows, np.arange(first.issued)):
        raise ValueError(f"the shards own {len(rows)} rows, not the {first.issued} issued")
    tab = SimpleNamespace(**{k: np.empty(len(rows), first.columns[k].dtype) for k in TABLE_COLUMNS})
    for p in parts:   # a rejected row is in every open-loop shard, alike; any other row in its replica's shard
        at = np.searchsorted(rows, p.rows)
        for k in TABLE_COLUMNS:
            getattr(tab, k)[at] = p.columns[k]
    logs = {e: lg for p in parts for e, lg in p.logs.items()}
    accs = {e: a for p in parts for e, a in p.acc.items()}
    order = sorted(logs)
    ended = "duration" if any(p.ended_by == "duration" for p in parts) else first.ended_by
    now = max(p.sim_time_s for p in parts)
    if first.closed_loop and first.duration_s is not None and ended != "duration":
        raise pool_ran_out(first.n_rows, now, first.duration_s)
    n_rej = int((tab.reject > 0).sum())
    if len(rows) and n_rej == len(rows):
        raise nothing_fits(n_rej, first.meta["kv_capacity_tokens"], first.max_model_len,
                           bool(np.any(tab.reject == R_LEN)))
    gaps = {e: g.copy() for p in parts for e, g in p.gaps.items()}
    for g in gaps.values():          # table rows -> positions in the merged table
        g[:, 0] = np.searchsorted(rows, g[:, 0])
    return result_of(tab, slice(None), [logs[e] for e in order], [accs[e] for e in order],
                     request_id=rows if first.pinned else None, sim_time_s=now, ended_by=ended,
                     notes=first.notes, gaps=[gaps.get(e, np.zeros((0, 3), np.int64)) for e in order], **first.meta)


def simulate_sharded(cfg: RunConfig, shards: int,
                     run_parts: Callable[[RunConfig, list[tuple[int, int]]], list[ShardPart]]) -> RunOutput:
    """Simulate ``cfg`` as ``shards`` shards; ``run_parts(cfg, ranges)`` runs :func:`simulate_part` for each range
    (serially, in a process pool, on Ray) and returns the parts. The same RunOutput as ``simulate(cfg)``."""
    check_shardable(cfg)
    prep = prepare(cfg)   # checks the configuration and resolves what the summary reports; not run here
    parts = run_parts(cfg, shard_ranges(cfg.engine.replicas, shards))
    return prep.output(merge(parts))
