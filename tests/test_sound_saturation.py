"""Issue 31 item 2: saturation means service does not keep up with demand, wherever the requests are held
(admission queue, running set, prefill pool, KV transfer). Known answers for each place, open and closed loop,
the issue's own runs, and the rule's boundaries."""
from __future__ import annotations

import json

import numpy as np
import pytest

from dsparksim.cli.main import main
from dsparksim.results.metrics import saturation

from test_engine import FlatProfile
from test_kv_paged import _sim, _wl


def _poisson(rate: float, n: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).exponential(1 / rate, n).cumsum()


# ------------------------------------------------------------------ open loop, one case per place
@pytest.mark.parametrize("rate,expect", [(30.0, True), (2.0, False)])
def test_open_loop_running_set_grows_under_paged_kv(rate, expect):
    # Paged KV with room for everyone: every arrival is admitted at once, so the admission queue stays empty and the
    # requests pile up in the running set. A step costs c + 1 ms x M (M = 2 tokens per decoding request at K = 1,
    # plus prefill tokens): a request of prompt 10 and output 50 takes 10 + 49 x 2 = 108 ms of per-token time, so
    # the engine serves at most 9.3 requests/s however large its batch. 30/s is 3.2x that; 2/s is 0.2x.
    prof = FlatProfile(0.01, per_token=1e-3)
    n = int(rate * 20)
    res = _sim(_wl([10] * n, [50] * n, arrivals=_poisson(rate, n)), K=1, alpha=0.0, profile=prof, kv=10**7,
               duration_s=20.0).run()
    sat, info = saturation(res, warmup_s=2.0, closed_loop=False)
    assert sat is expect, info
    held = info["held_end_by_place"]
    assert held["admission_queue"] <= 1          # nobody waits for admission: the old rule could not see it
    if expect:
        assert held["running"] > 100 and info["completion_rate_rps"] < 9.3 < info["arrival_rate_rps"]
    else:
        assert info["held_growth"] <= 5


def _disagg(rate, n, *, gbps=100.0, pool=1, duration=5.0, closed=None):
    # prefill instance: c + 0 per token = 10 ms a request; decode engine: 10 ms steps, outputs of 3 tokens
    prof = FlatProfile(0.01)
    prof.metadata.update({"kv_bytes_per_token": 1.0e5})
    wl = _wl([10] * n, [3] * n, concurrency=closed) if closed else _wl([10] * n, [3] * n, arrivals=_poisson(rate, n))
    return _sim(wl, K=1, profile=prof, disaggregated=True, prefill_replicas=pool, kv_transfer_gbps=gbps,
                duration_s=duration).run()


@pytest.mark.parametrize("rate,expect", [(300.0, True), (20.0, False)])
def test_open_loop_prefill_pool_holds_the_requests(rate, expect):
    # one prefill instance serves 100 requests/s: 300/s piles up at the pool, 20/s does not
    res = _disagg(rate, int(rate * 5))
    sat, info = saturation(res, warmup_s=0.5, closed_loop=False)
    assert sat is expect, info
    if expect:
        held = info["held_end_by_place"]
        assert held["prefill_pool"] > 0.9 * sum(held.values())


def test_open_loop_kv_transfer_holds_the_requests():
    # a 1e-6 Gbit/s link: 10 tokens x 1e5 B take 8,000 s to cross; nothing lands, nothing is served
    res = _disagg(10.0, 50, gbps=1e-6)
    sat, info = saturation(res, warmup_s=0.5, closed_loop=False)
    held = info["held_end_by_place"]
    # every request held is in transfer, but the one that arrived at the window's end (still being prefilled)
    assert sat is True and info["held_end"] > 20 and held["transfer"] >= info["held_end"] - 1
    assert held["admission_queue"] == held["running"] == 0


def test_open_loop_admission_queue_holds_the_requests():
    # reserve KV with 2 slots: the engine serves at most 2 requests per 3 x 10 ms steps ~ 67/s; 200/s queues
    n = 600
    res = _sim(_wl([10] * n, [3] * n, arrivals=_poisson(200.0, n)), K=1, kv_policy="reserve", max_seqs=2,
               duration_s=3.0).run()
    sat, info = saturation(res, warmup_s=0.3, closed_loop=False)
    assert sat is True and info["held_end_by_place"]["admission_queue"] > 100


# ------------------------------------------------------------------ closed loop
def test_closed_loop_zero_throughput_is_saturated():
    # the issue's case: a link so slow that no KV ever lands; no engine step runs in the window (old rule: "too
    # few steps to judge", not saturated)
    res = _disagg(0, 64, gbps=1e-9, closed=16)
    sat, info = saturation(res, warmup_s=0.5, closed_loop=True)
    assert sat is True, info
    assert info["steps"] == 0 and info["held_by_place"]["transfer"] == 16


@pytest.mark.parametrize("pool,expect", [(1, True), (32, False)])
def test_closed_loop_prefill_pool_queue(pool, expect):
    # 64 users; one prefill instance (10 ms a request) is the bottleneck of a 4-step service; 32 are not
    res = _disagg(0, 20000, pool=pool, closed=64, duration=3.0)
    sat, info = saturation(res, warmup_s=0.5, closed_loop=True)
    assert sat is expect, info


# ------------------------------------------------------------------ the issue's runs
@pytest.mark.parametrize("load", [["--rate", "6", "--duration", "60"], ["--trace", "azure-conv-window",
                                                                        "--duration", "15"]])
