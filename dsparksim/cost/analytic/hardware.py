"""GPU datasheet figures (shipped table dsparksim/data/hardware.csv, copied from ../shared/data/deployments).

Peaks are vendor ceilings; achieved fractions come from :mod:`dsparksim.cost.analytic.efficiency` (fitted) or are stated
assumptions in :mod:`dsparksim.cost.analytic.cost`.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from dsparksim.errors import InputError

__all__ = ["GPU", "HARDWARE_CSV", "SHORT_NAMES", "load_gpus", "get_gpu"]

HARDWARE_CSV = Path(__file__).resolve().parents[2] / "data" / "hardware.csv"
# short name -> full name in the table (the names; matched case-insensitively)
SHORT_NAMES = {"A100": "A100-SXM4-80GB", "H100": "H100-SXM5-80GB", "H200": "H200-SXM-141GB",
               "H800": "H800-SXM5-80GB", "H20": "H20-96GB", "B200": "B200-180GB"}
_FIELDS = ("gpu", "memory_gb", "hbm_tb_s", "bf16_dense_tflops", "fp8_dense_tflops", "nvlink_gb_s_per_gpu",
           "scaleout_gb_s_per_gpu", "source")


@dataclass(frozen=True)
class GPU:
    """One row of the datasheet table, in SI units (bytes, bytes/s, FLOP/s)."""

    name: str
    memory_bytes: float             # datasheet "GB" read as GiB (nvidia-smi: H100 80GB = 81,559 MiB)
    hbm_Bps: float
    bf16_flops: float
    fp8_flops: float | None          # None: no fp8 tensor cores (A100)
    nvlink_Bps: float                # per GPU, both directions together (datasheet convention)
    scaleout_Bps: float
    source: str

    def peak_flops(self, dtype: str) -> float:
        """Dense tensor peak for a weight dtype ("bf16"/"fp16" or "fp8"); fp8 on a GPU without it is an error."""
        if dtype == "fp8":
            if self.fp8_flops is None:
                raise InputError("--dtype", "fp8", f"{self.name} has no fp8 tensor cores (datasheet); use bf16")
            return self.fp8_flops
        return self.bf16_flops

    def as_dict(self) -> dict:
        return {"name": self.name, "memory_GiB": self.memory_bytes / 2**30, "hbm_TB_s": self.hbm_Bps / 1e12,
                "bf16_dense_TFLOP_s": self.bf16_flops / 1e12,
                "fp8_dense_TFLOP_s": None if self.fp8_flops is None else self.fp8_flops / 1e12,
                "nvlink_GB_s_per_gpu": self.nvlink_Bps / 1e9, "source": self.source}


def load_gpus(path: str | Path = HARDWARE_CSV) -> dict[str, GPU]:
    """Parse the datasheet CSV (InputError naming the line and column on a bad cell)."""
    path = Path(path)
    out: dict[str, GPU] = {}
    with open(path, newline="", encoding="utf-8") as f:
        rows = csv.DictReader(f)
        if tuple(rows.fieldnames or ()) != _FIELDS:
            raise InputError(str(path), "header", f"expected columns {', '.join(_FIELDS)}, got {rows.fieldnames}")
        for i, r in enumerate(rows, start=2):
            def num(k: str, optional: bool = False) -> float | None:
                v = (r.get(k) or "").strip()
                if not v and optional:
                    return None
                try:
                    x = float(v)
                except ValueError:
                    raise InputError(str(path), k, f"expected a number, got {v!r}", line=i) from None
                if not x > 0:
                    raise InputError(str(path), k, f"expected a positive number, got {v!r}", line=i)
                return x
            fp8 = num("fp8_dense_tflops", optional=True)
            out[r["gpu"]] = GPU(name=r["gpu"], memory_bytes=num("memory_gb") * 2**30, hbm_Bps=num("hbm_tb_s") * 1e12,
                                bf16_flops=num("bf16_dense_tflops") * 1e12,
                                fp8_flops=None if fp8 is None else fp8 * 1e12,
                                nvlink_Bps=num("nvlink_gb_s_per_gpu") * 1e9,
                                scaleout_Bps=num("scaleout_gb_s_per_gpu") * 1e9, source=r["source"])
    return out


def get_gpu(name: str) -> GPU:
    """A GPU by short name (A100, H100, ...) or full table name, case-insensitive; unknown -> InputError."""
    gpus = load_gpus()
    key = SHORT_NAMES.get(name.upper(), name)
    for full, g in gpus.items():
        if full.lower() == key.lower():
            return g
    valid = ", ".join(list(SHORT_NAMES) + list(gpus))
    raise InputError("--gpu", "gpu", f"unknown GPU {name!r}; expected one of {valid}")
