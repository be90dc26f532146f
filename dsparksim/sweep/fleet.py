"""A fleet run sharded across the local process pool or Ray (:mod:`dsparksim.sim.shard` says when it may be).

``run_fleet(cfg, backend, workers)`` cuts the replicas into one contiguous range per worker, simulates each range
in a worker (:func:`execute_shard`, through the sweep backends) and merges the parts into the RunOutput that
``simulate(cfg)`` returns in one process, bit for bit."""
from __future__ import annotations

import os
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable

from dsparksim.config import RunConfig
from dsparksim.errors import one_line
from dsparksim.sim.cluster import ShardPart
from dsparksim.sim.shard import check_shardable, simulate_part, simulate_sharded
from dsparksim.sim.simulate import RunOutput
from dsparksim.sweep.backends import cell_exception, make_backend, portable

__all__ = ["ShardTask", "execute_shard", "run_fleet"]


@dataclass(frozen=True)
class ShardTask:
    index: int
    config: RunConfig
    lo: int
    hi: int


def execute_shard(task: ShardTask) -> dict[str, Any]:
    """Simulate one shard; an exception comes back as a failed result (its one line and traceback)."""
    t0, c0 = time.perf_counter(), time.process_time()
    res: dict[str, Any] = {"index": task.index, "pid": os.getpid(), "replicas": (task.lo, task.hi)}
    try:
        res.update(ok=True, part=simulate_part(task.config, task.lo, task.hi))
    except Exception as e:  # noqa: BLE001 -- re-raised in the parent by run_fleet
        res.update(ok=False, error=one_line(e), traceback=traceback.format_exc(), exception=portable(e))
    res["wall_s"], res["cpu_s"] = time.perf_counter() - t0, time.process_time() - c0
    return res


def run_fleet(cfg: RunConfig, backend: str = "local", workers: int | None = None, address: str | None = None,
              on_shard: Callable[[dict[str, Any]], None] | None = None) -> RunOutput:
    """Simulate ``cfg`` in ``min(workers, replicas)`` shards on ``backend`` (serial | local | ray).
    ``on_shard(result)``: called with each shard's result (``replicas`` (lo, hi), ``wall_s``, ``cpu_s``)."""
    check_shardable(cfg)   # before any worker starts
    be = make_backend(backend, workers, address)
    shards = workers or getattr(be, "workers", 1) or 1

    def run_parts(c: RunConfig, ranges: list[tuple[int, int]]) -> list[ShardPart]:
        done: dict[int, dict[str, Any]] = {}
        be.run([ShardTask(i, c, lo, hi) for i, (lo, hi) in enumerate(ranges)],
               lambda r: done.__setitem__(r["index"], r), fn=execute_shard)
        if on_shard is not None:
            for i in sorted(done):
                on_shard(done[i])
        for i in range(len(ranges)):
            if not done[i]["ok"]:
                raise cell_exception(done[i])
        return [done[i]["part"] for i in range(len(ranges))]

    return simulate_sharded(cfg, shards, run_parts)
