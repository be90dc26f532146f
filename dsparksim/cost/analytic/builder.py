"""Assemble a ``dsparksim-profile/1`` profile from architecture x hardware x parallelism (``profile build``).

The profile describes ONE engine (one DP rank of tp GPUs): verify staircase = the analytic forward over M query
tokens (:class:`~dsparksim.cost.analytic.cost.ForwardModel`), attention = KV bytes read per context token, prefill = the
query-key work of prompt chunks, drafters = small target-width stacks priced the same way. Every input,
fitted parameter and assumption is recorded in ``metadata.build``.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from dsparksim.cost.analytic.arch import load_arch
from dsparksim.cost.analytic.calibration import FAMILY_NOTES, Calibration, calibrated_sum, family_tables
from dsparksim.cost.analytic.cost import ASSUMPTIONS, DTYPE_BYTES, ForwardModel, Parallel
from dsparksim.cost.analytic.efficiency import EFFICIENCY_JSON, load_efficiency
from dsparksim.cost.analytic.hardware import HARDWARE_CSV, get_gpu
from dsparksim.errors import InputError

__all__ = ["BUILDER_VERSION", "M_GRID", "build_profile", "build_forward_model", "FIXED_OVERHEAD_S", "RESERVE_GIB",
           "DRAFTERS"]

BUILDER_VERSION = "2"
# verify breakpoints: every M to 32, then steps of 8, 32, 128, 512 up to 16384 (above vLLM's 8192 default
# max_num_batched_tokens; the run's default token budget is the profile's largest breakpoint)
M_GRID = np.unique(np.concatenate([np.arange(1, 33), np.arange(40, 257, 8), np.arange(288, 1025, 32),
                                   np.arange(1152, 4097, 128), np.arange(4608, 16385, 512)])).astype(int)
FIXED_OVERHEAD_S = 1.5e-3    # same stated assumption as profiles/derive_vidur.py (host scheduling, launch)
RESERVE_GIB = 4.0            # activations, CUDA graphs, NCCL buffers per GPU (assumption, as derive_vidur.py)
DRAFTERS: dict[str, dict[str, Any]] = {
    # layers: dense target-width layers (attention + dense MLP of the config's intermediate_size)
    "dspark": {"kind": "parallel", "layers": 3, "moe": False, "markov_overhead_frac": 0.008,
               "note": "3 target-width dense layers + LM head (public DSpark drafts use 3 layers); Markov head "
                       "+0.8% (paper: 0.2-1.3%); one forward over n_req*K tokens"},
    "dflash": {"kind": "parallel", "layers": 3, "moe": False, "markov_overhead_frac": 0.0,
               "note": "3 target-width dense layers + LM head; one forward over n_req*K tokens"},
    "eagle3": {"kind": "autoregressive", "layers": 1, "moe": False, "markov_overhead_frac": 0.0,
               "note": "1 target-width dense layer + LM head per sequential step"},
    "mtp1": {"kind": "mtp", "layers": 1, "moe": True, "markov_overhead_frac": 0.0,
             "note": "1 target layer (MoE when the target is MoE, as DeepSeek's MTP module) + shared LM head"},
    # DeepSeek's MTP module reused for K draft positions (acceptance kind `mtp`): K sequential forwards, each the
    # module's enorm/hnorm + eh_proj, one target layer (MoE when the target is MoE) and the shared LM head. Kind
    # `chain`: the first forward runs over the K + 1 tokens per request the target verified (SGLang's EAGLE
    # worker: draft extend after verify, which yields the first draft token), the other K - 1 at n_req tokens
    "mtp": {"kind": "chain", "layers": 1, "moe": True, "mtp_projection": True, "markov_overhead_frac": 0.0,
            "note": "DeepSeek's MTP module reused per draft position: enorm/hnorm + eh_proj (2h->h, bf16, "
                    "replicated) + 1 target layer (MoE when the target is MoE) + shared LM head; K positions cost "
                    "one forward over n_req*(K+1) tokens (draft extend over the verified tokens, as SGLang's EAGLE "
                    "worker runs it) + K-1 forwards over n_req tokens"},
}


def _sha16(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def _r(x: float) -> float:
    return float(f"{float(x):.6g}")


def build_forward_model(model: str | Path, gpu: str, tp: int = 1, ep: int = 1, dp: int = 1,
                        dtype: str | None = None, kv_dtype: str | None = None) -> ForwardModel:
    """The checked :class:`ForwardModel` :func:`build_profile` prices with (``dtype`` None: as there)."""
    arch = load_arch(Path(model))
    if dtype is None:
        hint = arch.weight_dtype_hint.lower()
        dtype = hint if hint in DTYPE_BYTES else "bf16"
    fm = ForwardModel(arch, get_gpu(gpu), Parallel(tp=tp, ep=ep, dp=dp), load_efficiency()[0], dtype=dtype,
                      kv_dtype=kv_dtype)
    fm.check_shapes()
    return fm


def resolve_dtype(model: str | Path, tp: int, ep: int, dp: int, dtype: str | None, kv_dtype: str | None,
                  gpu_memory_utilization: float) -> str:
    """Check the build options (InputError naming the flag) and return the weight dtype: ``dtype``, or None = the
    dtype the config says its weights are published in (DeepSeek-V3: fp8), else bf16."""
    for flag, v in (("--tp", tp), ("--ep", ep), ("--dp", dp)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise InputError(flag, flag.lstrip("-"), f"expected a positive integer, got {v!r}")
    if dtype is None:
        hint = load_arch(Path(model)).weight_dtype_hint.lower()
        dtype = hint if hint in DTYPE_BYTES else "bf16"
    if dtype not in DTYPE_BYTES:
        raise InputError("--dtype", "dtype", f"expected one of {', '.join(DTYPE_BYTES)}, got {dtype!r}")
    if kv_dtype is not None and kv_dtype not in DTYPE_BYTES:
        raise InputError("--kv-dtype", "kv_dtype", f"expected one of {', '.join(DTYPE_BYTES)}, got {kv_dtype!r}")
    if not 0 < gpu_memory_utilization <= 1:
        raise InputError("--gpu-memory-utilization", "gpu_memory_utilization",
                         f"expected a fraction in (0, 1], got {gpu_memory_utilization!r}")
    return dtype


@dataclass(frozen=True)
class KVMemory:
    """One GPU's memory: weight bytes by part, usable and free-for-KV bytes, the KV capacity and max model length."""

    weight_parts: dict[str, float]
    usable: float
    free: float
    kv_capacity_tokens: int
    max_model_len: int


