"""Leave-one-model-out validation of the builder on vidur's measured operator times.

Like for like: vidur measures the non-attention part of a forward (per layer: input/post-attention layernorm,
QKV projection, rope, output projection, gate/up, activation, down, residual add; plus the embedding), not the
attention kernel, LM head, sampling or communication. So the comparison is the measured sum
``layers * sum(ops) + emb`` against the builder's own terms for exactly those kernels
(:class:`~dsparksim.cost.analytic.cost.ForwardModel` attention projections + dense MLP + norms/rope/add + embedding),
with the efficiency curves fitted WITHOUT the model being predicted. It is not a comparison with the shipped
vidur-derived staircases, whose other terms are modelled (not measured) and would only compare two models.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from dsparksim.cost.analytic.arch import load_arch
from dsparksim.cost.analytic.cost import ForwardModel, Parallel
from dsparksim.cost.analytic.efficiency import OPS, VIDUR_FILES, Efficiency, fit, vidur_rows
from dsparksim.cost.analytic.hardware import get_gpu

__all__ = ["MODELS_DIR", "measured_forward", "built_forward", "loo_table"]

MODELS_DIR = Path(__file__).resolve().parents[2] / "data" / "models"


def measured_forward(rows: Any, n_layers: int) -> np.ndarray:
    """Measured non-attention forward seconds per row: layers * sum of the layer ops + embedding."""
    layer = [op for op in OPS if op != "emb"]
    return rows[layer].sum(axis=1).to_numpy(float) * n_layers + rows["emb"].to_numpy(float)


def built_forward(eff: Efficiency, model: str, gpu: str, tp: int, M: np.ndarray) -> np.ndarray:
    """The builder's seconds for the same kernels (fp16, as vidur measured), one GPU of tp."""
    arch = load_arch(MODELS_DIR / f"{model}.json")
    fm = ForwardModel(arch, get_gpu(gpu), Parallel(tp=tp), eff, dtype="fp16")
    per_layer = fm.attn_proj(M) + fm.dense_mlp(M) + fm.layer_common(M) - eff.t0_gemm_s  # no attention kernel
    return arch.n_layers * per_layer + fm.head(M)["embedding"]


def loo_table(csv_dir: str | Path, models: list[str] | None = None) -> tuple[Any, Any]:
    """(per-model summary, per-row detail) DataFrames of leave-one-model-out relative errors (built/measured - 1)."""
    import pandas as pd  # lazy: pandas

    rows = vidur_rows(csv_dir)
    gpus = {g: get_gpu(g) for g in rows["gpu"].unique()}
    detail = []
    for model in (models or sorted(rows["model"].unique())):
        eff, _ = fit(rows[rows["model"] != model], gpus)
        sub = rows[rows["model"] == model]
        L = load_arch(MODELS_DIR / f"{model}.json").n_layers
        for tp, g in sub.groupby("tp"):
            M = g["num_tokens"].to_numpy(float)
            meas = measured_forward(g, L)
            built = built_forward(eff, model, g["gpu"].iloc[0], int(tp), M)
            detail.append(pd.DataFrame({"model": model, "gpu": g["gpu"].iloc[0], "tp": int(tp), "M": M.astype(int),
                                        "measured_s": meas, "built_s": built, "rel_err": built / meas - 1.0}))
    d = pd.concat(detail, ignore_index=True)
    d["abs_err"] = d["rel_err"].abs()
    s = d.groupby(["model", "gpu"]).agg(n=("M", "size"), median_abs_rel_err=("abs_err", "median"),
                                        max_abs_rel_err=("abs_err", "max"),
                                        median_signed_rel_err=("rel_err", "median")).reset_index()
    return s, d


_ = VIDUR_FILES  # the measured files and their GPUs/configs are listed there
