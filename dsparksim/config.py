"""Frozen configuration of one simulated run, saved next to every result (config.json)."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from dsparksim.errors import ConfigError


@dataclass(frozen=True)
class EngineConfig:
    """The serving engine being simulated (DESIGN.md section 6).

    block_size:          K, draft tokens proposed per request per step (mtp1 always runs with 1).
    drafter:             drafting-cost entry of the profile for the block drafter; None = the acceptance
                         source's drafter (mtp1 always uses the profile's "mtp1" entry).
    kv_capacity_tokens:  KV-cache capacity in tokens; None = the profile's metadata value.
    max_num_seqs:        most requests running at once (vLLM's max_num_seqs).
    max_batched_tokens:  token budget of one target forward; None = the profile's largest breakpoint.
    prefill_chunk_tokens: most prefill tokens scheduled in one step (chunked prefill).
    extrapolate:         allow (and report) cost lookups beyond the profile's largest breakpoint.
    """

    block_size: int = 7
    drafter: str | None = None
    kv_capacity_tokens: int | None = None
    max_num_seqs: int = 1024
    max_batched_tokens: int | None = None
    prefill_chunk_tokens: int = 2048
    extrapolate: bool = False

    def __post_init__(self) -> None:
        if not 1 <= self.block_size <= 15:
            raise ConfigError("config", "block_size", f"must be in 1..15, got {self.block_size}")
        if self.max_num_seqs < 1:
            raise ConfigError("config", "max_num_seqs", f"must be >= 1, got {self.max_num_seqs}")
        if self.kv_capacity_tokens is not None and self.kv_capacity_tokens < 1:
            raise ConfigError("config", "kv_capacity_tokens", f"must be >= 1, got {self.kv_capacity_tokens}")
        if self.max_batched_tokens is not None and self.max_batched_tokens < 2:
            raise ConfigError("config", "max_batched_tokens", f"must be >= 2, got {self.max_batched_tokens}")
        if self.prefill_chunk_tokens < 1:
            raise ConfigError("config", "prefill_chunk_tokens", f"must be >= 1, got {self.prefill_chunk_tokens}")


@dataclass(frozen=True)
class RunConfig:
    """One simulated run: which inputs, which policy, which load, how long, which seed."""

    policy: str = "confidence"
    profile: str = "h100-llama2-7b-tp1"
    acceptance: str = "dspark"
    mtp1_acceptance: str = "mtp1"
    engine: EngineConfig = field(default_factory=EngineConfig)
    traffic: Any = None  # dsparksim.traffic.TrafficConfig (kept Any so this module stays import-light)
    warmup_s: float | None = None  # None = 10% of duration for duration-bound runs, 0 for count-bound runs
    seed: int = 0

    def __post_init__(self) -> None:
        if self.warmup_s is not None and not (math.isfinite(self.warmup_s) and self.warmup_s >= 0):
            raise ConfigError("config", "warmup_s", f"must be a finite number >= 0, got {self.warmup_s}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**63:
            # numpy's SeedSequence takes non-negative integers only
            raise ConfigError("config", "seed", f"must be an integer in [0, 2^63), got {self.seed!r}")
        t = self.traffic
        dur = getattr(t, "duration_s", None) if getattr(t, "num_requests", None) is None else None
        if self.warmup_s is not None and dur is not None and self.warmup_s >= dur:
            raise ConfigError("config", "warmup_s", f"must be below duration_s ({dur:g}) so some time is measured, "
                              f"got {self.warmup_s:g}")

    def to_dict(self) -> dict[str, Any]:
        return _jsonable(dataclasses.asdict(self))

    def replace(self, **kw: Any) -> "RunConfig":
        return dataclasses.replace(self, **kw)


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if hasattr(x, "item") and callable(x.item):  # numpy scalars
        return x.item()
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    return str(x)
