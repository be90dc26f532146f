"""Achieved fraction of peak HBM bandwidth / tensor FLOP/s, as curves fitted on measured operator times.

Kernel time model (the same one prices every GEMM and elementwise op of the builder)::

    gemm(M, K, N) = t0_gemm + max(bytes / (HBM peak * e_bw(bytes)),  flops / (FLOP peak * e_fl(M)))
        bytes = K*N*w + M*(K+N)*a   (weights read once, activations in/out), flops = 2*M*K*N
        e_bw(bytes) = bw_max * bytes / (bytes + bw_half_bytes)       small transfers do not saturate HBM
        e_fl(M)     = fl_max * M / (M + fl_half_tokens)              skinny GEMMs do not fill the tensor cores
    elementwise(bytes) = t0_ew + bytes / (HBM peak * ew_frac)

Fitted on microsoft/vidur's measured operator medians (data/profiling/compute/<sku>/<model>/mlp.csv @7d47513363ec,
MIT; fp16, A100 and H100, TP 1/2/4/8, num_tokens 1..4096/32768) by least squares on log time, all models and
GPUs together in units of each GPU's datasheet peak. The fit script is scripts/fit_efficiency.py; the shipped
result is dsparksim/data/efficiency.json (the builder needs only that file).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, asdict
from pathlib import Path
from typing import Any, Iterable

import numpy as np

__all__ = ["Efficiency", "EFFICIENCY_JSON", "load_efficiency", "gemm_time", "elementwise_time",
           "vidur_rows", "VIDUR_FILES", "fit", "predict_ops", "OPS"]

EFFICIENCY_JSON = Path(__file__).resolve().parents[2] / "data" / "efficiency.json"
PARAMS = ("t0_gemm_s", "bw_max", "bw_half_bytes", "fl_max", "fl_half_tokens", "t0_ew_s", "ew_frac")


@dataclass(frozen=True)
class Efficiency:
    """Fitted kernel-time parameters (see module docstring)."""

    t0_gemm_s: float
    bw_max: float
    bw_half_bytes: float
    fl_max: float
    fl_half_tokens: float
    t0_ew_s: float
    ew_frac: float

    def e_bw(self, nbytes: Any) -> Any:
        nbytes = np.asarray(nbytes, dtype=float)
        return self.bw_max * nbytes / (nbytes + self.bw_half_bytes)

    def e_fl(self, M: Any) -> Any:
        M = np.asarray(M, dtype=float)
        return self.fl_max * M / (M + self.fl_half_tokens)


def load_efficiency(path: str | Path = EFFICIENCY_JSON) -> tuple[Efficiency, dict[str, Any]]:
    """(parameters, the whole JSON: fit provenance) from the shipped file."""
    d = json.loads(Path(path).read_text(encoding="utf-8"))
    return Efficiency(**{k: float(d["params"][k]) for k in PARAMS}), d


def gemm_time(eff: Efficiency, M: Any, K: float, N: float, hbm_Bps: float, peak_flops: float,
              w_bytes: float = 2.0, a_bytes: float = 2.0) -> Any:
    """Seconds of one (M x K) @ (K x N) GEMM whose K x N weight is read from HBM (see module docstring)."""
    M = np.asarray(M, dtype=float)
    nbytes = K * N * w_bytes + M * (K + N) * a_bytes
    flops = 2.0 * M * K * N
    return eff.t0_gemm_s + np.maximum(nbytes / (hbm_Bps * eff.e_bw(nbytes)),
                                      flops / (peak_flops * np.maximum(eff.e_fl(M), 1e-12)))


def elementwise_time(eff: Efficiency, nbytes: Any, hbm_Bps: float) -> Any:
    """Seconds of one memory-bound elementwise kernel moving `nbytes` (read + write)."""
    return eff.t0_ew_s + np.asarray(nbytes, dtype=float) / (hbm_Bps * eff.ew_frac)


# ------------------------------------------------------------------------------------------- measured data
# vidur file -> (GPU short name, HF config shipped in dsparksim/data/models)
VIDUR_FILES = {
    "h100_meta-llama_Llama-2-7b-hf_mlp.csv": ("H100", "llama-2-7b"),
    "h100_meta-llama_Llama-2-70b-hf_mlp.csv": ("H100", "llama-2-70b"),
    "h100_codellama_CodeLlama-34b-Instruct-hf_mlp.csv": ("H100", "codellama-34b"),
    "h100_Qwen_Qwen-72B_mlp.csv": ("H100", "qwen-72b"),
    "a100_meta-llama_Meta-Llama-3-8B_mlp.csv": ("A100", "llama-3-8b"),
    "a100_meta-llama_Meta-Llama-3-70B_mlp.csv": ("A100", "llama-3-70b"),
}
OPS = ("emb", "input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj", "post_attention_layernorm",
       "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")


def vidur_rows(csv_dir: str | Path, files: Iterable[str] | None = None) -> "Any":
    """One row per (file, TP, num_tokens): the shape columns and the median over rows of each op's median (s)."""
    import pandas as pd  # lazy: pandas

    out = []
    for f in (files or VIDUR_FILES):
        df = pd.read_csv(Path(csv_dir) / f)
        cols = [f"time_stats.{op}.median" for op in OPS]
        g = df.groupby(["num_tensor_parallel_workers", "num_tokens"])
        med = g[cols].median() / 1e3
        med.columns = list(OPS)
        shape = g[["n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size", "use_gated_mlp"]].first()
        t = med.join(shape).reset_index().rename(columns={"num_tensor_parallel_workers": "tp"})
        t["file"], t["gpu"], t["model"] = f, VIDUR_FILES[f][0], VIDUR_FILES[f][1]
        out.append(t)
    return pd.concat(out, ignore_index=True)


