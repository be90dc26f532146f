"""The workload a run serves: who arrives when, with how many prompt and output tokens, from which domain."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class Workload:
    """Requests in issue order.

    prompt_tokens: (n,) int64 >= 1
    output_tokens: (n,) int64 >= 1   (the request emits exactly this many tokens, then finishes)
    domain:        (n,) object array of domain strings ("math" | "code" | "chat")
    arrival_s:     (n,) float64 non-decreasing arrival times for open loop; None for closed loop.
    concurrency:   closed loop only: number of users; user u sends request rows in order as it frees up
                   (row j goes to the first free user). None for open loop.
    metadata:      what generated it (process, rate, burstiness, trace file, replay mode, scaling, ...).

    For closed loop the arrays are a pool long enough for the run; running out ends the run (reported, never
    silently recycled).
    """

    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    domain: np.ndarray
    arrival_s: np.ndarray | None = None
    concurrency: int | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.prompt_tokens)
        if len(self.output_tokens) != n or len(self.domain) != n:
            raise ValueError(f"Workload arrays differ in length: {n}, {len(self.output_tokens)}, {len(self.domain)}")
        if (self.arrival_s is None) == (self.concurrency is None):
            raise ValueError("Workload needs exactly one of arrival_s (open loop) or concurrency (closed loop)")
        if self.arrival_s is not None and len(self.arrival_s) != n:
            raise ValueError(f"arrival_s has {len(self.arrival_s)} rows, expected {n}")

    @property
    def closed_loop(self) -> bool:
        return self.concurrency is not None

    def __len__(self) -> int:
        return len(self.prompt_tokens)
