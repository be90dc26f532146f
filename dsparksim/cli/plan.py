"""CLI: `dsparksim plan SPEC.toml --out DIR` (registered by dsparksim.cli.sweep)."""
from __future__ import annotations

import argparse
import sys

from dsparksim.cli.options import bar_off, check_backend_options
from dsparksim.config import DEFAULT_DURATION_S
from dsparksim.results.notes import slo_tail_notes, slo_unit_notes, spec_chunk_notes, trace_cover_note
from dsparksim.results.outputs import claim_result_set


def trace_note(spec) -> str | None:
    """trace_cover_note for a plan whose [traffic] trace its duration_s ends early at some traffic scale."""
    from dsparksim.traffic.readers import read_trace  # lazy: pulls in numpy
    from dsparksim.traffic.sources import resolve  # lazy: pulls in numpy

    t = {**spec.traffic, **spec.base}
    if not t.get("trace") or t.get("num_requests") is not None or spec.load_key != "time_scale":
        return None
    tab = read_trace(resolve(t["trace"], "trace")[0], t.get("trace_format"))
    return trace_cover_note(float(tab.arrival_s[-1]), t.get("duration_s", DEFAULT_DURATION_S),
                            [spec.load(s) for s in spec.scales], "[traffic] duration_s")


def cmd_plan(args: argparse.Namespace) -> int:
    from dsparksim.plan import load_plan, run_plan, text_report, write_plan  # lazy: pulls in numpy, pandas, pyarrow, scipy, simpy
    from dsparksim.plan.report import MANIFEST, RESULT_FILES  # lazy: pulls in numpy, pandas, pyarrow, scipy, simpy
    from dsparksim.plan.search import fit_range_lines  # lazy: pulls in numpy, pandas, pyarrow, scipy, simpy

    check_backend_options(args)
    spec = load_plan(args.spec)  # validated (every probe's configuration, prices, SLO metrics): nothing runs before
    # holds the cell cache: written into, never replaced; a same-named file of the user's is never replaced
    out = claim_result_set(args.out, RESULT_FILES, MANIFEST, "--out")
    out.mkdir(parents=True, exist_ok=True)
    for line in spec.profile_lines():   # a fitted profile's server and request latency, once each
        print(line, file=sys.stderr)
    opts = [{**spec.traffic, **spec.base, **d.options} for d in spec.deployments]
    for note in [*slo_unit_notes(spec.slo, "plan.slo", (o.get("random_output_len") for o in opts)),
                 *slo_tail_notes(spec.slo, "plan.slo")]:
        print(f"dsparksim: caution: {note}", file=sys.stderr)
    for note in [spec.price_note(), trace_note(spec), *spec_chunk_notes(opts)]:
        if note:
            print(f"dsparksim: note: {note}", file=sys.stderr)
    if spec.collapsed and not args.quiet:
        print(f"dsparksim: note: {len(spec.collapsed)} deployment(s) are the same run as one searched anyway and "
              "are searched once (plan.json: collapsed): " + "; ".join(f"{c['label']} = {c['why']}"
                                                                        for c in spec.collapsed), file=sys.stderr)
    try:
        run = run_plan(spec, out, backend=args.backend, workers=args.workers, ray_address=args.ray_address,
                       progress=not bar_off(args))
    except KeyboardInterrupt:
        print(f"dsparksim: interrupted: finished probes are saved in {out}/cells; run the same command again to "
              "resume", file=sys.stderr)
        return 130
    doc, paths = write_plan(run, out)
    for line in fit_range_lines(run):   # probes beyond what a fitted profile's runs covered: never silently
        print(line, file=sys.stderr)
    if not args.quiet:
        print(text_report(doc))
        for name, p in paths.items():
            print(f"  {name:13s} {p}")
    if run.failures:
        for f in run.failures[:20]:
            print(f"dsparksim: probe failed: {f['deployment']} x{f['scale']:g} at {f['replicas']} replicas: "
                  f"{f['error']}", file=sys.stderr)
        if len(run.failures) > 20:
            print(f"dsparksim: ... and {len(run.failures) - 20} more failed probe(s) (plan.json: failures)",
                  file=sys.stderr)
        return 1
    return 0


def register(subparsers, backend_args) -> None:
    p = subparsers.add_parser(
        "plan", help="cheapest deployment meeting an SLO at a given traffic, per policy family",
        description="Search candidate deployments (profile, run options, policy and K) for the fewest replicas "
                    "meeting every SLO term at each traffic scale, by bisection on replicas (feasibility assumed "
                    "monotone in replicas) with dominance pruning; probes are cached sweep cells in OUT/cells (a "
                    "rerun resumes). Writes plan.json (with the resolved spec and the search trace), spec.json, "
                    "cheapest.csv, pareto.csv/.json, probes.csv, plan.png and, last, plan.manifest.json. A spec "
                    "error exits 2 before any probe runs. Spec tables: [plan] slo = [\"METRIC OP NUMBER\", ...] "
                    "(OP >=, <=, > or <; METRIC any summary.json metric, *_p50 = *_median; e.g. \"tps_user_p50 >= 60\", "
                    "\"ttft_p99_s <= 2\"), seeds, require_unsaturated, prune; [traffic] rate or trace, scales; "
                    "[base] run options for every candidate; [prices] $/GPU-hour by metadata.device or short GPU "
                    "name; [[candidates]] profile, replicas = [MIN, MAX], policies, K, any run option (a list = one "
                    "deployment per value). The format is documented in dsparksim/plan/spec.py; see "
                    "sweeps/plan-example.toml.")
    p.add_argument("spec", help="plan spec (TOML), e.g. sweeps/plan-example.toml")
    p.add_argument("--out", "--result-dir", dest="out", required=True, help="output folder (also the probe cache)")
    backend_args(p)
    p.set_defaults(func=cmd_plan)
