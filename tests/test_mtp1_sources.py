"""Named MTP-1 acceptance sources: mtp1 = mtp1-v3 (DeepSeek-V3, 0.87) and mtp1-v4 (DeepSeek-V4, 0.76-0.79)."""
from __future__ import annotations

import pytest

from dsparksim.acceptance import drafter_of, load_acceptance
from dsparksim.acceptance.reference import load_reference
from dsparksim.config import RunConfig
from dsparksim.errors import ConfigError
from dsparksim.sim.simulate import simulate
from dsparksim.traffic import TrafficConfig


def test_named_sources_pick_their_alpha():
    ref = load_reference()
    lo, hi = ref["other_published_tau"]["deepseek_v4_mtp_k2_unconditional_pos1_pos2"][0]
    v3 = ref["conditional_acceptance"]["mtp1"]["all"]["pos_1"]
    assert load_acceptance("mtp1", 1).curves["all"].tolist() == [v3] == [0.87]
    assert load_acceptance("mtp1-v3", 1).curves["all"].tolist() == [0.87]
    a4 = load_acceptance("mtp1-v4", 1)
    assert a4.curves["all"].tolist() == [pytest.approx((lo + hi) / 2)] and lo <= a4.curves["all"][0] <= hi
    assert "DeepSeek-V4" in a4.describe()["provenance"] and drafter_of("mtp1-v4") == "mtp1"
    assert RunConfig().mtp1_acceptance == "mtp1"     # the default baseline is the V3 figure


@pytest.mark.parametrize("spec,K,field", [("mtp1-v5", 1, None), ("mtp1-v4", 7, "K"), ("mtp1-v4:", 1, None)])
def test_bad_mtp1_sources_are_config_errors(spec, K, field):
    with pytest.raises(ConfigError) as e:
        load_acceptance(spec, K)
    assert e.value.field == field


def test_mtp1_runs_with_the_named_source():
    # tau = 1 + alpha for a one-token drafter; 8 users x 10 s ~ 8k steps of one request: SE of tau ~ 0.01
    taus = {}
    for src in ("mtp1", "mtp1-v4"):
        cfg = RunConfig(policy="mtp1", mtp1_acceptance=src, seed=2,
                        traffic=TrafficConfig(mode="closed", concurrency=8, duration_s=10.0))
        taus[src] = simulate(cfg).summary["tau"]
    assert taus["mtp1"] == pytest.approx(1.87, abs=0.04)
    assert taus["mtp1-v4"] == pytest.approx(1.775, abs=0.04)


def test_spec_names_the_source():
    from dsparksim.acceptance import parse_spec
    assert [(parse_spec(s).name, parse_spec(s).arg) for s in ("mtp1", "mtp1-v3", "mtp1-v4?noise_sd=0.2")] == [
        ("mtp1", ""), ("mtp1", "v3"), ("mtp1", "v4")]
