torch = __import__("pytest").importorskip("torch")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from dsparksim.cost.profile import load_profile, save_profile  # noqa: E402
from dsparksim.runner import fitting, grid, measure, timing  # noqa: E402
from dsparksim.runner.executor import ExecutorConfig  # noqa: E402
from dsparksim.runner.grid import MeasureConfig  # noqa: E402
from dsparksim.runner.fitting import MeasurementError, decompose_target, fit_profile  # noqa: E402

TINY = "tiny,n_layers=1,d_model=32,n_heads=2,n_kv_heads=1,d_ff=64,vocab_size=128"


def _synthetic(V0, B, s, ns=(1, 2, 4), K=3, ctxs=(10, 50)):
    recs = []
    for c in ctxs:
        for n in ns:
            for L in range(K + 1):
                M = n * (1 + L)
                kv = n * c
                t = V0(M) + B(n) + s * kv
                recs.append({"n": n, "L": L, "ctx": c, "M": M, "kv": kv, "t_step": t + 2e-3, "t_target": t,
                             "t_draft": 1e-3 * n, "t_host": 1e-3})
    return recs


def test_decomposition_recovers_verify_floor_and_context_terms():
    V0 = lambda M: 1e-3 + 2e-5 * M  # noqa: E731
    B = lambda n: 3e-4 * (n - 1)    # noqa: E731
    recs = _synthetic(V0, B, 1e-7)
    r = {k: np.array([x[k] for x in recs], float) for k in recs[0]}
    M, V, Bn, s, q = decompose_target(r)
    np.testing.assert_allclose(V, V0(M), rtol=1e-6)
    np.testing.assert_allclose(Bn, [B(1), B(2), B(4)], atol=1e-9)
    assert s == pytest.approx(1e-7, rel=1e-6)


