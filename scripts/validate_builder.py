#!/usr/bin/env python
"""Leave-one-model-out validation of `dsparksim profile build` on vidur's measured operator times.

Usage (repo root): python scripts/validate_builder.py [CSV_DIR] [--out-dir profiles]
Writes OUT_DIR/builder_loo.md (per-model table) and builder_loo.png (measured vs
built per model, one line per TP degree) and with --detail builder_loo.csv (every point). What is compared: see dsparksim/cost/analytic/loo.py.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dsparksim.cost.analytic.loo import loo_table  # noqa: E402

DEFAULT_CSV_DIR = REPO / ".." / "shared" / "data" / "vidur-profiles"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv_dir", nargs="?", default=str(DEFAULT_CSV_DIR))
    ap.add_argument("--out-dir", default=str(REPO / "profiles"))
    ap.add_argument("--detail", action="store_true", help="also write builder_loo.csv (every point, ~0.5 MB)")
    a = ap.parse_args(argv)
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    s, d = loo_table(a.csv_dir)
    if a.detail:
        d.to_csv(out / "builder_loo.csv", index=False, float_format="%.6g")
    lines = ["| model (left out) | GPU | points (TP 1/2/4/8 x M) | median abs rel. error | max abs rel. error | "
             "median signed |", "|---|---|---|---|---|---|"]
    for r in s.itertuples():
        lines.append(f"| {r.model} | {r.gpu} | {r.n} | {r.median_abs_rel_err:.1%} | {r.max_abs_rel_err:.1%} | "
                     f"{r.median_signed_rel_err:+.1%} |")
    (out / "builder_loo.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(s["model"])
    fig, axes = plt.subplots(2, (len(models) + 1) // 2, figsize=(13, 7), squeeze=False)
    for ax, m in zip(axes.flat, models):
        for tp, g in d[d["model"] == m].groupby("tp"):
            line, = ax.plot(g["M"], g["measured_s"] * 1e3, lw=1.2, label=f"TP{tp} measured")
            ax.plot(g["M"], g["built_s"] * 1e3, lw=1.0, ls="--", color=line.get_color(), label=f"TP{tp} built")
        r = s[s["model"] == m].iloc[0]
        ax.set_title(f"{m} ({r.gpu}): median {r.median_abs_rel_err:.1%}, max {r.max_abs_rel_err:.1%}", fontsize=9)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("tokens M")
        ax.set_ylabel("non-attention forward (ms)")
        ax.grid(True, which="both", alpha=0.3)
    axes.flat[0].legend(fontsize=7, ncol=2)
    fig.suptitle("profile build, leave-one-model-out: measured (vidur, solid) vs built (dashed)", fontsize=10)
    fig.tight_layout()
    fig.savefig(out / "builder_loo.png", dpi=110)
    print(f"wrote {out / 'builder_loo.md'}, {out / 'builder_loo.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
