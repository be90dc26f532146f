#!/usr/bin/env python
"""Fit the builder's kernel efficiency curves on vidur's measured operator times; write dsparksim/data/efficiency.json.

Usage (repo root): python scripts/fit_efficiency.py [CSV_DIR] [--out dsparksim/data/efficiency.json]
CSV_DIR defaults to ../shared/data/vidur-profiles. The model is in dsparksim/cost/analytic/efficiency.py.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dsparksim.cost.analytic.efficiency import EFFICIENCY_JSON, VIDUR_FILES, fit, params_dict, vidur_rows  # noqa: E402
from dsparksim.cost.analytic.hardware import get_gpu  # noqa: E402

DEFAULT_CSV_DIR = REPO / ".." / "shared" / "data" / "vidur-profiles"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv_dir", nargs="?", default=str(DEFAULT_CSV_DIR))
    ap.add_argument("--out", default=str(EFFICIENCY_JSON))
    a = ap.parse_args(argv)
    csv_dir = Path(a.csv_dir)
    rows = vidur_rows(csv_dir)
    gpus = {g: get_gpu(g) for g in sorted({v[0] for v in VIDUR_FILES.values()})}
    eff, stats = fit(rows, gpus)
    out = {
        "_about": "fitted kernel efficiency curves of the analytic profile builder (dsparksim/cost/analytic/efficiency.py)",
        "params": params_dict(eff),
        "fit": {**stats, "script": "scripts/fit_efficiency.py",
                "data": "microsoft/vidur data/profiling/compute/<sku>/<org>/<model>/mlp.csv @7d47513363ec (MIT)",
                "files": {f: hashlib.sha256((csv_dir / f).read_bytes()).hexdigest()[:16] for f in sorted(VIDUR_FILES)},
                "n_rows": int(len(rows)), "gpus": sorted(gpus),
                "units": "fractions of each GPU's datasheet peak (dsparksim/data/hardware.csv), fp16"},
    }
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {a.out}: " + ", ".join(f"{k}={v:.4g}" for k, v in out["params"].items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
