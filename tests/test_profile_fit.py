"""`dsparksim profile fit`: calibrated builder linearity, exact re-pricing against the DES, identifiability
(recovery of known scales from a synthetic profile's own replays, flagging of what the runs cannot see), bad
inputs. Synthetic "measurements" are the simulator's own metrics on a calibrated profile, so the truth is known."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from dsparksim.cli.main import main
from dsparksim.cost.analytic.builder import build_forward_model, build_profile, M_GRID
from dsparksim.cost.analytic.calibration import Calibration, family_tables
from dsparksim.cost.profile import dumps_profile, profile_from_dict
from dsparksim.errors import InputError
from dsparksim.fit.fitter import FitProblem, fit_problem, loco
from dsparksim.fit.reprice import PARAMS, LinearRun, PriceBasis, coef_of
from dsparksim.fit.runs import FitRun
from dsparksim.fit.trace import ClientSpec, simulate_trace

MODELS = Path(__file__).resolve().parents[1] / "dsparksim" / "data" / "models"
MOE = str(MODELS / "qwen3-30b-a3b.json")      # MoE on one H100: no communication family
DENSE = str(MODELS / "llama-2-7b.json")
# the builder's fixed overhead (1.5 ms): in runs without a drafter it is collinear with the floor family, so the
# fit holds it at the builder's value and the truth must sit there to be recovered
TRUE = Calibration(scales={"dense": 0.8, "moe": 1.4, "floor": 0.6, "attention": 0.7, "prefill": 1.5},
                   fixed_overhead_s=0.0015, request_latency_s=0.04)


def _profiles(model: str, cal: Calibration):
    base = profile_from_dict(build_profile(model, "H100", date="2026-12-01"), "base.json")
    calp = profile_from_dict(build_profile(model, "H100", date="2026-12-01", calibration=cal), "cal.json")
    return base, calp, PriceBasis.build(model, "H100")


@pytest.fixture(scope="module")
def moe():
    return _profiles(MOE, TRUE)


def _synthetic_runs(base, basis, coef, workloads, concs):
    runs, lin = [], []
    for L, O in workloads:
        for c in concs:
            spec = ClientSpec(concurrency=c, num_prompts=3 * c, input_len=L, output_len=O, range_ratio=0.8)
            lr = LinearRun(simulate_trace(base, spec), basis)
            meas = {k: lr.metric(k, coef) for k in ("mean_tpot_ms", "mean_ttft_ms", "output_throughput_per_gpu")}
            runs.append(FitRun(f"{L}/{O}@{c}", spec, meas))
            lin.append(lr)
    return runs, lin


# ------------------------------------------------------------------ calibration in the builder
def test_families_partition_the_forward_and_calibration_is_linear():
    for model, tp in ((MOE, 1), (str(MODELS / "deepseek-v3.json"), 8), (DENSE, 1)):
        fm = build_forward_model(model, "H200", tp=tp)
        tab = family_tables(fm, M_GRID)
        np.testing.assert_allclose(sum(tab.values()), fm.forward(M_GRID), rtol=1e-12)
    d = build_profile(MOE, "H100", date="2026-12-01", calibration=TRUE)
    tab = family_tables(build_forward_model(MOE, "H100"), M_GRID)
    want = 0.8 * tab["dense"] + 1.4 * tab["moe"] + 1.0 * tab["comm"] + 0.6 * tab["floor"]
    np.testing.assert_allclose(d["verify"]["time_s"], want, rtol=1e-14)
    # the floor family is exactly the M-independent part: a constant over M, and the floorless rest is 0 at M -> 0
    # only where nothing but floors remains (here: a positive constant, below the M=1 forward)
    fl = tab["floor"]
    assert np.ptp(fl) < 1e-15 and 0 < fl[0] < sum(tab.values())[0]
    assert d["fixed_overhead_s"] == 0.0015 and d["request_latency_s"] == 0.04
    assert d["metadata"]["build"]["calibration"]["scales"]["moe"] == 1.4
    # identity calibration: the uncalibrated profile, byte for byte
    a = dumps_profile(build_profile(MOE, "H100", date="2026-12-01"))
    assert dumps_profile(build_profile(MOE, "H100", date="2026-12-01", calibration=Calibration())) == a
    with pytest.raises(InputError, match="unknown cost family"):
        Calibration(scales={"gemm": 1.0})


# ------------------------------------------------------------------ exact re-pricing
@pytest.mark.parametrize("mixed,wait", [(True, None), (False, None), (True, (6, 1.0))],
                         ids=["mixed", "prefill-only-steps", "batch-waiting"])
def test_repricing_the_builder_trace_equals_a_fresh_des_run_of_the_calibrated_profile(moe, mixed, wait):
    """Exact for batch waiting too: its hold counts steps and tokens, never seconds."""
    from dsparksim.bench.client import ClientWorkload, ServerSettings, run_client
    base, calp, basis = moe
    t, r = wait or (None, None)
    chunk = 2048 if wait is None else 8192        # batch waiting: a threshold (8192) above one prompt, so it holds
    spec = ClientSpec(concurrency=8, num_prompts=24, input_len=3000, output_len=200, range_ratio=0.8,
                      prefill_chunk_tokens=chunk, num_warmup_prompts=5, mixed_prefill=mixed,
                      batch_wait_timeout_iters=t, batch_wait_max_tokens_ratio=r)
    tr0, tr1 = simulate_trace(base, spec), simulate_trace(calp, spec)
    if wait is not None:   # the hold changed the schedule: fewer steps carry prefill than without it
        free = simulate_trace(base, dataclasses.replace(spec, batch_wait_timeout_iters=None,
                                                        batch_wait_max_tokens_ratio=None))
        assert (tr0.steps["n_prefill_tokens"] > 0).sum() < (free.steps["n_prefill_tokens"] > 0).sum()
    both = (tr0.steps["n_decode"] > 0) & (tr0.steps["n_prefill_tokens"] > 0)
    assert both.any() == mixed           # unmixed (SGLang's default): no step carries decode and a chunk
    for k in ("M", "kv_read", "prefill_qk", "decode_qk", "n_decode"):
        assert np.array_equal(tr0.steps[k], tr1.steps[k]), k    # step shapes do not depend on prices
    assert tr0.start_step >= 0
    lr, c = LinearRun(tr0, basis), coef_of(TRUE, basis)
    end = tr1.steps["t_start"] + tr1.steps["dt"]                 # seconds from the benchmark's start
    np.testing.assert_allclose(lr.end[1:] @ c - lr.end[tr0.start_step + 1] @ c, end, rtol=1e-9, atol=1e-12)
    # the client's own metrics of a fresh simulation of the calibrated profile
    run = run_client(calp, ClientWorkload(random_input_len=3000, random_output_len=200, random_range_ratio=0.8,
                                          num_prompts=24, max_concurrency=8, num_warmup_prompts=5),
                     ServerSettings(chunked_prefill_size=chunk, max_running_requests=1024, gpus=1,
                                    mixed_chunk=mixed, batch_wait_timeout_iters=t, batch_wait_max_tokens_ratio=r))
    got = lr.metrics(c)
    for k in ("mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms", "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms",
              "mean_e2el_ms", "p99_e2el_ms", "output_throughput_per_gpu", "duration_s"):
        assert got[k] == pytest.approx(run.metrics[k], rel=1e-9), k
    assert got["mean_tpot_ms"] != pytest.approx(lr.metric("mean_tpot_ms", coef_of(Calibration(), basis)), rel=0.01)


def test_repricing_is_not_valid_for_a_price_dependent_policy(moe):
    """The confidence policy chooses verify lengths by price: its step shapes change with the profile, so a trace
    re-priced differs from the DES of the calibrated profile (such runs must be simulated)."""
    base, calp, basis = moe
    spec = ClientSpec(concurrency=8, num_prompts=16, input_len=256, output_len=128)
    tr0 = simulate_trace(base, spec, policy="confidence")
    tr1 = simulate_trace(calp, spec, policy="confidence")
    assert not np.array_equal(tr0.steps["M"], tr1.steps["M"])


# ------------------------------------------------------------------ identifiability
def test_fit_recovers_known_scales_from_its_own_replays(moe):
    base, _, basis = moe
    c = coef_of(TRUE, basis)
    # five concurrencies: with four, leaving out c=64 makes prefill collinear with dense and floor (index 13 > 10)
    runs, lin = _synthetic_runs(base, basis, c, ((4096, 64), (256, 256)), (1, 4, 16, 32, 64))
    res = fit_problem(FitProblem(basis, runs, lin))
    assert res.status["comm"]["status"] == "unidentified" and "zero" in res.status["comm"]["reason"]
    # a per-step constant: the floor family (larger, chosen first) and the fixed overhead cannot be told apart
    st = res.status["fixed_overhead_s"]
    assert st["status"] == "unidentified" and "collinear" in st["reason"] and "floor" in st["reason"]
    assert set(res.fitted) == set(PARAMS) - {"comm", "fixed_overhead_s"}
    assert "request_latency_s" in res.fitted and "floor" in res.fitted
    np.testing.assert_allclose(res.coef, c, rtol=1e-4)            # noise-free data: recovered to 1e-4
    assert np.abs(res.residuals).max() < 1e-6
    rows = loco(FitProblem(basis, runs, lin))                     # held-out concurrencies predicted exactly too
    assert rows and max(abs(r["rel_error"]) for r in rows) < 1e-4


def test_fit_flags_what_the_runs_cannot_see_and_holds_it_at_the_builder_value():
    """Tiny prompts: the prefill query-key term is invisible. A dense model: the moe family prices nothing."""
    base, _, basis = _profiles(DENSE, Calibration())
    truth = Calibration(scales={"dense": 1.2}, fixed_overhead_s=0.002)
    runs, lin = _synthetic_runs(base, basis, coef_of(truth, basis), ((8, 128),), (1, 8, 32))
    res = fit_problem(FitProblem(basis, runs, lin))
    st = res.status
    assert st["moe"]["status"] == "unidentified" and "zero" in st["moe"]["reason"]
    assert st["prefill"]["status"] == "unidentified" and "flat" in st["prefill"]["reason"]
    for p in ("moe", "prefill", "comm"):
        assert res.coef[PARAMS.index(p)] == (1.0 if p != "fixed_overhead_s" else basis.fixed_overhead_s)
    assert "dense" in res.fitted


# ------------------------------------------------------------------ the command
def _runs_csv(path: Path, moe_profiles, spec: str = "none") -> None:
    from dsparksim.bench.runs import write_runs
    base, _, basis = moe_profiles
    c = coef_of(TRUE, basis)
    runs, _ = _synthetic_runs(base, basis, c, ((2048, 128),), (2, 8, 32))
    rows = []
    for i, r in enumerate(runs):
        s, m = r.spec, r.measured
        rows.append({"run_id": f"syn:{i + 1}", "source_format": "vllm", "source_file": "synthetic", "source_row": i + 1,
                     "gpu": "h100", "tp": 1, "ep": 1, "gpu_count": 1, "spec_method": spec if i == 1 else "none",
                     "dataset_name": "random", "random_input_len": s.input_len, "random_output_len": s.output_len,
                     "random_range_ratio": 0.8, "random_range_convention": "low", "max_concurrency": s.concurrency,
                     "request_rate": float("inf"), "num_prompts": s.num_prompts, "ignore_eos": True,
                     "mean_tpot_ms": m["mean_tpot_ms"], "mean_ttft_ms": m["mean_ttft_ms"],
                     "output_throughput_per_gpu": m["output_throughput_per_gpu"],
                     "output_throughput": m["output_throughput_per_gpu"]})
    write_runs(rows, path)


def test_cli_fit_writes_a_profile_with_provenance_and_refuses_to_overwrite(tmp_path, moe, capsys):
    runs = tmp_path / "runs.csv"
    _runs_csv(runs, moe)
    out = tmp_path / "fit.json"
    argv = ["profile", "fit", str(runs), "--model", MOE, "--gpu", "H100", "--where", "gpu=h100",
            "--bootstrap", "20", "--out", str(out), "--date", "2026-12-03"]
    capsys.readouterr()
    assert main(argv) == 0
    assert "simulate runs" not in capsys.readouterr().err     # progress bars only on a terminal (stderr is not)
    d = json.loads(out.read_text())
    fit = d["metadata"]["fit"]
    assert fit["runs"]["run_ids"] == ["syn:1", "syn:2", "syn:3"] and len(fit["runs"]["sha256"]) == 64
    assert fit["parameters"]["comm"]["status"] == "unidentified"
    for p, e in fit["parameters"].items():
        if e["status"] == "fitted":
            assert e["bootstrap"]["p2.5"] * 0.999 <= e["value"] <= e["bootstrap"]["p97.5"] * 1.001
    assert fit["fit_error"]["tpot"]["median_abs"] < 0.01
    assert fit["client_model"]["mixed_prefill"]["value"] is True      # the runs name no engine: mixed (vLLM)
    prof = profile_from_dict(d, str(out))                      # a normal profile
    assert prof.fixed_overhead_s == pytest.approx(fit["parameters"]["fixed_overhead_s"]["value"])
    before = out.read_bytes()
    capsys.readouterr()
    assert main(argv) == 2                                     # exists: needs --force
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--force" in err[0] and out.read_bytes() == before
    assert main(argv + ["--force", "--bootstrap", "0"]) == 0


@pytest.mark.parametrize("case", ["missing_file", "bad_where", "unknown_column", "mtp_on", "not_ours",
                                  "no_match", "bad_metrics"])
def test_cli_fit_bad_inputs_one_line_exit_2_nothing_written(tmp_path, moe, capsys, case):
    runs = tmp_path / "runs.csv"
    _runs_csv(runs, moe, spec="eagle" if case == "mtp_on" else "none")
    out = tmp_path / "fit.json"
    where = {"bad_where": "gpu", "unknown_column": "gpu_kind=h100", "no_match": "gpu=b200"}.get(case, "gpu=h100")
    if case == "not_ours":
        out.write_text('{"user": "file"}')
    argv = ["profile", "fit", str(tmp_path / "nope.csv") if case == "missing_file" else str(runs), "--model", MOE,
            "--gpu", "H100", "--where", where, "--bootstrap", "0", "--out", str(out)]
    if case == "bad_metrics":
        argv += ["--metrics", "tpot,itl"]
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("dsparksim: error:"), err
    if case == "not_ours":
        assert out.read_text() == '{"user": "file"}'
    else:
        assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["runs.csv"] + (["fit.json"] if case == "not_ours"
                                                                                  else []))


def test_fit_runs_take_mixed_prefill_from_the_engine_unless_overridden(tmp_path, moe):
    from dsparksim.bench.runs import read_runs, write_runs
    from dsparksim.fit.runs import load_fit_runs
    runs = tmp_path / "runs.csv"
    _runs_csv(runs, moe)
    rows = read_runs(runs)
    for r, eng in zip(rows, ("sglang", "trtllm", "vllm")):
        r["engine"] = eng
    write_runs(rows, runs, force=True)
    got, _ = load_fit_runs(runs, {"spec_method": "none"})
    assert [r.spec.mixed_prefill for r in got] == [False, True, True]   # sglang off (its default), others on
    got, _ = load_fit_runs(runs, {"spec_method": "none"}, mixed_prefill=True)
    assert [r.spec.mixed_prefill for r in got] == [True, True, True]


def test_fit_runs_keep_their_range_ratio_and_refuse_failed_requests(tmp_path, moe):
    """A range ratio of 0 (SGLang's default: lengths uniform in [1, L]) was read as 1 (every length L), and a
    missing one too; vLLM's symmetric R = 0 is every length L; a run with failed requests measured fewer."""
    from dsparksim.bench.runs import read_runs, write_runs
    from dsparksim.errors import InputError
    from dsparksim.fit.runs import load_fit_runs
    runs = tmp_path / "runs.csv"
    _runs_csv(runs, moe)
    rows = read_runs(runs)
    rows[0]["random_range_ratio"] = 0.0
    rows[2]["random_range_ratio"], rows[2]["random_range_convention"] = 0.0, "symmetric"
    write_runs(rows, runs, force=True)
    got, _ = load_fit_runs(runs, {"spec_method": "none"})
    assert [r.spec.range_ratio for r in got] == [0.0, 0.8, 1.0]
    for field, value in (("random_range_ratio", None), ("failed", 3)):
        bad = [dict(r) for r in rows]
        bad[1][field] = value
        write_runs(bad, runs, force=True)
        with pytest.raises(InputError) as e:
            load_fit_runs(runs, {"spec_method": "none"})
        assert e.value.field == field and "syn:2" in str(e.value)


def test_replay_reads_vllm_symmetric_ratio_0_as_fixed_lengths_and_notes_failed_requests():
    from dsparksim.bench.replay import row_workload
    from dsparksim.errors import InputError
    row = {"run_id": "r1", "dataset_name": "random", "random_input_len": 100, "random_output_len": 50,
           "random_range_ratio": 0.0, "random_range_convention": "symmetric", "num_prompts": 8,
           "max_concurrency": 4, "request_rate": float("inf"), "ignore_eos": True, "failed": 2}
    wl, notes = row_workload(row)
    assert wl.random_range_ratio == 1.0 and any("2 request(s) failed" in n for n in notes)
    with pytest.raises(InputError, match="symmetric"):
        row_workload({**row, "random_range_ratio": 0.5})


@pytest.mark.parametrize("n", ["1", "3", "19", "10001", "1000000000"])
def test_cli_fit_refuses_too_few_bootstrap_resamples(tmp_path, moe, capsys, n):
    """--bootstrap 1 printed '[x, x] 95% bootstrap': a zero-width 'interval' that excluded the fitted value;
    --bootstrap 10**9 was a MemoryError traceback."""
    runs = tmp_path / "runs.csv"
    _runs_csv(runs, moe)
    out = tmp_path / "fit.json"
    capsys.readouterr()
    assert main(["profile", "fit", str(runs), "--model", MOE, "--gpu", "H100", "--where", "gpu=h100",
                 "--bootstrap", n, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--bootstrap" in err[0] and "at least 20" in err[0] and "10,000" in err[0]
    assert not out.exists()


def test_fit_applies_batch_waiting_to_the_runs_it_names_and_records_it(tmp_path, moe, capsys):
    from dsparksim.fit.command import FitOptions, run_fit
    from dsparksim.fit.runs import load_fit_runs
    runs = tmp_path / "runs.csv"
    _runs_csv(runs, moe)
    wait = {"batch_wait_timeout_iters": 8, "batch_wait_max_tokens_ratio": 1.0}
    got, _ = load_fit_runs(runs, {}, run_server={"syn:3": wait})
    assert [r.spec.batch_wait_timeout_iters for r in got] == [None, None, 8]
    with pytest.raises(InputError, match="server settings given for 1 run.*'syn:9'"):
        load_fit_runs(runs, {}, run_server={"syn:9": wait})
    base = FitOptions(model=MOE, gpu="H100", bootstrap=0, date="2026-12-03")
    d0, rep0 = run_fit(runs, base)
    d1, rep1 = run_fit(runs, dataclasses.replace(base, batch_wait_timeout_iters=8, batch_wait_max_tokens_ratio=1.0,
                                                 batch_wait_runs=("syn:3",)))
    assert "batch_wait" not in d0["metadata"]["fit"]["client_model"]       # off: metadata as before it existed
    assert d1["metadata"]["fit"]["client_model"]["batch_wait"] == {"timeout_iters": [8], "max_tokens_ratio": [1.0],
                                                                   "run_ids": ["syn:3"]}
    # the named run was simulated with its prefills held (a later first token); the others as before
    t0 = {r.run_id: r for r in rep0["runs"]}
    t1 = {r.run_id: r for r in rep1["runs"]}
    assert t1["syn:1"].spec == t0["syn:1"].spec and t1["syn:3"].spec != t0["syn:3"].spec
    ttft = {w: {r["run_id"]: r["predicted"] for r in rep["in_sample"] if r["metric"] == "mean_ttft_ms"}
            for w, rep in (("off", rep0), ("on", rep1))}
    assert ttft["on"]["syn:3"] > 1.2 * ttft["off"]["syn:3"]
    # batch waiting is TensorRT-LLM's: a run of another engine it would apply to is refused, naming it
    from dsparksim.bench.runs import read_runs, write_runs
    rows = read_runs(runs)
    rows[2]["engine"] = "sglang"
    write_runs(rows, runs, force=True)
    with pytest.raises(InputError, match="--batch-wait-timeout-iters.*8 given, but run syn:3 ran on 'sglang'"):
        run_fit(runs, dataclasses.replace(base, batch_wait_timeout_iters=8, batch_wait_max_tokens_ratio=1.0))
    run_fit(runs, dataclasses.replace(base, batch_wait_timeout_iters=8, batch_wait_max_tokens_ratio=1.0,
                                      batch_wait_runs=("syn:2",)))     # not applied to the SGLang run: fine
    # half a setting: one line naming the flag, exit 2, nothing written
    out = tmp_path / "fit.json"
    capsys.readouterr()
    assert main(["profile", "fit", str(runs), "--model", MOE, "--gpu", "H100", "--bootstrap", "0",
                 "--batch-wait-timeout-iters", "40", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--batch-wait-timeout-iters" in err[0] and "give both" in err[0], err
    assert main(["profile", "fit", str(runs), "--model", MOE, "--gpu", "H100", "--bootstrap", "0",
                 "--batch-wait-timeout-iters", "40", "--batch-wait-max-tokens-ratio", "2", "--out", str(out)]) == 2
    assert "expected a fraction in (0, 1], got 2.0" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("half, words", [({"batch_wait_timeout_iters": 40}, "'--batch-wait-timeout-iters': 40 given"),
                                         ({"batch_wait_max_tokens_ratio": 0.8},
                                          "'--batch-wait-max-tokens-ratio': 0.8 given")])
def test_fit_names_the_value_of_half_a_batch_wait_setting(half, words):
    from dsparksim.fit.command import batch_wait_settings, FitOptions
    with pytest.raises(InputError, match="give both") as ei:
        batch_wait_settings(FitOptions(model=MOE, gpu="H100", **half))
    assert words in str(ei.value), str(ei.value)


def test_cli_fit_takes_bench_replays_spellings_of_the_server_settings(tmp_path, moe):
    """`bench replay` spells them --chunked-prefill-size / --max-running-requests (SGLang's names); the walk-through
    passes the same flags to both commands."""
    runs = tmp_path / "runs.csv"
    _runs_csv(runs, moe)
    out = tmp_path / "fit.json"
    assert main(["profile", "fit", str(runs), "--model", MOE, "--gpu", "H100", "--bootstrap", "0",
                 "--chunked-prefill-size", "1024", "--max-running-requests", "64", "--out", str(out)]) == 0
    cm = json.loads(out.read_text())["metadata"]["fit"]["client_model"]
    assert (cm["prefill_chunk_tokens"], cm["max_num_seqs"]) == (1024, 64)


def test_fit_refusals_say_how_to_supply_or_select(tmp_path, moe):
    """A vLLM file records neither the range ratio nor ignore_eos, and a paced run cannot be fitted: each refusal
    says which bench import option fills the column, or which --where selects the fittable runs."""
    from dsparksim.bench.runs import read_runs, write_runs
    from dsparksim.errors import InputError
    from dsparksim.fit.runs import load_fit_runs
    runs = tmp_path / "runs.csv"
    _runs_csv(runs, moe)
    rows = read_runs(runs)
    for field, value, hint in (("random_range_ratio", None, "bench import --random-range-ratio"),
                               ("ignore_eos", None, "bench import --ignore-eos true"),
                               ("request_rate", 2.0, "--where request_rate=inf")):
        bad = [dict(r) for r in rows]
        bad[1][field] = value
        write_runs(bad, runs, force=True)
        with pytest.raises(InputError) as e:
            load_fit_runs(runs, {"spec_method": "none"})
        assert e.value.field == field and hint in str(e.value), str(e.value)


@pytest.mark.parametrize("field,value", [("gpu", "H200"), ("tp", 2), ("ep", 2)])
def test_fit_refuses_a_run_of_another_deployment_than_gpu_tp_ep(tmp_path, moe, capsys, field, value):
    """Runs of two deployments in one table (an H100 TP1 and an H200 TP8 model, say) were all fitted into the one
    profile of --gpu/--tp/--ep, silently; bench replay refuses such a run, and so does the fit now."""
    from dsparksim.bench.runs import read_runs, write_runs
    runs = tmp_path / "runs.csv"
    _runs_csv(runs, moe)
    rows = read_runs(runs)
    rows[1][field] = value
    if field in ("tp", "ep"):
        rows[1]["gpu_count"] = 2
    write_runs(rows, runs, force=True)
    out = tmp_path / "fit.json"
    assert main(["profile", "fit", str(runs), "--model", MOE, "--gpu", "H100", "--bootstrap", "0",
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"field '{field}'" in err and "syn:2" in err and str(runs) in err, err
    assert not out.exists()


def test_fit_says_when_no_run_measured_a_metric(tmp_path, moe, capsys):
    """Runs imported without --gpu-count have no output tok/s per GPU: the fit left throughput out without a word."""
    from dsparksim.bench.runs import read_runs, write_runs
    runs = tmp_path / "runs.csv"
    _runs_csv(runs, moe)
    rows = read_runs(runs)
    for r in rows:
        r["output_throughput_per_gpu"], r["gpu_count"] = None, None
    write_runs(rows, runs, force=True)
    assert main(["profile", "fit", str(runs), "--model", MOE, "--gpu", "H100", "--where", "spec_method=none",
                 "--bootstrap", "0", "--out", str(tmp_path / "fit.json")]) == 0
    out = capsys.readouterr().out
    assert "tput: not in any selected run, not fitted: output_throughput_per_gpu (empty where gpu_count is: " \
           "bench import --gpu-count N)" in out, out
    assert "tpot: not in" not in out
    # and it says what to run next, with the server settings it simulated (bench replay's own defaults may differ)
    from dsparksim.cost.profile import load_profile
    budget = load_profile(str(tmp_path / "fit.json")).max_tokens
    nxt = [ln for ln in out.splitlines() if ln.startswith("  next: dsparksim bench replay ")]
    assert len(nxt) == 1 and f"--chunked-prefill-size {budget} --max-running-requests 1024" in nxt[0], out
    assert "  only 3 concurrencies [2, 8, 32]: the leave-one-concurrency-out error extrapolates" in out, out


def test_fit_help_names_every_fitted_parameter():
    """`profile fit --help` listed the families as (dense, moe, comm, attention, prefill) and the fixed overhead,
    while the fit also fits `floor` and `request_latency_s` and prints both: the help names every one."""
    import argparse

    from dsparksim.cli.main import build_parser
    from dsparksim.cost.analytic.calibration import FAMILIES

    def sub(p, name):
        return next(a for a in p._actions if isinstance(a, argparse._SubParsersAction)).choices[name]

    text = " ".join(sub(sub(build_parser(), "profile"), "fit").format_help().split())
    assert "floor" in FAMILIES and f"scale per cost family ({', '.join(FAMILIES)})" in text
    assert "request latency" in text and "fixed overhead" in text


def test_fit_notes_another_models_runs_and_empty_gpu_and_words_a_refusal_for_its_options(tmp_path, moe, capsys):
    """Qwen3 runs fitted with --model llama-3-8b, or runs imported without --gpu, were fitted without a word (bench
    replay notes both); a run of another TP was refused with replay's advice and "(file <builder>)", while what
    the fit builds comes from its own --gpu/--tp/--ep."""
    from dsparksim.bench.runs import read_runs, write_runs
    runs = tmp_path / "runs.csv"
    _runs_csv(runs, moe)
    rows = read_runs(runs)
    for r in rows:
        r["model"] = "meta-llama/Llama-3.1-8B-Instruct"
    rows[0]["gpu"] = None
    write_runs(rows, runs, force=True)
    assert main(["profile", "fit", str(runs), "--model", MOE, "--gpu", "H100", "--bootstrap", "0",
                 "--out", str(tmp_path / "fit.json")]) == 0
    out = capsys.readouterr().out
    assert "note: the runs' model 'meta-llama/Llama-3.1-8B-Instruct' shares no name with --model 'qwen3-30b-a3b'" \
        in out, out
    assert "note: 1 run(s) with gpu empty: taken as the fit's --gpu, not checked" in out, out
    rows[1]["tp"], rows[1]["gpu_count"] = 2, 2
    write_runs(rows, runs, force=True)
    assert main(["profile", "fit", str(runs), "--model", MOE, "--gpu", "H100", "--bootstrap", "0",
                 "--out", str(tmp_path / "fit2.json")]) == 2
    err = capsys.readouterr().err
    assert "profile fit builds that profile from --gpu H100 --tp 1 --ep 1: give the runs' own --tp" in err, err
    assert "<builder>" not in err, err


def test_fit_of_a_directory_says_it_is_one(tmp_path, capsys):
    """`profile fit results/ ...` (the folder of the benchmark files) said 'runs table not found', though the path is
    there; bench replay says 'is a directory'; so does the fit now, and a missing path is still 'not found'."""
    for path, words in ((tmp_path, "is a directory; expected a runs table"),
                        (tmp_path / "no.csv", "runs table not found")):
        assert main(["profile", "fit", str(path), "--model", MOE, "--gpu", "H100",
                     "--out", str(tmp_path / "f.json")]) == 2
        err = capsys.readouterr().err
        assert words in err, err


def test_fit_refusal_of_a_chunk_above_the_budget_says_what_to_pass_instead(tmp_path, moe, capsys):
    # an SGLang run recorded with --chunked-prefill-size 32768 (InferenceX's launch script) on the builder's
    # 16384-token budget: the refusal named the field and the budget but not what to do instead
    runs = tmp_path / "runs.csv"
    _runs_csv(runs, moe)
    capsys.readouterr()
    assert main(["profile", "fit", str(runs), "--model", MOE, "--gpu", "H100", "--bootstrap", "0",
                 "--chunked-prefill-size", "32768", "--out", str(tmp_path / "fit.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "32768 exceeds the profile's token budget 16384" in err[0], err
    assert "give --prefill-chunk 16384 or less, or leave it out" in err[0], err
    assert not (tmp_path / "fit.json").exists()
