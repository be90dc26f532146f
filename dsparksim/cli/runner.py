"""`dsparksim measure | validate | audit | run-real`: the torch runner's commands (torch imported lazily)."""
from __future__ import annotations

import math
from dataclasses import replace
import argparse
import json
import os
import sys
from pathlib import Path

from dsparksim.cli.options import (add_seed_option, add_threads_option, bar_off, check_seed, check_threads,
                                   refuse_empty)
from dsparksim.cli.main import (add_draft_len, add_out, add_run_options, check_fixed_k, check_run_args, flag_given,
                                run_config, run_traffic)
from dsparksim.errors import ConfigError
from dsparksim.results.outputs import atomic_write, check_out_dir, claim_out_file, refuse_working_dir, written_by


def _ints(s: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in s.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {s!r}") from None


def _strs(s: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in s.split(",") if x.strip())


DEFAULT_POLICIES = ("mtp1", "fixed:7", "threshold:0.5", "goodput", "confidence", "confidence-async:2")


def _pair(s: str) -> tuple[int, int]:
    v = _ints(s)
    if len(v) != 2 or not 1 <= v[0] <= v[1]:
        raise argparse.ArgumentTypeError(f"expected LO,HI with 1 <= LO <= HI, got {s!r}")
    return v


def _device_args(p: argparse.ArgumentParser, seed: bool = True) -> None:
    g = p.add_argument_group("real engine")
    g.add_argument("--model", default="tiny",
                   help="target: shape name (tiny, small, qwen3-8b), NAME,field=value overrides, or ckpt:PATH "
                        "(random weights unless a checkpoint) [%(default)s]")
    g.add_argument("--device", default="cpu", help="torch device (cpu, cuda) [%(default)s]")
    g.add_argument("--dtype", default=None, help="float32 | bfloat16 | float16 [float32 on CPU, bfloat16 on CUDA]")
    g.add_argument("--drafter-layers", type=int, default=1, help="layers of the drafter proxy [%(default)s]")
    add_threads_option(g)
    if seed:
        add_seed_option(g)
    g.add_argument("--clock", choices=["auto", "wall", "thread"], default="auto",
                   help="step clock: thread CPU time (CPU, 1 thread; immune to other processes' preemption) or "
                        "wall; auto = thread on CPU with --threads 1, else wall [%(default)s]")
    g.add_argument("--temperature", type=float, default=1.0, help="sampling temperature [%(default)s]")


def _live_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("live drafters (instead of trace replay)")
    g.add_argument("--live", action="store_true",
                   help="the trained drafter/target pair in --models drafts and verifies for real (acceptance by "
                        "rejection sampling); the target is MODELS/target.pt (--model and --drafter-layers are refused "
                        "with it, as --models, --live-drafter and --prompts-dir are without it)")
    g.add_argument("--models", default="models", help="trained models directory [%(default)s]")
    g.add_argument("--live-drafter", default="dspark", choices=["dspark", "dflash", "eagle3"],
                   help="drafter of the K-token policies (mtp1 policies use mtp1) [%(default)s]")
    g.add_argument("--prompts-dir", default=None,
                   help="directory with the prompts/*.jsonl files the eval prompts come from [../shared/data/prompts]")


def _measure_args(p: argparse.ArgumentParser) -> None:

    g = p.add_argument_group("profile sweep")
    add_draft_len(g)
    g.add_argument("--n-req", type=_ints, default=None, help="numbers of requests, comma-separated (must include 1)")
    g.add_argument("--contexts", type=_ints, default=None, help="context lengths in tokens, comma-separated")
    g.add_argument("--anchor-context", type=int, default=32,
                   help="also measure the cells at this short context when every --contexts value is longer, so the "
                        "verify staircase (the forward's cost without context, which prefill chunks and short "
                        "requests pay) is measured, not extrapolated from long contexts; 0 = off [%(default)s]")
    g.add_argument("--context-spread-from", default=None, metavar="LENGTHS_CSV",
                   help="spread each cell's contexts like the decode contexts of this workload (columns "
                        "num_prefill_tokens, num_decode_tokens), scaled to the cell's context, instead of evenly over "
                        "[c/2, 3c/2]; the runner pads each attention group to its longest context, so cells spread "
                        "like the served batches price them best (validate: --cell-spread)")
    g.add_argument("--warmup", type=int, default=2, help="discarded steps per cell, at least 1 [%(default)s]")
    g.add_argument("--reps", type=int, default=5,
                   help="timed rounds per cell (every verify length once per round, median), at least 3 "
                        "[%(default)s]")
    g.add_argument("--drift-threshold", type=float, default=0.15,
                   help="re-time a fixed reference cell beside every measurement, bring times to the baseline "
                        "machine speed, and discard (re-measure, counted) a measurement across which the reference "
                        "moved more than this fraction [%(default)s]")
    g.add_argument("--drift-gate", type=float, default=0.25,
                   help="measure only in the machine's fast state: a cell or run window starts (waiting, re-probing) "
                        "and must end with the reference within this fraction of the baseline (the lower quartile "
                        "of 9 calibration probes); 0 = off [%(default)s]")
    g.add_argument("--drift-window", type=float, default=0.25,
                   help="validate: seconds of a real run's measured time between in-run reference timings; each "
                        "step is normalised by its window's timings [%(default)s]")
    g.add_argument("--drift-attempts", type=int, default=None,
                   help="measurements of one cell/run while the machine drifts past the threshold [measure 3, "
                        "validate 1 per repeat]")
    g.add_argument("--no-drift", action="store_true",
                   help="no drift normalisation: raw times, nothing discarded (validate still times and reports "
                        "the reference cell around each run)")
    g.add_argument("--min-growth", type=float, default=1.05,
                   help="refuse the profile as flat if the verify time at the largest M is less than this multiple "
                        "of the time at M=1 [%(default)s]")


def _gate(args) -> float | None:
    if args.drift_gate < 0:
        raise ConfigError("cli", "--drift-gate", f"must be >= 0 (0 = off), got {args.drift_gate}")
    return args.drift_gate or None


def _need_torch() -> None:
    # The torch runner is an optional extra: say so up front instead of a ModuleNotFoundError mid-command.
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        raise ConfigError("cli", "torch", "this command runs the real engine and needs torch: pip install "
                          "'dsparksim[torch]' (the pinned torch==2.13.0, as `train`/`collect` say)")


def _check_engine_args(args) -> None:
    """The real engine's options, before any model is built (hostile-tester findings 2026-12-03: --threads 0
    wrote a profile of garbage, --threads -1 / --seed -3 / --device cuda without CUDA ended in tracebacks)."""

    import torch  # lazy: torch

    check_threads(args)
    check_seed(args)
    if not (math.isfinite(args.temperature) and args.temperature >= 0):
        raise ConfigError("cli", "--temperature", f"expected >= 0 (0 = greedy), got {args.temperature}")
    if args.drafter_layers < 1:
        raise ConfigError("cli", "--drafter-layers", f"expected at least 1 layer, got {args.drafter_layers}")
    if not getattr(args, "live", False):
        from dsparksim.runner.models import parse_model  # lazy: torch
        layers = parse_model(args.model)[0].n_layers
        if args.drafter_layers > layers:   # 1000000 built layers until the machine ran out of memory
            raise ConfigError("cli", "--drafter-layers", f"expected at most the target's {layers} layer(s) (a drafter "
                              f"proxy is a cheaper model than its target), got {args.drafter_layers}")
    try:
        d = torch.device(args.device)
    except RuntimeError:
        raise ConfigError("cli", "--device", f"not a torch device: {args.device!r} (expected cpu, cuda or "
                          "cuda:N)") from None
    if d.type not in ("cpu", "cuda"):
        raise ConfigError("cli", "--device", f"the real engine runs on cpu or cuda, got {args.device!r}")
    if d.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("cli", "--device", f"CUDA is not available to this torch ({torch.__version__}); "
                              "use --device cpu")
        if d.index is not None and d.index >= torch.cuda.device_count():
            raise ConfigError("cli", "--device", f"{args.device!r}: this machine has {torch.cuda.device_count()} "
                              "CUDA device(s)")


LIVE_ONLY = ("--models", "--live-drafter", "--prompts-dir")   # read only with --live
PROXY_ONLY = ("--model", "--drafter-layers")                   # with --live the target is MODELS/target.pt


def _check_live_flags(args, live_ignores: tuple[str, ...] = ()) -> None:
    """An option that --live (or its absence) would ignore is an error, never silently dropped (run-real --live
    --acceptance /nonexistent.csv ran, replaying nothing of it; --models without --live was ignored)."""
    live = getattr(args, "live", False)
    unread = [f for f in ((*PROXY_ONLY, *live_ignores) if live else LIVE_ONLY) if flag_given(args, f)]
    if unread:
        why = ("with --live the trained pair in --models serves (its target is MODELS/target.pt)" if live else
               "it applies to --live only")
        raise ConfigError("cli", unread[0], f"would be ignored: {why}; drop {', '.join(unread)}")


def _check_unread_sweep_flags(args, validate: bool) -> None:
    """Options the command would not read are errors (each was dropped silently): measure's --drift-window (a
    validate option) and its drift options with --no-drift (no reference cell is timed); validate's --pair-baseline
    with --no-pair-cells and --cell-spread beside --context-spread-from (which overrides it)."""
    pairs = [("--drift-window", "it applies to validate's real runs only")] if not validate else []
    if not validate and args.no_drift:
        pairs += [(f, "--no-drift times no reference cell") for f in ("--drift-threshold", "--drift-gate",
                                                                      "--drift-attempts")]
    if validate and (args.no_pair_cells or args.no_drift):
        pairs.append(("--pair-baseline", f"{'--no-pair-cells' if args.no_pair_cells else '--no-drift'} pairs no cell"))
    if validate and args.context_spread_from:
        pairs.append(("--cell-spread", "--context-spread-from sets the cells' contexts"))
    for flag, why in pairs:
        if flag_given(args, flag):
            raise ConfigError("cli", flag, f"would be ignored: {why}; drop {flag}")


def _check_measure_args(args, validate: bool = False) -> None:
    """The profile sweep's options and --out, before any model is built (an unwritable --out used to fail after
    the whole sweep)."""
    if not 1 <= args.block_size <= 15:
        raise ConfigError("cli", "--num-speculative-tokens", f"must be in 1..15 (as the simulator's), got "
                          f"{args.block_size}")
    if args.contexts and len(set(args.contexts)) != len(args.contexts):
        raise ConfigError("cli", "--contexts", f"each context once, got {list(args.contexts)}")
    if not (math.isfinite(args.min_growth) and args.min_growth >= 0):
        raise ConfigError("cli", "--min-growth", f"expected a finite multiple >= 0 (0 = no flatness check), got "
                          f"{args.min_growth}")
    if not (math.isfinite(args.drift_gate) and args.drift_gate >= 0):
        raise ConfigError("cli", "--drift-gate", f"expected a finite fraction >= 0 (0 = off), got {args.drift_gate}")
    refuse_empty(args, "--name", expected="a name (or leave the option out)")
    refuse_empty(args, "--context-spread-from", "--raw", "--acceptance", "--mtp1-acceptance")
    _check_unread_sweep_flags(args, validate)
    if not validate:
        claim_out_file(args.out, "profile", args.force, "--out")
        if args.raw:
            if Path(args.raw).absolute() == Path(args.out).absolute():
                raise ConfigError("cli", "--raw", f"{args.raw!r} is also --out; the raw records need their own file")
            claim_out_file(args.raw, "json", args.force, "--raw")
        return
    if args.profile is not None:
        # the sweep options shape a profile measured in this command; with --profile they would be ignored
        given = [f for f in ("--n-req", "--contexts", "--anchor-context", "--context-spread-from", "--warmup",
                             "--reps", "--min-growth", "--cell-spread") if flag_given(args, f)]
        if given:
            raise ConfigError("cli", given[0], f"shapes the profile measured in this command, but --profile "
                              f"{args.profile} is given; drop {', '.join(given)} or --profile")
    if not args.concurrency or min(args.concurrency) < 1 or len(set(args.concurrency)) != len(args.concurrency):
        raise ConfigError("cli", "--concurrency", f"expected distinct user counts >= 1, got "
                          f"{list(args.concurrency or ())}")
    if args.policies is not None:
        if not args.policies:
            raise ConfigError("cli", "--policies", "expected at least one policy spec")
        if len(set(args.policies)) != len(args.policies):
            raise ConfigError("cli", "--policies", f"each policy once, got {','.join(args.policies)}")
    for flag in ("--requests-per-user", "--prefill-chunk"):
        v = getattr(args, flag[2:].replace("-", "_"))
        if v is not None and v < 1:
            raise ConfigError("cli", flag, f"expected an integer >= 1, got {v}")
    if args.max_error is not None and not args.max_error > 0:
        raise ConfigError("cli", "--max-error", f"expected a fraction > 0 (e.g. 0.10), got {args.max_error}")
    from dsparksim.runner.validate import OUT_NAMES  # lazy: pulls in numpy, pandas, pyarrow, scipy, simpy, torch, tqdm
    out = Path(args.out)
    refuse_working_dir(out, "--out")       # validate cleans an earlier validation's files out of OUT
    check_out_dir(out, "--out", replace=False)
    other = sorted(p.name for p in out.iterdir() if p.name not in OUT_NAMES) if out.is_dir() else []
    if other:
        raise ConfigError("cli", "--out", f"{str(out)!r} holds files that no validation wrote ({', '.join(other[:5])}"
                          f"{', ...' if len(other) > 5 else ''}); choose a new or empty directory")


def _executor(args):
    from dsparksim.runner.executor import ExecutorConfig  # lazy: pulls in numpy, scipy, simpy, torch, tqdm
    dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    return ExecutorConfig(device=args.device, dtype=dtype, drafter_layers=args.drafter_layers, seed=args.seed,
                          threads=args.threads, clock=args.clock, temperature=args.temperature)


def _runner(args, executor):
    from dsparksim.runner.run import RunnerConfig  # lazy: pulls in numpy, scipy, simpy, torch, tqdm
    live = getattr(args, "live", False)
    kw = dict(mode="live", models=args.models, live_drafter=args.live_drafter, prompts_dir=args.prompts_dir) \
        if live else {}
    return RunnerConfig(model=_live_model(args), executor=executor,
                        check_profile=not getattr(args, "no_profile_check", False), **kw)


def _live_model(args) -> str:
    return f"ckpt:{Path(args.models) / 'target.pt'}" if getattr(args, "live", False) else args.model


def _mc(args):
    from dsparksim.runner.grid import MeasureConfig  # lazy: pulls in numpy, scipy, simpy, torch, tqdm
    kw = {"model": _live_model(args), "executor": _executor(args), "K": args.block_size, "warmup": args.warmup,
          "reps": args.reps, "min_growth": args.min_growth, "drift": not args.no_drift,
          "drift_threshold": args.drift_threshold, "drift_gate": _gate(args), "anchor_context": args.anchor_context}
    if args.drift_attempts is not None:
        kw["drift_attempts"] = args.drift_attempts
    if getattr(args, "live", False):
        kw["live_models"] = args.models
        kw["block_drafter"] = args.live_drafter
    if args.n_req:
        kw["n_reqs"] = args.n_req
    if args.contexts:
        kw["contexts"] = args.contexts
    if args.context_spread_from:
        from dsparksim.runner.grid import context_spread_from_csv  # lazy: pulls in numpy, scipy, simpy, torch, tqdm
        kw["context_spread"] = context_spread_from_csv(args.context_spread_from)
    if getattr(args, "name", None):
        kw["name"] = args.name
    return MeasureConfig(**kw)


def cmd_measure(args) -> int:
    _need_torch()
    _check_live_flags(args)
    _check_engine_args(args)
    _check_measure_args(args)
    from dsparksim.runner.measure import measure  # lazy: pulls in numpy, pandas, pyarrow, scipy, simpy, torch, tqdm
    prof, raw = measure(_mc(args), progress=not bar_off(args))
    prof["metadata"]["command"] = "dsparksim " + " ".join(sys.argv[1:])
    out = Path(args.out)
    from dsparksim.cli.profile import save_profile_file  # lazy: pulls in numpy
    # the raw records are written first under a temporary name and renamed only once the profile is saved: a
    # failure in either leaves neither file replaced (it left a new profile without its raw records)
    raw_tmp = Path(args.raw).parent / f".{Path(args.raw).name}.{os.getpid()}.tmp" if args.raw else None
    try:
        if raw_tmp is not None:
            doc = {"written_by": written_by(), **raw}
            atomic_write(raw_tmp, lambda p: p.write_text(json.dumps(doc) + "\n"))
        save_profile_file(prof, out)
        if raw_tmp is not None:
            os.replace(raw_tmp, args.raw)
    finally:
        if raw_tmp is not None:
            raw_tmp.unlink(missing_ok=True)
    fit = prof["metadata"]["fit"]
    print(f"wrote {out}: M 1..{prof['verify']['M'][-1]} ({len(prof['verify']['M'])} breakpoints), verify growth "
          f"{fit['verify_growth']:.2f}x, s/KV token {_g(fit['seconds_per_kv_token'])}, failed cells "
          f"{len(prof['metadata']['failed_cells'])}")
    pf = fit.get("prefill") or {}
    if "seconds_per_chunk" in pf:
        print(f"  prefill: {pf['seconds_per_token']:.3g} s/token, {pf['seconds_per_query_key']:.3g} s/query-key, "
              f"{pf['seconds_per_chunk']:.3g} s/chunk, + per decoding request beside it "
              f"{pf['seconds_per_token_per_decode']:.3g} s/token, {pf['seconds_per_chunk_per_decode']:.3g} s/chunk "
              f"(decode rows {pf['decode_rows']})")
    print(f"  per request: drafter {fit['drafter_per_request']['per_request_s']:.3g} s, host loop "
          f"{fit['host_per_request']['per_request_s']:.3g} s"
          + ("" if not fit.get("context_shape") else "; context s/KV token by context "
             + ", ".join(f"{c}: {v:.3g}" for c, v in fit["context_shape"]["s_per_kv_token_by_context"].items())))
    d = prof["metadata"].get("drift")
    if d:
        print(f"  drift: {100 * d['drift_over_command']:.1f}% over the command ({len(d['reference_s'])} reference "
              f"timings), {d['kept']} measurement(s) kept, {d['discarded']} discarded (threshold "
              f"{100 * d['threshold']:.0f}%)")
    return 0


def _g(v) -> str:
    return "n/a (one context)" if v is None else f"{v:.3g}"


def cmd_validate(args) -> int:
    _need_torch()
    _check_live_flags(args)
    _check_engine_args(args)
    _check_measure_args(args, validate=True)
    from dsparksim.runner.validate import ValidateConfig, validate  # lazy: pulls in numpy, pandas, pyarrow, scipy, simpy, torch, tqdm
    mc = _mc(args)
    acc, acc1 = args.acceptance, args.mtp1_acceptance
    K = args.block_size
    if acc is None and not args.live and K != 7:
        acc = "dspark"          # the shipped sample trace is K=7; another K replays the parametric dspark source
    pols = args.policies or tuple(f"fixed:{K}" if p == "fixed:7" else p for p in DEFAULT_POLICIES)
    check_fixed_k(pols, K, "--policies")
    extra = {}
    for k in ("prompt_tokens", "output_tokens"):
        if getattr(args, k) is not None:
            extra[k] = getattr(args, k)
    if args.prefill_chunk is not None:
        extra["prefill_chunk_tokens"] = args.prefill_chunk
    if args.drift_attempts is not None:
        extra["drift_attempts"] = args.drift_attempts
    if args.live:
        # the simulated side replays traces collected from the same trained pair (`dsparksim collect`)
        acc = acc or f"traces/real_{args.live_drafter}_k{args.block_size}.csv.gz"
        acc1 = acc1 or "traces/real_mtp1_k1.csv.gz"
    if args.live and "output_tokens" not in extra:
        # live: stay inside the traces' horizon (collected over the first 20 blocks per response)
        extra["output_tokens"] = (24, 56)
    if not args.n_req and not args.profile and args.concurrency:
        from dsparksim.runner.validate import dense_n_reqs  # lazy: pulls in numpy, pandas, pyarrow, scipy, simpy, torch, tqdm
        chunk = extra.get("prefill_chunk_tokens", ValidateConfig.prefill_chunk_tokens)
        mc = replace(mc, n_reqs=dense_n_reqs(args.concurrency, K, chunk))
    vc = ValidateConfig(policies=pols, concurrency=args.concurrency, drift_threshold=args.drift_threshold,
                        drift_gate=_gate(args), window_s=args.drift_window,
                        normalise=not args.no_drift, pair_cells=not args.no_pair_cells,
                        pair_baseline=args.pair_baseline, cell_spread=args.cell_spread, acceptance=acc or
                        "traces/sample_dspark_k7.csv", mtp1_acceptance=acc1 or "mtp1", K=args.block_size,
                        requests_per_user=args.requests_per_user, repeats=args.repeats, seed=args.seed, measure=mc, profile=args.profile,
                        runner=_runner(args, mc.executor), **extra)
    validate(vc, args.out, progress=not bar_off(args))
    s = json.loads((Path(args.out) / "summary.json").read_text())["summary"]
    worst = max(s["median_abs_rel_err_throughput"], s["median_abs_rel_err_tps_user_median"])
    d = s["drift"]
    over = (f"all {s['cells']} cells (none steady)" if s["cells_drifting"] == s["cells"]
            else f"{s['cells_in_stats']}/{s['cells']} steady cells")
    print(f"median |rel err| over {over}: throughput "
          f"{100 * s['median_abs_rel_err_throughput']:.1f}% (p95 {100 * s['p95_abs_rel_err_throughput']:.1f}%), "
          f"per-user median {100 * s['median_abs_rel_err_tps_user_median']:.1f}% (p95 "
          f"{100 * s['p95_abs_rel_err_tps_user_median']:.1f}%); drift over the runs "
          f"{100 * d['drift_over_command']:.1f}%, {d['discarded']} run(s) discarded; all cells: throughput "
          f"{100 * s['median_abs_rel_err_throughput_all_cells']:.1f}% (p95 "
          f"{100 * s['p95_abs_rel_err_throughput_all_cells']:.1f}%), per-user median "
          f"{100 * s['median_abs_rel_err_tps_user_median_all_cells']:.1f}% (p95 "
          f"{100 * s['p95_abs_rel_err_tps_user_median_all_cells']:.1f}%); report {args.out}/REPORT.md")
    if args.max_error is not None and worst > args.max_error:
        print(f"FAIL: median relative error {100 * worst:.1f}% > {100 * args.max_error:.1f}%", file=sys.stderr)
        return 1
    return 0


def _check_audit_args(args) -> None:
    """Every audit option before any sampling (a zero step count made every lossless policy 'look biased' at
    p = nan, and an unwritable --out raised after the whole audit)."""
    if args.steps < 1:
        raise ConfigError("cli", "--steps", f"expected at least 1 engine step per setting, got {args.steps}")
    check_seed(args)
    if args.live and args.requests < 1:
        raise ConfigError("cli", "--requests", f"expected at least 1 request per policy, got {args.requests}")
    if not 0.0 < args.alpha < 1.0:
        raise ConfigError("cli", "--alpha", f"expected a significance level in (0, 1), got {args.alpha:g}")
    refuse_empty(args, "--out", "--profile", "--models", "--prompts-dir")
    unread = [f for f in (("--steps",) if args.live else ("--models", "--requests", "--profile", "--prompts-dir"))
              if flag_given(args, f)]
    if unread:
        why = ("the live audit runs --requests requests, not synthetic steps" if args.live else
               "it applies to the live audit (--live) only")
        raise ConfigError("cli", unread[0], f"would be ignored: {why}; drop {', '.join(unread)}")
    if args.out:
        claim_out_file(args.out, "audit", args.force, "--out")
    elif args.force:
        raise ConfigError("cli", "--force", "has no effect without --out (audit writes nothing else)")


def _write_rows(path: str, rows) -> None:
    atomic_write(Path(path), lambda p: p.write_text(json.dumps(rows, indent=2) + "\n"))


def cmd_audit(args) -> int:
    from dsparksim.runner.audit import LOSSLESS, RECALIBRATED, audit_all  # lazy: pulls in numpy, scipy
    _check_audit_args(args)
    recal = getattr(args, "recalibrate", False)
    lossless_set = RECALIBRATED if recal else LOSSLESS
    if args.live:
        return _audit_live(args, lossless_set)
    if recal:
        # the recalibrated lossless readers; the power check (confidence-global must be caught) runs unwrapped:
        # recalibrated, the Appendix-A confidences drop so low that the global search verifies nothing (no bias)
        rows = audit_all(steps=args.steps, seed=args.seed, policies=lossless_set, recalibrate=True)
        rows += audit_all(steps=args.steps, seed=args.seed, policies=("confidence-global",))
    else:
        rows = audit_all(steps=args.steps, seed=args.seed, policies=lossless_set + ("confidence-global",))
    bad = 0
    for r in rows:
        lossless = not r["policy"].startswith("confidence-global")
        ok = (r["p_value"] > args.alpha) if lossless else True
        flag = "" if ok else "  <-- FAILS (lossless policy looks biased)"
        if not lossless and r["setting"] == "appendix_a" and r["p_value"] > args.alpha:
            flag = "  <-- NOT DETECTED (non-causal variant should be biased)"
            ok = False
        bad += not ok
        print(f"{r['setting']:>10} {r['policy']:>20} tokens={r['tokens']:>6} chi2={r['chi2']:8.2f} dof={r['dof']} "
              f"p={r['p_value']:.3g}{flag}")
    if args.out:
        _write_rows(args.out, rows)
    return 1 if bad else 0


def _audit_live(args, policies) -> int:
    from dsparksim.runner.audit_live import audit_live  # lazy: pulls in numpy, scipy, simpy, torch, tqdm
    rows = audit_live(args.models, args.profile, policies, n_requests=args.requests, seed=args.seed,
                      prompts_dir=args.prompts_dir, recalibrate=getattr(args, "recalibrate", False))
    bad = 0
    for r in rows:
        ok = r["p_value"] > args.alpha
        bad += not ok
        print(f"live {r['policy']:>20} requests={r['requests']} tokens={r['tokens_tested']} chi2={r['chi2']:7.2f} "
              f"dof={r['dof']} p={r['p_value']:.3g} tau={r['tau']:.2f} verify={r['mean_verify_len']:.2f}"
              + ("" if ok else "  <-- FAILS (lossless policy looks biased)"))
    if args.out:
        _write_rows(args.out, rows)
    return 1 if bad else 0


def cmd_run_real(args) -> int:
    from dsparksim.sim.simulate import write_run  # lazy: pulls in numpy, scipy, simpy

    check_run_args(args)  # options and the output directory, before the engine starts
    _need_torch()
    # live: the trained drafter's own acceptance replaces --acceptance / --mtp1-acceptance
    _check_live_flags(args, ("--acceptance", "--mtp1-acceptance"))
    _check_engine_args(args)
    from dsparksim.runner.run import real_run  # lazy: pulls in numpy, scipy, simpy, torch, tqdm

    if args.profile is None:    # the shipped profile of this machine's CPU target, measured for the mode
        args.profile = "cpu-tiny-live" if args.live else "cpu-tiny"
    cfg = run_config(args).replace(traffic=run_traffic(args, default_concurrency=8))
    check_fixed_k([cfg.policy], cfg.engine.block_size)
    out = real_run(cfg, _runner(args, _executor(args)))
    paths = write_run(out, args.out, fmt=args.format, steps=True)
    s = out.summary
    _warn_beyond_measured(out)
    if not args.quiet:
        # a run in which no request finished has no per-user speed (None): "n/a", as `run` prints it
        print(f"real run, policy {s['policy']}: {s['num_requests_completed']} requests, output throughput "
              f"{_num(s['output_throughput_tok_s'], 1)} tok/s, per-user median {_num(s['tps_user_median'], 1)} "
              f"tok/s, tau {_num(s['tau'], 2)}, mean verify len {_num(s['mean_verify_len'], 2)}")
        for k, p in paths.items():
            print(f"  {k:9s} {p}")
    return 0


def _num(v, nd: int) -> str:
    return "n/a" if v is None else f"{v:.{nd}f}"


def _warn_beyond_measured(out) -> None:
    """Say so when served requests reached contexts beyond the profile's measured cells (their contexts span up
    to 1.5x the largest grid context): the policies priced those steps by extrapolating the context term."""
    grid = (out.inputs["profile"]["metadata"] or {}).get("grid") or {}   # the run's own profile, as it loaded it
    if not grid.get("contexts"):
        return
    top = 1.5 * max(grid["contexts"])
    req = out.requests()
    ctx = (req["prompt_tokens"] + req["emitted_tokens"])[~req["rejected"].astype(bool)]
    beyond = int((ctx > top).sum())
    if beyond:
        print(f"dsparksim: warning: {beyond} of {len(ctx)} requests reached contexts above {top:.0f} tokens (up to "
              f"{int(ctx.max())}), beyond the profile's measured cells (grid contexts {grid['contexts']}); the "
              "policies priced those steps by extrapolating its context term (measure --contexts to cover them)",
              file=sys.stderr)


def register(sub) -> None:
    p = sub.add_parser("measure", help="measure a cost profile on the real (torch) engine",
                       description="Sweep n_req x uniform verify length x context on the real engine and write a "
                                   "dsparksim-profile/1 JSON (floor separated from the verify term).")
    _device_args(p)
    _measure_args(p)
    _live_args(p)
    p.add_argument("--out", "-o", required=True, help="profile JSON to write (an existing file only if dsparksim "
                                                      "wrote it)")
    p.add_argument("--force", action="store_true",
                   help="replace an existing --out file that dsparksim wrote (never any other file)")
    p.add_argument("--name", default=None, help="profile name [DEVICE-MODEL]")
    p.add_argument("--raw", default=None, help="also write the raw per-step records (JSON; an existing file only if "
                                                "dsparksim wrote it)")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_measure)

    v = sub.add_parser("validate", help="real (trace-replay) vs simulated runs, with the profile measured first")
    _device_args(v)
    _measure_args(v)
    _live_args(v)
    v.add_argument("--policies", type=_strs, default=None,
                   help="policy specs, comma-separated; policies that read the true accepted length (oracle) are "
                        "refused before any measurement [" + ",".join(DEFAULT_POLICIES) + "; fixed:7 -> fixed:K]")
    v.add_argument("--concurrency", type=_ints, default=(1, 4, 16))
    v.add_argument("--acceptance", default=None,
                   help="acceptance trace the simulated side (and trace replay) uses [traces/sample_dspark_k7.csv; "
                        "with --live traces/real_<drafter>_k<K>.csv.gz]")
    v.add_argument("--mtp1-acceptance", default=None,
                   help="mtp1 acceptance [mtp1 (parametric); with --live traces/real_mtp1_k1.csv.gz]")
    v.add_argument("--requests-per-user", type=int, default=8,
                   help="closed-loop requests per user (at least 16 per cell) [%(default)s]")
    v.add_argument("--prompt-tokens", type=_pair, default=None,
                   help="prompt length range LO,HI in tokens, drawn uniformly (e.g. 768,1280 for ~1k contexts, "
                        "3584,4608 for ~4k; measure --contexts around them, a short anchor context is added) [16,64]")
    v.add_argument("--output-tokens", type=_pair, default=None, help="output length range LO,HI [32,96]")
    v.add_argument("--prefill-chunk", type=int, default=None, help="prefill chunk tokens per step [128]")
    v.add_argument("--repeats", type=int, default=5,
                   help="real runs per cell; they run the same steps, and each step's time is the median over "
                        "them; a cell is steady when half its runs are [%(default)s]")
    v.add_argument("--no-pair-cells", action="store_true",
                   help="normalise real steps by the drift windows' reference cell only, instead of re-timing the "
                        "profile cell nearest each decode step right after it (paired cells: proxy cells in trace "
                        "replay, live-step cells with --live)")
    v.add_argument("--pair-baseline", choices=("fit", "cell"), default="fit",
                   help="a paired cell's reference time: the profile's own price of its shape (fit), or its raw "
                        "median when profiled (cell; a 5-step median scatters by several %% on a shared CPU) "
                        "[%(default)s]")
    v.add_argument("--cell-spread", choices=("even", "workload"), default="even",
                   help="contexts of the profile's cells: evenly over [c/2, 3c/2] (even), or spread like this "
                        "validation's own decode contexts (workload); --context-spread-from overrides both "
                        "[%(default)s]")
    v.add_argument("--profile", default=None,
                   help="use this profile measured earlier by `dsparksim measure` for the same model/device "
                        "(default: measure it now, in this command)")
    v.add_argument("--max-error", type=float, default=None,
                   help="exit 1 if the median |relative error| of throughput or per-user median exceeds this (0.10)")
    v.add_argument("--out", "-o", required=True, help="report directory")
    v.add_argument("--quiet", action="store_true")
    v.set_defaults(func=cmd_validate)

    r = sub.add_parser("run-real", help="serve one configuration on the real (torch) engine, trace-replay acceptance",
                       description="Like `dsparksim run`, but every step is executed for real (one flattened target "
                                   "forward per step, drafter-proxy forward, sampling) and timed; writes the same "
                                   "result files (plus steps.csv), so real and simulated runs load into one frontier.")
    r.add_argument("--policy", default="confidence", help="policy spec [%(default)s]")
    add_run_options(r, frontier=False)
    _device_args(r, seed=False)
    _live_args(r)
    r.add_argument("--no-profile-check", action="store_true",
                   help="allow a profile measured for another model/device (its metadata is otherwise checked)")
    add_out(r, "results/run-real", "output directory, replaced whole by the new results")
    r.add_argument("--quiet", action="store_true")
    r.set_defaults(func=cmd_run_real, profile=None, acceptance="traces/sample_dspark_k7.csv")
    for act in r._actions:      # the shared option's help names the simulator's default; say what run-real uses
        if act.dest == "profile":
            act.help = ("cost profile: shipped name or JSON path, measured for this model and device [cpu-tiny; "
                        "with --live cpu-tiny-live]")

    a = sub.add_parser("audit", help="statistical test that lossless policies keep the target distribution")
    a.add_argument("--steps", type=int, default=6000, help="engine steps per synthetic setting [%(default)s]")
    add_seed_option(a)
    a.add_argument("--alpha", type=float, default=1e-3, help="significance level [%(default)s]")
    a.add_argument("--out", default=None, help="write the results as JSON (an existing file only if an audit wrote it)")
    a.add_argument("--force", action="store_true",
                   help="replace an existing --out file that dsparksim wrote (never any other file)")
    a.add_argument("--recalibrate", action="store_true",
                   help="audit the confidence-reading policies wrapped in online recalibration (the --recalibrate of "
                        "a run; the non-causal confidence-global must still be caught)")
    g = a.add_argument_group("live audit (the real engine with the trained drafters)")
    g.add_argument("--live", action="store_true",
                   help="audit the batched real engine with the trained pair instead of the synthetic Markov settings")
    g.add_argument("--models", default="models", help="trained models directory [%(default)s]")
    g.add_argument("--requests", type=int, default=2000, help="requests per policy (3 tokens each) [%(default)s]")
    g.add_argument("--profile", default="cpu-tiny-live",
                   help="profile the policies price steps with [%(default)s]")
    g.add_argument("--prompts-dir", default=None, help="prompts directory [../shared/data/prompts]")
    a.set_defaults(func=cmd_audit)
