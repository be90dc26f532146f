"""``dsparksim bench replay RUNS.csv --profile P [--where KEY=VALUE,...] [--seed S] --out DIR``.

Simulates every selected run of a runs table as its benchmark client ran it (dsparksim.bench.replay) and writes
``replay.csv`` (measured, simulated and relative error per metric per run), ``replay_errors.csv`` (median and p90
|error| per metric), ``replay.png`` (interactivity against throughput per GPU, measured vs simulated per workload)
and ``config.json``; prints the error table.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from dsparksim.cli.options import add_seed_option, bar_off, check_seed
from dsparksim import __version__
from dsparksim.config import pos_float, pos_int
from dsparksim.errors import ConfigError
from dsparksim.io.options import nonneg_int
from dsparksim.results.outputs import check_out_dir, staged_dir


def register_replay(sub) -> None:
    """Add ``replay`` to the ``bench`` subcommands."""

    q = sub.add_parser("replay", help="simulate every selected run of a runs table as its client ran it",
                       description="Simulate each selected run of a runs table (bench import) on a cost profile, "
                                   "as its benchmark client ran it (random dataset, prompts, cap, rate, warm-up; "
                                   "MTP rows with the policy their speculative config maps to), and compare with "
                                   "the measurement.")
    q.add_argument("runs", metavar="RUNS.csv", help="runs table (dsparksim bench import)")
    q.add_argument("--profile", required=True, help="cost profile: shipped name or JSON path")
    q.add_argument("--where", default=None, metavar="KEY=VALUE,...",
                   help="only the runs whose columns equal these values (numbers as numbers; KEY= for empty)")
    add_seed_option(q, help="random seed of every simulated run [%(default)s]")
    q.add_argument("--chunked-prefill-size", type=pos_int, default=None, metavar="N",
                   help="server setting for every run: prefill tokens per step [a fitted profile's: the chunk it "
                        "was fitted under (metadata.fit.client_model); any other: its token budget, as profile fit's "
                        "default]")
    q.add_argument("--max-running-requests", type=pos_int, default=None, metavar="N",
                   help="server setting for every run: most running requests [a fitted profile's: the fit's; "
                        "any other: 1024]")
    q.add_argument("--mem-fraction-static", type=pos_float, default=None, metavar="FRAC",
                   help="server setting for every run: KV capacity from the profile's memory metadata [a fitted "
                        "profile's: the fit's; any other: the profile's KV capacity]")
    q.add_argument("--cuda-graph-max-bs", type=pos_int, default=None, metavar="N",
                   help="server setting for every run: recorded, not priced")
    q.add_argument("--attention-dp-timeout-iters", type=nonneg_int, default=None, metavar="N",
                   help="server setting for the DP-attention runs: TensorRT-LLM's attention_dp_config with "
                        "enable_balance true and timeout_iters N (prefills held until every rank has one) [off, "
                        "TensorRT-LLM's default; InferenceX's launch scripts: 60]")
    q.add_argument("--attention-dp-batching-wait-iters", type=nonneg_int, default=0, metavar="N",
                   help="server setting for the DP-attention runs: attention_dp_config batching_wait_iters, with "
                        "--attention-dp-timeout-iters [%(default)s]")
    q.add_argument("--batch-wait-timeout-iters", type=pos_int, default=None, metavar="N",
                   help="server setting for every run: TensorRT-LLM's batch_wait_timeout_iters, with "
                        "--batch-wait-max-tokens-ratio (new prefills held until enough tokens wait or N steps "
                        "passed; not with DP attention) [off, TensorRT-LLM's default]")
    q.add_argument("--batch-wait-max-tokens-ratio", type=pos_float, default=None, metavar="FRAC",
                   help="server setting for every run: TensorRT-LLM's batch_wait_max_tokens_ratio, in (0, 1] [off]")
    q.add_argument("--mixed-prefill", action=argparse.BooleanOptionalAction, default=None,
                   help="whether the server's steps mix prefill chunks with decode [each run's engine default: "
                        "off for SGLang (--enable-mixed-chunk defaults to off), on otherwise]")
    q.add_argument("--acceptance", default=None, metavar="SPEC",
                   help="acceptance model of the speculative runs instead of their config's mapping (mtp), e.g. "
                        "\"mtp?tau2=2.3\" from your server log's accept length, \"mtp?a1=0.6&tau2=1.9\" below 1.87 "
                        "[the mapping's]")
    q.add_argument("--out", required=True, help="output directory, replaced whole by the new results")
    q.add_argument("--quiet", action="store_true",
                   help="print no summary table or file list (notes, cautions and errors still are)")
    q.set_defaults(func=replay_command)


def _check_batch_wait_flags(args: argparse.Namespace) -> None:
    """Batch waiting's two flags: both or neither, the ratio a fraction (errors named by flag)."""
    t, r = args.batch_wait_timeout_iters, args.batch_wait_max_tokens_ratio
    if (t is None) != (r is None):
        flag, other = (("--batch-wait-timeout-iters", "--batch-wait-max-tokens-ratio") if r is None else
                       ("--batch-wait-max-tokens-ratio", "--batch-wait-timeout-iters"))
        raise ConfigError("cli", flag, f"{t if r is None else r} without {other}: TensorRT-LLM's batch waiting holds "
                          "prefills only with both set (one alone never holds): give both, or neither")
    if r is not None and r > 1:
        raise ConfigError("cli", "--batch-wait-max-tokens-ratio", f"expected a fraction in (0, 1], got {r}")


