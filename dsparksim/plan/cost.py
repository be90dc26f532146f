"""Dollar arithmetic of a deployment: GPUs x price per hour, and the price of a million output tokens."""
from __future__ import annotations

import math


def cost_per_hour(replicas: int, gpus_per_replica: int, price_per_gpu_hour: float, prefill_gpus: int = 0) -> float:
    """$ per hour of ``replicas`` decode replicas of ``gpus_per_replica`` GPUs plus a prefill pool of
    ``prefill_gpus`` GPUs (disaggregated deployments; 0 otherwise), all at ``price_per_gpu_hour``."""
    return (replicas * gpus_per_replica + prefill_gpus) * price_per_gpu_hour


def cost_per_mtok(dollars_per_hour: float, output_tok_s: float | None) -> float | None:
    """$ per million output tokens at ``output_tok_s`` output tokens per second: $/h / (3600 x tok/s) x 1e6.
    None when nothing was produced (no finite price)."""
    if output_tok_s is None or not math.isfinite(output_tok_s) or output_tok_s <= 0:
        return None
    return dollars_per_hour / (3600.0 * output_tok_s) * 1e6


def max_replicas_below(key: tuple[float, int], index: int, gpus_per_replica: int, prefill_gpus: int, price: float,
                       lo: int, hi: int) -> int:
    """The largest replica count r in [lo, hi] whose (cost, deployment index) sorts before ``key`` (the family's
    cheapest so far: cheaper, or as cheap and listed earlier); lo - 1 when none does (the deployment cannot win)."""
    best = lo - 1
    for r in range(lo, hi + 1):  # cost grows with r: stop at the first that does not beat the key
        if (cost_per_hour(r, gpus_per_replica, price, prefill_gpus), index) < key:
            best = r
        else:
            break
    return best
