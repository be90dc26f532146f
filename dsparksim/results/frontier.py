"""Frontiers: policies x load levels, Pareto sets, matched comparisons (DESIGN.md section 8)."""
from __future__ import annotations

import math
import warnings
import dataclasses
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import pandas as pd

from dsparksim.config import EngineConfig, RunConfig
from dsparksim.errors import ConfigError, InputError

X, Y = "output_throughput_tok_s", "tps_user_median"
DEFAULT_POLICIES = ("none", "mtp1", "fixed:7", "threshold:0.5", "goodput", "confidence", "confidence-async:2", "oracle")
# The shipped H100 7B profile holds ~113k KV tokens, i.e. ~80 Azure-conversation requests: levels stop just past
# that, where the engine saturates.
DEFAULT_CONCURRENCY = (1, 2, 4, 8, 16, 32, 64, 96, 128)


# A deployment is (replicas, router): how many identical engines serve the load and how requests reach them.
Deployment = tuple[int, str]
SERIES = ("replicas", "router", "policy")  # one Pareto frontier per series


def deployment_label(replicas: Any, router: Any) -> str:
    """'x2 least-outstanding': the deployment's name in comparison.csv, the printed table and the plots."""
    return f"x{int(replicas)} {router}"


def deployments(replicas: Sequence[int], routers: Sequence[str]) -> list[Deployment]:
    """Every replicas x router pair, replica counts outermost."""
    return [(int(r), str(name)) for r in replicas for name in routers]


def cells(base: RunConfig, policies: Sequence[str], loads: Sequence[float],
          deploys: Sequence[Deployment] | None = None, seeds: Sequence[int] | None = None) -> list[RunConfig]:
    """One RunConfig per deployment x policy x load level (deployment outermost; ``None``: the base's own).
    The load replaces concurrency (closed loop), rate (open loop) or time scale (trace); it is the load on the
    whole deployment, which the router spreads over its replicas. With ``seeds`` every cell is repeated once per
    seed (innermost), the same seeds for every policy, so policies are compared on paired draws."""
    if seeds is not None:
        return [c.replace(seed=int(s)) for c in cells(base, policies, loads, deploys) for s in seeds]
    out = []
    for dep in deploys or [(base.engine.replicas, base.engine.router)]:
        b = base
        if dep != (base.engine.replicas, base.engine.router):
            b = base.replace(engine=dataclasses.replace(base.engine, replicas=dep[0], router=dep[1]))
        for pol in policies:
            for load in loads:
                t = b.traffic
                if t.mode == "closed":
                    t = dataclasses.replace(t, concurrency=_users(load))
                elif t.mode == "trace":
                    t = dataclasses.replace(t, time_scale=float(load))
                else:
                    t = dataclasses.replace(t, rate=float(load))
                out.append(b.replace(policy=pol, traffic=t))
    return out


def _users(load: Any) -> int:
    """A closed-loop load level as its number of users: 8, 8.0 or a numpy integer; 7.9, True or '8' is a ConfigError
    (int() would run 7.9 as 7 users and label the point 7)."""
    try:
        n = int(load)
    except (TypeError, ValueError):
        n = None
    if isinstance(load, (bool, str)) or n is None or n != load:
        raise ConfigError("frontier", "loads", f"a closed-loop load level is a whole number of users, got {load!r}")
    return n


def run_cells(cfgs: list[RunConfig], jobs: int = 1, on_done: Callable[[], None] | None = None,
              backend: str | None = None, ray_address: str | None = None) -> list[dict[str, Any]]:
    """Run every cell on a sweep backend (serial when jobs <= 1, else a local pool of ``jobs`` workers; or
    ``backend`` by name); results in the order of ``cfgs``, identical whatever the backend.

    Any failing cell raises its own exception (an InputError keeps its one-line message) as soon as it fails, and
    the cells still queued or running are cancelled: a frontier with holes is never returned as if complete.
    """
    from dsparksim.sweep.backends import Task, cell_exception, make_backend  # lazy: pulls in scipy

    name = backend or ("serial" if jobs <= 1 or len(cfgs) <= 1 else "local")
    out: list[dict[str, Any] | None] = [None] * len(cfgs)

    def on_result(res: dict[str, Any]) -> None:
        if not res["ok"]:
            raise _naming_cell(cell_exception(res), cfgs[res["index"]], cfgs)  # the backend cancels the rest
        out[res["index"]] = res["summary"]
        if on_done:
            on_done()

    make_backend(name, jobs, ray_address).run([Task(i, c) for i, c in enumerate(cfgs)], on_result)
    return out  # type: ignore[return-value]


