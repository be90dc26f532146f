"""Frontier and verify-budget plots (matplotlib, Agg backend: no display needed)."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from dsparksim.frontier import X, Y  # noqa: E402

_STYLE = {"oracle": dict(color="black", linestyle="--"), "mtp1": dict(color="tab:gray")}


def plot_frontier(df: pd.DataFrame, path: str | Path, title: str = "") -> None:
    """Per-user tokens/s vs total output throughput: Pareto frontier lines, all points, saturated ones as x."""
    fig, ax = plt.subplots(figsize=(8, 5.5), dpi=120)
    for i, (pol, g) in enumerate(df.groupby("policy", sort=False)):
        style = _STYLE.get(pol, dict(color=f"C{i % 10}"))
        par = g[g["pareto"]].sort_values(X)
        ax.plot(par[X], par[Y], marker="o", ms=4, lw=1.8, label=pol, **style)
        rest = g[~g["pareto"] & ~g["saturated"].astype(bool)]
        ax.scatter(rest[X], rest[Y], s=12, alpha=0.35, color=style["color"])
        sat = g[g["saturated"].astype(bool)]
        ax.scatter(sat[X], sat[Y], s=28, marker="x", alpha=0.7, color=style["color"])
    ax.set_xlabel("total output throughput (tokens/s per engine)")
    ax.set_ylabel("per-user decode speed, median (tokens/s)")
    ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(title or "Throughput vs per-user speed frontier (lines: Pareto set; x: saturated)", fontsize=10)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_verify_budget(df: pd.DataFrame, path: str | Path, load_name: str = "load") -> None:
    """Mean verify length per request per step vs load level, per policy."""
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    for i, (pol, g) in enumerate(df.groupby("policy", sort=False)):
        style = _STYLE.get(pol, dict(color=f"C{i % 10}"))
        g = g.sort_values("load")
        ax.plot(g["load"], g["mean_verify_len"], marker="o", ms=4, label=pol, **style)
    ax.set_xscale("log", base=2)
    ax.set_xlabel(load_name)
    ax.set_ylabel("mean verify length L per request per step")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
