"""Capacity search: per policy (and per value of the spec's other axes), the largest load meeting an SLO.

As Vidur's capacity search: bisection over simulated runs on one load axis (concurrency, rate or trace time
scale), assuming the SLO holds below the capacity and fails above it. Probes of all groups run together on the
backend each round, and every probe is a cached sweep cell (a rerun reuses them). The output states the SLO and
the full search trace (every probed load, its metrics and the violated constraints).
"""
from __future__ import annotations

import itertools
import math
import operator
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import pandas as pd

from dsparksim.errors import ConfigError
from dsparksim.results.notes import config_users, short_window_count
from dsparksim.results.stats import MAX_SEEDS, seed_list, t_interval
from dsparksim.sweep.cells import Cell, build_config, cell_hash
from dsparksim.sweep.spec import LOAD_KEYS, SweepSpec
from dsparksim.sweep import runner as sweep_runner  # called through the module: tests patch run_cells_cached

_OPS = {">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt}
# One SLO term, "METRIC OP NUMBER" (OP one of >= <= > <), as capacity, plan and frontier --slo take it.
SLO_RE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(>=|<=|>|<)\s*([-+0-9.eE]+)\s*$")


@dataclass(frozen=True)
class Constraint:
    """One SLO term, e.g. ``tps_user_median >= 50`` or ``ttft_p99_s <= 2``, on a run-summary field (``metric``,
    canonical; ``spelled``: as the user wrote it, e.g. ``tps_user_p50``)."""

    metric: str
    op: str
    value: float
    spelled: str = ""

    def __str__(self) -> str:
        return f"{self.spelled or self.metric} {self.op} {self.value:g}"

    def holds(self, summary: Mapping[str, Any]) -> bool:
        """The constraint holds on a run summary; a missing or non-finite value never holds."""
        if not measured(summary.get(self.metric)):
            return False  # no measurement (e.g. no request completed) never meets an SLO; check_slo says why
        return bool(_OPS[self.op](float(summary[self.metric]), self.value))


def measured(v: Any) -> bool:
    """``v`` is a finite number (not None, not a bool, not NaN or inf): a value an SLO can be judged on."""
    return not (v is None or isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v))


# The one SLO vocabulary of capacity, plan and frontier: the numeric run-summary fields an SLO may constrain,
# checked before any probe runs (a typo fails in a second, not after the search), and their percentile spellings
# (METRIC_ALIASES: *_p50 = *_median, as vLLM names them). A field the summary gains is added here.
SLO_METRICS = (
    "output_throughput_tok_s", "request_throughput_req_s", "tps_user_mean", "tps_user_median", "tps_user_p10",
    "tps_user_p90", "tps_user_p99", "ttft_mean_s", "ttft_median_s", "ttft_p10_s", "ttft_p90_s", "ttft_p99_s",
    "tpot_mean_s", "tpot_median_s", "tpot_p10_s", "tpot_p90_s", "tpot_p99_s", "itl_mean_s", "itl_median_s",
    "itl_p10_s", "itl_p90_s", "itl_p99_s", "e2e_mean_s", "e2e_median_s", "e2e_p10_s", "e2e_p90_s", "e2e_p99_s",
    "mean_verify_len", "tau",
    "mean_batch_tokens", "mean_running", "num_requests_completed", "num_requests_completed_total",
    "num_requests_issued", "num_steps", "kv_peak_used_tokens", "sim_time_s", "window_s")
METRIC_ALIASES = {f"{m}_p50{u}": f"{m}_median{u}" for m, u in
                  (("tps_user", ""), ("ttft", "_s"), ("tpot", "_s"), ("itl", "_s"), ("e2e", "_s"))}


def check_slo_metrics(slo: Sequence[Constraint], source: str = "--slo") -> None:
    """Raise ConfigError for an SLO term on a metric no run summary has (before anything runs)."""
    for i, c in enumerate(slo):
        if c.metric not in SLO_METRICS:
            raise ConfigError(source, f"slo[{i}]", _unknown(c.metric))


