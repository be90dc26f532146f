"""On-disk results of a sweep, keyed by cell hash; every file is written atomically (temp file + rename).

Layout under the sweep's output folder::

    cells/<hash>/config.json      the RunConfig, its axis values, resolved inputs, input hashes, version
    cells/<hash>/requests.parquet per-request table (only with save_requests; .csv without pyarrow)
    cells/<hash>/summary.json     written LAST: its presence means the cell finished (a cached result)
    cells/<hash>/error.json       a failed attempt (never a result; the cell is retried on the next run)

A summary.json that does not parse or lacks fields (a disk error, a hand edit) is not a result: it is reported in
one warning line naming the file, removed, and the cell is computed again.
"""
from __future__ import annotations

import contextlib
import json
import shutil
import logging
from pathlib import Path
from typing import Any

import pandas as pd

from dsparksim.config import jsonable
from dsparksim.errors import ConfigError
from dsparksim.results.metrics import SUMMARY_FIELDS
from dsparksim.results.outputs import atomic_write

log = logging.getLogger(__name__)


def write_json(path: Path, obj: Any) -> None:
    # Full float precision (repr round-trips exactly) so a cached result equals a fresh one bit for bit.
    atomic_write(path, lambda p: p.write_text(json.dumps(jsonable(obj), indent=1, allow_nan=True) + "\n"))


def write_frame(path: Path, df: pd.DataFrame) -> None:
    if path.suffix == ".parquet":
        atomic_write(path, lambda p: df.to_parquet(p, index=False))
    else:
        atomic_write(path, lambda p: df.to_csv(p, index=False))


def have_parquet() -> bool:
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        return False
    return True


class CellCache:
    """Finished and failed cells of one output folder."""

    def __init__(self, out_dir: str | Path):
        self.root = Path(out_dir)
        self.cells = self.root / "cells"

    def dir(self, h: str) -> Path:
        return self.cells / h

    def done(self, h: str) -> bool:
        return self.get(h) is not None

    def load(self, h: str) -> dict[str, Any]:
        rec = self.get(h)
        if rec is None:
            raise FileNotFoundError(self.dir(h) / "summary.json")
        return rec

    def get(self, h: str) -> dict[str, Any] | None:
        """The cached result of cell ``h``, or None if there is none. A corrupt one is removed with a warning."""
        path = self.dir(h) / "summary.json"
        if path.exists() and not path.is_file():  # e.g. a directory in its place: it would block the rewrite too
            log.warning("dsparksim: warning: corrupt cached cell %s (not a regular file); computing it again", path)
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
            return None
        if not path.is_file():
            return None
        try:
            rec = json.loads(path.read_text(encoding="utf-8"))
            problem = _problem(rec, h)
        except (OSError, ValueError) as e:  # ValueError covers JSONDecodeError and UnicodeDecodeError
            problem = f"not valid JSON: {e}"
        if problem is None:
            return rec
        log.warning("dsparksim: warning: corrupt cached cell %s (%s); computing it again", path, problem)
        with contextlib.suppress(OSError):  # if it cannot go, the rewrite after the recompute will say why
            path.unlink()
        return None

    def check_cell_dirs(self, hashes: list[str]) -> None:
        """Raise ConfigError if something that is not a folder stands where one of these cells' folders goes (it is
        not dsparksim's, so it is never removed; the cell could not be written)."""
        for h in hashes:
            d = self.dir(h)
            if (d.exists() or d.is_symlink()) and not d.is_dir():
                raise ConfigError("cli", "--out", f"{str(d)!r} is in the way of a cell's cache folder and is not a "
                                  "folder; move it or choose a new or empty folder")

    def save_result(self, h: str, config: dict[str, Any], summary: dict[str, Any], wall_s: float,
                    requests: pd.DataFrame | None = None) -> None:
        d = self.dir(h)
        write_json(d / "config.json", config)
        if requests is not None:
            write_frame(d / ("requests.parquet" if have_parquet() else "requests.csv"), requests)
        err = d / "error.json"
        if err.exists():
            err.unlink()
        write_json(d / "summary.json", {"cell_hash": h, "wall_s": wall_s, "summary": summary})  # last

    def save_error(self, h: str, config: dict[str, Any], error: str, tb: str) -> None:
        d = self.dir(h)
        write_json(d / "config.json", config)
        write_json(d / "error.json", {"cell_hash": h, "error": error, "traceback": tb})

    def clean_temp(self) -> int:
        """Remove temp files a killed run left behind (an interrupted write never became a result)."""
        n = 0
        if self.root.is_dir():
            for p in self.root.rglob(".*.tmp"):
                p.unlink(missing_ok=True)
                n += 1
        return n


def _problem(rec: Any, h: str) -> str | None:
    """What is wrong with a parsed summary.json record (None if it is a whole result of cell ``h``)."""
    if not isinstance(rec, dict):
        return f"expected a JSON object, got {type(rec).__name__}"
    if rec.get("cell_hash") != h:
        return f"cell_hash is {rec.get('cell_hash')!r}, expected the folder's hash"
    summ = rec.get("summary")
    if not isinstance(summ, dict):
        return "no 'summary' object"
    missing = [k for k in SUMMARY_FIELDS if k not in summ]
    if missing:
        return f"summary lacks {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}"
    return None
