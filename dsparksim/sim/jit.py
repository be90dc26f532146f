"""The switch and the decorator of the compiled (numba) paths: the step kernel (:mod:`dsparksim.sim.kernel`) and the
acceptance draws' refill (:mod:`dsparksim.sim.fill_jit`). Both give the numpy code's results bit for bit; they run
when numba is installed (``pip install -e ".[fast]"``) unless ``DSPARKSIM_KERNEL=0`` (or off/false/no) is set.
"""
from __future__ import annotations

import importlib.util
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
        warnings.warn(f"dsparksim: {err}; compiling in each process (NUMBA_CACHE_DIR names a folder for the cache)",
                      RuntimeWarning, stacklevel=2)
        return numba.njit(error_model="numpy")(fn)
