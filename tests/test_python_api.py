"""The Python API as a notebook uses it: bad values from Python get the same one-line ConfigErrors as the CLI
(never an AttributeError or TypeError from deep inside a run), and nothing is silently truncated or reinterpreted."""
from __future__ import annotations

import pytest

from dsparksim.config import EngineConfig, RunConfig
from dsparksim.errors import ConfigError
from dsparksim.sim.simulate import simulate
from dsparksim.traffic.config import TrafficConfig

TRAFFIC = TrafficConfig(concurrency=2, duration_s=1.0)


def test_run_without_traffic_is_a_config_error():
    with pytest.raises(ConfigError, match=r"field 'traffic': a run needs its load"):
        simulate(RunConfig())


@pytest.mark.parametrize("kw, field", [({"traffic": {"concurrency": 4}}, "traffic"),
                                       ({"engine": None, "traffic": TRAFFIC}, "engine"),
                                       ({"engine": {"block_size": 3}, "traffic": TRAFFIC}, "engine")])
def test_run_parts_must_be_their_configs(kw, field):
    with pytest.raises(ConfigError, match=rf"field '{field}': expected an? (Engine|Traffic)Config"):
        RunConfig(**kw)
