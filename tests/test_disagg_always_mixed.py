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


FITTED_SGLANG = "fitted-h200x8-deepseek-r1-sglang-0.5.12"   # fitted under mixed_prefill = false


def test_a_moot_mixed_prefill_false_is_said_beside_disaggregated():
    """The fit's note listed mixed_prefill = false as 'used' on a disaggregated run (run, study's production
    regime, sweep, plan), and config.json / study.json record it, while the decode-only engine mixed anyway; the
    note now says it changes nothing there. Colocated, the note is as before."""
    from dsparksim.cost.fitted import fit_defaults, key_spelling

    fd = fit_defaults(FITTED_SGLANG, {"disaggregated": True})
    assert fd.used.get("mixed_prefill") is False
    note = fd.note(key_spelling)
    assert "mixed_prefill = false changes nothing here" in note and "disaggregated = true" in note, note
    colocated = fit_defaults(FITTED_SGLANG, {}).note(key_spelling)
    assert "mixed_prefill = false" in colocated and "changes nothing" not in colocated, colocated


def test_a_typed_no_mixed_prefill_beside_disaggregated_is_noted(tmp_path, capsys):
    """`run --disaggregated --no-mixed-prefill` simulated a mixing engine and config.json said mixed_prefill
    false, without a word; a note says the option changes nothing there."""
    from dsparksim.cli.main import main

    args = ["run", "--disaggregated", "--kv-transfer-gbps", "100", "--kv-bytes-per-token", "524288",
            "--concurrency", "2", "--num-requests", "4", "--quiet"]
    assert main([*args, "--no-mixed-prefill", "--out", str(tmp_path / "a")]) == 0
    err = capsys.readouterr().err
    assert "--no-mixed-prefill changes nothing beside --disaggregated" in err, err
    assert main([*args, "--out", str(tmp_path / "b")]) == 0
    assert "changes nothing" not in capsys.readouterr().err
    assert main(["run", "--no-mixed-prefill", "--concurrency", "2", "--num-requests", "4", "--quiet",
                 "--out", str(tmp_path / "c")]) == 0
    assert "changes nothing" not in capsys.readouterr().err


def test_a_given_mixed_prefill_beside_disaggregated_is_no_difference_from_the_fit():
    """`--disaggregated --mixed-prefill` on a profile fitted under mixed_prefill false got the caution that the
    setting differs from the fit's and 'figures on this one carry an error the fit never measured', while a
    decode-only engine always mixes: the run is the one the fit's value gives. Colocated, the caution stays."""
    from dsparksim.cost.fitted import fit_defaults, fit_lines

    fd = fit_defaults(FITTED_SGLANG, {"disaggregated": True, "mixed_prefill": True})
    assert "mixed_prefill" not in fd.differs and "mixed_prefill" not in fd.used, fd
    assert not [x for x in fit_lines([fd]) if "caution" in x], fit_lines([fd])
    colocated = fit_defaults(FITTED_SGLANG, {"mixed_prefill": True})
    assert colocated.differs == {"mixed_prefill": True}
    assert any("caution: mixed_prefill = true differs" in x for x in fit_lines([colocated]))
