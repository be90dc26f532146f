"""Regression check: recompute a small fixed sweep and compare it seed by seed with a saved baseline.

The baseline JSON (format ``dsparksim-regress/3``) stores the spec it was made from (path relative to the
baseline file, plus the spec's sha256), the seeds, the rule's settings and every frontier point (policy x load):
each compared metric's value at every seed, and the Pareto and saturation flags per seed.

The rule, per point and metric. The new run is the same sweep over the same seeds, and a run's draws are keyed
by (seed, request, step), so seed s of the new run is paired with seed s of the baseline. With d_s = new_s -
baseline_s, a change is flagged when

    the 95% Student-t interval of mean(r_s) excludes zero   AND   |mean(r_s)| > threshold,

where r_s = d_s / |baseline_s| is the relative change at seed s (the plain d_s, against threshold x |mean
baseline|, where some baseline_s is 0)

(``threshold`` = 0.02 by default: a practical size below which a change is not worth a failure). With one seed
the interval is the difference itself. An unchanged simulator reproduces every seed exactly (d_s = 0), so it never
flags; seed-to-seed spread, which made the unpaired intervals of format 2 wide, cancels in d_s. Each policy's
points are compared on their own (no gain against a baseline policy is compared: it moves with either policy), so
a regression is reported under the policy whose runs changed. ``--exact`` flags any difference beyond the floor
``atol + rtol x |baseline|`` at any seed. Flag flips (Pareto, saturated) and a metric that gains or loses its value
at some seed are notes, never failures. benchmarks/regress_power.py measures what the rule detects.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import pandas as pd

from dsparksim.errors import ConfigError, InputError
from dsparksim.sweep.spec import LOAD_KEYS, SweepSpec, load_spec, unread_note
from dsparksim import __version__
from dsparksim.results.frontier import frontier_table
from dsparksim.results.outputs import check_out_file
from dsparksim.results.stats import seed_list, t_interval
from dsparksim.sweep.backends import make_backend, Task
from dsparksim.sweep.cache import write_json
from dsparksim.sweep.cells import expand

FORMAT = "dsparksim-regress/3"
OLD_FORMATS = ("dsparksim-regress/1", "dsparksim-regress/2")
METRICS = ("output_throughput_tok_s", "tps_user_median", "ttft_median_s", "tpot_median_s", "mean_verify_len", "tau",
           "num_requests_completed")
FLAGS = ("pareto", "saturated")
DEFAULT_TOLERANCES = {"threshold": 0.02, "confidence": 0.95, "rtol": 1e-6, "atol": 1e-9}
REGRESS_KEYS = tuple(DEFAULT_TOLERANCES) + ("seeds",)
# keys of format 2 the paired rule no longer reads: refused with the reason
GONE_KEYS = {"gain_atol": "gains against a baseline policy are no longer compared (each policy's own points are)",
             "baseline_policy": "gains against a baseline policy are no longer compared (each policy's own points "
                                "are)"}


def rule_text(tol: Mapping[str, float]) -> str:
    return (f"flag when the {tol['confidence']:.0%} t-interval of the paired per-seed changes ((new - baseline) / "
            f"baseline, same seed) excludes zero and their mean exceeds {tol['threshold']:.0%}")


def _seeds(spec: SweepSpec) -> list[int]:
    """The regress run's seeds: [regress] seeds = N -> the base seed and the N-1 after it (default 1)."""

    for k in spec.regress:
        if k in GONE_KEYS:
            raise ConfigError(spec.source, f"regress.{k}", f"no longer read: {GONE_KEYS[k]}; remove it")
        if k not in REGRESS_KEYS:
            raise ConfigError(spec.source, f"regress.{k}", f"unknown key; expected some of {', '.join(REGRESS_KEYS)}")
    n = spec.regress.get("seeds", 1)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(spec.source, "regress.seeds", f"expected an integer >= 1, got {n!r}")
    if "seed" in spec.axes:
        raise ConfigError(spec.source, "axes.seed", "regress repeats every cell over [regress] seeds; do not vary "
                                                    "the seed as an axis")
    return seed_list(int(spec.base.get("seed", 0)), n)