def kv_memory(fm: ForwardModel, mpath: Path, gpu_memory_utilization: float) -> KVMemory:
    """Weights, activation reserve and KV capacity per GPU; InputError when the weights leave no room for KV."""
    arch, g, par = fm.a, fm.g, fm.p
    wparts = fm.weight_bytes_per_gpu()
    weights = sum(wparts.values())
    usable = g.memory_bytes * gpu_memory_utilization
    free = usable - weights - RESERVE_GIB * 2**30
    if free <= 0:
        raise InputError(str(mpath), "weights", f"{arch.name} in {fm.dtype} needs {weights / 2**30:.1f} GiB of "
                                               f"weights per GPU with tp={par.tp}, ep={par.ep}, dp={par.dp}, but "
                                               f"{g.name} offers {usable / 2**30:.1f} GiB at gpu_memory_utilization "
                                               f"{gpu_memory_utilization} minus a {RESERVE_GIB:g} GiB activation "
                                               "reserve; use more GPUs (tp/ep)"
                                               + ("" if fm.dtype == "fp8" else " or --dtype fp8"))
    kv_cap = int(free // fm.kv_bytes_per_token())
    return KVMemory(wparts, usable, free, kv_cap, int(min(arch.max_position, kv_cap)))


def drafter_table(fm: ForwardModel, spec: dict[str, Any], cal: Calibration,
                  rnd: Callable[[float], float]) -> dict[str, Any]:
    """One drafter's profile entry: its forward priced over ``M_GRID`` (calibrated per family unless ``cal`` is
    the identity), the prompt-state update per token, and its note."""
    arch, M = fm.a, M_GRID
    moe_layers = spec["layers"] if (spec["moe"] and arch.is_moe) else 0
    if cal.is_identity:
        t = fm.forward(M, n_layers=spec["layers"], n_moe_layers=moe_layers)
        if spec.get("mtp_projection"):
            t = t + fm.mtp_projection(M)
    else:
        t = calibrated_sum(family_tables(fm, M, n_layers=spec["layers"], n_moe_layers=moe_layers), cal)
        if spec.get("mtp_projection"):   # enorm/hnorm + eh_proj: dense GEMM and elementwise work (+ floors)
            bare = fm.floorless().mtp_projection(M)
            t = t + cal.scale("dense") * bare + cal.scale("floor") * (fm.mtp_projection(M) - bare)
    e: dict[str, Any] = {"kind": spec["kind"], "tokens": [int(x) for x in M], "time_s": [rnd(x) for x in t]}
    if spec["markov_overhead_frac"]:
        e["markov_overhead_frac"] = spec["markov_overhead_frac"]
    # state update per prompt token (drafters read the target's features of every prompt token): marginal
    # cost per token over the top octave of the grid
    e["prefill_s_per_token"] = rnd(max((t[-1] - t[np.searchsorted(M, M[-1] // 2)]) / (M[-1] - M[-1] // 2), 0.0))
    e["note"] = spec["note"]
    if spec.get("mtp_projection"):
        e["note"] += (f"; this config has num_nextn_predict_layers={arch.mtp_layers}" if arch.mtp_layers else
                      "; this config has no MTP module: a hypothetical one of the target's shape")
    return e


def kv_bytes_note(fm: ForwardModel) -> str:
    """What ``kv_bytes_per_token`` counts and which link ``--kv-transfer-gbps`` stands for."""
    arch = fm.a
    return (f"KV bytes of one token for the whole model, counted once: {arch.n_layers} layers x "
            + (f"MLA latent ({arch.kv_lora_rank} kv_lora_rank + {arch.qk_rope_head_dim} rope dims)" if arch.is_mla
               else f"K+V of {arch.n_kv_heads} KV heads x {arch.head_dim}")
            + f" x {fm.kv_dtype} ({fm.kvb:g} bytes). --kv-transfer-gbps is the bandwidth that carries one "
            "request's KV into the engine: "
            + ("the latent is replicated on every TP rank, so each rank needs all of it; one NIC's figure "
               "(e.g. scaleout_gb_s_per_gpu of hardware.csv x 8 Gbit/s) is the right link"
               if arch.is_mla else
               "TP ranks hold disjoint KV-head shards, each can pull its shard over its own NIC: up to tp x one "
               "NIC's figure"))


def build_assumptions(dp: int) -> dict[str, Any]:
    """``metadata.build.assumptions``: the cost model's stated assumptions and the builder's own."""
    return {**ASSUMPTIONS,
            "fixed_overhead_s": {"value": FIXED_OVERHEAD_S, "source": "assumption (as "
                                 "profiles/derive_vidur.py): host scheduling and launch per step"},
            "activation_reserve_GiB": {"value": RESERVE_GIB, "source": "assumption (as "
                                       "profiles/derive_vidur.py)"},
            "routing": {"value": "uniform independent top-k", "source": "assumption: expected "
                        "distinct experts E*(1-(1-k/E)^tokens) over the EP group's tokens"},
            "dp_lockstep": {"value": dp, "source": "assumption: with dp > 1 and ep > 1 every DP "
                            "rank routes a batch of the same M each step (tokens per EP group = "
                            "dp*M); run this profile with --dp-ranks dp"},
            "drafter_shapes": {"value": {k: {"layers": v["layers"], "moe": v["moe"],
                                             **({"mtp_projection": True}
                                                if v.get("mtp_projection") else {})}
                                         for k, v in DRAFTERS.items()},
                               "source": "assumption: drafters are target-width stacks; their "
                                         "attention over context is not priced"}}


def build_record(fm: ForwardModel, mpath: Path, label: str, mem: KVMemory, gpu_memory_utilization: float,
                 terms: dict[str, np.ndarray]) -> dict[str, Any]:
    """``metadata.build``: every input (with checksums), fitted parameter, assumption and memory figure, the
    uncalibrated terms at M = 1, 64, 1024, and what is not modelled."""
    arch, g, par = fm.a, fm.g, fm.p
    _, eff_json = load_efficiency()
    i1 = [int(np.searchsorted(M_GRID, m)) for m in (1, 64, 1024)]
    return {
        "builder_version": BUILDER_VERSION, "code": "dsparksim/cost/analytic/",
        "inputs": {"model_config": label, "model_config_sha256_16": _sha16(mpath), "gpu": g.name,
                   "hardware_table": f"dsparksim/data/{HARDWARE_CSV.name}",
                   "hardware_table_sha256_16": _sha16(HARDWARE_CSV),
                   "tp": par.tp, "ep": par.ep, "dp": par.dp, "dtype": fm.dtype, "kv_dtype": fm.kv_dtype,
                   "gpu_memory_utilization": gpu_memory_utilization},
        "architecture": {k: v for k, v in arch.__dict__.items()},
        "gpu_figures": g.as_dict(),
        "efficiency_fit": {"file": f"dsparksim/data/{EFFICIENCY_JSON.name}",
                           "sha256_16": _sha16(EFFICIENCY_JSON), "params": eff_json["params"],
                           "fit": {k: v for k, v in eff_json["fit"].items() if k != "files"}},
        "assumptions": build_assumptions(par.dp),
        "memory": {"weights_GiB_per_gpu": {k: round(v / 2**30, 3) for k, v in mem.weight_parts.items()},
                   "usable_GiB": round(mem.usable / 2**30, 3), "free_for_kv_GiB": round(mem.free / 2**30, 3),
                   "kv_bytes_per_token_per_gpu": fm.kv_bytes_per_token(),
                   "kv_capacity": "(memory * gpu_memory_utilization - weights - reserve) / KV bytes per token",
                   "max_model_len": "min(max_position_embeddings, kv_capacity_tokens)"},
        "terms_ms_at_M": {str(int(M_GRID[i])): {k: round(float(v[i]) * 1e3, 4) for k, v in terms.items()}
                          for i in i1},
        "not_modelled": ["overlap of communication with compute (terms add)", "load imbalance across experts",
                         "overlap of attention KV reads (seconds_per_kv_token, bytes) with attention FLOPs "
                         "(seconds_per_query_kv, per query-key pair): the two add",
                         "MLA prefill in the non-absorbed form (prefill pairs are priced absorbed, as decode)",
                         "pipeline parallelism", "drafters' attention"],
    }


def profile_metadata(fm: ForwardModel, mpath: Path, label: str, mem: KVMemory, gpu_memory_utilization: float,
                     terms: dict[str, np.ndarray], date: str | None, cal: Calibration) -> dict[str, Any]:
    """The profile's ``metadata``: device, model, provenance, parallelism, KV capacity and bytes, the build record
    and (when not the identity) the calibration."""
    arch, g, par = fm.a, fm.g, fm.p
    meta: dict[str, Any] = {
        "device": g.name, "model": arch.name, "source": f"dsparksim profile build (builder v{BUILDER_VERSION}) from "
                                                        f"{label} and {HARDWARE_CSV.name}",
        "method": "analytic: per-forward roofline terms with efficiency curves fitted on measured vidur operator "
                  "times; MoE fixed costs and communication from cited engine benchmarks; see metadata.build",
        "dtype": fm.dtype, "tensor_parallel": par.tp, "expert_parallel": par.ep, "data_parallel": par.dp,
        "date": date or _dt.date.today().isoformat(),
        "kv_capacity_tokens": mem.kv_capacity_tokens, "max_model_len": mem.max_model_len,
        # read by --disaggregated (dsparksim/sim/disagg.py): prompt_tokens * this / link = the KV transfer time
        "kv_bytes_per_token": int(fm.kv_bytes_per_token_engine()),   # whole bytes for every dtype here
        "kv_bytes_per_token_note": kv_bytes_note(fm),
        "build": build_record(fm, mpath, label, mem, gpu_memory_utilization, terms),
    }
    if not cal.is_identity:
        meta["build"]["calibration"] = {
            **cal.as_dict(), "families": FAMILY_NOTES,
            "note": "each scale multiplies the seconds of its family's terms wherever the builder prices them "
                    "(verify staircase, drafters, context and prefill terms); terms_ms_at_M above are uncalibrated"}
    return meta


def context_terms(fm: ForwardModel, cal: Calibration,
                  rnd: Callable[[float], float]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The profile's ``attention`` (KV bytes read per context token, decode query-key FLOPs) and ``prefill``
    (prompt chunks' query-key FLOPs) sections, scaled by their families."""
    arch = fm.a
    qk_kind = (f"absorbed MLA: 2 x ({2 * arch.kv_lora_rank} + {arch.qk_rope_head_dim}) per head per layer"
               if arch.is_mla else "QK^T + PV: 2 x (head_dim + v_head_dim) per head per layer")
    attention = {"model": "kv_bandwidth",
                 "seconds_per_kv_token": rnd(cal.scale("attention") * fm.seconds_per_kv_token()),
                 "seconds_per_query_kv": rnd(cal.scale("attention") * fm.seconds_per_query_key()),
                 "note": f"seconds_per_kv_token: {fm.kv_bytes_per_token():g} KV bytes per context token per "
                         f"GPU ({'MLA latent' if arch.is_mla else 'GQA K+V'}, {fm.kv_dtype}) read once per "
                         "step at the fitted HBM fraction (bytes). seconds_per_query_kv: "
                         f"{fm.attn_flops_per_query_key():g} attention FLOPs per decode query-key pair per GPU "
                         f"({qk_kind}) / (bf16 peak x fitted fl_max) (FLOPs); the two add (no overlap)"}
    prefill = {"seconds_per_token": 0.0,
               "seconds_per_query_key": rnd(cal.scale("prefill") * fm.seconds_per_query_key()),
               "seconds_per_chunk": 0.0,
               "note": "prompt tokens' GEMMs are in the verify term at the step's M; the query-key work is "
                       "attention FLOPs per pair / (bf16 peak * fitted fl_max)"}
    return attention, prefill


def build_profile(model: str | Path, gpu: str, tp: int = 1, ep: int = 1, dp: int = 1, dtype: str | None = None,
                  kv_dtype: str | None = None, gpu_memory_utilization: float = 0.9, name: str | None = None,
                  date: str | None = None, model_label: str | None = None,
                  calibration: Calibration | None = None) -> dict[str, Any]:
    """The profile JSON object (validate/save with dsparksim.cost.profile). InputError/ConfigError on bad input.
    ``dtype`` None = the weight dtype the config says its weights are published in (DeepSeek-V3: fp8), else bf16.
    ``calibration`` scales each cost family and sets the fixed overhead (:mod:`.calibration`); None or the identity
    builds the uncalibrated profile byte for byte. A calibrated profile keeps full float precision (the fit's
    re-pricing reproduces its prices exactly) and records the calibration in ``metadata.build.calibration``."""
    cal = calibration if calibration is not None else Calibration()
    rnd = _r if cal.is_identity else float
    dtype = resolve_dtype(model, tp, ep, dp, dtype, kv_dtype, gpu_memory_utilization)
    mpath = Path(model)
    fm = build_forward_model(mpath, gpu, tp=tp, ep=ep, dp=dp, dtype=dtype, kv_dtype=kv_dtype)
    mem = kv_memory(fm, mpath, gpu_memory_utilization)

    M = M_GRID
    terms = fm.terms(M)
    verify = sum(terms.values()) if cal.is_identity else calibrated_sum(family_tables(fm, M), cal)
    drafters = {dn: drafter_table(fm, spec, cal, rnd) for dn, spec in DRAFTERS.items()}
    par = f"tp{tp}" + (f"-ep{ep}" if ep > 1 else "") + (f"-dp{dp}" if dp > 1 else "")
    label = model_label or str(mpath)
    meta = profile_metadata(fm, mpath, label, mem, gpu_memory_utilization, terms, date, cal)
    fixed = FIXED_OVERHEAD_S if cal.fixed_overhead_s is None else float(cal.fixed_overhead_s)
    attention, prefill = context_terms(fm, cal, rnd)
    return {
        "format": "dsparksim-profile/1", "name": name or f"built-{gpu.lower()}-{fm.a.name}-{par}", "metadata": meta,
        "verify": {"M": [int(x) for x in M], "time_s": [rnd(x) for x in verify]},
        "attention": attention,
        "prefill": prefill,
        "fixed_overhead_s": fixed,
        **({"request_latency_s": float(cal.request_latency_s)} if cal.request_latency_s else {}),
        "drafters": drafters,
    }
