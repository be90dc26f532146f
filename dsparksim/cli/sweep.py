"""CLI: `dsparksim sweep | capacity | regress | plan` (sweeps from a TOML spec; see dsparksim/sweep/)."""
from __future__ import annotations

import argparse
import itertools
import json
import sys


from dsparksim.cli.options import add_backend_options, bar_off, check_backend_options
from dsparksim.cli.main import flag_given
from dsparksim.cli.plan import register as register_plan
from dsparksim.config import pos_float
from dsparksim.errors import ConfigError
from dsparksim.results.notes import (request_latency_note, short_window_list, short_window_note, slo_tail_notes,
                                     slo_unit_notes, spec_chunk_notes)
from dsparksim.results.outputs import WriteInterrupted, claim_result_set, write_result_set


def _backend_args(p: argparse.ArgumentParser, default: str = "local") -> None:
    """The execution group of the spec-driven commands: the shared backend options and ``--quiet``."""
    g = p.add_argument_group("execution")
    add_backend_options(g, default=default)
    g.add_argument("--quiet", action="store_true", help="no progress bar or report")


def profile_notes(spec) -> None:
    """Print what the spec's profiles call for, each line once: the server settings a fitted profile filled in
    (and a caution where the spec sets another value), and a fitted request latency the cells' engine-side TTFT
    and E2E leave out (as `run` and `frontier` print them)."""
    from dsparksim.cost.profile import load_profile  # lazy: pulls in numpy
    from dsparksim.sweep.cells import DEFAULT_PROFILE, fit_lines  # lazy: pulls in numpy, pandas, pyarrow, scipy, simpy

    lines = fit_lines(spec.base, spec.axes)
    for prof in dict.fromkeys(spec.axes.get("profile") or [spec.base.get("profile", DEFAULT_PROFILE)]):
        note = request_latency_note(str(prof), load_profile(prof).request_latency_s)
        if note:
            lines.append(f"dsparksim: note: {note}")
    for line in lines:
        print(line, file=sys.stderr)


def _say_unread(spec, command: str) -> None:
    """The one line naming what of a shared spec file this command does not read (after the checks: a refused
    command prints its one error line only)."""
    from dsparksim.sweep.spec import unread_note  # lazy: pulls in numpy, pandas, pyarrow, scipy, simpy
    line = unread_note(spec, command)
    if line:
        print(line, file=sys.stderr)


def cmd_sweep(args: argparse.Namespace) -> int:
    from dsparksim.sweep import failure_text, load_spec, run_sweep  # lazy: pulls in numpy, pandas, pyarrow, scipy, simpy
    from dsparksim.sweep.runner import MANIFEST, RESULT_FILES  # lazy: pulls in numpy, pandas, pyarrow, scipy, simpy

    check_backend_options(args)
    spec = load_spec(args.spec)  # validated before any cell runs
    # holds the cache: written into, never replaced whole; a same-named file of the user's is never replaced
    claim_result_set(args.out, RESULT_FILES, MANIFEST, "--out")
    _say_unread(spec, "sweep")
    profile_notes(spec)
    keys = [k for k in ("profile", "prefill_chunk_tokens", "max_batched_tokens") if k in spec.axes]
    for note in spec_chunk_notes({**spec.base, **dict(zip(keys, vals))}
                                 for vals in itertools.product(*(spec.axes[k] for k in keys))):
        print(f"dsparksim: note: {note}", file=sys.stderr)
    try:
        res = run_sweep(spec, args.out, backend=args.backend, workers=args.workers, ray_address=args.ray_address,
                        progress=not bar_off(args))
    except WriteInterrupted:   # the cells are done; main() says which result set is left incomplete
        raise
    except KeyboardInterrupt:
        print(f"dsparksim: interrupted: finished cells are saved in {args.out}/cells; run the same command again "
              "to resume", file=sys.stderr)
        return 130
    if not args.quiet:
        rep = (f"{res.n_cells - res.n_repeats} runs: {res.n_repeats} repeat an earlier cell's run and share its "
               f"result, results column same_as, because {res.repeats_why}; " if res.n_repeats else "")
        print(f"{spec.name}: {res.n_cells} cells ({rep}{res.n_cached} cached, {res.n_ran} run, "
              f"{len(res.failures)} failed) in {res.wall_s:.1f} s on backend {args.backend}")
        from dsparksim.sweep.table import sweep_text  # lazy: pulls in numpy, pandas, pyarrow, scipy, simpy
        text = sweep_text(res.table)
        if text:
            print(text)
        for k, p in res.paths.items():
            print(f"  {k:9s} {p}")
    from dsparksim.sweep.table import incomplete_notes  # lazy: pulls in numpy, pandas, pyarrow, scipy, simpy
    for line in incomplete_notes(res.table):    # said even with --quiet, as `run` and `frontier` say it
        print(line, file=sys.stderr)
    if res.short_windows:
        print(f"dsparksim: warning: {len(res.short_windows)} cell(s): "
              f"{short_window_note(short_window_list(res.short_windows, 'results.csv'))}", file=sys.stderr)
    if "parquet" not in res.paths:
        print("dsparksim: note: results.parquet not written: pyarrow is not installed (pip install pyarrow); "
              "results.csv holds the same table", file=sys.stderr)
    if res.failures:
        print(failure_text(res.failures), file=sys.stderr)
        return 1
    return 0


