"""The built profiles shipped in profiles/ and how to regenerate them (the golden test rebuilds and compares).

Usage (repo root): python -m dsparksim.cost.analytic.shipped [--out-dir profiles]
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from dsparksim.cost.analytic.builder import build_profile
from dsparksim.cost.profile import save_profile

REPO = Path(__file__).resolve().parents[3]
DATE = "2026-12-01"   # fixed so regenerated files are byte-identical
# name -> (config under dsparksim/data/models, gpu, tp, ep, dp, dtype)
SHIPPED: dict[str, tuple[str, str, int, int, int, str]] = {
    "built-h200x8-deepseek-v3-tp8": ("deepseek-v3", "H200", 8, 1, 1, "fp8"),
    "built-h200x8-deepseek-v3-dp8ep8": ("deepseek-v3", "H200", 1, 8, 8, "fp8"),
    "built-h100-qwen3-30b-a3b-tp1": ("qwen3-30b-a3b", "H100", 1, 1, 1, "bf16"),
    "built-h100x8-qwen3-235b-a22b-tp8": ("qwen3-235b-a22b", "H100", 8, 1, 1, "bf16"),
    "built-h100x2-mixtral-8x7b-tp2": ("mixtral-8x7b", "H100", 2, 1, 1, "bf16"),
    "built-h100-llama2-7b-tp1": ("llama-2-7b", "H100", 1, 1, 1, "fp16"),
    "built-h100x4-llama2-70b-tp4": ("llama-2-70b", "H100", 4, 1, 1, "fp16"),
    "built-a100-llama3-8b-tp1": ("llama-3-8b", "A100", 1, 1, 1, "bf16"),
    "built-a100x4-llama3-70b-tp4": ("llama-3-70b", "A100", 4, 1, 1, "bf16"),
}


def build_shipped(name: str) -> dict[str, Any]:
    """The profile object `name` as the builder produces it now from the shipped inputs."""
    model, gpu, tp, ep, dp, dtype = SHIPPED[name]
    rel = f"dsparksim/data/models/{model}.json"
    return build_profile(REPO / rel, gpu, tp=tp, ep=ep, dp=dp, dtype=dtype, name=name, date=DATE, model_label=rel)


def main(argv: list[str] | None = None) -> int:

    ap = argparse.ArgumentParser(description="regenerate the shipped built profiles")
    ap.add_argument("--out-dir", default=str(REPO / "profiles"))
    a = ap.parse_args(argv)
    for n in SHIPPED:
        p = save_profile(build_shipped(n), Path(a.out_dir) / f"{n}.json")
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
