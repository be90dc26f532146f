"""The compiled refill of the pre-drawn draws (dsparksim.sim.fill_jit, numba) gives the numpy refill's rings bit for
bit, and a whole run the very same result; without numba, switched off, or for a source it does not cover, the
numpy refill runs (issue 28)."""
from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest

from dsparksim.acceptance import load_acceptance
from dsparksim.config import EngineConfig, RunConfig
from dsparksim.sim import jit
from dsparksim.sim import predraw as predraw_mod
from dsparksim.sim.requests import RequestTable
from dsparksim.sim.simulate import simulate
from dsparksim.sim.streams import RequestStreams, normals_from_halves
from dsparksim.traffic import TrafficConfig
from dsparksim.traffic.base import Workload
from sim_kit import assert_same_result

DOMAINS = np.array(["chat", "math", "code"], object)
# sources the compiled refill covers: the default, other paper drafters, pooled curves, the plain logit-normal link,
# other heterogeneity / noise, the raw head (and mtp1 / mtp where K allows)
COVERED = ["dspark", "dflash", "eagle3", "tau:1.8", "dspark?jump=0&slope=1&offset=0&slope_easy=1",
           "dspark?sigma_req=0.4&sigma_block=1.5&sigma_tok=0.9&noise_sd=0.05&noise_sd_end=0.8&temperature=1.3"]
# branches it leaves to numpy
NOT_COVERED = ["dspark?noise_block=0.2", "dspark?req_load=0.5", "dspark?head_blind=0.5", "dspark?noise_sd=0&noise_sd_end=0",
               "dspark?sigma_tok=0&jump=0"]


def _table(seed: int, n: int) -> RequestTable:
    rng = np.random.default_rng(seed)
    wl = Workload(prompt_tokens=np.full(n, 10), output_tokens=rng.integers(1, 90, n),
                  domain=rng.choice(DOMAINS, n), concurrency=n)
    table = RequestTable(wl, None, RequestStreams(seed))
    table.load(n - 1)
    table.gen[:n] = rng.integers(0, 5, n)
    table.dsteps[:n] = rng.integers(0, 60, n)
    return table


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint64) if a.dtype == np.float64 else a


def _compare_fills(acc, K: int, seed: int, B: int, fills: int = 4, n: int = 200) -> int:
    """Refill random rows of two PredrawnDraws over one table, one compiled and one numpy, their rings made equal
    before each fill; assert the rings equal bit for bit after it. Returns the steps drawn."""
    table = _table(seed, n)
    jit = predraw_mod.PredrawnDraws(acc, table.streams, table, K, acc.words_per_step, steps=B)
    ref = predraw_mod.PredrawnDraws(acc, table.streams, table, K, acc.words_per_step, steps=B)
    assert jit.compiled is not None
    ref.compiled = None
    rng = np.random.default_rng(1000 + seed)
    drawn = 0
    for _ in range(fills):
        rows = np.sort(rng.choice(n, size=int(rng.integers(1, n)), replace=False))
        for p in (jit, ref):
            p._sized()
            new = p.entry[rows] == 0
            if new.any():
                p._alloc(rows[new])
        e = jit.entry[rows]
        assert (e == ref.entry[rows]).all()
        first = rng.integers(0, 80, rows.size)
        ref._cs[:] = rng.standard_normal(ref._cs.shape)      # what a fill leaves alone must stay as it was
        jit._cs[:] = ref._cs
        before = jit._filled.copy()
        for p in (jit, ref):
            p._fill(rows, e, first)
        for name in ("_cs", "_acc", "_filled"):
            a, b = getattr(jit, name), getattr(ref, name)
            assert a.shape == b.shape and np.array_equal(_bits(a), _bits(b)), name
        drawn += int((jit._filled - before).clip(0).sum())
    return drawn


