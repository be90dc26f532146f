"""Multi-seed frontiers (`frontier --seeds N`): per-cell means with 95% t-intervals, and paired gain intervals.

frontier_seeds.csv holds one row per cell and seed (its own Pareto flags); frontier.csv holds one row per cell: the
existing columns carry the mean over seeds, each metric is followed by ``<metric>_lo`` and ``<metric>_hi`` (the 95%
t-interval of the mean over seeds), and ``n_seeds`` says how many seeds it rests on. Pareto flags of frontier.csv
are computed on the means; a cell counts as saturated when any of its seeds saturated (``saturated_seeds``).
Every summary metric is a count, rate, time, length or fraction, so its mean is >= 0: the interval of a metric
whose per-seed values are all >= 0 is the t-interval intersected with [0, inf) (the same coverage: the true mean
lies in that range), so a count's ``_lo`` is never negative; a metric with a negative value keeps the plain interval.

Gains are paired: for every seed the policy's frontier is compared with the baseline's frontier of that same seed
(same requests, same draws), giving one gain per seed; the interval is the t-interval over those per-seed gains.
"""
from __future__ import annotations

import math
import numbers
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd

from dsparksim.results.frontier import comparison_table, deprecated_slas, mark_pareto, SERIES
from dsparksim.results.stats import LEVEL, t_interval

# Columns that name a cell rather than measure it: equal across seeds, never averaged.
CELL_KEYS = ("replicas", "router", "policy", "load")
_NOT_METRICS = set(CELL_KEYS) | {"seed", "pareto", "saturated", "block_size", "dp_ranks", "kv_capacity_tokens",
                                 "warmup_s", "kv_page_tokens", "replicas", "prefill_replicas"}
GAIN_CI_COLUMNS = ("gain_seed_mean", "gain_lo", "gain_hi", "n_seeds")


def _numeric(col: pd.Series) -> bool:
    """A metric column: every present value a real number (not a flag); missing values allowed."""
    vals = [v for v in col if not pd.isna(v)]
    return bool(vals) and all(isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_)) for v in vals)


def seed_means(per_seed: pd.DataFrame) -> pd.DataFrame:
    """frontier.csv of a multi-seed run from frontier_seeds.csv: one row per cell (first-seen order), the mean
    over seeds in each metric's own column, its 95% t-interval in ``<metric>_lo``/``<metric>_hi``, ``n_seeds``,
    ``saturated`` (any seed) with ``saturated_seeds``, and Pareto flags recomputed on the means."""
    cols = [c for c in per_seed.columns if c != "seed"]
    rows = []
    for _, g in per_seed.groupby(list(CELL_KEYS), sort=False, dropna=False):
        row: dict[str, Any] = {}
        for c in cols:
            col = g[c]
            if c in CELL_KEYS or c == "pareto":
                row[c] = col.iloc[0]
            elif c == "saturated":
                sat = col.fillna(False).astype(bool)
                row[c], row["saturated_seeds"] = bool(sat.any()), int(sat.sum())
            elif c not in _NOT_METRICS and _numeric(col):
                iv = t_interval(col.tolist())
                lo = iv.lo
                if lo < 0 and (col.dropna() >= 0).all():
                    lo = 0.0   # a non-negative metric: the interval intersected with its range (module doc)
                row[c], row[f"{c}_lo"], row[f"{c}_hi"] = iv.mean, lo, iv.hi
            else:  # a setting or a label: one value when the seeds agree, every value otherwise
                vals = list(dict.fromkeys(str(v) for v in col))
                row[c] = col.iloc[0] if len(vals) == 1 else "|".join(vals)
        row["n_seeds"] = int(g["seed"].nunique()) if "seed" in g else len(g)
        rows.append(row)
    return mark_pareto(pd.DataFrame(rows), SERIES)


def comparison_with_intervals(mean_df: pd.DataFrame, per_seed: pd.DataFrame, baseline: str = "mtp1",
                              slos: Iterable[float] = (), *, slas: Iterable[float] | None = None) -> pd.DataFrame:
    """comparison.csv of a multi-seed run: the gains of the mean frontiers (as for one seed), plus the paired
    per-seed gains' mean ``gain_seed_mean`` and 95% t-interval ``gain_lo``..``gain_hi``; ``n_seeds``: the seeds
    where that gain is defined.

    Each seed's gain is ``gain_mean`` of that seed's own frontiers (its own overlap range); a seed where the gain is
    undefined (no overlap, SLO outside a frontier) leaves the interval empty and says so in ``note``.
    """

    slos = list(deprecated_slas(slos, slas))
    comp = comparison_table(mean_df, baseline=baseline, slos=slos)
    seeds = list(dict.fromkeys(per_seed["seed"]))
    key = ["policy", "deployment", "metric"]
    per = []
    for s in seeds:
        cs = comparison_table(per_seed[per_seed["seed"] == s].drop(columns="seed"), baseline=baseline, slos=slos)
        per.append(cs.set_index(key)["gain_mean"])
    extra: dict[str, list[Any]] = {c: [] for c in GAIN_CI_COLUMNS}
    notes = []
    for _, r in comp.iterrows():
        k = tuple(r[c] for c in key)
        gains = [p.get(k) for p in per]
        iv = t_interval(gains)
        missing = sum(g is None or (isinstance(g, float) and math.isnan(g)) for g in gains)
        extra["gain_seed_mean"].append(None if math.isnan(iv.mean) else iv.mean)
        extra["gain_lo"].append(None if math.isnan(iv.lo) else iv.lo)
        extra["gain_hi"].append(None if math.isnan(iv.hi) else iv.hi)
        extra["n_seeds"].append(len(seeds) - missing)
        note = r["note"] or ""
        if missing:
            note = "; ".join(x for x in (note, f"gain undefined at {missing} of {len(seeds)} seeds: no interval")
                             if x)
        notes.append(note)
    comp = comp.copy()
    comp["note"] = notes
    at = list(comp.columns).index("gain_at_mid") + 1
    for i, c in enumerate(GAIN_CI_COLUMNS):
        comp.insert(at + i, c, extra[c])
    return comp


def interval_text(lo: Any, hi: Any, pct: bool = True) -> str:
    """'95% CI +3..+7%' for a gain interval (empty when undefined)."""
    if lo is None or hi is None or lo != lo or hi != hi:
        return ""
    if pct:
        return f"{LEVEL:.0%} CI {100 * lo:+.1f}..{100 * hi:+.1f}%"
    return f"{LEVEL:.0%} CI {lo:.4g}..{hi:.4g}"


def seeds_text(seeds: Sequence[int]) -> str:
    """'11..15 (5 seeds)' or '11' for the config and the printed summary."""
    return f"{seeds[0]}" if len(seeds) == 1 else f"{seeds[0]}..{seeds[-1]} ({len(seeds)} seeds)"
