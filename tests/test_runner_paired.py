"""Paired reference cells (dsparksim.runner.paired): the profile's own cells re-timed beside every real step."""
from types import SimpleNamespace

import numpy as np
import pytest

from dsparksim.runner.paired import PairedCells, RunPairs, smooth_factors


def test_smooth_factors_carries_the_running_median_to_every_step():
    idx = np.array([0, 2, 3, 7])
    f = np.array([1.0, 1.0, 2.0, 2.0])
    # span 0: each measured step keeps its own factor; unpaired steps take the nearest (ties: the earlier)
    assert smooth_factors(idx, f, 10, 0).tolist() == [1, 1, 1, 2, 2, 2, 2, 2, 2, 2]
    # span 1: running median over 3 measured neighbours (the window is cut at the ends)
    sm = smooth_factors(idx, f, 8, 1)
    assert sm[0] == np.median([1, 1]) and sm[2] == np.median([1, 1, 2]) and sm[3] == np.median([1, 2, 2])
    assert sm[7] == np.median([2, 2])
    # one outlier among steady factors is removed by the median
    idx = np.arange(9)
    f = np.ones(9)
    f[4] = 3.0
    assert np.all(smooth_factors(idx, f, 9, 2) == 1.0)
    assert smooth_factors(np.array([], int), np.array([]), 5, 2) is None
    with pytest.raises(ValueError, match="increase"):
        smooth_factors(np.array([3, 1]), np.array([1.0, 1.0]), 5, 1)
    with pytest.raises(ValueError, match="positive"):
        smooth_factors(np.array([0, 1]), np.array([1.0, 0.0]), 5, 1)


def test_cell_medians_are_the_per_cell_medians_and_mean_contexts():
    pytest.importorskip("torch")
    from dsparksim.runner.fitting import cell_medians
    recs = [{"n": 2, "ctx": 32, "L": 1, "t_step": t, "kv": kv} for t, kv in ((3.0, 64), (1.0, 66), (2.0, 68))]
    recs += [{"n": 1, "ctx": 32, "L": 0, "t_step": 5.0, "kv": 40}]
    c = cell_medians(recs, 3)
    assert c == {"K": 3, "rows": [[1, 32, 0, 5.0, 40.0], [2, 32, 1, 2.0, 33.0]]}
    assert cell_medians([], 3) == {"K": 3, "rows": []}


class FakeCells(PairedCells):
    """Stored cells timed on a fake machine: a cell's time now = its stored time x the machine's slowdown."""

    def __init__(self, rows, K=3):
        super().__init__(None, None, None, {"dspark": {"K": K, "rows": rows}}, warmup=2, reps=3,
                         baseline="cell")
        self.slowdown = 1.0
        self.asked = []

    def time(self, key):
        self.asked.append(key)
        return self.baseline(key) * self.slowdown


