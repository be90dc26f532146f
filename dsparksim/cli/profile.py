"""``dsparksim profile show|import|list|build|fit`` -- inspect, import, build and fit cost profiles.

The lead's CLI calls :func:`register` with its argparse subparsers object; every subcommand sets ``func``.
"""
from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from dsparksim.cli.options import add_seed_option, bar_off, flag_spelling
from dsparksim.cost.fitted import fit_server
from dsparksim.cost.memory import kv_capacity_at_fraction
from dsparksim.errors import InputError
from dsparksim.io.options import iso_date, pos_float, pos_int
from dsparksim.io.textio import not_a_file
from dsparksim.cost.profile import CostProfile, dumps_profile, list_profiles, load_profile, profile_from_dict, profile_path, profile_to_dict, shipped_dir
from dsparksim.cost.profile_import import (FORMATS, LOOKUPS, complete_profile, import_sps_table, parse_drafter_cost,
                                      run_readiness)
from dsparksim.cost.analytic.builder import build_profile
from dsparksim.cost.analytic.hardware import canonical_gpu
from dsparksim.cost.analytic.calibration import FAMILIES
from dsparksim.cost.analytic.loo import MODELS_DIR
from dsparksim.results.outputs import atomic_write, claim_out_file, image_metadata, written_by

