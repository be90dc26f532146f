"""Plan outputs: per traffic scale and policy family the cheapest feasible deployment, the Pareto set of cost
against per-user speed, the mtp1-vs-confidence saving line, a plot, and the resolved spec beside them.

Files (written as one set; plan.manifest.json, last, lists them)::

    plan.json      resolved spec, assumptions, per scale: cheapest per family, binding SLO where none is
                   feasible, saving line, Pareto set, and every search with its probes
    spec.json      the resolved spec alone (deployments with GPUs and prices)
    cheapest.csv   one row per (scale, family)
    pareto.csv     / pareto.json: the Pareto set per (scale, family) and over all families ("all")
    probes.csv     every probe run: deployment, scale, replicas, feasibility, cost, metrics
    plan.png       cost ($/h) against per-user speed per scale; Pareto sets as steps, cheapest marked
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd

from dsparksim.plan.search import SPEED, PlanRun, Probe, Search, binding_slo
from dsparksim.config import jsonable
from dsparksim.results.outputs import write_result_set

MANIFEST = "plan.manifest.json"
RESULT_FILES = ("plan.json", "spec.json", "cheapest.csv", "pareto.csv", "pareto.json", "probes.csv", "plan.png")
CONFIDENCE_FAMILIES = ("confidence", "confidence-async")  # confidence-global is not lossless: never a deployment
ASSUMPTIONS = [
    "feasibility is monotone in the replica count at a fixed traffic (bisection); violations seen among the "
    "probes are listed per search under monotonicity_violations",
    "GPUs per replica: the profile's metadata gpus, else tensor_parallel x pipeline_parallel x data parallel "
    "(metadata, else the run's dp_ranks), at least expert_parallel; disaggregated deployments add "
    "prefill_replicas x the prefill GPUs per replica (the decode replica's unless the candidate says)",
    "$/hour = GPUs x price of the profile's metadata.device; $ per million output tokens = $/hour / (3600 x output "
    "tokens/s) x 1e6 (mean output throughput over seeds)",
    "with several seeds a probe meets a term only if the pessimistic end of the two-sided t-interval of the "
    "mean over seeds does; headroom is measured at that end ((value - threshold) / threshold for >=, "
    "(threshold - value) / threshold for <=)",
    "cheapest: the smallest $/hour, ties to the deployment listed first; pruning skips only deployments and "
    "replica counts that cannot beat that, so the answer equals a brute-force scan of every replica count",
    "the Pareto set covers the feasible probes the search ran (with pruning on, costlier replica counts are not "
    "run); set plan.prune = false for every deployment's own smallest feasible count",
]


def probe_row(s: Search, p: Probe) -> dict[str, Any]:
    d = s.d
    row = {"scale": s.scale, "family": d.family, "deployment": d.label, "candidate": d.candidate,
           "policy": d.policy, "K": d.K, "replicas": p.replicas, "gpus": p.gpus, "device": d.device,
           "cost_per_hour": p.cost_per_hour, "cost_per_mtok": p.cost_per_mtok, "feasible": p.feasible,
           "output_throughput_tok_s": p.throughput, SPEED: p.speed, "saturated": p.saturated}
    for name, m in p.metrics.items():
        row[name] = m.get("mean")
        if "low" in m and m["low"] != m["high"]:
            row[f"{name}_low"], row[f"{name}_high"] = m["low"], m["high"]
        row[f"{name}_headroom"] = m.get("headroom")
    row["violations"] = "; ".join(v["term"] for v in p.violations)
    return row


def _best(searches: list[Search]) -> Search | None:
    ok = [s for s in searches if s.status == "feasible"]
    return min(ok, key=lambda s: (s.answer.cost_per_hour, s.d.index)) if ok else None


def pareto(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows not dominated in (lower cost_per_hour, higher per-user speed), cheapest first."""
    pts = sorted((r for r in rows if r[SPEED] is not None), key=lambda r: (r["cost_per_hour"], -r[SPEED]))
    out, top = [], -math.inf
    for r in pts:
        if r[SPEED] > top:
            out.append(r)
            top = r[SPEED]
    return out


