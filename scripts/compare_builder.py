#!/usr/bin/env python
"""Compare `dsparksim profile build` with a profile measured by `dsparksim measure` (same shape, same GPU).

Usage (repo root): python scripts/compare_builder.py MEASURED.json --gpu NAME [--dtype bf16] [--out REPORT.md]

The measured profile's metadata.target_config (the runner's dense shape) becomes the builder's config. Like for
like: the measured verify staircase V0(M) is the target forward alone (the runner fits host time, per-request
time and KV reads separately), so it is compared with the builder's forward terms WITHOUT its assumed fixed
overhead; the measured seconds_per_kv_token with the builder's. No MoE comparison is possible yet: the runner's
TargetModel (dsparksim/backend/model.py) has dense SwiGLU blocks only.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dsparksim.cost.analytic.builder import build_profile  # noqa: E402
from dsparksim.cost.profile import load_profile, profile_from_dict  # noqa: E402

MOE_NOTE = ("MoE: not measured. The runner builds dense targets only (dsparksim/backend/model.py: attention + "
            "SwiGLU blocks), so a Qwen3-30B-A3B-shaped random-weight model cannot be measured yet; the MoE terms "
            "of the builder rest on the cited engine benchmarks in metadata.build.assumptions.")


def hf_config(tc: dict) -> dict:
    """The runner's ModelConfig fields as the Hugging Face config keys the builder reads."""
    return {"architectures": ["LlamaForCausalLM"], "hidden_size": tc["d_model"], "num_hidden_layers": tc["n_layers"],
            "num_attention_heads": tc["n_heads"], "num_key_value_heads": tc["n_kv_heads"],
            "intermediate_size": tc["d_ff"], "vocab_size": tc["vocab_size"], "max_position_embeddings": tc["max_seq"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("measured")
    ap.add_argument("--gpu", required=True)
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp8"))
    ap.add_argument("--note", default="", help="a line printed above the table (e.g. 'plumbing only')")
    ap.add_argument("--out", help="write the report (markdown) here too")
    a = ap.parse_args(argv)
    meas = load_profile(a.measured)
    tc = meas.metadata.get("target_config")
    if not tc:
        print(f"{a.measured}: no metadata.target_config (not a `dsparksim measure` profile)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as td:
        cfg = Path(td) / "runner-shape.json"
        cfg.write_text(json.dumps(hf_config(tc)))
        built = profile_from_dict(build_profile(cfg, a.gpu, dtype=a.dtype, model_label="runner target_config",
                                                date="-"))
    M = np.array([m for m in meas.verify_M if m <= built.max_tokens])
    vm = meas.verify_time(M, 0)
    vb = built.verify_time(M, 0)
    err = vb / vm - 1
    lines = [f"# builder vs measured: {meas.name} ({meas.metadata.get('device')}) vs built on {built.metadata['device']}",
             a.note, "", "| M | measured forward ms | built forward ms | rel. error |", "|---|---|---|---|"]
    lines += [f"| {m} | {x * 1e3:.3f} | {y * 1e3:.3f} | {e:+.1%} |" for m, x, y, e in zip(M, vm, vb, err)]
    lines += ["", f"median |error| {np.median(np.abs(err)):.1%}, max {np.max(np.abs(err)):.1%} over {len(M)} M",
              f"seconds_per_kv_token: measured {meas.seconds_per_kv_token or 0:.4g}, built "
              f"{built.seconds_per_kv_token:.4g}",
              f"fixed overhead: measured {meas.fixed_overhead_s * 1e3:.3f} ms, builder assumes "
              f"{built.fixed_overhead_s * 1e3:.3f} ms (not in the comparison above)", "", MOE_NOTE]
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        Path(a.out).write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