SHOW_M = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
SHOW_NREQ = (1, 8, 32, 128)
SHOW_K = 7


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``profile`` (with show / import / list) to an argparse subparsers object."""
    p = subparsers.add_parser("profile", help="list, inspect, import, build (analytic, from a model config) and fit (to benchmark runs) cost profiles")
    sub = p.add_subparsers(dest="profile_cmd", required=True)

    s = sub.add_parser("show", help="metadata, staircase summary, SPS, drafter costs, context model")
    s.add_argument("profile", help="shipped profile name or path to a profile JSON")
    s.add_argument("--json", action="store_true", help="print a machine-readable summary")
    s.add_argument("--plot", metavar="FILE.png", help="also plot the verify staircase (and drafters) to this file "
                                                      "(an existing file only if dsparksim wrote it, with --force)")
    s.add_argument("--force", action="store_true",
                   help="replace an existing --plot image that dsparksim wrote (never any other file)")
    s.set_defaults(func=cmd_show)

    i = sub.add_parser("import", help="convert an engine SPS table (vLLM/SGLang/TensorRT-LLM) to a profile")
    i.add_argument("input", help="engine table JSON")
    i.add_argument("--format", required=True, choices=FORMATS, dest="fmt")
    i.add_argument("--out", required=True, help="profile JSON to write (never the input; an existing file only if "
                                                "dsparksim wrote it, with --force)")
    i.add_argument("--force", action="store_true",
                   help="replace an existing --out file that dsparksim wrote (never any other file)")
    i.add_argument("--name", help="profile name (default: the output file stem)")
    i.add_argument("--drafters-from", metavar="PROFILE", help="copy drafter costs from this profile (name or path)")
    i.add_argument("--lookup", choices=LOOKUPS, default="auto",
                   help="how the engine reads the table: auto (from the format/marker), floor, interp")
    i.add_argument("--engine-clamp", action=argparse.BooleanOptionalAction, default=True,
                   help="price M outside the probes as the engine does: the first probe's value down to M=1 and, "
                        "for an SpsCostTable, the last probe's value up to its max_batch_tokens (added "
                        "breakpoints are recorded in metadata as not measured) [on]")
    i.add_argument("--kv-capacity-tokens", type=int, metavar="TOKENS",
                   help="KV-cache capacity in tokens (vLLM logs it as 'GPU KV cache size'); stored in metadata so "
                        "`dsparksim run --profile OUT` needs no --kv-capacity")
    i.add_argument("--max-model-len", type=int, metavar="TOKENS",
                   help="longest prompt+output the engine accepts (vLLM's --max-model-len); stored in metadata")
    i.add_argument("--drafter-cost", action="append", default=[], metavar="NAME[:KIND]=SECONDS",
                   help="a drafter whose one forward costs SECONDS at any batch size (repeatable; KIND defaults "
                        "by name: dspark/dflash parallel, eagle3 autoregressive, mtp1 mtp); replaces a drafter "
                        "of that name from --drafters-from; 0 = drafting already inside the measured step")
    i.add_argument("--device", help="metadata: device the table was measured on")
    i.add_argument("--model", help="metadata: target model")
    i.add_argument("--dtype", help="metadata: dtype")
    i.add_argument("--tensor-parallel", type=int, help="metadata: tensor-parallel degree")
    i.set_defaults(func=cmd_import)

    li = sub.add_parser("list", help="list shipped profiles")
    li.set_defaults(func=cmd_list)
    _register_build(sub)
    _register_fit(sub)
    return p


def _register_build(sub: Any) -> None:
    b = sub.add_parser("build", help="build a profile analytically from a HF config.json and a GPU datasheet",
                       description="Analytic cost profile of one engine (one DP rank of --tp GPUs): GEMMs, MoE "
                                   "experts and fixed MoE costs, attention KV reads, TP all-reduce / EP all-to-all, "
                                   "LM head, sampling, drafters; efficiencies fitted on measured operator times "
                                   "(dsparksim/data/efficiency.json). Every input and assumption goes to "
                                   "metadata.build.")
    b.add_argument("--model", required=True, metavar="CONFIG.json",
                   help="Hugging Face config.json (Llama, Qwen/Qwen3, Qwen3-MoE, Mixtral, DeepSeek-V3 keys), or "
                        "the name of a shipped one in dsparksim/data/models/ (e.g. llama-3-8b, qwen3-235b-a22b)")
    b.add_argument("--gpu", required=True, metavar="NAME",
                   help="A100, H100, H200, H800, H20, B200 or a full name of dsparksim/data/hardware.csv")
    b.add_argument("--tp", type=int, default=1, help="tensor-parallel GPUs per engine [1]")
    b.add_argument("--ep", type=int, default=1, help="expert-parallel degree: experts spread over EP GPUs; must "
                                                     "divide tp*dp and the routed experts; with --dp > 1 tokens "
                                                     "reach the experts by all-to-all [1]")
    b.add_argument("--dp", type=int, default=1, help="data-parallel engines sharing the experts (with --ep); the "
                                                     "profile prices one of them [1]")
    b.add_argument("--dtype", default=None, choices=("bf16", "fp16", "fp8"),
                   help="weight dtype [the dtype the config says its weights are published in (DeepSeek-V3: fp8), "
                        "else bf16]")
    b.add_argument("--kv-dtype", choices=("bf16", "fp16", "fp8"),
                   help="KV-cache dtype [bf16 for fp8 weights, else the weight dtype]")
    b.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                   help="fraction of GPU memory the engine may use, as vLLM's flag [0.9]")
    b.add_argument("--name", help="profile name (default: built-<gpu>-<model>-<parallelism>)")
    b.add_argument("--date", type=iso_date, help="date written into metadata, YYYY-MM-DD (default today; fix it for reproducible files)")
    b.add_argument("--out", required=True, help="profile JSON to write (never the --model config; an existing file "
                                                "only if dsparksim wrote it, with --force)")
    b.add_argument("--force", action="store_true",
                   help="replace an existing --out file that dsparksim wrote (never any other file)")
    b.set_defaults(func=cmd_build)


def _model_config(spec: str) -> str:
    """A config.json path, or the name of a shipped one (``llama-3-8b`` -> dsparksim/data/models/llama-3-8b.json)
    when no such file exists; a bare name that is neither is refused with the list of shipped names."""
    p = Path(spec)
    if p.exists() or p.suffix or len(p.parts) > 1:
        return spec
    shipped = MODELS_DIR / f"{spec}.json"
    if shipped.is_file():
        return str(shipped)
    names = ", ".join(sorted(q.stem for q in MODELS_DIR.glob("*.json")))
    raise InputError(spec, "--model", f"no such config.json file and not a shipped model name (shipped: {names})")


def cmd_build(args: argparse.Namespace) -> int:

    try:
        if args.dp > 1 and args.ep <= 1:
            # data-parallel engines only interact through expert parallelism: without --ep the profile would be
            # that of one independent engine, and --dp only a GPU count others would multiply in
            raise InputError("profile build", "--dp", f"--dp {args.dp} without --ep has no effect on one engine's "
                             "costs: run independent engines as --replicas, or give --ep to spread the experts")
        model = _model_config(args.model)
        out = _check_out(args.out, args.force, inputs=[model])
        d = build_profile(model, canonical_gpu(args.gpu), tp=args.tp, ep=args.ep, dp=args.dp, dtype=args.dtype,
                          kv_dtype=args.kv_dtype, gpu_memory_utilization=args.gpu_memory_utilization,
                          name=args.name or None, date=args.date)
        save_profile_file(d, out)
    except InputError as e:
        print(f"dsparksim: error: {e}", file=sys.stderr)
        return 2
    md = d["metadata"]
    v = d["verify"]
    print(f"wrote {out}: {md['model']} on {md['device']} tp={args.tp} ep={args.ep} dp={args.dp} {md.get('dtype')}; "
          f"M {v['M'][0]}..{v['M'][-1]}, verify {v['time_s'][0] * 1e3:.2f} ms at M=1, "
          f"{v['time_s'][-1] * 1e3:.1f} ms at M={v['M'][-1]}")
    print(f"  kv_capacity_tokens: {md['kv_capacity_tokens']}  max_model_len: {md['max_model_len']}")
    dp_hint = f" --dp-ranks {args.dp}" if args.dp > 1 else ""   # the profile prices ONE of dp ranks
    print(f"  ready: dsparksim run --profile {out}{dp_hint}")
    return 0


# ---------------------------------------------------------------------------- show
def summarize(p: CostProfile) -> dict[str, Any]:
    """Machine-readable summary used by ``show`` (text and --json)."""
    Ms = [m for m in SHOW_M if p.min_tokens <= m <= p.max_tokens]
    vt = p.verify_time(np.array(Ms)) if Ms else np.zeros(0)
    steps = np.diff(p.verify_time_s if p.verify_time_s.ndim == 1 else p.verify_time_s[0])
    out: dict[str, Any] = {
        "name": p.name, "source": p.source,
        "metadata": {k: v for k, v in p.metadata.items() if k != "derivation"},
        "has_derivation": "derivation" in p.metadata,
        "verify": {"n_breakpoints": int(len(p.verify_M)), "M_min": p.min_tokens, "M_max": p.max_tokens,
                   "time_s_min": float(np.min(p.verify_time_s)), "time_s_max": float(np.max(p.verify_time_s)),
                   "n_decreasing_steps": int(np.sum(steps < 0)),
                   "sps_at": {str(m): float(1.0 / t) for m, t in zip(Ms, vt)},
                   "time_ms_at": {str(m): float(t * 1e3) for m, t in zip(Ms, vt)}},
        "context_model": p.context_model,
        "fixed_overhead_s": p.fixed_overhead_s,
        "request_latency_s": p.request_latency_s,
        "fit_server": fit_server(p.metadata, str(p.source), p.max_tokens),
        "fit_kv_capacity_tokens": None,
        "batch_overhead": None if p.batch_overhead is None else
        {"n_req_min": int(p.batch_overhead[0][0]), "n_req_max": int(p.batch_overhead[0][-1]),
         "time_s_max": float(np.max(p.batch_overhead[1]))},
        "drafters": {},
    }
    frac = out["fit_server"].get("mem_fraction_static")
    if frac is not None:   # the KV capacity the fitted server has, which the commands simulate
        out["fit_kv_capacity_tokens"] = int(kv_capacity_at_fraction(p, frac)[0])
    if p.context_model == "linear":
        out["seconds_per_kv_token"] = p.seconds_per_kv_token
        out["attention_note"] = p.attention_note
    elif p.context_model == "table":
        out["kv_tokens"] = [int(x) for x in p.kv_tokens]
    for name, d in p.drafters.items():
        K = 1 if d.kind == "mtp" else SHOW_K
        at = {}
        for n in SHOW_NREQ:
            try:
                at[str(n)] = float(p.draft_time(name, n, K) * 1e3)
            except InputError:
                at[str(n)] = None  # outside the drafter's measured range
        out["drafters"][name] = {"kind": d.kind, "K": K, "tokens": [int(d.tokens[0]), int(d.tokens[-1])],
                                 "markov_overhead_frac": d.markov_overhead_frac, "draft_ms_at_n_req": at}
    return out


def format_summary(s: dict[str, Any]) -> str:
    md = s["metadata"]
    lines = [f"profile {s['name']}  ({s['source']})"]
    for k in ("device", "model", "dtype", "tensor_parallel", "expert_parallel", "data_parallel", "date",
              "kv_capacity_tokens", "max_model_len", "source", "method"):
        if k in md:
            lines.append(f"  {k:<18} {md[k]}")
    if s["fit_server"]:
        kv = s["fit_kv_capacity_tokens"]
        kv = f"; KV capacity at that fraction {kv}" if kv is not None else ""
        lines.append(f"  fitted server      {' '.join(flag_spelling(k, v) for k, v in s['fit_server'].items())} "
                     f"(metadata.fit.client_model: run, frontier, sweep, capacity, plan, study and bench replay "
                     f"use it where no option sets it, bench replay all but the batch waiting{kv})")
    if s["request_latency_s"]:
        lines.append(f"  request latency    {s['request_latency_s'] * 1e3:.1f} ms outside the engine's step loop "
                     "(client-side: bench replay adds it to TTFT and E2E; run, frontier, sweep and plan leave it "
                     "out)")
    if s["has_derivation"]:
        lines.append("  derivation         in metadata.derivation (profile show --json omits it; read the JSON)")
    if s["metadata"].get("build"):
        lines.append("  build              in metadata.build: inputs, efficiency fit, GPU figures, assumptions with sources")
    for k in ("import_notes", "missing"):
        for n in md.get(k, []):
            lines.append(f"  {k:<18} {n}")
    v = s["verify"]
    kind = _kind(md)
    down = v["n_decreasing_steps"]
    if down == 0:
        jag = "non-decreasing"
    elif kind in ("derived", "measured"):
        jag = f"{down} step(s) down (jagged measurements, kept as measured)"
    elif kind == "imported":
        jag = f"{down} step(s) down (as in the imported table)"
    else:
        jag = f"{down} step(s) down (as the {kind} model computes them: not measured)"
    lines.append(f"verify staircase ({kind}): {v['n_breakpoints']} breakpoints, M {v['M_min']}..{v['M_max']}, "
                 f"{v['time_s_min'] * 1e3:.3f}..{v['time_s_max'] * 1e3:.3f} ms, {jag}")
    lines.append("  M = tokens in one target forward (each decoding request's last token + its verified drafts, "
                 "+ prefill chunks);")
    lines.append("  ms = that forward's time (floor lookup between breakpoints); SPS = steps per second at M = "
                 "1000 / ms, the paper's SPS(B)")
    lines.append(f"  {'M':>6} {'ms':>10} {'SPS':>9}")
    for m, ms in v["time_ms_at"].items():
        lines.append(f"  {m:>6} {ms:>10.3f} {v['sps_at'][m]:>9.1f}")
    ctx = s["context_model"]
    if ctx == "linear":
        lines.append(f"context model: linear, {s['seconds_per_kv_token']:.4g} s per KV token read "
                     f"({s.get('attention_note', '')})")
    elif ctx == "table":
        lines.append(f"context model: 2-D table, kv_tokens rows {s['kv_tokens']}")
    else:
        lines.append("context model: none (cost does not depend on context length)")
    lines.append(f"fixed overhead: {s['fixed_overhead_s'] * 1e3:.3f} ms/step")
    if s["batch_overhead"]:
        b = s["batch_overhead"]
        lines.append(f"batch overhead: n_req {b['n_req_min']}..{b['n_req_max']}, up to {b['time_s_max'] * 1e3:.3f} ms")
    if not s["drafters"]:
        lines.append("drafters: none (import with --drafters-from PROFILE to add drafting costs)")
    for name, d in s["drafters"].items():
        at = ", ".join(f"n_req={n}: {'out of range' if t is None else f'{t:.3f} ms'}"
                       for n, t in d["draft_ms_at_n_req"].items())
        extra = f", markov +{d['markov_overhead_frac']:.1%}" if d["markov_overhead_frac"] else ""
        lines.append(f"drafter {name} ({d['kind']}, tokens {d['tokens'][0]}..{d['tokens'][1]}{extra}) "
                     f"K={d['K']}: {at}")
    return "\n".join(lines)


def check_plot_path(path: str | Path) -> Path:
    """Refuse a plot path matplotlib cannot write (unknown format, a directory) before any work is done."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # lazy: matplotlib

    path = Path(path)
    ext = path.suffix[1:].lower()
    known = sorted(FigureCanvasAgg.get_supported_filetypes())
    if ext and ext not in known:
        raise InputError(str(path), "--plot",
                         f"unknown image format '.{ext}'; expected one of {', '.join('.' + e for e in known)}")
    if path.is_dir():
        raise InputError(str(path), "--plot", "is a directory; expected an image file path")
    return path


