"""Small real cost profiles for engine tests: any verify curve, tabulated at every M (a typed CostProfile, as the
engine requires, instead of a duck-typed stand-in)."""
from __future__ import annotations

from typing import Callable

import numpy as np

from dsparksim.cost.profile import CostProfile, profile_from_dict


def stand_in_profile(verify: Callable[[np.ndarray], np.ndarray], max_tokens: int, draft: float = 0.0,
                     name: str = "stand-in", drafters: tuple[str, ...] = ("dspark", "mtp1")) -> CostProfile:
    """verify_time(M) = verify(M) at every M = 1..max_tokens (no context term), no fixed overhead; each drafter
    costs ``draft`` seconds on a step with decoding requests (a parallel drafter, flat over its tokens)."""
    M = np.arange(1, max_tokens + 1)
    t = np.broadcast_to(np.asarray(verify(M), dtype=np.float64), M.shape)
    return profile_from_dict({
        "format": "dsparksim-profile/1", "name": name,
        "metadata": {"device": "test", "model": "test", "source": "test", "method": "stand-in"},
        "verify": {"M": M.tolist(), "time_s": t.tolist()}, "fixed_overhead_s": 0.0,
        "drafters": {d: {"kind": "parallel", "tokens": [1, 10**9], "time_s": [float(draft)] * 2} for d in drafters}})