def _plan(n, L, ctx, prefill=()):
    # a StepPlan's fields the pairing reads; prompt tokens and query-key pairs as the engine counts them
    # (predicted_s 0: no price, a mixed step's weight falls back to the references' shares)
    return SimpleNamespace(n_decode=n, verify=np.full(n, L), kv_read=n * ctx, prefill=list(prefill),
                           n_prefill=sum(c[3] for c in prefill), predicted_s=0.0,
                           prefill_qk=sum(c[3] * c[2] + c[3] * (c[3] + 1) // 2 for c in prefill))


ROWS = [[n, c, L, 1e-3 * (1 + n + L) * (1 + c / 100), c + 4.0]
        for n in (1, 2, 4, 8) for c in (32, 96) for L in range(4)]


def test_match_picks_the_nearest_measured_n_context_and_verify_length():
    cells = FakeCells(ROWS)
    assert cells.match("dspark", 3, 2.4, 90.0) in {("dspark", 2, 96, 2), ("dspark", 4, 96, 2)}
    assert cells.match("dspark", 7, 0.6, 30.0) == ("dspark", 8, 32, 1)
    assert cells.match("dspark", 40, 9.0, 1000.0) == ("dspark", 8, 96, 3)      # L clipped to K, n to the largest
    assert cells.match("mtp1", 1, 1.0, 30.0) is None                             # no cells for this drafter
    assert cells.baseline(("dspark", 4, 32, 3)) == pytest.approx(1e-3 * 8 * 1.32)


def test_paired_factors_recover_an_injected_slowdown_step_by_step():
    cells = FakeCells(ROWS)
    pairs = RunPairs(cells, "dspark", span=2)
    truth = np.ones(60)
    truth[20:40] = 1.37                          # the machine slows for 20 steps, then recovers
    shapes = [(1 + i % 8, i % 4, 30 + 2 * i) for i in range(60)]
    for i, (n, L, ctx) in enumerate(shapes):
        cells.slowdown = truth[i]
        pf = [(0, 0, 0, 16)] if i % 10 == 5 else []    # steps with a prefill chunk are paired by their decode part
        pairs.after_step(i, _plan(0 if i % 10 == 7 else n, L, ctx, pf))   # prefill-only steps are not paired
    assert len(pairs.idx) == 60 - 6 and all(i % 10 != 7 for i in pairs.idx) and 5 in pairs.idx
    f = pairs.factors(60)
    # exact away from the switch (the running median needs span paired steps on the new side)
    inside = np.r_[0:18, 23:38, 43:60]
    assert np.allclose(f[inside], truth[inside])
    # a step's time divided by its factor is the stored cell speed again: the slowdown is undone
    assert np.allclose((truth / f)[inside], 1.0)
    # every step has a factor, unpaired prefill-only steps included, and decode steps of shapes not in the profile
    # (no cells for mtp1) are left unpaired
    other = RunPairs(cells, "mtp1")
    other.after_step(0, _plan(1, 1, 30))
    assert other.factors(3) is None and other.idx == []


def test_fit_baseline_is_the_profiles_closed_form_price_of_the_cell_shape():
    from dsparksim.errors import ConfigError
    from dsparksim.cost.profile import FORMAT, profile_from_dict
    prof = profile_from_dict({
        "format": FORMAT, "name": "t", "metadata": {"device": "-", "model": "-", "source": "-", "method": "-"},
        "verify": {"M": [1, 16, 1000], "time_s": [1e-3, 3e-3, 9e-3]}, "fixed_overhead_s": 1e-4,
        "attention": {"model": "kv_bandwidth", "seconds_per_kv_token": 1e-6},
        "drafters": {"dspark": {"kind": "parallel", "tokens": [3, 12, 300], "time_s": [5e-4, 2e-3, 5e-3]}}})
    rows = [[2, 32, 3, 7e-3, 36.0], [4, 32, 3, 1e-2, 40.0]]
    cells = PairedCells(None, None, None, {"dspark": {"K": 3, "rows": rows}}, 2, 3, profile=prof)
    # n=2, L=3: M = 2 x 4 = 8 -> floor to the M=1 step (1 ms) + 2 x 36 KV tokens x 1 us; drafter 2 x 3 = 6 tokens
    # -> floor to 3 (0.5 ms); fixed overhead 0.1 ms
    assert cells.fit_price(("dspark", 2, 32, 3)) == pytest.approx(1e-3 + 72e-6 + 5e-4 + 1e-4)
    # n=4: M = 16 (3 ms) + 160 us; 12 drafter tokens (2 ms); 0.1 ms
    assert cells.baseline(("dspark", 4, 32, 3)) == pytest.approx(3e-3 + 160e-6 + 2e-3 + 1e-4)
    assert cells.cell_median(("dspark", 4, 32, 3)) == 1e-2
    # a run paired with the fit baseline records what the raw cell median would have said
    cells.time = lambda key: 2 * cells.fit_price(key)          # the machine runs at half the profile's speed
    pairs = RunPairs(cells, "dspark", span=0)
    pairs.after_step(0, _plan(4, 3, 40.0))
    assert pairs.f == [pytest.approx(2.0)]
    assert pairs.median_over_fit == [pytest.approx(1e-2 / (3e-3 + 160e-6 + 2e-3 + 1e-4))]
    with pytest.raises(ConfigError, match="pair_baseline"):
        PairedCells(None, None, None, {"dspark": {"K": 3, "rows": rows}}, 2, 3, profile=None)
    with pytest.raises(ConfigError, match="pair_baseline"):
        PairedCells(None, None, None, {"dspark": {"K": 3, "rows": rows}}, 2, 3, profile=prof, baseline="mean")


def _live_meta(drafting):
    return {"metadata": {"drafting": drafting, "grid": {"warmup": 1, "reps": 2},
                         "cells": {"dspark": {"K": 7, "rows": [[2, 32, 3, 1e-3, 32.0]]}}}}


def test_pairing_refuses_cells_of_the_other_step_kind():
    """Cells measured on live steps pair only live runs, proxy cells only trace replay (the two steps differ)."""
    from types import SimpleNamespace
    from dsparksim.errors import ConfigError
    with pytest.raises(ConfigError, match="live.*proxy"):
        PairedCells.from_profile(_live_meta("live:models"), None, None, None, baseline="cell")
    with pytest.raises(ConfigError, match="drafter-proxy.*live"):
        PairedCells.from_profile(_live_meta("proxy"), None, None, None, baseline="cell",
                                 live=SimpleNamespace(drafters={"dspark": None}))
    with pytest.raises(ConfigError, match="dspark"):
        PairedCells.from_profile(_live_meta("live:models"), None, None, None, baseline="cell",
                                 live=SimpleNamespace(drafters={"mtp1": None}))


def test_live_cells_are_timed_on_the_trained_drafters_step():
    """Live pairing re-times the live profiling step (trained drafter + rejection sampling + state update, every
    block rejected after position 1) on its own engine, which lives as long as a profile cell did."""
    pytest.importorskip("torch")
    from pathlib import Path
    from dsparksim.runner.executor import ExecutorConfig, build_models
    from dsparksim.runner.live import LiveExecutor
    from dsparksim.runner.timing import LiveDrafters
    from dsparksim.runner.models import load_target
    models = Path(__file__).resolve().parents[1] / "models"
    ex = ExecutorConfig()
    mcfg, tmodel, _ = load_target(f"ckpt:{models / 'target.pt'}", ex.device, ex.dtype)
    target, proxy = build_models(mcfg, ex, tmodel)
    lv = LiveDrafters.load(str(models), ["dspark"], target)
    cells = PairedCells(target, proxy, ex, _live_meta("live:models")["metadata"]["cells"], warmup=1, reps=2,
                        baseline="cell", live=lv)
    key = cells.match("dspark", 3, 2.8, 40.0)
    assert key == ("dspark", 2, 32, 3)
    times = [cells.time(key) for _ in range(8 * 3)]        # (warmup + reps) rounds of the 8 verify lengths
    assert times[:2] == [None, None]                         # a fresh engine's first steps are not used
    assert all(t is not None and 0 < t < 1 for t in times[2:])
    assert not cells._engines                                # its lifetime is over: the next call starts afresh
    cells.time(key)
    (st, *_), = cells._engines.values()
    assert isinstance(st.ex, LiveExecutor) and st.ex.force_reject


PF_ROWS = [[c, k, pre, 1e-3 * (1 + c / 64) * k * (1 + pre / 512), pre + c] for c in (16, 32, 64, 128)
           for k in (1, 2) for pre in (0, 1536)]


class FakePrefillCells(FakeCells):
    """FakeCells with prefill-only cells on the same fake machine (its own slowdown)."""

    def __init__(self):
        super().__init__(ROWS)
        self.prefill = {"dspark": {"rows": np.asarray(PF_ROWS, float), "price": None}}
        self.pf_slowdown = 1.0

    def time_prefill(self, key):
        return self.prefill_baseline(key) * self.pf_slowdown


def test_prefill_only_steps_take_the_factor_of_their_own_prefill_cells():
    """A slow spell that hits decode steps but not prefill-only ones (what this VM does at ~1k contexts) is undone
    for each kind by its own paired cells; without prefill cells prefill-only steps take a decode neighbour's."""
    cells = FakePrefillCells()
    # nearest chunk length, chunk count and prefix (estimated from the query-key pairs)
    assert cells.match_prefill("dspark", 120, 1, 120 * 1000 + 120 * 121 // 2) == ("prefill", "dspark", 128, 1, 1536)
    assert cells.match_prefill("dspark", 60, 2, 2 * (30 * 31 // 2)) == ("prefill", "dspark", 32, 2, 0)
    assert cells.match_prefill("mtp1", 60, 1, 100) is None
    pairs = RunPairs(cells, "dspark", span=1)
    decode = np.ones(40, bool)
    decode[10:20] = False                                   # steps 10..19: one request's prompt, chunk by chunk
    cells.slowdown, cells.pf_slowdown = 1.4, 1.0           # decode steps 40% slower, prefill-only ones not
    for i in range(40):
        plan = _plan(2, 3, 500) if decode[i] else _plan(0, 0, 0, [(0, 0, 128 * (i - 10), 128)])
        pairs.after_step(i, plan)
    assert len(pairs.idx) == 30 and len(pairs.pf_log) == 10 and pairs.pf_steps == list(range(10, 20))
    f = pairs.factors(40)
    assert np.allclose(f[decode], 1.4) and np.allclose(f[~decode], 1.0)
    t = pairs.prefill_table()
    assert list(t.columns) == ["step", "drafter", "chunk", "k", "prefix", "cell_s", "baseline_s", "factor"]
    assert np.allclose(t["factor"], 1.0) and set(t["prefix"]) == {0, 1536}
    # without prefill cells: the decode neighbours' factor (the old behaviour)
    plain = FakeCells(ROWS)
    plain.slowdown = 1.4
    p2 = RunPairs(plain, "dspark", span=1)
    for i in range(40):
        p2.after_step(i, _plan(2, 3, 500) if decode[i] else _plan(0, 0, 0, [(0, 0, 0, 128)]))
    assert np.allclose(p2.factors(40), 1.4) and p2.pf_log == []


def test_prefill_cell_price_is_the_verify_term_plus_prefill_terms_beside_no_decode():
    from dsparksim.cost.profile import FORMAT, profile_from_dict
    from dsparksim.runner.paired import prefill_cell_prices
    prof = profile_from_dict({
        "format": FORMAT, "name": "t", "metadata": {"device": "-", "model": "-", "source": "-", "method": "-"},
        "verify": {"M": [1, 64, 1000], "time_s": [1e-3, 3e-3, 9e-3]}, "fixed_overhead_s": 1e-4,
        "attention": {"model": "kv_bandwidth", "seconds_per_kv_token": 1e-6},
        "prefill": {"seconds_per_token": 1e-6, "seconds_per_query_key": 1e-9, "seconds_per_chunk": 2e-4,
                    "seconds_per_token_per_decode": 5e-7, "note": "t"},
        "drafters": {"dspark": {"kind": "parallel", "tokens": [3, 300], "time_s": [5e-4, 5e-3],
                                "prefill_s_per_token": 3e-7}}})
    # one 64-token chunk after 512 cached tokens: M = 64 (3 ms) + 576 KV tokens x 1 us; 64 x 1 us per token;
    # 64 x 512 + 64 x 65 / 2 query-key pairs x 1 ns; 0.2 ms per chunk; no per-decode term; drafter 64 x 0.3 us;
    # no fixed overhead (the cell times the executor's step, not the host loop)
    want = 3e-3 + 576e-6 + 64e-6 + (64 * 512 + 64 * 65 // 2) * 1e-9 + 2e-4 + 64 * 3e-7
    got = prefill_cell_prices(prof, np.array([[64, 1, 512, 0.0, 576.0]]), "dspark")
    assert got == pytest.approx([want], rel=1e-12)


def test_mixed_steps_take_the_blended_factor_of_their_decode_and_prefill_cells():
    # without a profile the blend weights the two cells by their references: summed times over summed references
    cells = FakePrefillCells()
    cells.slowdown, cells.pf_slowdown = 1.5, 1.0
    pairs = RunPairs(cells, "dspark", span=0)
    chunk = [(9, 9, 512, 128)]                                  # 128 prompt tokens after 512 cached ones

    def mixed():                                                # 4 decoding requests at context 96 + the chunk:
        p = _plan(4, 3, 96, chunk)                              # kv_read also counts the chunk's prefix and tokens
        p.kv_read += 512 + 128
        return p
    for i in range(10):
        pairs.after_step(i, _plan(4, 3, 96) if i < 5 else _plan(0, 0, 0, chunk) if i == 7 else mixed())
    # the decode part is matched on the decoding rows' own context, and is still a decode pair
    assert {r[1:5] for r in pairs.log} == {("dspark", 4, 96, 3)} and len(pairs.log) == 9
    assert len(pairs.mx_log) == 4 and pairs.mx_steps == [5, 6, 8, 9] and pairs.pf_steps == [7]
    f = pairs.factors(10)
    bd = cells.baseline(("dspark", 4, 96, 3))
    pk = cells.match_prefill("dspark", 128, 1, 128 * 512 + 128 * 129 // 2)
    assert pk == ("prefill", "dspark", 128, 1, 1536)          # 512 cached: nearer 1536 than 0 (log(prefix + 32))
    bp = cells.prefill_baseline(pk)
    assert np.allclose(f[:5], 1.5) and f[7] == pytest.approx(1.0)
    assert np.allclose(f[[5, 6, 8, 9]], (1.5 * bd + bp) / (bd + bp))
    t = pairs.mixed_table()
    assert np.allclose(t["factor"], (1.5 * bd + bp) / (bd + bp)) and len(t) == 4


def test_mixed_blend_weights_the_prefill_cell_by_the_price_beyond_the_decode_part():
    from dsparksim.cost.profile import FORMAT, profile_from_dict
    prof = profile_from_dict({
        "format": FORMAT, "name": "t", "metadata": {"device": "-", "model": "-", "source": "-", "method": "-"},
        "verify": {"M": [1, 16, 1000], "time_s": [1e-3, 3e-3, 9e-3]}, "fixed_overhead_s": 1e-4,
        "drafters": {"dspark": {"kind": "parallel", "tokens": [3, 12, 300], "time_s": [5e-4, 2e-3, 5e-3]}}})
    cells = PairedCells(None, None, None, {"dspark": {"K": 3, "rows": [[4, 32, 3, 1e-2, 40.0]]}}, 2, 3,
                        profile=prof)
    key = ("dspark", 4, 32, 3)
    dec = cells.fit_price(key)                           # M = 16: 3 ms + 12 drafter tokens 2 ms + 0.1 ms
    assert dec == pytest.approx(5.1e-3)
    assert cells.prefill_weight(key, 4 * dec, 1.0, 1.0) == pytest.approx(0.75)     # 3/4 of the step is the chunk
    assert cells.prefill_weight(key, 0.5 * dec, 1.0, 1.0) == 0.0                   # clipped to [0, 1]
    from dsparksim.runner.paired import _mixed_factor
    row = (0, "dspark", 4, 32, 3, 1.5, 1.0, 128, 1, 0, 1.0, 1.0, 0.25)             # decode x1.5, prefill x1.0
    assert _mixed_factor(row) == pytest.approx(0.75 * 1.5 + 0.25 * 1.0)
