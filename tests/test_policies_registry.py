"""Policy registry: every spec parses to the right class, bad specs raise ConfigError naming the spec."""
from __future__ import annotations

import pytest

from dsparksim.errors import ConfigError
from dsparksim.policies import REGISTRY, list_policies, list_specs, make_policy
from dsparksim.policies.base import Policy

GOOD = {
    "mtp1": "mtp1", "fixed:7": "fixed", "fixed:1": "fixed", "threshold:0.6": "threshold", "threshold:0": "threshold",
    "threshold:1": "threshold", "goodput": "goodput", "confidence": "confidence",
    "confidence-async": "confidence-async", "confidence-async:3": "confidence-async",
    "confidence-global": "confidence-global", "oracle": "oracle",
}


@pytest.mark.parametrize("spec,name", GOOD.items())
def test_good_specs_parse(spec, name):
    p = make_policy(spec)
    assert isinstance(p, REGISTRY[name]) and p.name == name
    assert p.spec == spec


def test_args_reach_the_instance():
    assert make_policy("fixed:7").spec == "fixed:7" and make_policy("fixed:7").k == 7
    assert make_policy("threshold:0.25").t == 0.25
    assert make_policy("confidence-async").lag == 2
    assert make_policy("confidence-async:5").lag == 5
    assert make_policy("mtp1").drafter == "mtp1" and make_policy("mtp1").block_size == 1
    assert make_policy("oracle").needs_oracle and not make_policy("confidence").needs_oracle


BAD = ["nope", "nope:3", "fixed", "fixed:", "fixed:0", "fixed:-2", "fixed:2.5", "fixed:x", "fixed:3:4",
       "threshold", "threshold:1.01", "threshold:-0.1", "threshold:nan", "threshold:abc", "mtp1:1", "goodput:2",
       "confidence:1", "oracle:x", "confidence-async:-1", "confidence-async:0", "confidence-async:1.5",
       "confidence-async:", "confidence-global:2", "", "Confidence"]


@pytest.mark.parametrize("spec", BAD)
def test_bad_specs_raise_config_error_naming_spec(spec):
    with pytest.raises(ConfigError) as e:
        make_policy(spec)
    msg = str(e.value)
    assert repr(spec) in msg
    assert "valid specs" in msg and all(u in msg for u in list_specs())


def test_from_arg_directly_raises_config_error():
    with pytest.raises(ConfigError, match="'fixed:0'"):
        REGISTRY["fixed"].from_arg("0")


def test_registry_shape_and_help():
    assert all(issubclass(c, Policy) for c in REGISTRY.values())
    assert set(REGISTRY) == {c.name for c in REGISTRY.values()}
    lines = list_policies()
    assert len(lines) == len(REGISTRY)
    assert any(line.startswith("confidence-global") and "NOT LOSSLESS" in line for line in lines)