@pytest.mark.parametrize("K", range(1, 9))
def test_compiled_fill_gives_the_numpy_rings_bit_for_bit(K):
    pytest.importorskip("numba")
    drawn = 0
    for i, spec in enumerate(COVERED + ["mtp1"] * (K == 1) + ["mtp"] * (K <= 4)):
        acc = load_acceptance(spec, K, confidence="raw" if i == 2 else "sts")
        for seed, B in ((K * 10 + i, 16), (K * 10 + i + 100, 3), (K * 10 + i + 200, 5)):  # R = 32 (mask), 6, 10 (%)
            drawn += _compare_fills(acc, K, seed, B)
    assert drawn > 1000


def test_compiled_fill_with_fewer_ring_positions_than_the_source_draws():
    """The engine's K below the source's: the first K confidences, the accepted prefix over all of the source's."""
    pytest.importorskip("numba")
    assert _compare_fills(load_acceptance("dspark", 8), 5, 3, 16) > 0


def test_plan_covers_exactly_the_default_branches(monkeypatch):
    for spec in COVERED:
        assert load_acceptance(spec, 7).keyed_plan() is not None, spec
    for spec in NOT_COVERED:
        acc = load_acceptance(spec, 7)
        assert acc.keyed_plan() is None, spec
        assert predraw_mod.compiled_fill(acc) is None
    assert predraw_mod.compiled_fill(object()) is None                            # a source without a plan
    monkeypatch.setenv(jit.ENV, "0")
    assert predraw_mod.compiled_fill(load_acceptance("dspark", 7)) is None


def test_without_numba_the_numpy_fill_runs(monkeypatch):
    monkeypatch.setitem(sys.modules, "numba", None)       # `import numba` raises ModuleNotFoundError
    monkeypatch.delitem(sys.modules, "dsparksim.sim.fill_jit", raising=False)
    assert predraw_mod.compiled_fill(load_acceptance("dspark", 7)) is None


def _headline_like(monkeypatch, compiled: bool):
    monkeypatch.setenv(jit.ENV, "1" if compiled else "0")
    calls = []
    if compiled:
        from dsparksim.sim.fill_jit import CompiledFill
        fill = CompiledFill.fill

        def counted(self, *a):
            calls.append(1)
            return fill(self, *a)
        monkeypatch.setattr(CompiledFill, "fill", counted)
    cfg = RunConfig(policy="confidence", profile="h100-llama2-7b-tp1", acceptance="dspark",
                    engine=EngineConfig(block_size=7, max_num_seqs=1024, kv_capacity_tokens=10**9),
                    traffic=TrafficConfig(mode="closed", concurrency=64, duration_s=300.0), seed=3)
    out = simulate(cfg)
    monkeypatch.undo()
    return out.result, len(calls)


def test_a_run_with_the_compiled_fill_is_bit_identical(monkeypatch):
    pytest.importorskip("numba")
    a, calls = _headline_like(monkeypatch, True)
    b, none = _headline_like(monkeypatch, False)
    assert calls > 50 and none == 0
    assert len(a.steps["dt"]) > 1000
    assert_same_result(a, b)


def _flip_mu(acc, streams, key, u, step: int) -> tuple[float, bool] | None:
    """An offset mu (K = 1, plain link) at which request ``key``'s acceptance test at ``step`` (h < 2**32 / (1 +
    exp(-x))) comes out one way with numpy's exp and the other with libm's (math.exp), with numpy's outcome; or
    None."""
    p = acc.params
    h = streams.rows(np.atleast_1d(key), step, acc.words_per_step).halves_by_position(4)[:, 0]
    z = normals_from_halves(h[:2])
    t = u + p.sigma_block * z[0]
    e = z[1] * p.sigma_tok
    hu = float(h[2])
    if not 0 < hu < 2.0 ** 31:            # exp(-x) > 1 there: its last bit reaches 1 + exp(-x)
        return None
    x0 = -np.log(2.0 ** 32 / hu - 1.0)
    mu = (x0 - e - t) + np.arange(-20_000, 20_000) * np.spacing(x0 - e - t)
    x = (mu + t) + e                       # draw_by_position's sums, in its order
    with np.errstate(over="ignore"):
        by_numpy = hu < 2.0 ** 32 / (1.0 + np.exp(-x))
    by_libm = np.array([hu < 2.0 ** 32 / (1.0 + math.exp(-v)) for v in x])
    flips = np.flatnonzero(by_numpy != by_libm)
    return (float(mu[flips[0]]), bool(by_numpy[flips[0]])) if flips.size else None


