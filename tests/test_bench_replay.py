"""`bench replay`: every selected run of a runs table simulated as its client ran it."""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pandas as pd
import pytest

from dsparksim.bench.client import ClientWorkload, run_client
from dsparksim.bench.replay import METRICS, error_summary, replay, row_workload, select
from dsparksim.cli.main import main
from dsparksim.errors import ConfigError, InputError

PROFILE = "h100-llama2-7b-tp1"


def _names() -> list[str]:
    from dsparksim.bench.runs import NAMES
    return list(NAMES)


def _row(i: int, conc: int, **kw) -> dict:
    r = dict.fromkeys(_names())
    r.update(run_id=f"t.csv:{i}", source_format="inferencex", source_file="t.csv", source_row=i, model="llama",
             gpu="h100", gpu_count=1, tp=1, ep=1, engine="sim", engine_version="x", spec_method="none",
             dataset_name="random", random_input_len=256, random_output_len=32, random_range_ratio=0.8,
             random_range_convention="low", max_concurrency=conc, request_rate=math.inf, num_prompts=5 * conc,
             num_warmup_prompts=2 * conc, ignore_eos=True)
    r.update(kw)
    return r


def _with_measured(r: dict, seed: int = 11) -> dict:
    """The row's 'measurement' is a simulation of it (another seed): replay then errs by sampling alone."""
    w, _ = row_workload(r)
    m = run_client(PROFILE, w, seed=seed).metrics
    return {**r, **{k: m[k] for k in METRICS}, "completed": m["completed"], "failed": m["failed"]}


def _write(path: Path, rows: list[dict]) -> Path:
    names = _names()
    with open(path, "w", newline="") as f:
        f.write("# dsparksim runs table v1 (README: Benchmark runs as input)\n")
        w = csv.writer(f)
        w.writerow(names)
        for r in rows:
            w.writerow(["" if r.get(n) is None else ("inf" if r.get(n) == math.inf else
                                                     ("true" if r.get(n) is True else r.get(n))) for n in names])
    return path


def test_replay_of_the_simulators_own_runs_is_close():
    rows = [_with_measured(_row(i, c)) for i, c in enumerate((2, 8), start=2)]
    df = replay(rows, PROFILE, seed=0)
    assert len(df) == 2 and (df["policy"] == "none").all()
    for m in ("mean_tpot_ms", "output_throughput_per_gpu", "duration_s"):
        e = df[f"rel_error_{m}"]
        assert (e.abs() < 0.10).all(), (m, e.tolist())      # same server, other draws: sampling error only
    # the same seed as the 'measurement' reproduces it exactly
    df11 = replay(rows, PROFILE, seed=11)
    assert (df11[[f"rel_error_{m}" for m in METRICS]].abs() < 1e-9).all().all()
    s = error_summary(df)
    assert set(s["metric"]) == set(METRICS) and (s["runs"] == 2).all()


def test_replay_knows_its_row_fields():
    w, notes = row_workload(_row(1, 4, random_range_ratio=None, request_rate=None, ignore_eos=None))
    assert (w.random_range_ratio, w.request_rate, w.max_concurrency, w.num_prompts) == (0.0, math.inf, 4, 20)
    assert len(notes) == 3
    for kw, field in (({"random_range_convention": "symmetric"}, "random_range_convention"),
                      ({"dataset_name": "sharegpt"}, "dataset_name"), ({"num_prompts": None}, "num_prompts"),
                      ({"ignore_eos": False}, "ignore_eos"),
                      ({"max_concurrency": None, "request_rate": None}, "request_rate")):
        with pytest.raises(InputError, match=field):
            row_workload(_row(1, 4, **kw))


def test_select():
    rows = [_row(1, 2), _row(2, 4, engine="other"), _row(3, 8)]
    assert [r["run_id"] for r in select(rows, [("engine", "sim"), ("max_concurrency", "8")])] == ["t.csv:3"]
    assert len(select(rows, [("request_rate", "inf")])) == 3
    from dsparksim.errors import ConfigError
    with pytest.raises(ConfigError, match="not a column"):
        select(rows, [("nope", "1")])
    with pytest.raises(ConfigError, match="selects none"):
        select(rows, [("engine", "vllm")])
    # numbers as numbers, text case-insensitively (the fit selects with the same rule)
    assert [r["run_id"] for r in select(rows, [("max_concurrency", "8.0"), ("engine", "SIM")])] == ["t.csv:3"]


def test_a_run_of_another_deployment_is_refused_before_any_simulation():
    # a B200 or TP4 run priced on an H200 TP8 profile: its errors would mean nothing, and would count in the medians
    ok = _row(1, 2, gpu="h200", gpu_count=8, tp=8)
    for bad, field in ((dict(gpu="b200"), "gpu"), (dict(tp=4, gpu_count=4), "tp"), (dict(ep=8), "ep")):
        with pytest.raises(ConfigError, match=f"field '{field}': run t.csv:2 ran"):
            replay([ok, _row(2, 2, **{**ok, **bad, "run_id": "t.csv:2"})], "built-h200x8-deepseek-v3-tp8")


def test_where_refuses_a_column_given_twice():
    from dsparksim.bench.replay import parse_where
    assert parse_where("engine=sglang,max_concurrency=4") == [("engine", "sglang"), ("max_concurrency", "4")]
    with pytest.raises(ConfigError, match="'max_concurrency' is given twice"):
        parse_where("max_concurrency=4,max_concurrency=64")


