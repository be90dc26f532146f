"""Regenerate the shipped cost profiles from vidur's measured operator profiles.

Usage (from the repo root)::

    python profiles/derive_vidur.py [CSV_DIR] [--out-dir profiles] [--date YYYY-MM-DD] [--only NAME ...]

CSV_DIR defaults to ../shared/data/vidur-profiles (relative to the repo root). Input: microsoft/vidur
data/profiling/compute/<sku>/<org>/<model>/mlp.csv (MIT), copied as <sku>_<org>_<model>_mlp.csv.

What is MEASURED and what is MODELLED (every number below is also written into each profile's metadata):

* Non-attention part of the target forward (measured): per decoder layer at num_tokens = t, the sum over
  the ops input_layernorm, attn_pre_proj, attn_rope, attn_post_proj, post_attention_layernorm, mlp_up_proj,
  mlp_act, mlp_down_proj, add of the median over rows (same t, same TP degree) of ``time_stats.<op>.median``
  (ms); times the layer count, plus ``time_stats.emb.median`` once. Breakpoints are the measured t values,
  unsmoothed, so the staircase is kept as measured. The CSV has no layer count: it comes from each model's
  Hugging Face config.json (num_hidden_layers), stated per model below.
* Attention (modelled): decode attention is memory-bound, so a linear kv-bandwidth term: bytes read per KV
  token per GPU = 2 (K,V) * layers * max(n_kv_head / TP, 1) * head_dim * 2 bytes (fp16), divided by an
  achievable HBM bandwidth (peak * fraction, per device below).
* LM head (modelled; vidur's mlp.csv has none): roofline max(weight bytes / HBM bandwidth, 2*t*vocab/TP*hidden
  FLOP / achievable fp16 tensor throughput), vocab sharded over TP.
* Tensor-parallel communication (modelled, TP > 1 only; vidur profiles it separately and that file is not in
  our data): 2 all-reduces per layer of t*hidden*2 bytes, each latency + 2(TP-1)/TP * bytes / bus bandwidth,
  plus one gather of the t*vocab fp16 logits.
* Fixed overhead (assumed, not measured): FIXED_OVERHEAD_S per step for host scheduling, sampling/rejection
  sampling and graph launch.
* Drafters (modelled from the same staircase): a drafter forward at t tokens costs n_draft_layers target-shaped
  layers (+ their all-reduces) + embedding + LM head at t tokens. dspark and dflash share a 3-layer parallel
  backbone (public DSpark draft checkpoints use 3 layers; DeepSeek-V4.1 DSpark has three draft stages); dspark
  adds markov_overhead_frac = 0.008 (paper: Markov head 0.2-1.3%). eagle3: 1 layer per sequential step
  (autoregressive). mtp1: 1 layer (DeepSeek MTP module: one transformer block + shared head). The drafters'
  own attention over context is not modelled.

Prints a sanity table (Llama-2-7B on H100 at M=64 with modest context should be ~10-20 ms per step).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CSV_DIR = REPO / ".." / "shared" / "data" / "vidur-profiles"
VIDUR_COMMIT = "7d47513363ec"

OPS = ("input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj", "post_attention_layernorm",
       "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")

FIXED_OVERHEAD_S = 1.5e-3
FIXED_OVERHEAD_WHY = ("assumed, not measured: host-side scheduling, sampling/rejection sampling and CUDA-graph "
                      "launch per engine step; order of magnitude of the per-step CPU overhead that modern engines "
                      "overlap only partly. Edit 'fixed_overhead_s' in the JSON (or the constant in "
                      "profiles/derive_vidur.py) to use a measured value")
KV_BYTES_PER_ELEMENT = 2  # fp16 KV cache
GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default gpu_memory_utilization
RESERVE_GIB_PER_GPU = 4.0  # activations, CUDA graphs, NCCL buffers (assumed)

# Peak numbers are vendor datasheet values; the fractions are stated assumptions of what kernels achieve.
HARDWARE: dict[str, dict[str, Any]] = {
    "h100": {"device": "NVIDIA H100 SXM 80GB", "hbm_peak_Bps": 3.35e12, "hbm_fraction": 0.7,
             "fp16_dense_peak_flops": 989e12, "compute_fraction": 0.6, "memory_GiB": 80,
             "allreduce_latency_s": 10e-6, "allreduce_busbw_Bps": 300e9,
             "note": "datasheet: 3.35 TB/s HBM3, 989 TFLOP/s dense FP16/BF16 tensor, NVLink4 900 GB/s "
                     "bidirectional; all-reduce latency/bus bandwidth are assumptions"},
    "a100": {"device": "NVIDIA A100 SXM 80GB", "hbm_peak_Bps": 2.039e12, "hbm_fraction": 0.7,
             "fp16_dense_peak_flops": 312e12, "compute_fraction": 0.6, "memory_GiB": 80,
             "allreduce_latency_s": 12e-6, "allreduce_busbw_Bps": 200e9,
             "note": "datasheet: 2.039 TB/s HBM2e (80GB SXM), 312 TFLOP/s dense FP16/BF16 tensor, NVLink3 600 GB/s "
                     "bidirectional; all-reduce latency/bus bandwidth are assumptions"},
}

# Layer counts are not in vidur's CSV: num_hidden_layers of each model's Hugging Face config.json.
MODELS: dict[str, dict[str, Any]] = {
    "meta-llama/Llama-2-7b-hf": {"n_layers": 32, "n_draft_layers": 3},
    "meta-llama/Llama-2-70b-hf": {"n_layers": 80, "n_draft_layers": 3},
    "meta-llama/Meta-Llama-3-8B": {"n_layers": 32, "n_draft_layers": 3},
    "meta-llama/Meta-Llama-3-70B": {"n_layers": 80, "n_draft_layers": 3},
}
LAYERS_SOURCE = "num_hidden_layers in the model's Hugging Face config.json (vidur's mlp.csv has no layer count)"

# name -> (sku, csv file, model, TP degree)
SHIPPED: dict[str, tuple[str, str, str, int]] = {
    "h100-llama2-7b-tp1": ("h100", "h100_meta-llama_Llama-2-7b-hf_mlp.csv", "meta-llama/Llama-2-7b-hf", 1),
    "h100-llama2-70b-tp4": ("h100", "h100_meta-llama_Llama-2-70b-hf_mlp.csv", "meta-llama/Llama-2-70b-hf", 4),
    "a100-llama3-8b-tp1": ("a100", "a100_meta-llama_Meta-Llama-3-8B_mlp.csv", "meta-llama/Meta-Llama-3-8B", 1),
    "a100-llama3-70b-tp4": ("a100", "a100_meta-llama_Meta-Llama-3-70B_mlp.csv", "meta-llama/Meta-Llama-3-70B", 4),
}

DRAFTERS: dict[str, dict[str, Any]] = {
    "dspark": {"kind": "parallel", "layers": "n_draft_layers", "markov_overhead_frac": 0.008,
               "note": "DFlash-style parallel backbone + Markov head; one forward over n_req*K tokens"},
    "dflash": {"kind": "parallel", "layers": "n_draft_layers", "markov_overhead_frac": 0.0,
               "note": "parallel block drafter without the Markov head; one forward over n_req*K tokens"},
    "eagle3": {"kind": "autoregressive", "layers": 1, "markov_overhead_frac": 0.0,
               "note": "one target-shaped layer + LM head per sequential step; K forwards of n_req tokens"},
    "mtp1": {"kind": "mtp", "layers": 1, "markov_overhead_frac": 0.0,
             "note": "one MTP module (one transformer block + shared head) over n_req tokens"},
}


def sha256_16(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def read_layer_table(csv: Path, tp: int) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Per num_tokens: per-layer non-attention ms and embedding ms (medians over rows), plus model shape."""
    df = pd.read_csv(csv)
    df = df[df["num_tensor_parallel_workers"] == tp]
    if df.empty:
        raise SystemExit(f"{csv}: no rows with num_tensor_parallel_workers == {tp}")
    cols = [f"time_stats.{op}.median" for op in OPS] + ["time_stats.emb.median"]
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise SystemExit(f"{csv}: missing columns {missing}")
    g = df.groupby("num_tokens")[cols].median().sort_index()
    if g.isna().any().any():
        raise SystemExit(f"{csv}: NaN medians at num_tokens {list(g.index[g.isna().any(axis=1)])}")
    table = pd.DataFrame({"layer_ms": g[cols[:-1]].sum(axis=1), "emb_ms": g["time_stats.emb.median"]})
    shape_cols = ["n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size", "use_gated_mlp"]
    shapes = df[shape_cols].drop_duplicates()
    if len(shapes) != 1:
        raise SystemExit(f"{csv}: expected one model shape, got {len(shapes)}")
    s = shapes.iloc[0]
    shape = {"n_head": int(s.n_head), "n_kv_head": int(s.n_kv_head), "hidden": int(s.n_embd),
             "ffn": int(s.n_expanded_embd), "vocab": int(s.vocab_size), "gated_mlp": bool(s.use_gated_mlp),
             "head_dim": int(s.n_embd) // int(s.n_head)}
    return table, {"shape": shape, "rows_used": int(len(df))}


class StepModel:
    """The stated models for the parts vidur's mlp.csv does not measure (see module docstring)."""

    def __init__(self, hw: dict[str, Any], shape: dict[str, Any], n_layers: int, tp: int):
        self.hw, self.sh, self.L, self.tp = hw, shape, n_layers, tp
        self.bw = hw["hbm_peak_Bps"] * hw["hbm_fraction"]
        self.flops = hw["fp16_dense_peak_flops"] * hw["compute_fraction"]

    def lm_head_s(self, t: np.ndarray) -> np.ndarray:
        v, h = self.sh["vocab"] / self.tp, self.sh["hidden"]
        return np.maximum(v * h * 2 / self.bw, 2.0 * t * v * h / self.flops)

    def _allreduce_s(self, nbytes: np.ndarray) -> np.ndarray:
        if self.tp == 1:
            return np.zeros_like(nbytes, dtype=float)
        f = 2 * (self.tp - 1) / self.tp
        return self.hw["allreduce_latency_s"] + f * nbytes / self.hw["allreduce_busbw_Bps"]

    def comm_per_layer_s(self, t: np.ndarray) -> np.ndarray:
        return 2 * self._allreduce_s(t * self.sh["hidden"] * 2.0)

    def logits_gather_s(self, t: np.ndarray) -> np.ndarray:
        if self.tp == 1:
            return np.zeros_like(t, dtype=float)
        f = (self.tp - 1) / self.tp
        return self.hw["allreduce_latency_s"] + f * t * self.sh["vocab"] * 2.0 / self.hw["allreduce_busbw_Bps"]

    def kv_bytes_per_token(self) -> float:
        kv_heads = max(self.sh["n_kv_head"] / self.tp, 1.0)  # heads are replicated when TP > n_kv_head
        return 2 * self.L * kv_heads * self.sh["head_dim"] * KV_BYTES_PER_ELEMENT

    def params(self) -> float:
        h, f, v = self.sh["hidden"], self.sh["ffn"], self.sh["vocab"]
        kv_dim = self.sh["n_kv_head"] * self.sh["head_dim"]
        per_layer = h * (h + 2 * kv_dim) + h * h + (3 if self.sh["gated_mlp"] else 2) * h * f + 2 * h
        return self.L * per_layer + 2 * v * h + h  # untied embedding and LM head (Llama)

    def kv_capacity_tokens(self) -> int:
        mem = self.hw["memory_GiB"] * 2**30 * GPU_MEMORY_UTILIZATION
        free = mem - self.params() * 2 / self.tp - RESERVE_GIB_PER_GPU * 2**30
        return int(free // self.kv_bytes_per_token())


def derive(name: str, csv_dir: Path, date: str) -> dict[str, Any]:
    """Build the profile JSON object for one SHIPPED entry."""
    sku, fname, model, tp = SHIPPED[name]
    hw, mcfg = HARDWARE[sku], MODELS[model]
    csv = Path(csv_dir) / fname
    table, info = read_layer_table(csv, tp)
    sh, L = info["shape"], mcfg["n_layers"]
    sm = StepModel(hw, sh, L, tp)
    t = table.index.to_numpy(dtype=np.int64)
    tf = t.astype(float)
    layer_s = table["layer_ms"].to_numpy() / 1e3
    emb_s = table["emb_ms"].to_numpy() / 1e3
    comm = sm.comm_per_layer_s(tf)
    head = sm.lm_head_s(tf) + sm.logits_gather_s(tf)
    verify = L * (layer_s + comm) + emb_s + head

    def fwd(n_layers: int) -> np.ndarray:
        return n_layers * (layer_s + comm) + emb_s + head

    drafters: dict[str, Any] = {}
    drafter_deriv: dict[str, Any] = {}
    for dname, spec in DRAFTERS.items():
        nl = mcfg["n_draft_layers"] if spec["layers"] == "n_draft_layers" else int(spec["layers"])
        e: dict[str, Any] = {"kind": spec["kind"], "tokens": [int(x) for x in t],
                             "time_s": [_r(x) for x in fwd(nl)]}
        if spec["markov_overhead_frac"]:
            e["markov_overhead_frac"] = spec["markov_overhead_frac"]
        e["note"] = f"{nl} target-shaped layer(s) + embedding + LM head per forward; {spec['note']}"
        drafters[dname] = e
        drafter_deriv[dname] = {"kind": spec["kind"], "layers": nl, "markov_overhead_frac": spec["markov_overhead_frac"]}

    spk = sm.kv_bytes_per_token() / sm.bw
    src = f"microsoft/vidur data/profiling/compute/{sku}/{model}/mlp.csv @{VIDUR_COMMIT} (MIT)"
    meta = {
        "device": hw["device"], "model": model, "dtype": "fp16", "tensor_parallel": tp,
        "source": src,
        "method": ("derived: measured per-layer non-attention operator medians (vidur) x layers + embedding; "
                   "stated models for attention (kv bandwidth), LM head, TP communication, host overhead and "
                   "drafters -- see derivation"),
        "date": date,
        "kv_capacity_tokens": sm.kv_capacity_tokens(),
        "derivation": {
            "script": "profiles/derive_vidur.py",
            "csv_file": fname, "csv_sha256_16": sha256_16(csv), "csv_rows_used": info["rows_used"],
            "tensor_parallel_filter": f"num_tensor_parallel_workers == {tp}",
            "model_shape": {**sh, "n_layers": L, "n_layers_source": LAYERS_SOURCE},
            "non_attention": {"ops": list(OPS), "statistic": "time_stats.<op>.median (ms)",
                              "aggregation": "median over rows with the same num_tokens, summed over ops, "
                                             f"x {L} layers, + time_stats.emb.median once",
                              "breakpoints": "the measured num_tokens values, unsmoothed",
                              "n_breakpoints": int(len(t))},
            "hardware": {k: v for k, v in hw.items()},
            "attention": {"model": "kv_bandwidth",
                          "bytes_per_kv_token_per_gpu": sm.kv_bytes_per_token(),
                          "formula": "2 (K,V) * n_layers * max(n_kv_head/TP, 1) * head_dim * 2 bytes",
                          "effective_bandwidth_Bps": sm.bw},
            "lm_head": {"model": "roofline max(vocab/TP*hidden*2 B / effective HBM bandwidth, "
                                 "2*tokens*vocab/TP*hidden FLOP / effective fp16 FLOP/s)",
                        "effective_flops": sm.flops,
                        "logits_gather": "TP>1: latency + (TP-1)/TP * tokens*vocab*2 B / all-reduce bus bandwidth"},
            "tp_communication": ("none (TP=1)" if tp == 1 else
                                 "2 all-reduces per layer of tokens*hidden*2 B: latency + 2(TP-1)/TP * bytes / "
                                 "bus bandwidth (vidur's network profiles are not in our data)"),
            "fixed_overhead": {"seconds": FIXED_OVERHEAD_S, "why": FIXED_OVERHEAD_WHY},
            "drafters": {"model": "drafter forward at t tokens = layers * (vidur per-layer + TP all-reduces) + "
                                  "embedding + LM head at t tokens (target shapes)",
                         "why_3_layers": "public DSpark draft checkpoints use 3 draft layers (e.g. d0rj GigaChat3 "
                                         "DSpark Base, rasyosef Llama-3.2-1B-Instruct-DSpark); DeepSeek-V4.1 DSpark "
                                         "has three draft stages; dflash shares the backbone",
                         "markov": "dspark markov_overhead_frac 0.008: paper reports the Markov head at 0.2-1.3%",
                         "tokens_axis": f"the measured num_tokens breakpoints {int(t[0])}..{int(t[-1])}; "
                                        "beyond is a range error",
                         "per_drafter": drafter_deriv},
            "kv_capacity": {"formula": "(memory_GiB * gpu_memory_utilization - weights/TP - reserve) / "
                                       "kv bytes per token per GPU",
                            "gpu_memory_utilization": GPU_MEMORY_UTILIZATION, "reserve_GiB_per_gpu": RESERVE_GIB_PER_GPU,
                            "params": sm.params(), "weight_bytes_per_gpu": sm.params() * 2 / tp},
            "not_modelled": ["prefill attention compute (quadratic part); only KV bytes read are priced",
                             "drafters' attention over context", "sampling cost growth with batch",
                             "pipeline parallelism, expert parallelism"],
        },
    }
    return {
        "format": "dsparksim-profile/1",
        "name": name,
        "metadata": meta,
        "verify": {"M": [int(x) for x in t], "time_s": [_r(x) for x in verify]},
        "attention": {"model": "kv_bandwidth", "seconds_per_kv_token": _r(spk),
                      "note": f"{sm.kv_bytes_per_token():.0f} B per KV token per GPU / {sm.bw / 1e12:.4g} TB/s "
                              "effective HBM bandwidth; kv_tokens = total KV tokens the batch reads"},
        "fixed_overhead_s": FIXED_OVERHEAD_S,
        "drafters": drafters,
    }


def _r(x: float) -> float:
    """Round to 6 significant digits: keeps files readable; far below measurement noise."""
    x = float(x)
    return float(f"{x:.6g}") if x and math.isfinite(x) else x


def sanity_table(profile: Any) -> str:
    """Small table of step costs at a few batch sizes (ms)."""
    lines = [f"{profile.name}: {profile.metadata['device']}, {profile.metadata['model']}, "
             f"TP={profile.metadata['tensor_parallel']}, KV capacity {profile.metadata['kv_capacity_tokens']} tokens",
             f"  {'M':>5} {'verify(no ctx)':>15} {'SPS':>8}"]
    for M in (1, 8, 64, 256, 1024, 4096):
        if M <= profile.max_tokens:
            v = profile.verify_time(M)
            lines.append(f"  {M:>5} {v * 1e3:>13.3f}ms {1 / v:>8.1f}")
    f = profile.fixed_overhead_s
    t1 = profile.verify_time(64, 64 * 512) + f
    t2 = profile.verify_time(64, 8 * 1024) + profile.nontrimmable_time("dspark", 8, 7)
    t3 = profile.verify_time(16, 8 * 1024) + profile.nontrimmable_time("mtp1", 8, 1)
    lines.append(f"  decode, 64 requests x 512 ctx, no spec (M=64):             {t1 * 1e3:7.2f} ms/step")
    lines.append(f"  dspark, 8 requests x 1024 ctx, K=7 all verified (M=64):     {t2 * 1e3:7.2f} ms/step "
                 f"(draft {profile.draft_time('dspark', 8, 7) * 1e3:.2f} ms)")
    lines.append(f"  mtp1, 8 requests x 1024 ctx (M=16):                         {t3 * 1e3:7.2f} ms/step")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv_dir", nargs="?", default=str(DEFAULT_CSV_DIR))
    ap.add_argument("--out-dir", default=str(Path(__file__).resolve().parent))
    ap.add_argument("--date", default=_dt.date.today().isoformat(), help="date written into metadata")
    ap.add_argument("--only", nargs="*", choices=sorted(SHIPPED), help="regenerate only these")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(REPO))
    from dsparksim.cost.profile import profile_from_dict, save_profile

    for name in args.only or sorted(SHIPPED):
        d = derive(name, Path(args.csv_dir), args.date)
        out = Path(args.out_dir) / f"{name}.json"
        save_profile(d, out)
        print(sanity_table(profile_from_dict(d, str(out))))
        print(f"  -> wrote {out}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