def _unknown(name: str) -> str:
    return f"unknown metric {name!r}; expected one of {', '.join(SLO_METRICS)} (or {', '.join(METRIC_ALIASES)})"


def parse_slo(terms: Sequence[str], source: str = "--slo", field: str = "slo") -> list[Constraint]:
    """Parse SLO terms ``METRIC OP NUMBER`` (OP one of >=, <=, >, <; METRIC in SLO_METRICS or METRIC_ALIASES,
    stored canonical) -- the one SLO syntax and vocabulary of capacity, plan and frontier. Errors name ``source``
    and ``field``: a file's ``capacity.slo[i]``, or (source ``"cli"``) the option, e.g. ``--slo``, and the term."""
    cli = source == "cli"
    if isinstance(terms, str) or not isinstance(terms, (list, tuple)) or not terms:
        raise ConfigError(source, field, f"expected a non-empty list of terms like 'tps_user_median >= 50', "
                          f"got {terms!r}")
    out = []
    for i, t in enumerate(terms):
        where, what = (field, f"in {t!r}: ") if cli else (f"{field}[{i}]", "")
        m = SLO_RE.match(t) if isinstance(t, str) else None
        if not m:
            ops = t.split()[1] if isinstance(t, str) and len(t.split()) == 3 else None
            hint = f" (operator {ops!r} is not one of {', '.join(_OPS)})" if ops and ops not in _OPS else ""
            raise ConfigError(source, where, f"expected 'METRIC OP NUMBER' with OP one of {', '.join(_OPS)}, "
                              f"got {t!r}{hint}")
        try:
            v = float(m.group(3))
        except ValueError:
            raise ConfigError(source, where, f"{what}threshold is not a number in {t!r}") from None
        if not math.isfinite(v):
            raise ConfigError(source, where, f"{what}threshold must be finite, got {t!r}")
        name = m.group(1)
        metric = METRIC_ALIASES.get(name, name)
        if metric not in SLO_METRICS:
            raise ConfigError(source, where, what + _unknown(name))
        out.append(Constraint(metric, m.group(2), v, name))
    return out


def check_slo(summary: Mapping[str, Any], slo: Sequence[Constraint], require_unsaturated: bool = True,
              source: str = "--slo") -> tuple[bool, list[str]]:
    """(meets the SLO, violated terms). A saturated run never meets it when ``require_unsaturated``, a run that
    rejected requests on arrival never (:func:`rejected_term`)."""
    for c in slo:
        if c.metric not in summary:
            numeric = sorted(k for k, v in summary.items() if isinstance(v, (int, float)) and not isinstance(v, bool))
            raise ConfigError(source, "slo", f"unknown metric {c.metric!r}; run summaries have: {', '.join(numeric)}")
    # A metric without a value (e.g. no request completed in the window) makes the probe infeasible, with the
    # reason spelled out in the search trace, rather than an error: at a high enough load that is the answer.
    bad = [str(c) if measured(summary.get(c.metric)) else f"{c} (no value: {summary.get(c.metric)!r})"
           for c in slo if not c.holds(summary)]
    if require_unsaturated and summary.get("saturated"):
        bad.append("saturated")
    rejected = rejected_term(summary)
    if rejected:
        bad.append(rejected)
    return not bad, bad


def rejected_term(summary: Mapping[str, Any]) -> str | None:
    """The violation of a run that rejected requests on arrival (prompt + output + K beyond the KV capacity or
    max_model_len), or None: such a run does not serve its load, whatever the admitted requests' metrics say (a
    probe rejecting 99% of its requests met the SLO on the other 1%)."""
    n = int(summary.get("num_requests_rejected") or 0)
    if not n:
        return None
    why = ", ".join(f"{k}: {v}" for k, v in (summary.get("rejected_by_reason") or {}).items() if v)
    return (f"no request rejected on arrival ({n} of {summary.get('num_requests_issued')} were"
            + (f"; {why}" if why else "") + ")")


