"""Command-line interface: `dsparksim run | frontier | profile | trace`."""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from dsparksim.config import EngineConfig, RunConfig
from dsparksim.errors import ConfigError, InputError

DEFAULT_DURATION_S = 60.0


def _floats(s: str) -> list[float]:
    try:
        return [float(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {s!r}") from None


def _add_common(p: argparse.ArgumentParser, frontier: bool) -> None:
    g = p.add_argument_group("inputs")
    g.add_argument("--profile", default="h100-llama2-7b-tp1",
                   help="cost profile: shipped name (see `dsparksim profile list`) or JSON path [%(default)s]")
    g.add_argument("--acceptance", default="dspark",
                   help="block drafter acceptance: parametric name (dspark, dflash, eagle3), acceptance-trace file, "
                        "vllm:PATH, sglang:PATH or tau:X [%(default)s]")
    g.add_argument("--mtp1-acceptance", default="mtp1",
                   help="acceptance source the mtp1 baseline runs with [%(default)s]")
    g.add_argument("--block-size", "-K", type=int, default=7, help="draft block size K [%(default)s]")
    t = p.add_argument_group("traffic (closed loop by default)")
    if frontier:
        t.add_argument("--concurrency-levels", type=_floats, default=None,
                       help="closed-loop load levels (users), comma-separated [1,2,4,8,16,32,64,96,128]")
        t.add_argument("--rates", type=_floats, default=None,
                       help="open-loop load levels (req/s), comma-separated; uses Poisson/gamma arrivals")
        t.add_argument("--time-scales", type=_floats, default=None,
                       help="trace replay load levels (arrival-rate multipliers), comma-separated")
    else:
        x = t.add_mutually_exclusive_group()
        x.add_argument("--concurrency", type=int, help="closed loop with N concurrent users [32 if nothing else]")
        x.add_argument("--rate", type=float, help="open loop, mean arrival rate in req/s")
        x.add_argument("--trace", help="replay an arrival trace: an Azure 2023 CSV or Mooncake JSONL path, or a shipped window "
                                       "(azure-conv-window, azure-code-window, mooncake-window)")
        t.add_argument("--time-scale", type=float, default=1.0, help="trace replay rate multiplier [%(default)s]")
    if frontier:
        t.add_argument("--trace", help="replay an arrival trace at each --time-scales level")
    t.add_argument("--burstiness", type=float, default=1.0,
                   help="open loop: gamma shape (1 = Poisson, <1 burstier), as vllm bench serve [%(default)s]")
    t.add_argument("--arrival", choices=["poisson", "gamma", "constant"], default=None,
                   help="open-loop arrival process [poisson, or gamma when --burstiness != 1]")
    t.add_argument("--mooncake-spread", action="store_true",
                   help="Mooncake replay: spread each ~3 s timestamp group over the gap (default: fire at once)")
    t.add_argument("--lengths", default=None,
                   help="prompt/output length source, resampled: azure-conv (shipped sample), azure-code, sharegpt, "
                        "arxiv, or a CSV/JSONL path [azure-conv; a replayed trace's own lengths]")
    t.add_argument("--domain", default="mix:math=1,code=1,chat=1",
                   help="domain of each request: math | code | chat | mix:math=W,code=W,chat=W [%(default)s]")
    d = t.add_mutually_exclusive_group()
    d.add_argument("--duration", type=float, default=None, help=f"simulated seconds [{DEFAULT_DURATION_S:g}]")
    d.add_argument("--num-requests", type=int, default=None, help="serve exactly N requests, then stop")
    t.add_argument("--warmup", type=float, default=None,
                   help="seconds excluded from the metrics [10%% of --duration; 0 with --num-requests]")
    e = p.add_argument_group("engine")
    e.add_argument("--kv-capacity", type=int, default=None, help="KV capacity in tokens [profile's value]")
    e.add_argument("--max-num-seqs", type=int, default=1024, help="most running requests [%(default)s]")
    e.add_argument("--max-batched-tokens", type=int, default=None,
                   help="token budget per target forward [profile's largest breakpoint]")
    e.add_argument("--prefill-chunk", type=int, default=2048, help="chunked-prefill tokens per step [%(default)s]")
    e.add_argument("--extrapolate", action="store_true",
                   help="allow cost lookups beyond the profile's last breakpoint (reported in the summary)")
    p.add_argument("--seed", type=int, default=0, help="random seed [%(default)s]")
    p.add_argument("--format", choices=["csv", "parquet"], default="csv", help="per-request table format")


def _traffic(args: argparse.Namespace, mode: str, **over: Any):
    from dsparksim.traffic import TrafficConfig

    duration = args.duration if args.num_requests is None else None
    if duration is None and args.num_requests is None:
        duration = DEFAULT_DURATION_S
    arrival = args.arrival or ("gamma" if args.burstiness != 1.0 else "poisson")
    kw: dict[str, Any] = dict(mode=mode if mode != "open" else arrival, lengths=args.lengths, domain=args.domain,
                              num_requests=args.num_requests, duration_s=duration)
    if kw["mode"] == "gamma":
        kw["burstiness"] = args.burstiness
    elif args.burstiness != 1.0:
        raise ConfigError("cli", "--burstiness", f"only applies to gamma arrivals (got --arrival {kw['mode']})")
    if args.mooncake_spread:
        kw["mooncake_spread"] = True
    kw.update(over)
    # Closed loop needs no pool: requests are generated lazily as users need them (traffic.base), so a cell never
    # depends on the other load levels of a frontier or sweep.
    return TrafficConfig(**kw)


def run_traffic(args: argparse.Namespace, default_concurrency: int):
    """The traffic of one run from `run`-style options: --trace | --rate | --concurrency (the default)."""
    if args.trace:
        return _traffic(args, "trace", trace=args.trace, time_scale=args.time_scale)
    if args.rate is not None:
        return _traffic(args, "open", rate=args.rate)
    return _traffic(args, "closed", concurrency=args.concurrency or default_concurrency)


def _run_config(args: argparse.Namespace, traffic) -> RunConfig:
    eng = EngineConfig(block_size=args.block_size, kv_capacity_tokens=args.kv_capacity,
                       max_num_seqs=args.max_num_seqs, max_batched_tokens=args.max_batched_tokens,
                       prefill_chunk_tokens=args.prefill_chunk, extrapolate=args.extrapolate)
    return RunConfig(policy=getattr(args, "policy", "confidence"), profile=args.profile, acceptance=args.acceptance,
                     mtp1_acceptance=args.mtp1_acceptance, engine=eng, traffic=traffic, warmup_s=args.warmup,
                     seed=args.seed)


def cmd_run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from dsparksim.simulate import simulate, write_run

    traffic = run_traffic(args, default_concurrency=32)
    cfg = _run_config(args, traffic)
    t0 = time.perf_counter()
    total = traffic.duration_s
    with tqdm(total=total, unit="sim-s", disable=args.quiet or total is None, leave=False,
              bar_format="{l_bar}{bar}| {n:.1f}/{total:.0f} sim-s [{elapsed}<{remaining}]") as bar:
        out = simulate(cfg, progress=(lambda now: bar.update(min(now, total) - bar.n)) if total else None)
    wall = time.perf_counter() - t0
    paths = write_run(out, args.out, fmt=args.format, steps=args.save_steps)
    s = out.summary
    if not args.quiet:
        print(f"policy {s['policy']}: {s['num_requests_completed']} requests in {s['window_s']:.1f} s measured "
              f"({s['sim_time_s']:.1f} s simulated, {wall:.1f} s wall)")
        print(f"  output throughput {s['output_throughput_tok_s']:.1f} tok/s | per-user median "
              f"{_f(s['tps_user_median'])} tok/s | TTFT median {_f(s['ttft_median_s'], 3)} s | "
              f"tau {_f(s['tau'], 2)} | mean verify len {_f(s['mean_verify_len'], 2)} | "
              f"saturated {s['saturated']}")
        for k, p in paths.items():
            print(f"  {k:9s} {p}")
    return 0


def _f(v: Any, nd: int = 1) -> str:
    return "n/a" if v is None else f"{v:.{nd}f}"


def cmd_frontier(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from dsparksim.frontier import (DEFAULT_CONCURRENCY, DEFAULT_POLICIES, cells, comparison_table,
                                    frontier_table, run_cells)
    from dsparksim.plots import plot_frontier, plot_verify_budget
    from dsparksim.policies import make_policy
    from dsparksim.simulate import write_json, write_table

    policies = [p.strip() for p in args.policies.split(",")] if args.policies else list(DEFAULT_POLICIES)
    for p in policies:
        make_policy(p)  # fail fast on a bad spec, before any cell runs
    if args.trace:
        loads, traffic, load_name = args.time_scales or [0.5, 1, 2, 4], _traffic(args, "trace", trace=args.trace,
                                                                               time_scale=1.0), "trace time scale"
    elif args.rates:
        loads, traffic, load_name = args.rates, _traffic(args, "open", rate=args.rates[0]), "arrival rate (req/s)"
    else:
        loads = args.concurrency_levels or list(DEFAULT_CONCURRENCY)
        traffic = _traffic(args, "closed", concurrency=int(max(loads)))
        load_name = "concurrent users"
    base = _run_config(args, traffic)
    cfgs = cells(base, policies, loads)
    jobs = args.jobs or min(os.cpu_count() or 1, len(cfgs))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with tqdm(total=len(cfgs), unit="cell", disable=args.quiet, desc="frontier") as bar:
        summaries = run_cells(cfgs, jobs=jobs, on_done=lambda: bar.update(1))
    wall = time.perf_counter() - t0
    df = frontier_table(summaries)
    comp = comparison_table(df, baseline=args.baseline, slas=args.sla or ())
    paths = {"config": out / "config.json", "frontier_csv": out / "frontier.csv",
             "comparison_csv": out / "comparison.csv", "frontier_png": out / "frontier.png",
             "verify_budget_png": out / "verify_budget.png"}
    write_json(paths["config"], {"base_config": base.to_dict(), "policies": policies, "loads": list(loads),
                                 "load_axis": load_name, "jobs": jobs, "wall_s": round(wall, 2)})
    write_table(paths["comparison_csv"], comp)
    plot_frontier(df, paths["frontier_png"], title=f"{base.profile} | {base.acceptance} K={base.engine.block_size}"
                                                   f" | {load_name} {min(loads):g}-{max(loads):g}")
    plot_verify_budget(df, paths["verify_budget_png"], load_name=load_name)
    write_table(paths["frontier_csv"], df)  # last: its presence means the sweep completed
    if not args.quiet:
        print(f"{len(cfgs)} cells ({len(policies)} policies x {len(loads)} loads) in {wall:.1f} s with {jobs} jobs")
        print(_comparison_text(df, comp, args.baseline))
        for k, p in paths.items():
            print(f"  {k:18s} {p}")
    return 0


def _comparison_text(df, comp, baseline: str) -> str:
    lines = [f"{'policy':22s} {'peak tok/s':>11s} {'best user tok/s':>15s} "
             f"{'user-speed gain vs ' + baseline:>26s} {'throughput gain @SLA':>21s}"]
    for pol, g in df.groupby("policy", sort=False):
        row = [f"{pol:22s}", f"{g['output_throughput_tok_s'].max():11.0f}", f"{g['tps_user_median'].max():15.1f}"]
        for metric in ("tps_user_gain_at_matched_throughput", "throughput_gain_at_matched_sla"):
            c = comp[(comp["policy"] == pol) & (comp["metric"] == metric)] if len(comp) else comp
            if pol == baseline or c.empty or c.iloc[0]["gain_mean"] is None or c.iloc[0]["gain_mean"] != c.iloc[0]["gain_mean"]:
                row.append(f"{'-':>26s}" if metric.startswith("tps") else f"{'-':>21s}")
            else:
                r = c.iloc[0]
                txt = f"{100 * r['gain_min']:+.0f}..{100 * r['gain_max']:+.0f}% (mean {100 * r['gain_mean']:+.0f}%)"
                row.append(f"{txt:>26s}" if metric.startswith("tps") else f"{txt:>21s}")
        lines.append(" ".join(row))
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dsparksim",
        description="Discrete-event serving simulator for speculative decoding: compare verification policies "
                    "(mtp1, fixed:K, threshold:T, goodput, confidence, confidence-async:LAG, oracle) on a measured "
                    "cost profile, a drafter's acceptance and your traffic.")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="simulate one configuration",
                       description="Simulate one policy at one load; writes config.json, summary.json, "
                                   "requests.csv and a vllm-bench-serve-shaped bench_result.json.")
    r.add_argument("--policy", default="confidence", help="policy spec, e.g. confidence, fixed:7 [%(default)s]")
    _add_common(r, frontier=False)
    r.add_argument("--out", default="results/run", help="output directory [%(default)s]")
    r.add_argument("--save-steps", action="store_true", help="also write the per-step log steps.csv")
    r.add_argument("--quiet", action="store_true")
    r.set_defaults(func=cmd_run)
    f = sub.add_parser("frontier", help="policies x load levels: frontier, comparison, plots",
                       description="Sweep policies over load levels; writes frontier.csv, comparison.csv, "
                                   "frontier.png, verify_budget.png and config.json.")
    f.add_argument("--policies", default=None, help="comma-separated policy specs [all seven]")
    _add_common(f, frontier=True)
    f.add_argument("--baseline", default="mtp1", help="policy the gains are measured against [%(default)s]")
    f.add_argument("--sla", type=_floats, default=None, help="per-user tokens/s targets for throughput gains")
    f.add_argument("--jobs", type=int, default=None, help="worker processes [all cores]")
    f.add_argument("--out", default="results/frontier", help="output directory [%(default)s]")
    f.add_argument("--quiet", action="store_true")
    f.set_defaults(func=cmd_frontier)
    for mod in ("dsparksim.cli_profile", "dsparksim.cli_trace", "dsparksim.cli_sweep",
                "dsparksim.cli_models", "dsparksim.cli_runner"):
        __import__(mod, fromlist=["register"]).register(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except InputError as e:  # bad input or impossible config: one clear line, no traceback
        print(f"dsparksim: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
