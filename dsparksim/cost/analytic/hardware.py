"""GPU datasheet figures (shipped table dsparksim/data/hardware.csv, copied from ../shared/data/deployments).

Peaks are vendor ceilings; achieved fractions come from :mod:`dsparksim.cost.analytic.efficiency` (fitted) or are stated
assumptions in :mod:`dsparksim.cost.analytic.cost`.
"""
from __future__ import annotations

import csv
import functools
import re
from dataclasses import dataclass
from pathlib import Path

from dsparksim.errors import InputError

__all__ = ["GPU", "HARDWARE_CSV", "SHORT_NAMES", "load_gpus", "get_gpu", "gpu_mismatch", "canonical_gpu",
           "same_gpu"]

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


_VENDOR = "nvidia"
_MEMORY_KIND = re.compile(r"hbm\d*e?|gddr\d*x?")     # implied by the GPU: HBM3e of an H200 says nothing more
_CAPACITY = re.compile(r"(\d+)g(?:b|ib)?")


def gpu_mismatch(gpu: str, device: str) -> str | None:
    """None when the GPU name ``gpu`` (a run's, a flag's) names ``device``, else why not: the one GPU-name rule of
    `bench replay`, `bench import`, `profile build`/`fit --gpu` and `--where gpu=`. Both are split into lower-case
    words (``NVIDIA H100 80GB HBM3`` -> nvidia, h100, 80gb, hbm3); the vendor word ``nvidia`` and memory kinds
    (hbm3e) are dropped, as nvidia-smi and benchmark metadata add them; a memory size (141gb) must equal the
    device's where both give one; the words left must be whole consecutive words of the device's (h200 in
    H200-SXM-141GB, h20 is not; H100 PCIe is not H100-SXM5-80GB)."""
    run, dev = (re.findall(r"[a-z0-9]+", s.lower()) for s in (gpu, device))
    dev = [w for w in dev if w != _VENDOR and not _MEMORY_KIND.fullmatch(w)]
    run = [w for w in run if w != _VENDOR and not _MEMORY_KIND.fullmatch(w)]
    size_run = {_CAPACITY.fullmatch(w).group(1) for w in run if _CAPACITY.fullmatch(w)}
    size_dev = {_CAPACITY.fullmatch(w).group(1) for w in dev if _CAPACITY.fullmatch(w)}
    if size_run and size_dev and size_run != size_dev:
        return f"{'/'.join(sorted(size_run))} GB against {'/'.join(sorted(size_dev))} GB"
    words = [w for w in run if not _CAPACITY.fullmatch(w)]
    if not words:
        return "no GPU model in the run's name"
    n = len(words)
    if any(dev[i:i + n] == words for i in range(len(dev) - n + 1)):
        return None
    return f"{' '.join(words)!r} is not a whole word (or words) of the device's name"


def same_gpu(a: str, b: str) -> bool:
    """Whether two GPU names name one GPU (either is a spelling of the other: ``NVIDIA H200`` and ``h200``). A
    name of one table GPU is read as that GPU's full name first (``h200`` is H200-SXM-141GB), so a name with a
    word that GPU lacks is another GPU (``H200 NVL``, ``H100 PCIe``), not a spelling of it."""
    if a.lower() == b.lower():
        return True
    a, b = _table_name(a), _table_name(b)
    return a.lower() == b.lower() or gpu_mismatch(a, b) is None or gpu_mismatch(b, a) is None


@functools.lru_cache(maxsize=256)
def _table_name(name: str) -> str:
    """The table's full name of the one GPU ``name`` spells (:func:`canonical_gpu`), else ``name`` itself."""
    try:
        key = canonical_gpu(name)
    except InputError:
        return name
    return SHORT_NAMES.get(key.upper(), key)


def canonical_gpu(name: str, field: str = "--gpu") -> str:
    """The table's spelling of GPU ``name``: a short name (A100, H100, ...) or full table name as typed (any case),
    else the short (or full) name of the one table GPU it names by :func:`gpu_mismatch` (``NVIDIA H200``,
    ``NVIDIA H100 80GB HBM3``: nvidia-smi's spellings). A name of no GPU, or of several, is an InputError naming
    them (``field``: the flag or column it came from)."""
    gpus = load_gpus()
    if name.upper() in SHORT_NAMES or any(full.lower() == name.lower() for full in gpus):
        return name
    short = {full: s for s, full in SHORT_NAMES.items()}
    hits = [full for full in gpus if gpu_mismatch(name, full) is None]
    if len(hits) == 1:
        return short.get(hits[0], hits[0])
    if hits:
        raise InputError(field, "gpu", f"GPU {name!r} is ambiguous: it names {', '.join(hits)}; give one of them "
                         "(or its short name)")
    valid = ", ".join(list(SHORT_NAMES) + list(gpus))
    raise InputError(field, "gpu", f"unknown GPU {name!r}; expected one of {valid} (nvidia-smi spellings such as "
                     "'NVIDIA H200' are read too)")


def get_gpu(name: str) -> GPU:
    """A GPU by short name (A100, H100, ...), full table name or a spelling of one (:func:`canonical_gpu`),
    case-insensitive; unknown or ambiguous -> InputError."""
    gpus = load_gpus()
    key = canonical_gpu(name)
    key = SHORT_NAMES.get(key.upper(), key)
    return next(g for full, g in gpus.items() if full.lower() == key.lower())
