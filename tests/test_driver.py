"""The one step loop (sim/driver.py) and the engine's configuration: the Driver runs the same plans and outcomes on
the profile's price and on a measured clock (a fake executor implementing the contract's Executor Protocol), and a
bad engine value is refused once, by its config dataclass, in one line."""
from __future__ import annotations

import numpy as np
import pytest

from dsparksim.config import EngineConfig
from dsparksim.errors import ConfigError
from dsparksim.policies import make_policy
from dsparksim.sim.cluster import Simulation
from dsparksim.sim.contract import CostExecutor, NewRequest, StepOutcome, StepPlan
from dsparksim.sim.inputs import ResolvedInputs
from dsparksim.sim.requests import RequestTable
from dsparksim.sim.scheduler import Scheduler
from dsparksim.sim.streams import RequestStreams
from sim_kit import FlatAcceptance, chat_workload, linear_profile


def _inputs(K=3, max_tokens=256, kv=10_000):
    pol = make_policy("confidence")
    pol.reset(K, np.random.default_rng(0))
    return ResolvedInputs(profile=linear_profile(), policy=pol, K=K, acceptance=FlatAcceptance(K), drafter="dspark",
                          kv_cap=kv, max_tokens=max_tokens)


def _wl(n=24, users=4):
    return chat_workload(n, users)


def _shape(plan: StepPlan, out: StepOutcome):
    return (plan.decode.tolist(), plan.verify.tolist(), list(plan.prefill), plan.M, out.accepted.tolist())


class _Recording(CostExecutor):
    """The simulator's executor, recording what it ran."""

    def __init__(self):
        self.seen = []

    def execute(self, plan):
        out = super().execute(plan)
        self.seen.append(_shape(plan, out))
        return out


class _FakeTimer:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


class _SlowExecutor:
    """A tiny Executor (the contract's Protocol): it 'runs' each step for twice the profile's price on a fake timer
    and follows the requests it is given."""

    tracks_requests = True

    def __init__(self, timer):
        self.timer, self.seen, self.started, self.finished = timer, [], [], []

    def start(self, new):
        assert all(isinstance(q, NewRequest) and q.prompt_tokens == 10 for q in new)
        self.started += [q.row for q in new]

    def finish(self, rows):
        self.finished += [int(r) for r in rows]

    def execute(self, plan):
        self.timer.t += 2 * plan.predicted_s
        a = np.minimum(plan.verify, plan.true_accepted) if plan.n_decode else np.zeros(0, np.int64)
        out = StepOutcome(duration_s=float("nan"), accepted=a)   # the clock decides the duration
        self.seen.append(_shape(plan, out))
        return out


class _FakeMeasuredClock:
    """A measured clock (StepClock) reading the fake timer: planning and applying take no fake time."""

    measured = True

    def __init__(self, timer):
        self.timer, self.t0, self.stepped_n = timer, 0.0, 0

    def drafter(self, scheduler):
        return None

    def planning(self, step):
        self.t0 = self.timer()

    def executed(self, outcome):
        return self.timer() - self.t0

    def applying(self):
        pass

    def applied(self, outcome, dt):
        outcome.duration_s = dt
        return 0.0

    def stepped(self, step, plan, seconds):
        assert step == self.stepped_n
        self.stepped_n += 1


def test_driver_runs_the_same_plans_and_outcomes_on_the_price_and_on_a_measured_clock():
    def run(**kw):
        sim = Simulation(EngineConfig(kv_policy="reserve", max_num_seqs=4, prefill_chunk_tokens=64), _inputs(),
                         _wl(), RequestStreams(1), num_requests=24, **kw)
        return sim, sim.run()
    rec = _Recording()
    _, base = run(executor=rec)
    timer = _FakeTimer()
    slow = _SlowExecutor(timer)
    clock = _FakeMeasuredClock(timer)
    _, res = run(executor=slow, clock=clock)
    assert len(rec.seen) > 20 and slow.seen == rec.seen                 # step for step the same plans and outcomes
    assert clock.stepped_n == len(rec.seen)
    assert res.completed.all() and sorted(slow.started) == list(range(24)) == sorted(slow.finished)
    np.testing.assert_array_equal(res.verify_tokens, base.verify_tokens)
    np.testing.assert_allclose(res.steps["dt"], 2 * base.steps["dt"], rtol=1e-12)
    np.testing.assert_allclose(res.finish_s, 2 * base.finish_s, rtol=1e-9)


def test_a_bad_engine_value_is_refused_once_by_its_config_in_one_line():
    with pytest.raises(ConfigError) as e:
        EngineConfig(kv_watermark=1.5)
    msg = str(e.value)
    assert "kv_watermark" in msg and "1.5" in msg and "\n" not in msg
    with pytest.raises(TypeError, match="EngineConfig"):     # no side door of loose keywords
        Simulation({"kv_policy": "paged"}, _inputs(), _wl(), RequestStreams(1), num_requests=4)
    # what only the resolved inputs decide is checked by the Simulation, once, in one line
    with pytest.raises(ConfigError) as e:
        Simulation(EngineConfig(), _inputs(K=3, max_tokens=3), _wl(), RequestStreams(1), num_requests=4)
    assert "max_batched_tokens" in str(e.value) and "\n" not in str(e.value)


def test_scheduler_and_engine_config_agree_on_the_default_kv_policy():
    table = RequestTable(_wl(), 24, None)
    eng = Scheduler(EngineConfig(), _inputs(), table, rng=np.random.default_rng(0))
    assert EngineConfig().kv_policy == "paged" and eng.kv.paged and eng.kv.page == EngineConfig().kv_page_tokens


@pytest.mark.parametrize("dur", [1e308, 1.0000001e7, float("inf"), float("nan"), 0.0, -1.0, True])
def test_a_simulation_built_from_python_refuses_the_durations_traffic_config_refuses(dur):
    """TrafficConfig bounds duration_s at DURATION_MAX_S and refuses non-finite values, but a Simulation built directly
    (a notebook's path past the CLI and RunConfig) took any duration_s: 1e308 in closed loop ran without end. It is
    refused there now with TrafficConfig's message; DURATION_MAX_S itself is taken."""
    from dsparksim.traffic.config import DURATION_MAX_S, TrafficConfig

    with pytest.raises(ConfigError) as e:
        Simulation(EngineConfig(), _inputs(), _wl(), RequestStreams(1), duration_s=dur)
    with pytest.raises(ConfigError) as t:
        TrafficConfig(mode="closed", concurrency=1, duration_s=dur)
    msg = str(e.value)
    assert msg.startswith("Simulation: field 'duration_s'"), msg
    assert msg.split("field 'duration_s'", 1)[1] == str(t.value).split("field 'duration_s'", 1)[1], (msg, t.value)
    assert Simulation(EngineConfig(), _inputs(), _wl(), RequestStreams(1), duration_s=DURATION_MAX_S).duration \
        == DURATION_MAX_S
