"""Regression check: recompute a small fixed sweep and compare its frontiers with a saved baseline.

The baseline JSON (format ``dsparksim-regress/1``) stores the spec it was made from (path relative to the
baseline file, plus the spec's sha256), the stated tolerances, every frontier point (policy x load: the compared
metrics, the Pareto and saturation flags) and the matched comparison gains vs the baseline policy. Runs are
deterministic given their seed, so the default tolerances are tight (relative 1e-6: room for last-bit platform
differences in floating point, nothing more).
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

FORMAT = "dsparksim-regress/1"
METRICS = ("output_throughput_tok_s", "tps_user_median", "ttft_median_s", "tpot_median_s", "mean_verify_len", "tau",
           "num_requests_completed")
FLAGS = ("pareto", "saturated")
DEFAULT_TOLERANCES = {"rtol": 1e-6, "atol": 1e-9, "gain_atol": 1e-6}


def compute(spec: SweepSpec, backend: str = "local", workers: int | None = None,
            ray_address: str | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Run every cell (no cache: this is the check) and return (frontier table, comparison table)."""
    from dsparksim.frontier import comparison_table, frontier_table
    from dsparksim.sweep.backends import Task, make_backend
    from dsparksim.sweep.cells import expand

    extra = [k for k in spec.axes if k not in ("policy",) + LOAD_KEYS]
    if extra or "policy" not in spec.axes:
        raise ConfigError(spec.source, "axes", f"a regress spec varies only policy and one load axis (got axes "
                          f"{list(spec.axes)}); fix everything else in [base]")
    cells = expand(spec)
    results: dict[int, dict[str, Any]] = {}
    make_backend(backend, workers, ray_address).run([Task(c.index, c.config) for c in cells],
                                                    lambda r: results.__setitem__(r["index"], r))
    bad = [(c, results[c.index]) for c in cells if not results[c.index]["ok"]]
    if bad:
        c, r = bad[0]
        raise ConfigError(spec.source, "cells", f"{len(bad)} cell(s) failed, first {c.key}: {r['error']}")
    df = frontier_table([results[c.index]["summary"] for c in cells])
    comp = comparison_table(df, baseline=spec.regress.get("baseline_policy", "mtp1"))
    return df, comp


def _spec_sha(spec: SweepSpec) -> str:
    return hashlib.sha256(Path(spec.source).read_bytes()).hexdigest()


def make_baseline(spec: SweepSpec, df: pd.DataFrame, comp: pd.DataFrame, baseline_path: str | Path,
                  tolerances: Mapping[str, float] | None = None) -> dict[str, Any]:
    """The baseline document for ``df``/``comp`` (spec path stored relative to the baseline file)."""
    from dsparksim import __version__

    tol = {**DEFAULT_TOLERANCES, **(tolerances or {}), **{k: v for k, v in spec.regress.items() if k in
                                                         DEFAULT_TOLERANCES}}
    rel = os.path.relpath(Path(spec.source).resolve(), Path(baseline_path).resolve().parent)
    return {"format": FORMAT, "spec": Path(rel).as_posix(), "spec_sha256": _spec_sha(spec),
            "dsparksim_version": __version__, "tolerances": tol, "metrics": list(METRICS),
            "frontier": [_row(r) for _, r in df.iterrows()],
            "comparison": [{"policy": r["policy"], "metric": r["metric"], "gain_mean": _num(r["gain_mean"])}
                           for _, r in comp.iterrows()] if len(comp) else []}


def _num(v: Any) -> Any:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    return v.item() if hasattr(v, "item") else v


def _row(r: pd.Series) -> dict[str, Any]:
    return {"policy": r["policy"], "load": _num(r["load"]), **{m: _num(r.get(m)) for m in METRICS},
            **{f: bool(r[f]) for f in FLAGS}}


def load_baseline(path: str | Path) -> dict[str, Any]:
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
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        got = d.get("format") if isinstance(d, dict) else d
        raise InputError(str(p), "format", f"expected {FORMAT!r}, got {got!r}")
    for k in ("spec", "tolerances", "frontier", "comparison"):
        if k not in d:
            raise InputError(str(p), k, "required field missing")
    return d


