"""Issue 31 item 20: `regress` compares seed by seed (per-seed values stored in the baseline) and flags a change
whose paired 95% interval excludes zero AND exceeds the practical threshold (2% of the baseline mean), each
policy's regression under its own name. Injected slowdowns (tests/regress_inject.py) on a small fixed sweep; the
full detection / false-alarm study is benchmarks/regress_power.py."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from regress_inject import slowdown  # noqa: E402

from dsparksim.sweep.regress import compare, regress  # noqa: E402

SPEC = """
[sweep]
name = "regress-small"
[base]
profile = "h100-llama2-7b-tp1"
acceptance = "dspark"
block_size = 7
duration_s = 4.0
domain = "mix:math=1,code=1,chat=1"
seed = 11
[axes]
policy = ["mtp1", "fixed:7"]
concurrency = [8, 32]
[regress]
seeds = 3
"""


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    d = tmp_path_factory.mktemp("regress")
    (d / "spec.toml").write_text(SPEC)
    ok, msg, doc = regress(d / "baseline.json", spec_path=d / "spec.toml", backend="serial", update=True)
    assert ok, msg
    return d / "baseline.json"


def _flagged(msg: str) -> list[str]:
    block = msg.partition("\nnote: ")[0]
    return [ln.strip()[:-1] for ln in block.splitlines() if ln.startswith("  ") and not ln.startswith("    ")]


def test_baseline_stores_per_seed_values(baseline):
    doc = json.loads(baseline.read_text())
    assert doc["format"] == "dsparksim-regress/3" and doc["seeds"] == [11, 12, 13]
    pt = doc["frontier"][0]
    assert len(pt["output_throughput_tok_s"]) == 3 and len(set(pt["output_throughput_tok_s"])) == 3
    assert doc["tolerances"]["threshold"] == 0.02


def test_unchanged_code_passes(baseline):
    ok, msg, _ = regress(baseline, backend="serial")
    assert ok and "frontiers match the baseline" in msg, msg


def test_a_5pct_profile_slowdown_is_flagged_for_every_policy(baseline):
    with slowdown(1.05):
        ok, msg, _ = regress(baseline, backend="serial")
    assert not ok
    assert set(_flagged(msg)) == {"mtp1", "fixed:7"}, msg
    assert "output_throughput_tok_s" in msg and "paired 95% CI" in msg


def test_a_5pct_mtp1_slowdown_is_reported_under_mtp1_only(baseline):
    with slowdown(1.05, policy="mtp1"):
        ok, msg, _ = regress(baseline, backend="serial")
    assert not ok and _flagged(msg) == ["mtp1"], msg


def test_a_1pct_slowdown_is_below_the_practical_threshold(baseline):
    with slowdown(1.01):
        ok, msg, _ = regress(baseline, backend="serial")
    assert ok, msg


def _doc(base, new, seeds=(1, 2, 3), threshold=0.02):
    def d(vals):
        return {"format": "dsparksim-regress/3", "spec": "s.toml", "spec_sha256": "x", "seeds": list(seeds),
                "tolerances": {"threshold": threshold, "confidence": 0.95, "rtol": 1e-6, "atol": 1e-9},
                "metrics": ["output_throughput_tok_s"],
                "frontier": [{"policy": "p", "load": 8, "output_throughput_tok_s": list(vals),
                              "pareto": [True] * len(vals), "saturated": [False] * len(vals)}]}
    return d(base), d(new)


@pytest.mark.parametrize("new,flag", [
    ([96.0, 194.0, 291.0], True),      # -4%, -3%, -3%: the paired CI excludes 0 and the mean -3.3% exceeds 2%
    ([99.0, 198.0, 297.0], False),     # -1% at every seed: the CI excludes 0 but 1% < the 2% practical threshold
    ([80.0, 215.0, 290.0], False),     # -20%, +7.5%, -3.3%: mean -5.3% but the paired CI straddles zero
    ([100.0, 200.0, 300.0], False),    # unchanged
])
def test_rule_needs_both_an_interval_excluding_zero_and_the_threshold(new, flag):
    b, g = _doc([100.0, 200.0, 300.0], new)
    assert bool(compare(b, g)) is flag


def test_paired_beats_unpaired_intervals():
    # seeds differ a lot from each other (100..300) but every seed loses 3%: the unpaired intervals of format 2
    # overlap completely, the paired differences are all -3%
    base = [100.0, 200.0, 300.0]
    b, g = _doc(base, [x * 0.97 for x in base])
    d = compare(b, g)
    assert list(d) == ["p"] and "-3.00%" in d["p"][0]
