"""sweeps/production.toml: its cells run decode-only (no prefill tokens in decode steps but each request's last prompt
token, which samples its first token, and recompute after a preemption) on the built DeepSeek-V3 H200 profile, and the KV transfer follows the profile's kv_bytes_per_token."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dsparksim.sim.simulate import simulate
from dsparksim.sweep.cells import build_config
from dsparksim.sweep.spec import load_spec

REPO = Path(__file__).resolve().parents[1]
SPEC = REPO / "sweeps" / "production.toml"


def _run(**over):
    """One cell of the shipped spec (its [base], the repo's copy of the profile), shortened."""
    spec = load_spec(SPEC)
    values = {**spec.base, "profile": str(REPO / "profiles" / f"{spec.base['profile']}.json"),
              "duration_s": 4.0, "warmup_s": 0.0, **over}
    return simulate(build_config(values, str(SPEC)))


def test_production_spec_is_the_issue_regime():
    spec = load_spec(SPEC)
    assert spec.base["profile"] == "built-h200x8-deepseek-v3-tp8" and spec.base["disaggregated"] is True
    assert "mtp1" in spec.axes["policy"] and spec.base["block_size"] == 5
    # loads reach the paged KV limit: the largest concurrency's chat requests (~1,200+ tokens each) exceed it
    import json
    cap = json.loads((REPO / "profiles" / "built-h200x8-deepseek-v3-tp8.json").read_text())["metadata"][
        "kv_capacity_tokens"]
    assert max(spec.axes["concurrency"]) * 1000 > cap


def test_disaggregated_decode_steps_hold_no_prefill_and_transfer_is_closed_form():
    out = _run(policy="mtp1", concurrency=64)
    res, s = out.result, out.summary
    assert s["num_requests_completed"] > 0 and s["num_preemptions"] == 0
    steps = res.steps
    assert len(steps["n_prefill_tokens"]) > 10
    # the prefill pool built every prompt's KV but the last token, which the request's first step here computes
    assert int(np.sum(steps["n_prefill_tokens"])) == int(np.isfinite(res.first_token_s).sum())
    assert np.asarray(steps["n_prefill_tokens"]).max() <= np.asarray(steps["n_running"]).max()
    # TTFT transfer part = prompt * 61 layers * (512 + 64) * 2 bytes * 8 / 400 Gbit/s (metadata.kv_bytes_per_token)
    seen = np.isfinite(res.ttft_transfer_s)
    assert seen.sum() > 0
    np.testing.assert_allclose(res.ttft_transfer_s[seen], res.prompt_tokens[seen] * 61 * 576 * 2 * 8 / 400e9,
                               rtol=1e-12)


def test_disaggregated_prefill_tokens_only_recompute_after_preemption():
    # a KV cache far too small for 64 chat users at K = 5: paged KV must preempt (by recompute); 40,000 tokens
    # stopped preempting within 4 s once the step-weighted acceptance landed (2 preemptions at 30,000)
    out = _run(policy="fixed:5", concurrency=64, kv_capacity_tokens=30_000)
    res, s = out.result, out.summary
    assert s["num_preemptions"] > 0 and s["recomputed_tokens"] > 0
    pf = np.asarray(res.steps["n_prefill_tokens"])
    pre = np.asarray(res.steps["preempted"])
    first = int(np.argmax(pre > 0))
    assert pre[first] > 0
    n_first = int(np.isfinite(res.first_token_s).sum())   # one prompt token per request: its first step here
    assert pf[:first + 1].sum() <= n_first       # before a preemption only those are prefilled on the decode engine
    assert pf.sum() > n_first                    # the victims re-prefill here (recompute)
    # re-prefill never exceeds the KV tokens the preemptions threw away
    assert pf.sum() - n_first <= int(np.asarray(res.recomputed_tokens).sum())
    assert np.all(np.asarray(res.steps["kv_pages"]) * 16 <= 30_000 + 15)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(pytest.main([__file__, "-q"]))