def _op_shapes(r: Any) -> dict[str, tuple[str, Any]]:
    """Each vidur op as ('gemm', (K, N)) or ('ew', bytes) for row(s) r (fp16 activations and weights)."""
    tp, M = r["tp"], r["num_tokens"].astype(float)
    h, nh, nkv, f = r["n_embd"], r["n_head"], r["n_kv_head"], r["n_expanded_embd"]
    hd = h // nh
    qkv = (nh + 2 * nkv) * hd / tp
    up = f * np.where(r["use_gated_mlp"], 2, 1) / tp
    return {"attn_pre_proj": ("gemm", (h, qkv)), "attn_post_proj": ("gemm", (nh * hd / tp, h)),
            "mlp_up_proj": ("gemm", (h, up)), "mlp_down_proj": ("gemm", (f / tp, h)),
            "input_layernorm": ("ew", 2 * M * h * 2), "post_attention_layernorm": ("ew", 2 * M * h * 2),
            "attn_rope": ("ew", 2 * M * (nh + nkv) * hd / tp * 2), "mlp_act": ("ew", 1.5 * M * up * 2),
            "add": ("ew", 3 * M * h * 2), "emb": ("ew", 2 * M * h * 2)}


def predict_ops(eff: Efficiency, rows: Any, gpus: dict[str, Any]) -> dict[str, np.ndarray]:
    """Predicted seconds of every vidur op for each row (rows from :func:`vidur_rows`)."""
    bw = rows["gpu"].map(lambda g: gpus[g].hbm_Bps).to_numpy(float)
    fl = rows["gpu"].map(lambda g: gpus[g].bf16_flops).to_numpy(float)
    M = rows["num_tokens"].to_numpy(float)
    out = {}
    for op, (kind, arg) in _op_shapes(rows).items():
        if kind == "gemm":
            K, N = (np.asarray(a, dtype=float) for a in arg)
            out[op] = gemm_time(eff, M, K, N, bw, fl)
        else:
            out[op] = elementwise_time(eff, np.asarray(arg, dtype=float), bw)
    return out


def fit(rows: Any, gpus: dict[str, Any]) -> tuple[Efficiency, dict[str, Any]]:
    """Least squares on log(predicted/measured) over every op of every row; returns params and fit stats."""
    from scipy.optimize import least_squares  # lazy: scipy

    meas = {op: rows[op].to_numpy(float) for op in OPS}
    x0 = np.log([5e-6, 0.8, 2e6, 0.7, 32.0, 4e-6, 0.7])

    def unpack(x: np.ndarray) -> Efficiency:
        return Efficiency(*np.exp(x))

    def resid(x: np.ndarray) -> np.ndarray:
        pred = predict_ops(unpack(x), rows, gpus)
        return np.concatenate([np.log(pred[op] / meas[op]) for op in OPS])

    lo = np.log([1e-7, 0.05, 1e3, 0.05, 0.5, 1e-7, 0.05])
    hi = np.log([1e-4, 1.0, 1e9, 1.0, 1e4, 1e-4, 1.0])
    res = least_squares(resid, x0, bounds=(lo, hi), loss="soft_l1", f_scale=0.1)
    eff = unpack(res.x)
    r = resid(res.x)
    return eff, {"n_residuals": int(r.size), "median_abs_log_ratio": float(np.median(np.abs(r))),
                 "loss": "soft_l1 on log(pred/measured), f_scale 0.1", "converged": bool(res.success)}


def params_dict(eff: Efficiency) -> dict[str, float]:
    return {k: float(v) for k, v in asdict(eff).items()}
