"""Run a sweep: skip cached cells, run the rest on a backend, write each result as it lands, build the table."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import pandas as pd
from tqdm import tqdm

from dsparksim.sweep.backends import Task, make_backend
from dsparksim.sweep.cache import CellCache, have_parquet
from dsparksim.sweep.cells import Cell, code_fingerprint, expand, input_hashes
from dsparksim.sweep.spec import SweepSpec
from dsparksim import __version__
from dsparksim.config import jsonable
from dsparksim.results.notes import config_users, short_window_count
from dsparksim.sim.reads import collapsed_reason

RESULT_FILES = ("sweep.json", "failures.json", "results.parquet", "results.csv")  # the set (parquet: with pyarrow)
MANIFEST = "sweep.manifest.json"  # written last: the final files of the sweep are complete
KEY_PREFIX = "cfg."  # table columns holding a cell's axis values (summary fields keep their own names)


@dataclass
class SweepResult:
    """What a sweep produced. ``table``: one row per finished cell, in cell order; ``failures``: failed cells."""

    table: pd.DataFrame
    failures: list[dict[str, Any]]
    n_cells: int
    n_cached: int
    n_ran: int
    wall_s: float
    paths: dict[str, Path] = field(default_factory=dict)
    n_repeats: int = 0        # cells that are the same run as an earlier cell (run once; column same_as)
    repeats_why: str = ""     # e.g. "mtp1 reads no acceptance, block_size"
    short_windows: list[str] = field(default_factory=list)   # closed-loop cells that finished fewer than users

    @property
    def ok(self) -> bool:
        return not self.failures


def run_cells_cached(cells: Sequence[Cell], out_dir: str | Path, backend: str = "local", workers: int | None = None,
                     ray_address: str | None = None, save_requests: bool = False, progress: bool = True,
                     desc: str = "sweep", bar: Any = None
                     ) -> tuple[dict[int, dict[str, Any]], list[dict[str, Any]], int, int]:
    """Run the cells not already finished in ``out_dir``. Returns (summaries by cell index, failures, cached, ran).
    Cells sharing a hash (the same run, see ``Cell.same_as``) run once; cached and ran count runs, not cells.

    ``bar``: a tqdm bar to advance (one step per cell, cached ones at once) instead of a bar of its own, for a
    caller that runs several batches under one progress bar (``dsparksim plan``); it is left open."""

    cache = CellCache(out_dir)
    cache.clean_temp()
    distinct = list({c.hash: c for c in reversed(cells)}.values())[::-1]   # the first cell of every run
    todo = [c for c in distinct if not cache.done(c.hash)]  # a corrupt cached cell is warned about and redone
    cache.check_cell_dirs([c.hash for c in todo])             # before any cell runs, not after the first one
    by_index = {c.index: c for c in cells}
    failures: list[dict[str, Any]] = []
    mine = code_fingerprint()

    def cfg_record(c: Cell, inputs: Any = None) -> dict[str, Any]:
        return {"cell_hash": c.hash, "key": c.key, "config": c.config.to_dict(), "inputs": inputs,
                "input_hashes": input_hashes(c.config), "dsparksim_version": __version__, "code": mine}

    own = bar is None
    if own:
        bar = tqdm(total=len(distinct), initial=len(distinct) - len(todo), unit="cell", desc=desc,
                   disable=not progress, dynamic_ncols=True)
    else:
        bar.update(len(distinct) - len(todo))

    def on_result(res: dict[str, Any]) -> None:
        c = by_index[res["index"]]
        if res["ok"] and res.get("code") not in (None, mine):
            res = {**res, "ok": False, "traceback": "",
                   "error": "worker ran different dsparksim code (source fingerprint differs from the driver's); "
                            "install the same version on every worker"}
        if res["ok"]:
            cache.save_result(c.hash, cfg_record(c, res.get("inputs")), res["summary"], res["wall_s"],
                              res.get("requests"))
        else:
            cache.save_error(c.hash, cfg_record(c), res["error"], res.get("traceback", ""))  # error: one line
            failures.append({"cell": c.index, "cell_hash": c.hash, **{KEY_PREFIX + k: v for k, v in c.key.items()},
                             "error": res["error"], "traceback": res.get("traceback", "")})
            bar.set_postfix(failed=len(failures))
        bar.update(1)

    try:
        make_backend(backend, workers, ray_address).run([Task(c.index, c.config, save_requests) for c in todo],
                                                        on_result)
    finally:
        if own:
            bar.close()
    summaries = {c.index: rec["summary"] for c in cells if (rec := cache.get(c.hash)) is not None}
    failures.sort(key=lambda f: f["cell"])
    return summaries, failures, len(distinct) - len(todo), len(todo)


def results_table(cells: Sequence[Cell], summaries: dict[int, dict[str, Any]]) -> pd.DataFrame:
    """One row per finished cell in cell order: cell index and hash, ``cfg.<axis>`` values, summary fields.

    Nested summary values (dicts) are stored as JSON strings so the table stays flat (CSV and Parquet alike).
    """
    rows = []
    for c in cells:
        s = summaries.get(c.index)
        if s is None:
            continue
        row: dict[str, Any] = {"cell": c.index, "cell_hash": c.hash}
        row.update({KEY_PREFIX + k: v for k, v in c.key.items()})
        row["same_as"] = c.same_as   # the earlier cell whose run this is (empty: its own run)
        for k, v in s.items():
            row[k] = json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else v
        rows.append(row)
    if not rows:   # no cell finished: still a readable table (its header), never an empty file
        return pd.DataFrame(columns=["cell", "cell_hash", *(KEY_PREFIX + k for k in (cells[0].key if cells else {})),
                                     "same_as"])
    df = pd.DataFrame(rows)
    df["same_as"] = df["same_as"].astype("Int64")
    return df


def run_sweep(spec: SweepSpec, out_dir: str | Path, backend: str = "local", workers: int | None = None,
              ray_address: str | None = None, progress: bool = True) -> SweepResult:
    """Run every cell of ``spec`` not already in ``out_dir`` and write sweep.json, results.{csv,parquet} and
    failures.json there as one set: each file atomically, then sweep.manifest.json (sizes, sha256) last."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    cells = expand(spec)
    same = [c.same_as for c in cells]
    n_rep = sum(s is not None for s in same)
    why = collapsed_reason([c.config for c in cells], same) if n_rep else ""
    summaries, failures, n_cached, n_ran = run_cells_cached(
        cells, out, backend, workers, ray_address, spec.save_requests, progress, desc=spec.name)
    wall = time.perf_counter() - t0
    table = results_table(cells, summaries)
    # The final files are replaced as a set; sweep.manifest.json (written last) lists them (dsparksim.results.outputs).
    from dsparksim.results.outputs import write_result_set

    files = {"sweep.json": lambda p: dump_json(p, {
                 "spec": spec.to_dict(), "n_cells": len(cells), "n_runs": len(cells) - n_rep,
                 "n_repeats": n_rep, "repeats_why": why, "n_cached": n_cached, "n_ran": n_ran,
                 "n_failed": len(failures), "backend": backend, "workers": workers, "wall_s": round(wall, 3),
                 "cell_hashes": [c.hash for c in cells]}),
             "failures.json": lambda p: dump_json(p, failures)}
    if have_parquet():
        files["results.parquet"] = lambda p: table.to_parquet(p, index=False)
    files["results.csv"] = lambda p: table.to_csv(p, index=False)
    # "complete" only when every cell finished; the files themselves are always written whole
    written = write_result_set(out, files, MANIFEST, stale=("results.parquet",),
                               status={"complete": not failures, "n_cells": len(cells), "n_failed": len(failures)})
    keys = {"sweep.json": "sweep", "failures.json": "failures", "results.parquet": "parquet", "results.csv": "csv"}
    paths = {keys[n]: p for n, p in written.items()}
    paths["manifest"] = out / MANIFEST
    return SweepResult(table=table, failures=failures, n_cells=len(cells), n_cached=n_cached, n_ran=n_ran,
                       wall_s=wall, paths=paths, n_repeats=n_rep, repeats_why=why,
                       short_windows=short_window_cells(cells, summaries))


