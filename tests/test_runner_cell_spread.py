"""Profile cells whose contexts spread like the served batches' (measure.context_spread / cell_contexts).

The real runner pads each attention group to its longest context, so a cell's cost depends on how widely its
contexts spread, not only on their mean; validate measures its cells at its own workload's decode-context spread.
"""
torch = __import__("pytest").importorskip("torch")

import json  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from dsparksim.errors import ConfigError, InputError  # noqa: E402
from dsparksim.runner import measure  # noqa: E402
from dsparksim.runner.grid import MeasureConfig, slot_tokens, cell_contexts, context_spread, context_spread_from_csv  # noqa: E402
from dsparksim.runner.paired import PairedCells  # noqa: E402

TINY = "tiny,n_layers=1,d_model=32,n_heads=2,n_kv_heads=1,d_ff=64,vocab_size=128"


def test_context_spread_matches_the_closed_form_of_fixed_lengths():
    # one request, prompt p, output o: its decode contexts are p, p+1, ..., p+o-1 (mean p+(o-1)/2); the linear
    # quantile of that sample at (j+1/2)/P is p + (j+1/2)/P * (o - 1)
    p, o, P = 40, 81, 9
    q = np.array(context_spread(np.array([p]), np.array([o]), points=P))
    want = (p + (np.arange(P) + 0.5) / P * (o - 1)) / (p + (o - 1) / 2)
    assert np.allclose(q, want, atol=1e-4)
    assert np.all(np.diff(q) > 0)
    # two populations: half the requests short, half long -> the spread is bimodal and its mean is 1
    q2 = np.array(context_spread(np.array([10, 1000]), np.array([10, 10]), points=20))
    assert abs(q2.mean() - 1) < 0.01 and q2[:9].max() < 0.05 and q2[11:].min() > 1.9   # 2 quantiles straddle the gap


def test_cell_contexts_follow_the_spread_at_the_cells_mean_context():
    q = context_spread(np.full(3, 16), np.full(3, 145), points=33)        # contexts 16..160 relative to 88
    for n, ctx in ((4, 88), (16, 88), (32, 88), (16, 1000)):
        c = np.sort(cell_contexts(n, ctx, q))
        assert abs(c.mean() - ctx) <= 0.5 + 1e-9
        # the quantiles at (i+1/2)/n of contexts uniform over [16/88, 160/88] x ctx, within rounding
        want = ctx * np.interp((np.arange(n) + 0.5) / n, (np.arange(33) + 0.5) / 33, np.array(q) / np.mean(q))
        assert np.max(np.abs(c - want)) <= 1.5
        # wider than the default [c/2, 3c/2] cell, same mean
        d = np.sort(cell_contexts(n, ctx))
        assert c.max() > d.max() and c.min() < d.min() and abs(d.mean() - ctx) <= 0.5
        # the KV slot covers the longest context of the cell and the steps after it
        assert slot_tokens(ctx, 7, 2, 5, spread=q) > c.max() + 8 * 7
    assert cell_contexts(1, 88, q).tolist() == [88]
    # without a spread: unchanged (evenly over [c/2, 3c/2])
    assert sorted(cell_contexts(3, 100).tolist()) == [50, 100, 150]


def test_bad_spreads_and_lengths_files_are_refused_with_the_field(tmp_path):
    for bad in ((1.0,), (1.2, 0.8), (0.0, 1.0), (0.5, float("nan"))):
        with pytest.raises(ConfigError, match="context_spread"):
            MeasureConfig(context_spread=bad)
    f = tmp_path / "l.csv"
    f.write_text("num_prefill_tokens,num_decode_tokens\n10,20\n12,x\n")
    with pytest.raises(InputError, match=r":3: field 'num_decode_tokens'.*'x'"):      # the traffic reader's checks
        context_spread_from_csv(f)
    f.write_text("num_prefill_tokens,output\n10,20\n")
    with pytest.raises(InputError, match=r"field 'num_decode_tokens': missing column"):
        context_spread_from_csv(f)
    f.write_text("num_prefill_tokens,num_decode_tokens\n40,81\n12,30\n")
    assert context_spread_from_csv(f, points=9) == context_spread(np.array([40, 12]), np.array([81, 30]), points=9)
    from dsparksim.runner.validate import ValidateConfig
    with pytest.raises(ConfigError, match="cell_spread"):
        ValidateConfig(cell_spread="wide")


def test_measure_times_cells_at_the_spread_and_pairing_re_times_them_alike(monkeypatch):
    from dsparksim.runner.executor import Executor
    seen = []
    real_fast = Executor.fast_prefill

    def spy(exe, new, lens):
        pre = real_fast(exe, new, lens)
        seen.append((len(new), sorted(int(exe.cache_len[r]) for r in range(len(new))), sorted(pre.contexts.tolist())))
        return pre

    monkeypatch.setattr(Executor, "fast_prefill", spy)
    q = context_spread(np.full(2, 8), np.full(2, 57), points=17)
    mc = MeasureConfig(model=TINY, drift_gate=None, drift=False, prefill=False, mtp1=False, K=3, n_reqs=(1, 2, 4),
                       contexts=(16, 48), reps=3, min_growth=0.0, context_spread=q)
    prof, _ = measure.measure(mc, progress=False, log=lambda s: None)
    assert prof["metadata"]["grid"]["context_spread"] == list(q)
    assert "grid.context_spread" in prof["metadata"]["method"]
    # every 4-request cell's executor and scheduler contexts are the spread's at one of the measured contexts
    cells4 = [s for s in seen if s[0] == 4]
    want = {c: sorted(cell_contexts(4, c, q).tolist()) for c in mc.contexts}
    assert {c for c in want if any(s[1] == s[2] == want[c] for s in cells4)} == set(mc.contexts)
    assert all(s[1] in want.values() for s in cells4)
    # validate's paired cells rebuild the same cells from the profile's metadata
    from dsparksim.runner.executor import ExecutorConfig, build_models
    from dsparksim.runner.models import load_target
    ex = ExecutorConfig()
    mcfg, tmodel, _ = load_target(TINY, ex.device, ex.dtype)
    target, proxy = build_models(mcfg, ex, tmodel)
    pc = PairedCells.from_profile(json.loads(json.dumps(prof)), target, proxy, ex)
    assert pc.spread == q
    seen.clear()
    key = pc.match("dspark", 4, 2.0, 48.0)
    pc.time(key)
    assert seen and seen[-1][1] == seen[-1][2] == sorted(cell_contexts(4, key[2], q).tolist())