def replay_server(args: argparse.Namespace, prof):
    """(the ServerSettings every run is replayed on, the mixed-prefill setting (None: each run's engine default),
    the settings taken from the profile's fit by flag): the options given, else the server a fitted profile was
    fitted under, else the chunk of the profile's token budget (profile fit's default) and the simulator's."""
    from dsparksim.bench.client import ServerSettings  # lazy: pulls in numpy

    fit, fit_used = replay_fit_defaults(args, prof)
    chunk = args.chunked_prefill_size or fit.get("prefill_chunk_tokens") or int(prof.max_tokens)
    server = ServerSettings(chunked_prefill_size=chunk,
                            max_running_requests=args.max_running_requests or fit.get("max_num_seqs"),
                            cuda_graph_max_bs=args.cuda_graph_max_bs,
                            mem_fraction_static=(args.mem_fraction_static if args.mem_fraction_static is not None
                                                 else fit.get("mem_fraction_static")),
                            attention_dp_timeout_iters=args.attention_dp_timeout_iters,
                            attention_dp_batching_wait_iters=args.attention_dp_batching_wait_iters,
                            batch_wait_timeout_iters=args.batch_wait_timeout_iters,
                            batch_wait_max_tokens_ratio=args.batch_wait_max_tokens_ratio)
    mixed = args.mixed_prefill if args.mixed_prefill is not None else fit_used.get("--mixed-prefill")
    return server, mixed, fit_used


def replay_fit_defaults(args: argparse.Namespace, prof) -> tuple[dict, dict]:
    """(the server a fitted profile records, :func:`dsparksim.cost.fitted.fit_server`; the settings of it this
    replay takes, by flag, because no option set them). ``profile fit``'s mixed prefill is taken only when the fit
    was given it: otherwise the fit used each run's engine default, as replay does."""
    from dsparksim.cost.fitted import fit_server, fit_set_mixed_prefill  # lazy: pulls in numpy

    fit = fit_server(prof.metadata, str(prof.source), prof.max_tokens)
    used: dict = {}
    for flag, key, given in (("--chunked-prefill-size", "prefill_chunk_tokens", args.chunked_prefill_size),
                             ("--max-running-requests", "max_num_seqs", args.max_running_requests),
                             ("--mem-fraction-static", "mem_fraction_static", args.mem_fraction_static)):
        if given is None and key in fit:
            used[flag] = fit[key]
    mixed = fit_set_mixed_prefill(prof.metadata)
    if args.mixed_prefill is None and mixed is not None:
        used["--mixed-prefill"] = mixed
    return fit, used