def plot_profile(p: CostProfile, path: str | Path) -> Path:
    """Step plot of the verify staircase (first kv row for 2-D tables) and each drafter's forward cost, written
    atomically and marked as dsparksim's (so a rerun may replace it)."""
    import matplotlib  # lazy: matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: matplotlib

    path = check_plot_path(path)

    fig, ax = plt.subplots(figsize=(8, 4.5))
    vt = p.verify_time_s if p.verify_time_s.ndim == 1 else p.verify_time_s[0]
    from dsparksim.results.plots import policy_color  # one colour per policy/drafter name in every plot

    ax.step(p.verify_M, vt * 1e3, where="post", color="0.3", lw=1.6, label="verify (target forward)")
    for name, d in p.drafters.items():
        ax.step(d.tokens, d.time_s * 1e3, where="post", lw=0.8, color=policy_color(name),
                label=f"drafter {name} forward ({d.kind})")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("tokens in the forward (M)")
    ax.set_ylabel("time (ms)")
    ax.set_title(f"{p.name}  [context model: {p.context_model}]", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fmt = path.suffix[1:].lower() or "png"
    try:
        atomic_write(path, lambda q: fig.savefig(q, dpi=120, format=fmt, metadata=image_metadata(path)))
    except OSError as e:
        raise InputError(str(path), "--plot", f"cannot write the plot: {e.strerror or e}") from None
    finally:
        plt.close(fig)
    return path


def cmd_show(args: argparse.Namespace) -> int:
    try:
        if getattr(args, "plot", None):
            check_plot_path(args.plot)
            claim_out_file(args.plot, "plot", getattr(args, "force", False), "--plot",
                           inputs=[_profile_file(args.profile)])
        elif getattr(args, "force", False):
            raise InputError("cli", "--force", "has no effect without --plot (show writes nothing else)")
        p = load_profile(args.profile)
        s = summarize(p)
        print(json.dumps(s, indent=2) if args.json else format_summary(s))
        if getattr(args, "plot", None):
            print(f"wrote {plot_profile(p, args.plot)}", file=sys.stderr)
    except InputError as e:
        print(f"dsparksim: error: {e}", file=sys.stderr)
        return 2
    return 0


def _check_out(path: str | Path, force: bool = False, inputs=()) -> Path:
    """The profile file to write, by the one overwrite rule (dsparksim.results.outputs.claim_out_file): never a
    directory or an input; an existing file only when dsparksim wrote it, or with --force."""
    return claim_out_file(path, "profile", force, "--out", inputs=inputs)


def _profile_file(spec: str | None) -> str | None:
    """The file a --drafters-from name or path reads (None when there is none to protect)."""
    if not spec:
        return None
    try:
        return str(profile_path(spec))
    except InputError:
        return None


def save_profile_file(p: CostProfile | dict, out: Path) -> None:
    """Write the profile atomically with the mark (metadata.written_by) that lets a rerun replace it."""
    d = profile_to_dict(p) if isinstance(p, CostProfile) else dict(p)
    d["metadata"] = {**d.get("metadata", {}), "written_by": written_by()}
    profile_from_dict(d, str(out))  # never write something load_profile would reject
    try:
        atomic_write(out, lambda q: q.write_text(dumps_profile(d), encoding="utf-8"))
    except OSError as e:
        raise InputError(str(out), "--out", f"cannot write the profile: {e.strerror or e}") from None


def cmd_import(args: argparse.Namespace) -> int:
    meta = {k: v for k, v in (("device", args.device), ("model", args.model), ("dtype", args.dtype),
                              ("tensor_parallel", args.tensor_parallel)) if v is not None}
    try:
        costs = [parse_drafter_cost(c) for c in args.drafter_cost]   # bad options fail before any file is read
        out = _check_out(args.out, args.force, inputs=[args.input, _profile_file(args.drafters_from)])
        p = import_sps_table(args.input, args.fmt, name=args.name or out.stem,
                             drafters_from=args.drafters_from, lookup=args.lookup,
                             engine_clamp=args.engine_clamp, metadata=meta)
        p = complete_profile(p, kv_capacity_tokens=args.kv_capacity_tokens, max_model_len=args.max_model_len,
                             drafter_costs=costs)
        save_profile_file(p, out)
    except InputError as e:
        print(f"dsparksim: error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {out}: {len(p.verify_M)} breakpoints M {p.min_tokens}..{p.max_tokens}, "
          f"fixed overhead {p.fixed_overhead_s * 1e3:.3f} ms, drafters: {', '.join(sorted(p.drafters)) or 'none'}")
    for k in ("kv_capacity_tokens", "max_model_len"):
        if p.metadata.get(k) is not None:
            print(f"  {k}: {p.metadata[k]}")
    for n in p.metadata.get("import_notes", []):
        print(f"  note: {n}")
    for n in p.metadata.get("missing", []):
        print(f"  missing: {n}")
    w = p.metadata.get("drafter_costs", {}).get("warning")
    if w:
        print(f"  warning: {w}")
    need = run_readiness(p)
    if need:
        print(f"  not runnable as is: `dsparksim run --profile {out}` still needs " + "; ".join(need))
    else:
        print(f"  ready: dsparksim run --profile {out}")
    return 0


def _kind(md: dict) -> str:
    """Where a profile's numbers come from, in one word."""
    fit = md.get("fit")
    if isinstance(fit, dict) and str(fit.get("command", "")).startswith("dsparksim profile fit"):
        return "fitted"                      # `profile fit`: built, then fitted to benchmark runs
    if "build" in md:
        return "built"                       # `profile build`: analytic model (MoE ones unvalidated)
    if "measure" in str(md.get("source", "")):
        return "measured"                    # `dsparksim measure` on the torch engine
    method = str(md.get("method", ""))
    if ":" in method:
        return method.split(":", 1)[0].strip() or "?"
    return "imported" if method.startswith("imported") else "?"


def _parallel(md: dict) -> tuple[str, str | None]:
    """('TP8', None), or for a profile that prices one of D data-parallel ranks ('DP8 EP8, 1 of 8 ranks', note)."""
    tp, ep, dp = (md.get(k) for k in ("tensor_parallel", "expert_parallel", "data_parallel"))
    txt = f"TP{tp}" if isinstance(tp, int) else "TP?"
    if isinstance(ep, int) and ep > 1:
        txt += f" EP{ep}"
    if isinstance(dp, int) and dp > 1:
        tp_txt = f"TP{tp} " if isinstance(tp, int) and tp > 1 else ""
        ep_txt = f"EP{ep} " if isinstance(ep, int) and ep > 1 else ""
        return (f"DP{dp} {ep_txt}{tp_txt}(1 of {dp} ranks)".replace("  ", " "),
                f"prices ONE of {dp} data-parallel attention ranks (experts over {ep} GPUs): run it with "
                f"--dp-ranks {dp}")
    return txt, None


def cmd_list(args: argparse.Namespace) -> int:
    from dsparksim.plan.spec import gpus_per_replica  # lazy: pulls in pandas, pyarrow, scipy, simpy
    names = list_profiles()
    print(f"shipped profiles ({shipped_dir()}):")
    rows, notes = [], []
    for n in names:
        try:
            p = load_profile(n)
        except InputError as e:  # a broken shipped file must be visible, not skipped
            print(f"  {n}  INVALID: {e}")
            return 2
        md = p.metadata
        par, note = _parallel(md)
        dp = md.get("data_parallel") if isinstance(md.get("data_parallel"), int) else 1
        try:
            gpus = str(gpus_per_replica(md, dp)[0] or "?")
        except ValueError:
            gpus = "?"
        if note:
            notes.append(f"  {n}: {note}")
        rows.append([n, _kind(md), gpus, par, f"{p.min_tokens}..{p.max_tokens}",
                     ",".join(sorted(p.drafters)) or "none", str(md.get("device", "?")), str(md.get("model", "?"))])
    head = ["name", "kind", "GPUs", "parallel", "M", "drafters", "device", "model"]
    width = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head[:-1])] + [0]
    for r in [head, *rows]:
        print("  " + "  ".join(c.ljust(w) if i != 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, width))).rstrip())
    print("kind: built = `profile build`'s analytic model (the MoE ones are unvalidated predictions), derived = from "
          "measured operator times (vidur), measured = `dsparksim measure`, fitted = `profile fit` to benchmark runs; "
          "GPUs per engine; M = the batch tokens "
          "priced (beyond: --extrapolate)")
    for line in notes:
        print(line)
    return 0


