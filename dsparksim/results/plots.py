"""Frontier and verify-budget plots (matplotlib, Agg backend: no display needed), and the one policy colour map.

Every plot of a policy (frontier.png, verify_budget.png, plan.png, the notebooks, profile plots of a drafter) takes
its colour from :func:`policy_color`: one colour per policy family (``fixed:3`` and ``fixed:7`` alike), the same in
every plot. Legends sit beside the data area, never over a point; of two series with the same points, the one drawn
first is drawn wider, so it shows around the other.
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Iterable

import numpy as np
import pandas as pd
# Figures are built without pyplot: no GUI backend is needed to save them, and importing this module does not
# switch the backend of a notebook that displays them (matplotlib.use("Agg") here would hide inline plots).
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from dsparksim.results.frontier import deprecated_slas, series_labels, X, Y

# The shipped policy families (and the drafters they run with) get fixed colours, keyed by family (the spec before
# ':'); mtp1 is the grey baseline, none (plain decoding) light grey and dotted, oracle the black upper bound.
POLICY_COLORS = {
    "none": "#b0b0b0",
    "mtp1": "#7f7f7f",
    "fixed": "#1f77b4",
    "threshold": "#ff7f0e",
    "goodput": "#2ca02c",
    "confidence": "#d62728",
    "confidence-async": "#9467bd",
    "oracle": "#000000",
}
KEY_COLOR = "#2b5d8a"   # the legend's explanation keys (line = Pareto, faded, x): no policy's colour, not grey
# Any other spec: a colour picked by a stable hash of its text (same in every process, unlike hash()).
_FALLBACK = ("#8c564b", "#e377c2", "#bcbd22", "#17becf", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5",
             "#c49c94", "#f7b6d2", "#dbdb8d", "#9edae5", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173")
_LINESTYLE = {"oracle": "--", "none": ":"}
# With several deployments (replicas x router), each gets its own line style and marker; colour stays the policy's.
_DEPLOY_STYLES = (("-", "o"), ("--", "s"), (":", "^"), ("-.", "D"), ((0, (5, 1, 1, 1)), "v"), ((0, (1, 3)), "P"))


def policy_family(policy: str) -> str:
    """'fixed' for 'fixed:7': the spec before its argument."""
    return str(policy).strip().partition(":")[0]


def policy_color(policy: str) -> str:
    """The fixed colour (hex) of a policy spec's family or a drafter name; deterministic for families not in
    POLICY_COLORS."""
    p = policy_family(policy)
    if p in POLICY_COLORS:
        return POLICY_COLORS[p]
    h = int.from_bytes(hashlib.sha256(p.encode()).digest()[:4], "big")
    return _FALLBACK[h % len(_FALLBACK)]


# Members of one family in one plot (fixed:3, fixed:7) share its colour and differ by marker.
_FAMILY_MARKERS = ("o", "s", "^", "D", "v", "P")


def outside_legend(ax, handles=None, **kw) -> None:
    """The legend to the right of the data area (never over a point)."""
    kw = {"fontsize": 7, "loc": "upper left", "bbox_to_anchor": (1.01, 1.0), "borderaxespad": 0.0, **kw}
    if handles is not None:
        kw["handles"] = handles
    ax.legend(**kw)


def _widths(n: int, i: int, lw: float = 1.8, ms: float = 4.0) -> tuple[float, float]:
    """(line width, marker size) of the i-th of n series: earlier series wider, so a later one with the same
    points leaves them visible around it."""
    k = (n - 1 - i)
    return lw + 1.6 * k, ms + 2.0 * k


# major tick multiples of a log axis, coarsest first: the first that labels MIN_LOG_LABELS ticks in view is used
LOG_SUBS = ((1.0, 2.0, 5.0), (1.0, 2.0, 3.0, 5.0, 7.0), tuple(float(k) for k in range(1, 10)))
MIN_LOG_LABELS = 4


def _plain(ax, axis: str) -> None:
    """Plain tick labels (1000, 2500, 0.5; no offset, no 1e3 or 10^x notation), linear or log axis."""
    fmt = FuncFormatter(lambda v, _: f"{v:,.0f}" if abs(v) >= 10 else f"{v:g}")
    a = ax.xaxis if axis == "x" else ax.yaxis
    a.set_major_formatter(fmt)
    if a.get_scale() == "log":
        # 1-2-5 major ticks, finer when the view holds fewer than MIN_LOG_LABELS of them (5.4..46 has only 10 and
        # 20): a log axis spanning about a decade or less still gets several labels
        lo, hi = sorted(ax.get_xlim() if axis == "x" else ax.get_ylim())
        for subs in LOG_SUBS:
            loc = LogLocator(base=10, subs=subs)
            if sum(lo <= v <= hi for v in loc.tick_values(lo, hi)) >= MIN_LOG_LABELS:
                break
        a.set_major_locator(loc)
        a.set_minor_formatter(NullFormatter())


def _series(df: pd.DataFrame):
    """(policy, deployment label or None, line style, marker, name, rows) per series, in table order. With one
    deployment a series is a policy, styled and named as a single-engine frontier always was."""
    labels = series_labels(df)
    deps = list(dict.fromkeys(labels))
    members: dict[str, list[str]] = {}
    for pol in dict.fromkeys(df["policy"]):
        members.setdefault(policy_family(pol), []).append(str(pol))
    for (dep, pol), g in df.groupby([labels, df["policy"]], sort=False):
        fam = members[policy_family(pol)]
        if len(deps) == 1:
            mk = _FAMILY_MARKERS[fam.index(str(pol)) % len(_FAMILY_MARKERS)]
            yield pol, None, _LINESTYLE.get(policy_family(pol), "-"), mk, str(pol), g
        else:
            ls, mk = _DEPLOY_STYLES[deps.index(dep) % len(_DEPLOY_STYLES)]
            yield pol, dep, ls, mk, f"{pol} | {dep}", g


def _error_bars(ax, g: pd.DataFrame, x: str, y: str, color: str, gid: str) -> bool:
    """Error bars from a multi-seed frontier's ``<col>_lo``/``<col>_hi`` columns (x and/or y); False if none."""
    def err(c: str):
        if f"{c}_lo" not in g or f"{c}_hi" not in g:
            return None
        v, lo, hi = (pd.to_numeric(g[k], errors="coerce").to_numpy(float) for k in (c, f"{c}_lo", f"{c}_hi"))
        return np.vstack([v - lo, hi - v])

    xe, ye = err(x), err(y)
    if xe is None and ye is None:
        return False
    ok = np.isfinite(pd.to_numeric(g[x], errors="coerce").to_numpy(float)) & np.isfinite(
        pd.to_numeric(g[y], errors="coerce").to_numpy(float))
    for e in (xe, ye):
        if e is not None:
            ok &= np.isfinite(e).all(axis=0)
    if not ok.any():
        return False
    ax.errorbar(g[x][ok], g[y][ok], xerr=None if xe is None else xe[:, ok], yerr=None if ye is None else ye[:, ok],
                fmt="none", ecolor=color, elinewidth=0.8, capsize=2, alpha=0.6, gid=gid)
    return True