@dataclass(frozen=True)
class CapacitySettings:
    """One capacity search (:func:`capacity_settings` builds it): the ``load`` axis searched between ``lo`` and
    ``hi`` to ``tolerance``, the ``slo`` every probe must meet (and not saturate, unless ``require_unsaturated`` is
    False), over ``seeds`` seeds."""

    load: str
    lo: float
    hi: float
    tolerance: float
    slo: tuple[Constraint, ...]
    require_unsaturated: bool = True
    seeds: int = 1  # > 1: one search per seed (seed, seed+1, ...), capacity = mean with a 95% t-interval

    @property
    def integer(self) -> bool:
        return self.load == "concurrency"

    def to_dict(self) -> dict[str, Any]:
        """The settings as capacity.json states them (with the monotonicity assumption)."""
        d = {"load": self.load, "min": self.lo, "max": self.hi, "tolerance": self.tolerance,
             "slo": [str(c) for c in self.slo], "require_unsaturated": self.require_unsaturated,
             "assumption": "the SLO holds at every load below the capacity and fails above it (monotone)"}
        if self.seeds > 1:
            d["seeds"] = self.seeds
            d["interval"] = ("capacity searched independently per seed; reported: the mean of the per-seed "
                             "capacities and its 95% Student-t interval over seeds (each per-seed capacity is "
                             "itself known to within the bisection tolerance)")
        return d


def capacity_settings(spec: SweepSpec, **over: Any) -> CapacitySettings:
    """Settings from the spec's [capacity] table, overridden by non-None keyword values (the CLI flags)."""
    src = spec.source
    table = dict(spec.capacity)
    # the [capacity] table may use the option names: sla (= slo), allow_saturated (= not require_unsaturated)
    for alias, key, conv in (("sla", "slo", lambda v: v), ("allow_saturated", "require_unsaturated",
                                                            lambda v: (not v) if isinstance(v, bool) else v)):
        if alias in table:
            if key in table:
                raise ConfigError(src, f"capacity.{alias}", f"same setting as capacity.{key}; keep one")
            table[key] = conv(table.pop(alias))
    given = {k for k, v in over.items() if v is not None}   # typed on the command line
    d = {**table, **{k: v for k, v in over.items() if v is not None}}
    known = ("load", "min", "max", "tolerance", "slo", "require_unsaturated", "seeds")
    for k in d:
        if k not in known:
            raise ConfigError(src, f"capacity.{k}", f"unknown key; expected some of {', '.join(known)} (or sla, "
                              "allow_saturated)")

    def bad(k: str, msg: str, *also: str) -> ConfigError:
        # blamed where the value came from: the command line (its option) or the spec file (capacity.KEY); a
        # clash of two values goes to the command-line one when there is one (``also``: the other key)
        for key in (k, *also):
            if key in given:
                return ConfigError("cli", _FLAGS[key], msg)
        return ConfigError(src, f"capacity.{k}", msg)

    load = d.get("load", spec.load_key)
    if load not in LOAD_KEYS:
        raise bad("load", f"expected one of {LOAD_KEYS}, got {load!r}")
    _check_range_load(src, table, table.get("load", spec.load_key), load, given)
    if load in spec.axes:
        raise ConfigError(src, f"axes.{load}", "is the load the capacity search varies; remove it from [axes]")
    if load in spec.base:    # every probe sets its own load: the value was dropped silently
        raise ConfigError(src, f"base.{load}", f"is the load the capacity search varies: its value {spec.base[load]!r} "
                          f"would be ignored; remove it{'' if 'load' in d else f' (capacity.load = {load!r} names the load)'}")
    for table, keys in (("base", spec.base), ("axes", spec.axes)):
        for k in LOAD_KEYS:   # another load key: each probe would set two loads (blamed on the search's, not this)
            if k != load and k in keys:
                raise ConfigError(src, f"{table}.{k}", f"sets the load as {k}, but the capacity search varies "
                                  f"{load}{_from('load', given, src) if 'load' in d else ''}; remove one of the two")
    for k in ("min", "max"):
        if k not in d:
            raise ConfigError(src, f"capacity.{k}", f"required: the load range to search (or {_FLAGS[k]})")
        if isinstance(d[k], bool) or not isinstance(d[k], (int, float)) or not 0 < d[k] < math.inf:
            raise bad(k, f"expected a finite number > 0, got {d[k]!r}")
    lo, hi = float(d["min"]), float(d["max"])
    if load == "concurrency":
        for k, v in (("min", lo), ("max", hi)):
            if not v.is_integer():
                raise bad(k, f"concurrency bounds must be integers, got {v:g}", "load")
    if not hi > lo:
        if "min" in given and "max" not in given:
            raise bad("min", f"must be below max ({hi:g}{_from('max', given, src)}), got {lo:g}")
        raise bad("max", f"must exceed min ({lo:g}{_from('min', given, src)}), got {hi:g}")
    tol = d.get("tolerance", 1.0 if load == "concurrency" else (hi - lo) / 100)
    if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not 0 < tol < math.inf:
        raise bad("tolerance", f"expected a finite number > 0, got {tol!r}")
    if load == "concurrency" and tol < 1:
        raise bad("tolerance", f"concurrency is an integer: tolerance must be >= 1, got {tol!r}", "load")
    req = d.get("require_unsaturated", True)
    if not isinstance(req, bool):
        raise bad("require_unsaturated", f"expected true or false, got {req!r}")
    seeds = d.get("seeds", 1)
    if isinstance(seeds, bool) or not isinstance(seeds, int) or not 1 <= seeds <= MAX_SEEDS:
        raise bad("seeds", f"expected an integer in 1..{MAX_SEEDS}, got {seeds!r}")
    if seeds > 1 and "seed" in spec.axes:
        raise ConfigError(src, "axes.seed", f"conflicts with {'--seeds' if 'seeds' in given else 'capacity.seeds'}, "
                                            "which repeats the search over seeds; keep one")
    if "slo" in given:
        slo = parse_slo(d["slo"], "cli", "--slo")
    else:
        slo = parse_slo(d.get("slo") or [], src, "capacity.slo")
    return CapacitySettings(load, lo, hi, float(tol), tuple(slo), req, seeds)


