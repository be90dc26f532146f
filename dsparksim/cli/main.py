"""Command-line interface: `dsparksim run | frontier | profile | trace`."""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

from dsparksim.config import (DEFAULT_CONCURRENCY, DEFAULT_DURATION_S, RunConfig, nonneg_float,
                              nonneg_int, pos_float, pos_int, run_options)
from dsparksim.cli.options import add_backend_options, bar_off, check_backend_options, flag_spelling
from dsparksim.errors import CLI, ConfigError, InputError, error_lines, missing_extra, one_line
from dsparksim.io.options import number
from dsparksim import __version__
from dsparksim.config import PAGED_ONLY, reserved_kv_conflict
from dsparksim.results.notes import (fit_range_cautions, low_verify_note, prefill_chunk_note, request_latency_note,
                                     short_window_count, short_window_list, short_window_note, trace_cover_note)
from dsparksim.results.outputs import check_out_dir, check_out_file, need_parquet, staged_dir
from dsparksim.sim.inputs import load_run_profile, resolve_inputs
from dsparksim.sim.reads import unread_by_all

__all__ = ["DEFAULT_DURATION_S", "add_draft_len", "add_option", "add_out", "build_parser", "main", "nonneg_float",
           "nonneg_int", "pos_float", "pos_int", "preflight", "run_config"]


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (no usage block): ``dsparksim run: error: argument --x: ...``, exit 2."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def _floats(s: str) -> list[float]:
    # Load levels: every listed value is a finite number > 0, and at least one is listed.
    vals = [x.strip() for x in s.split(",")]
    if not any(vals) or not all(vals):
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers > 0, got {s!r}")
    return [number(x, float, 0.0, True, "comma-separated numbers > 0") for x in vals]


def _ints(s: str) -> list[int]:
    vals = [x.strip() for x in s.split(",")]
    if not any(vals) or not all(vals):
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 1, got {s!r}")
    return [number(x, int, 1, False, "comma-separated integers >= 1") for x in vals]


# Run options that `frontier` takes as comma lists (one frontier per deployment = replicas x router).
DEPLOYMENT_AXES = ("replicas", "router")


def _option_list(key: str):
    """The argparse type of a comma list of option ``key``'s values: each element goes through that option's own
    parser or choices (config field metadata, as in `run`); empty elements and duplicates are refused."""
    o = run_options()[key].option

    def parse(s: str) -> list[Any]:
        vals = [x.strip() for x in s.split(",")]
        if not any(vals) or not all(vals):
            raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {s!r}")
        out = []
        for v in vals:
            if o.choices is not None and v not in o.choice_list():
                raise argparse.ArgumentTypeError(f"invalid choice {v!r} (choose from {', '.join(o.choice_list())})")
            out.append(o.parse(v) if o.parse is not None else v)
        dup = sorted({str(v) for v in out if out.count(v) > 1})
        if dup:
            raise argparse.ArgumentTypeError(f"lists {', '.join(dup)} more than once (each cell would run twice)")
        return out

    parse.__name__ = f"{key} list"
    return parse


def _add_axis_option(container, key: str) -> None:
    """A frontier axis: the run option ``key`` as a comma list (dest ``key``, default [the option's default])."""
    spec = run_options()[key]
    o = spec.option
    help = _AXIS_HELP[key].format(choices=", ".join(o.choice_list() or ()), default=spec.default)
    metavar = (o.metavar or key.upper()) + "[,...]"
    container.add_argument(*o.flags, dest=key, type=_option_list(key), default=[spec.default], metavar=metavar,
                           help=help)


_AXIS_HELP = {
    "replicas": "identical engine replicas behind the router, comma-separated: one frontier per count [{default}]",
    "router": "how requests are spread over the replicas (and DP ranks), comma-separated: one frontier per router "
              "({choices}) [{default}]",
}