def spec_of(baseline: Mapping[str, Any], baseline_path: str | Path) -> Path:
    """The spec file a baseline was made from (its path is relative to the baseline file)."""
    return (Path(baseline_path).resolve().parent / baseline["spec"]).resolve()


def _close(a: Any, b: Any, rtol: float, atol: float) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return abs(float(a) - float(b)) <= atol + rtol * abs(float(b))


def compare(baseline: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, list[str]]:
    """Per-policy list of differences of ``current`` from ``baseline`` (empty dict = within tolerance)."""
    tol = baseline["tolerances"]
    rtol, atol, gatol = float(tol["rtol"]), float(tol["atol"]), float(tol["gain_atol"])
    diffs: dict[str, list[str]] = {}

    def add(pol: str, msg: str) -> None:
        diffs.setdefault(pol, []).append(msg)

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
            if not _close(g.get(m), w.get(m), rtol, atol):
                rel = ("" if w.get(m) in (None, 0) or g.get(m) is None
                       else f" ({100 * (float(g[m]) - float(w[m])) / abs(float(w[m])):+.4g}%)")
                add(pol, f"load {load:g}: {m} {_fmt(w.get(m))} -> {_fmt(g.get(m))}{rel}")
        for f in FLAGS:
            if bool(w.get(f)) != bool(g.get(f)):
                add(pol, f"load {load:g}: {f} {w.get(f)} -> {g.get(f)}")
    cw = {(r["policy"], r["metric"]): r["gain_mean"] for r in baseline["comparison"]}
    cg = {(r["policy"], r["metric"]): r["gain_mean"] for r in current["comparison"]}
    for k in sorted(set(cw) | set(cg)):
        a, b = cw.get(k), cg.get(k)
        if (a is None) != (b is None) or (a is not None and abs(a - b) > gatol):
            add(k[0], f"{k[1]} (mean gain) {_fmt(a)} -> {_fmt(b)}")
    return diffs


def _fmt(v: Any) -> str:
    return "none" if v is None else f"{v:.10g}" if isinstance(v, float) else str(v)


def diff_text(diffs: Mapping[str, Sequence[str]], tol: Mapping[str, float]) -> str:
    lines = [f"frontier regression: {sum(len(v) for v in diffs.values())} difference(s) in {len(diffs)} "
             f"policy(ies) beyond tolerance (rtol {tol['rtol']:g}, atol {tol['atol']:g}, gain atol "
             f"{tol['gain_atol']:g}):"]
    for pol in sorted(diffs):
        lines.append(f"  {pol}:")
        lines.extend(f"    {d}" for d in diffs[pol])
    return "\n".join(lines)


def regress(baseline_path: str | Path, spec_path: str | Path | None = None, backend: str = "local",
            workers: int | None = None, ray_address: str | None = None,
            update: bool = False) -> tuple[bool, str, dict[str, Any]]:
    """Recompute the baseline's sweep and compare. Returns (passed, readable report, current document).

    With ``update`` the baseline file is (re)written from the current results (``spec_path`` required if the
    baseline does not exist yet).
    """
    from dsparksim.sweep.cache import write_json

    bp = Path(baseline_path)
    base = None if (update and not bp.exists()) else load_baseline(bp)
    sp = Path(spec_path) if spec_path else (spec_of(base, bp) if base else None)
    if sp is None:
        raise ConfigError("regress", "--spec", "a new baseline needs the spec it is made from (--spec FILE)")
    spec = load_spec(sp)
    df, comp = compute(spec, backend, workers, ray_address)
    cur = make_baseline(spec, df, comp, bp, base["tolerances"] if base else None)
    if update:
        write_json(bp, cur)
        return True, f"baseline written: {bp} ({len(cur['frontier'])} frontier points)", cur
    diffs = compare(base, cur)
    if not diffs:
        n_pol = len({r["policy"] for r in cur["frontier"]})
        return True, (f"frontiers match the baseline {bp}: {len(cur['frontier'])} points, {n_pol} policies "
                      f"(rtol {base['tolerances']['rtol']:g})"), cur
    return False, diff_text(diffs, base["tolerances"]), cur