def test_bench_replay_cli(tmp_path, capsys):
    rows = [_with_measured(_row(i, c)) for i, c in enumerate((2, 4), start=2)]
    rows.append(_row(9, 2, engine="other", spec_method="eagle", spec_num_steps=2, spec_topk=1))
    t = _write(tmp_path / "runs.csv", rows)
    out = tmp_path / "rep"
    assert main(["bench", "replay", str(t), "--profile", PROFILE, "--where", "engine=sim", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "2 of 3 runs replayed" in text and "mean_tpot_ms" in text
    df = pd.read_csv(out / "replay.csv")
    assert len(df) == 2 and {"measured_mean_tpot_ms", "simulated_mean_tpot_ms", "rel_error_mean_tpot_ms"} <= set(df)
    errs = pd.read_csv(out / "replay_errors.csv")
    assert errs.set_index("metric").loc["mean_tpot_ms", "runs"] == 2
    assert (out / "replay.png").stat().st_size > 10_000
    assert json.loads((out / "config.json").read_text())["selected"] == 2


def test_bench_replay_refuses_a_row_before_simulating(tmp_path, capsys):
    t = _write(tmp_path / "runs.csv", [_row(1, 2), _row(2, 2, random_range_convention="symmetric")])
    out = tmp_path / "rep"
    rc = main(["bench", "replay", str(t), "--profile", PROFILE, "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "random_range_convention" in err and "t.csv:2" in err
    assert not out.exists()


def test_a_run_the_engine_cannot_serve_is_named_in_the_error(tmp_path, capsys):
    """A run whose requests fit no engine of the profile said only "config: field 'max_model_len': ...": which
    run of the table it was went unsaid."""
    t = _write(tmp_path / "runs.csv", [_row(1, 2), _row(2, 2, random_input_len=10_000_000)])
    out = tmp_path / "rep"
    rc = main(["bench", "replay", str(t), "--profile", PROFILE, "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "runs.csv" in err and "run t.csv:2" in err, err
    assert "rejected" in err and not out.exists()


def test_mtp_rows_replay_with_their_spec_mapping():
    row = _row(1, 2, spec_method="eagle", spec_num_steps=2, spec_num_draft_tokens=3, spec_topk=1, gpu_count=8,
               tp=8, gpu="h200", random_input_len=256, random_output_len=24, num_prompts=6)
    df = replay([row], "built-h200x8-deepseek-v3-tp8")
    assert df["policy"].tolist() == ["fixed:2"]
    plain = replay([{**row, "spec_method": "none", "spec_num_steps": None, "spec_num_draft_tokens": None,
                     "spec_topk": None}], "built-h200x8-deepseek-v3-tp8")
    assert plain["policy"].tolist() == ["none"]
    # MTP emits more than one token per step at low load: TPOT falls
    assert df["simulated_mean_tpot_ms"][0] < plain["simulated_mean_tpot_ms"][0]
    with pytest.raises(InputError, match="spec_topk"):
        replay([{**row, "spec_topk": 4}], "built-h200x8-deepseek-v3-tp8")


def test_acceptance_override_changes_only_speculative_runs(tmp_path, capsys):
    """--acceptance replaces the mapping's acceptance of MTP rows: a lower accept length lengthens TPOT; it is
    refused (one line, nothing written) without a speculative run or with a bad spec."""
    row = _row(1, 2, spec_method="eagle", spec_num_steps=2, spec_num_draft_tokens=3, spec_topk=1, gpu_count=8,
               tp=8, gpu="h200", random_input_len=256, random_output_len=24, num_prompts=6)
    plain = {**row, "run_id": "t.csv:2", "spec_method": "none", "spec_num_steps": None,
             "spec_num_draft_tokens": None, "spec_topk": None}
    base = replay([row, plain], "built-h200x8-deepseek-v3-tp8")
    low = replay([row, plain], "built-h200x8-deepseek-v3-tp8", acceptance="mtp?a1=0.3&a2=0.25")
    assert low["simulated_mean_tpot_ms"][0] > base["simulated_mean_tpot_ms"][0]      # fewer tokens per step
    assert low["simulated_mean_tpot_ms"][1] == base["simulated_mean_tpot_ms"][1]     # the plain run untouched
    assert "acceptance mtp?a1=0.3&a2=0.25 (given)" in low["notes"][0]
    with pytest.raises(ConfigError, match="no selected run is speculative"):
        replay([plain], "built-h200x8-deepseek-v3-tp8", acceptance="mtp")
    with pytest.raises(ConfigError, match="a1"):
        replay([row], "built-h200x8-deepseek-v3-tp8", acceptance="mtp?a1=2")
    t = tmp_path / "runs.csv"
    from dsparksim.bench.runs import write_runs
    write_runs([plain], t, force=True)
    out = tmp_path / "rep"
    rc = main(["bench", "replay", str(t), "--profile", "built-h200x8-deepseek-v3-tp8", "--acceptance", "mtp",
               "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "--acceptance" in err and not out.exists()


def test_round_trip_run_import_replay_is_exact(tmp_path, monkeypatch, capsys):
    """A simulated run's vLLM result file, imported and replayed with its seed, is reproduced exactly."""
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--profile", PROFILE, "--policy", "none", "--random-input-len", "300", "--random-output-len",
                 "40", "--random-range-ratio", "0.5", "--num-prompts", "30", "--max-concurrency", "5",
                 "--num-warmup-prompts", "4", "--seed", "4", "--result-dir", "rd", "--result-filename", "r.json",
                 "--quiet"]) == 0
    assert main(["bench", "import", "rd/r.json", "--gpu", "h100", "--gpu-count", "1", "--tp", "1", "--engine", "vllm",
                 "--dataset-name", "random", "--random-input-len", "300", "--random-output-len", "40",
                 "--random-range-ratio", "0.5", "--random-range-convention", "low", "--ignore-eos", "true",
                 "--num-warmup-prompts", "4", "--out", "runs.csv"]) == 0
    assert main(["bench", "replay", "runs.csv", "--profile", PROFILE, "--seed", "4", "--out", "rep", "--quiet"]) == 0
    df = pd.read_csv(tmp_path / "rep" / "replay.csv")
    errs = df[[f"rel_error_{m}" for m in METRICS]].iloc[0]
    assert errs.notna().all() and (errs.abs() < 1e-6).all(), errs.to_dict()
    capsys.readouterr()


# --- DP attention ---------------------------------------------------------------------------------------------
DP_PROFILE = "built-h200x8-deepseek-v3-dp8ep8"      # one of 8 DP ranks: tensor_parallel 1, expert_parallel 8


def _dp_row(i: int, conc: int, **kw) -> dict:
    base = dict(gpu="h200", gpu_count=8, tp=8, ep=8, dp_attention=True, engine="trtllm", random_input_len=256,
                random_output_len=32, num_prompts=3 * conc, num_warmup_prompts=0)
    return _row(i, conc, **{**base, **kw})


def test_a_dp_attention_run_replays_as_lockstep_ranks(monkeypatch):
    """A DP-attention row is simulated as tp ranks stepped in lockstep, each batching its own requests (spread as
    TensorRT-LLM balances them), not as one TP engine batching all of them."""
    import dsparksim.bench.replay as rp
    runs = []

    def keep(*a, **kw):
        runs.append(run_client(*a, **kw))
        return runs[-1]

    monkeypatch.setattr(rp, "run_client", keep)
    df = replay([_dp_row(1, 16)], DP_PROFILE, seed=0)
    assert df["dp_ranks"].tolist() == [8] and df["dp_router"].tolist() == ["least-outstanding"]
    assert "DP attention: 8 ranks in lockstep" in df["notes"].iloc[0]
    run = runs[0]
    assert run.notes["dp_ranks"] == 8 and run.notes["config"].engine.dp_ranks == 8
    st = run.steps
    assert sorted(st["rank"].unique()) == list(range(8))
    assert st.groupby("rank")["n_running"].max().max() == 2        # 16 requests over 8 ranks: 2 each
    # the same workload on one engine of that profile batches all 16 requests in a step: another deployment
    w, _ = row_workload(_dp_row(1, 16))
    tp = run_client(DP_PROFILE, w, rp.ServerSettings(gpus=8), seed=0)
    assert tp.steps["n_running"].max() == 16 and "rank" in tp.steps and tp.steps["rank"].max() == 0
    assert abs(run.metrics["median_tpot_ms"] / tp.metrics["median_tpot_ms"] - 1) > 0.05


def test_sglang_dp_attention_spreads_requests_in_turn():
    from dsparksim.bench.replay import dp_router
    assert dp_router("sglang") == "round-robin" and dp_router("trtllm") == "least-outstanding"
    df = replay([_dp_row(1, 8, engine="sglang")], DP_PROFILE, seed=0)
    assert df["dp_ranks"].tolist() == [8] and df["dp_router"].tolist() == ["round-robin"]


def test_dp_attention_and_profile_must_agree(tmp_path, capsys):
    """A DP-attention run on a TP profile (or a TP run on a DP-rank profile) is one error line naming the run and
    dp_attention, exit 2, nothing written."""
    tp_prof = "fitted-h200x8-deepseek-r1-trtllm-1.1.0rc2.post2-ep8"     # TP8 EP8, metadata.data_parallel 1
    cases = ((_dp_row(1, 4), tp_prof, "ran with DP attention over 8 ranks"),
             (_dp_row(1, 4, dp_attention=False), DP_PROFILE, "ran without DP attention (dp_attention false)"),
             (_dp_row(1, 4, dp_attention=None), DP_PROFILE, "ran without DP attention (dp_attention empty)"))
    for i, (row, prof, says) in enumerate(cases):
        t = _write(tmp_path / f"runs{i}.csv", [row])
        out = tmp_path / f"rep{i}"
        rc = main(["bench", "replay", str(t), "--profile", prof, "--out", str(out)])
        err = capsys.readouterr().err.strip()
        assert rc == 2 and len(err.splitlines()) == 1, err
        assert "field 'dp_attention'" in err and "run t.csv:1 " in err and says in err, err
        assert not out.exists()
    # the DP profile's GPUs per engine are tensor_parallel x data_parallel: a DP run of another TP size is refused
    with pytest.raises(ConfigError, match=r"field 'dp_attention': run t.csv:1 ran with DP attention over 4 ranks"):
        replay([_dp_row(1, 4, tp=4, gpu_count=4)], DP_PROFILE)
    with pytest.raises(InputError, match="field 'tp': run t.csv:1: missing, and dp_attention is true"):
        replay([_dp_row(1, 4, tp=None)], DP_PROFILE)


def test_the_attention_dp_balance_is_refused_for_an_engine_without_it():
    """TensorRT-LLM's attention_dp_config balance applied to an SGLang DP-attention run would model a setting SGLang
    does not have."""
    from dsparksim.bench.client import ServerSettings
    with pytest.raises(ConfigError, match=r"--attention-dp-timeout-iters.*60 given, but run t.csv:1 ran on 'sglang'"):
        replay([_dp_row(1, 4, engine="sglang")], DP_PROFILE, server=ServerSettings(attention_dp_timeout_iters=60))
    df = replay([_dp_row(1, 4)], DP_PROFILE, server=ServerSettings(attention_dp_timeout_iters=60), seed=0)
    assert df["dp_ranks"].tolist() == [8]


def test_a_vllm_run_without_a_range_ratio_is_replayed_with_vllms_default_every_length_l():
    # vllm bench serve records no range ratio; its default (0, symmetric; 1.0 in the older benchmark_serving.py)
    # draws every length L, not SGLang's [1, L]: filling 0 in [int(R*L), L] halved the simulated lengths
    w, notes = row_workload(_row(1, 4, source_format="vllm", random_range_ratio=None, random_range_convention=None))
    assert w.random_range_ratio == 1.0
    assert any("vLLM's default" in n and "every length L" in n for n in notes), notes
    w, notes = row_workload(_row(1, 4, random_range_ratio=None, random_range_convention=None))   # not vLLM's
    assert w.random_range_ratio == 0.0 and "random_range_ratio missing: 0" in notes


def test_replay_default_prefill_chunk_is_the_profiles_token_budget_as_in_profile_fit():
    # profile fit simulates at --prefill-chunk = the profile's token budget by default; bench replay used the
    # simulator's 2048, so a fitted profile replayed with defaults ran another server than the one it was fitted on
    from dsparksim.bench.client import ServerSettings
    from dsparksim.cost.profile import load_profile
    budget = load_profile(PROFILE).max_tokens
    assert budget != 2048
    rows = [_row(1, 8, random_input_len=1024, random_range_ratio=1.0, num_prompts=16, num_warmup_prompts=0)]
    dflt = replay(rows, PROFILE, seed=0)
    given = replay(rows, PROFILE, server=ServerSettings(chunked_prefill_size=budget), seed=0)
    small = replay(rows, PROFILE, server=ServerSettings(chunked_prefill_size=2048), seed=0)
    assert dflt["simulated_mean_ttft_ms"].iloc[0] == given["simulated_mean_ttft_ms"].iloc[0]
    assert dflt["simulated_mean_ttft_ms"].iloc[0] != small["simulated_mean_ttft_ms"].iloc[0]


def test_bench_replay_says_its_prefill_chunk_and_that_fields_were_filled_in(tmp_path, capsys):
    t = _write(tmp_path / "runs.csv", [_row(1, 2, source_format="vllm", random_range_ratio=None,
                                            random_range_convention=None, num_prompts=4, num_warmup_prompts=0)])
    out = tmp_path / "rep"
    assert main(["bench", "replay", str(t), "--profile", PROFILE, "--out", str(out), "--quiet"]) == 0
    assert json.loads((out / "config.json").read_text())["server"]["chunked_prefill_size"] == 4096
    assert main(["bench", "replay", str(t), "--profile", PROFILE, "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "(chunked prefill 4096 tokens, the profile's token budget as in profile fit" in text
    assert "1 run(s) with fields filled in or caveats (replay.csv notes), e.g.: random_range_ratio not recorded: " \
           "vLLM's default" in text


def test_a_prefill_chunk_above_the_token_budget_is_said_to_be_capped(tmp_path, capsys):
    # --chunked-prefill-size 32768 on a 16384-token profile is simulated at 16384 (identical replay.csv, as
    # docs/benchmarks.md says: "within the token budget"), but the command printed "chunked prefill 32768 tokens"
    t = _write(tmp_path / "runs.csv", [_row(1, 2, num_prompts=4, num_warmup_prompts=0)])
    args = ["bench", "replay", str(t), "--profile", PROFILE, "--out"]
    assert main([*args, str(tmp_path / "a"), "--chunked-prefill-size", "8192"]) == 0
    out, err = capsys.readouterr()
    assert "(chunked prefill 8192 tokens, at most 4096 per step: the profile's token budget)" in out, out
    assert "note: --chunked-prefill-size 8192 is above the profile's token budget 4096" in err, err
    assert main([*args, str(tmp_path / "b"), "--chunked-prefill-size", "4096", "--quiet"]) == 0
    assert "token budget" not in capsys.readouterr().err
    same = [(tmp_path / d / "replay.csv").read_text() for d in "ab"]
    assert same[0] == same[1]                              # the cap is what was simulated


def test_an_h20_run_is_not_replayed_on_an_h200_profile():
    # the GPU check was a substring test: 'h20' is in 'h200-sxm-141gb', so an H20 run (148 vs 989 TFLOPS) passed
    ok = _row(1, 2, gpu="h200", gpu_count=8, tp=8)
    assert replay_ok(ok) and replay_ok({**ok, "gpu": "H200-SXM-141GB"})
    for gpu in ("H20", "h2", "H200X"):
        with pytest.raises(ConfigError, match=f"field 'gpu': run t.csv:1 ran on '{gpu}'"):
            check_deployment_of({**ok, "gpu": gpu})


def test_a_deployment_mismatch_names_the_profile_file_not_only_its_inner_name(tmp_path):
    # `profile fit --out my-h200.json` writes a profile named 'fitted-h200x8-deepseek-v3' inside: the error named
    # only that, a name the user never typed (bench replay runs.csv --profile my-h200.json)
    from dsparksim.bench.replay import check_deployment
    from dsparksim.cost.profile import load_profile, profile_path
    mine = tmp_path / "my-h200.json"
    mine.write_bytes(profile_path("built-h200x8-deepseek-v3-tp8").read_bytes())
    row = {**_row(1, 2, gpu="h200", gpu_count=8, tp=8), "ep": 8}
    with pytest.raises(ConfigError, match=r"but the profile 'built-h200x8-deepseek-v3-tp8' \(file .*my-h200\.json\) "
                                          r"has expert_parallel 1"):
        check_deployment(row, load_profile(str(mine)))
    with pytest.raises(ConfigError, match=r"but the profile 'built-h200x8-deepseek-v3-tp8' has expert_parallel 1"):
        check_deployment_of(row)                          # a shipped profile: its file is named after it


def check_deployment_of(row):
    from dsparksim.bench.replay import check_deployment
    from dsparksim.cost.profile import load_profile
    return check_deployment(row, load_profile("built-h200x8-deepseek-v3-tp8"))


def replay_ok(row) -> bool:
    return check_deployment_of(row) == 1


def test_lengths_that_the_runs_token_count_contradicts_are_refused():
    # vLLM files record no lengths: a mistyped --random-output-len at import was simulated (and fitted) silently,
    # although the file's total_output_tokens / completed says otherwise
    ok = _row(1, 4, random_output_len=512, random_range_ratio=1.0, completed=20, total_output_tokens=20 * 512)
    row_workload(ok)
    wide = _row(1, 4, random_output_len=512, random_range_ratio=0.0, completed=20, total_output_tokens=20 * 270)
    row_workload(wide)                                     # [1, 512]: mean 256.5, 20 draws: within sampling
    for bad in ({"total_output_tokens": 20 * 1024}, {"random_range_ratio": 0.0}):
        with pytest.raises(InputError, match=r"field 'random_output_len': run t.csv:1: its 20 completed requests "
                                             r"emitted 1024.0|emitted 512.0"):
            row_workload({**ok, **bad})


def test_fit_refuses_lengths_that_the_token_count_contradicts(tmp_path):
    from dsparksim.bench.runs import write_runs
    from dsparksim.fit.runs import load_fit_runs
    rows = [_row(1, 4, random_output_len=512, random_range_ratio=1.0, completed=20, total_output_tokens=20 * 1024,
                 mean_tpot_ms=10.0)]
    write_runs(rows, tmp_path / "r.csv")
    with pytest.raises(InputError, match="field 'random_output_len'.*emitted 1024.0 tokens each"):
        load_fit_runs(tmp_path / "r.csv", {})


def test_a_placeholder_tpot_of_0_is_neither_compared_by_replay_nor_fitted(tmp_path):
    # a runs table written before bench import blanked it (or by hand) holds the clients' TPOT 0 of a run whose
    # requests all emitted one token: replay printed it as the measured TPOT beside the simulated one
    from dsparksim.bench.runs import write_runs
    from dsparksim.fit.runs import load_fit_runs
    row = _row(1, 2, random_output_len=1, random_range_ratio=1.0, num_prompts=4, completed=4, total_output_tokens=4,
               mean_tpot_ms=0.0, median_tpot_ms=0.0, p99_tpot_ms=0.0, mean_ttft_ms=30.0, output_throughput=100.0,
               output_throughput_per_gpu=100.0)
    df = replay([row], PROFILE)
    for s in ("mean", "median", "p99"):
        assert pd.isna(df[f"measured_{s}_tpot_ms"].iloc[0]) and pd.isna(df[f"rel_error_{s}_tpot_ms"].iloc[0])
    assert df["measured_mean_ttft_ms"].iloc[0] == 30.0
    assert "measured TPOT 0 not compared" in df["notes"].iloc[0]
    assert error_summary(df).set_index("metric").loc["mean_tpot_ms", "runs"] == 0
    write_runs([row], tmp_path / "r.csv")
    (fr,), _ = load_fit_runs(tmp_path / "r.csv", {})
    assert not any(k.endswith("_tpot_ms") for k in fr.measured) and fr.measured["mean_ttft_ms"] == 30.0


@pytest.mark.parametrize("gpu", ["NVIDIA H200", "nvidia h200", "H200 141GB HBM3e", "NVIDIA H200 141GB HBM3e",
                                 "H200-SXM-141GB", "h200 sxm", "H200 SXM 141GB"])
def test_gpu_names_as_nvidia_smi_writes_them_match_their_profile(gpu):
    # "NVIDIA H200" (nvidia-smi, benchmark metadata) was refused against the H200 profile
    ok = _row(1, 2, gpu="h200", gpu_count=8, tp=8)
    assert replay_ok({**ok, "gpu": gpu})


@pytest.mark.parametrize("gpu, why", [("NVIDIA H20", "'h20' is not a whole word"),
                                      ("H200 96GB", "96 GB against 141 GB"),
                                      ("NVIDIA", "no GPU model"),
                                      ("H200 NVL", "'h200 nvl' is not a whole word"),
                                      ("NVIDIA H100 80GB HBM3", "80 GB against 141 GB")])
def test_gpu_names_that_stay_ambiguous_or_differ_are_refused_naming_both(gpu, why):
    ok = _row(1, 2, gpu="h200", gpu_count=8, tp=8)
    with pytest.raises(ConfigError, match=f"field 'gpu': run t.csv:1 ran on '{gpu}' but the profile .* prices "
                                          f"'H200-SXM-141GB' \\({why}"):
        check_deployment_of({**ok, "gpu": gpu})


def test_an_nvidia_smi_name_matches_a_vendor_named_device():
    from dsparksim.bench.replay import gpu_mismatch
    assert gpu_mismatch("NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM 80GB") is None
    assert gpu_mismatch("H100", "NVIDIA H100 SXM 80GB") is None
    assert gpu_mismatch("H100 PCIe", "NVIDIA H100 SXM 80GB") is not None
    assert gpu_mismatch("H100 SXM", "H100-SXM5-80GB") is not None     # SXM vs SXM5: not guessed


def test_an_sglang_run_that_drew_zero_token_outputs_is_noted_checked_on_its_own_draw_and_refused_by_fit(tmp_path):
    # sglang bench_serving.py (0033168f) draws outputs in [int(R*L), L]: [0, L] at its default R = 0, and sends a
    # 0 as max_new_tokens 0; the simulator draws [1, L]. Replay said nothing, and the length check used [1, L]:
    # an SGLang run of L = 4 (mean 2.0 tokens, as SGLang draws them) was refused as a mistyped length
    from dsparksim.bench.runs import write_runs
    from dsparksim.fit.runs import load_fit_runs
    row = _row(1, 4, source_format="sglang", random_output_len=4, random_range_ratio=0.0, num_prompts=2000,
               completed=2000, total_output_tokens=4000, mean_ttft_ms=30.0)
    wl, notes = row_workload(row)
    assert wl.random_range_ratio == 0.0
    assert any("[0, 4]: about 4e+02 of its 2000 prompts (1 in 5) went out with max_new_tokens 0" in n for n in notes)
    with pytest.raises(InputError, match="emitted 2.0 tokens each"):
        row_workload({**row, "source_format": "vllm"})           # another client's [1, 4]: mean 2.5
    long = {**row, "random_output_len": 1024, "total_output_tokens": 2000 * 512}
    assert any("about 2 of its 2000 prompts (1 in 1025)" in n for n in row_workload(long)[1])
    assert not any("max_new_tokens 0" in n for n in row_workload({**long, "random_range_ratio": 0.001})[1])
    write_runs([row, {**long, "run_id": "t.csv:2", "source_row": 2}], tmp_path / "r.csv")
    with pytest.raises(InputError, match=r"field 'random_range_ratio': run t.csv:1: SGLang's bench_serving .* about "
                                         r"4e\+02 of its prompts \(1 in 5"):
        load_fit_runs(tmp_path / "r.csv", {})
    runs, _ = load_fit_runs(tmp_path / "r.csv", {"source_row": "2"})    # 1 in 1025: within the fit's 2%
    assert [r.run_id for r in runs] == ["t.csv:2"]


def test_fit_refuses_one_measurement_twice_in_a_hand_made_table(tmp_path):
    from dsparksim.bench.runs import write_runs
    from dsparksim.fit.runs import load_fit_runs
    a = _row(1, 4, random_output_len=32, random_range_ratio=1.0, mean_tpot_ms=10.0, duration_s=3.0)
    write_runs([a, {**a, "run_id": "u.csv:1", "source_file": "u.csv"}], tmp_path / "r.csv")
    with pytest.raises(InputError, match="field 'run_id': run u.csv:1 is run t.csv:1 again"):
        load_fit_runs(tmp_path / "r.csv", {})
    assert len(load_fit_runs(tmp_path / "r.csv", {"source_file": "u.csv"})[0]) == 1


def test_fit_refuses_runs_of_two_models_in_one_selection(tmp_path):
    # runs of two models were fitted into one profile silently
    from dsparksim.bench.runs import write_runs
    from dsparksim.fit.runs import load_fit_runs
    a = _row(1, 4, random_output_len=32, random_range_ratio=1.0, mean_tpot_ms=10.0, model="deepseek-ai/DeepSeek-R1")
    b = {**a, "run_id": "t.csv:2", "source_row": 2, "max_concurrency": 8, "model": "meta-llama/Llama-3.1-8B"}
    c = {**a, "run_id": "t.csv:3", "source_row": 3, "max_concurrency": 2, "model": "DEEPSEEK-AI/deepseek-r1"}
    write_runs([a, b, c], tmp_path / "r.csv")
    with pytest.raises(InputError, match=r"field 'model': the selected runs are of more than one model: run t.csv:1 "
                                         r"'deepseek-ai/deepseek-r1', run t.csv:2 'meta-llama/llama-3.1-8b'"):
        load_fit_runs(tmp_path / "r.csv", {})
    assert len(load_fit_runs(tmp_path / "r.csv", {"model": "deepseek-ai/DeepSeek-R1"})[0]) == 2   # case aside


def test_a_run_of_another_model_than_the_profiles_is_noted():
    # a Llama run replayed on a DeepSeek profile was compared without a word
    from dsparksim.bench.replay import model_note
    from dsparksim.cost.profile import load_profile
    ds = load_profile("built-h200x8-deepseek-v3-tp8")
    assert model_note({"model": "deepseek-ai/DeepSeek-R1-0528"}, ds) is None
    assert model_note({"model": "DeepSeek-V3-0324-FP8"}, ds) is None
    assert model_note({"model": None}, ds) is None
    note = model_note({"model": "meta-llama/Llama-3.1-8B-Instruct"}, ds)
    assert "'meta-llama/Llama-3.1-8B-Instruct' shares no name with the profile's model 'deepseek-v3'" in note
    assert model_note({"model": "Qwen/Qwen3-30B-A3B"}, load_profile("built-h100-qwen3-30b-a3b-tp1")) is None
    assert model_note({"model": "Qwen/Qwen3-8B"}, ds) is not None
    ok = _row(1, 2, gpu="h200", gpu_count=8, tp=8, model="meta-llama/Llama-3.1-8B", random_input_len=64,
              random_output_len=8, num_prompts=4)
    assert "shares no name" in replay([ok], "built-h200x8-deepseek-v3-tp8")["notes"].iloc[0]


def test_prompts_neither_completed_nor_failed_are_noted_and_refused_by_fit(tmp_path):
    # SGLang's line has no failed count: a run with 360 of 400 prompts failed (or a --num-prompts 400 typed at
    # import for a 40-prompt run) was fitted as if the 40 completed requests were all 400, and replayed silently
    from dsparksim.bench.runs import write_runs
    from dsparksim.fit.runs import load_fit_runs
    row = _row(1, 4, source_format="sglang", random_output_len=32, random_range_ratio=1.0, num_prompts=400,
               completed=40, total_output_tokens=40 * 32, mean_tpot_ms=10.0)
    _, notes = row_workload(row)
    assert any(n.startswith("360 of its 400 prompts neither completed nor counted failed (completed 40") for n in notes)
    write_runs([row], tmp_path / "r.csv")
    with pytest.raises(InputError, match="field 'completed': run t.csv:1: 360 of its 400 prompts neither completed"):
        load_fit_runs(tmp_path / "r.csv", {})
    full = {**row, "num_prompts": 40}
    assert not any("neither completed" in n for n in row_workload(full)[1])
    assert not any("neither completed" in n for n in row_workload({**row, "completed": 38, "failed": 362, "total_output_tokens": 38 * 32})[1])


def test_fit_refuses_a_per_gpu_throughput_of_no_whole_number_of_gpus(tmp_path):
    # the divisor output_throughput / output_throughput_per_gpu was rounded silently: 1000 / 300 fitted as 3 GPUs
    from dsparksim.bench.runs import write_runs
    from dsparksim.fit.runs import load_fit_runs
    a = _row(1, 4, random_output_len=32, random_range_ratio=1.0, mean_tpot_ms=10.0, gpu_count=8, tp=8,
             output_throughput=1000.0, output_throughput_per_gpu=300.0)
    write_runs([a], tmp_path / "r.csv")
    with pytest.raises(InputError, match=r"field 'output_throughput_per_gpu': run t.csv:1: 300 is output_throughput "
                                         r"1000 / 3.33, not a whole number"):
        load_fit_runs(tmp_path / "r.csv", {})
    write_runs([{**a, "output_throughput_per_gpu": 125.04}], tmp_path / "ok.csv")     # published rounding
    assert load_fit_runs(tmp_path / "ok.csv", {})[0][0].spec.gpus == 8


def test_prompt_lengths_that_the_runs_token_count_contradicts_are_refused(tmp_path):
    # only the output side was checked: a mistyped --random-input-len at import (or a --random-prefix-len the
    # file does not record) was simulated and fitted with the wrong prompt lengths
    from dsparksim.bench.runs import write_runs
    from dsparksim.fit.runs import load_fit_runs
    ok = _row(1, 4, random_input_len=1024, random_output_len=32, random_range_ratio=1.0, completed=20,
              total_input_tokens=20 * 1024, total_output_tokens=20 * 32, mean_tpot_ms=10.0)
    row_workload(ok)
    bad = {**ok, "random_input_len": 256}
    with pytest.raises(InputError, match=r"field 'random_input_len': run t.csv:1: its 20 completed requests sent "
                                         r"1024.0 prompt tokens each \(total_input_tokens / completed\), but prompt "
                                         r"lengths uniform in \[256, 256\].*--random-prefix-len"):
        row_workload(bad)
    write_runs([bad], tmp_path / "r.csv")
    with pytest.raises(InputError, match="field 'random_input_len'"):
        load_fit_runs(tmp_path / "r.csv", {})
    wide = {**ok, "random_range_ratio": 0.0, "total_input_tokens": 20 * 530, "total_output_tokens": 20 * 17}
    row_workload(wide)


def test_vllms_special_token_shortfall_on_short_prompts_is_no_mistyped_length():
    # vLLM's RandomDataset draws around random_input_len - num_special_tokens (1 for a BOS): 16-token prompts
    # recorded as 15 each are what the client sent for --random-input-len 16
    row = _row(1, 4, random_input_len=16, random_output_len=32, random_range_ratio=1.0, completed=400,
               total_input_tokens=400 * 15, total_output_tokens=400 * 32)
    row_workload(row)
    with pytest.raises(InputError, match="field 'random_input_len'"):
        row_workload({**row, "total_input_tokens": 400 * 10})
    with pytest.raises(InputError, match="field 'random_input_len'"):
        row_workload({**row, "total_input_tokens": 400 * 17})


def test_where_gpu_selects_every_spelling_of_that_gpu_and_refuses_an_ambiguous_one():
    # `bench replay --where gpu=h200` selected none of the rows spelled "NVIDIA H200"
    rows = [_row(1, 2, gpu="NVIDIA H200"), _row(2, 2, gpu="H200-SXM-141GB"), _row(3, 2, gpu="NVIDIA H20"),
            _row(4, 2, gpu="H100-SXM5-80GB"), _row(5, 2, gpu="H800-SXM5-80GB")]
    assert [r["run_id"] for r in select(rows, [("gpu", "h200")])] == ["t.csv:1", "t.csv:2"]
    assert [r["run_id"] for r in select(rows, [("gpu", "NVIDIA H200 141GB HBM3e")])] == ["t.csv:1", "t.csv:2"]
    assert [r["run_id"] for r in select(rows, [("gpu", "h20")])] == ["t.csv:3"]
    with pytest.raises(ConfigError, match=r"gpu=sxm5 is ambiguous: it selects runs on 2 GPUs \('H100-SXM5-80GB', "
                                          r"'H800-SXM5-80GB'\); name one"):
        select(rows, [("gpu", "sxm5")])


def test_where_gpu_of_another_form_factor_selects_none_of_the_plain_name():
    """--where gpu='H200 NVL' selected the 130 'h200' (SXM) runs of the InferenceX table and replayed them on the
    H200-SXM profile: 'h200' is H200-SXM-141GB, whose words NVL is not one of (as H100 PCIe is not H100)."""
    from dsparksim.cost.analytic.hardware import same_gpu

    rows = [_row(1, 2, gpu="h200"), _row(2, 2, gpu="NVIDIA H200"), _row(3, 2, gpu="H200 NVL"),
            _row(4, 2, gpu="h100")]
    assert [r["run_id"] for r in select(rows, [("gpu", "H200 NVL")])] == ["t.csv:3"]
    assert [r["run_id"] for r in select(rows, [("gpu", "h200")])] == ["t.csv:1", "t.csv:2"]
    with pytest.raises(ConfigError, match="selects none"):
        select(rows, [("gpu", "NVIDIA H100 PCIe")])
    assert not same_gpu("h100", "H100 PCIe") and not same_gpu("H200 NVL", "h200") and same_gpu("h200", "NVIDIA H200")


def test_one_gpu_name_rule_for_profile_build_fit_and_hardware():
    from dsparksim.cost.analytic.hardware import canonical_gpu, get_gpu
    # `profile fit/build --gpu "NVIDIA H200"` failed with "unknown GPU"
    assert canonical_gpu("NVIDIA H200") == "H200" and get_gpu("NVIDIA H200").name == "H200-SXM-141GB"
    assert canonical_gpu("NVIDIA H100 80GB HBM3") == "H100" and canonical_gpu("h100") == "h100"
    assert canonical_gpu("H200-SXM-141GB") == "H200-SXM-141GB" and canonical_gpu("NVIDIA H20") == "H20"
    with pytest.raises(InputError, match="GPU 'SXM5' is ambiguous: it names H100-SXM5-80GB, H800-SXM5-80GB"):
        get_gpu("SXM5")
    with pytest.raises(InputError, match="unknown GPU 'NVIDIA H100 PCIe'"):
        canonical_gpu("NVIDIA H100 PCIe")


def test_profile_build_takes_an_nvidia_smi_gpu_name(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    base = ["profile", "build", "--model", "llama-2-7b", "--date", "2026-12-01"]
    assert main([*base, "--gpu", "NVIDIA H200", "--out", str(a)]) == 0
    assert main([*base, "--gpu", "H200", "--out", str(b)]) == 0
    assert a.read_bytes() == b.read_bytes()


def test_a_run_without_gpu_or_tp_is_noted_as_taken_to_be_the_profiles():
    """A run imported without --gpu / --tp (bench import says they are needed) was replayed on any profile
    without a word: check_deployment cannot check an empty column. Now its notes say which it took as the
    profile's; an empty ep is said only beside a profile with expert parallelism."""
    small = dict(random_input_len=64, random_output_len=8, num_prompts=4)
    df = replay([_row(1, 2, gpu=None, tp=None, ep=None, **small), _row(2, 2, **small)], PROFILE)
    note = df["notes"].iloc[0]
    assert "gpu (the profile's NVIDIA H100 SXM 80GB), tp (the profile's 1) not recorded" in note, note
    assert "--gpu / --tp" in note and "ep (" not in note, note
    assert "not recorded" not in (df["notes"].iloc[1] or "")
    from dsparksim.bench.replay import unchecked_note
    from dsparksim.cost.profile import load_profile
    dp = load_profile("built-h200x8-deepseek-v3-dp8ep8")   # one of 8 DP ranks: the engine spans 8 GPUs, EP 8
    note = unchecked_note({"gpu": "h200", "tp": None, "ep": None}, dp)
    assert note is not None and "tp (the profile's 8), ep (the profile's 8)" in note, note


def test_a_run_without_a_cap_at_rate_inf_is_noted():
    """A vLLM file without its max_concurrency key (an older or hand-edited result) was replayed with every prompt
    released at once, 130% off its measured TPOT at a real cap of 4, without a word; its notes say so now, and a
    capped run has no such note."""
    small = dict(random_input_len=64, random_output_len=8, num_prompts=4)
    df = replay([_row(1, 2, max_concurrency=None, **small), _row(2, 2, **small)], PROFILE)
    assert "max_concurrency empty (no cap, or not recorded): every prompt released at once" in df["notes"].iloc[0]
    assert "max_concurrency" not in (df["notes"].iloc[1] or "")