def _naming_cell(e: BaseException, cfg: RunConfig, cfgs: Sequence[RunConfig] = ()) -> BaseException:
    """A cell's configuration error with the cell (policy and load level) named: a frontier runs many cells, and
    the one that failed is not the command line's value (e.g. one level of --concurrency-levels). The deployment
    and the seed are named too when the frontier's cells (``cfgs``) have several."""
    if type(e) not in (ConfigError, InputError):   # subclasses and other errors stay as they are
        return e
    t = cfg.traffic
    load = (f"{t.concurrency} users" if t.mode == "closed" else f"rate {t.rate:g}/s" if t.rate is not None
            else f"time scale {t.time_scale:g}")
    if len({(c.engine.replicas, c.engine.router) for c in cfgs}) > 1:   # --replicas / --router lists
        load += f", deployment {deployment_label(cfg.engine.replicas, cfg.engine.router)}"
    if len({c.seed for c in cfgs}) > 1:
        load += f", seed {cfg.seed}"
    return type(e)(e.source, e.field, f"{e.message} [frontier cell: policy {cfg.policy}, {load}]", e.line)


def pareto_mask(x: np.ndarray, y: np.ndarray, eligible: np.ndarray | None = None) -> np.ndarray:
    """True where no other eligible point has x' >= x and y' >= y with one strictly greater (both maximised).

    Ineligible (e.g. saturated) and non-finite points are never Pareto and never dominate another point.
    """
    x, y = np.asarray(x, float), np.asarray(y, float)
    ok = np.isfinite(x) & np.isfinite(y)
    if eligible is not None:
        ok &= np.asarray(eligible, bool)
    mask = np.zeros(len(x), bool)
    idx = np.flatnonzero(ok)
    for i in idx:
        dom = (x[idx] >= x[i]) & (y[idx] >= y[i]) & ((x[idx] > x[i]) | (y[idx] > y[i]))
        mask[i] = not dom.any()
    return mask


def _with_deployment(df: pd.DataFrame, cfgs: Sequence[RunConfig] | None = None) -> pd.DataFrame:
    """``df`` with ``replicas`` and ``router`` columns: from ``cfgs`` (one per row) when given, else kept as they
    are; a missing one gets the engine default (a table of single-engine runs). ``router`` follows ``replicas``."""

    df = df.copy()
    if cfgs is not None:
        df["replicas"] = [c.engine.replicas for c in cfgs]
    elif "replicas" not in df:
        df["replicas"] = EngineConfig.replicas
    routers = [c.engine.router for c in cfgs] if cfgs is not None else (
        df["router"] if "router" in df else [EngineConfig.router] * len(df))
    if "router" in df:
        df = df.drop(columns="router")
    df.insert(list(df.columns).index("replicas") + 1, "router", list(routers))
    return df


def frontier_table(summaries: list[dict[str, Any]], cfgs: Sequence[RunConfig] | None = None,
                   seeded: bool = False) -> pd.DataFrame:
    """frontier.csv: one row per deployment x policy x load with the summary fields, ``replicas`` and ``router``
    (from ``cfgs``, the cells' configs, when given) and a Pareto flag computed per series (deployment, policy).
    ``seeded``: the cells are repeated over seeds (frontier_seeds.csv): a leading ``seed`` column from ``cfgs``,
    Pareto flags per series and seed.

    Nested summary fields (``saturation_detail``, ``per_replica``) are left out. Saturated points are kept and
    marked but never Pareto-efficient: past saturation the numbers depend on how
    long the run was, not on the policy.
    """
    # Nested details (saturation_detail, a cluster's per_replica list) stay in the run summaries: a frontier row is
    # one cell, and a column that only multi-replica cells had would move with the order of the cells.
    df = pd.DataFrame([{k: v for k, v in s.items() if not isinstance(v, (dict, list, tuple))} for s in summaries])
    df = _with_deployment(df, cfgs)
    if cfgs is not None and seeded:
        df.insert(0, "seed", [c.seed for c in cfgs])
    return mark_pareto(df, SERIES + (("seed",) if seeded else ()))


def mark_pareto(df: pd.DataFrame, series: Sequence[str]) -> pd.DataFrame:
    """``df`` itself with its ``pareto`` column (re)computed per ``series`` group, in place (pass a copy to keep the
    original); saturated points are never Pareto."""
    df["pareto"] = False
    sat = df["saturated"].fillna(False).astype(bool) if "saturated" in df else pd.Series(False, index=df.index)
    for _, g in df.groupby(list(series), sort=False):
        m = pareto_mask(g[X].to_numpy(float), g[Y].to_numpy(float), ~sat[g.index].to_numpy(bool))
        df.loc[g.index, "pareto"] = m
    return df


