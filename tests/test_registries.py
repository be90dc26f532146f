"""Router and acceptance-kind registries (issue 28 part 5): a new router or kind is one class plus one registry
line; spec strings are parsed by the registry; error messages list the registered names."""
from __future__ import annotations

import dataclasses

import pytest

from dsparksim import acceptance
from dsparksim.acceptance import REGISTRY as KINDS
from dsparksim.acceptance import drafter_of, load_acceptance, parse_spec
from dsparksim.acceptance.kinds.tau import Tau
from dsparksim.acceptance.registry import AcceptanceKind
from dsparksim.config import EngineConfig, RunConfig
from dsparksim.errors import ConfigError
from dsparksim.sim.routers import REGISTRY as ROUTERS
from dsparksim.sim.routers import Router, make_router
from dsparksim.sim.shard import refusal
from dsparksim.sim.simulate import simulate
from dsparksim.traffic import TrafficConfig


def test_every_router_declares_whether_it_decides_from_the_request_alone():
    for name, cls in ROUTERS.items():
        assert cls.name == name and isinstance(cls.request_only, bool) and isinstance(cls.pins_users, bool)
        assert not cls.pins_users or cls.request_only
    assert {n for n, c in ROUTERS.items() if not c.request_only} == {"least-outstanding", "least-kv", "session"}


def test_router_errors_list_the_registered_names():
    with pytest.raises(ConfigError) as e:
        make_router("nearest", 2)
    assert all(n in str(e.value) for n in ROUTERS) and "'nearest'" in str(e.value)
    with pytest.raises(ConfigError, match="'pinned' takes no argument"):
        make_router("pinned:3", 2)
    with pytest.raises(ConfigError, match="router"):
        EngineConfig(replicas=2, router="nearest")


class _First(Router):
    """Every request to engine 0 (a request-only router added by a test)."""
    name = usage = "first"
    request_only = True

    def route(self, row, engines, table) -> int:
        return 0


def test_a_new_router_is_one_class_and_one_registry_line(monkeypatch):
    monkeypatch.setitem(ROUTERS, "first", _First)       # the one line
    cfg = RunConfig(policy="fixed:3", traffic=TrafficConfig(mode="poisson", rate=4.0, duration_s=3.0), seed=2)
    cfg = cfg.replace(engine=dataclasses.replace(cfg.engine, replicas=3, router="first"))
    served = simulate(cfg).requests()["replica"]
    assert len(served) > 3 and (served == 0).all()
    assert refusal(cfg) is None                          # request-only: shardable without a list in the sharder


class _Half(AcceptanceKind):
    """``half:X``: the tau:X curve under another name (an acceptance kind added by a test)."""
    kind = "half"
    names = ("half",)
    takes_arg = True
    usage = "'half:X'"

    @classmethod
    def load(cls, ps, K, domain_default, confidence):
        return Tau.load(ps, K, domain_default, confidence)


def test_a_new_acceptance_kind_is_one_class_and_one_registry_line(monkeypatch):
    monkeypatch.setitem(KINDS, "half", _Half)           # the one line
    ps = parse_spec("half:2.5?drafter=eagle3")
    assert (ps.kind, ps.arg, dict(ps.params)) == ("half", "2.5", {"drafter": "eagle3"})
    assert drafter_of("half:2.5?drafter=eagle3") == "eagle3"
    a, b = load_acceptance("half:2.5", 5), load_acceptance("tau:2.5", 5)
    da, db = a.describe(), b.describe()
    assert da.pop("source") == "half:2.5" and db.pop("source") == "tau:2.5" and da == db
    with pytest.raises(ConfigError, match="'half:X'"):
        parse_spec("nosuch")


def test_acceptance_errors_list_every_registered_kind():
    with pytest.raises(ConfigError) as e:
        parse_spec("dspark-chat")
    msg = str(e.value)
    assert "unknown acceptance source" in msg and all(c.usage in msg for c in KINDS.values())
    assert list(KINDS) == ["parametric", "mtp", "trace", "vllm", "sglang", "tau"]
    # a trace path with an engine-log prefix is that log, by the registry's arg-taking names
    assert parse_spec("vllm:run.csv").kind == "vllm" and parse_spec("run.csv").kind == "trace"
    assert acceptance.PARAMETRIC_DRAFTERS == ("dspark", "dflash", "eagle3", "mtp1")
