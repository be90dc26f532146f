"""Paper-published acceptance numbers (package copy of the shared ``dspark_acceptance.json``).

One job: turn the JSON into per-(drafter, domain) conditional-acceptance curves of a requested length and the
Table 1 domain means, stating every assumption made on the way (e.g. the eagle3 tail).
"""
from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Any

import numpy as np

from dsparksim.errors import ConfigError
from dsparksim.acceptance.base import DOMAINS

K_MAX = 15                     # positions 1..7 measured, 8..15 the fitted flat tail
MEASURED_POSITIONS = 7
PAPER_BLOCK_DRAFTERS = ("dspark", "dflash", "eagle3")
DATA_NAME = "dspark_acceptance.json"


@lru_cache(maxsize=1)
def load_reference() -> dict[str, Any]:
    """The packaged JSON (read once)."""
    text = resources.files("dsparksim.data").joinpath(DATA_NAME).read_text(encoding="utf-8")
    return json.loads(text)


# The MTP-1 baseline's one acceptance, by named source (``mtp1-v3`` / ``mtp1-v4`` specs; plain ``mtp1`` = v3).
MTP1_SOURCES = ("v3", "v4")
MTP1_DEFAULT_SOURCE = "v3"


def mtp1_alpha(source: str = MTP1_DEFAULT_SOURCE) -> tuple[float, str]:
    """(acceptance, provenance) of the MTP-1 draft token for a named source.

    v3: 0.87, the DeepSeek-V3 technical report (second-token acceptance 85-90%).
    v4: 0.775, the midpoint of DeepSeek-V4's MTP position-1 acceptance 0.76-0.79 (reference JSON,
        ``other_published_tau.deepseek_v4_mtp_k2_unconditional_pos1_pos2``) -- the DSpark paper's production baseline.
    """
    ref = load_reference()
    if source == "v3":
        return float(ref["conditional_acceptance"]["mtp1"]["all"]["pos_1"]), (
            "DeepSeek-V3 technical report: second-token (MTP-1) acceptance 85-90%, 0.87 used")
    if source == "v4":
        lo, hi = (float(x) for x in ref["other_published_tau"]["deepseek_v4_mtp_k2_unconditional_pos1_pos2"][0])
        return (lo + hi) / 2, (f"DeepSeek-V4 MTP position-1 acceptance {lo:.2f}-{hi:.2f} (the DSpark paper's "
                               f"production baseline), midpoint {(lo + hi) / 2:.3f} used")
    raise ConfigError(DATA_NAME, "mtp1 source", f"expected one of {MTP1_SOURCES}, got {source!r}")


def paper_curve(drafter: str, domain: str, K: int, mtp1_source: str = MTP1_DEFAULT_SOURCE
                ) -> tuple[np.ndarray, list[str]]:
    """Conditional acceptance alpha_1..alpha_K for a paper drafter and domain, plus the assumptions used.

    mtp1 has one number for every domain (``mtp1_source``: v3 = DeepSeek-V3 report, 0.87; v4 = DeepSeek-V4,
    0.775) and K must be 1.
    """
    ref = load_reference()["conditional_acceptance"]
    src = f"{DATA_NAME}"
    if drafter not in ref:
        raise ConfigError(src, "drafter", f"unknown paper drafter {drafter!r}; expected one of {sorted(ref)}")
    if not 1 <= K <= K_MAX:
        raise ConfigError(src, "K", f"block size must be in 1..{K_MAX} (paper data has {K_MAX} positions), got {K}")
    notes: list[str] = []
    if drafter == "mtp1":
        if K != 1:
            raise ConfigError(src, "K", f"mtp1 drafts exactly one token (K=1), got K={K}")
        alpha, why = mtp1_alpha(mtp1_source)
        notes.append(f"mtp1 ({mtp1_source}): one acceptance {alpha:.3f} for every domain ({why}); domain does not "
                     "change it")
        return np.array([alpha]), notes
    if domain not in ref[drafter]:
        raise ConfigError(src, "domain", f"no {drafter} curve for domain {domain!r}; expected one of {DOMAINS}")
    entry = ref[drafter][domain]
    measured = [float(a) for a in entry["pos_1_7"]]
    curve = measured[:K]
    if K > MEASURED_POSITIONS:
        tail = entry.get("tail_8_15")
        if tail is None:
            tail = measured[-1]
            notes.append(f"{drafter}: the paper has no tail for positions 8..15; ASSUMED a flat tail equal to the "
                         f"position-7 value ({tail:.3f} for {domain})")
        else:
            notes.append(f"{drafter}: positions 8..{K} use the flat tail {float(tail):.3f} ({domain}) fitted to the "
                         "paper's Fig. 4 tau at draft length 16 (lower confidence than positions 1..7)")
        curve += [float(tail)] * (K - MEASURED_POSITIONS)
    return np.array(curve), notes


def table1_domain_tau(drafter: str) -> dict[str, float]:
    """Table 1 (Qwen3-4B, block 7): mean of the three benchmark columns of each domain."""
    t = load_reference()["table1_tau_qwen3_4b_block7"]
    vals = np.asarray(t[drafter], dtype=float)
    doms = np.asarray(t["_domains"])
    return {d: float(vals[doms == d].mean()) for d in DOMAINS}


def confidence_head_quality() -> dict[str, Any]:
    """Published confidence-head AUC by position and ECE (raw / after temperature scaling)."""
    return dict(load_reference()["confidence_head_quality"])