# ---------------------------------------------------------------------------------------------- profile fit
FIT_MARK = "dsparksim profile fit"
MIN_BOOTSTRAP = 20   # fewest resamples `profile fit` turns into a 95% percentile interval
MAX_BOOTSTRAP = 10_000   # most resamples (each a full refit; 10**9 was a MemoryError)


def _register_fit(sub: Any) -> None:
    f = sub.add_parser("fit", help="fit a built profile's cost families to measured benchmark runs",
                       description="Start from `profile build`'s model of --model on --gpu/--tp/--ep and fit one "
                                   f"scale per cost family ({', '.join(FAMILIES)}), the per-step fixed overhead and "
                                   "the request latency outside the step loop (request_latency_s, which bench replay "
                                   "adds to every TTFT and E2E) to the selected runs' TPOT, TTFT and output "
                                   "tok/s/GPU (bounded "
                                   "least squares on log ratios). Parameters the runs cannot identify are held at the "
                                   "builder's value and reported. Writes a normal profile with metadata.fit "
                                   "(values, bootstrap intervals, leave-one-concurrency-out error, provenance).")
    f.add_argument("runs", metavar="RUNS.csv", help="runs table (`dsparksim bench import` output)")
    f.add_argument("--model", required=True, metavar="CONFIG.json", help="model config or shipped model name")
    f.add_argument("--gpu", required=True, metavar="NAME", help="GPU of the runs (as `profile build`)")
    f.add_argument("--tp", type=int, default=1, help="tensor-parallel GPUs per engine [1]")
    f.add_argument("--ep", type=int, default=1, help="expert-parallel degree [1]")
    f.add_argument("--where", metavar="KEY=VALUE,...", help="select runs whose columns equal these values (e.g. "
                                                             "gpu=h200,engine=sglang,engine_version=...,spec_method=none)")
    f.add_argument("--metrics", default="tpot,ttft,tput",
                   help="metrics fitted, of tpot, ttft, tput (all are reported) [%(default)s]")
    f.add_argument("--bootstrap", type=int, default=200, metavar="N",
                   help="bootstrap resamples over runs for the 95%% intervals (0 = none, else "
                        f"{MIN_BOOTSTRAP}..{MAX_BOOTSTRAP}) [%(default)s]")
    add_seed_option(f, help="bootstrap seed [%(default)s]")
    f.add_argument("--max-num-seqs", "--max-running-requests", type=int, default=1024,
                   help="server's max running requests (bench replay's --max-running-requests) [%(default)s]")
    f.add_argument("--prefill-chunk", "--chunked-prefill-size", type=int, default=None, metavar="TOKENS",
                   help="server's chunked-prefill size (bench replay's --chunked-prefill-size) [the profile's token "
                        "budget]")
    f.add_argument("--mem-fraction-static", type=float, default=None, metavar="F",
                   help="server's memory fraction for weights + KV (SGLang's flag; sets the KV capacity) "
                        "[the built profile's KV capacity]")
    f.add_argument("--kv-dtype", choices=("bf16", "fp16", "fp8"), help="server's KV-cache dtype [as `profile build`]")
    f.add_argument("--mixed-prefill", action=argparse.BooleanOptionalAction, default=None,
                   help="whether the server's steps mixed prefill chunks with decode [each run's engine default: "
                        "off for SGLang (--enable-mixed-chunk defaults to off), on otherwise]")
    f.add_argument("--batch-wait-timeout-iters", type=pos_int, default=None, metavar="N",
                   help="server's TensorRT-LLM batch_wait_timeout_iters, with --batch-wait-max-tokens-ratio: new "
                        "prefills held until enough tokens wait or N steps passed (every selected run) [off]")
    f.add_argument("--batch-wait-max-tokens-ratio", type=pos_float, default=None, metavar="FRAC",
                   help="server's TensorRT-LLM batch_wait_max_tokens_ratio, in (0, 1] [off]")
    f.add_argument("--name", help="profile name [fitted-<gpu>x<tp>-<model>]")
    f.add_argument("--date", type=iso_date, help="date written into metadata, YYYY-MM-DD [today]")
    f.add_argument("--out", required=True, metavar="P.json", help="profile JSON to write (never overwritten "
                                                                    "unless it is one this command wrote and "
                                                                    "--force is given)")
    f.add_argument("--force", action="store_true", help="replace --out if `profile fit` wrote it")
    f.set_defaults(func=cmd_fit)


