"""Notes a run's summary calls for: facts about the result a reader could otherwise miss (printed, never fatal)."""
from __future__ import annotations

from typing import Any, Mapping

LOW_VERIFY_PARTS = 10   # a drafting run verifying under 1/10 of K per request is all but plain decoding


def low_verify_note(s: Mapping[str, Any]) -> str | None:
    """The note for a drafting run under load (more than one request running on average) whose mean verify length
    is below 10% of K, else None."""
    K, v, running = s.get("block_size"), s.get("mean_verify_len"), s.get("mean_running")
    if not K or v is None or running is None or running <= 1 or v * LOW_VERIFY_PARTS >= K:
        return None
    tau = s.get("tau")
    return (f"mean verify length {v:.2f} is below 10% of K={K} with {running:.0f} requests running: policy "
            f"{s.get('policy')} verifies a draft token only when its expected acceptance pays for the step time it "
            f"adds, and on this profile at this batch the verify cost of nearly every token outweighs it, so the run "
            f"is close to plain decoding" + (f" (tau {tau:.2f})" if tau is not None else "")
            + "; compare --policy none and fixed:K, or the production variant confidence-async:2")


def request_latency_note(profile_name: str, seconds: float) -> str | None:
    """The note for a profile carrying a client-side request latency (``request_latency_s``, fitted by ``profile
    fit``), which ``run``/``frontier``/``plan`` leave out of their engine-side TTFT and E2E, else None."""
    if not seconds:
        return None
    return (f"profile {profile_name} carries request_latency_s = {seconds * 1000:.1f} ms (the serving stack's "
            "latency outside the engine, as a benchmark client sees it); TTFT and E2E here are engine-side, without "
            "it (bench replay adds it to every request, as the client measured)")