def test_the_acceptance_test_takes_numpys_exp_where_libms_differs():
    """numpy's SIMD exp and libm's differ in the last bit for a few values in a hundred: an offset is chosen so that
    one request's acceptance test at one step turns on that bit; the compiled fill decides it as numpy does."""
    pytest.importorskip("numba")
    acc = load_acceptance("dspark?jump=0&slope=1&offset=0&slope_easy=1", 1)
    table = _table(5, 1)
    table.gen[0], table.dsteps[0], table.out[0] = 0, 0, 10**6
    streams = table.streams
    u = acc.request_state(table.domain[:1], streams.rows(table.key[:1], -1, 1))[1]
    for step in range(200):
        found = _flip_mu(acc, streams, table.key[0], u, step)
        if found is not None:
            break
    assert found is not None
    acc._mu[:], accepted = found                       # every curve: the request's domain does not matter
    jit = predraw_mod.PredrawnDraws(acc, streams, table, 1, acc.words_per_step, steps=1)
    ref = predraw_mod.PredrawnDraws(acc, streams, table, 1, acc.words_per_step, steps=1)
    ref.compiled = None
    rows = np.zeros(1, np.int64)
    for p in (jit, ref):
        p._sized()
        p._fill(rows, p._alloc(rows), np.array([step]))
    at = ref.entry[0] * ref.R + step % ref.R
    assert ref._acc[at] == accepted        # the numpy path decides as numpy's exp does
    assert jit._acc[at] == accepted
    assert jit._cs[at].tobytes() == ref._cs[at].tobytes()


def test_importing_the_simulator_does_not_import_numba():
    code = "import sys, dsparksim, dsparksim.sim.simulate, dsparksim.sim.predraw, dsparksim.cli.main\n" \
           "print('numba' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stdout + r.stderr


def test_without_a_cache_folder_the_kernels_compile_in_each_process(monkeypatch):
    pytest.importorskip("numba")
    import importlib  # the kernels' module is reloaded twice (without, then with its cache)

    from numba.core.caching import CacheImpl, NullCache
    from dsparksim.sim import fill_jit

    monkeypatch.setattr(CacheImpl, "_locator_classes", [])   # numba finds nowhere to cache
    try:
        with pytest.warns(RuntimeWarning, match="compiling in each process"):
            importlib.reload(fill_jit)
        assert isinstance(fill_jit._halves._cache, NullCache)
    finally:
        monkeypatch.undo()
        importlib.reload(fill_jit)
    assert not isinstance(fill_jit._halves._cache, NullCache)


def test_the_fills_copy_of_the_code_is_current():
    """The code the compiled refill copies is the code it was checked against (else: make fill_jit follow the
    change, then put the printed fingerprints into fill_jit.MIRRORED)."""
    pytest.importorskip("numba")
    from dsparksim.sim import fill_jit

    acc = load_acceptance("dspark", 7)
    now = fill_jit.fingerprints(acc, predraw_mod.PredrawnDraws._fill)
    assert now == fill_jit.MIRRORED, now


def test_a_patched_draw_runs_on_numpy(monkeypatch):
    """A draw changed at run time is drawn as it is: the numpy refill, not the compiled copy."""
    pytest.importorskip("numba")
    acc = load_acceptance("dspark", 7)
    assert predraw_mod.compiled_fill(acc) is not None
    real = type(acc).draw_by_position
    monkeypatch.setattr(type(acc), "draw_by_position", lambda self, *a: real(self, *a))
    assert predraw_mod.compiled_fill(acc) is None