def replay_command(args: argparse.Namespace) -> int:
    from tqdm import tqdm  # lazy: only commands that draw a bar (CLI start-up)

    from dsparksim.bench.replay import (error_summary, parse_where, read_table, replay,  # lazy: numpy
                                        replay_figure, row_policy, row_workload, select)
    from dsparksim.cost.profile import load_profile, profile_path  # lazy: pulls in numpy
    from dsparksim.sim.simulate import write_json, write_table  # lazy: pulls in numpy, scipy, simpy

    check_seed(args)
    if args.attention_dp_batching_wait_iters and args.attention_dp_timeout_iters is None:   # named by its flag
        raise ConfigError("cli", "--attention-dp-batching-wait-iters", f"{args.attention_dp_batching_wait_iters}: "
                          "the batching wait is part of the attention-DP balance: set --attention-dp-timeout-iters "
                          "too, or drop it")
    _check_batch_wait_flags(args)
    check_out_dir(args.out, "--out")
    where = parse_where(args.where)
    runs = read_table(args.runs)
    sel = select(runs, where, source=str(args.runs))
    for r in sel:                       # every row checked before any is simulated
        row_workload(r, str(args.runs))
        row_policy(r, str(args.runs))
    prof = load_profile(args.profile)
    server, mixed, fit_used = replay_server(args, prof)
    chunk = server.chunked_prefill_size
    t0 = time.perf_counter()
    with tqdm(total=len(sel), unit="run", desc="replay", disable=bar_off(args)) as bar:
        df = replay(sel, prof, server=server, seed=args.seed, source=str(args.runs), on_done=lambda: bar.update(1),
                    mixed_prefill=mixed, acceptance=args.acceptance)
    wall = time.perf_counter() - t0
    err = error_summary(df)
    out = Path(args.out)
    with staged_dir(out) as d:
        write_table(d / "replay.csv", df)
        write_table(d / "replay_errors.csv", err)
        replay_figure(df, title=f"{prof.name} | {len(df)} runs of {Path(args.runs).name}"
                      ).savefig(d / "replay.png")
        write_json(d / "config.json", {"runs": str(args.runs), "where": args.where, "profile": prof.name,
                                       "profile_path": str(profile_path(args.profile)), "seed": args.seed,
                                       "acceptance": args.acceptance,
                                       "server": {k: v for k, v in server.__dict__.items()     # per run: not here
                                                  if k not in ("gpus", "mixed_chunk", "dp_ranks", "router")},
                                       "mixed_prefill": (mixed if mixed is not None
                                                         else "each run's engine default (sglang: off, "
                                                              "others: on)"),
                                       "from_profile_fit": fit_used,
                                       "selected": len(df), "of": len(runs), "wall_s": round(wall, 2),
                                       "dsparksim_version": __version__})
    budget = int(prof.max_tokens)
    if chunk > budget:   # never silently: the token budget caps every step's prefill (docs/benchmarks.md)
        print(f"dsparksim: note: --chunked-prefill-size {chunk} is above the profile's token budget {budget} (its "
              f"largest breakpoint), which caps every step's prefill: the runs were simulated with chunks of at most "
              f"{budget} tokens (profile fit refuses such a chunk)", file=sys.stderr)
    if not args.quiet:
        how = ((f", at most {budget} per step: the profile's token budget" if chunk > budget else "")
               if args.chunked_prefill_size else ", the fit's" if "--chunked-prefill-size" in fit_used else
               ", the profile's token budget as in profile fit: give your server's with --chunked-prefill-size")
        print(f"{len(df)} of {len(runs)} runs replayed on {prof.name} in {wall:.1f} s (chunked prefill {chunk} "
              f"tokens{how})")
        if fit_used:
            flags = [f"{k} {v}" if not isinstance(v, bool) else k if v else "--no-" + k[2:]
                     for k, v in fit_used.items()]
            print(f"  the server the profile was fitted under (metadata.fit.client_model), as no option set it: "
                  f"{' '.join(flags)}")
        noted = [n for n in df["notes"] if n]
        if noted:
            print(f"  {len(noted)} run(s) with fields filled in or caveats (replay.csv notes), e.g.: {noted[0]}")
        print("metric                      runs  median |err|  p90 |err|  median err")
        for r in err.itertuples():
            if not r.runs:   # no selected run published this metric (e.g. history rows have no means)
                print(f"  {r.metric:26s}{r.runs:5d}  {'not measured in these runs':>33s}")
                continue
            print(f"  {r.metric:26s}{r.runs:5d}  {r.median_abs_error_pct:10.1f}%  {r.p90_abs_error_pct:8.1f}%  "
                  f"{r.median_error_pct:+9.1f}%")
        for name in ("replay.csv", "replay_errors.csv", "replay.png", "config.json"):
            print(f"  {out / name}")
    sys.stdout.flush()
    return 0