def summarize_plan(run: PlanRun) -> dict[str, Any]:
    """The result document (plan.json) of a finished search."""
    spec = run.spec
    families = list(dict.fromkeys(d.family for d in spec.deployments))
    scales = []
    for scale in spec.scales:
        ss = [s for s in run.searches if s.scale == scale]
        cheapest, par = {}, {}
        feasible_rows = [probe_row(s, p) for s in ss for p in s.probes.values() if p.feasible]
        for fam in families:
            fs = [s for s in ss if s.d.family == fam]
            b = _best(fs)
            if b is None:
                cheapest[fam] = {"feasible": False, "binding_slo": binding_slo(fs),
                                 "why": _none_why(fs)}
            else:
                p = b.answer
                cheapest[fam] = {"feasible": True, "deployment": b.d.label, "candidate": b.d.candidate,
                                 "policy": b.d.policy, "K": b.d.K, "options": dict(b.d.options),
                                 "replicas": p.replicas, "gpus": p.gpus, "device": b.d.device,
                                 "cost_per_hour": p.cost_per_hour, "cost_per_mtok": p.cost_per_mtok,
                                 "output_throughput_tok_s": p.throughput, SPEED: p.speed,
                                 "headroom": {k: m.get("headroom") for k, m in p.metrics.items()},
                                 "metrics": p.metrics}
            par[fam] = pareto([r for r in feasible_rows if r["family"] == fam])
        par["all"] = pareto(feasible_rows)
        any_ok = [s for s in ss if s.status == "feasible"]
        scales.append({
            "scale": scale, "load": {spec.load_key: spec.load(scale)}, "cheapest": cheapest,
            "feasible": bool(any_ok),
            "binding_slo": None if any_ok else binding_slo(ss),
            "saving": saving(cheapest),
            "pareto": par,
            "searches": [{"deployment": s.d.label, "family": s.d.family, "status": s.status, "error": s.error,
                          "replicas": None if s.answer is None else s.answer.replicas,
                          "probes": [s.probes[r].to_dict() for r in sorted(s.probes)],
                          "monotonicity_violations": s.monotonicity_violations()} for s in ss]})
    return {"plan": spec.name, "spec": spec.to_dict(), "assumptions": ASSUMPTIONS,
            "counts": {"deployments": len(spec.deployments), "scales": len(spec.scales), "probes": run.n_probes,
                       "cells": run.n_cells, "cells_cached": run.n_cached, "cells_ran": run.n_ran,
                       "rounds": run.rounds, "failed": len(run.failures),
                       "pruned": sum(s.status == "pruned" for s in run.searches)},
            "failures": run.failures, "scales": scales}


def _none_why(fs: list[Search]) -> str:
    st = {s.status for s in fs}
    if st <= {"infeasible"}:
        return "no deployment meets the SLO even at its largest replica count"
    return "statuses: " + ", ".join(sorted(st))