def tolerances(spec: SweepSpec, given: Mapping[str, Any] | None = None) -> dict[str, float]:
    """The rule's settings: defaults, then ``given`` (a baseline's), then the spec's [regress] table; checked."""
    tol = {**DEFAULT_TOLERANCES, **{k: v for k, v in (given or {}).items() if k in DEFAULT_TOLERANCES},
           **{k: v for k, v in spec.regress.items() if k in DEFAULT_TOLERANCES}}
    for k, v in tol.items():
        bad = isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0
        if k == "confidence":
            bad = bad or not 0 < v < 1
        if bad:
            want = "a number in (0, 1)" if k == "confidence" else "a finite number >= 0"
            raise ConfigError(spec.source, f"regress.{k}", f"expected {want}, got {v!r}")
    return {k: float(v) for k, v in tol.items()}


def compute(spec: SweepSpec, backend: str = "local", workers: int | None = None,
            ray_address: str | None = None, failures: list[tuple[str, Any, int, str]] | None = None
            ) -> pd.DataFrame:
    """Run every cell over the spec's seeds (no cache: this is the check) and return the per-seed frontier table
    (one row per policy x load x seed, ``seed`` column first). A cell that fails raises ConfigError, or, when
    ``failures`` is given, is left out of the table and appended there as (policy, load, seed, error)."""

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
    if bad and failures is None:
        i, r = bad[0]
        raise ConfigError(spec.source, "cells", f"{len(bad)} cell(s) failed, first {cells[i][0]} seed "
                          f"{cells[i][1].seed}: {r['error']}")
    for i, r in bad:
        key = cells[i][0]
        failures.append((str(key["policy"]), key.get(spec.load_key, spec.base.get(spec.load_key)),
                         cells[i][1].seed, r["error"]))
    ok = [i for i in range(len(cells)) if results[i]["ok"]]
    if not ok:      # every cell failed: no row to compare (each point is missing, each failure reported)
        return pd.DataFrame(columns=["seed", "policy", "load", *METRICS, *FLAGS])
    return frontier_table([results[i]["summary"] for i in ok], [cells[i][1] for i in ok], seeded=True)


def _spec_sha(spec: SweepSpec) -> str:
    return hashlib.sha256(Path(spec.source).read_bytes()).hexdigest()


def _runs_sha(spec: SweepSpec) -> str:
    """sha256 of what regress reads of the spec ([base], [axes] in order, [regress]): a comment, the sweep's name
    or a [capacity] table (one file serves sweep, capacity and regress) leave the runs, and this hash, unchanged."""
    doc = {"base": dict(spec.base), "axes": [[k, list(v)] for k, v in spec.axes.items()],
           "regress": dict(spec.regress)}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def make_baseline(spec: SweepSpec, per_seed: pd.DataFrame, baseline_path: str | Path,
                  tol: Mapping[str, float] | None = None) -> dict[str, Any]:
    """The baseline document of a per-seed frontier table (spec path stored relative to the baseline file)."""

    tol = tolerances(spec, tol)
    rel = os.path.relpath(Path(spec.source).resolve(), Path(baseline_path).resolve().parent)
    seeds = _seeds(spec)
    points = []
    for (pol, load), g in per_seed.groupby(["policy", "load"], sort=False):
        g = g.set_index("seed").reindex(seeds)
        row: dict[str, Any] = {"policy": pol, "load": _num(load)}
        row.update({m: [_num(v) for v in g[m]] if m in g else [None] * len(seeds) for m in METRICS})
        row.update({f: [bool(v) for v in g[f].fillna(False)] for f in FLAGS})
        points.append(row)
    return {"format": FORMAT, "spec": Path(rel).as_posix(), "spec_sha256": _spec_sha(spec),
            "runs_sha256": _runs_sha(spec), "dsparksim_version": __version__, "seeds": seeds, "tolerances": tol,
            "rule": rule_text(tol), "metrics": list(METRICS), "frontier": points}


def _num(v: Any) -> Any:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    return v.item() if hasattr(v, "item") else v


