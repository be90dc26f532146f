"""Benchmark (run on demand, not a test): sweep throughput of the serial, local-pool and Ray backends.

    python benchmarks/sweep_backends.py [--workers 2] [--duration 10] [--no-ray]

A 48-cell sweep (4 policies x 4 concurrency levels x 3 seeds, closed loop, shipped defaults), each backend into a
fresh folder (nothing cached). Reports wall time, cells per minute, the mean in-worker simulation time of a cell,
and the per-cell overhead of the backend = wall x workers / cells - mean in-worker cell time (process start-up,
pickling, scheduling, result writing; idle workers at the end of the sweep count as overhead too). Ray's
instance start-up is timed separately and excluded from its sweep wall time. Also checks that all three tables
are identical.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import pandas as pd

from dsparksim.sweep import run_sweep, spec_from_dict


def spec(duration: float):
    return spec_from_dict({"sweep": {"name": "bench"},
                           "base": {"duration_s": duration, "domain": "mix:math=1,code=1,chat=1"},
                           "axes": {"policy": ["mtp1", "fixed:7", "confidence", "oracle"],
                                    "concurrency": [4, 16, 32, 64], "seed": [0, 1, 2]}})


def one(name: str, backend: str, workers: int, sp, root: Path) -> tuple[dict, pd.DataFrame]:
    out = root / name
    t0 = time.perf_counter()
    res = run_sweep(sp, out, backend=backend, workers=workers, progress=False)
    wall = time.perf_counter() - t0
    assert res.ok and res.n_ran == res.n_cells, res.failures
    cell_s = [json.loads(p.read_text())["wall_s"] for p in (out / "cells").glob("*/summary.json")]
    mean_cell = sum(cell_s) / len(cell_s)
    n = res.n_cells
    return ({"backend": name, "workers": workers, "cells": n, "wall_s": round(wall, 2),
             "cells_per_min": round(60 * n / wall, 1), "mean_cell_s": round(mean_cell, 4),
             "overhead_per_cell_s": round(wall * workers / n - mean_cell, 4)}, res.table)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--duration", type=float, default=10.0, help="simulated seconds per cell [%(default)s]")
    ap.add_argument("--no-ray", action="store_true")
    args = ap.parse_args()
    sp = spec(args.duration)
    rows, tables = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        r, tables["serial"] = one("serial", "serial", 1, sp, root)
        rows.append(r)
        r, tables["pool"] = one(f"pool({args.workers})", "local", args.workers, sp, root)
        rows.append(r)
        if not args.no_ray:
            import ray

            t0 = time.perf_counter()
            ray.init(address="local", num_cpus=args.workers, include_dashboard=False, log_to_driver=False)
            init_s = time.perf_counter() - t0
            try:
                r, tables["ray"] = one(f"ray({args.workers})", "ray", args.workers, sp, root)
            finally:
                ray.shutdown()
            r["startup_s"] = round(init_s, 2)
            rows.append(r)
    print(pd.DataFrame(rows).to_string(index=False))
    ref = tables["serial"]
    same = all(t.equals(ref) for t in tables.values())
    print(f"tables identical across backends: {same}")


if __name__ == "__main__":
    main()