def test_issue_runs_on_a_compute_bound_engine_are_saturated(tmp_path, load):
    out = tmp_path / "o"
    # the issue's runs were made with the then default policy, confidence (run's default is now confidence-async:2)
    assert main(["run", "--policy", "confidence", "--profile", "a100-llama3-70b-tp4", *load, "--quiet", "--out",
                 str(out)]) == 0
    s = json.loads((out / "summary.json").read_text())
    d = s["saturation_detail"]
    assert s["num_requests_completed_total"] < 0.3 * s["num_requests_issued"]
    assert s["saturated"] is True and d["held_end_by_place"]["running"] > d["held_end_by_place"]["admission_queue"]


def test_issue_closed_loop_disaggregated_zero_throughput(tmp_path):
    out = tmp_path / "o"
    assert main(["run", "--disaggregated", "--kv-transfer-gbps", "1e-9", "--kv-bytes-per-token", "524288",
                 "--concurrency", "16", "--duration", "5", "--quiet", "--out", str(out)]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["output_throughput_tok_s"] == 0 and s["saturated"] is True


# ------------------------------------------------------------------ the rule's boundaries (issue 31 item 21)
def _hand(arrival, finish, steps_waiting=None, end=None, admitted=None):
    """A SimResult built by hand: requests admitted at ``admitted`` (default: on arrival; NaN: never), finishing
    at ``finish`` (NaN: never); one-second steps with ``steps_waiting`` requests waiting at their ends."""
    from dsparksim.sim.cluster import SimResult

    arrival = np.asarray(arrival, float)
    admitted = arrival.copy() if admitted is None else np.asarray(admitted, float)
    finish = np.asarray(finish, float)
    n = len(arrival)
    q = np.zeros(0, np.int64) if steps_waiting is None else np.asarray(steps_waiting)
    k = len(q)
    z = np.zeros(n, np.int64)
    steps = {"t_start": np.arange(k) * 1.0, "dt": np.ones(k), "n_waiting": q}
    return SimResult(arrival_s=arrival, admitted_s=admitted, first_token_s=admitted.copy(), finish_s=finish,
                     prompt_tokens=z + 1, output_tokens=z + 1, emitted_tokens=z + 1, decode_steps=z,
                     verify_tokens=z, accepted_tokens=z, domain=np.full(n, "chat", dtype=object), steps=steps,
                     sim_time_s=float(end if end is not None else max(k, arrival.max() + 1 if n else 0)),
                     ended_by="duration", kv_capacity_tokens=1, max_batched_tokens=1, block_size=1,
                     drafter="dspark", reject_reason=np.zeros(n, np.int8))


@pytest.mark.parametrize("n,stuck,expect", [
    (40, 0, False), (40, 5, False), (40, 6, True),   # 40 arrivals: threshold max(5, 4) = 5
    (40, 9, True),                                    # between the minimum 5 and 10: growth beyond 5 counts
    (100, 10, False), (100, 11, True),                # 100 arrivals: threshold max(5, 10) = 10
])
def test_open_loop_waiting_rule_boundary(n, stuck, expect):
    # n arrivals at 0, 1, ..., n-1 s, each admitted on arrival and finished 1 s later except the last `stuck`
    # (never admitted by the end at n s): the admission queue grows by exactly `stuck`; the held rule stays quiet
    # (its limit is 3 sd of a stable count, above these growths)
    arrival = np.arange(float(n))
    admitted = arrival.copy()
    if stuck:
        admitted[-stuck:] = np.nan
    sat, info = saturation(_hand(arrival, admitted + 1.0, admitted=admitted, end=float(n)), warmup_s=0.0,
                           closed_loop=False)
    assert info["queue_growth"] == stuck and info["arrivals_in_window"] == n
    assert "held" not in info["saturated_by"]
    assert sat is expect, info


@pytest.mark.parametrize("instant,g,expect", [
    (40, 9, False), (40, 10, True),        # few arrivals: the noise limit 3 sqrt(min(g, ...)) = 3 sqrt(g) binds
    (600, 33, False), (600, 34, True),     # many: 10% of the late half's arrivals (300 + g) binds
])
def test_open_loop_held_rule_boundary(instant, g, expect):
    # `instant` requests spread over [0, 100] s finish on arrival; g more arrive at the midpoint 50 s, are admitted
    # at once and never finish (they hold the running set): H(50-) = 0, H(100) = g, no admission queue at all
    arrival = np.concatenate([np.linspace(0.0, 100.0, instant), np.full(g, 50.0)])
    finish = np.concatenate([np.linspace(0.0, 100.0, instant), np.full(g, np.nan)])
    sat, info = saturation(_hand(arrival, finish, end=101.0), warmup_s=0.0, closed_loop=False)
    assert info["queue_growth"] == 0 and info["held_growth"] == g and info["held_mid"] == 0
    assert sat is expect, info


@pytest.mark.parametrize("waiting_steps,expect", [(50, False), (51, True), (49, False), (100, True), (0, False)])
def test_closed_loop_wait_fraction_boundary(waiting_steps, expect):
    # 100 window steps; requests wait in exactly `waiting_steps` of them: saturated iff strictly more than half
    q = np.zeros(100, np.int64)
    q[np.random.default_rng(0).permutation(100)[:waiting_steps]] = 2
    sat, info = saturation(_hand([0.0], [np.nan], q, end=100.0), warmup_s=0.0, closed_loop=True)
    assert info["frac_steps_with_waiting"] == pytest.approx(waiting_steps / 100)
    assert sat is expect