def frontier_figure(df: pd.DataFrame, title: str = "", slos: Iterable[float] = (),
                    load_name: str = "load", *, slas: Iterable[float] | None = None, x: str | None = None) -> Figure:
    """Per-user tokens/s vs total output throughput: Pareto lines, dominated points faded, saturated ones as x,
    every point labelled with its load level, one labelled horizontal line per SLO target (``slas``: deprecated spelling). One line per series:
    colour = policy family, line style and marker = deployment (replicas x router) when there are several.
    ``x``: the throughput column on the x axis (``output_throughput_tok_s_per_gpu``: a deployments frontier per
    GPU)."""

    slos = list(deprecated_slas(slos, slas))
    fig = Figure(figsize=(11, 6), dpi=120)
    ax = fig.subplots()
    multi = bars = False
    series = list(_series(df))
    x_col = x or X
    for i, (pol, dep, ls, mk, name, g) in enumerate(series):
        lw, ms = _widths(len(series), i)
        multi |= dep is not None
        col = policy_color(pol)
        sat_m = g["saturated"].fillna(False).astype(bool) if "saturated" in g else pd.Series(False, index=g.index)
        par_m = g["pareto"].astype(bool)
        par = g[par_m].sort_values(x_col)
        sid = name if dep is None else f"{pol}@{dep}"
        # The oracle bounds throughput at each load (same drafter and K), not per-user speed: say so in the legend.
        label = f"{name} (throughput bound per load)" if str(pol).startswith("oracle") else name
        ax.plot(par[x_col], par[Y], marker=mk, ms=ms, lw=lw, label=label, color=col, ls=ls, gid=f"pareto:{sid}",
                zorder=2 + i)
        rest = g[~par_m & ~sat_m]
        ax.scatter(rest[x_col], rest[Y], s=ms ** 2, alpha=0.3, color=col, marker=mk, gid=f"dominated:{sid}",
                   zorder=2 + i)
        sat = g[sat_m]
        ax.scatter(sat[x_col], sat[Y], s=2 * ms ** 2, marker="x", alpha=0.8, color=col, gid=f"saturated:{sid}",
                   zorder=2 + i)
        bars |= _error_bars(ax, g, x_col, Y, col, f"ci:{sid}")
        for r in g.itertuples(index=False):
            xv, yv = getattr(r, x_col), getattr(r, Y)
            if pd.notna(xv) and pd.notna(yv):
                ax.annotate(f"{r.load:g}", (xv, yv), xytext=(3, 3), textcoords="offset points", fontsize=6,
                            color=col, alpha=0.8)
    for s in slos:
        ax.axhline(s, color="tab:red", lw=0.9, ls=":", gid=f"slo:{s:g}")
        ax.annotate(f"SLO {s:g} tok/s/user", (1.0, s), xycoords=("axes fraction", "data"), xytext=(-4, 2),
                    textcoords="offset points", ha="right", va="bottom", fontsize=7, color="tab:red")
    many = "replicas" in df and (pd.to_numeric(df["replicas"], errors="coerce").fillna(1) > 1).any()
    if x_col != X:
        ax.set_xlabel("output throughput per GPU (tokens/s per GPU: a deployment's total over all its GPUs)")
    else:
        ax.set_xlabel("total output throughput (tokens/s per deployment, all replicas)" if many
                      else "total output throughput (tokens/s per engine)")
    ax.set_ylabel("per-user decode speed, median (tokens/s)")
    ys = pd.to_numeric(df[Y], errors="coerce") if Y in df else pd.Series(dtype=float)
    if (ys > 0).any():
        ax.set_yscale("log")
    else:   # no cell finished a request: nothing to place on a log axis (frontier.csv and a warning say so)
        ax.text(0.5, 0.5, "no cell finished a request in its measurement window", ha="center", va="center",
                transform=ax.transAxes, fontsize=9, color="0.4")
    _plain(ax, "x")
    _plain(ax, "y")
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(title or "Throughput vs per-user speed frontier", fontsize=10)
    handles, labels = ax.get_legend_handles_labels()
    handles += [Line2D([], [], color=KEY_COLOR, marker="o", ms=4, lw=1.8, label="line: Pareto frontier"
                       + (" (colour: policy; style and marker: deployment xN router)" if multi else
                          " (colour: policy family)")),
                Line2D([], [], color=KEY_COLOR, marker="o", ls="", alpha=0.3, label="faded: dominated (not Pareto)"),
                Line2D([], [], color=KEY_COLOR, marker="x", ls="", label="x: saturated (never Pareto)")]
    if slos:
        handles.append(Line2D([], [], color="tab:red", ls=":", label="dotted: SLO target"))
    if len(series) > 1:
        handles.append(Line2D([], [], ls="", label="wider: drawn first (shows under an equal series)"))
    if bars:
        n = int(pd.to_numeric(df["n_seeds"]).max()) if "n_seeds" in df else 0
        handles.append(Line2D([], [], color=KEY_COLOR, marker="|", lw=0.8,
                              label=f"bars: 95% t-interval of the mean over {n} seeds"))
    handles.append(Line2D([], [], ls="", label=f"numbers: {load_name}"))
    outside_legend(ax, handles)
    fig.tight_layout()
    return fig


