torch = __import__("pytest").importorskip("torch")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from dsparksim.profile import load_profile, save_profile  # noqa: E402
from dsparksim.runner import measure as meas  # noqa: E402
from dsparksim.runner.executor import ExecutorConfig  # noqa: E402
from dsparksim.runner.measure import MeasureConfig, MeasurementError, decompose_target, fit_profile  # noqa: E402

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
    M, V, Bn, s = decompose_target(r)
    np.testing.assert_allclose(V, V0(M), rtol=1e-6)
    np.testing.assert_allclose(Bn, [B(1), B(2), B(4)], atol=1e-9)
    assert s == pytest.approx(1e-7, rel=1e-6)


def test_flat_and_inert_results_are_refused():
    mc = MeasureConfig(K=3, n_reqs=(1, 2, 4), contexts=(10, 50))
    flat = _synthetic(lambda M: 1e-3, lambda n: 0.0, 0.0)
    with pytest.raises(MeasurementError, match="flat"):
        fit_profile(flat, [], mc)
    inert = _synthetic(lambda M: 0.0, lambda n: 0.0, 0.0)
    with pytest.raises(MeasurementError, match="inert"):
        fit_profile(inert, [], mc)


def test_measured_profile_loads_in_core_and_oom_cell_is_reported_not_measured(tmp_path, monkeypatch):
    real_cell = meas._cell

    def flaky(target, proxy, ex, K, drafter, n, ctx, *a):
        if n == 2 and ctx == 16 and K > 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real_cell(target, proxy, ex, K, drafter, n, ctx, *a)

    monkeypatch.setattr(meas, "_cell", flaky)
    mc = MeasureConfig(model=TINY, executor=ExecutorConfig(), K=3, n_reqs=(1, 2, 4), contexts=(16, 48), reps=3,
                       min_growth=0.0)
    prof, raw = meas.measure(mc, progress=False, log=lambda s: None)
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

    monkeypatch.setattr(meas, "_prefill_cells", oom)
    mc = MeasureConfig(model=TINY, executor=ExecutorConfig(), K=3, n_reqs=(1, 2, 4), contexts=(16,), reps=3,
                       min_growth=0.0)
    prof, _ = meas.measure(mc, progress=False, log=lambda s: None)
    assert "prefill" not in prof                                        # no partial / guessed term
    assert prof["metadata"]["fit"]["prefill"] == {"skipped": "out of memory"}
    assert any(f.get("cell") == "prefill" and "out of memory" in f["error"] for f in prof["metadata"]["failed_cells"])
    assert load_profile_dict(prof).prefill_note is None


def load_profile_dict(d):
    from dsparksim.profile import profile_from_dict
    return profile_from_dict(d, source="t")


def test_measure_fits_a_prefill_term_from_paired_steps():
    mc = MeasureConfig(model=TINY, executor=ExecutorConfig(), K=3, n_reqs=(1, 2, 4, 8, 12), contexts=(16,), reps=3,
                       min_growth=0.0)
    prof, _ = meas.measure(mc, progress=False, log=lambda s: None)
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
    from dsparksim.cli import main
    mc = MeasureConfig(model=TINY, executor=ExecutorConfig(), K=3, n_reqs=(1, 2, 4), contexts=(16, 48), reps=3,
                       min_growth=0.0)
    prof, _ = meas.measure(mc, progress=False, log=lambda s: None)
    p = save_profile(prof, tmp_path / "p.json")
    out = tmp_path / "fr"
    rc = main(["frontier", "--profile", str(p), "--policies", "fixed:3,confidence", "--block-size", "3",
               "--concurrency-levels", "1,2", "--num-requests", "8", "--lengths", "sharegpt", "--jobs", "1",
               "--baseline", "fixed:3", "--out", str(out), "--quiet"])
    assert rc == 0
    import pandas as pd
    df = pd.read_csv(out / "frontier.csv")
    assert set(df["policy"]) == {"fixed:3", "confidence"} and (df["output_throughput_tok_s"] > 0).all()