def test_decomposition_recovers_the_query_key_term_that_a_kv_only_fit_misses():
    # target = V0(M) + B(n) + s*kv + q*qk: one request verifying L scores its cache 1+L times (qk), n requests at
    # L=0 read n caches once each (kv). The fit must return q, and pricing with it must match every cell exactly.
    V0 = lambda M: 1e-3 + 2e-5 * M  # noqa: E731
    B = lambda n: 3e-4 * (n - 1)    # noqa: E731
    s_true, q_true = 5e-8, 1e-7
    recs = []
    for c in (10, 50, 200):
        for n in (1, 2, 4, 8):
            for L in range(8):
                M, kv, qk = n * (1 + L), n * c, n * ((1 + L) * c + L * (L + 1) // 2)
                t = V0(M) + B(n) + s_true * kv + q_true * qk
                recs.append({"n": n, "L": L, "ctx": c, "M": M, "kv": kv, "qk": qk, "t_step": t + 2e-3,
                             "t_target": t, "t_draft": 1e-3 * n, "t_host": 1e-3})
    r = {k: np.array([x[k] for x in recs], float) for k in recs[0]}
    M, V, Bn, s, q = decompose_target(r)
    assert q == pytest.approx(q_true, rel=1e-6) and s == pytest.approx(s_true, rel=1e-6)
    np.testing.assert_allclose(V, V0(M), rtol=1e-6)
    # without the qk column (old records) the same data cannot be priced exactly: a kv-only fit is off somewhere
    r_old = {k: v for k, v in r.items() if k != "qk"}
    M2, V2, B2, s2, q2 = decompose_target(r_old)
    assert q2 is None
    pred = V2[np.searchsorted(M2, r["M"].astype(int))] + B2[np.searchsorted([1, 2, 4, 8], r["n"].astype(int))] \
        + s2 * r["kv"]
    assert np.max(np.abs(pred / r["t_target"] - 1)) > 0.05
    # the fitted profile carries it, and the core prices a step with it (absent = 0 keeps old profiles)
    prof = fit_profile(recs, [], MeasureConfig(K=7, n_reqs=(1, 2, 4, 8), contexts=(10, 50, 200)))
    assert prof["attention"]["seconds_per_query_kv"] == pytest.approx(q_true, rel=1e-6)
    assert prof["_fit"]["context_shape"]["max_over_min"] == pytest.approx(1.0, rel=1e-4)


def test_flat_and_inert_results_are_refused():
    mc = MeasureConfig(K=3, n_reqs=(1, 2, 4), contexts=(10, 50))
    flat = _synthetic(lambda M: 1e-3, lambda n: 0.0, 0.0)
    with pytest.raises(MeasurementError, match="flat"):
        fit_profile(flat, [], mc)
    inert = _synthetic(lambda M: 0.0, lambda n: 0.0, 0.0)
    with pytest.raises(MeasurementError, match="inert"):
        fit_profile(inert, [], mc)


def test_measured_profile_loads_in_core_and_oom_cell_is_reported_not_measured(tmp_path, monkeypatch):
    real_cell = timing.time_cell

    def flaky(target, proxy, ex, K, drafter, n, ctx, *a):
        if n == 2 and ctx == 16 and K > 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real_cell(target, proxy, ex, K, drafter, n, ctx, *a)

    monkeypatch.setattr(timing, "time_cell", flaky)
    mc = MeasureConfig(
        model=TINY, drift_gate=None, executor=ExecutorConfig(), K=3, n_reqs=(1, 2, 4), contexts=(16, 48), reps=3,
        min_growth=0.0)
    prof, raw = measure.measure(mc, progress=False, log=lambda s: None)
    fails = prof["metadata"]["failed_cells"]
    assert len(fails) == 1 and fails[0]["n_req"] == 2 and fails[0]["context"] == 16 and "out of memory" in fails[0]["error"]
    assert not any(r["n"] == 2 and r["ctx"] == 16 for r in raw["block"])   # never written as a measurement
    p = save_profile(prof, tmp_path / "p.json")
    cp = load_profile(str(p))
    assert cp.min_tokens == 1 and cp.max_tokens == 4 * 4
    assert set(cp.drafters) == {"dspark", "mtp1"} and cp.context_model == "linear"
    # a step is priced from the measured terms
    assert cp.step_time(8, 4, "dspark", 3, 100) > cp.verify_time(8, 100) > 0


def test_prefill_cells_out_of_memory_leave_no_prefill_term(monkeypatch):
    def oom(*a, **k):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")

    monkeypatch.setattr(timing, "time_prefill_cells", oom)
    mc = MeasureConfig(
        model=TINY, drift_gate=None, executor=ExecutorConfig(), K=3, n_reqs=(1, 2, 4), contexts=(16,), reps=3,
        min_growth=0.0)
    prof, _ = measure.measure(mc, progress=False, log=lambda s: None)
    assert "prefill" not in prof                                        # no partial / guessed term
    assert prof["metadata"]["fit"]["prefill"] == {"skipped": "out of memory"}
    assert any(f.get("cell") == "prefill" and "out of memory" in f["error"] for f in prof["metadata"]["failed_cells"])
    assert load_profile_dict(prof).prefill_note is None


def load_profile_dict(d):
    from dsparksim.cost.profile import profile_from_dict
    return profile_from_dict(d, source="t")


def test_measure_fits_a_prefill_term_from_paired_steps():
    mc = MeasureConfig(
        model=TINY, drift_gate=None, executor=ExecutorConfig(), K=3, n_reqs=(1, 2, 4, 8, 12), contexts=(16,), reps=3,
        min_growth=0.0)
    prof, _ = measure.measure(mc, progress=False, log=lambda s: None)
    fit = prof["metadata"]["fit"]["prefill"]
    assert fit["cells"] >= 3 and "prefill" in prof                       # 4 x (1+3) + chunk <= 48 tokens
    for k in ("seconds_per_token", "seconds_per_query_key", "seconds_per_chunk"):
        assert prof["prefill"][k] >= 0
    assert load_profile_dict(prof).prefill_note.startswith("fitted")


def test_shipped_cpu_profile_loads_and_states_provenance():
    from pathlib import Path
    p = Path(__file__).resolve().parents[1] / "profiles" / "cpu-tiny.json"
    if not p.is_file():
        pytest.skip("profiles/cpu-tiny.json not generated")
    cp = load_profile(str(p))
    for k in ("runner_model", "runner_device", "grid", "fit", "date", "torch"):
        assert k in cp.metadata
    assert cp.verify_time(cp.max_tokens) > cp.verify_time(1)


def test_measured_profile_drives_dsparksim_frontier(tmp_path):
    from dsparksim.cli.main import main
    mc = MeasureConfig(
        model=TINY, drift_gate=None, executor=ExecutorConfig(), K=3, n_reqs=(1, 2, 4), contexts=(16, 48), reps=3,
        min_growth=0.0)
    prof, _ = measure.measure(mc, progress=False, log=lambda s: None)
    p = save_profile(prof, tmp_path / "p.json")
    out = tmp_path / "fr"
    rc = main(["frontier", "--profile", str(p), "--policies", "fixed:3,confidence", "--block-size", "3",
               "--concurrency-levels", "1,2", "--num-requests", "8", "--lengths", "sharegpt", "--jobs", "1",
               "--baseline", "fixed:3", "--out", str(out), "--quiet"])
    assert rc == 0
    import pandas as pd
    df = pd.read_csv(out / "frontier.csv")
    assert set(df["policy"]) == {"fixed:3", "confidence"} and (df["output_throughput_tok_s"] > 0).all()


def _fit_base():
    """A measured-profile skeleton (linear staircase) for fit_prefill's verify-growth subtraction."""
    return {"format": "dsparksim-profile/1", "verify": {"M": list(range(1, 513)),
                                                       "time_s": [1e-3 + 2e-6 * m for m in range(1, 513)]},
            "attention": {"model": "kv_bandwidth", "seconds_per_kv_token": 1e-8, "note": "t"},
            "fixed_overhead_s": 1e-4, "drafters": {"dspark": {"kind": "parallel", "tokens": [1, 4096],
                                                              "time_s": [1e-4, 1e-4]}}}


def test_prefill_fit_recovers_the_chunk_cost_growing_with_decoding_requests():
    from dsparksim.cost.profile import profile_from_dict
    prof = _fit_base()
    p = profile_from_dict(prof | {"name": "t", "metadata": {k: "-" for k in ("device", "model", "source", "method")}})
    a, b, e, tn, cn = 3e-7, 2e-9, 1.5e-4, 4e-9, 6e-6          # the closed form being fitted
    recs = []
    for n in grid.PREFILL_DECODE_ROWS:
        for c in grid.PREFILL_CHUNKS:
            for k, pre in ((k, pre) for k in (1, 2) for pre in grid.PREFILL_PREFIXES):
                M0, kv0 = n * 8, n * 40.0
                M1, kv1 = M0 + c * k, kv0 + (pre + c) * k
                qk = k * (c * pre + c * (c + 1) // 2)           # a chunk after `pre` cached tokens
                dv = p.verify_time(M1, kv1) - (p.verify_time(M0, kv0) if M0 else 0.0)   # n=0: a whole step
                add = a * c * k + b * qk + e * k + (tn * c * k + cn * k) * n
                recs.append({"n_dec": n, "chunk": c, "k": k, "tokens": c * k, "qk": qk, "M0": M0, "M1": M1,
                             "kv0": kv0, "kv1": kv1, "d_step": dv + add + 1e-5 * c * k, "d_target": dv + add,
                             "d_draft": 1e-5 * c * k})
    fit = fitting.fit_prefill(recs, prof)
    # the prefill-only records (n_dec = 0) go to prefill.only (fit_prefill_only), not to these terms
    assert 0 in grid.PREFILL_DECODE_ROWS and fit["decode_rows"] == [n for n in grid.PREFILL_DECODE_ROWS if n]
    for key, want in (("seconds_per_token", a), ("seconds_per_query_key", b), ("seconds_per_chunk", e),
                      ("seconds_per_token_per_decode", tn), ("seconds_per_chunk_per_decode", cn),
                      ("drafter_s_per_token", 1e-5)):
        assert fit[key] == pytest.approx(want, rel=1e-6), key
    # the profile prices a step's chunks with the fitted terms beside n decoding requests; absent terms price 0
    d = prof | {"name": "t", "metadata": {k: "-" for k in ("device", "model", "source", "method")},
                "prefill": {"seconds_per_token": a, "seconds_per_query_key": b, "seconds_per_chunk": e,
                            "seconds_per_token_per_decode": tn, "seconds_per_chunk_per_decode": cn, "note": "t"}}
    cp = profile_from_dict(d)
    got = cp.step_overhead("dspark", 16, 7, 100, 5050, 2) - cp.step_overhead("dspark", 16, 7)
    assert got == pytest.approx(a * 100 + b * 5050 + e * 2 + (tn * 100 + cn * 2) * 16, rel=1e-12)
    old = {k: v for k, v in d["prefill"].items() if "per_decode" not in k}
    cp0 = profile_from_dict(d | {"prefill": old})
    assert cp0.step_overhead("dspark", 16, 7, 100, 5050, 2) - cp0.step_overhead("dspark", 16, 7) == \
        pytest.approx(a * 100 + b * 5050 + e * 2, rel=1e-12)
    # one decode-row count only (old raw records): no interaction terms are fitted
    old_recs = [{k: v for k, v in r.items() if k != "n_dec"} for r in recs if r["n_dec"] == 4]
    assert len({r["qk"] for r in recs}) > len(grid.PREFILL_CHUNKS) * 2    # prefixes make c*s separable from c^2
    assert fitting.fit_prefill(old_recs, prof)["seconds_per_chunk_per_decode"] == 0.0


def test_prefill_fit_weighs_cells_by_relative_error():
    """Chunks that the terms cannot describe exactly (here a prompt token costs 0.7x the verify staircase's growth,
    and each chunk a fixed 2e-4 s): an absolute least-squares fit is ruled by the largest cells and under-prices
    the small chunks real traffic schedules most (short prompts: 16-64 tokens); the relative fit (the default)
    balances them: its root-mean-square relative error over the cells is smaller, and so is the small chunks'
    mean bias."""
    from dsparksim.cost.profile import profile_from_dict
    prof = _fit_base()
    p = profile_from_dict(prof | {"name": "t", "metadata": {k: "-" for k in ("device", "model", "source", "method")}})
    recs = []
    for n in (1, 4, 16):
        for c in grid.PREFILL_CHUNKS:
            for k, pre in ((k, pre) for k in (1, 2) for pre in grid.PREFILL_PREFIXES):
                M0, kv0 = n * 8, n * 40.0
                M1, kv1 = M0 + c * k, kv0 + (pre + c) * k
                qk = k * (c * pre + c * (c + 1) // 2)
                dv = p.verify_time(M1, kv1) - p.verify_time(M0, kv0)
                d = 0.7 * dv + 2e-4 * k + 1e-9 * qk
                recs.append({"n_dec": n, "chunk": c, "k": k, "tokens": c * k, "qk": qk, "M0": M0, "M1": M1,
                             "kv0": kv0, "kv1": kv1, "d_step": d, "d_target": d, "d_draft": 0.0})

    def errors(fit):
        # the profile's own price of each cell's chunks with the fitted terms (measure.prefill_section writes them)
        fp = profile_from_dict(prof | {"name": "f", "metadata": p.metadata, "prefill": fitting.prefill_section(fit, "f")})
        return np.array([(fp.verify_time(r["M1"], r["kv1"]) - fp.verify_time(r["M0"], r["kv0"])
                          + fp.prefill_time(None, r["tokens"], r["qk"], r["k"], r["n_dec"])) / r["d_step"] - 1
                         for r in recs])

    rel, ab = errors(fitting.fit_prefill(recs, prof)), errors(fitting.fit_prefill(recs, prof, relative=False))
    small = np.array([r["chunk"] <= 32 for r in recs])
    rms = lambda e: float(np.sqrt(np.mean(e ** 2)))  # noqa: E731
    assert rms(rel) < 0.99 * rms(ab)                              # 6.0% vs 6.3%
    assert abs(rel[small].mean()) < 0.7 * abs(ab[small].mean())   # -3.4% vs -5.8%
    # a noisy cell timed at ~0 s does not take the fit over (its weight is capped at 2x the median cell's; at 10x
    # that one cell made the rms error 0.34 instead of 0.06)
    bad = dict(recs[0], d_step=1e-12, d_target=1e-12)
    fit2 = fitting.fit_prefill(recs + [bad], prof)
    assert all(np.isfinite(v) for v in fit2.values() if isinstance(v, float))
    assert rms(errors(fit2)) < 1.5 * rms(rel)


def test_prefill_prefixes_span_the_measured_contexts():
    assert grid.prefill_prefixes((32, 96, 160)) == (0, 512)
    assert grid.prefill_prefixes((2048, 4096, 6144)) == (0, 6144)
    assert grid.prefill_prefixes((1024, 8192, 32768)) == (0, grid.PREFIX_CAP)


def test_per_request_and_context_shape_diagnostics_match_their_closed_forms():
    ns = np.array([1, 2, 4, 8, 16])
    c = fitting.per_request_cost(ns, 2e-4 + 3e-5 * ns)
    assert c["intercept_s"] == pytest.approx(2e-4, rel=1e-9) and c["per_request_s"] == pytest.approx(3e-5, rel=1e-9)
    V0 = lambda M: 1e-3 + 2e-5 * M  # noqa: E731
    B = lambda n: 3e-4 * (n - 1)    # noqa: E731
    r = {k: np.array([x[k] for x in _synthetic(V0, B, 1e-7, ctxs=(10, 50, 200))], float)
         for k in _synthetic(V0, B, 1e-7)[0]}
    M, V, Bn, s, q = decompose_target(r)
    sh = fitting.context_shape(r, M, V, np.array([1, 2, 4]), Bn)
    assert sh["s_per_kv_token_by_context"] == pytest.approx({"10": 1e-7, "50": 1e-7, "200": 1e-7}, rel=1e-5)
    assert sh["max_over_min"] == pytest.approx(1.0, rel=1e-5)                         # linear: shapes agree
    # a context term growing faster than linearly shows as a slope rising with the context
    recs = _synthetic(V0, B, 0.0, ctxs=(10, 50, 200))
    for x in recs:
        x["t_target"] += 1e-9 * x["kv"] * x["ctx"]
    r2 = {k: np.array([x[k] for x in recs], float) for k in recs[0]}
    sh2 = fitting.context_shape(r2, M, V, np.array([1, 2, 4]), Bn)["s_per_kv_token_by_context"]
    assert sh2["10"] == pytest.approx(1e-8) and sh2["200"] == pytest.approx(2e-7)


def _drafter_recs(s_draft, D=lambda n: 4e-4 + 1e-4 * n, ctxs=(10, 50, 200)):
    """The target as in _synthetic; the drafter timer costs D(n) + s_draft * kv (a known slope)."""
    recs = _synthetic(lambda M: 1e-3 + 2e-5 * M, lambda n: 3e-4 * (n - 1), 1e-7, ctxs=ctxs)
    for x in recs:
        x["t_draft"] = D(x["n"]) + s_draft * x["kv"]
    return recs


def test_measure_fits_the_drafter_context_slope_and_its_no_context_table():
    mc = MeasureConfig(K=3, n_reqs=(1, 2, 4), contexts=(10, 50, 200))
    prof = fit_profile(_drafter_recs(2e-7), [], mc)
    d = prof["drafters"]["dspark"]
    assert d["seconds_per_kv_token"] == pytest.approx(2e-7, rel=1e-6)
    # the table is the drafter time at no context (the slope is not counted twice)
    np.testing.assert_allclose(d["time_s"], [4e-4 + 1e-4 * n for n in (1, 2, 4)], rtol=1e-6)
    assert prof["_fit"]["drafter_context"]["seconds_per_kv_token"] == pytest.approx(2e-7, rel=1e-6)
    # the written profile prices a drafting step at D(n) + slope * kv_read
    from dsparksim.cost.profile import profile_from_dict
    p = profile_from_dict({k: v for k, v in prof.items() if k != "_fit"} | {
        "name": "fit", "metadata": {k: "-" for k in ("device", "model", "source", "method")}}, "fit")
    assert p.draft_time("dspark", 2, 3, 1000) == pytest.approx(4e-4 + 2e-4 + 2e-7 * 1000, rel=1e-6)


def test_drafter_context_negative_or_absent_slope_writes_no_term():
    mc = MeasureConfig(K=3, n_reqs=(1, 2, 4), contexts=(10, 50, 200))
    neg = fit_profile(_drafter_recs(-1e-9), [], mc)          # drafter "gets cheaper" with context: noise
    assert "seconds_per_kv_token" not in neg["drafters"]["dspark"]
    assert neg["_fit"]["drafter_context"]["seconds_per_kv_token"] == 0.0
    note = neg["_fit"]["drafter_context"]["note"]
    assert "negative" in note and "clipped to 0" in note
    one = fit_profile(_drafter_recs(2e-7, ctxs=(50,)), [], MeasureConfig(K=3, n_reqs=(1, 2, 4), contexts=(50,)))
    assert "seconds_per_kv_token" not in one["drafters"]["dspark"]
    assert one["_fit"]["drafter_context"]["seconds_per_kv_token"] is None


def test_anchor_context_is_added_only_when_every_context_is_long():
    assert MeasureConfig(contexts=(512, 1024, 1536)).grid_contexts == (32, 512, 1024, 1536)
    assert MeasureConfig(contexts=(32, 96, 160)).grid_contexts == (32, 96, 160)      # the default grid: unchanged
    assert MeasureConfig(contexts=(16, 48)).grid_contexts == (16, 48)
    assert MeasureConfig(contexts=(512,), anchor_context=0).grid_contexts == (512,)  # off
    assert MeasureConfig(contexts=(512,), anchor_context=64).grid_contexts == (64, 512)
    with pytest.raises(Exception, match="anchor_context"):
        MeasureConfig(anchor_context=-1)


def test_anchor_context_pins_the_verify_staircase_that_long_contexts_only_extrapolate():
    """The c1k grid's shape: n = 1..8 then 24 (validate's dense grid to the largest step), so every M > 64 is
    only measured by 24-request cells. Their attention costs more per KV token once the batch reads > 8k tokens (a
    cache effect the linear kv term cannot express); with long contexts only, V0(M > 64) absorbs it (the measured
    c1k profile's staircase jumped 6.2 -> 11.0 ms between M=64 and 72). The anchor context measures those M at
    ~800 KV tokens; taking V0 from the anchor cells alone (``v0_at_shortest``) also leaves the long contexts'
    misfit out of V0."""
    def records(ctxs, ns=(1, 2, 3, 4, 5, 6, 7, 8, 24), K=7):
        recs = []
        for c in ctxs:
            for n in ns:
                for L in range(K + 1):
                    M, kv = n * (1 + L), n * c
                    t = 1e-3 + 2e-5 * M + 5e-7 * kv + 1e-6 * max(0, kv - 8000)
                    recs.append({"n": n, "L": L, "ctx": c, "M": M, "kv": kv, "t_target": t, "t_step": t + 2e-3,
                                 "t_draft": 1e-3 * n, "t_host": 1e-3})
        return recs

    def err(M, V):
        return np.abs(V / (1e-3 + 2e-5 * M) - 1)[M > 64].max()

    def arrays(recs):
        return {k: np.array([x[k] for x in recs], float) for k in recs[0]}

    mc = MeasureConfig(K=7, n_reqs=(1, 2, 3, 4, 5, 6, 7, 8, 24), contexts=(512, 1024, 1536))
    long_only = err(*decompose_target(arrays(records(mc.contexts)))[:2])
    joint = err(*decompose_target(arrays(records(mc.grid_contexts)))[:2])
    at_anchor = err(*decompose_target(arrays(records(mc.grid_contexts)), v0_at_shortest=True)[:2])
    assert long_only > 1.0                 # long contexts only: V0 more than 2x the truth somewhere
    assert joint < 0.2                     # anchored, fitted jointly with the long contexts
    assert at_anchor < 0.1 and at_anchor < joint / 1.5   # V0 from the anchor cells alone
    # fit_profile fits V0 jointly (the anchor-only option measured no reliable gain on real validations)
    prof = fit_profile(records(mc.grid_contexts), [], mc)
    assert err(np.array(prof["verify"]["M"]), np.array(prof["verify"]["time_s"])) == pytest.approx(joint, rel=1e-9)


def test_mtp1_gets_its_own_context_slope_from_cells_at_every_context():
    mc = MeasureConfig(K=3, n_reqs=(1, 2, 4), contexts=(10, 50, 200))
    mtp = []
    for c in (10, 50, 200):
        for n in (1, 2, 4):
            for L in (0, 1):
                kv = n * c
                mtp.append({"n": n, "L": L, "ctx": c, "M": n * (1 + L), "kv": kv, "t_step": 1e-3, "t_target": 1e-3,
                            "t_draft": 2e-4 + 5e-5 * n + 3e-7 * kv, "t_host": 1e-4})
    prof = fit_profile(_drafter_recs(2e-7), mtp, mc)
    d = prof["drafters"]["mtp1"]
    assert d["seconds_per_kv_token"] == pytest.approx(3e-7, rel=1e-6)
    np.testing.assert_allclose(d["time_s"], [2e-4 + 5e-5 * n for n in (1, 2, 4)], rtol=1e-6)
    assert prof["_fit"]["mtp1_context"]["seconds_per_kv_token"] == pytest.approx(3e-7, rel=1e-6)
    # one context: the plain medians, no term (as before)
    one = fit_profile(_drafter_recs(2e-7), [x for x in mtp if x["ctx"] == 50], mc)
    assert "seconds_per_kv_token" not in one["drafters"]["mtp1"]
    np.testing.assert_allclose(one["drafters"]["mtp1"]["time_s"], [2e-4 + 5e-5 * n + 3e-7 * 50 * n for n in (1, 2, 4)])


def test_prefill_only_fit_recovers_the_whole_step_closed_form_and_the_profile_prices_it():
    """Prefill-only steps (no decoding request) are priced from their own cells: NNLS of the whole step time on
    [1, tokens, query-key pairs, chunks] recovers the closed form; the engine and disaggregated prefill price such a
    step with it (plus the fixed overhead), and a step with decoding requests is priced as before."""
    from dsparksim.cost.profile import profile_from_dict, profile_to_dict
    from dsparksim.errors import InputError
    p0, a, b, e, dft = 2e-3, 4e-6, 3e-9, 1e-4, 1e-6
    recs = []
    for c in grid.PREFILL_CHUNKS:
        for k in (1, 2):
            for pre in (0, 1536):
                qk = k * (c * pre + c * (c + 1) // 2)
                recs.append({"n_dec": 0, "chunk": c, "k": k, "prefix": pre, "tokens": c * k, "qk": qk, "M0": 0,
                             "M1": c * k, "kv0": 0.0, "kv1": float(k * (pre + c)), "d_target": 0.0,
                             "d_step": p0 + a * c * k + b * qk + e * k + dft * c * k, "d_draft": dft * c * k})
    only = fitting.fit_prefill_only(recs)
    for key, want in (("seconds_per_step", p0), ("seconds_per_token", a), ("seconds_per_query_key", b),
                      ("seconds_per_chunk", e)):
        assert only[key] == pytest.approx(want, rel=1e-6), key
    assert fitting.fit_prefill_only(recs[:3]) is None                       # too few cells
    assert fitting.fit_prefill_only([{**r, "n_dec": 1} for r in recs]) is None   # none without decoding requests
    d = _fit_base() | {"name": "t", "metadata": {k: "-" for k in ("device", "model", "source", "method")},
                       "prefill": {"seconds_per_token": 1e-6, "seconds_per_query_key": 0.0, "note": "t",
                                   "only": only}}
    d["drafters"]["dspark"]["prefill_s_per_token"] = dft
    prof = profile_from_dict(d)
    assert profile_from_dict(profile_to_dict(prof)).prefill_only == prof.prefill_only
    t = prof.prefill_only_time("dspark", 128, 128 * 500 + 128 * 129 // 2, 1)
    assert t == pytest.approx(p0 + a * 128 + b * (128 * 500 + 128 * 129 // 2) + e + dft * 128, rel=1e-6)
    # the engine: a prefill-only step costs fixed + that, whatever its M; with a decoding request, the old formula
    import numpy as np
    from dsparksim.cost.price import StepPricer, StepShape
    pricer = StepPricer(prof, dense=False)
    shape = StepShape(M=128, n_decode=0, kv_read=628, prefill_tokens=128, prefill_qk=128 * 500 + 128 * 129 // 2,
                      prefill_chunks=1, drafter="dspark", K=7)
    cost = pricer.step_time(shape)
    assert np.allclose(cost(np.array([128, 129])), 1e-4 + t)
    mixed = pricer.step_time(shape._replace(n_decode=1))(np.array([136]))[0]
    assert mixed == pytest.approx(prof.verify_time(136, 628) + prof.step_overhead("dspark", 1, 7, 128, 128 * 500
                                                                                  + 128 * 129 // 2, 1))
    # disaggregated prefill prices its chunks the same way
    from dsparksim.sim.disagg import PrefillPool
    pool = PrefillPool(profile=prof, drafter="dspark", K=7, replicas=1, chunk_tokens=128, gbps=100.0,
                       bytes_per_token=1.0)
    want = sum(1e-4 + prof.prefill_only_time("dspark", 128, 128 * s + 128 * 129 // 2, 1) for s in (0, 128))
    assert pool.prefill_s(256) == pytest.approx(want)
    for bad, msg in (({**only, "seconds_per_step": 0.0}, "seconds_per_step"), ({**only, "x": 1}, "only.x")):
        with pytest.raises(InputError, match=msg):
            profile_from_dict(d | {"prefill": {**d["prefill"], "only": bad}})
