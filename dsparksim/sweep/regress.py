"""Regression check: recompute a small fixed sweep and compare its frontiers with a saved baseline.

The baseline JSON (format ``dsparksim-regress/2``) stores the spec it was made from (path relative to the
baseline file, plus the spec's sha256), the seeds, the tolerance floors, every frontier point (policy x load: each
compared metric's mean over the seeds and the half-width of its 95% t-interval, the Pareto and saturation flags)
and the matched comparison gains vs the baseline policy (paired per-seed mean gain and its half-width).

The rule (one per metric and point, and per gain): a difference is flagged when

    |new mean - baseline mean| > baseline half-width + new half-width + floor,   floor = atol + rtol * |baseline|

(for gains the floor is ``gain_atol``). The new run is the same sweep over the same seeds, so an unchanged
simulator reproduces the baseline exactly (runs are deterministic given their seed) and never flags; a change
flags where it moves a mean further than the two intervals together allow. Adding the half-widths is conservative
(the interval of a difference of independent means is at most that wide). The floor keeps a metric with no spread
over seeds (e.g. fixed:7's verify length) from flagging on last-bit floating-point differences. With one seed
there are no intervals and the floor alone is the tolerance (the exact check of format 1); ``--exact`` applies
that check to a multi-seed baseline (any change at all is flagged). Flag flips (Pareto,
saturated) fail the check with one seed; with several they are reported as notes, since a point within its
interval may cross a neighbour's.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import pandas as pd

from dsparksim.errors import ConfigError, InputError
from dsparksim.sweep.spec import LOAD_KEYS, SweepSpec, load_spec

FORMAT = "dsparksim-regress/2"
OLD_FORMATS = ("dsparksim-regress/1",)
METRICS = ("output_throughput_tok_s", "tps_user_median", "ttft_median_s", "tpot_median_s", "mean_verify_len", "tau",
           "num_requests_completed")
FLAGS = ("pareto", "saturated")
DEFAULT_TOLERANCES = {"rtol": 1e-6, "atol": 1e-9, "gain_atol": 1e-6}
REGRESS_KEYS = tuple(DEFAULT_TOLERANCES) + ("baseline_policy", "seeds")
RULE = ("flag when |new - baseline| > baseline half-width + new half-width + (atol + rtol*|baseline|) "
        "(gains: + gain_atol); half-widths of 95% t-intervals over the seeds")
HW = "_hw"  # suffix of a metric's half-width in the baseline document


def _seeds(spec: SweepSpec) -> list[int]:
    """The regress run's seeds: [regress] seeds = N -> the base seed and the N-1 after it (default 1)."""
    from dsparksim.results.stats import seed_list

    for k in spec.regress:
        if k not in REGRESS_KEYS:
            raise ConfigError(spec.source, f"regress.{k}", f"unknown key; expected some of {', '.join(REGRESS_KEYS)}")
    n = spec.regress.get("seeds", 1)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(spec.source, "regress.seeds", f"expected an integer >= 1, got {n!r}")
    if "seed" in spec.axes:
        raise ConfigError(spec.source, "axes.seed", "regress repeats every cell over [regress] seeds; do not vary "
                                                    "the seed as an axis")
    return seed_list(int(spec.base.get("seed", 0)), n)