def short_window_cells(cells: Sequence[Cell], summaries: dict[int, dict[str, Any]]) -> list[str]:
    """'cell I [axis=value, ...]: N finished for U users' for every finished closed-loop cell whose measurement
    window finished fewer requests than it has users (:func:`dsparksim.results.notes.short_window_count`)."""
    out = []
    for c in cells:
        short = short_window_count(summaries.get(c.index) or {}, config_users(c.config))
        if short:
            key = ", ".join(f"{k}={v}" for k, v in c.key.items())
            out.append(f"cell {c.index} [{key}]: {short}")
    return out


def dump_json(p: Path, obj: Any) -> None:
    """Write ``obj`` (made JSON-safe by :func:`dsparksim.config.jsonable`) to ``p`` as indented JSON."""
    p.write_text(json.dumps(jsonable(obj), indent=1, allow_nan=True) + "\n")


def failure_text(failures: Sequence[dict[str, Any]], limit: int = 20) -> str:
    """A readable list of failed cells: index, axis values, error."""
    lines = [f"{len(failures)} cell(s) failed (not written as results; rerun to retry):"]
    for f in failures[:limit]:
        key = ", ".join(f"{k[len(KEY_PREFIX):]}={v}" for k, v in f.items() if k.startswith(KEY_PREFIX))
        lines.append(f"  cell {f['cell']} [{key}] {f['error']}")
    if len(failures) > limit:
        lines.append(f"  ... and {len(failures) - limit} more (see failures.json)")
    return "\n".join(lines)