def _check_range_load(src: str, table: Mapping[str, Any], table_load: Any, load: str, given: set[str]) -> None:
    """A --load other than the load the spec's [capacity] table was written for (its ``load``, else the spec's
    load key) takes none of the table's min, max or tolerance: they are in that load's units (a concurrency range
    1..64 was searched as 1..64 req/s without a word). ConfigError naming the values the command line must give."""
    if "load" not in given or load == table_load:
        return
    stale = [k for k in ("min", "max", "tolerance") if k in table and k not in given]
    if stale:
        vals = ", ".join(f"capacity.{k} = {table[k]!r}" for k in stale)
        whose = "capacity.load" if "load" in table else "the spec's load"
        raise ConfigError("cli", "--load", f"searches {load}, but {src}'s {vals} "
                          f"{'was' if len(stale) == 1 else 'were'} written for load {table_load!r} ({whose}): "
                          f"give {', '.join(_FLAGS[k] for k in stale)} for {load} as well")


# The command-line option of each [capacity] key (capacity_settings' keyword overrides).
_FLAGS = {"load": "--load", "min": "--min", "max": "--max", "tolerance": "--tolerance", "slo": "--slo",
          "require_unsaturated": "--allow-saturated", "seeds": "--seeds"}


def _from(k: str, given: set[str], src: str) -> str:
    return f", from {_FLAGS[k]}" if k in given else f", from {src} capacity.{k}"


