"""Simulate recorded-looking blocks from any acceptance model, and write them as a (synthetic) trace file."""
from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Sequence

import numpy as np

from dsparksim.acceptance.base import DOMAINS, AcceptanceModel
from dsparksim.acceptance.trace_format import write_trace


def simulate_blocks(model: AcceptanceModel, domains: Sequence[str], lengths: Sequence[int],
                    rng: np.random.Generator) -> dict[str, np.ndarray]:
    """One response per entry of ``domains`` with ``lengths[i]`` blocks each, drawn step by step.

    Uses slots 0..len(domains)-1 of ``model`` (run it on a model outside a simulation). Returns arrays in trace
    layout: request_id, domain, step, accepted_len, conf (N, K).
    """
    doms = np.asarray(domains, dtype=object)
    lens = np.asarray(lengths, dtype=np.int64)
    if doms.size != lens.size or (lens < 1).any():
        raise ValueError("simulate_blocks: one positive length per domain entry is needed")
    slots = np.arange(doms.size)
    model.start(slots, doms, rng)
    rid, step, acc, conf = [], [], [], []
    for b in range(int(lens.max())):
        live = slots[lens > b]
        blk = model.draw(live, rng)
        rid.append(live)
        step.append(np.full(live.size, b))
        acc.append(blk.accepted)
        conf.append(blk.conf)
    r = np.concatenate(rid)
    order = np.lexsort((np.concatenate(step), r))
    return {"request_id": r[order], "domain": doms[r[order]], "step": np.concatenate(step)[order],
            "accepted_len": np.concatenate(acc)[order], "conf": np.vstack(conf)[order]}


def write_parametric_trace(path: str | Path, spec: str = "dspark", K: int = 7, *, requests_per_domain: int = 12,
                           blocks: tuple[int, int] = (4, 16), domains: Sequence[str] = DOMAINS, seed: int = 0,
                           created: str | None = None) -> Path:
    """Write a synthetic acceptance trace drawn from a parametric spec (e.g. ``"dspark"``).

    Each response has a uniformly random number of blocks in ``blocks`` (inclusive). The metadata says
    "synthetic, from the parametric model" and records the spec, seed and model parameters.
    """
    from dsparksim.acceptance import load_acceptance  # local import: the registry imports this module's siblings

    model = load_acceptance(spec, K)
    rng = np.random.default_rng(seed)
    doms = np.repeat(np.asarray(domains, dtype=object), requests_per_domain)
    lens = rng.integers(blocks[0], blocks[1] + 1, size=doms.size)
    data = simulate_blocks(model, doms, lens, rng)
    desc = model.describe()
    meta = {
        "drafter": model.drafter, "K": K, "temperature": 1.0,
        "target": "none (synthetic; curves from the paper's Qwen3-4B target)",
        "source": f"synthetic, from the parametric model (spec {spec!r}, seed {seed}); not a recording",
        "created": created or datetime.now(timezone.utc).replace(microsecond=0).isoformat(),
        "generator": "dsparksim.acceptance.synthetic.write_parametric_trace",
        "params": desc.get("params"),
    }
    return write_trace(path, data, meta)
