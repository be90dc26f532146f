"""The `none` policy: plain autoregressive decoding (K = 0, no drafter, no draft KV slots)."""
from __future__ import annotations

import numpy as np
import pytest

from dsparksim.config import EngineConfig, RunConfig
from dsparksim.results.frontier import DEFAULT_POLICIES
from dsparksim.sim.inputs import resolve_inputs
from dsparksim.sim.simulate import simulate
from dsparksim.traffic import TrafficConfig


def _run(policy: str, **kw):
    t = dict(mode="closed", concurrency=6, duration_s=8.0)
    t.update(kw)
    return simulate(RunConfig(policy=policy, traffic=TrafficConfig(**t), seed=3))


def test_none_resolves_to_k0_without_drafter_or_acceptance_draws():
    ri = resolve_inputs(RunConfig(policy="none"))
    assert ri.K == 0 and ri.drafter is None and ri.acceptance.K == 0 and ri.acceptance_spec == "none"
    assert "none" in DEFAULT_POLICIES


def test_none_emits_one_token_per_request_per_step_and_pays_no_drafting():
    out = _run("none")
    s, res, prof = out.summary, out.result, resolve_inputs(out.config).profile
    st = {k: np.asarray(v) for k, v in res.steps.items()}
    dec = st["n_decode"] > 0
    assert dec.sum() > 200
    # exactly one token per decoding request per step, nothing verified: M = anchors + prefill tokens
    assert (st["decode_emitted"] == st["n_decode"]).all()
    assert (st["verify_tokens"] == 0).all() and (st["M"] == st["n_decode"] + st["n_prefill_tokens"]).all()
    assert s["tau"] == 1.0 and s["mean_verify_len"] == 0.0 and s["block_size"] == 0 and s["drafter"] is None
    done = res.completed
    assert (res.decode_steps[done] == res.output_tokens[done] - 1).all()    # the first token comes from prefill
    # a decode-only step costs the verify term plus fixed and batch overheads: no drafting term at all
    only = dec & (st["n_prefill_tokens"] == 0)
    want = [float(prof.verify_time(np.array([m]), kv)[0]) + prof.fixed_overhead_s + float(prof.batch_overhead_time(n))
            for m, kv, n in zip(st["M"][only], st["kv_read"][only], st["n_decode"][only])]
    np.testing.assert_allclose(st["dt"][only], want, rtol=1e-12)
    # ... which fixed:7 does pay: its step at the same n costs more than the verify term alone would
    assert prof.draft_time("dspark", 6, 7) > 0 and prof.draft_time(None, 6, 7) == 0


@pytest.mark.parametrize("kv_policy", ["reserve", "paged"])
def test_none_reserves_no_draft_kv_slots(kv_policy):
    # one-token pages so both KV policies count the same tokens: paged holds ceil((context + K) / page) pages
    pages = {"kv_page_tokens": 1} if kv_policy == "paged" else {}   # reserve has no pages (refused there)
    eng = EngineConfig(kv_policy=kv_policy, **pages)
    kv = {}
    for pol in ("none", "fixed:7"):
        st = {k: np.asarray(v) for k, v in simulate(RunConfig(policy=pol, seed=3, engine=eng, traffic=TrafficConfig(
            mode="closed", concurrency=6, duration_s=8.0))).result.steps.items()}
        only = (st["n_prefill_tokens"] == 0) & (st["n_decode"] == st["n_running"]) & (st["n_decode"] > 0)
        assert only.sum() > 100
        kv[pol] = st["kv_used"][only] - st["kv_read"][only], st["n_running"][only]
    assert (kv["none"][0] == 0).all()                        # context only: no draft slots
    assert (kv["fixed:7"][0] == 7 * kv["fixed:7"][1]).all()  # K = 7 slots per running request
    # prompt + output within 7 tokens below the KV capacity: served without draft slots, rejected with K = 7
    cap = 1500
    res = {}
    for pol in ("none", "fixed:7"):
        cfg = RunConfig(policy=pol, traffic=TrafficConfig(mode="closed", concurrency=4, duration_s=8.0), seed=3,
                        engine=EngineConfig(kv_capacity_tokens=cap, kv_policy=kv_policy, **pages))
        r = simulate(cfg).result
        tot = r.prompt_tokens + r.output_tokens
        res[pol] = (tot, r.rejected)
    edge = {pol: (tot > cap - 7) & (tot <= cap) for pol, (tot, _) in res.items()}
    assert edge["none"].sum() + edge["fixed:7"].sum() >= 1
    assert not res["none"][1][edge["none"]].any() and res["fixed:7"][1][edge["fixed:7"]].all()
    assert (res["none"][1] == (res["none"][0] > cap)).all()


@pytest.mark.parametrize("flag", [["-K", "5"], ["--acceptance", "dflash"], ["--mtp1-acceptance", "mtp1"]])
def test_options_none_never_reads_are_errors(flag, tmp_path, capsys):
    from dsparksim.cli.main import main
    with pytest.raises(SystemExit) as e:
        rc = main(["run", "--policy", "none", "--duration", "1", "--out", str(tmp_path / "o"), *flag])
        raise SystemExit(rc)
    assert e.value.code == 2
    assert "no effect with --policy none" in capsys.readouterr().err