@dataclass
class _Search:
    """Bisection state of one group: [lo, hi] brackets the boundary (lo meets the SLO, hi does not)."""

    key: dict[str, Any]
    st: CapacitySettings
    lo: float
    hi: float
    trace: list[dict[str, Any]] = field(default_factory=list)
    status: str = "running"
    lo_ok: bool | None = None
    hi_ok: bool | None = None

    def probes(self) -> list[float]:
        if self.status != "running":
            return []
        if self.lo_ok is None:
            return [self.lo, self.hi]  # first round: both ends
        if self.hi - self.lo <= self.st.tolerance:
            self.status = "ok"
            return []
        mid = (self.lo + self.hi) / 2
        if self.st.integer:
            mid = float(math.floor(mid))
        return [mid]

    def feed(self, load: float, ok: bool) -> None:
        if self.lo_ok is None or self.hi_ok is None:
            if load == self.st.lo:
                self.lo_ok = ok
            else:
                self.hi_ok = ok
            if self.lo_ok is not None and self.hi_ok is not None:
                if not self.lo_ok:
                    self.status = "infeasible_at_min"
                elif self.hi_ok:
                    self.status = "feasible_at_max"
            return
        if ok:
            self.lo = load
        else:
            self.hi = load

    @property
    def capacity(self) -> float | None:
        if self.status == "infeasible_at_min":
            return None
        if self.status == "feasible_at_max":
            return self.st.hi
        return self.lo


def _load_value(st: CapacitySettings, x: float) -> Any:
    return int(x) if st.integer else float(x)


def capacity_search(spec: SweepSpec, settings: CapacitySettings, out_dir: str | Path, backend: str = "local",
                    workers: int | None = None, ray_address: str | None = None, progress: bool = True
                    ) -> dict[str, Any]:
    """Run the search for every group (the cross product of the spec's axes) and return the result dict."""

    st = settings
    names = list(spec.axes)
    base = {k: v for k, v in spec.base.items() if k != st.load}
    groups = [dict(zip(names, combo)) for combo in itertools.product(*(spec.axes[k] for k in names))]
    seeds = seed_list(int(base.get("seed", 0)), st.seeds) if st.seeds > 1 else [None]
    # one search per group and seed (seed innermost); the probe cells of a seed carry it in their key
    searches = [_Search(g if s is None else {**g, "seed": s}, st, st.lo, st.hi) for g in groups for s in seeds]
    rnd = 0
    while True:
        batch: list[tuple[_Search, float, Cell]] = []
        for s in searches:
            for x in s.probes():
                cfg = build_config({**base, **s.key, st.load: _load_value(st, x)}, spec.source)
                batch.append((s, x, Cell(index=len(batch), key={**s.key, st.load: _load_value(st, x)}, config=cfg,
                                         hash=cell_hash(cfg))))
        if not batch:
            break
        rnd += 1
        summaries, failures, _, _ = sweep_runner.run_cells_cached([c for _, _, c in batch], out_dir, backend, workers,
                                                     ray_address, False, progress, desc=f"capacity round {rnd}")
        failed = {f["cell"]: f["error"] for f in failures}
        for s, x, c in batch:
            if c.index in failed:
                s.status = "error"
                s.trace.append({"load": _load_value(st, x), "cell_hash": c.hash, "error": failed[c.index]})
                continue
            summ = summaries[c.index]
            ok, bad = check_slo(summ, st.slo, st.require_unsaturated, spec.source)
            metrics = {m.metric: summ.get(m.metric) for m in st.slo}
            s.trace.append({"load": _load_value(st, x), "feasible": ok, "violations": bad, "metrics": metrics,
                            "saturated": bool(summ.get("saturated")), "cell_hash": c.hash, "round": rnd})
            short = short_window_count(summ, config_users(c.config))
            if short:   # only where it applies: the trace of every other probe is as before
                s.trace[-1]["short_window"] = short
            if s.status == "running":
                s.feed(x, ok)
    results = []
    for s in searches:
        cap = s.capacity if s.status != "error" else None
        results.append({"group": s.key, "capacity": None if cap is None else _load_value(st, cap),
                        "status": s.status, "bracket": [_load_value(st, s.lo), _load_value(st, s.hi)],
                        "n_probes": len(s.trace), "trace": s.trace})
    if st.seeds > 1:
        results = [_over_seeds(g, results[i * len(seeds):(i + 1) * len(seeds)]) for i, g in enumerate(groups)]
    return {"spec": spec.source, "settings": st.to_dict(), "base": dict(spec.base), "results": results}