def compute(spec: SweepSpec, backend: str = "local", workers: int | None = None,
            ray_address: str | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Run every cell over the spec's seeds (no cache: this is the check) and return (frontier table, comparison
    table); with several seeds the tables of ``frontier --seeds`` (means, ``<metric>_lo/_hi``, paired gains)."""
    from dsparksim.results.frontier import comparison_table, frontier_table
    from dsparksim.results.frontier_seeds import comparison_with_intervals, seed_means
    from dsparksim.sweep.backends import Task, make_backend
    from dsparksim.sweep.cells import expand

    extra = [k for k in spec.axes if k not in ("policy",) + LOAD_KEYS]
    if extra or "policy" not in spec.axes:
        raise ConfigError(spec.source, "axes", f"a regress spec varies only policy and one load axis (got axes "
                          f"{list(spec.axes)}); fix everything else in [base]")
    seeds = _seeds(spec)
    cells = [(c.key, c.config.replace(seed=s)) for c in expand(spec) for s in seeds]  # seeds innermost
    results: dict[int, dict[str, Any]] = {}
    make_backend(backend, workers, ray_address).run([Task(i, cfg) for i, (_, cfg) in enumerate(cells)],
                                                    lambda r: results.__setitem__(r["index"], r))
    bad = [(i, results[i]) for i in range(len(cells)) if not results[i]["ok"]]
    if bad:
        i, r = bad[0]
        raise ConfigError(spec.source, "cells", f"{len(bad)} cell(s) failed, first {cells[i][0]} seed "
                          f"{cells[i][1].seed}: {r['error']}")
    summaries = [results[i]["summary"] for i in range(len(cells))]
    base_policy = spec.regress.get("baseline_policy", "mtp1")
    if len(seeds) == 1:
        df = frontier_table(summaries)
        return df, comparison_table(df, baseline=base_policy)
    per = frontier_table(summaries, [cfg for _, cfg in cells], seeded=True)
    df = seed_means(per)
    return df, comparison_with_intervals(df, per, baseline=base_policy)


def _spec_sha(spec: SweepSpec) -> str:
    return hashlib.sha256(Path(spec.source).read_bytes()).hexdigest()


def make_baseline(spec: SweepSpec, df: pd.DataFrame, comp: pd.DataFrame, baseline_path: str | Path,
                  tolerances: Mapping[str, float] | None = None) -> dict[str, Any]:
    """The baseline document for ``df``/``comp`` (spec path stored relative to the baseline file)."""
    from dsparksim import __version__

    tol = {**DEFAULT_TOLERANCES, **{k: v for k, v in (tolerances or {}).items() if k in DEFAULT_TOLERANCES},
           **{k: v for k, v in spec.regress.items() if k in DEFAULT_TOLERANCES}}
    rel = os.path.relpath(Path(spec.source).resolve(), Path(baseline_path).resolve().parent)
    seeded = "gain_lo" in comp.columns or "n_seeds" in df.columns
    return {"format": FORMAT, "spec": Path(rel).as_posix(), "spec_sha256": _spec_sha(spec),
            "dsparksim_version": __version__, "seeds": _seeds(spec), "tolerances": tol, "rule": RULE,
            "metrics": list(METRICS), "frontier": [_row(r) for _, r in df.iterrows()],
            "comparison": [_gain_row(r, seeded) for _, r in comp.iterrows()] if len(comp) else []}


def _num(v: Any) -> Any:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    return v.item() if hasattr(v, "item") else v


def _hw(lo: Any, hi: Any) -> float | None:
    lo, hi = _num(lo), _num(hi)
    return None if lo is None or hi is None else (float(hi) - float(lo)) / 2


def _row(r: pd.Series) -> dict[str, Any]:
    """One frontier point: each metric's mean and (with seeds) its 95% half-width, and the flags."""
    out = {"policy": r["policy"], "load": _num(r["load"])}
    for m in METRICS:
        out[m] = _num(r.get(m))
        out[m + HW] = _hw(r.get(f"{m}_lo"), r.get(f"{m}_hi"))
    return {**out, **{f: bool(r[f]) for f in FLAGS}}


def _gain_row(r: pd.Series, seeded: bool) -> dict[str, Any]:
    """One gain: with seeds the paired per-seed mean and its half-width, else the gain of the one frontier."""
    if seeded:
        return {"policy": r["policy"], "metric": r["metric"], "gain_mean": _num(r["gain_seed_mean"]),
                "gain_hw": _hw(r["gain_lo"], r["gain_hi"])}
    return {"policy": r["policy"], "metric": r["metric"], "gain_mean": _num(r["gain_mean"]), "gain_hw": None}


