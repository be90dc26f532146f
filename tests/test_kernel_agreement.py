"""The compiled step kernel (dsparksim/sim/kernel.py, run by sim/fastpath.py) against the numpy engine: the same
steps, requests, summary and errors, bit for bit, over 20 seeded runs of varied configurations (issue 28 part 6
asks for the same decisions in >= 99.99% of steps and summary metrics within 1e-9 relative; they are equal)."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("numba")

from dsparksim.config import EngineConfig, RunConfig  # noqa: E402
from dsparksim.errors import ConfigError  # noqa: E402
from dsparksim.sim import fastpath  # noqa: E402
from dsparksim.sim.cluster import Simulation  # noqa: E402
from dsparksim.sim.simulate import prepare, simulate  # noqa: E402
from dsparksim.traffic import TrafficConfig  # noqa: E402

PROFILE = "h100-llama2-7b-tp1"
HEADLINE = dict(block_size=7, max_num_seqs=1024, kv_capacity_tokens=10**9, max_batched_tokens=4096)

# (users, simulated seconds, engine options, profile): each is run with seeds below; together they reach paged KV
# with preemptions, reserved KV, small chunks and token budgets, rejections on arrival, the builder's and a fitted
# profile (prefill and long-context terms), and replicas behind the three routers the kernel routes as
CASES = [
    (256, 40.0, HEADLINE, PROFILE),
    (64, 60.0, dict(kv_capacity_tokens=60_000), PROFILE),
    (48, 60.0, dict(kv_capacity_tokens=30_000, kv_page_tokens=32), PROFILE),
    (32, 60.0, dict(kv_policy="reserve", kv_capacity_tokens=40_000), PROFILE),
    (16, 60.0, dict(prefill_chunk_tokens=256, max_batched_tokens=512, block_size=5), PROFILE),
    (24, 60.0, dict(kv_capacity_tokens=3_000, kv_page_tokens=16), PROFILE),
    (40, 30.0, dict(), "built-h100-llama2-7b-tp1"),
    (64, 40.0, dict(kv_capacity_tokens=120_000), "fitted-h200x8-deepseek-r1-trtllm-1.3.0rc14-ep8"),
    (256, 30.0, dict(HEADLINE, replicas=4, router="least-outstanding"), PROFILE),
    (90, 40.0, dict(kv_capacity_tokens=50_000, replicas=3, router="round-robin"), PROFILE),
    (60, 40.0, dict(kv_capacity_tokens=20_000, replicas=3, router="pinned"), PROFILE),
    # fuzz: more replicas than users, so some never step (the numpy engine's empty logs make the columns float64)
    (2, 1.0, dict(kv_page_tokens=64, block_size=1, max_num_seqs=3, prefill_chunk_tokens=1000, replicas=5,
                  router="round-robin", extrapolate=True), "a100-llama3-8b-tp1"),
]
SEEDS = {i: (3 * i + 1, 3 * i + 2, 3 * i + 3) for i in range(len(CASES))}


# the other policies the kernel decides as: (policy, users, simulated seconds, engine options, profile), 2 seeds each
POLICY_CASES = [
    ("fixed:7", 64, 40.0, dict(kv_capacity_tokens=50_000), PROFILE),
    ("fixed:3", 128, 30.0, dict(HEADLINE, replicas=2), PROFILE),
    ("mtp1", 48, 40.0, dict(kv_policy="reserve", kv_capacity_tokens=60_000), PROFILE),
    ("threshold:0.5", 64, 40.0, dict(), "built-h100-llama2-7b-tp1"),
    ("threshold:0.8", 256, 20.0, dict(HEADLINE, max_batched_tokens=1024), PROFILE),
]


def _cfg(users, duration, engine, profile, seed, policy="confidence", **traffic):
    return RunConfig(policy=policy, profile=profile, acceptance="dspark", engine=EngineConfig(**engine),
                     traffic=TrafficConfig(mode="closed", concurrency=users, duration_s=duration, **traffic),
                     seed=seed)


def _run(monkeypatch, cfg, kernel: bool):
    """simulate(cfg) on the kernel or on the numpy engine; (output, whether the kernel ran, progress calls)."""
    monkeypatch.setenv(fastpath.ENV, "1" if kernel else "0")
    ran = []
    real = fastpath.run_kernel

    def spy(*a, **k):
        ran.append(True)
        return real(*a, **k)

    monkeypatch.setattr(fastpath, "run_kernel", spy)
    calls = []
    out = simulate(cfg, progress=calls.append)
    return out, bool(ran), calls


def _same(x, y, what):
    x, y = np.asarray(x), np.asarray(y)
    assert x.dtype == y.dtype and x.shape == y.shape, f"{what}: {x.dtype}{x.shape} vs {y.dtype}{y.shape}"
    if x.dtype.kind == "f":
        assert np.array_equal(x.view(np.uint64), y.view(np.uint64)), f"{what} differs"
    else:
        assert np.array_equal(x, y), f"{what} differs"


def _assert_identical(a, b):
    ra, rb = a.result, b.result
    assert list(ra.steps) == list(rb.steps)
    for k in ra.steps:
        _same(ra.steps[k], rb.steps[k], f"steps[{k}]")
    for k in ("arrival_s", "admitted_s", "first_token_s", "finish_s", "prompt_tokens", "output_tokens",
              "emitted_tokens", "decode_steps", "verify_tokens", "accepted_tokens", "reject_reason", "preemptions",
              "recomputed_tokens", "decode_emitted_tokens", "step_accepted_per_pos", "gap_request", "gap_steps"):
        _same(getattr(ra, k), getattr(rb, k), k)
    assert ra.ended_by == rb.ended_by and ra.sim_time_s == rb.sim_time_s
    assert a.summary.keys() == b.summary.keys()
    for k, v in a.summary.items():
        w = b.summary[k]
        both_nan = isinstance(v, float) and isinstance(w, float) and math.isnan(v) and math.isnan(w)
        assert both_nan or v == w, f"summary[{k}]: {v!r} vs {w!r}"


@pytest.mark.parametrize("case", range(len(CASES)))
def test_kernel_equals_numpy_engine(monkeypatch, case):
    users, duration, engine, profile = CASES[case]
    for seed in SEEDS[case]:
        cfg = _cfg(users, duration, engine, profile, seed)
        a, ran_a, calls_a = _run(monkeypatch, cfg, kernel=False)
        b, ran_b, calls_b = _run(monkeypatch, cfg, kernel=True)
        assert not ran_a and ran_b, "the kernel must run only when enabled"
        assert len(b.result.steps["dt"]) > 20
        _assert_identical(a, b)
        assert calls_a == calls_b     # progress: every simulated second, then the end


@pytest.mark.parametrize("case", range(len(POLICY_CASES)))
def test_other_policies_on_the_kernel_equal_numpy(monkeypatch, case):
    policy, users, duration, engine, profile = POLICY_CASES[case]
    for seed in (40 + case, 50 + case):
        cfg = _cfg(users, duration, engine, profile, seed, policy=policy)
        a, ran_a, _ = _run(monkeypatch, cfg, kernel=False)
        b, ran_b, _ = _run(monkeypatch, cfg, kernel=True)
        assert not ran_a and ran_b
        _assert_identical(a, b)


def test_the_cases_reach_what_they_are_for(monkeypatch):
    """The configurations above really preempt, reject and prefill in chunks (else agreement proves less)."""
    monkeypatch.setenv(fastpath.ENV, "1")
    pre = simulate(_cfg(*CASES[2], seed=7)).result
    assert pre.preemptions.sum() > 0 and len(pre.gap_request) > 0
    rej = simulate(_cfg(*CASES[5], seed=7)).result
    assert (rej.reject_reason > 0).sum() > 0
    small = simulate(_cfg(*CASES[4], seed=7)).result
    assert (np.asarray(small.steps["prefill_chunks"]) > 0).sum() > 10
    long_ctx = simulate(_cfg(*CASES[6], seed=7)).result
    assert (np.asarray(long_ctx.steps["decode_qk"]) > 0).all() or (np.asarray(long_ctx.steps["n_decode"]) == 0).any()
    assert np.asarray(long_ctx.steps["decode_qk"]).max() > 0
    reps = simulate(_cfg(*CASES[8], seed=7)).result
    assert set(np.unique(reps.replica)) == {0, 1, 2, 3}


def test_shards_on_the_kernel_equal_one_numpy_process(monkeypatch):
    """A pinned run sharded over the serial backend (each shard stepped by the kernel), merged, equals the run in one
    process on the numpy engine."""
    from dsparksim.sweep.fleet import run_fleet

    cfg = _cfg(*CASES[10], seed=5)
    monkeypatch.setenv(fastpath.ENV, "0")
    one = simulate(cfg)
    monkeypatch.setenv(fastpath.ENV, "1")
    ran = []
    real = fastpath.run_kernel
    monkeypatch.setattr(fastpath, "run_kernel", lambda *a, **k: ran.append(1) or real(*a, **k))
    merged = run_fleet(cfg, backend="serial", workers=3)
    assert len(ran) == 3
    _assert_identical(one, merged)


def test_errors_are_the_numpy_engines(monkeypatch):
    """A closed-loop pool that runs out, and a workload no request of which fits, fail with the same error."""
    cfgs = [_cfg(8, 600.0, {}, PROFILE, 3, pool_size=40),
            _cfg(8, 60.0, dict(kv_capacity_tokens=64, kv_page_tokens=16), PROFILE, 3)]
    for cfg in cfgs:
        msgs = []
        for kernel in (False, True):
            monkeypatch.setenv(fastpath.ENV, "1" if kernel else "0")
            with pytest.raises(ConfigError) as e:
                simulate(cfg)
            msgs.append(str(e.value))
        assert msgs[0] == msgs[1]


@pytest.mark.parametrize("change,why", [
    (dict(engine=dict(dp_ranks=2)), "DP ranks"),
    (dict(engine=dict(replicas=2, router="random")), "router random"),
    (dict(policy="goodput"), "policy goodput"),
    (dict(engine=dict(mixed_prefill=False)), "prefill-only steps or batch waiting"),
    (dict(engine=dict(pad_verify=True)), "early exit or padded verification"),
    (dict(traffic=dict(mode="poisson", rate=2.0, duration_s=30.0)), "not a closed loop"),
])
def test_unsupported_runs_take_the_numpy_engine(monkeypatch, change, why):
    eng = EngineConfig(**change.get("engine", {}))
    traffic = TrafficConfig(**change.get("traffic", dict(mode="closed", concurrency=8, duration_s=30.0)))
    cfg = RunConfig(policy=change.get("policy", "confidence"), profile=PROFILE, acceptance="dspark", engine=eng,
                    traffic=traffic, seed=1)
    sim = prepare(cfg).sim
    assert isinstance(sim, Simulation)
    assert fastpath.refusal(sim) == why
    monkeypatch.setenv(fastpath.ENV, "1")
    ran = []
    monkeypatch.setattr(fastpath, "run_kernel", lambda *a, **k: ran.append(1))
    simulate(cfg)
    assert not ran


def test_switch_off(monkeypatch):
    monkeypatch.setenv(fastpath.ENV, "0")
    assert not fastpath.enabled()
    monkeypatch.setenv(fastpath.ENV, "1")
    assert fastpath.enabled()


def _every_mirror():
    """A supported run of each scheduler, KV and router kind: their code is what fastpath.MIRRORED covers."""
    for eng in (dict(), dict(kv_policy="reserve"), dict(replicas=2, router="least-outstanding"),
                dict(replicas=2, router="round-robin"), dict(replicas=2, router="pinned")):
        yield prepare(_cfg(8, 10.0, eng, PROFILE, 1)).sim


def test_the_kernels_copy_of_the_code_is_current():
    """The code the kernel mirrors (policies, scheduler, KV, driver, closed loop, routers, price, draws) is the code
    it was checked against by the agreement tests above. When this fails after a change to one of them: make the
    kernel follow the change (the agreement tests say where it does not), then put the printed fingerprints into
    fastpath.MIRRORED."""
    now = {}
    for sim in _every_mirror():
        now.update(fastpath.fingerprints(sim))
    assert set(now) == set(fastpath.MIRRORED) and all(fastpath.MIRRORED[k] == v for k, v in now.items()), now


def test_a_patched_policy_or_scheduler_runs_on_numpy(monkeypatch):
    """A policy or scheduler changed at run time (as a CI pipeline's regress check patches one) is run as it is: on
    numpy."""
    from dsparksim.policies.fixed import Fixed

    cfg = _cfg(16, 20.0, {}, PROFILE, 1, policy="fixed:3")
    assert fastpath.refusal(prepare(cfg).sim) is None
    monkeypatch.setattr(Fixed, "choose", lambda self, ctx: np.zeros(ctx.n, dtype=np.int64))
    assert fastpath.refusal(prepare(cfg).sim) == "code differs from the kernel's copy (Fixed.choose)"
    monkeypatch.setenv(fastpath.ENV, "1")
    out = simulate(cfg)
    assert int(np.asarray(out.result.steps["verify_tokens"]).sum()) == 0     # the patched choice ran
    monkeypatch.undo()
    from dsparksim.sim.scheduler import Scheduler
    real = Scheduler._chunks
    monkeypatch.setattr(Scheduler, "_chunks", lambda self, rows, budget: real(self, rows, min(budget, 64)))
    assert fastpath.refusal(prepare(cfg).sim) == "code differs from the kernel's copy (Scheduler._chunks)"


@pytest.mark.parametrize("replicas", [1, 2])
def test_runs_of_one_step_per_engine(monkeypatch, replicas):
    """Fuzz: a horizon inside each engine's second step leaves one logged step per engine, started at SimPy's int 0
    (the numpy engine's t_start column is then int64, and the kernel's must be too)."""
    cfg = _cfg(4, 0.01, dict(replicas=replicas, prefill_chunk_tokens=64), PROFILE, 1)
    a, _, calls_a = _run(monkeypatch, cfg, kernel=False)
    b, ran, calls_b = _run(monkeypatch, cfg, kernel=True)
    assert ran and len(a.result.steps["dt"]) == replicas
    _assert_identical(a, b)
    assert calls_a == calls_b


def test_a_rejection_streak_inside_the_kernel(monkeypatch, tmp_path):
    """Fuzz: one request fits, then 10,000 rejections in a row end the run inside the kernel (X_NOTHING_FITS): the
    numpy engine's error, and the same progress calls up to it."""
    lengths = tmp_path / "lengths.csv"
    lengths.write_text("ContextTokens,GeneratedTokens\n200,50\n" + "50000,100\n" * 9999)
    cfg = _cfg(1, 30.0, dict(kv_capacity_tokens=20_000), PROFILE, 16, lengths=str(lengths))
    seen = []
    for kernel in (False, True):
        monkeypatch.setenv(fastpath.ENV, "1" if kernel else "0")
        ran, calls = [], []
        real = fastpath.run_kernel
        monkeypatch.setattr(fastpath, "run_kernel", lambda *a, **k: ran.append(1) or real(*a, **k))
        with pytest.raises(ConfigError) as e:
            simulate(cfg, progress=calls.append)
        monkeypatch.setattr(fastpath, "run_kernel", real)
        seen.append((str(e.value), calls, bool(ran)))
    assert seen[0][0] == seen[1][0] and "15214 requests were rejected" in seen[0][0]
    assert seen[0][1] == seen[1][1]
    assert seen[1][2] and not seen[0][2]


def test_no_writable_cache_directory(tmp_path):
    """Fuzz (a read-only install whose home is read-only too): numba finds no directory to cache the kernel in, and
    ``njit(cache=True)`` raised RuntimeError at import, ending every supported run with a traceback. The compiled
    paths now compile uncached and say so once (NUMBA_CACHE_DIR keeps them)."""
    script = (
        "import numba.core.caching as c\n"
        "impl = getattr(c, 'CacheImpl', None) or getattr(c, '_CacheImpl')   # numba >= 0.60 / older\n"
        "impl._locator_classes = []   # what numba sees when no cache directory is writable\n"
        "from dsparksim.sim import kernel, fill_jit\n"
        "print('IMPORTED')\n")
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "IMPORTED"
    assert p.stderr.count("compiling in each process") == 1 and "NUMBA_CACHE_DIR" in p.stderr


def test_extrapolation_warned_once_as_on_numpy(monkeypatch, caplog):
    """Fuzz: the kernel's probe copy of the profile (which tells whether a price term extrapolates) logged its own
    "cost profile: extrapolating ..." warning, so a kernel run printed it twice; the same log as the numpy engine."""
    cfg = _cfg(100, 5.0, dict(block_size=3, extrapolate=True), "cpu-tiny", 1)
    logs = []
    for kernel in (False, True):
        caplog.clear()
        with caplog.at_level("WARNING"):
            out, ran, _ = _run(monkeypatch, cfg, kernel=kernel)
        assert ran == kernel and out.summary
        logs.append([r.getMessage() for r in caplog.records if "extrapolating" in r.getMessage()])
    assert logs[0] == logs[1] and len(logs[0]) == 1


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")   # the numpy engine's prices overflow
@pytest.mark.parametrize("case", ["prefill step never ends", "decode prices near overflow"])
def test_unchecked_dense_prices(monkeypatch, tmp_path, case):
    """Fuzz: where a step's dense prices are not all finite (DenseStepTime.checked is False) the kernel stopped with
    'code 14' (RuntimeError); the numpy engine checks only the prices its policy reads, and none on a step without
    decoding rows. Here a profile whose prefill step costs inf, and one whose top verify price plus a huge drafter
    term overflows while the prices the policy reads do not: both runs end at the horizon on either engine."""
    prof = json.loads((Path(__file__).resolve().parents[1] / "profiles" / "cpu-tiny.json").read_text())
    traffic = {}
    if case == "prefill step never ends":
        prof["verify"]["time_s"] = [1e308] * len(prof["verify"]["M"])
        prof["fixed_overhead_s"] = 1e308
    else:
        prof["verify"]["time_s"][-1] = 1.7e308
        for d in prof["drafters"].values():
            d["time_s"] = [1e308] * len(d["time_s"])
        traffic = dict(dataset_name="random", random_input_len=16, random_output_len=64)
    path = tmp_path / "huge.json"
    path.write_text(json.dumps(prof))
    cfg = _cfg(8, 2.0, dict(block_size=7), str(path), 1, **traffic)
    a, _, calls_a = _run(monkeypatch, cfg, kernel=False)
    b, ran, calls_b = _run(monkeypatch, cfg, kernel=True)
    assert ran and a.result.ended_by == "duration"
    _assert_identical(a, b)
    assert calls_a == calls_b


def test_numba_installed_but_not_importable(tmp_path):
    """Fuzz: numba installed but failing at import (built for another NumPy) ended every supported run with a
    traceback; such runs now take the numpy engine, refusal() says why and a warning says it once."""
    fake = tmp_path / "numba"
    fake.mkdir()
    (fake / "__init__.py").write_text('raise ImportError("Numba needs NumPy 2.2 or less. Got NumPy 9.9.")\n')
    script = (
        "from dsparksim.config import EngineConfig, RunConfig\n"
        "from dsparksim.sim import fastpath\n"
        "from dsparksim.sim.simulate import prepare, simulate\n"
        "from dsparksim.traffic import TrafficConfig\n"
        "cfg = RunConfig(policy='confidence', profile='h100-llama2-7b-tp1', engine=EngineConfig(), seed=1,\n"
        "                traffic=TrafficConfig(mode='closed', concurrency=8, duration_s=5.0))\n"
        "print('REFUSAL', fastpath.refusal(prepare(cfg).sim))\n"
        "for _ in range(2):\n"
        "    print('STEPS', len(simulate(cfg).result.steps['dt']))\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[1]), str(tmp_path)]))
    env.pop(fastpath.ENV, None)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0] == "REFUSAL numba cannot be imported (ImportError: Numba needs NumPy 2.2 or less. Got NumPy 9.9.)"
    assert lines[1] == lines[2] and int(lines[1].split()[1]) > 20
    assert p.stderr.count("the step kernel is off: numba cannot be imported") == 1


# rare paths found by reading the kernel against the numpy engine: (users, seconds, engine options, seed)
RARE_CASES = [
    # pinned users on one engine: the rows each engine's users sent (Simulation._cursor) make the result
    (16, 20.0, dict(router="pinned", kv_capacity_tokens=40_000), 3),
    # engines that never step (pinned users on 2 of 4): their empty logs make the merged int columns float64
    (2, 10.0, dict(router="pinned", replicas=4, kv_capacity_tokens=40_000), 3),
]


@pytest.mark.parametrize("case", range(len(RARE_CASES)))
def test_rare_paths_on_the_kernel_equal_numpy(monkeypatch, case):
    users, duration, engine, seed = RARE_CASES[case]
    cfg = _cfg(users, duration, engine, PROFILE, seed)
    a, ran_a, calls_a = _run(monkeypatch, cfg, kernel=False)
    b, ran_b, calls_b = _run(monkeypatch, cfg, kernel=True)
    assert not ran_a and ran_b
    _assert_identical(a, b)
    assert calls_a == calls_b


def _hand_profile(**extra):
    """A small hand-written profile (verify 10 ms flat, 1 ms fixed, a 2 ms parallel drafter) plus ``extra`` sections."""
    from dsparksim.cost.profile import FORMAT, profile_from_dict

    d = {"format": FORMAT, "name": "hand",
         "metadata": {"device": "test", "model": "test", "source": "hand-written", "method": "hand-written"},
         "verify": {"M": [1, 4096], "time_s": [0.010, 0.010]}, "fixed_overhead_s": 0.001,
         "drafters": {"dspark": {"kind": "parallel", "tokens": [1, 100000], "time_s": [0.002, 0.002],
                                 "markov_overhead_frac": 0.0}}}
    d.update(extra)
    return profile_from_dict(d)


def test_extrapolated_step_terms_are_looked_up_and_reported_as_numpy(monkeypatch, caplog):
    """A batch-overhead term past its measured range is looked up (and reported) every step, as the numpy engine
    does, and warned about once per run."""
    extra = {"batch_overhead": {"n_req": [1, 2, 4], "time_s": [0.001, 0.002, 0.003]}}
    cfg = _cfg(12, 10.0, dict(kv_capacity_tokens=40_000, extrapolate=True), PROFILE, 4)
    outs, warned = [], []
    for kernel in (False, True):
        monkeypatch.setenv(fastpath.ENV, "1" if kernel else "0")
        caplog.clear()
        outs.append(simulate(cfg, profile=_hand_profile(**extra).with_extrapolation(True)))
        warned.append(sum("extrapolating" in r.getMessage() for r in caplog.records))
    _assert_identical(*outs)
    rep = outs[1].summary["extrapolation"]
    assert rep["axes"]["batch_overhead.n_req"]["count"] > 100
    assert warned == [1, 1]


def test_more_users_than_an_engine_may_queue_take_the_numpy_engine():
    """cluster.MAX_WAITING stops a numpy run whose engine holds more requests; the kernel does not check it."""
    from dsparksim.sim.cluster import MAX_WAITING

    assert fastpath.MAX_USERS == MAX_WAITING
    for users, why in ((MAX_WAITING, None), (MAX_WAITING + 1, "more users than an engine's queue limit")):
        cfg = _cfg(users, 10.0, dict(replicas=2, router="round-robin"), PROFILE, 1)
        assert fastpath.refusal(prepare(cfg).sim) == why


def test_a_price_table_that_is_not_checked_is_checked_per_candidate_as_numpy(monkeypatch):
    """A profile built in Python with a negative term (the JSON loader refuses one): DenseStepTime is then not
    ``checked`` and Algorithm 1 evaluates every candidate's price; the kernel stopped with an error instead."""
    import dataclasses

    cfg = _cfg(12, 5.0, dict(kv_capacity_tokens=40_000), PROFILE, 4)
    outs = []
    for kernel in (False, True):
        monkeypatch.setenv(fastpath.ENV, "1" if kernel else "0")
        outs.append(simulate(cfg, profile=dataclasses.replace(_hand_profile(), fixed_overhead_s=-0.0025)))
    _assert_identical(*outs)
    assert (np.asarray(outs[1].result.steps["n_decode"]) > 0).sum() > 100


def test_a_compile_is_announced_once(tmp_path, caplog):
    """Before the first run after an install (no cached code newer than the kernel's source) one line says the
    kernel is being compiled, so a progress bar at 0 for ~20-30 s is explained; nothing when the cache is fresh."""
    import time
    from types import SimpleNamespace

    src, index = tmp_path / "kernel.py", tmp_path / "kernel.run_steps.nbi"
    src.write_text("")
    class FakeKernel:     # a module's stand-in (hashable, as a module is)
        __file__ = str(src)
        run_steps = SimpleNamespace(_cache=SimpleNamespace(_cache_file=SimpleNamespace(_index_path=str(index))))

    k = FakeKernel()
    said = []
    for state in ("missing", "stale", "fresh"):
        if state == "stale":
            index.write_text("")
            t = time.time()
            os.utime(index, (t - 100, t - 100))
        if state == "fresh":
            os.utime(index, None)
            os.utime(src, (time.time() - 100, time.time() - 100))
        fastpath._note_compiling.cache_clear()
        caplog.clear()
        with caplog.at_level("WARNING"):
            fastpath._note_compiling(k)
            fastpath._note_compiling(k)
        said.append(sum("compiling the step kernel" in r.getMessage() for r in caplog.records))
    assert said == [1, 1, 0]