def _over_seeds(group: dict[str, Any], per_seed: list[dict[str, Any]]) -> dict[str, Any]:
    """A group's result over seeds: mean capacity and its 95% t-interval when every seed's search ended inside
    the range ("ok"); otherwise no mean or interval (a capacity at a range end is censored, not measured) and a
    status naming the seeds' outcomes. Each seed's own search (bracket, trace) is kept under ``seeds``."""

    statuses = [r["status"] for r in per_seed]
    ok = all(x == "ok" for x in statuses)
    iv = t_interval([r["capacity"] for r in per_seed]) if ok else None
    status = statuses[0] if len(set(statuses)) == 1 else "mixed: " + ", ".join(
        f"{n} {x}" for x, n in sorted({x: statuses.count(x) for x in statuses}.items()))
    seeds = [{"seed": r["group"]["seed"], **{k: v for k, v in r.items() if k != "group"}} for r in per_seed]
    return {"group": group, "capacity": iv.mean if iv else None, "capacity_lo": iv.lo if iv else None,
            "capacity_hi": iv.hi if iv else None, "n_seeds": len(per_seed),
            "capacities": [r["capacity"] for r in per_seed], "status": status,
            "n_probes": sum(r["n_probes"] for r in per_seed), "seeds": seeds}


def capacity_table(res: Mapping[str, Any]) -> pd.DataFrame:
    """One row per group: its axis values, capacity, status, bracket and number of probes; over several seeds the
    mean capacity, its 95% interval (capacity_lo, capacity_hi), n_seeds and every seed's capacity instead of the
    bracket."""
    rows = []
    for r in res["results"]:
        if "seeds" in r:
            rows.append({**r["group"], "load": res["settings"]["load"], "capacity": r["capacity"],
                         "capacity_lo": r["capacity_lo"], "capacity_hi": r["capacity_hi"], "n_seeds": r["n_seeds"],
                         "capacities": " ".join("-" if c is None else f"{c:g}" for c in r["capacities"]),
                         "status": r["status"], "n_probes": r["n_probes"]})
            continue
        rows.append({**r["group"], "load": res["settings"]["load"], "capacity": r["capacity"], "status": r["status"],
                     "bracket_lo": r["bracket"][0], "bracket_hi": r["bracket"][1], "n_probes": r["n_probes"]})
    return pd.DataFrame(rows)


def capacity_errors(res: Mapping[str, Any]) -> list[str]:
    """One line per probe that failed to run (its search stopped with status error), for every group and seed:
    the group's axis values, the load and the error."""
    lines = []
    for r in res["results"]:
        for run in r.get("seeds", [r]):
            key = {**r["group"], **({"seed": run["seed"]} if "seed" in run else {})}
            for t in run["trace"]:
                if "error" in t:
                    what = ", ".join(f"{k}={v}" for k, v in key.items())
                    lines.append(f"  [{what}] {res['settings']['load']}={t['load']}: {t['error']}")
    return lines


def capacity_short_windows(res: Mapping[str, Any]) -> list[str]:
    """'[axis=value, ...] LOAD=X: N finished for U users' for every closed-loop probe whose measurement window
    finished fewer requests than it has users (its trace entry's ``short_window``), for every group and seed."""
    lines = []
    for r in res["results"]:
        for run in r.get("seeds", [r]):
            key = {**r["group"], **({"seed": run["seed"]} if "seed" in run else {})}
            what = ", ".join(f"{k}={v}" for k, v in key.items())
            lines += [f"[{what}] {res['settings']['load']}={t['load']}: {t['short_window']}"
                      for t in run["trace"] if t.get("short_window")]
    return lines