class _Deprecated(argparse.Action):
    """Stores the value; a deprecated spelling still works but warns (e.g. --block-size, vLLM's KV page size)."""

    def __init__(self, *args: Any, deprecated: tuple[tuple[str, str], ...] = (), **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.deprecated = dict(deprecated)

    def __call__(self, parser, namespace, values, option_string=None):
        why = self.deprecated.get(option_string)
        if why is not None:
            use = " or ".join(o for o in self.option_strings if o not in self.deprecated)
            print(f"dsparksim: warning: {option_string} is deprecated ({why}); use {use}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_option(container, key: str, help: str | None = None) -> None:
    """Add the run option ``key`` (see :func:`dsparksim.config.run_options`) to a parser or argument group: its
    flags, parser, choices, default and help all come from the config field's metadata; the dest is the key."""
    spec = run_options()[key]
    o = spec.option
    kw: dict[str, Any] = {"dest": key, "default": spec.default, "help": o.help if help is None else help}
    if o.switch:
        # a switch that defaults on gets its --no- spelling too (--mixed-prefill / --no-mixed-prefill)
        kw["action"] = argparse.BooleanOptionalAction if spec.default is True else "store_true"
    else:
        if o.parse is not None:
            kw["type"] = o.parse
        if o.choices is not None:
            kw["choices"] = o.choice_list()
        if o.metavar is not None or o.choices is None:  # --kv-capacity KV_CAPACITY, as typed (not the dest)
            kw["metavar"] = o.metavar or o.flags[0].lstrip("-").replace("-", "_").upper()
        if o.deprecated:
            kw.update(action=_Deprecated, deprecated=o.deprecated)
    container.add_argument(*o.flags, **kw)


def add_draft_len(g) -> None:
    """The draft length option, vLLM's name first: --num-speculative-tokens / -K (--block-size deprecated)."""
    add_option(g, "block_size")


def add_out(p: argparse.ArgumentParser, default: str | None, help: str = "output directory",
            result_dir_alias: bool = True) -> None:
    """``--out`` and (``result_dir_alias``) its vLLM spelling ``--result-dir``."""
    kw = {"default": default} if default is not None else {"required": True}
    flags = ("--out", "--result-dir") if result_dir_alias else ("--out",)
    p.add_argument(*flags, dest="out", **kw, help=f"{help}" + (" [%(default)s]" if default is not None else ""))


PERCENTILE_METRICS = ("ttft", "tpot", "itl", "e2el")


def add_result_options(r: argparse.ArgumentParser) -> None:
    """`vllm bench serve`'s result options on `run` (they shape bench_result.json; see results.bench_json)."""
    g = r.add_argument_group("result file (vllm bench serve's options)")
    g.add_argument("--save-result", action="store_true",
                   help="accepted for vLLM habits: bench_result.json is always written (with --result-dir also "
                        "there)")
    g.add_argument("--result-dir", default=None, metavar="DIR",
                   help="also write the vLLM result JSON into DIR as a new file (created if missing; nothing in DIR "
                        "is replaced; an existing file of that name is refused); without --out, only that file")
    g.add_argument("--result-filename", default=None, metavar="NAME",
                   help="name of that file [vLLM's {label or backend}-{rate}qps[-concurrency{N}]-{model}-{date}"
                        ".json]; without --result-dir an extra copy inside --out")
    g.add_argument("--percentile-metrics", default=",".join(PERCENTILE_METRICS), metavar="LIST",
                   help="metrics with statistics in the result JSON, of ttft,tpot,itl,e2el [%(default)s]")
    g.add_argument("--metric-percentiles", default="99", metavar="LIST",
                   help="percentiles of those metrics, comma-separated, e.g. 25,50,99 [%(default)s]")
    g.add_argument("--label", default=None, help="the result JSON's label (and its file name's prefix)")
    g.add_argument("--metadata", nargs="*", default=None, metavar="KEY=VALUE",
                   help="KEY=VALUE pairs added to the result JSON (strings, as vLLM)")
    g.add_argument("--goodput", nargs="+", default=None, metavar="KEY:VALUE",
                   help="SLOs in ms for request_goodput: ttft:MS tpot:MS e2el:MS (as vllm bench serve)")


def result_options(args: argparse.Namespace) -> dict[str, Any]:
    """bench_result()'s options from `run`'s result flags, checked (one line naming the flag)."""
    from dsparksim.results.bench_json import ALL_KEYS, parse_goodput  # lazy: pulls in numpy, scipy, simpy

    mets = [m.strip() for m in args.percentile_metrics.split(",")]
    bad = [m for m in mets if m not in PERCENTILE_METRICS]
    if bad or not mets:
        raise _bad("--percentile-metrics", f"expected a comma-separated subset of {','.join(PERCENTILE_METRICS)}, "
                   f"got {args.percentile_metrics!r}")
    try:
        pcts = [float(x) for x in args.metric_percentiles.split(",")]
    except ValueError:
        pcts = []
    if not pcts or not all(0 < p <= 100 for p in pcts):
        raise _bad("--metric-percentiles", f"expected comma-separated percentiles in (0, 100], got "
                   f"{args.metric_percentiles!r}")
    meta: dict[str, str] = {}
    for item in args.metadata or []:
        k, eq, v = item.partition("=")
        k = k.strip()
        if not eq or not k:
            raise _bad("--metadata", f"expected KEY=VALUE, got {item!r}")
        if k in ALL_KEYS or k.endswith("_ms"):
            raise _bad("--metadata", f"key {k!r} is one of the result's own keys; choose another")
        meta[k] = v.strip()
    return {"metrics": tuple(mets), "percentiles": tuple(pcts), "label": args.label,
            "goodput": None if args.goodput is None else parse_goodput(args.goodput), "metadata": meta or None}


def result_file(args: argparse.Namespace, cfg: RunConfig, model: str) -> Path | None:
    """Where --result-dir puts the result JSON (vLLM's name unless --result-filename); refused if it exists."""

    if args.result_filename is not None and (not args.result_filename or "/" in args.result_filename
                                             or args.result_filename in (".", "..")):
        raise _bad("--result-filename", f"expected a file name (no folder), got {args.result_filename!r}")
    if args.result_dir is None:
        return None
    name = args.result_filename
    if name is None:
        label = args.label or "dsparksim"
        if "/" in label or label in (".", "..") or any(ord(c) < 32 for c in label):   # '../x' wrote outside
            raise _bad("--label", f"names the --result-dir file, so it must be a plain name (no '/' or control "
                       f"characters), got {label!r}")
        t = cfg.traffic
        rate = t.rate if t.mode in ("poisson", "gamma", "constant") else "inf"
        cap = t.concurrency if t.mode == "closed" else t.max_concurrency
        conc = f"-concurrency{cap}" if cap is not None else ""
        name = (f"{args.label or 'dsparksim'}-{rate}qps{conc}-{(model or cfg.profile).split('/')[-1]}-"
                f"{time.strftime('%Y%m%d-%H%M%S')}.json")
    path = Path(args.result_dir) / name
    out = Path(args.out).resolve() if getattr(args, "out", None) is not None else None
    if out is not None and (path.parent.resolve() == out or out in path.parent.resolve().parents):
        # the file would be written, reported and then deleted with the folder --out replaces whole
        raise _bad("--result-dir", f"{args.result_dir!r} is inside --out {args.out!r}, which the run replaces "
                   "whole; choose another folder, or --result-filename alone for a copy inside --out")
    if path.exists() or path.is_symlink():
        raise _bad("--result-dir", f"{str(path)!r} exists; dsparksim never replaces a file it is asked to add "
                   "(choose another --result-filename or folder)")
    check_out_file(path, "--result-dir")
    return path


def default_out_note(args: argparse.Namespace, existed: bool) -> None:
    """Say so when a command without --out replaced its default folder (the previous results are gone)."""
    typed = flag_given(args, "--out") or (flag_given(args, "--result-dir") and not hasattr(args, "result_dir"))
    if existed and not typed:   # (--result-dir is --out's alias only where it is not vLLM's separate option)
        print(f"dsparksim: note: replaced {args.out} (the previous results there); give --out DIR to keep each "
              "run's results", file=sys.stderr)


_GROUPS = {"inputs": "inputs", "traffic": "traffic (closed loop by default)", "engine": "engine"}


def add_run_options(p: argparse.ArgumentParser, frontier: bool) -> None:
    """The shared run options, generated from the config fields' metadata (``frontier``: load lists instead of
    one load), plus ``--format``."""
    groups = {name: p.add_argument_group(title) for name, title in _GROUPS.items()}
    if frontier:
        t = groups["traffic"]
        t.add_argument("--concurrency-levels", type=_ints, default=None,
                       help="closed-loop load levels (users), comma-separated [1,2,4,8,16,32,64,96,128]")
        t.add_argument("--rates", type=_floats, default=None,
                       help="open-loop load levels (req/s), comma-separated; uses Poisson/gamma arrivals")
        t.add_argument("--time-scales", type=_floats, default=None,
                       help="trace replay load levels (arrival-rate multipliers), comma-separated (needs --trace)")
    exclusive: dict[tuple[str, str], Any] = {}
    for key, spec in run_options().items():
        o = spec.option
        if not o.flags or not o.common or (frontier and o.load):
            continue
        g = p if spec.group == "" else groups[spec.group]
        ex = None if frontier and o.exclusive == "load" else o.exclusive  # frontier: --trace is its own axis
        if ex is not None:
            if (spec.group, ex) not in exclusive:
                exclusive[(spec.group, ex)] = g.add_mutually_exclusive_group()
            g = exclusive[(spec.group, ex)]
        if frontier and key in DEPLOYMENT_AXES:
            _add_axis_option(g, key)
            continue
        add_option(g, key, help=o.frontier_help if frontier and o.frontier_help else None)
    # frontier writes no per-request table: the option stays (refused with a reason) but is not offered
    p.add_argument("--format", choices=["csv", "parquet"], default="csv",
                   help=argparse.SUPPRESS if frontier else "per-request table format [%(default)s]")


def _bad(option: str, message: str) -> ConfigError:
    return ConfigError("cli", option, message)


def flag_given(args: argparse.Namespace, *opts: str) -> bool:
    """Was any of ``opts`` typed on the command line (as ``--opt v``, ``--opt=v`` or ``-Kv``)?"""
    argv = getattr(args, "_argv", None) or []
    return any(a == o or a.startswith(o + "=") or (len(o) == 2 and a.startswith(o) and not a.startswith("--"))
               for a in argv for o in opts)


# The command-line flags of the draft options (dsparksim.sim.reads.DRAFT_OPTIONS; drafter has none).
DRAFT_FLAGS = {"acceptance": ("--acceptance",), "block_size": ("--num-speculative-tokens", "-K", "--block-size"),
               "mtp1_acceptance": ("--mtp1-acceptance",), "confidence": ("--confidence",),
               "recalibrate": ("--recalibrate",), "draft_exit": ("--draft-exit",)}


def check_unread_options(args: argparse.Namespace, policies: Sequence[str], how: str) -> None:
    """An option typed on the command line that none of ``policies`` reads is an error, never silently dropped
    (one rule for `run` and `frontier`, as for sweep and plan specs: dsparksim.sim.reads). ``how``: how the
    policies were given, e.g. '--policy none'."""

    for key, flags in DRAFT_FLAGS.items():
        if flag_given(args, *flags):
            hit = unread_by_all(policies, [key])
            if hit:
                raise _bad(flags[0], f"has no effect with {how} ({hit[1]})")


def check_policy_inputs(args: argparse.Namespace) -> None:
    """`run` with one policy: an acceptance or draft-length option that policy never reads is an error."""
    check_unread_options(args, [args.policy], f"--policy {args.policy}")


def check_run_args(args: argparse.Namespace, frontier: bool = False) -> None:
    """Checks of `run`-style options that argparse cannot do alone, before anything is simulated.

    Options that would be ignored are errors, never silently dropped; the output directory must be usable and a
    needed extra (pyarrow for --format parquet) importable."""
    if args.warmup_s is not None and args.num_requests is None:
        dur = args.duration_s if args.duration_s is not None else DEFAULT_DURATION_S
        if args.warmup_s >= dur:
            raise _bad("--warmup", f"expected a value below --duration ({dur:g} s) so some time is measured, "
                       f"got {args.warmup_s:g}")
    has_rate = bool(args.rates) if frontier else args.rate is not None
    if args.arrival is not None and not has_rate:
        raise _bad("--arrival", f"applies to open-loop arrivals only (set {'--rates' if frontier else '--rate'}); "
                   f"got --arrival {args.arrival} without a rate")
    if not frontier and args.time_scale is not None and not args.trace:
        raise _bad("--time-scale", f"applies to trace replay only (set --trace); got --time-scale {args.time_scale:g}")
    reps = args.replicas if isinstance(args.replicas, (list, tuple)) else [args.replicas]
    if flag_given(args, "--router") and max(reps) == 1 and getattr(args, "dp_ranks", 1) == 1:
        raise _bad("--router", f"has no effect on one engine (set --replicas or --dp-ranks above 1); got --router "
                   f"{','.join(args.router) if isinstance(args.router, (list, tuple)) else args.router}")
    hit = reserved_kv_conflict(args.kv_policy, {k: getattr(args, k) for k, f in PAGED_ONLY.items() if flag_given(args, f)},
                               flags=True)
    if hit:
        raise _bad(*hit)
    if args.format == "parquet":
        if frontier:
            raise _bad("--format", "frontier writes no per-request table; --format applies to run")
        need_parquet("--format")
    if args.out is not None:   # None: `run --result-dir` alone writes no folder
        check_out_dir(args.out, "--out", also=tuple(x for x in [getattr(args, "result_filename", None)] if x))


def _options(args: argparse.Namespace) -> dict[str, Any]:
    """The run options of a parsed command line (its dests are the option keys)."""
    return {k: getattr(args, k) for k in run_options() if hasattr(args, k)}


def run_config(args: argparse.Namespace, default_concurrency: int = DEFAULT_CONCURRENCY, **load: Any) -> RunConfig:
    """The RunConfig of `run`-style options (``load`` overrides them, e.g. a frontier's load level);
    errors name the command-line flag."""
    return RunConfig.from_options({**_options(args), **load}, "cli", flags=True,
                                  default_concurrency=default_concurrency)


def run_traffic(args: argparse.Namespace, default_concurrency: int):
    """The traffic of one run from `run`-style options: --trace | --rate | --concurrency (the default)."""
    return run_config(args, default_concurrency).traffic


def _traffic(args: argparse.Namespace, mode: str, **load: Any):
    """The traffic of `run`-style options with the load replaced (``mode``: closed | open | trace, named by the
    load given in ``load``)."""
    load = {"concurrency": None, "rate": None, "trace": None, "time_scale": None, **load}
    return run_config(args, **load).traffic


def _run_config(args: argparse.Namespace, traffic) -> RunConfig:
    """The RunConfig of `run`-style options with ``traffic`` (see :func:`run_config`)."""
    return run_config(args).replace(traffic=traffic)


def cmd_run(args: argparse.Namespace) -> int:
    from tqdm import tqdm  # lazy: only commands that draw a bar (CLI start-up)

    from dsparksim.sim.simulate import simulate, write_run  # lazy: pulls in numpy, scipy, simpy

    write_out = args.result_dir is None or flag_given(args, "--out")   # --result-dir alone: only that file
    if not write_out:
        args.out = None
    check_run_args(args)  # every option and the output directory, before the simulation
    check_policy_inputs(args)
    bench_opts = result_options(args)
    if args.result_filename is not None and args.result_dir is None and \
            args.result_filename in ("config.json", "summary.json", "bench_result.json", "steps.csv",
                                     f"requests.{args.format}"):
        raise _bad("--result-filename", f"{args.result_filename!r} is one of the run's own files in --out")
    fit_lines: list[str] = []   # a fitted profile's server settings used, said once every check has passed
    fit_used = fit_server_options(args, args.profile, fit_lines)
    cfg = run_config(args, **fit_used)
    traffic = cfg.traffic
    if args.ray_address is not None and args.backend != "ray":
        raise _bad("--ray-address", "applies to --backend ray only; got " + (
            f"--backend {args.backend}" if args.backend is not None else "no --backend"))
    if args.backend is not None or args.workers is not None:
        if cfg.engine.replicas == 1:   # a run is sharded by replica: one replica is one shard, whatever the router
            flag = "--workers" if args.workers is not None else "--backend"
            raise _bad(flag, "shards a run's replicas over processes, and this run has one replica: add --replicas "
                             "N (N > 1) or drop " + flag)
        from dsparksim.sim.shard import check_shardable  # lazy: pulls in numpy, scipy, simpy
        check_shardable(cfg)   # one line saying why the replicas interact, before anything runs
    preflight(cfg, [cfg.policy])  # profile, acceptance, lengths and trace read before the progress bar starts
    prof = load_run_profile(cfg)
    target = result_file(args, cfg, str(prof.metadata.get("model", "")))
    for line in fit_lines:
        print(line, file=sys.stderr)
    existed = args.out is not None and Path(args.out).is_dir() and any(Path(args.out).iterdir())
    t0 = time.perf_counter()
    total = traffic.duration_s
    with tqdm(total=total, unit="sim-s", disable=bar_off(args) or total is None, leave=False,
              bar_format="{l_bar}{bar}| {n:.1f}/{total:.0f} sim-s [{elapsed}<{remaining}]") as bar:
        if args.backend is None and args.workers is None:
            out = simulate(cfg, progress=(lambda now: bar.update(min(now, total) - bar.n)) if total else None)
        else:   # sharded across workers (ConfigError when the replicas interact)
            from dsparksim.sweep.fleet import run_fleet  # lazy: pulls in numpy, pandas, pyarrow, scipy, simpy
            out = run_fleet(cfg, args.backend or "local", args.workers, args.ray_address)
    wall = time.perf_counter() - t0
    paths = write_run(out, args.out, fmt=args.format, steps=args.save_steps, bench_options=bench_opts,
                      result_file=target, bench_copy_name=args.result_filename if args.result_dir is None else None,
                      fit_used=fit_used)
    default_out_note(args, existed)
    s = out.summary
    run_notes(args, cfg, prof, s)
    if not args.quiet:
        print(f"policy {s['policy']}: {s['num_requests_completed']} requests in {s['window_s']:.1f} s measured "
              f"({s['sim_time_s']:.1f} s simulated, {wall:.1f} s wall)")
        print(f"  output throughput {s['output_throughput_tok_s']:.1f} tok/s | per-user median "
              f"{_f(s['tps_user_median'])} tok/s | TTFT median {_f(s['ttft_median_s'], 3)} s | "
              f"tau {_f(s['tau'], 2)} | mean verify len {_f(s['mean_verify_len'], 2)} | "
              f"saturated {s['saturated']}")
        if traffic.num_requests is not None and out.bench is not None:
            b = out.bench   # the client's view, as vllm bench serve prints it
            print(f"  client: {b['completed']} completed, {b['failed']} failed in {b['duration']:.2f} s | output "
                  f"{b['output_throughput']:.1f} tok/s | TPOT mean {_f(b.get('mean_tpot_ms'), 2)} ms, median "
                  f"{_f(b.get('median_tpot_ms'), 2)} ms | TTFT mean {_f(b.get('mean_ttft_ms'), 1)} ms")
        for k, p in paths.items():
            print(f"  {k:9s} {p}")
    return 0


def _f(v: Any, nd: int = 1) -> str:
    return "n/a" if v is None else f"{v:.{nd}f}"


def frontier_policies(args: argparse.Namespace) -> tuple[list[str], Any, list[str]]:
    """The swept policies, SLOs and notes of `frontier`, every option checked before any cell runs."""
    from dsparksim.policies import make_policy  # lazy: pulls in numpy
    from dsparksim.results.frontier import DEFAULT_POLICIES  # lazy: pulls in numpy, pandas, pyarrow

    if args.policies is not None:
        policies = [p.strip() for p in args.policies.split(",")]
        if not all(policies):
            raise _bad("--policies", f"expected comma-separated policy specs, got {args.policies!r}")
    else:   # fixed:7 verifies the whole block: fixed:K at another --num-speculative-tokens
        policies = [f"fixed:{args.block_size}" if p == "fixed:7" else p for p in DEFAULT_POLICIES]
    for p in policies:
        make_policy(p)  # fail fast on a bad spec, before any cell runs
    # an option that no swept policy reads would change nothing in any cell: refused, as `run` refuses it
    check_unread_options(args, policies, f"--policies {','.join(policies)}: none of them reads it")
    dup = sorted({p for p in policies if policies.count(p) > 1})
    if dup:
        raise _bad("--policies", f"lists {', '.join(dup)} more than once (each cell would run twice)")
    slos, slo_warnings = frontier_slos(args)
    levels = args.concurrency_levels or args.rates or args.time_scales or []
    if len(set(levels)) != len(levels):
        raise _bad("load levels", f"a level is listed more than once in {','.join(f'{x:g}' for x in levels)}")
    if args.baseline is None:
        # The paper's baseline when it is swept; otherwise the first policy, said out loud in the output.
        args.baseline = "mtp1" if "mtp1" in policies else policies[0]
        if args.baseline != "mtp1":   # printed with the other notes, once every check has passed
            slo_warnings.append(f"dsparksim: note: gains are measured against {args.baseline} (mtp1 is not among "
                                "--policies; set --baseline to choose)")
    if args.baseline not in policies:
        raise ConfigError("cli", "--baseline", f"must be one of --policies ({','.join(policies)}), "
                          f"got {args.baseline!r}")
    check_frontier_loads(args)
    check_backend_options(args)   # --ray-address without ray; --workers with serial (was ignored silently)
    if args.backend == "ray":
        from dsparksim.sweep.backends import import_ray  # lazy: pulls in numpy, pandas, pyarrow, scipy, simpy
        import_ray()  # the missing extra is one line before any cell, not after the progress bar
    return policies, slos, slo_warnings


def frontier_cells(args: argparse.Namespace, policies: list[str], slo_warnings: list[str]):
    """The base config, loads, deployments, seeds and every cell of `frontier`."""
    from dsparksim.results.frontier import DEFAULT_CONCURRENCY as DEFAULT_LOADS  # lazy: pulls in numpy, pandas, pyarrow
    from dsparksim.results.frontier import cells, deployment_label, deployments  # lazy: pulls in numpy, pandas, pyarrow
    from dsparksim.results.stats import seed_list  # lazy: pulls in numpy

    check_run_args(args, frontier=True)
    if args.trace:
        loads, load, load_name = args.time_scales or [0.5, 1, 2, 4], {"time_scale": 1.0}, "trace time scale"
    elif args.rates:
        loads, load, load_name = args.rates, {"rate": args.rates[0]}, "arrival rate (req/s)"
    else:
        loads = args.concurrency_levels or list(DEFAULT_LOADS)
        load, load_name = {"concurrency": int(max(loads))}, "concurrent users"
    deploys = deployments(args.replicas, args.router)
    if getattr(args, "dp_ranks", 1) == 1:
        # one engine reads no router: its deployment under a second router is the same run (dsparksim.sim.reads)
        same = [d for d in deploys if d[0] == 1 and d[1] != args.router[0]]
        if same:
            deploys = [d for d in deploys if d not in same]
            slo_warnings.append(f"dsparksim: note: {', '.join(deployment_label(*d) for d in same)} would repeat "
                                f"{deployment_label(1, args.router[0])} (one engine reads no router): run once, as "
                                f"{deployment_label(1, args.router[0])}")
    # The base config is the first deployment's; each cell sets its own replicas and router.
    fitted = fit_server_options(args, args.profile, slo_warnings)   # said with the other notes, after the checks
    with _frontier_flags_named(args, *load):
        base = run_config(args, replicas=deploys[0][0], router=deploys[0][1], **load, **fitted)
    preflight(base, policies, "--policies")
    _check_session_routers(base, args.router)
    seeds = seed_list(base.seed, args.seeds)
    with _frontier_flags_named(args, *load):
        cfgs = cells(base, policies, loads, deploys, seeds=seeds if len(seeds) > 1 else None)
    return base, loads, load_name, deploys, seeds, cfgs, fitted


def run_notes(args: argparse.Namespace, cfg: RunConfig, prof: Any, s: dict[str, Any]) -> None:
    """What `run` says about its result (``s``: the summary) on stderr: an empty or short measurement window,
    the notes its policy, profile, chunk and trace call for, and requests rejected on arrival."""
    traffic = cfg.traffic
    if not s["num_requests_completed"]:
        print(f"dsparksim: warning: no request both arrived inside the measurement window (after the {s['warmup_s']:g} s "
              "warm-up) and completed: per-request metrics are empty (lower --warmup or run longer)", file=sys.stderr)
    short = short_window_count(s, traffic.concurrency if traffic.mode == "closed" else None)
    if short:
        print(f"dsparksim: warning: {short_window_note(short)}", file=sys.stderr)
    for note in (low_verify_note(s), request_latency_note(str(cfg.profile), prof.request_latency_s),
                 given_chunk_note(args, cfg, prof), trace_note(cfg, [cfg.traffic.time_scale]),
                 given_mixed_note(args, cfg)):
        if note:
            print(f"dsparksim: note: {note}", file=sys.stderr)
    rej = _rejected_text(s)
    if rej:
        # never silently: the metrics describe only the requests that were admitted
        print(f"dsparksim: warning: {rej}; every metric covers only the admitted requests (see "
              "summary.json: num_requests_rejected, rejected_by_reason; requests.csv: reject_reason)", file=sys.stderr)
    for line in fit_range_cautions([cfg], [s]):   # a fitted profile run beyond what its fit saw: never silently
        print(line, file=sys.stderr)


@contextlib.contextmanager
def _frontier_flags_named(args: argparse.Namespace, key: str) -> Iterator[None]:
    """A load level refused by TrafficConfig is named by frontier's own flag (--rates), not the field (rate) or
    run's flag (--rate), which frontier does not have; a deployment value the engine config refuses (one of
    --replicas, or --max-num-seqs x replicas) by its flag, not the dataclass field."""
    try:
        yield
    except ConfigError as e:
        if e.field in (key, "--" + key.replace("_", "-")):
            flag = "--time-scales" if args.trace else "--rates" if args.rates else "--concurrency-levels"
            raise ConfigError(CLI, flag, e.message) from None
        spec = next((s for s in run_options().values() if s.field == e.field and s.section == "engine"), None)
        if e.source != "config" or spec is None or not spec.option.flags:
            raise
        raise ConfigError(CLI, spec.option.flags[0], e.message) from None


def warn_incomplete_cells(table, seeded: bool, closed_loop: bool = False) -> None:
    """Cells with no finished request, closed-loop cells with fewer finished requests than users, or with
    requests rejected on arrival, said out loud (never silently left off a plot); with seeds, ``table`` is the
    per-seed table."""
    empty = _empty_cells(table)  # with seeds: any seed without a finished request
    if empty:
        # Kept in frontier.csv with empty metrics (never Pareto) -- said out loud, never silently left off a plot.
        print(f"dsparksim: warning: {len(empty)} cell(s) finished no request in the measurement window; they stay "
              "in frontier.csv with empty metrics and are never Pareto: "
              f"{short_window_list(empty, 'frontier.csv: num_requests_completed 0')} (lengthen --duration)"
              + ("; a cell's mean over seeds is empty when any of its seeds is" if seeded else ""),
              file=sys.stderr)
    short = _cell_names(table, [short_window_count(r, r.get("load")) for _, r in table.iterrows()]) \
        if closed_loop else []
    if short:
        where = short_window_list(short, "frontier.csv: num_requests_completed against load")
        print(f"dsparksim: warning: {len(short)} cell(s): {short_window_note(where)}", file=sys.stderr)
    rejected = _rejected_cells(table)
    if rejected:
        print(f"dsparksim: warning: requests were rejected on arrival in {len(rejected)} cell(s) and their metrics "
              f"cover only the admitted requests: {short_window_list(rejected, 'frontier.csv')} "
              "(frontier.csv: num_requests_rejected)",
              file=sys.stderr)


# Run options whose given-ness decides what a fitted profile's server fills in (dsparksim.cost.fitted).
FIT_GIVEN_KEYS = ("prefill_chunk_tokens", "max_num_seqs", "mem_fraction_static", "mixed_prefill", "kv_capacity_tokens",
                  "batch_wait_timeout_iters", "batch_wait_max_tokens_ratio", "disaggregated", "dp_ranks")


def given_options(args: argparse.Namespace, keys: Sequence[str]) -> dict[str, Any]:
    """The options of ``keys`` the command line set: typed in any spelling (``--no-`` too, or abbreviated, as
    argparse takes a unique prefix: ``--prefill-ch 2048`` sets the chunk even to its default), or parsed to a value
    other than the default. None of these keys' flags has another option's full name as a prefix, so a typed
    prefix of one is that flag."""
    typed = [a.split("=", 1)[0] for a in (getattr(args, "_argv", None) or []) if a.startswith("--") and len(a) > 2]
    out = {}
    for k in keys:
        spec = run_options()[k]
        flags = tuple(spec.option.flags) + (tuple("--no-" + f[2:] for f in spec.option.flags if f.startswith("--"))
                                            if spec.option.switch else ())
        v = getattr(args, k, spec.default)
        if v != spec.default or any(f.startswith(t) for f in flags for t in typed) or flag_given(args, *flags):
            out[k] = v
    return out


def fit_server_options(args: argparse.Namespace, profile: str, lines: list[str]) -> dict[str, Any]:
    """The run options a fitted profile's server fills in where the command line set none
    (:func:`dsparksim.cost.fitted.fit_defaults`; {} for another profile); its note, and a caution when a typed
    value differs from the fit's, are appended to ``lines`` (printed once every check has passed)."""
    from dsparksim.cost.fitted import fit_defaults  # lazy: pulls in numpy

    fd = fit_defaults(profile, given_options(args, FIT_GIVEN_KEYS))
    for kind, line in (("note", fd.note(flag_spelling)), ("caution", fd.caution(flag_spelling))):
        if line:
            lines.append(f"dsparksim: {kind}: {line}")
    return dict(fd.used)


def latency_note(cfg: RunConfig, args: argparse.Namespace | None = None, scales: Sequence[float] = ()) -> None:
    """Print the note of a profile with a client-side request latency that the command's TTFT leaves out, (given
    ``args``) that of a typed prefill chunk above the token budget, and that of a trace the duration cuts short
    at one of the time ``scales``."""
    prof = load_run_profile(cfg)
    for note in (request_latency_note(str(cfg.profile), prof.request_latency_s),
                 given_chunk_note(args, cfg, prof) if args is not None else None, trace_note(cfg, scales),
                 given_mixed_note(args, cfg) if args is not None else None):
        if note:
            print(f"dsparksim: note: {note}", file=sys.stderr)


def trace_note(cfg: RunConfig, scales: Sequence[float]) -> str | None:
    """trace_cover_note for a duration-bound trace replay at these time scales (the trace is read once: cached)."""
    from dsparksim.traffic.readers import read_trace  # lazy: pulls in numpy
    from dsparksim.traffic.sources import resolve  # lazy: pulls in numpy

    t = cfg.traffic
    if not t.trace or t.num_requests is not None:
        return None
    tab = read_trace(resolve(t.trace, "trace")[0], t.trace_format)
    return trace_cover_note(float(tab.arrival_s[-1]), t.duration_s, scales)


def given_mixed_note(args: argparse.Namespace, cfg: RunConfig) -> str | None:
    """The note of a --no-mixed-prefill typed beside --disaggregated: a decode-only engine always mixes (its
    first steps ride with the decoding requests, sim/scheduler.py), so the option changes nothing; config.json
    records it as given. (One taken from a fitted profile's server says so in the fit's note.)"""
    if not (cfg.engine.disaggregated and not cfg.engine.mixed_prefill
            and "mixed_prefill" in given_options(args, ("mixed_prefill",))):
        return None
    return ("--no-mixed-prefill changes nothing beside --disaggregated: a decode-only engine always mixes its "
            "requests' first steps with decoding (SGLang's decode server runs no prefill forward); config.json "
            "records mixed_prefill false as given")


def given_chunk_note(args: argparse.Namespace, cfg: RunConfig, prof) -> str | None:
    """prefill_chunk_note for a --prefill-chunk typed on the command line, or taken from a fitted profile's server
    (above a typed --max-batched-tokens); the 2048 default above a small profile's budget, cpu-tiny's 512, is the
    default's business, not a surprise."""
    from dsparksim.cost.fitted import profile_fit_server  # lazy: pulls in numpy

    fitted = profile_fit_server(cfg.profile, unreadable_ok=True).get("prefill_chunk_tokens")
    if not flag_given(args, "--prefill-chunk", "--chunked-prefill-size") and fitted is None:
        return None
    return prefill_chunk_note(cfg.engine.prefill_chunk_tokens, int(cfg.engine.max_batched_tokens or prof.max_tokens))


BASE_CONFIG_NOTE = ("the options every cell shares; each cell sets its own policy and load from 'policies' and 'loads' "
                    "(and its replicas and router from 'deployments')")


def cmd_frontier(args: argparse.Namespace) -> int:
    """`dsparksim frontier`: every policy at every load (and deployment, seed), the frontier and the gains."""
    from tqdm import tqdm  # lazy: only commands that draw a bar (CLI start-up)
    from dsparksim.results.frontier import comparison_table, deployment_label, frontier_table, run_cells  # lazy: pulls in numpy, pandas, pyarrow
    from dsparksim.results.frontier_seeds import comparison_with_intervals, seed_means  # lazy: pulls in numpy, pandas, pyarrow
    from dsparksim.results.plots import plot_frontier, plot_verify_budget  # lazy: pulls in matplotlib, numpy, pandas, pyarrow
    from dsparksim.sim.simulate import write_json, write_table  # lazy: pulls in numpy, scipy, simpy

    policies, slos, slo_warnings = frontier_policies(args)
    base, loads, load_name, deploys, seeds, cfgs, fitted = frontier_cells(args, policies, slo_warnings)
    for w in slo_warnings:   # after every check: a refused command prints its one error line only (notes too)
        print(w, file=sys.stderr)
    latency_note(base, args, loads if args.trace else ())
    jobs = args.workers or min(os.cpu_count() or 1, len(cfgs))
    out = Path(args.out)
    existed = out.is_dir() and any(out.iterdir())
    t0 = time.perf_counter()
    with tqdm(total=len(cfgs), unit="cell", disable=bar_off(args), desc="frontier") as bar:
        summaries = run_cells(cfgs, jobs=jobs, on_done=lambda: bar.update(1), backend=args.backend,
                              ray_address=args.ray_address)
    wall = time.perf_counter() - t0
    names = {"config": "config.json", "frontier_csv": "frontier.csv", "comparison_csv": "comparison.csv",
             "frontier_png": "frontier.png", "verify_budget_png": "verify_budget.png"}
    extra: dict[str, Any] = {}
    if len(seeds) > 1:  # per-seed rows, then means with intervals and paired gain intervals
        per_seed = frontier_table(summaries, cfgs, seeded=True)
        df = seed_means(per_seed)
        comp = comparison_with_intervals(df, per_seed, baseline=args.baseline, slos=slos)
        names["frontier_seeds_csv"] = "frontier_seeds.csv"
        extra = {"seeds": seeds, "interval": "95% Student-t over seeds; gains paired per seed"}
    else:
        df = frontier_table(summaries, cfgs)
        comp = comparison_table(df, baseline=args.baseline, slos=slos)
    gpu_note = _per_gpu(df, base)
    if len(seeds) > 1 and gpu_note is None:
        _per_gpu(per_seed, base)
    many = len({r for r, _ in deploys}) > 1 or max(r for r, _ in deploys) > 1
    if many and gpu_note is None:
        names["frontier_per_gpu_png"] = "frontier_per_gpu.png"
    elif many:
        print(f"dsparksim: note: no per-GPU frontier (frontier_per_gpu.png, output_throughput_tok_s_per_gpu): "
              f"{gpu_note}", file=sys.stderr)
    from dsparksim.sweep.cells import input_hashes  # lazy: pulls in numpy, pandas, pyarrow, scipy, simpy
    with staged_dir(out) as d:  # all the files replace OUT together (dsparksim.results.outputs)
        write_json(d / names["config"], {"base_config": base.to_dict(), "base_config_note": BASE_CONFIG_NOTE,
                                         **({"options_from_profile_fit": fitted} if fitted else {}),
                                         "dsparksim_version": __version__, "input_sha256": input_hashes(base),
                                         "policies": policies, "loads": list(loads),
                                         "load_axis": load_name, "replicas": list(args.replicas),
                                         "routers": list(args.router),
                                         "deployments": [deployment_label(*x) for x in deploys],
                                         **extra, "jobs": jobs, "wall_s": round(wall, 2)})
        if len(seeds) > 1:
            write_table(d / names["frontier_seeds_csv"], per_seed)
        write_table(d / names["comparison_csv"], comp)
        dep_title = "" if len(deploys) == 1 else f" | {len(deploys)} deployments"
        plot_frontier(df, d / names["frontier_png"], title=f"{base.profile} | {base.acceptance} "
                      f"K={base.engine.block_size} | {load_name} {min(loads):g}-{max(loads):g}{dep_title}",
                      slos=slos, load_name=load_name)
        if "frontier_per_gpu_png" in names:
            plot_frontier(df, d / names["frontier_per_gpu_png"], title=f"{base.profile} | per GPU | {load_name} "
                          f"{min(loads):g}-{max(loads):g}{dep_title}", slos=slos, load_name=load_name,
                          x="output_throughput_tok_s_per_gpu")
        plot_verify_budget(df, d / names["verify_budget_png"], load_name=load_name, profile=base.profile)
        write_table(d / names["frontier_csv"], df)
    paths = {k: out / v for k, v in names.items()}
    default_out_note(args, existed)
    warn_incomplete_cells(per_seed if len(seeds) > 1 else df, len(seeds) > 1, load_name == "concurrent users")
    for line in fit_range_cautions(cfgs, summaries):   # runs beyond what a fitted profile's runs covered
        print(line, file=sys.stderr)
    if not args.quiet:
        deps = f" x {len(deploys)} deployments" if len(deploys) > 1 else ""
        reps = f" x {len(seeds)} seeds {seeds[0]}..{seeds[-1]}" if len(seeds) > 1 else ""
        print(f"{len(cfgs)} cells ({len(policies)} policies{deps} x {len(loads)} loads{reps}) in {wall:.1f} s with "
              f"{jobs} jobs")
        print(_comparison_text(df, comp, args.baseline))
        for k, p in paths.items():
            print(f"  {k:18s} {p}")
    return 0


def _per_gpu(df, base: RunConfig) -> str | None:
    """Add ``gpus`` (replicas x GPUs of one replica, from the profile's metadata) and
    ``output_throughput_tok_s_per_gpu`` (with its interval ends, when the table has them) to a frontier table; the
    reason when the profile does not say how many GPUs a replica has (then nothing is added)."""
    from dsparksim.cost.profile import load_profile  # lazy: pulls in numpy
    from dsparksim.plan.spec import gpus_per_replica  # lazy: pulls in numpy, pandas, pyarrow, scipy, simpy

    try:
        g, _ = gpus_per_replica(load_profile(base.profile).metadata, base.engine.dp_ranks)
    except (ValueError, InputError) as e:
        return str(e)
    if not g:
        return "the profile states neither gpus nor tensor_parallel in its metadata"
    df["gpus"] = (df["replicas"].astype(int) * g).astype(int)
    for suffix in ("", "_lo", "_hi"):
        col = "output_throughput_tok_s" + suffix
        if col in df:
            df[f"output_throughput_tok_s_per_gpu{suffix}"] = df[col] / df["gpus"]
    return None


def _gain_cell(r: Any) -> str:
    """'mean +12% [+8..+15] over 1200-3400' (+ '!' on a narrow overlap); '-' when there is no gain to show."""
    g = r["gain_mean"]
    if g is None or g != g:
        return "-" if not r["note"] else "n/a"
    ci = r.get("gain_lo"), r.get("gain_hi")
    ci_txt = (f" (CI {100 * ci[0]:+.1f}..{100 * ci[1]:+.1f})" if "gain_lo" in r and all(
        v is not None and v == v for v in ci) else "")
    mark = " !" if bool(r.get("narrow_overlap")) else ""
    if r["range_lo"] == r["range_hi"]:  # one point: an SLO target, or frontiers that touch at a single value
        return f"{100 * g:+.0f}%{ci_txt}" + (f" at {r['range_lo']:.4g}{mark}" if mark else "")
    txt = (f"{100 * g:+.0f}%{ci_txt} [{100 * r['gain_min']:+.0f}..{100 * r['gain_max']:+.0f}] "
           f"over {r['range_lo']:.4g}-{r['range_hi']:.4g}")
    return txt + mark


def check_fixed_k(policies: Sequence[str], K: int, option: str = "--policy") -> None:
    """A fixed:k with k above the block size K is refused (it would run as fixed:K under its own name); `run`,
    `frontier`, `run-real` and `validate` alike."""
    from dsparksim.policies import make_policy  # lazy: pulls in numpy
    from dsparksim.policies.fixed import Fixed  # lazy: pulls in numpy

    for spec in policies:
        pol = make_policy(spec)
        if isinstance(pol, Fixed) and pol.k > K:
            raise _bad(option, f"{spec} verifies {pol.k} draft tokens but a block holds only K={K} "
                               f"(--num-speculative-tokens); expected fixed:k with k <= {K}")


def preflight(base: RunConfig, policies: Sequence[str], option: str = "--policy") -> None:
    """Load every input the cells will read (profile, each policy's acceptance source, length and trace files) in
    this process, so a bad one is one error line before any cell runs, not a failure inside a worker. A fixed:k
    with k above the block size K is refused (it would run as fixed:K under its own name)."""
    from dsparksim.traffic.readers import read_trace  # lazy: pulls in numpy
    from dsparksim.traffic.sources import resolve  # lazy: pulls in numpy

    check_fixed_k(policies, base.engine.block_size, option)
    cache: dict = {}  # each profile and (acceptance spec, K) is read once across the policies
    for spec in policies:
        resolve_inputs(base.replace(policy=spec), cache=cache)
    t = base.traffic
    for key, val in (("lengths", t.lengths), ("trace", t.trace)):
        if val:
            path, _ = resolve(val, key)
            read_trace(path, t.trace_format if key == "trace" else None)


def _check_session_routers(base: RunConfig, routers: Sequence[str]) -> None:
    """A router that needs session or prefix ids (``session``) on a workload without them fails here, before any
    cell, with the message its cells would give."""
    import numpy as np  # lazy: numpy (CLI start-up)

    from dsparksim.sim.routers import router_class  # lazy: pulls in numpy
    from dsparksim.traffic.build import build_workload  # lazy: pulls in numpy

    need = [r for r in routers if router_class(r)[0].needs_session]
    if not need:
        return
    blk = next(iter(build_workload(base.traffic, np.random.default_rng(base.seed)).iter_blocks()), None)
    if blk is None or len(blk) <= 4 or blk[4] is None:
        raise _bad("--router", f"router '{need[0]}' needs session or prefix ids, which this workload does not carry "
                   "(Mooncake traces carry hash_ids)")


def _slo_list(s: str) -> list[str]:
    """The terms of one --slo value (comma-separated); parsed by :func:`frontier_slos`."""
    vals = [x.strip() for x in s.split(",")]
    if not all(vals):
        raise argparse.ArgumentTypeError(f"expected comma-separated SLO terms like tps_user_median>=50, got {s!r}")
    return vals


# The per-user speed SLO of a frontier: its y axis (tps_user_median; tps_user_p50 is its percentile spelling).
FRONTIER_SLO_METRICS = ("tps_user_median", "tps_user_p50")


def frontier_slos(args: argparse.Namespace) -> tuple[list[float], list[str]]:
    """(the per-user speed targets of `frontier --slo` terms, deprecation warnings to print once every check has
    passed). The terms take the SLO syntax of capacity and plan (``tps_user_median>=X``); a bare number and the
    ``--sla`` spelling still work, deprecated."""
    from dsparksim.sweep.capacity import parse_slo  # lazy: pulls in numpy, pandas, pyarrow, scipy, simpy

    out, bare = [], []
    for t in args.slo or ():
        try:
            out.append(number(t, float, 0.0, True, "a number"))
            bare.append(t)
            continue
        except argparse.ArgumentTypeError:
            pass
        c = parse_slo([t], "cli")[0] if _is_term(t) else None
        if c is None or c.metric not in FRONTIER_SLO_METRICS or c.op not in (">=", ">") or not c.value > 0:
            raise _bad("--slo", f"a frontier compares throughput at a per-user speed target: expected "
                       f"tps_user_median>=X (X > 0; or tps_user_p50>=X), got {t!r}; latency SLOs are searched by "
                       "capacity and plan")
        out.append(c.value)
    warn = []
    if flag_given(args, "--sla"):
        warn.append("dsparksim: warning: --sla is deprecated; use --slo")
    if bare:
        warn.append(f"dsparksim: warning: --slo {','.join(bare)}: a bare number is deprecated; write --slo "
                    f"'tps_user_median>={bare[0]}' (the SLO syntax of capacity and plan)")
    dup = sorted({f"{v:g}" for v in out if out.count(v) > 1})
    if dup:
        raise _bad("--slo", f"lists the target {', '.join(dup)} more than once")
    return out, warn


def _is_term(t: str) -> bool:
    from dsparksim.sweep.capacity import SLO_RE  # lazy: pulls in numpy, pandas, pyarrow, scipy, simpy
    return bool(SLO_RE.match(t))


def check_frontier_loads(args: argparse.Namespace) -> None:
    """Exactly one load axis: --concurrency-levels, --rates, or --trace [--time-scales]; nothing ignored."""
    given = [o for o, v in (("--concurrency-levels", args.concurrency_levels), ("--rates", args.rates)) if v]
    if args.trace and given:
        raise _bad(given[0], f"conflicts with --trace (a replay's load levels are --time-scales); drop {given[0]}")
    if len(given) > 1:
        raise _bad("--rates", "conflicts with --concurrency-levels: closed loop or open loop, not both")
    if args.time_scales and not args.trace:
        raise _bad("--time-scales", "applies to trace replay only (set --trace)")
    if getattr(args, "max_concurrency", None) is not None and not args.rates:
        raise _bad("--max-concurrency", "caps the prompts of --rates levels; with --concurrency-levels (and "
                   "--num-prompts) each level is the client's --max-concurrency at request rate inf")


def _empty_cells(df) -> list[str]:
    if "num_requests_completed" not in df.columns:
        return []
    return _cell_names(df, list(df["num_requests_completed"].fillna(0) <= 0))


def _cell_names(df, flags: list) -> list[str]:
    """'policy@load[ seed S][ (deployment)][: what]' for every row whose flag is set (a string flag is appended)."""
    from dsparksim.results.frontier import series_labels  # lazy: pulls in numpy, pandas, pyarrow

    labels = series_labels(df)
    multi = labels.nunique() > 1
    return [f"{r['policy']}@{r['load']:g}" + (f" seed {r['seed']}" if "seed" in df else "")
            + (f" ({labels[i]})" if multi else "") + (f": {f}" if isinstance(f, str) else "")
            for (i, r), f in zip(df.iterrows(), flags) if f]


def _rejected_text(s: dict[str, Any]) -> str:
    """'151 of 315 issued requests (48%) were rejected on arrival (kv_capacity: 151)', or '' when none was."""
    n = int(s.get("num_requests_rejected") or 0)
    if not n:
        return ""
    issued = int(s.get("num_requests_issued") or 0)
    why = ", ".join(f"{k}: {v}" for k, v in (s.get("rejected_by_reason") or {}).items() if v)
    share = f" ({100 * n / issued:.0f}%)" if issued else ""
    return f"{n} of {issued} issued requests{share} were rejected on arrival" + (f" ({why})" if why else "")


def _rejected_cells(df) -> list[str]:
    """'policy@load: N rejected' for every frontier cell (row) with requests rejected on arrival."""
    if "num_requests_rejected" not in df.columns:
        return []
    bad = df[df["num_requests_rejected"].fillna(0) > 0]
    return [f"{r['policy']}@{r['load']:g}" + (f" seed {r['seed']}" if "seed" in df else "")
            + f": {int(r['num_requests_rejected'])} rejected" for _, r in bad.iterrows()]


def _comparison_text(df, comp, baseline: str) -> str:
    """The frontier summary: per policy (and deployment, when there are several), unsaturated peak, best per-user
    speed, and every gain vs the baseline at the same deployment with the range it was interpolated over; one
    column per --slo target; '!' marks a narrow overlap."""
    from dsparksim.results.frontier import peak_and_best, series_labels  # lazy: pulls in numpy, pandas, pyarrow

    slas = [m for m in dict.fromkeys(comp["metric"]) if m.startswith("throughput_gain_at_slo:")] if len(comp) else []
    cols = [("tps_user_gain_at_matched_throughput", f"user-speed gain vs {baseline} @ same tok/s"),
            ("throughput_gain_at_matched_slo", f"throughput gain vs {baseline} @ same tok/s/user")]
    cols += [(m, f"tput gain @{m.split(':', 1)[1]} tok/s/user") for m in slas]
    labels = series_labels(df)
    multi = labels.nunique() > 1  # one deployment: the table of a single-engine frontier, unchanged
    lead = ["policy", "deployment"] if multi else ["policy"]
    header = lead + ["peak tok/s", "best user tok/s"] + [h for _, h in cols]
    table = [header]
    flagged = False
    for (dep, pol), g in df.groupby([labels, df["policy"]], sort=False):
        peak, best = peak_and_best(g)
        row = [str(pol)] + ([str(dep)] if multi else [])
        row += [f"{peak:.0f}" if peak == peak else "n/a (saturated)", f"{best:.1f}" if best == best else "n/a"]
        for metric, _ in cols:
            c = comp[(comp["policy"] == pol) & (comp["metric"] == metric)] if len(comp) else comp
            if len(c) and "deployment" in c:
                c = c[c["deployment"] == dep]
            if pol == baseline:
                row.append("(baseline)")
            elif c.empty:
                row.append("-")
            else:
                cell = _gain_cell(c.iloc[0])
                flagged |= cell.endswith("!")
                row.append(cell)
        table.append(row)
    widths = [max(len(r[k]) for r in table) for k in range(len(header))]
    lines = ["  ".join(c.ljust(w) if k == 0 else c.rjust(w) for k, (c, w) in enumerate(zip(r, widths))).rstrip()
             for r in table]
    if "gain_lo" in comp.columns:
        n = int(comp["n_seeds"].max()) if len(comp) else 0
        lines.append(f"values are means over {n} seeds; (CI lo..hi): 95% t-interval of the paired per-seed mean "
                     "gain (each seed's policy frontier vs the baseline's frontier of the same seed, same draws)")
    lines.append("gains: mean [min..max] of (policy / baseline - 1) along the overlap of the two Pareto frontiers, "
                 + ("each policy against the baseline at the same deployment (replicas x router), " if multi else "")
                 + "over the stated range (tok/s for user-speed gains, tok/s/user for throughput gains); "
                 "saturated points are never on a frontier; peak tok/s is over unsaturated points.")
    if any(c == "n/a" for r in table[1:] for c in r[len(lead) + 2:]):
        lines.append("n/a: no overlap, or the SLO lies outside a frontier's per-user speed range (see the note "
                     "column of comparison.csv); nothing is extrapolated.")
    if flagged:
        from dsparksim.results.frontier import NARROW_FRACTION, NARROW_MIN_POINTS  # lazy: pulls in numpy, pandas, pyarrow
        lines.append(f"! narrow overlap: the frontiers share less than {NARROW_FRACTION:.0%} of the baseline's range "
                     f"on that axis, or fewer than {NARROW_MIN_POINTS} points of either frontier lie in it: the gain "
                     f"is an edge interpolation, not a frontier-wide result.")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:

    p = _Parser(
        prog="dsparksim",
        description="Discrete-event serving simulator for speculative decoding: compare verification policies "
                    "(none, mtp1, fixed:K, threshold:T, goodput, confidence, confidence-async:LAG, oracle; "
                    "`run --help` lists them all) on a measured cost profile, a drafter's acceptance and your "
                    "traffic.")
    p.add_argument("--version", action="version", version=f"dsparksim {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="simulate one configuration",
                       description="Simulate one policy at one load; writes config.json, summary.json, "
                                   "requests.csv and a vllm-bench-serve-shaped bench_result.json.")
    add_option(r, "policy")
    from dsparksim.policies import list_specs  # lazy: pulls in numpy
    for act in r._actions:
        if act.dest == "policy":   # every spec the registry knows (the top-level help points here)
            act.help = f"policy spec, one of: {', '.join(list_specs())} [%(default)s]"
    add_run_options(r, frontier=False)
    add_out(r, "results/run", "output directory, replaced whole by the new results", result_dir_alias=False)
    add_result_options(r)
    r.add_argument("--save-steps", action="store_true", help="also write the per-step log steps.csv")
    from dsparksim.sim.routers import request_only_names  # lazy: pulls in numpy
    fleet = r.add_argument_group("fleet sharding", "with --backend or --workers, the replicas are cut into one shard "
                                 "per worker and simulated apart, then merged (the same files, bit for bit); only "
                                 "when replicas never interact: a router that decides from the request alone ("
                                 f"{', '.join(request_only_names())}; a closed loop needs one that pins users)")
    add_backend_options(fleet, default=None, backend_help="where the shards run: serial, local process pool or ray "
                                                          "(optional extra) [local when --workers is given]")
    r.add_argument("--quiet", action="store_true",
                   help="print no summary lines or file list (notes, cautions and errors still are)")
    r.set_defaults(func=cmd_run)
    f = sub.add_parser("frontier", help="policies x load levels: frontier, comparison, plots",
                       description="Sweep policies over load levels; writes frontier.csv, comparison.csv, "
                                   "frontier.png, verify_budget.png and config.json.")
    f.add_argument("--policies", default=None,
                   help="comma-separated policy specs [all eight: none, mtp1, fixed:7 (fixed:K at another -K), "
                        "threshold:0.5, goodput, confidence, confidence-async:2, oracle]")
    add_run_options(f, frontier=True)
    from dsparksim.results.stats import MAX_SEEDS, seeds_arg  # lazy: pulls in numpy
    f.add_argument("--seeds", type=seeds_arg, default=1,
                   help="run every cell with N seeds (--seed, --seed+1, ...), the same seeds for every policy "
                        "(paired draws); frontier.csv then holds per-cell means with 95%% t-intervals "
                        "(<metric>_lo, <metric>_hi, n_seeds), frontier_seeds.csv every seed's row, comparison.csv "
                        f"paired per-seed gain intervals, and the plots error bars; at most {MAX_SEEDS} "
                        "[%(default)s]")
    f.add_argument("--baseline", default=None,
                   help="policy the gains are measured against [mtp1 if swept, else the first policy]")
    f.add_argument("--slo", "--sla", dest="slo", type=_slo_list, default=None, action="extend", metavar="SLO",
                   help="per-user speed targets for throughput gains at that speed, comma-separated, in the SLO "
                        "syntax of capacity and plan: tps_user_median>=X (or tps_user_p50>=X); repeatable (a bare "
                        "number X and the --sla spelling are deprecated)")
    add_backend_options(f, default=None,
                        backend_help="where cells run: serial, local process pool or ray (optional extra) [local; "
                                     "serial for 1 worker]; results are identical whatever the backend")
    add_out(f, "results/frontier", "output directory, replaced whole by the new results")
    f.add_argument("--quiet", action="store_true",
                   help="print no comparison table or file list (notes, cautions and errors still are)")
    f.set_defaults(func=cmd_frontier)
    for mod in ("dsparksim.cli.profile", "dsparksim.cli.trace", "dsparksim.cli.sweep",
                "dsparksim.cli.models", "dsparksim.cli.runner", "dsparksim.cli.bench", "dsparksim.cli.study"):
        __import__(mod, fromlist=["register"]).register(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI. Exit codes: 0 success; 1 the command ran but found a problem it reports (failed sweep cells,
    `regress` differences, capacity errors); 2 bad input, impossible configuration or a missing optional extra
    (one line on stderr); 130 interrupted (Ctrl-C); 141 stdout closed early (broken pipe). A traceback means a bug.
    """

    command = None
    try:
        argv = list(sys.argv[1:] if argv is None else argv)
        if not argv:                  # bare `dsparksim`: the command list, not only "arguments are required"
            build_parser().print_help(sys.stderr)
            return 2
        args = build_parser().parse_args(argv)
        args._argv = argv  # which options were typed (see flag_given)
        command = args.command
        return int(args.func(args) or 0)
    except InputError as e:  # bad input or impossible config: one clear line, no traceback
        for line in error_lines(e):   # several independent problems of one spec: one line each
            _stderr_line(f"dsparksim: error: {line}")
        return 2
    except ImportError as e:  # a missing optional extra names what to install; any other import error is a bug
        extra = missing_extra(e, f"dsparksim {command}" if command else None)
        if extra is None:
            raise
        _stderr_line(f"dsparksim: error: {one_line(extra)}")
        return 2
    except KeyboardInterrupt as e:  # pool workers ignore SIGINT and are terminated by the backend on the way out
        # a plain Ctrl-C has no message; one raised while result files were written says which set is incomplete
        _stderr_line(f"dsparksim: interrupted {e}" if str(e) else "dsparksim: interrupted")
        return 130
    except BrokenPipeError:
        # The reader went away (e.g. `| head`): no traceback, and stdout must not be flushed again at exit.
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


def _stderr_line(msg: str) -> None:
    with contextlib.suppress(OSError):
        print(msg, file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