def load_baseline(path: str | Path, old_ok: bool = False) -> dict[str, Any]:
    """Read and check a baseline document; one of an older format only with ``old_ok`` (``--update`` replaces
    it). Every per-seed value must be a number or null (InputError naming the field otherwise)."""
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
        raise InputError(str(p), "format", f"baseline format {got!r} has no per-seed values (this dsparksim reads "
                         f"{FORMAT!r}); regenerate it: dsparksim regress --baseline {p} --update")
    if got != FORMAT and not (old_ok and got in OLD_FORMATS):
        raise InputError(str(p), "format", f"expected {FORMAT!r}, got {got!r}")
    for k in ("spec", "tolerances", "frontier", "seeds"):
        if k not in d:
            raise InputError(str(p), k, "required field missing")
    if got == FORMAT:
        _check_doc(d, str(p), metrics_too=not old_ok)   # --update rewrites the metrics (a newer baseline's too)
    return d


def _check_doc(d: Mapping[str, Any], src: str, metrics_too: bool = True) -> None:
    seeds = d["seeds"]
    if not isinstance(seeds, list) or not seeds:
        raise InputError(src, "seeds", f"expected a non-empty list of seeds, got {seeds!r}")
    tol = d["tolerances"]
    if not isinstance(tol, dict):
        raise InputError(src, "tolerances", f"expected an object, got {tol!r}")
    for k in DEFAULT_TOLERANCES:
        v = tol.get(k)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 or (
                k == "confidence" and not 0 < v < 1):
            raise InputError(src, f"tolerances.{k}", f"expected a number >= 0 (confidence in (0, 1)), got {v!r}")
    metrics = d.get("metrics", list(METRICS))
    if metrics_too:
        _check_metrics(metrics, d.get("dsparksim_version"), src)
    elif not isinstance(metrics, list):
        metrics = []
    if not isinstance(d["frontier"], list):
        raise InputError(src, "frontier", "expected a list of points")
    seen: dict[tuple[str, float], int] = {}
    for i, r in enumerate(d["frontier"]):
        if not isinstance(r, dict) or "policy" not in r or not _is_num(r.get("load")):
            raise InputError(src, f"frontier[{i}]", "expected a point with policy and a numeric load")
        j = seen.setdefault((str(r["policy"]), float(r["load"])), i)
        if j != i:   # one of the two would be compared, the other dropped without a word
            raise InputError(src, f"frontier[{i}]", f"policy {r['policy']!r} at load {r['load']:g} is already "
                             f"frontier[{j}]; expected one point per policy and load")
        for m in metrics:
            vals = r.get(m)
            if not isinstance(vals, list) or len(vals) != len(seeds) or not all(
                    v is None or _is_num(v) for v in vals):
                raise InputError(src, f"frontier[{i}].{m}", f"expected {len(seeds)} per-seed numbers (or null), "
                                 f"got {vals!r}")


def _check_metrics(metrics: Any, version: Any, src: str) -> None:
    """The baseline's compared metrics: a non-empty list of metrics this version computes (a metric it does not
    compute -- a baseline of a newer dsparksim, or a typo -- would be compared against nothing and pass)."""
    if not isinstance(metrics, list) or not metrics or not all(isinstance(m, str) for m in metrics):
        got = "an empty list: nothing would be compared" if metrics == [] else repr(metrics)
        raise InputError(src, "metrics", f"expected a non-empty list of metric names (some of {', '.join(METRICS)}), "
                         f"got {got}")
    unknown = [m for m in metrics if m not in METRICS]
    if unknown:
        raise InputError(src, "metrics", f"{', '.join(map(repr, unknown))} not computed by this dsparksim "
                         f"({__version__}; it compares {', '.join(METRICS)}); the baseline was written by dsparksim "
                         f"{version}: compare with that version, or regenerate the baseline with --update")


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def spec_of(baseline: Mapping[str, Any], baseline_path: str | Path) -> Path:
    """The spec file a baseline was made from (its path is relative to the baseline file)."""
    return (Path(baseline_path).resolve().parent / baseline["spec"]).resolve()