def cmd_capacity(args: argparse.Namespace) -> int:
    from dsparksim.sweep import load_spec  # lazy: pulls in numpy, pandas, pyarrow, scipy, simpy
    from dsparksim.sweep.runner import dump_json  # lazy: pulls in numpy, pandas, pyarrow, scipy, simpy
    from dsparksim.sweep.capacity import capacity_errors, capacity_search, capacity_settings, capacity_table  # lazy: pulls in numpy, pandas, pyarrow, scipy, simpy
    from dsparksim.sweep.capacity import capacity_short_windows  # lazy: pulls in numpy, pandas, pyarrow, scipy, simpy

    check_backend_options(args)
    spec = load_spec(args.spec)
    st = capacity_settings(spec, load=args.load, min=args.min, max=args.max, tolerance=args.tolerance,
                           slo=args.slo, require_unsaturated=False if args.allow_saturated else None,
                           seeds=args.seeds)
    out = claim_result_set(args.out, CAPACITY_FILES, "capacity.manifest.json", "--out")  # before any probe
    if flag_given(args, "--sla"):   # after the checks: a refused command prints its one error line only
        print("dsparksim: warning: --sla is deprecated; use --slo", file=sys.stderr)
    _say_unread(spec, "capacity")
    lens = (spec.base.get("random_output_len"), *spec.axes.get("random_output_len", ()))
    where = "--slo" if args.slo else "capacity.slo"
    for note in [*slo_unit_notes(st.slo, where, lens), *slo_tail_notes(st.slo, where)]:
        print(f"dsparksim: caution: {note}", file=sys.stderr)
    out.mkdir(parents=True, exist_ok=True)
    profile_notes(spec)
    try:
        res = capacity_search(spec, st, out, backend=args.backend, workers=args.workers,
                              ray_address=args.ray_address, progress=not bar_off(args))
    except KeyboardInterrupt:
        print(f"dsparksim: interrupted: finished probes are saved in {out}/cells; run the same command again to "
              "resume", file=sys.stderr)
        return 130
    table = capacity_table(res)
    errors = capacity_errors(res)
    # replaced as a set; capacity.manifest.json, written last, lists both (dsparksim.results.outputs); a search a
    # failed probe stopped leaves the set incomplete
    write_result_set(out, {"capacity.json": lambda p: dump_json(p, res),
                           "capacity.csv": lambda p: table.to_csv(p, index=False)}, "capacity.manifest.json",
                     status={"complete": not errors, "n_failed_probes": len(errors)})
    if not args.quiet:
        print(f"SLO: {' and '.join(st.to_dict()['slo'])}"
              f"{' and not saturated' if st.require_unsaturated else ''}; {st.load} in [{st.lo:g}, {st.hi:g}], "
              f"tolerance {st.tolerance:g}")
        print(table.to_string(index=False))
        if st.seeds > 1:
            print(f"capacity: mean over {st.seeds} seeds of each seed's own search; capacity_lo..capacity_hi: its "
                  f"95% t-interval (none unless every seed's search ended inside the range)")
        else:
            print("one seed: the capacity is known to within its bracket only; --seeds N states its spread over "
                  "seeds (a 95% interval)")
        print(f"  capacity.json {out / 'capacity.json'} (with the search trace)")
        print(f"  capacity.csv  {out / 'capacity.csv'}")
    short = capacity_short_windows(res)
    if short:
        where = short_window_list(short, "capacity.json: each trace entry with short_window")
        print(f"dsparksim: warning: {len(short)} capacity probe(s): {short_window_note(where)}; a capacity decided "
              "by such a probe rests on it", file=sys.stderr)
    if errors:
        print(f"dsparksim: {len(errors)} capacity probe(s) failed; their searches stopped (status error, no "
              "capacity; the trace in capacity.json):\n" + "\n".join(errors), file=sys.stderr)
        return 1
    return 0


CAPACITY_FILES = ("capacity.json", "capacity.csv")


