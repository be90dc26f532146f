"""Where cells run: serially in this process, in a local process pool, or on Ray.

Every backend runs the same function (:func:`execute_cell`) on the same RunConfig, and each cell carries its own
seed, so results are identical whatever the backend; backends only have to keep the cell -> result mapping.
Results stream back through ``on_result`` as they finish (the driver writes them to the cache at once, which is
what makes an interrupted sweep resumable). A cell that raises comes back as a failed result, never as an
exception that stops the other cells.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import time
import traceback
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from dsparksim.config import RunConfig
from dsparksim.errors import ConfigError

BACKENDS = ("serial", "local", "ray")


@dataclass(frozen=True)
class Task:
    index: int
    config: RunConfig
    save_requests: bool = False


def execute_cell(task: Task) -> dict[str, Any]:
    """Simulate one cell; any exception becomes a failed result carrying its message and traceback."""
    from dsparksim.config import _jsonable
    from dsparksim.sweep.cells import code_fingerprint

    t0 = time.perf_counter()
    res: dict[str, Any] = {"index": task.index, "pid": os.getpid(), "code": code_fingerprint()}
    try:
        from dsparksim.simulate import simulate

        out = simulate(task.config)
        res.update(ok=True, summary=out.summary, inputs=_jsonable(out.inputs),
                   requests=out.requests() if task.save_requests else None)
    except Exception as e:  # noqa: BLE001 -- reported per cell, the sweep goes on
        res.update(ok=False, error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc())
    res["wall_s"] = time.perf_counter() - t0
    return res


def _failed(task: Task, error: str) -> dict[str, Any]:
    return {"index": task.index, "ok": False, "error": error, "traceback": "", "wall_s": 0.0, "pid": None,
            "code": None}


def _cost_hint(cfg: RunConfig) -> float:
    t = cfg.traffic
    return float(t.concurrency or t.rate or t.time_scale or 1.0) * float(t.duration_s or 1.0)


def _longest_first(tasks: Sequence[Task]) -> list[Task]:
    # Highest load first keeps every worker busy to the end instead of waiting on one long straggler.
    return sorted(tasks, key=lambda t: -_cost_hint(t.config))


class SerialBackend:
    """Run cells one after the other in this process (the reference for determinism; easy to debug)."""

    name = "serial"
    workers = 1

    def run(self, tasks: Sequence[Task], on_result: Callable[[dict[str, Any]], None]) -> None:
        for t in tasks:
            on_result(execute_cell(t))


class LocalPoolBackend:
    """A local process pool (fork on POSIX). A worker that dies fails its cell(s); the rest still run."""

    name = "local"

    def __init__(self, workers: int | None = None):
        self.workers = max(1, workers or os.cpu_count() or 1)

    def run(self, tasks: Sequence[Task], on_result: Callable[[dict[str, Any]], None]) -> None:
        if not tasks:
            return
        ctx = mp.get_context("fork" if os.name == "posix" else "spawn")
        ex = ProcessPoolExecutor(max_workers=min(self.workers, len(tasks)), mp_context=ctx)
        try:
            futs = {ex.submit(execute_cell, t): t for t in _longest_first(tasks)}
            pending = set(futs)
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for f in done:
                    try:
                        res = f.result()
                    except Exception as e:  # noqa: BLE001 -- e.g. BrokenProcessPool: the worker died
                        res = _failed(futs[f], f"worker failed: {type(e).__name__}: {e}")
                    on_result(res)
        finally:
            ex.shutdown(wait=True, cancel_futures=True)


class RayBackend:
    """Ray: a local instance with ``workers`` CPUs, or an existing cluster at ``address``.

    The cluster's workers must have the same dsparksim installed; each result carries the worker's code
    fingerprint and a mismatch fails the cell (a result from other code must not be cached under this hash).
    """

    name = "ray"

    def __init__(self, workers: int | None = None, address: str | None = None):
        self.workers = max(1, workers or os.cpu_count() or 1)
        self.address = address

    def run(self, tasks: Sequence[Task], on_result: Callable[[dict[str, Any]], None]) -> None:
        ray = import_ray()
        started = False
        if not ray.is_initialized():
            if self.address:
                try:
                    ray.init(address=self.address, log_to_driver=False)
                except (ConnectionError, RuntimeError, ValueError) as e:
                    raise ConfigError("--ray-address", "ray_address", f"cannot connect to a Ray cluster at "
                                      f"{self.address!r}: {type(e).__name__}: {e}") from None
            else:
                # address="local": always a fresh instance, even if a `ray start` cluster runs on this machine
                ray.init(address="local", num_cpus=self.workers, include_dashboard=False, log_to_driver=False)
            started = True
        try:
            remote = ray.remote(num_cpus=1, max_retries=0)(execute_cell)
            refs = {remote.remote(t): t for t in _longest_first(tasks)}
            pending = list(refs)
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                for r in done:
                    try:
                        res = ray.get(r)
                    except Exception as e:  # noqa: BLE001 -- a dead worker or node fails only its cell
                        res = _failed(refs[r], f"ray task failed: {type(e).__name__}: {e}")
                    on_result(res)
        finally:
            if started:
                ray.shutdown()


def import_ray():
    """Import ray lazily (an optional extra: ``pip install 'dsparksim[ray]'``)."""
    try:
        import ray
    except ImportError:
        raise ConfigError("--backend", "ray", "Ray is not installed; pip install 'dsparksim[ray]' "
                          "(or use --backend local)") from None
    return ray


def make_backend(name: str = "local", workers: int | None = None, address: str | None = None):
    """Backend by name: serial | local | ray."""
    if name == "serial":
        return SerialBackend()
    if name == "local":
        return LocalPoolBackend(workers)
    if name == "ray":
        return RayBackend(workers, address)
    raise ConfigError("--backend", "backend", f"expected one of {', '.join(BACKENDS)}, got {name!r}")