def paired_change(base: Sequence[Any], new: Sequence[Any], confidence: float
                  ) -> tuple[float, float, float, float, int] | None:
    """(baseline mean, mean change, interval lo, hi, n) over the seeds where both values exist; None when none.

    The change is relative per seed, (new_s - base_s) / |base_s| -- a slowdown scales every seed alike -- and is
    returned in the metric's units (times |baseline mean|) so one rule covers both forms; where some base_s is 0
    the plain differences new_s - base_s are used. One pair: the interval is the change itself."""

    pairs = [(float(b), float(n)) for b, n in zip(base, new) if b is not None and n is not None]
    if not pairs:
        return None
    bmean = sum(b for b, _ in pairs) / len(pairs)
    rel = all(b != 0 for b, _ in pairs) and bmean != 0
    diffs = [(n - b) / abs(b) if rel else n - b for b, n in pairs]
    iv = t_interval(diffs, confidence)
    mean, lo, hi = (iv.mean, iv.lo, iv.hi) if len(diffs) > 1 else (diffs[0], diffs[0], diffs[0])
    scale = abs(bmean) if rel else 1.0
    return bmean, mean * scale, lo * scale, hi * scale, len(pairs)


def flagged(change: tuple[float, float, float, float, int], threshold: float, atol: float = 0.0) -> bool:
    """The rule: the interval excludes zero and the mean difference exceeds threshold x |baseline mean|."""
    bmean, mean, lo, hi, _ = change
    return (lo > 0 or hi < 0) and abs(mean) > threshold * abs(bmean) + atol


def compare(baseline: Mapping[str, Any], current: Mapping[str, Any],
            notes: dict[str, list[str]] | None = None, exact: bool = False) -> dict[str, list[str]]:
    """Per-policy list of differences of ``current`` from ``baseline`` under the paired rule (empty dict = none
    flagged). ``notes`` (when given) collects flag flips and values that appear or vanish at some seed.
    ``exact``: any per-seed difference beyond ``atol + rtol x |baseline|`` is flagged."""
    tol = {**DEFAULT_TOLERANCES, **baseline["tolerances"]}
    thr, conf = float(tol["threshold"]), float(tol["confidence"])
    rtol, atol = float(tol["rtol"]), float(tol["atol"])
    diffs: dict[str, list[str]] = {}

    def add(pol: str, msg: str, note: bool = False) -> None:
        if note:
            if notes is not None:
                notes.setdefault(pol, []).append(msg)
            return
        diffs.setdefault(pol, []).append(msg)

    if list(baseline.get("seeds") or []) != list(current.get("seeds") or []):
        add("(spec)", f"seeds {baseline.get('seeds')} -> {current.get('seeds')}: not the same runs")
    _spec_change(baseline, current, add)
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
            b, n = list(w.get(m) or []), list(g.get(m) or [])
            gone = [i for i, (x, y) in enumerate(zip(b, n)) if (x is None) != (y is None)]
            if gone:
                add(pol, f"load {load:g}: {m} has a value at {len(gone)} seed(s) in only one of the two runs",
                    note=not exact)
            if exact:
                bad = [i for i, (x, y) in enumerate(zip(b, n)) if x is not None and y is not None
                       and abs(float(y) - float(x)) > atol + rtol * abs(float(x))]
                if bad:
                    add(pol, f"load {load:g}: {m} differs at {len(bad)} of {len(b)} seed(s), e.g. seed "
                             f"{baseline['seeds'][bad[0]]}: {_fmt(b[bad[0]])} -> {_fmt(n[bad[0]])}")
                continue
            ch = paired_change(b, n, conf)
            if ch is not None and flagged(ch, thr, atol):
                add(pol, f"load {load:g}: {m} {_change_text(ch, conf, _new_mean(b, n))}")
        for f in FLAGS:
            fb, fn = list(w.get(f) or []), list(g.get(f) or [])
            flips = sum(bool(x) != bool(y) for x, y in zip(fb, fn))
            if flips:
                add(pol, f"load {load:g}: {f} changed at {flips} seed(s)", note=True)
    return diffs


