"""Injected slowdowns for checking what `dsparksim regress` detects (tests/test_regress_paired.py and
benchmarks/regress_power.py).

``slowdown(factor, policy=None)`` is a context manager: inside it every run (of ``policy`` only, when given) prices
its verify step -- the profile's verify table and its attention term per KV token -- ``factor`` times slower.
It patches the simulator's profile loader in this process; pool workers forked inside the block inherit it.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import dsparksim.sim.inputs as inputs
from dsparksim.cost.profile import profile_from_dict, read_profile_dict


def slowed_profile(name: str, factor: float):
    """The cost profile ``name`` with its verify step ``factor`` times slower (drafting and overhead unchanged)."""
    d, path = read_profile_dict(name)
    d = dict(d)
    d["verify"] = {**d["verify"], "time_s": [t * factor for t in d["verify"]["time_s"]]}
    att = d.get("attention")
    if isinstance(att, dict) and "seconds_per_kv_token" in att:
        d["attention"] = {**att, "seconds_per_kv_token": att["seconds_per_kv_token"] * factor}
    return profile_from_dict(d, source=str(path))


@contextlib.contextmanager
def slowdown(factor: float, policy: str | None = None) -> Iterator[None]:
    orig = inputs.load_run_profile
    memo: dict = {}

    def patched(cfg, cache=None):
        if policy is not None and cfg.policy != policy:
            return orig(cfg, cache)
        key = (cfg.profile, bool(cfg.engine.extrapolate))
        if key not in memo:
            p = slowed_profile(cfg.profile, factor)
            memo[key] = p.with_extrapolation(True) if cfg.engine.extrapolate else p
        return memo[key]

    inputs.load_run_profile = patched
    try:
        yield
    finally:
        inputs.load_run_profile = orig
