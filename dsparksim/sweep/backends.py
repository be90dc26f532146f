"""Where cells run: serially in this process, in a local process pool, or on Ray.

Every backend runs the same function (:func:`execute_cell`, or the ``fn`` given to ``run``: a fleet's shards) on the
same RunConfig, and each cell carries its own seed, so results are identical whatever the backend; backends only
have to keep the cell -> result mapping. Results stream back through ``on_result`` as they finish (the driver
writes them to the cache at once, which is what makes an interrupted sweep resumable). A cell that raises comes back as a failed result (its error as one
line, and the exception itself so a caller can re-raise it), never as an exception that stops the other cells.

To stop early, ``on_result`` raises: the backend then cancels every pending cell, terminates its workers and
re-raises. Ctrl-C does the same. Pool workers ignore SIGINT (only the parent handles it) and die with their parent
(PR_SET_PDEATHSIG on Linux, a watcher thread elsewhere), so neither Ctrl-C nor a SIGKILL leaves orphans.
"""
from __future__ import annotations

import ctypes
import contextlib
import multiprocessing as mp
import os
import pickle
import signal
import threading
import time
import traceback
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

from dsparksim.config import jsonable, RunConfig
from dsparksim.errors import ConfigError, InputError, MissingExtraError, one_line
from dsparksim.sweep.cells import code_fingerprint

BACKENDS = ("serial", "local", "ray")


@dataclass(frozen=True)
class Task:
    index: int
    config: RunConfig
    save_requests: bool = False


def execute_cell(task: Task) -> dict[str, Any]:
    """Simulate one cell; any exception becomes a failed result carrying its one-line message, its traceback and
    (when it pickles) the exception itself."""

    t0 = time.perf_counter()
    res: dict[str, Any] = {"index": task.index, "pid": os.getpid(), "code": code_fingerprint()}
    try:
        # looked up per call, not bound at import: a forked worker runs the simulate its parent patched (tests)
        from dsparksim.sim.simulate import simulate
        out = simulate(task.config)
        res.update(ok=True, summary=out.summary, inputs=jsonable(out.inputs),
                   requests=out.requests() if task.save_requests else None)
    except Exception as e:  # noqa: BLE001 -- reported per cell, the sweep goes on
        res.update(ok=False, error=one_line(e), traceback=traceback.format_exc(), exception=portable(e))
    res["wall_s"] = time.perf_counter() - t0
    return res


def portable(e: BaseException) -> BaseException | None:
    # An exception that does not survive pickling would break the result's trip to the parent (the pool would
    # count the worker as crashed); the one-line message and the traceback still go.
    try:
        pickle.loads(pickle.dumps(e))
    except Exception:  # noqa: BLE001
        return None
    return e


def cell_exception(res: dict[str, Any]) -> BaseException:
    """The exception to raise in the parent for a failed result: the worker's own (an InputError keeps its one
    line; anything else gets the worker's traceback as a note), else a RuntimeError with the message."""
    e = res.get("exception")
    if e is None:
        e = RuntimeError(f"cell {res['index']} failed: {res['error']}")
    if not isinstance(e, InputError) and res.get("traceback") and res.get("pid") not in (None, os.getpid()):
        e.add_note(f"in worker process {res.get('pid')} (cell {res['index']}):\n{res['traceback'].rstrip()}")
    return e


def _failed(task: Task, how: str, e: BaseException) -> dict[str, Any]:
    """The result of a cell whose worker died (no result came back): one line, the full text as traceback."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return {"index": task.index, "ok": False, "error": f"{how}: {type(e).__name__}: {lines[-1] if lines else ''}",
            "traceback": str(e), "wall_s": 0.0, "pid": None, "code": None}


def _cost_hint(cfg: RunConfig) -> float:
    t = cfg.traffic
    return float(t.concurrency or t.rate or t.time_scale or 1.0) * float(t.duration_s or 1.0)


def _longest_first(tasks: Sequence[Task]) -> list[Task]:
    # Highest load first keeps every worker busy to the end instead of waiting on one long straggler.
    return sorted(tasks, key=lambda t: -_cost_hint(t.config))


# ---- pool workers: no SIGINT, no life after the parent ------------------------------------------------------------

_PR_SET_PDEATHSIG = 1


def _worker_init(parent_pid: int) -> None:
    """Pool worker initializer: ignore Ctrl-C (the parent handles it and terminates the pool) and die with the
    parent, even when it is SIGKILLed."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):  # the parent blocked SIGINT around the fork (see _sigint_blocked)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    if not _set_pdeathsig(signal.SIGKILL):
        threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True, name="dsparksim-parent-watch").start()
    if os.getppid() != parent_pid:  # the parent died before the death signal was armed
        os._exit(1)