def load_baseline(path: str | Path, old_ok: bool = False) -> dict[str, Any]:
    """Read a baseline document; one of an older format only with ``old_ok`` (``--update`` replaces it)."""
    p = Path(path)
    try:
        d = json.loads(p.read_text())
    except OSError as e:
        raise InputError(str(p), None, f"cannot read baseline: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise InputError(str(p), None, f"not UTF-8 text: byte {e.object[e.start:e.start + 1]!r} at offset "
                         f"{e.start}") from None
    except RecursionError:
        raise InputError(str(p), None, "JSON nested too deeply") from None
    except json.JSONDecodeError as e:
        raise InputError(str(p), None, f"not valid JSON: {e.msg}", line=e.lineno) from None
    got = d.get("format") if isinstance(d, dict) else d
    if got in OLD_FORMATS and not old_ok:
        raise InputError(str(p), "format", f"baseline format {got!r} has no seed intervals (this dsparksim reads "
                         f"{FORMAT!r}); regenerate it: dsparksim regress --baseline {p} --update")
    if got != FORMAT and not (old_ok and got in OLD_FORMATS):
        raise InputError(str(p), "format", f"expected {FORMAT!r}, got {got!r}")
    for k in ("spec", "tolerances", "frontier", "comparison"):
        if k not in d:
            raise InputError(str(p), k, "required field missing")
    return d


def spec_of(baseline: Mapping[str, Any], baseline_path: str | Path) -> Path:
    """The spec file a baseline was made from (its path is relative to the baseline file)."""
    return (Path(baseline_path).resolve().parent / baseline["spec"]).resolve()


def allowed(base: Any, base_hw: Any, new_hw: Any, rtol: float, atol: float) -> float:
    """The largest |new - base| that is not a regression: both half-widths plus the floor (see the module doc)."""
    return float(base_hw or 0.0) + float(new_hw or 0.0) + atol + rtol * abs(float(base))


def _close(a: Any, b: Any, rtol: float, atol: float, a_hw: Any = None, b_hw: Any = None) -> bool:
    """``a`` (new) within tolerance of ``b`` (baseline); a missing value matches only a missing value."""
    if a is None or b is None:
        return a is None and b is None
    return abs(float(a) - float(b)) <= allowed(b, b_hw, a_hw, rtol, atol)


def compare(baseline: Mapping[str, Any], current: Mapping[str, Any],
            notes: dict[str, list[str]] | None = None, exact: bool = False) -> dict[str, list[str]]:
    """Per-policy list of differences of ``current`` from ``baseline`` (empty dict = within tolerance). With
    several seeds, flag flips go to ``notes`` (when given) instead of failing. ``exact``: the floor alone is the
    tolerance (the same seeds reproduce a deterministic simulator to the last bit: any change is flagged)."""
    tol = baseline["tolerances"]
    rtol, atol, gatol = float(tol["rtol"]), float(tol["atol"]), float(tol["gain_atol"])
    seeded = len(baseline.get("seeds") or [None]) > 1 and not exact
    diffs: dict[str, list[str]] = {}

    def add(pol: str, msg: str, note: bool = False) -> None:
        if note:
            if notes is not None:
                notes.setdefault(pol, []).append(msg)
            return
        diffs.setdefault(pol, []).append(msg)

    if list(baseline.get("seeds") or []) != list(current.get("seeds") or []):
        add("(spec)", f"seeds {baseline.get('seeds')} -> {current.get('seeds')}: not the same runs")
    if baseline.get("spec_sha256") != current.get("spec_sha256"):
        add("(spec)", f"spec {baseline['spec']} changed since the baseline was made (sha256 differs); "
                      "regenerate it with --update if the change is intended")
    want = {(r["policy"], r["load"]): r for r in baseline["frontier"]}
    got = {(r["policy"], r["load"]): r for r in current["frontier"]}
    for k in sorted(set(want) | set(got), key=lambda k: (str(k[0]), float(k[1]))):
        pol, load = k
        if k not in got:
            add(pol, f"load {load:g}: in the baseline, missing now")
            continue
        if k not in want:
            add(pol, f"load {load:g}: new point, not in the baseline")
            continue
        w, g = want[k], got[k]
        for m in baseline.get("metrics", METRICS):
            hw = (None, None) if exact else (g.get(m + HW), w.get(m + HW))
            if not _close(g.get(m), w.get(m), rtol, atol, *hw):
                rel = ("" if w.get(m) in (None, 0) or g.get(m) is None
                       else f" ({100 * (float(g[m]) - float(w[m])) / abs(float(w[m])):+.4g}%)")
                add(pol, f"load {load:g}: {m} {_fmt(w.get(m))}{_pm(w.get(m + HW))} -> {_fmt(g.get(m))}"
                         f"{_pm(g.get(m + HW))}{rel}")
        for f in FLAGS:
            if bool(w.get(f)) != bool(g.get(f)):
                add(pol, f"load {load:g}: {f} {w.get(f)} -> {g.get(f)}", note=seeded)
    cw = {(r["policy"], r["metric"]): r for r in baseline["comparison"]}
    cg = {(r["policy"], r["metric"]): r for r in current["comparison"]}
    for k in sorted(set(cw) | set(cg)):
        a, b = (cw.get(k) or {}).get("gain_mean"), (cg.get(k) or {}).get("gain_mean")
        ah, bh = (cw.get(k) or {}).get("gain_hw"), (cg.get(k) or {}).get("gain_hw")
        if not _close(b, a, 0.0, gatol, *((None, None) if exact else (bh, ah))):
            add(k[0], f"{k[1]} (mean gain) {_fmt(a)}{_pm(ah)} -> {_fmt(b)}{_pm(bh)}")
    return diffs


