"""``dsparksim trace inspect``: look inside an acceptance trace file or a parametric acceptance spec.

Wire with ``register(subparsers)``; the subcommand sets ``func(args) -> exit code`` (0 ok, 2 bad input).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from dsparksim.cli.options import add_seed_option, check_seed
from dsparksim.errors import InputError
from dsparksim.cli.main import pos_int

MAX_BLOCKS = 1_000_000   # simulated blocks per domain: ~1.5 GB peak at the limit (three domains), 28 s


def register(subparsers) -> None:
    """Add ``trace inspect`` to an argparse subparsers object."""
    p = subparsers.add_parser("trace", help="acceptance traces: inspect recorded or simulated draft blocks")
    sub = p.add_subparsers(dest="trace_cmd", metavar="{inspect}")
    sub.required = True
    q = sub.add_parser("inspect", help="metadata, tau, per-position acceptance (95%% CI), confidence ECE/AUC (per position: DeepSpec's)",
                       description="TARGET is a trace file (.csv, .csv.gz, .parquet) or an acceptance spec "
                                   "(dspark, dflash, eagle3, mtp1, tau:X, vllm:PATH, sglang:PATH; specs are "
                                   "simulated).")

    q.add_argument("target", help="trace path or acceptance spec")
    q.add_argument("--K", type=pos_int, default=None,
                   help="block size (trace: default the trace's K, smaller truncates; spec: default 7, mtp1 1)")
    q.add_argument("--blocks", type=int, default=20000,
                   help=f"simulated blocks per domain for a spec (default 20000, at most {MAX_BLOCKS:,})")
    q.add_argument("--blocks-per-request", type=int, default=20, help="simulated blocks per request (default 20)")
    add_seed_option(q, help="simulation seed (default 0)")
    q.add_argument("--json", action="store_true", help="print the summary as JSON")
    q.set_defaults(func=inspect_command)


def _clean(x: Any) -> Any:
    """JSON-safe: NaN/inf -> None, numpy scalars -> Python, int dict keys -> str."""
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if hasattr(x, "item") and not isinstance(x, (str, bytes)):
        try:
            x = x.item()
        except (ValueError, AttributeError):
            return str(x)
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def build_summary(args: argparse.Namespace) -> dict:
    """The summary dict for a trace path or a spec (used by the command and tests)."""
    from dsparksim.acceptance import load_acceptance, parse_spec  # lazy: pulls in numpy, scipy
    from dsparksim.acceptance.mtp import K_MAX_MTP  # lazy: pulls in numpy, scipy
    from dsparksim.acceptance.summary import summarize_model, summarize_trace  # lazy: pulls in numpy, pandas, pyarrow, scipy
    from dsparksim.acceptance.trace_format import read_trace  # lazy: pulls in numpy, pandas, pyarrow, scipy

    target = args.target.strip()
    ps = parse_spec(target)
    if ps.kind == "trace":
        trace = read_trace(ps.path)
        if args.K is not None and args.K != trace.K:
            trace = trace.truncated(args.K)
        return summarize_trace(trace)
    K = args.K if args.K is not None else (1 if ps.kind == "parametric" and ps.name == "mtp1" else
                                           K_MAX_MTP if ps.kind == "mtp" else 7)
    if args.blocks < 2 or args.blocks_per_request < 1:
        raise InputError("trace inspect", "--blocks", "need --blocks >= 2 and --blocks-per-request >= 1")
    n_req = max(2, -(-args.blocks // args.blocks_per_request))   # whole requests, as summarize_model draws them
    if n_req * args.blocks_per_request > MAX_BLOCKS:
        raise InputError("trace inspect", "--blocks", f"{n_req:,} requests x {args.blocks_per_request:,} blocks per "
                         f"domain is above the limit of {MAX_BLOCKS:,} simulated blocks per domain")
    return summarize_model(load_acceptance(target, K), args.blocks, args.blocks_per_request, args.seed)


def _fmt(v: Any, nd: int = 3) -> str:
    return "-" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{v:.{nd}f}"


def render_text(s: dict) -> str:
    """Human-readable report."""
    lines = [f"source: {s['source']}  ({s['kind']}, K={s['K']})"]
    meta = s.get("metadata", {})
    if s["kind"] == "trace":
        lines.append("metadata: " + json.dumps(_clean(meta)))
    else:
        keep = {k: meta.get(k) for k in ("drafter", "params", "assumptions", "lost") if meta.get(k)}
        lines.append("model: " + json.dumps(_clean(keep)))
        lines.append("simulated: " + json.dumps(s["simulation"]))
    lines.append(f"CI: {s['ci_method']}; ECE: {s['ece_definition']}")
    if s.get("confidence_head") is False:
        lines.append("confidence: none (this drafter has no confidence head; no ECE, AUC or mean confidence: '-')")
    elif s.get("per_position_definition"):
        lines.append(f"per position ECE_k / AUC_k: {s['per_position_definition']}")
    lines.append("")
    lines.append(f"{'domain':<7}{'requests':>9}{'blocks':>9}  {'tau (all K verified) [95% CI]':<32}{'ECE':>7}"
                 f"{'meanAUC':>9}")
    for d, v in s["domains"].items():
        tau = f"{_fmt(v['tau_all_verified'])} [{_fmt(v['tau_ci95'][0])}, {_fmt(v['tau_ci95'][1])}]"
        lines.append(f"{d:<7}{v['requests']:>9}{v['blocks']:>9}  {tau:<32}{_fmt(v['ece']):>7}{_fmt(v['mean_auc']):>9}")
    for d, v in s["domains"].items():
        lines.append("")
        lines.append(f"[{d}] per position: conditional acceptance P(k | 1..k-1 accepted)")
        lines.append(f"  {'k':>2}{'at risk':>9}{'cond.acc':>10}  {'95% CI':<16}{'mean conf':>10}{'AUC':>7}"
                     f"{'ECE_k':>8}{'AUC_k':>8}")
        for p in v["positions"]:
            ci = f"[{_fmt(p['ci95'][0])}, {_fmt(p['ci95'][1])}]"
            auc = v["auc_by_position"].get(p["k"], v["auc_by_position"].get(str(p["k"])))
            lines.append(f"  {p['k']:>2}{p['at_risk']:>9}{_fmt(p['conditional']):>10}  {ci:<16}"
                         f"{_fmt(p['mean_conf_at_risk']):>10}{_fmt(auc):>7}{_fmt(p.get('ece_survival')):>8}"
                         f"{_fmt(p.get('auc_survival')):>8}")
    lines.append("")
    lines.append("mean conf = mean conf_k over blocks at risk at k (comparable to the conditional acceptance); AUC = "
                 "conditional conf_k among blocks at risk at k; ECE_k / AUC_k = survival, DeepSpec's definitions")
    return "\n".join(lines)


def inspect_command(args: argparse.Namespace) -> int:
    """Entry point of ``dsparksim trace inspect``."""
    try:
        check_seed(args)
        summary = build_summary(args)
    except InputError as e:            # ConfigError is a subclass
        print(f"dsparksim: error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(_clean(summary), indent=1))
    else:
        print(render_text(summary))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Standalone entry (``python -m dsparksim.cli.trace trace inspect ...``) until the main CLI wires it."""
    parser = argparse.ArgumentParser(prog="dsparksim")
    register(parser.add_subparsers(dest="cmd", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