def series_labels(df: pd.DataFrame) -> pd.Series:
    """The deployment label of every row (the engine default where the table has no deployment columns)."""
    d = _with_deployment(df[[c for c in ("replicas", "router") if c in df]])
    return pd.Series([deployment_label(r, n) for r, n in zip(d["replicas"], d["router"])], index=df.index,
                     dtype=object)


# A gain is flagged when the two frontiers overlap on less than this share of the baseline's range on that axis,
# or when fewer than NARROW_MIN_POINTS measured points of either frontier lie inside the overlap: the number is
# then an interpolation between one or two points at a frontier's edge, not a comparison of the frontiers.
NARROW_FRACTION = 0.25
NARROW_MIN_POINTS = 2

COMPARISON_COLUMNS = ("policy", "baseline", "deployment", "metric", "axis", "range_lo", "range_hi", "overlap_frac",
                      "n_points_policy", "n_points_baseline", "narrow_overlap", "gain_mean", "gain_min", "gain_max",
                      "gain_at_mid", "n_grid", "note")


def peak_and_best(g: pd.DataFrame) -> tuple[float, float]:
    """(peak output tok/s, best median per-user tok/s) of one series' rows over its unsaturated points, as
    `frontier`'s printed table states them (NaN, NaN when every point saturated): a saturated point is the engine
    with a growing queue, never a throughput the deployment sustains."""
    sat = g["saturated"].fillna(False).astype(bool) if "saturated" in g else pd.Series(False, index=g.index)
    ok = g[~sat]
    if not len(ok):
        return math.nan, math.nan
    return float(ok["output_throughput_tok_s"].max()), float(ok["tps_user_median"].max())


def deprecated_slas(slos: Iterable[float], slas: Iterable[float] | None) -> Iterable[float]:
    """``slos``, or the deprecated keyword ``slas`` (a DeprecationWarning) when it is given instead."""
    if slas is None:
        return slos
    warnings.warn("slas= is deprecated; use slos=", DeprecationWarning, stacklevel=3)
    return slas


def _frontier_curve(df: pd.DataFrame, policy: str) -> tuple[np.ndarray, np.ndarray]:
    g = df[(df["policy"] == policy) & df["pareto"].astype(bool)].sort_values(X)
    return g[X].to_numpy(float), g[Y].to_numpy(float)


def _gain_stats(xa: np.ndarray, ya: np.ndarray, xb: np.ndarray, yb: np.ndarray) -> dict[str, Any]:
    """Gain of curve A over curve B in y at matched x, by linear interpolation on the overlap of x ranges.

    Also states how much the overlap is worth: its share of B's x range and the measured points of each curve
    inside it; ``narrow_overlap`` flags a gain resting on too little of either frontier.
    """
    empty = {"range_lo": None, "range_hi": None, "overlap_frac": None, "n_points_policy": 0,
             "n_points_baseline": 0, "narrow_overlap": True, "gain_mean": None, "gain_min": None,
             "gain_max": None, "gain_at_mid": None, "n_grid": 0}
    if len(xa) < 1 or len(xb) < 1:
        return {**empty, "note": "a frontier is empty"}
    lo, hi = max(xa.min(), xb.min()), min(xa.max(), xb.max())
    if not hi >= lo:
        return {**empty, "range_lo": float(lo), "range_hi": float(hi), "overlap_frac": 0.0,
                "note": "frontiers do not overlap"}
    span_b = float(xb.max() - xb.min())
    frac = float((hi - lo) / span_b) if span_b > 0 else 0.0
    na = int(((xa >= lo) & (xa <= hi)).sum())
    nb = int(((xb >= lo) & (xb <= hi)).sum())
    narrow = bool(frac < NARROW_FRACTION or min(na, nb) < NARROW_MIN_POINTS)
    grid = np.linspace(lo, hi, 64) if hi > lo else np.array([lo])
    with np.errstate(divide="ignore", invalid="ignore"):  # a zero baseline value gives inf, reported as such
        g = np.interp(grid, xa, ya) / np.interp(grid, xb, yb) - 1.0
        mid = np.interp((lo + hi) / 2, xa, ya) / np.interp((lo + hi) / 2, xb, yb) - 1.0
    note = (f"narrow overlap: {frac:.0%} of the baseline's range, {na} policy / {nb} baseline points inside"
            if narrow else "")
    return {"range_lo": float(lo), "range_hi": float(hi), "overlap_frac": frac, "n_points_policy": na,
            "n_points_baseline": nb, "narrow_overlap": narrow, "gain_mean": float(g.mean()),
            "gain_min": float(g.min()), "gain_max": float(g.max()), "gain_at_mid": float(mid),
            "n_grid": int(len(grid)), "note": note}