def saving(cheapest: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The best mtp1 deployment's cost against the best confidence-scheduled one's, at the same SLO."""
    m = cheapest.get("mtp1")
    confs = [(f, c) for f, c in cheapest.items() if f in CONFIDENCE_FAMILIES and c.get("feasible")]
    if m is None or not any(f in cheapest for f in CONFIDENCE_FAMILIES):
        return {"available": False, "why": "the plan needs an mtp1 and a confidence-scheduled candidate "
                                           f"({', '.join(CONFIDENCE_FAMILIES)})"}
    if not m.get("feasible") or not confs:
        return {"available": False, "why": ("no feasible mtp1 deployment" if not m.get("feasible") else "")
                + (" and " if not m.get("feasible") and not confs else "")
                + ("no feasible confidence-scheduled deployment" if not confs else "")}
    fam, c = min(confs, key=lambda fc: fc[1]["cost_per_hour"])
    d = m["cost_per_hour"] - c["cost_per_hour"]
    return {"available": True, "mtp1": m["deployment"], "mtp1_cost_per_hour": m["cost_per_hour"],
            "confidence": c["deployment"], "confidence_family": fam, "confidence_cost_per_hour": c["cost_per_hour"],
            "saving_per_hour": d, "saving_frac": d / m["cost_per_hour"],
            "mtp1_cost_per_mtok": m["cost_per_mtok"], "confidence_cost_per_mtok": c["cost_per_mtok"]}


def saving_line(scale: dict[str, Any], unit: str) -> str:
    sv = scale["saving"]
    if not sv["available"]:
        return f"saving at {unit}: n/a ({sv['why']})"
    return (f"saving at {unit}: mtp1 ${sv['mtp1_cost_per_hour']:.2f}/h ({sv['mtp1']}) vs "
            f"{sv['confidence_family']} ${sv['confidence_cost_per_hour']:.2f}/h ({sv['confidence']}): "
            f"{100 * sv['saving_frac']:+.1f}% (${sv['saving_per_hour']:.2f}/h) at the same SLO")


def text_report(doc: dict[str, Any]) -> str:
    """The lines `dsparksim plan` prints."""
    spec = doc["spec"]
    t = spec["traffic"]
    lines = [f"SLO: {' and '.join(spec['slo'])}{' and not saturated' if spec['require_unsaturated'] else ''}; "
             f"seeds {spec['seeds']}" + (f" (feasible at the pessimistic end of the {spec['confidence']:.0%} "
                                         "interval)" if len(spec["seeds"]) > 1 else "")]
    for sc in doc["scales"]:
        unit = f"{t['load']} {t['load_at_scale_1'] * sc['scale']:g}" + (" req/s" if t["load"] == "rate" else "")
        lines.append(f"traffic x{sc['scale']:g} ({unit}):")
        for fam, c in sc["cheapest"].items():
            if c["feasible"]:
                hr = ", ".join(f"{k} {v:+.0%}" for k, v in c["headroom"].items() if v is not None)
                mt = f"${c['cost_per_mtok']:.3f}/Mtok" if c["cost_per_mtok"] is not None else "$/Mtok n/a"
                lines.append(f"  {fam:18s} {c['deployment']}: {_n(c['replicas'], 'replica')}, {_n(c['gpus'], 'GPU')}, "
                             f"${c['cost_per_hour']:.2f}/h, {mt}; headroom {hr}")
            else:
                b = c["binding_slo"]
                lines.append(f"  {fam:18s} no feasible deployment"
                             + (f"; binding SLO {b['term']} (missed by {b['violated_by']} deployment(s) at their "
                                f"largest replica count" + (f", worst by {b['worst_miss']:.0%})"
                                                            if b["worst_miss"] is not None else ")")
                                if b else f" ({c['why']})"))
        if not sc["feasible"]:
            b = sc["binding_slo"]
            lines.append("  NO FEASIBLE DEPLOYMENT at this traffic" + (f": binding SLO {b['term']}" if b else ""))
        lines.append("  " + saving_line(sc, unit))
        for se in sc["searches"]:
            for v in se["monotonicity_violations"]:
                lines.append(f"  warning: {se['deployment']}: {v} (feasibility not monotone in replicas: the "
                             "bisection's answer may not be the smallest feasible count)")
    c = doc["counts"]
    lines.append(f"{c['probes']} probes ({c['cells']} cells: {c['cells_cached']} cached, {c['cells_ran']} run) in "
                 f"{c['rounds']} rounds; {c['pruned']} search(es) pruned; {c['failed']} failed")
    return "\n".join(lines)


def write_plan(run: PlanRun, out: str | Path) -> tuple[dict[str, Any], dict[str, Path]]:
    """Write the plan's result set into ``out`` (see the module docstring); returns (plan.json document, paths)."""

    doc = summarize_plan(run)
    probes = pd.DataFrame([probe_row(s, s.probes[r]) for s in run.searches for r in sorted(s.probes)])
    cheap = pd.DataFrame([{"scale": sc["scale"], "family": f, **{k: v for k, v in c.items()
                                                                  if k not in ("metrics", "options", "binding_slo",
                                                                               "headroom")},
                           **{f"headroom_{k}": v for k, v in c.get("headroom", {}).items()},
                           "binding_slo": (c.get("binding_slo") or {}).get("term")}
                          for sc in doc["scales"] for f, c in sc["cheapest"].items()])
    par = pd.DataFrame([{"scale": sc["scale"], "set": f, **r} for sc in doc["scales"]
                        for f, rows in sc["pareto"].items() for r in rows])
    files = {
        "plan.json": lambda p: _dump(p, doc),
        "spec.json": lambda p: _dump(p, doc["spec"]),
        "cheapest.csv": lambda p: cheap.to_csv(p, index=False),
        "pareto.csv": lambda p: par.to_csv(p, index=False),
        "pareto.json": lambda p: _dump(p, [{"scale": sc["scale"], "pareto": sc["pareto"]} for sc in doc["scales"]]),
        "probes.csv": lambda p: probes.to_csv(p, index=False),
        "plan.png": lambda p: plot(doc, p),
    }
    # "complete" only when no probe failed (as sweep and capacity say it); the files themselves are always whole
    return doc, write_result_set(out, files, MANIFEST, status={"complete": not run.failures,
                                                               "n_failed": len(run.failures)})


def _dump(p: Path, obj: Any) -> None:

    p.write_text(json.dumps(jsonable(obj), indent=1, allow_nan=False, default=str) + "\n")


def plot(doc: dict[str, Any], path: Path) -> None:
    """Write :func:`plan_figure` to ``path``."""
    plan_figure(doc).savefig(path, format="png", dpi=110)


def plan_figure(doc: dict[str, Any]):
    """Cost per hour against per-user speed, one panel per traffic scale: each family's Pareto set as a step line
    in the family's colour (as in every plot, dsparksim.results.plots), every point labelled with its replica
    count, its cheapest deployment circled, the per-user speed SLO as a dotted line; legend beside the panels."""
    from matplotlib.figure import Figure  # lazy: matplotlib

    from dsparksim.results.plots import outside_legend, policy_color  # lazy: pulls in matplotlib

    sc = doc["scales"]
    speed_slo = _speed_slo(doc)
    fig = Figure(figsize=(5.5 * len(sc) + 2.5, 4.4))
    axes = fig.subplots(1, len(sc), squeeze=False)[0]
    fams = [f for f in dict.fromkeys(d["family"] for d in doc["spec"]["deployments"])]
    for ax, s in zip(axes, sc):
        for fam in fams + [f for f in s["pareto"] if f not in fams and f != "all"]:
            rows = s["pareto"].get(fam)
            if not rows:
                continue
            col = policy_color(fam)
            xs, ys = [r["cost_per_hour"] for r in rows], [r[SPEED] for r in rows]
            ax.step(xs, ys, where="post", color=col, label=fam, gid=f"pareto:{fam}")
            ax.scatter(xs, ys, color=col, s=18)
            for r in rows:
                ax.annotate(f"x{r['replicas']}", (r["cost_per_hour"], r[SPEED]), xytext=(3, 3),
                            textcoords="offset points", fontsize=6, color=col)
            c = s["cheapest"].get(fam)
            if c and c.get("feasible"):
                ax.scatter([c["cost_per_hour"]], [c[SPEED]], s=110, facecolors="none", edgecolors=col, lw=1.5)
        for spelled, value in speed_slo:
            ax.axhline(value, color="tab:red", lw=0.9, ls=":", gid=f"slo:{spelled}")
            ax.annotate(f"SLO {spelled} >= {value:g}", (1.0, value), xycoords=("axes fraction", "data"),
                        xytext=(-4, 2), textcoords="offset points", ha="right", va="bottom", fontsize=7,
                        color="tab:red")
        ax.set_title(f"traffic x{s['scale']:g}" + ("" if s["feasible"] else " (nothing feasible)"))
        ax.set_xlabel("cost ($ / hour)")
        ax.set_ylabel("per-user speed, median (tok/s)")
        ax.grid(alpha=0.3)
    handles, _ = axes[-1].get_legend_handles_labels()
    if handles or speed_slo:
        from matplotlib.lines import Line2D  # lazy: matplotlib
        handles += [Line2D([], [], ls="", label="xN: replicas"),
                    Line2D([], [], ls="", marker="o", mfc="none", mec="0.2", label="circled: cheapest meeting the SLO")]
        if speed_slo:
            handles.append(Line2D([], [], color="tab:red", ls=":", label="dotted: per-user speed SLO"))
        outside_legend(axes[-1], handles, fontsize=8)
    other = [t for t in doc["spec"].get("slo", []) if t.split()[0] not in {x for x, _ in speed_slo}]
    fig.suptitle(f"{doc['plan']}: Pareto sets of cost vs per-user speed (circled: cheapest meeting the SLO)"
                 + (f"\nother SLO terms (not on these axes): {', '.join(other)}" if other else ""), fontsize=9)
    fig.tight_layout()
    return fig


def _speed_slo(doc: dict[str, Any]) -> list[tuple[str, float]]:
    """(spelled metric, value) of the SLO's lower bounds on the per-user speed the panels plot."""
    out = []
    metrics = doc["spec"].get("slo_metrics", {})
    for t in doc["spec"].get("slo", []):
        parts = t.split()
        if len(parts) == 3 and metrics.get(parts[0]) == SPEED and parts[1] in (">=", ">"):
            out.append((parts[0], float(parts[2])))
    return out


def _n(k: int, what: str) -> str:
    return f"{k} {what}{'' if k == 1 else 's'}"