def _check_fit_out(path: str, force: bool, runs: str) -> Path:
    """--out of `profile fit`: never an input; an existing file only if `profile fit` wrote it and --force."""
    out = Path(path)
    if out.exists():
        try:
            prev = json.loads(out.read_text(encoding="utf-8"))
            ours = isinstance(prev, dict) and prev.get("metadata", {}).get("fit", {}).get("command") == FIT_MARK
        except (OSError, ValueError, AttributeError):
            ours = False
        if not ours:
            raise InputError(str(out), "--out", "exists and was not written by `dsparksim profile fit`; "
                             "choose another path")
        if not force:
            raise InputError(str(out), "--out", "exists (a profile this command wrote): pass --force to replace it")
    return _check_out(path, force, inputs=(runs,))


def cmd_fit(args: argparse.Namespace) -> int:
    from dsparksim.fit.command import FitOptions, run_fit  # lazy: pulls in scipy, simpy
    from dsparksim.bench.replay import parse_where  # lazy: pulls in numpy

    try:
        for flag, v, lo in (("--tp", args.tp, 1), ("--ep", args.ep, 1), ("--bootstrap", args.bootstrap, 0),
                            ("--seed", args.seed, 0), ("--max-num-seqs", args.max_num_seqs, 1)):
            if v < lo:
                raise InputError("profile fit", flag, f"expected an integer >= {lo}, got {v}")
        if 0 < args.bootstrap < MIN_BOOTSTRAP or args.bootstrap > MAX_BOOTSTRAP:
            # a 95% percentile interval of a handful of resamples is noise; each resample is a full refit
            raise InputError("profile fit", "--bootstrap", f"expected 0 (no intervals) or at least {MIN_BOOTSTRAP} "
                             f"and at most {MAX_BOOTSTRAP:,} resamples for a 95% interval, got {args.bootstrap}")
        kinds = tuple(k.strip() for k in args.metrics.split(",") if k.strip())
        f = args.mem_fraction_static
        if f is not None and not 0 < f <= 1:
            raise InputError("profile fit", "--mem-fraction-static", f"expected a fraction in (0, 1], got {f}")
        if not kinds or any(k not in ("tpot", "ttft", "tput") for k in kinds):
            raise InputError("profile fit", "--metrics", f"expected a comma list of tpot, ttft, tput, got "
                             f"{args.metrics!r}")
        if not Path(args.runs).is_file():
            raise InputError(args.runs, None, not_a_file(args.runs, "runs table"))
        out = _check_fit_out(args.out, args.force, args.runs)
        model = _model_config(args.model)
        opt = FitOptions(model=model, gpu=canonical_gpu(args.gpu), tp=args.tp, ep=args.ep,
                         where=tuple(parse_where(args.where)), bootstrap=args.bootstrap, seed=args.seed,
                         max_num_seqs=args.max_num_seqs, prefill_chunk_tokens=args.prefill_chunk, name=args.name,
                         date=args.date, metrics=kinds, mem_fraction_static=args.mem_fraction_static,
                         kv_dtype=args.kv_dtype, mixed_prefill=args.mixed_prefill,
                         batch_wait_timeout_iters=args.batch_wait_timeout_iters,
                         batch_wait_max_tokens_ratio=args.batch_wait_max_tokens_ratio)
        # bars only on a terminal (cli.options.bar_off); otherwise they go to a sink, not a log's stderr
        d, rep = run_fit(args.runs, opt, tqdm_file=io.StringIO() if bar_off(args) else sys.stderr)
        save_profile_file(d, out)    # atomic: the file appears complete or not at all
    except InputError as e:
        print(f"dsparksim: error: {e}", file=sys.stderr)
        return 2
    fit = d["metadata"]["fit"]
    print(f"wrote {out}: {fit['runs']['n_runs']} runs, concurrencies {fit['runs']['concurrencies']}, "
          f"{fit['elapsed_s']} s")
    for note in rep["notes"]:
        print(f"  note: {note}")
    for p, e in fit["parameters"].items():
        if e["status"] == "fitted":
            b = e.get("bootstrap")
            ci = f"  [{b['p2.5']:.4g}, {b['p97.5']:.4g}] 95% bootstrap" if b else ""
            print(f"  {p:17s} {e['value']:.4g}  (builder {e['builder_value']:.4g}){ci}"
                  + ("  AT BOUND" if e.get("at_bound") else ""))
        else:
            print(f"  {p:17s} held at {e['builder_value']:.4g}: unidentified, {e['reason']}")
    for label, key in (("fit error", "fit_error"), ("leave-one-concurrency-out", "loco_error")):
        v = fit[key]
        if isinstance(v, dict):
            print(f"  {label}: " + ", ".join(f"{k} median |err| {x['median_abs']:.1%}" for k, x in v.items()))
        else:
            print(f"  {label}: {v}")
    _print_unmeasured(fit)
    _print_next(fit, out, args)
    return 0