def _spec_change(baseline: Mapping[str, Any], current: Mapping[str, Any], add: Callable[..., None]) -> None:
    """A spec edited since the baseline: a failure when what regress reads changed (runs_sha256; a baseline
    without it: the file's bytes), a note when only the rest of the file did (comments, name, [capacity])."""
    if baseline.get("spec_sha256") == current.get("spec_sha256"):
        return
    if "runs_sha256" in baseline and baseline.get("runs_sha256") == current.get("runs_sha256"):
        add("(spec)", f"spec {baseline['spec']} changed since the baseline was made, outside what regress reads "
                      "([base], [axes], [regress] are the same): the same runs are compared", note=True)
        return
    if current.get("spec") not in (None, baseline["spec"]):   # --spec named another file than the baseline's
        add("(spec)", f"spec {current['spec']} (relative to the baseline) is not the baseline's {baseline['spec']} "
                      "and differs from it (sha256): not the same runs; give the baseline's spec, or make a "
                      "baseline of this one with --update")
        return
    add("(spec)", f"spec {baseline['spec']} changed since the baseline was made (sha256 differs); "
                  "regenerate it with --update if the change is intended")


def _new_mean(base: Sequence[Any], new: Sequence[Any]) -> float:
    """The new run's mean over the seeds paired_change compared (both values present)."""
    vals = [float(y) for x, y in zip(base, new) if x is not None and y is not None]
    return sum(vals) / len(vals)


def _change_text(ch: tuple[float, float, float, float, int], conf: float, new_mean: float) -> str:
    """'baseline mean -> new mean (mean paired change; its interval)': the change is the mean of the per-seed
    changes, which is not the change of the means where seeds moved unequally."""
    bmean, mean, lo, hi, n = ch
    if bmean:
        pct = lambda v: f"{100 * v / abs(bmean):+.2f}%"  # noqa: E731
        return (f"{_fmt(bmean)} -> {_fmt(new_mean)} ({pct(mean)}; paired {conf:.0%} CI {pct(lo)}..{pct(hi)}"
                f" over {n} seed{'s' if n > 1 else ''})")
    return f"{_fmt(bmean)} -> {_fmt(new_mean)} (paired {conf:.0%} CI {lo:+.4g}..{hi:+.4g} over {n} seeds)"


def _fmt(v: Any) -> str:
    return "none" if v is None else f"{v:.6g}" if isinstance(v, float) else str(v)


def _tol_text(tol: Mapping[str, float], seeds: Sequence[int] | None, exact: bool = False) -> str:
    tol = {**DEFAULT_TOLERANCES, **tol}
    if exact:
        return f"exact: any seed beyond atol {tol['atol']:g} + rtol {tol['rtol']:g} x |baseline|"
    n = len(seeds or [])
    over = f" over {n} seeds {seeds[0]}..{seeds[-1]}" if n > 1 else " (one seed: the difference itself)"
    return rule_text(tol) + over


def diff_text(diffs: Mapping[str, Sequence[str]], tol: Mapping[str, float],
              seeds: Sequence[int] | None = None, exact: bool = False) -> str:
    lines = [f"frontier regression: {sum(len(v) for v in diffs.values())} difference(s) in {len(diffs)} "
             f"policy(ies) ({_tol_text(tol, seeds, exact)}):"]
    for pol in sorted(diffs):
        lines.append(f"  {pol}:")
        lines.extend(f"    {d}" for d in diffs[pol])
    return "\n".join(lines)


def _notes_text(notes: Mapping[str, Sequence[str]]) -> str:
    if not notes:
        return ""
    lines = ["note: changes that are not failures (flag flips; a metric with a value at some seed in one run "
             "only; spec edits outside what regress reads, baseline settings the spec overrides):"]
    for pol in sorted(notes):
        lines.extend(f"  {pol}: {n}" for n in notes[pol])
    return "\n" + "\n".join(lines)


def _spec_tolerances(base: dict[str, Any], tol: Mapping[str, float], notes: dict[str, list[str]]) -> dict[str, Any]:
    """``base`` judged by ``tol`` (the spec's [regress] over the baseline's settings, as tolerances() resolves
    them); a setting of the baseline's that the spec overrides is a note."""
    own = {**DEFAULT_TOLERANCES, **base["tolerances"]}
    moved = [f"{k} {own[k]:g} in the baseline, {tol[k]:g} in the spec's [regress]" for k in DEFAULT_TOLERANCES
             if float(own[k]) != tol[k]]
    if not moved:
        return base
    notes.setdefault("(spec)", []).append("; ".join(moved) + ": the spec's applied")
    return {**base, "tolerances": dict(tol)}


