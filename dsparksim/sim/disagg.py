"""The prefill pool of a disaggregated deployment (``--disaggregated``): it builds each prompt's KV and ships it to
a decode engine.

Model (deliberately simple, every part reported per request):

* ``replicas`` identical prefill instances serve requests FIFO in arrival order; a request goes to the instance
  that is free first and waits for it (``ttft_queue``).
* An instance runs one request at a time (no batching across requests), its prompt in chunks of
  ``chunk_tokens`` tokens; a chunk of c tokens after s already prefilled costs one prefill-only step of the cost
  profile, ``StepShape.prefill_chunk(c, s)`` priced by the profile's pricer (:mod:`dsparksim.cost.price`: the
  verify term at M = c and KV read s + c, the fixed overhead and the prefill terms, the drafter's prompt update
  included; a profile's measured ``prefill.only`` price when it has one, as the engine) -- ``ttft_prefill``. The
  verify lookup is summed first (no dense table), as this pool always has.
* The prompt's KV then crosses the link at full bandwidth, with no contention between transfers:
  ``prompt_tokens * kv_bytes_per_token * 8 / (kv_transfer_gbps * 1e9)`` seconds (``ttft_transfer``).

The KV then waits on the decode engine for admission (room in its KV cache: ``ttft_decode_wait``), and the decode
engine's first step for the request computes its last prompt token and samples the first output token
(``ttft_first_step``; vLLM's P/D connectors load the KV of all but the last prompt token). TTFT = queue + prefill +
transfer + decode wait + first step.
"""
from __future__ import annotations

import heapq
import math
from dsparksim.cost.price import StepPricer, StepShape
from dsparksim.cost.profile import CostProfile
from dsparksim.errors import ConfigError


def kv_transfer_terms(profile: CostProfile, gbps: float | None, bytes_per_token: float | None) -> tuple[float, float]:
    """(link Gbit/s, KV bytes per token) of a disaggregated run: the link from ``--kv-transfer-gbps`` (required),
    the bytes from ``--kv-bytes-per-token`` or else the profile's ``metadata.kv_bytes_per_token``."""
    if gbps is None:
        raise ConfigError("config", "kv_transfer_gbps", "a disaggregated run ships each prompt's KV from the "
                          "prefill pool to a decode engine: give the link bandwidth with --kv-transfer-gbps "
                          "(Gbit/s)")
    if bytes_per_token is None:
        v = profile.metadata.get("kv_bytes_per_token")
        if v is None:
            raise ConfigError(f"profile '{profile.name}' ({profile.source})", "metadata.kv_bytes_per_token",
                              "a disaggregated run needs the KV bytes per token to price the transfer; the profile "
                              "does not give it: pass --kv-bytes-per-token (e.g. Llama-2-7B bf16: 2 x 32 layers x "
                              "4096 x 2 bytes = 524288)")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise ConfigError(f"profile '{profile.name}' ({profile.source})", "metadata.kv_bytes_per_token",
                              f"expected a number > 0, got {v!r}")
        bytes_per_token = float(v)
    return float(gbps), float(bytes_per_token)


class PrefillPool:
    """FIFO prefill instances (see the module doc); :meth:`serve` gives one request's TTFT parts."""

    def __init__(self, *, profile: CostProfile, drafter: str | None, K: int, replicas: int, chunk_tokens: int,
                 gbps: float, bytes_per_token: float) -> None:
        if replicas < 1 or chunk_tokens < 1:
            raise ValueError(f"need replicas >= 1 and chunk_tokens >= 1, got {replicas}, {chunk_tokens}")
        self.profile, self.drafter, self.K = profile, drafter, int(K)
        self.chunk = int(chunk_tokens)
        self.bytes_per_s = float(gbps) * 1e9 / 8.0
        self.bytes_per_token = float(bytes_per_token)
        self._free = [0.0] * int(replicas)     # heap of the instances' next free times
        self._memo: dict[int, float] = {}
        self.pricer = StepPricer(profile, dense=False)

    def prefill_s(self, prompt: int) -> float:
        """Seconds one instance takes to prefill a ``prompt``-token prompt (chunked; see the module doc)."""
        t = self._memo.get(prompt)
        if t is None:
            t, s = 0.0, 0
            while s < prompt:
                c = min(self.chunk, prompt - s)
                t += self.pricer.seconds(StepShape.prefill_chunk(c, s, self.drafter, self.K))
                s += c
            self._memo[prompt] = t
        return t

    def transfer_s(self, prompt: int) -> float:
        """Seconds the prompt's KV takes over the link."""
        return prompt * self.bytes_per_token / self.bytes_per_s

    def serve(self, t: float, prompt: int) -> tuple[float, float, float]:
        """A request arriving at ``t`` (calls in arrival order): (queue, prefill, transfer) seconds."""
        free = heapq.heappop(self._free)
        start = max(t, free)
        pf = self.prefill_s(int(prompt))
        heapq.heappush(self._free, start + pf)
        return start - t, pf, self.transfer_s(int(prompt))