_UNMEASURED = {"tpot": "mean_tpot_ms / median_tpot_ms", "ttft": "mean_ttft_ms / median_ttft_ms",
               "tput": "output_throughput_per_gpu (empty where gpu_count is: bench import --gpu-count N)"}


def _print_next(fit: dict, out: Any, args: argparse.Namespace) -> None:
    """A caution under 4 concurrencies, then the bench replay command that simulates the runs on the server the
    fit assumed (its settings spelled out: replay's own defaults need not be the fit's)."""
    conc = fit["runs"]["concurrencies"]
    if len(conc) < 4:
        print(f"  only {len(conc)} concurrenc{'y' if len(conc) == 1 else 'ies'} {conc}: the leave-one-concurrency-out "
              "error extrapolates from fewer than 3 others; fit runs at 4 or more")
    cm = fit["client_model"]
    opts = [f"--chunked-prefill-size {cm['prefill_chunk_tokens']}", f"--max-running-requests {cm['max_num_seqs']}"]
    if cm.get("mem_fraction_static") is not None:
        opts.append(f"--mem-fraction-static {cm['mem_fraction_static']}")
    if args.mixed_prefill is not None:
        opts.append("--mixed-prefill" if args.mixed_prefill else "--no-mixed-prefill")
    if args.batch_wait_timeout_iters is not None:
        opts.append(f"--batch-wait-timeout-iters {args.batch_wait_timeout_iters} --batch-wait-max-tokens-ratio "
                    f"{args.batch_wait_max_tokens_ratio}")
    print(f"  next: dsparksim bench replay {args.runs} --profile {out} {' '.join(opts)} [--where ...] --out replay"
          "  (every run, speculative ones too, on the server the fit assumed)")


def _print_unmeasured(fit: dict) -> None:
    """Say which asked-for metric no selected run measured (it is then neither fitted nor judged)."""
    for kind in fit["fitted_metrics"]:
        if kind not in fit["fit_error"]:
            print(f"  {kind}: not in any selected run, not fitted: {_UNMEASURED[kind]}")
