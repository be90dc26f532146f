"""Command-line options that several commands share, each declared once here (issue 28, part 5).

* :func:`add_backend_options`: where the work runs (``--backend``, ``--workers``/``--jobs``, ``--ray-address``;
  :func:`check_backend_options` refuses one the backend would not read);
  :func:`add_workers_option` alone for a command with a local process pool only;
* :func:`add_seed_option` + :func:`check_seed`: ``--seed`` of the commands outside the run options (the run
  options' own ``--seed`` is RunConfig's field, ``dsparksim.config``);
* :func:`add_threads_option` + :func:`check_threads`: torch CPU threads of the torch commands;
* :func:`bar_off`: the one rule for progress bars;
* :func:`flag_spelling`: a run option's value as typed on the command line (notes that name settings).
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from dsparksim.config import run_options
from dsparksim.errors import ConfigError
from dsparksim.io.options import pos_int

BACKENDS = ("serial", "local", "ray")  # = dsparksim.sweep.backends.BACKENDS (tests/test_hygiene.py checks)
THREADS_DEFAULT = 1  # one CPU thread: the step clock of `measure` is thread CPU time only with one thread
MAX_THREADS = 1024   # --threads 100000 made torch start threads until the OS refused one (a crash, exit 139)

__all__ = ["BACKENDS", "MAX_THREADS", "THREADS_DEFAULT", "add_backend_options", "add_seed_option", "add_threads_option",
           "add_workers_option", "bar_off", "check_backend_options", "check_seed", "check_threads",
           "flag_spelling"]


def add_backend_options(p: Any, default: str | None = "local",
                        backend_help: str = "serial (this process), local (process pool) or ray (optional extra) "
                                            "[%(default)s]") -> None:
    """``--backend``, ``--workers`` (alias ``--jobs``, dest ``workers``) and ``--ray-address`` on parser or group
    ``p``. ``default``: the backend when not given (None: the command chooses, as ``backend_help`` says)."""
    p.add_argument("--backend", choices=BACKENDS, default=default, help=backend_help)
    add_workers_option(p)
    p.add_argument("--ray-address", default=None,
                   help="connect to an existing Ray cluster (e.g. ray://host:10001 or auto) instead of starting "
                        "a local instance")


def check_backend_options(args: argparse.Namespace) -> None:
    """Raise ConfigError for a backend option the chosen backend would not read (each was ignored silently by
    sweep, capacity, regress and plan): ``--ray-address`` without ``--backend ray``, ``--workers`` with
    ``--backend serial`` above 1 (every cell runs in this process: ``--workers 1`` says just that)."""
    if args.ray_address is not None and args.backend != "ray":
        got = f"--backend {args.backend}" if args.backend is not None else "no --backend"
        raise ConfigError("cli", "--ray-address", f"would be ignored: it applies to --backend ray only, got {got}; "
                          "drop it or add --backend ray")
    if args.workers is not None and args.workers > 1 and args.backend == "serial":
        raise ConfigError("cli", "--workers", "would be ignored: --backend serial runs every cell in this process, one "
                          f"at a time (got {args.workers}); drop it or use --backend local")


def add_workers_option(p: Any, default: int | None = None,
                       help: str = "worker processes / Ray CPUs [all cores]") -> None:
    """``--workers`` (alias ``--jobs``, dest ``workers``): an integer >= 1; ``default`` None = the command's choice."""
    p.add_argument("--workers", "--jobs", dest="workers", type=pos_int, default=default, help=help)


def add_seed_option(p: Any, help: str = "random seed [%(default)s]") -> None:
    """``--seed`` (an integer, default 0; :func:`check_seed` refuses a negative one in one line)."""
    p.add_argument("--seed", type=int, default=0, help=help)


def check_seed(args: argparse.Namespace) -> None:
    """Raise ConfigError unless ``--seed`` is an integer in [0, 2^63) (as a run's seed; torch's generators take
    no larger one: --seed 10**20 ended in an OverflowError traceback)."""
    if getattr(args, "seed", 0) < 0:
        raise ConfigError("cli", "--seed", f"expected a non-negative integer, got {args.seed}")
    if getattr(args, "seed", 0) >= 2**63:
        raise ConfigError("cli", "--seed", f"expected an integer below 2^63, got {args.seed}")


def add_threads_option(p: Any) -> None:
    """``--threads``: torch CPU threads (default :data:`THREADS_DEFAULT`; :func:`check_threads` refuses < 1 and
    > :data:`MAX_THREADS`)."""
    p.add_argument("--threads", type=int, default=THREADS_DEFAULT, help="torch CPU threads [%(default)s]")


def check_threads(args: argparse.Namespace) -> None:
    """Raise ConfigError unless ``--threads`` is in 1..MAX_THREADS."""
    if args.threads is not None and args.threads < 1:
        raise ConfigError("cli", "--threads", f"expected at least 1 CPU thread, got {args.threads}")
    if args.threads is not None and args.threads > MAX_THREADS:
        raise ConfigError("cli", "--threads", f"expected at most {MAX_THREADS} CPU threads (this machine has "
                          f"{os.cpu_count()} CPUs), got {args.threads}")


def refuse_empty(args: argparse.Namespace, *flags: str, noun: str = "value",
                 expected: str = "a path or spec (or leave the option out)") -> None:
    """A text option given as '' (or blanks) is an error, never its default: Path('') is the working directory, and
    an unset shell variable (``--out "$DIR"``) would silently have meant the default or written there."""
    for flag in flags:
        v = getattr(args, flag[2:].replace("-", "_"), None)
        if v is not None and not str(v).strip():
            raise ConfigError("cli", flag, f"empty {noun} {v!r}; expected {expected}")


def bar_off(args: argparse.Namespace) -> bool:
    """Progress bars go to a terminal only: a log or a pipe gets the result lines, not carriage-return noise.
    DSPARKSIM_PROGRESS=1 draws them anyway (e.g. to watch a CI log), --quiet never."""
    if getattr(args, "quiet", False):
        return True
    return not (sys.stderr.isatty() or os.environ.get("DSPARKSIM_PROGRESS", "") in ("1", "always"))


def flag_spelling(key: str, value: Any) -> str:
    """A run option (``dsparksim.config.run_options`` key) as typed on the command line: ``--prefill-chunk 16384``,
    ``--mem-fraction-static 0.82``, ``--no-mixed-prefill``."""
    flag = run_options()[key].option.flags[0]
    if isinstance(value, bool):
        return flag if value else "--no-" + flag[2:]
    return f"{flag} {value:g}" if isinstance(value, float) else f"{flag} {value}"