def _pm(hw: Any) -> str:
    return "" if hw is None else f" +-{hw:.3g}"


def _fmt(v: Any) -> str:
    return "none" if v is None else f"{v:.10g}" if isinstance(v, float) else str(v)


def _tol_text(tol: Mapping[str, float], seeds: Sequence[int] | None, exact: bool = False) -> str:
    floor = f"rtol {tol['rtol']:g}, atol {tol['atol']:g}, gain atol {tol['gain_atol']:g}"
    if exact:
        return f"exact: {floor}, no seed intervals"
    if seeds and len(seeds) > 1:
        return (f"tolerance: both runs' 95% t-interval half-widths over {len(seeds)} seeds {seeds[0]}..{seeds[-1]} "
                f"plus a floor of {floor}")
    return floor


def diff_text(diffs: Mapping[str, Sequence[str]], tol: Mapping[str, float],
              seeds: Sequence[int] | None = None, exact: bool = False) -> str:
    lines = [f"frontier regression: {sum(len(v) for v in diffs.values())} difference(s) in {len(diffs)} "
             f"policy(ies) beyond tolerance ({_tol_text(tol, seeds, exact)}):"]
    for pol in sorted(diffs):
        lines.append(f"  {pol}:")
        lines.extend(f"    {d}" for d in diffs[pol])
    return "\n".join(lines)


def _notes_text(notes: Mapping[str, Sequence[str]]) -> str:
    if not notes:
        return ""
    lines = ["note: flags changed on points whose metrics stayed within their intervals (not a failure with "
             "several seeds):"]
    for pol in sorted(notes):
        lines.extend(f"  {pol}: {n}" for n in notes[pol])
    return "\n" + "\n".join(lines)


def regress(baseline_path: str | Path, spec_path: str | Path | None = None, backend: str = "local",
            workers: int | None = None, ray_address: str | None = None,
            update: bool = False, exact: bool = False) -> tuple[bool, str, dict[str, Any]]:
    """Recompute the baseline's sweep and compare. Returns (passed, readable report, current document).

    With ``update`` the baseline file is (re)written from the current results (``spec_path`` required if the
    baseline does not exist yet).
    """
    from dsparksim.sweep.cache import write_json

    bp = Path(baseline_path)
    base = None if (update and not bp.exists()) else load_baseline(bp, old_ok=update)
    sp = Path(spec_path) if spec_path else (spec_of(base, bp) if base else None)
    if sp is None:
        raise ConfigError("regress", "--spec", "a new baseline needs the spec it is made from (--spec FILE)")
    spec = load_spec(sp)
    df, comp = compute(spec, backend, workers, ray_address)
    cur = make_baseline(spec, df, comp, bp, base["tolerances"] if base else None)
    if update:
        write_json(bp, cur)
        return True, f"baseline written: {bp} ({len(cur['frontier'])} frontier points)", cur
    notes: dict[str, list[str]] = {}
    diffs = compare(base, cur, notes, exact)
    if not diffs:
        n_pol = len({r["policy"] for r in cur["frontier"]})
        return True, (f"frontiers match the baseline {bp}: {len(cur['frontier'])} points, {n_pol} policies "
                      f"({_tol_text(base['tolerances'], base.get('seeds'), exact)}){_notes_text(notes)}"), cur
    return False, diff_text(diffs, base["tolerances"], base.get("seeds"), exact) + _notes_text(notes), cur