def comparison_table(df: pd.DataFrame, baseline: str = "mtp1", slos: Iterable[float] = (), *,
                     slas: Iterable[float] | None = None) -> pd.DataFrame:
    """comparison.csv: every policy vs the baseline at the same deployment (``deployment``: 'x2 least-outstanding';
    one block per deployment, in the table's order), each gain with its interpolation range and a trust flag.

    - tps_user_gain_at_matched_throughput: per-user speed ratio - 1 at equal total throughput, over the overlap of
      the two Pareto frontiers' throughput ranges (range_lo..range_hi, axis tok/s).
    - throughput_gain_at_matched_slo: total throughput ratio - 1 at equal per-user speed, over the overlap of
      per-user speed ranges (axis tok/s/user).
    - throughput_gain_at_slo:<S>: the same at one per-user speed target (SLO) S (if inside both frontiers).

    ``slas``: deprecated spelling of ``slos``.

    ``narrow_overlap`` is True where the overlap covers < NARROW_FRACTION of the baseline's range on that axis or
    holds < NARROW_MIN_POINTS Pareto points of either frontier. Saturated points are never Pareto, so never used.
    """

    missing = [c for c in ("policy", X, Y, "pareto") if c not in df]
    if missing:
        raise ConfigError("comparison_table", "df", f"a frontier table needs the columns {missing} (frontier.csv, "
                                                    "or frontier_table(); mark_pareto() adds 'pareto')")
    policies = list(df["policy"].unique()) if len(df) else []
    if baseline not in policies:
        raise ConfigError("cli", "--baseline", f"baseline policy {baseline!r} is not among the frontier's policies "
                                               f"{policies}")
    slos = list(deprecated_slas(slos, slas))
    for s in slos:
        # a per-user speed target (tok/s/user): a zero, negative or non-finite one lies inside no frontier and would
        # only ever read "outside the range"
        if isinstance(s, bool) or not isinstance(s, (int, float, np.integer, np.floating)) or not 0 < s < math.inf:
            raise ConfigError("comparison_table", "slos", f"expected positive per-user speed targets in tok/s/user, "
                                                          f"got {s!r}")
    labels = series_labels(df)
    rows = []
    for dep in dict.fromkeys(labels):
        d = df[labels == dep]
        if not (d["policy"] == baseline).any():
            raise ConfigError("cli", "--baseline", f"baseline policy {baseline!r} has no cells at deployment {dep!r}: "
                                                   "gains are only measured within one deployment")
        rows += _compare_within(d, baseline, dep, slos)
    return pd.DataFrame(rows, columns=list(COMPARISON_COLUMNS))


def _compare_within(df: pd.DataFrame, baseline: str, deployment: str, slos: Iterable[float]) -> list[dict[str, Any]]:
    """The comparison rows of one deployment's table (see :func:`comparison_table`)."""
    rows = []
    xb, yb = _frontier_curve(df, baseline)
    ob = np.argsort(yb, kind="stable")
    for pol in df["policy"].unique():
        if pol == baseline:
            continue
        xa, ya = _frontier_curve(df, pol)
        base = {"policy": pol, "baseline": baseline, "deployment": deployment}
        rows.append({**base, "metric": "tps_user_gain_at_matched_throughput", "axis": "tok/s",
                     **_gain_stats(xa, ya, xb, yb)})
        # Along a Pareto frontier y falls as x rises; swap axes and sort by y to interpolate x(y).
        oa = np.argsort(ya, kind="stable")
        rows.append({**base, "metric": "throughput_gain_at_matched_slo", "axis": "tok/s/user",
                     **_gain_stats(ya[oa], xa[oa], yb[ob], xb[ob])})
        for s in slos:
            inside = bool(len(ya) and len(yb) and ya.min() <= s <= ya.max() and yb.min() <= s <= yb.max())
            gain = float(np.interp(s, ya[oa], xa[oa]) / np.interp(s, yb[ob], xb[ob]) - 1) if inside else None
            rows.append({**base, "metric": f"throughput_gain_at_slo:{s:g}", "axis": "tok/s/user",
                         "range_lo": float(s), "range_hi": float(s), "overlap_frac": None,
                         "n_points_policy": int(len(ya)), "n_points_baseline": int(len(yb)),
                         "narrow_overlap": False, "gain_mean": gain, "gain_min": gain, "gain_max": gain,
                         "gain_at_mid": gain, "n_grid": 1 if inside else 0,
                         "note": "" if inside else "SLO outside a frontier's per-user speed range"})
    return rows
