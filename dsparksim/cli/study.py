"""CLI: ``dsparksim study NAME|all --out DIR`` — run the issue-29 studies and regenerate DIR/REPORT.md."""
from __future__ import annotations

import argparse
import sys

from dsparksim.cli.options import add_seed_option, add_workers_option, bar_off, check_seed
from dsparksim.errors import ConfigError
from dsparksim.study import STUDIES



def _seeds(text: str) -> int:
    """--seeds: 1..MAX_SEEDS paired seeds, as frontier and sweep take them."""
    from dsparksim.results.stats import seeds_arg  # lazy: numpy (CLI start-up)
    return seeds_arg(text)

def register(subparsers) -> None:

    p = subparsers.add_parser(
        "study", help="run a study (issue 29) and regenerate the studies report",
        description="Run one study (or all) and write DIR/NAME/ (tables as CSV, the report section, study.json) "
                    "and DIR/REPORT.md, assembled from every study folder in DIR. Full mode by default; --fast is "
                    "the CI-sized run (few seeds, short runs, the primary regime only: shape, not answers).")
    p.add_argument("name", metavar="NAME", choices=[*STUDIES, "all"], help=f"{' | '.join(STUDIES)} | all")
    p.add_argument("--out", required=True, help="study folder (e.g. studies); other files in it are left alone")
    p.add_argument("--fast", action="store_true", help="CI-sized run")
    p.add_argument("--profile", default=None,
                   help="cost profile of the production regime [built-h200x8-deepseek-v3-tp8]; its engine options "
                        "(decode-only, paged KV, ...) stay, and a `profile fit` profile brings the server it was "
                        "fitted under (prefill chunk, max running requests, memory fraction, mixed prefill), as in "
                        "`run`")
    p.add_argument("--no-contrast", action="store_true", help="skip the dense contrast regime (h100-llama2-7b-tp1)")
    p.add_argument("--seeds", type=_seeds, default=None, help="paired seeds [2 fast, 5 full]")
    add_seed_option(p, help="first seed [%(default)s]")
    add_workers_option(p, default=1, help="worker processes [%(default)s]")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_study)


def _check_production_profile(name: str) -> None:
    """The production regime runs decode-only behind a prefill pool: its KV transfer is priced from the profile's
    metadata.kv_bytes_per_token, which `study` has no option to give otherwise."""
    from dsparksim.cost.profile import load_profile  # lazy: pulls in numpy
    from dsparksim.study.common import PRODUCTION  # lazy: pulls in numpy

    if dict(PRODUCTION.options).get("disaggregated") and load_profile(name).metadata.get("kv_bytes_per_token") is None:
        raise ConfigError("study", "--profile", f"profile {name!r} gives no metadata.kv_bytes_per_token, which the "
                          "production regime's decode-only runs need to price the KV transfer from the prefill pool; "
                          "choose a profile that states it (`profile build` and `profile fit` write it)")


def cmd_study(args: argparse.Namespace) -> int:
    from dsparksim.study.run import (check_out, run_study, settings_for, study_fit_cautions,  # lazy: pulls in numpy
                                     study_fit_lines, write_report, write_study)

    check_seed(args)
    names = list(STUDIES) if args.name == "all" else [args.name]
    if args.profile is not None:
        from dsparksim.cost.profile import profile_path  # lazy: pulls in numpy

        profile_path(args.profile)   # an unknown name or a missing file fails before any run
        _check_production_profile(args.profile)
    settings = settings_for("fast" if args.fast else "full", args.profile, None if args.no_contrast else "dense",
                            args.seeds, args.seed)
    check_out(args.out, names)
    for line in study_fit_lines(names, settings):   # a fitted profile's server, taken as `run` takes it
        print(line, file=sys.stderr)
    written = 0
    try:
        for name in names:
            def progress(i: int, n: int, name=name) -> None:
                if not bar_off(args):   # a terminal only (a log gets the result lines); --quiet never
                    print(f"\r{name}: {i}/{n} runs", end="" if i < n else "\n", file=sys.stderr, flush=True)
            section, rows, wall = run_study(name, settings, workers=args.workers, progress=progress)
            for line in study_fit_cautions(rows):   # cells beyond what a fitted profile's runs covered: never silently
                print(line, file=sys.stderr)
            path = write_study(args.out, name, settings, section, wall)
            written += 1
            if not args.quiet:
                print(f"{name}: {wall:.1f} s -> {path}\n  {section.headline}")
    finally:
        if written and written < len(names):
            # a later study failed (or Ctrl-C): REPORT.md still showed the earlier results of the studies already
            # replaced; it is regenerated from the folders as they now are
            write_report(args.out)
    rep = write_report(args.out)
    if not args.quiet:
        print(f"report -> {rep}")
    return 0
