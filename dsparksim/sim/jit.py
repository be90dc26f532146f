"""The switch and the decorator of the compiled (numba) paths: the step kernel (:mod:`dsparksim.sim.kernel`) and the
acceptance draws' refill (:mod:`dsparksim.sim.fill_jit`). Both give the numpy code's results bit for bit; they run
when numba is installed (``pip install -e ".[fast]"``) unless ``DSPARKSIM_KERNEL=0`` (or off/false/no) is set.
"""
from __future__ import annotations

import hashlib
import importlib.util
import inspect
import os
import warnings
from typing import Any, Callable

ENV = "DSPARKSIM_KERNEL"          # "0" / "off" / "false" / "no": the numpy code everywhere


def numba_available() -> bool:
    """Whether numba is installed (the ``fast`` extra)."""
    return importlib.util.find_spec("numba") is not None


def enabled() -> bool:
    """The compiled paths may run: ``DSPARKSIM_KERNEL`` is not 0/off and numba is installed."""
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "off", "false", "no") and numba_available()


def njit_cached(fn: Callable[..., Any]) -> Any:
    """numba.njit with numpy's error model (x / 0 is inf: no check in the loops) and the machine code cached on disk;
    where numba finds no folder it can write the cache to, compiled in each process instead (a warning says so)."""
    import numba   # optional dependency (the fast extra); only the compiled modules call this

    try:
        return numba.njit(cache=True, error_model="numpy")(fn)
    except RuntimeError as err:      # numba: "cannot cache function ...: no locator available for file ..."
        if not _UNCACHED:            # said once per process, not once per function
            _UNCACHED.append(fn)
            warnings.warn(f"dsparksim: {err}; compiling in each process (~20 s; NUMBA_CACHE_DIR names a folder for "
                          "the cache)", RuntimeWarning, stacklevel=2)
        return numba.njit(error_model="numpy")(fn)


_UNCACHED: list = []     # the first function numba could not cache (the warning is given once)


_SEEN: dict[int, tuple[Any, str]] = {}


def fingerprint(obj: Any) -> str:
    """sha256 (first 16 hex digits) of a function's or class's source: what a compiled copy of Python code records
    to tell whether that code changed (edited, or patched at run time) since the copy was checked against it."""
    hit = _SEEN.get(id(obj))
    if hit is None or hit[0] is not obj:
        try:
            text = inspect.getsource(obj)
        except (OSError, TypeError):   # no source to compare: treated as changed
            text = f"<no source: {obj!r}>"
        text = text.replace("\r\n", "\n")    # a checkout with Windows line ends is the same code
        hit = _SEEN[id(obj)] = (obj, hashlib.sha256(text.encode()).hexdigest()[:16])
    return hit[1]


def changed(mirrored: dict[str, Any], recorded: dict[str, str]) -> list[str]:
    """The names in ``mirrored`` (name -> function or class now) whose code differs from ``recorded``."""
    return [name for name, obj in mirrored.items() if recorded.get(name) != fingerprint(obj)]