def plot_frontier(df: pd.DataFrame, path: str | Path, title: str = "", slos: Iterable[float] = (),
                  load_name: str = "load", x: str | None = None) -> Figure:
    """Write :func:`frontier_figure` to ``path`` and return the figure (a notebook shows it)."""
    fig = frontier_figure(df, title=title, slos=list(slos), load_name=load_name, x=x)
    fig.savefig(path)
    return fig


def verify_budget_figure(df: pd.DataFrame, load_name: str = "load", profile: str | None = None) -> Figure:
    """Mean verify length per request per step vs load level, per series (policy; x deployment when several);
    the title names the cost profile when given."""
    fig = Figure(figsize=(9, 4.5), dpi=120)
    ax = fig.subplots()
    series = list(_series(df))
    for i, (pol, dep, ls, mk, name, g) in enumerate(series):
        lw, ms = _widths(len(series), i, lw=1.5)
        g = g.sort_values("load")
        ax.plot(g["load"], g["mean_verify_len"], marker=mk, ms=ms, lw=lw, label=name, color=policy_color(pol),
                ls=ls, gid=f"verify:{name if dep is None else f'{pol}@{dep}'}", zorder=2 + i)
        _error_bars(ax, g, "load", "mean_verify_len", policy_color(pol), f"ci:{name}")
    ax.set_xscale("log", base=2)
    _plain(ax, "x")
    _plain(ax, "y")
    loads = sorted(float(v) for v in pd.unique(df["load"].dropna()) if float(v) > 0)
    if 0 < len(loads) <= 16:
        ax.set_xticks(loads)  # tick exactly at the swept load levels
    ax.set_xlabel(load_name)
    ax.set_ylabel("mean verify length L per request per step")
    ax.set_title(f"Verify budget: draft tokens verified per request per step vs {load_name}"
                 + (f"\nprofile {profile}" if profile else ""), fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    outside_legend(ax, fontsize=8)
    fig.tight_layout()
    return fig


def plot_verify_budget(df: pd.DataFrame, path: str | Path, load_name: str = "load",
                       profile: str | None = None) -> Figure:
    """Write :func:`verify_budget_figure` to ``path`` and return the figure (a notebook shows it)."""
    fig = verify_budget_figure(df, load_name=load_name, profile=profile)
    fig.savefig(path)
    return fig
