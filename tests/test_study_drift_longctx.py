"""Studies calibration-drift and long-context (issue 29, 2.2 and 2.3): the head-shift model, the domain drift of a
workload, the 2-D-priced policy, and each study's FAST run (numbers in the report come from its own tables)."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from dsparksim.acceptance import load_acceptance
from dsparksim.cli.main import main
from dsparksim.errors import ConfigError
from dsparksim.policies import make_policy
from dsparksim.policies.base import StepContext
from dsparksim.policies.confidence_async_2d import priced_candidates, ratio_2d
from dsparksim.study import drift, longctx
from dsparksim.study.run import settings_for
from dsparksim.traffic import TrafficConfig
from dsparksim.traffic.build import build_workload


# ------------------------------------------------------------------------------------------- head shift
def _blocks(spec: str, domain: str, n: int = 6000, seed: int = 5):
    m = load_acceptance(spec, 5)
    rng = np.random.default_rng(seed)
    m.start(np.arange(n), np.full(n, domain, dtype=object), rng)
    return m, m.draw(np.arange(n), rng)


def test_default_head_shift_changes_nothing():
    _, a = _blocks("dspark", "code")
    _, b = _blocks("dspark?head_blind=0", "code")
    np.testing.assert_array_equal(a.conf, b.conf)
    np.testing.assert_array_equal(a.accepted, b.accepted)


def test_blind_head_is_underconfident_off_its_mix_and_acceptance_is_unchanged():
    spec = "dspark?head_blind=1&head_mix=1:1:6&sts_mix=1:1:6"
    _, plain = _blocks("dspark?sts_mix=1:1:6", "code")
    m, blind = _blocks(spec, "code")
    np.testing.assert_array_equal(plain.accepted, blind.accepted)           # same draws, same truth
    bias = m.metadata["head_shift"]["bias_by_domain"]
    assert all(x < 0 for x in bias["code"]) and all(x > 0 for x in bias["chat"])
    # code accepts more than the chat-heavy mix: the blind head under-predicts position 1 by > 3 points
    assert blind.conf[:, 0].mean() < (blind.accepted >= 1).mean() - 0.03
    assert abs(plain.conf[:, 0].mean() - (plain.accepted >= 1).mean()) < 0.02


@pytest.mark.parametrize("q, name", [("head_blind=2", "head_blind"), ("head_blind=x", "head_blind"),
                                     ("sts_mix=1:1", "sts_mix"), ("head_mix=0:0:0", "head_mix"),
                                     ("sts_mix=1:-1:1", "sts_mix")])
def test_head_shift_parameters_are_checked(q, name):
    with pytest.raises(ConfigError, match=name):
        load_acceptance(f"dspark?{q}", 5)


# ------------------------------------------------------------------------------------------- domain drift
def _domains(drift_spec, n=3000, seed=2):
    t = TrafficConfig(mode="closed", concurrency=4, num_requests=n, domain="mix:math=1,code=1,chat=6",
                      domain_drift=drift_spec)
    return np.asarray(build_workload(t, np.random.default_rng(seed)).materialise().domain)


def test_domain_drift_switches_the_mix_by_request_index():
    d = _domains(("mix:math=1,code=6,chat=1", 1000, 1000))
    before, after = d[:1000], d[1000:]
    assert abs(np.mean(before == "code") - 1 / 8) < 0.035 and abs(np.mean(before == "chat") - 6 / 8) < 0.04
    assert abs(np.mean(after == "code") - 6 / 8) < 0.03 and abs(np.mean(after == "chat") - 1 / 8) < 0.03
    g = _domains(("mix:math=1,code=6,chat=1", 500, 2500))          # gradual: the code share rises in between
    shares = [np.mean(g[a:a + 500] == "code") for a in (0, 1000, 2500)]
    assert shares[0] < shares[1] < shares[2]
    # requests whose mix is the same in two runs get the same domain (inverse CDF of one keyed uniform)
    late = _domains(("mix:math=1,code=6,chat=1", 2000, 2000))
    np.testing.assert_array_equal(d[:1000], late[:1000])


def test_domain_drift_is_checked():
    for bad in (("mix:code=1", 5, 2), ("trace", 0, 1), ("mix:code=1", -1, 3), ("mix:code=1", 1.5, 3)):
        with pytest.raises(ConfigError, match="domain_drift"):
            TrafficConfig(mode="closed", concurrency=4, num_requests=10, domain_drift=bad)


# ------------------------------------------------------------------------------------------- 2-D policy
def _step(conf, context, qk=3e-9, sps_slope=2e-5):
    n = len(context)
    c = np.asarray(context, float)

    def base(M):
        return 0.02 + sps_slope * np.asarray(M, float)

    def one_d(M):       # the engine's 1-D price: each extra token at the mean context
        M = np.asarray(M)
        return base(M) + qk * (c.sum() + (M - n) * c.mean())

    return StepContext(conf=np.asarray(conf, float), survival=np.cumprod(conf, 1), request_ids=np.arange(n),
                       base_tokens=n, step_time=one_d, max_tokens=n * 6, context=np.asarray(context, np.int64),
                       qk_s=qk), base


def test_2d_without_context_is_confidence_async():
    rng = np.random.default_rng(0)
    a, b = make_policy("confidence-async:2"), make_policy("confidence-async-2d:2")
    a.reset(5, rng), b.reset(5, rng)
    for _ in range(20):
        ctx, _ = _step(rng.uniform(0.2, 0.99, (7, 5)), rng.integers(8000, 128000, 7))
        ctx = StepContext(conf=ctx.conf, survival=ctx.survival, request_ids=ctx.request_ids, base_tokens=7,
                          step_time=ctx.step_time, max_tokens=42)
        np.testing.assert_array_equal(a.choose(ctx), b.choose(ctx))


def test_2d_prices_the_exact_step_and_prefers_short_contexts():
    rng = np.random.default_rng(1)
    conf = rng.uniform(0.5, 0.99, (6, 5))
    ctxs = [8_000, 120_000, 16_000, 64_000, 9_000, 100_000]
    ctx, base = _step(conf, ctxs)
    order, vals, pairs, b = priced_candidates(ctx)
    M = np.arange(6, 37)
    np.testing.assert_allclose(b(M), base(M), rtol=1e-12)                   # the batch term recovered exactly
    r = ratio_2d(ctx, vals, pairs, b, 30)
    for k in (0, 7, 30):                                                     # the curve's price is the engine's
        L = np.bincount(order[:k] % 6, minlength=6)
        exact = base(6 + k) + 3e-9 * ((1 + L) * np.array(ctxs) + L * (L + 1) / 2).sum()
        assert r[k] == pytest.approx((6 + vals[:k].sum()) / exact, rel=1e-12)
        assert all(np.all(np.diff(np.sort(order[:k][order[:k] % 6 == i] // 6)) == 1) for i in range(6))  # prefixes
    # equal survivals: the first candidate admitted belongs to the shortest context
    ctx2, _ = _step(np.full((6, 5), 0.9), ctxs)
    assert order.size and priced_candidates(ctx2)[0][0] % 6 == int(np.argmin(ctxs))


# ------------------------------------------------------------------------------------------- FAST study runs
@pytest.fixture(scope="module")
def fast_out(tmp_path_factory):
    out = tmp_path_factory.mktemp("studies")
    for name in ("calibration-drift", "long-context"):
        assert main(["study", name, "--fast", "--out", str(out), "--quiet"]) == 0
    return out


def _intervals_hold(df, mean, lo, hi) -> int:
    ok = df[[mean, lo, hi]].notna().all(axis=1)
    sub = df[ok]
    assert ((sub[lo] <= sub[mean] + 1e-12) & (sub[mean] <= sub[hi] + 1e-12)).all()
    return int(ok.sum())


def test_fast_drift(fast_out):
    d = fast_out / "calibration-drift"
    meta = json.loads((d / "study.json").read_text())
    sec = (d / "section.md").read_text()
    assert meta["mode"] == "fast" and meta["headline"] in (fast_out / "REPORT.md").read_text()
    for part in ("**Question.**", "**Setup.**", "**Answer.**", "**Limits.**"):
        assert part in sec
    runs = pd.read_csv(d / "runs.csv")
    assert len(runs) == len(drift.plan(settings_for("fast")))
    # before the change every arm serves the same confidences (the reference's factor is 1 there): identical runs
    for seed, g in runs.groupby("seed"):
        b = g.set_index("arm")
        assert b.loc["stale", "throughput_before_tok_s"] == b.loc["correct", "throughput_before_tok_s"]
        assert b.loc["stale", "ece_before"] == pytest.approx(b.loc["correct", "ece_before"], rel=1e-9)
        assert b["code_share_after"].min() > 0.6 > 0.3 > b["code_share_before"].max()
    assert (runs.loc[runs["arm"] == "recal", "recal_refits"] > 0).all()
    paired = pd.read_csv(d / "paired.csv")
    assert _intervals_hold(paired, "diff", "diff_lo", "diff_hi") >= 6
    r = paired[(paired["arm"] == "stale") & (paired["metric"] == "throughput_after_tok_s")].iloc[0]
    assert f"{100 * r['diff']:+.2f}% [" in sec


def test_fast_long_context(fast_out):
    d = fast_out / "long-context"
    sec = (d / "section.md").read_text()
    runs = pd.read_csv(d / "runs.csv")
    assert len(runs) == len(longctx.plan(settings_for("fast")))
    one_d = runs[runs["policy"] == longctx.BASE]
    # long contexts: the 1-D price misses a verified token's cost by a lot per token, but not the step's total
    assert (one_d["price_err_ver_p90"] > 0.1).all() and (one_d["step_err_abs_p90"] < 0.05).all()
    assert (one_d["price_steps"] > 100).all() and (one_d["attention_share_ver"] > 0.05).all()
    price = pd.read_csv(d / "pricing_error.csv")
    assert _intervals_hold(price, "mean", "lo", "hi") >= 5
    r = price[price["metric"] == "price_err_ver_mean"].iloc[0]
    assert f"{100 * r['mean']:.1f}% [" in sec