def json_report(baseline_path: str | Path, doc: Mapping[str, Any], diffs: Mapping[str, Sequence[str]],
                notes: Mapping[str, Sequence[str]], exact: bool = False, updated: bool = False,
                points: int | None = None) -> dict[str, Any]:
    """The result as one JSON object (``regress --json``): passed, the rule, and per policy (``(spec)`` for the
    spec and seeds) the readable lines of its differences (failures) and notes (never failures)."""
    return {"format": "dsparksim-regress-report/1", "passed": not diffs, "updated": updated,
            "baseline": str(baseline_path), "dsparksim_version": __version__, "seeds": list(doc.get("seeds") or []),
            "rule": _tol_text(doc["tolerances"], doc.get("seeds"), exact), "exact": exact,
            "points": len(doc["frontier"]) if points is None else points,
            "failed_policies": sorted(diffs), "differences": {k: list(v) for k, v in sorted(diffs.items())},
            "notes": {k: list(v) for k, v in sorted(notes.items())}}


def regress(baseline_path: str | Path, spec_path: str | Path | None = None, backend: str = "local",
            workers: int | None = None, ray_address: str | None = None,
            update: bool = False, exact: bool = False,
            note: Callable[[str], None] | None = None, report: dict[str, Any] | None = None
            ) -> tuple[bool, str, dict[str, Any]]:
    """Recompute the baseline's sweep and compare. Returns (passed, readable report, current document).

    With ``update`` the baseline file is (re)written from the current results (``spec_path`` required if the
    baseline does not exist yet). ``note``: told the one line naming what of the spec regress does not read.
    ``report`` (when given) is filled with the machine-readable result (:func:`json_report`).
    """

    bp = Path(baseline_path)
    if update:   # writable before any cell runs (a --baseline under a file ended in a traceback after them all)
        check_out_file(bp, "--baseline")
    base = None if (update and not bp.exists()) else load_baseline(bp, old_ok=update)
    sp = Path(spec_path) if spec_path else (spec_of(base, bp) if base else None)
    if sp is None:
        raise ConfigError("regress", "--spec", "a new baseline needs the spec it is made from (--spec FILE)")
    spec = load_spec(sp)
    old_tol = base["tolerances"] if base and base.get("format") == FORMAT else None
    tolerances(spec, old_tol)   # a bad [regress] value is refused before any cell runs
    line = unread_note(spec, "regress")
    if line and note is not None:
        note(line)
    failures: list[tuple[str, Any, int, str]] | None = None if update else []   # --update: a failure is refused
    per_seed = compute(spec, backend, workers, ray_address, failures)
    cur = make_baseline(spec, per_seed, bp, old_tol)
    if update:
        write_json(bp, cur)
        if report is not None:
            report.update(json_report(bp, cur, {}, {}, updated=True))
        return True, f"baseline written: {bp} ({len(cur['frontier'])} frontier points x {len(cur['seeds'])} seeds)", cur
    notes: dict[str, list[str]] = {}
    base = _spec_tolerances(base, cur["tolerances"], notes)
    diffs = compare(base, cur, notes, exact)
    by_point: dict[tuple[str, Any, str], list[int]] = {}
    for pol, load, seed, err in failures or ():   # a cell that ran for the baseline and fails now: a regression
        by_point.setdefault((pol, _num(load), err), []).append(seed)
    for (pol, load, err), seeds in by_point.items():
        diffs.setdefault(pol, []).append(f"load {_fmt(load)}: cell failed at seed(s) "
                                         f"{', '.join(map(str, seeds))}: {err}")
    if report is not None:
        report.update(json_report(bp, base, diffs, notes, exact=exact, points=len(cur["frontier"])))
    if not diffs:
        n_pol = len({r["policy"] for r in cur["frontier"]})
        return True, (f"frontiers match the baseline {bp}: {len(cur['frontier'])} points, {n_pol} policies "
                      f"({_tol_text(base['tolerances'], base.get('seeds'), exact)}){_notes_text(notes)}"), cur
    return False, diff_text(diffs, base["tolerances"], base.get("seeds"), exact) + _notes_text(notes), cur