def _set_pdeathsig(sig: int) -> bool:
    """Ask Linux to send ``sig`` to this process when its parent dies (prctl PR_SET_PDEATHSIG); False elsewhere."""
    try:

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch_parent(parent_pid: int, period_s: float = 0.5) -> None:
    # Portable fallback: once the parent is gone the worker is re-parented, so getppid() changes.
    while os.getppid() == parent_pid:
        time.sleep(period_s)
    os._exit(1)


@contextlib.contextmanager
def _sigint_blocked() -> Iterator[None]:
    """Hold SIGINT while workers are forked: a Ctrl-C then reaches the parent (after this block), never a worker
    that has not yet run its initializer."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _kill_pool(ex: ProcessPoolExecutor) -> None:
    """Stop a pool now: cancel queued cells and terminate the workers (running cells are abandoned)."""
    procs = list((getattr(ex, "_processes", None) or {}).values())  # no public API before Python 3.14
    for p in procs:
        with contextlib.suppress(Exception):
            p.terminate()
    for p in procs:
        with contextlib.suppress(Exception):
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join(5)
    ex.shutdown(wait=True, cancel_futures=True)


class SerialBackend:
    """Run cells one after the other in this process (the reference for determinism; easy to debug)."""

    name = "serial"
    workers = 1

    def run(self, tasks: Sequence[Task], on_result: Callable[[dict[str, Any]], None],
            fn: Callable[[Any], dict[str, Any]] = execute_cell) -> None:
        for t in tasks:
            on_result(fn(t))


class LocalPoolBackend:
    """A local process pool (fork on POSIX). A worker that dies (e.g. killed for memory) breaks the pool: the cells
    not finished by then come back failed, and a rerun of the sweep retries them."""

    name = "local"

    def __init__(self, workers: int | None = None):
        self.workers = max(1, workers or os.cpu_count() or 1)

    def run(self, tasks: Sequence[Task], on_result: Callable[[dict[str, Any]], None],
            fn: Callable[[Any], dict[str, Any]] = execute_cell) -> None:
        if not tasks:
            return
        ctx = mp.get_context("fork" if os.name == "posix" else "spawn")
        ex = ProcessPoolExecutor(max_workers=min(self.workers, len(tasks)), mp_context=ctx,
                                 initializer=_worker_init, initargs=(os.getpid(),))
        finished = False
        try:
            with _sigint_blocked():  # the workers are forked by the first submit
                futs = {ex.submit(fn, t): t for t in _longest_first(tasks)}
            pending = set(futs)
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for f in done:
                    try:
                        res = f.result()
                    except Exception as e:  # noqa: BLE001 -- e.g. BrokenProcessPool: the worker died
                        res = _failed(futs[f], "worker failed", e)
                    on_result(res)
            finished = True
        finally:
            if finished:
                ex.shutdown(wait=True)
            else:  # on_result aborted, Ctrl-C, or any other exit: nothing may keep running
                _kill_pool(ex)


class RayBackend:
    """Ray: a local instance with ``workers`` CPUs, or an existing cluster at ``address``.

    The cluster's workers must have the same dsparksim installed; each result carries the worker's code
    fingerprint and a mismatch fails the cell (a result from other code must not be cached under this hash).
    """

    name = "ray"

    def __init__(self, workers: int | None = None, address: str | None = None):
        self.workers = max(1, workers or os.cpu_count() or 1)
        self.address = address

    def run(self, tasks: Sequence[Task], on_result: Callable[[dict[str, Any]], None],
            fn: Callable[[Any], dict[str, Any]] = execute_cell) -> None:
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
        refs: dict[Any, Task] = {}
        pending: list[Any] = []
        try:
            remote = ray.remote(num_cpus=1, max_retries=0)(fn)
            refs = {remote.remote(t): t for t in _longest_first(tasks)}
            pending = list(refs)
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                for r in done:
                    try:
                        res = ray.get(r)
                    except Exception as e:  # noqa: BLE001 -- a dead worker or node fails only its cell
                        res = _failed(refs[r], "ray task failed", e)
                    on_result(res)
        finally:
            if pending:  # aborted (on_result raised, Ctrl-C): stop the cells still queued or running
                for r in pending:
                    with contextlib.suppress(Exception):
                        ray.cancel(r, force=True)
            if started:
                ray.shutdown()


def import_ray():
    """Import ray lazily (an optional extra: ``pip install 'dsparksim[ray]'``)."""
    try:
        import ray  # optional: ray
    except ImportError:
        raise MissingExtraError("ray", "ray", "--backend ray", "use --backend local") from None
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
