"""Paired reference cells (dsparksim.runner.paired): the profile's own cells re-timed beside every real step."""
from types import SimpleNamespace

import numpy as np
import pytest

from dsparksim.runner.paired import PairedCells, RunPairs, cell_medians, smooth_factors


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
    recs = [{"n": 2, "ctx": 32, "L": 1, "t_step": t, "kv": kv} for t, kv in ((3.0, 64), (1.0, 66), (2.0, 68))]
    recs += [{"n": 1, "ctx": 32, "L": 0, "t_step": 5.0, "kv": 40}]
    c = cell_medians(recs, 3)
    assert c == {"K": 3, "rows": [[1, 32, 0, 5.0, 40.0], [2, 32, 1, 2.0, 33.0]]}
    assert cell_medians([], 3) == {"K": 3, "rows": []}


class FakeCells(PairedCells):
    """Stored cells timed on a fake machine: a cell's time now = its stored time x the machine's slowdown."""

    def __init__(self, rows, K=3):
        super().__init__(None, None, None, {"dspark": {"K": K, "rows": rows}}, warmup=2, reps=3)
        self.slowdown = 1.0
        self.asked = []

    def time(self, key):
        self.asked.append(key)
        return self.baseline(key) * self.slowdown


def _plan(n, L, ctx, prefill=()):
    return SimpleNamespace(n_decode=n, verify=np.full(n, L), kv_read=n * ctx, prefill=list(prefill))


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
        pf = [(0, 0, 0, 16)] if i % 10 == 5 else []    # prefill steps are not paired
        pairs.after_step(i, _plan(n, L, ctx, pf))
    assert len(pairs.idx) == 60 - 6 and all(i % 10 != 5 for i in pairs.idx)
    f = pairs.factors(60)
    # exact away from the switch (the running median needs span paired steps on the new side)
    inside = np.r_[0:18, 23:38, 43:60]
    assert np.allclose(f[inside], truth[inside])
    # a step's time divided by its factor is the stored cell speed again: the slowdown is undone
    assert np.allclose((truth / f)[inside], 1.0)
    # every step has a factor, unpaired prefill steps included, and decode steps of shapes not in the profile
    # (no cells for mtp1) are left unpaired
    other = RunPairs(cells, "mtp1")
    other.after_step(0, _plan(1, 1, 30))
    assert other.factors(3) is None and other.idx == []
