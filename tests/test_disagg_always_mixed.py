"""A decode-only engine (``--disaggregated``) never runs a prefill-only step, whatever ``mixed_prefill`` says.

SGLang's decode server runs no prefill forward for a transferred request (its PrebuiltExtendBatch only fills
metadata and the request joins the running batch: python/sglang/srt/disaggregation/decode.py), so the one-token
first step of each arriving request rides with the decoding requests. Before, ``mixed_prefill=False`` (a fitted
SGLang profile's server) made each of those one-token steps stall every decoding request (~10% of throughput at
64 users).
"""
from __future__ import annotations

import numpy as np

from dsparksim.config import RunConfig
from dsparksim.sim.simulate import simulate

OPTS = dict(profile="built-h200x8-deepseek-v3-tp8", disaggregated=True, kv_transfer_gbps=400.0, prefill_replicas=8,
            policy="fixed:3", concurrency=32, duration_s=6.0, seed=3)


def _run(mixed: bool):
    return simulate(RunConfig.from_options(dict(OPTS, mixed_prefill=mixed), source="test"))


def test_decode_only_engine_mixes_whatever_mixed_prefill_says():
    mixed, unmixed = _run(True), _run(False)
    a, b = mixed.result.steps, unmixed.result.steps
    # every arriving request's one-token first step carried decode rows too: no step with a prefill chunk and no
    # decode while requests were decoding
    n_dec, chunks = np.asarray(b["n_decode"]), np.asarray(b["prefill_chunks"])
    assert (chunks > 0).sum() > 10 and ((chunks > 0) & (n_dec > 0)).sum() > 10
    assert list(a["dt"]) == list(b["dt"]) and list(a["n_decode"]) == list(b["n_decode"])
    assert mixed.summary == unmixed.summary