def cmd_regress(args: argparse.Namespace) -> int:
    from dsparksim.sweep.regress import regress  # lazy: pulls in numpy, pandas, pyarrow, scipy, simpy

    check_backend_options(args)
    if args.update and args.exact:
        raise ConfigError("cli", "--exact", "would be ignored: --update writes the baseline without comparing; drop "
                          "one of the two")
    report: dict = {}
    ok, text, _ = regress(args.baseline, spec_path=args.spec, backend=args.backend, workers=args.workers,
                          ray_address=args.ray_address, update=args.update, exact=args.exact,
                          note=lambda line: print(line, file=sys.stderr), report=report)
    if args.json:                   # one JSON object on stdout, pass or fail; the exit status is the same
        print(json.dumps(report, indent=1))
    elif not (ok and args.quiet):   # --quiet: a pass is its exit status alone; a regression is always printed
        print(text, file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


def register(subparsers) -> None:
    """Add `sweep`, `capacity` and `regress` to the dsparksim CLI."""
    s = subparsers.add_parser("sweep", help="run every cell of a TOML sweep spec (cached, resumable)",
                              description="Run the cross product of a sweep spec's axes. Finished cells are cached "
                                          "by content hash in OUT/cells and skipped on a rerun (an interrupted sweep "
                                          "resumes); writes OUT/results.csv (+ .parquet), sweep.json, failures.json and, last, "
                                          "sweep.manifest.json (the set is complete when it is present).")
    s.add_argument("spec", help="sweep spec (TOML), e.g. sweeps/example.toml")
    s.add_argument("--out", "--result-dir", dest="out", required=True, help="output folder (also the cache)")
    _backend_args(s)
    s.set_defaults(func=cmd_sweep)

    c = subparsers.add_parser("capacity", help="per policy, the largest load meeting an SLO (bisection)",
                              description="For each combination of the spec's axes (e.g. each policy), bisect the "
                                          "load (concurrency, rate or time_scale) for the largest value meeting "
                                          "every SLO term; writes capacity.json (SLO + search trace), capacity.csv and, last, "
                                          "capacity.manifest.json. A probe whose SLO metric has no value (e.g. no "
                                          "request finished) is infeasible, with the reason in the trace.")
    c.add_argument("spec", help="sweep spec (TOML) whose axes must not include the load; its [capacity] table "
                                "may set load, min, max, tolerance, slo")
    c.add_argument("--out", "--result-dir", dest="out", required=True, help="output folder (also the probe cache)")
    c.add_argument("--slo", "--sla", dest="slo", action="append", default=None, metavar="SLO",
                   help="SLO term METRIC OP X (OP >=, <=, > or <) on a run-summary field, repeatable, e.g. "
                        "--slo 'tps_user_median>=50' --slo 'ttft_p99_s<=2' [spec's capacity.slo]")
    c.add_argument("--load", choices=["concurrency", "rate", "time_scale"], default=None,
                   help="load axis to search [spec's capacity.load, else its load key]")
    c.add_argument("--min", type=pos_float, default=None, help="lowest load searched")
    c.add_argument("--max", type=pos_float, default=None, help="highest load searched")
    c.add_argument("--tolerance", type=pos_float, default=None,
                   help="stop when the bracket is this narrow [1 for concurrency, (max-min)/100 otherwise]")
    c.add_argument("--allow-saturated", action="store_true", help="let a saturated run meet the SLO")
    from dsparksim.results.stats import seeds_arg  # lazy: pulls in numpy
    c.add_argument("--seeds", type=seeds_arg, default=None,
                   help="search every group once per seed (the spec's seed, seed+1, ...; same seeds for every "
                        "group): capacity is the mean of the per-seed capacities with a 95%% t-interval "
                        "(capacity_lo, capacity_hi) [spec's capacity.seeds, else 1]")
    _backend_args(c)
    c.set_defaults(func=cmd_capacity)

    r = subparsers.add_parser("regress", help="recompute a fixed sweep and compare it seed by seed with a baseline",
                              description="Recompute the baseline's sweep (no cache) over its seeds and compare "
                                          "every frontier point seed by seed (the baseline stores each seed's "
                                          "values; same seeds = same draws): a metric is flagged when the 95% "
                                          "t-interval of its paired per-seed relative changes excludes zero and "
                                          "their mean exceeds the threshold (2% unless [regress] threshold says "
                                          "otherwise). Exit 0 pass; 1 a regression (each under the policy whose "
                                          "runs changed; a cell that now fails is one); 2 bad input (one line); "
                                          "130 interrupted.")
    r.add_argument("--baseline", required=True, help="baseline JSON, e.g. tests/golden/regress_baseline.json")
    r.add_argument("--spec", default=None, help="sweep spec [the one the baseline names]")
    r.add_argument("--update", action="store_true", help="(re)write the baseline from the current results")
    r.add_argument("--exact", action="store_true",
                   help="flag any per-seed difference beyond atol + rtol x |baseline| (no interval, no "
                        "threshold): on the same seeds a deterministic simulator reproduces the baseline to the "
                        "last bit, so any change at all is flagged")
    r.add_argument("--json", action="store_true",
                   help="print the result as one JSON object on stdout instead of the readable report (passed, "
                        "rule, per policy its differences and notes); the exit status is the same")
    _backend_args(r)
    r.set_defaults(func=cmd_regress)

    register_plan(subparsers, _backend_args)
