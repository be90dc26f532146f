"""The torch runner's commands under hostile options (hostile-tester findings 2026-12-05): --model overrides that
cannot build a target (d_model=-1, n_layers=0, vocab_size=0, rope_base=-1, heads that do not divide d_model) ended
in tracebacks; run-real and validate ran fixed:9 at K=7 as fixed:7 under its own name (run refuses it);
validate took --requests-per-user 0 / -3, named n_reqs for --prefill-chunk 0, and spent hours profiling 100001
batch sizes for --concurrency 100000; --seed 10**20 was an OverflowError traceback; --drafter-layers 1000000 ran
the machine out of memory; --min-growth nan / --drift-gate nan were taken; and '' for --raw, --name,
--context-spread-from, --acceptance, --mtp1-acceptance or audit's --out silently meant the default."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import dsparksim.runner.timing as timing  # noqa: E402
from cli_guard import stub_runner_work  # noqa: E402
from dsparksim.cli.main import main  # noqa: E402


@pytest.fixture
def no_work(monkeypatch):
    return stub_runner_work(monkeypatch)


MODEL_CASES = [
    ("tiny,d_model=-1", "model.d_model", "integer >= 1, got -1"),
    ("tiny,n_layers=0", "model.n_layers", "integer >= 1, got 0"),
    ("tiny,vocab_size=0", "model.vocab_size", "integer >= 1, got 0"),
    ("tiny,n_heads=3", "model.n_heads", "3 heads do not divide d_model 128"),
    ("tiny,n_kv_heads=3", "model.n_kv_heads", "3 KV heads do not divide n_heads 4"),
    ("tiny,d_model=12,n_heads=4", "model.d_model", "head dimension d_model / n_heads = 3 is odd"),
    ("tiny,rope_base=-1", "model.rope_base", "finite number > 0, got -1.0"),
    ("tiny,norm_eps=-1", "model.norm_eps", "finite number >= 0"),
]


@pytest.mark.parametrize("cmd", ["measure", "run-real"])
@pytest.mark.parametrize("model, field, text", MODEL_CASES)
def test_a_target_shape_that_cannot_be_built_is_one_line(tmp_path, capsys, no_work, cmd, model, field, text):
    extra = ["--no-profile-check", "--duration", "1"] if cmd == "run-real" else []
    out = tmp_path / ("p.json" if cmd == "measure" else "r")
    assert main([cmd, "--model", model, *extra, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"field '{field}'" in err and text in err and err.count("\n") == 1, err
    assert not no_work and not out.exists()


CASES = [
    (["run-real", "--policy", "fixed:9", "--duration", "1"], "--policy", "a block holds only K=7"),
    (["validate", "--policies", "fixed:3,fixed:9"], "--policies", "fixed:9 verifies 9 draft tokens"),
    (["validate", "--requests-per-user", "0"], "--requests-per-user", "integer >= 1, got 0"),
    (["validate", "--requests-per-user", "-3"], "--requests-per-user", "got -3"),
    (["validate", "--prefill-chunk", "0"], "--prefill-chunk", "integer >= 1, got 0"),
    (["validate", "--acceptance", ""], "--acceptance", "empty value"),
    (["validate", "--mtp1-acceptance", ""], "--mtp1-acceptance", "empty value"),
    (["measure", "--seed", str(10**20)], "--seed", "below 2^63"),
    (["measure", "--drafter-layers", "1000000"], "--drafter-layers", "at most the target's 3 layer(s)"),
    (["measure", "--min-growth", "nan"], "--min-growth", "finite multiple >= 0"),
    (["measure", "--min-growth", "-1"], "--min-growth", "got -1.0"),
    (["measure", "--drift-gate", "nan"], "--drift-gate", "finite fraction >= 0"),
    (["measure", "--raw", ""], "--raw", "empty value"),
    (["measure", "--name", ""], "--name", "empty value"),
    (["measure", "--context-spread-from", ""], "--context-spread-from", "empty value"),
    (["validate", "--threads", "5000"], "--threads", "at most 1024"),
]


@pytest.mark.parametrize("argv, flag, text", CASES)
def test_bad_runner_options_are_refused_before_any_work(tmp_path, capsys, no_work, argv, flag, text):
    out = tmp_path / ("p.json" if argv[0] == "measure" else "v")
    assert main([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"field '{flag}'" in err and text in err and err.count("\n") == 1, err
    assert not no_work and not out.exists()


def test_audit_out_empty_is_refused_not_ignored(capsys, no_work):
    assert main(["audit", "--out", "", "--steps", "10"]) == 2
    assert "field '--out': empty value" in capsys.readouterr().err and not no_work


def test_a_batch_size_that_fits_no_context_is_refused_before_any_cell(tmp_path, capsys, monkeypatch):
    timed = []
    monkeypatch.setattr(timing, "time_cell", lambda *a, **k: timed.append(1) or [])
    assert main(["measure", "--n-req", "1,2,100000", "--contexts", "16", "--reps", "3", "--warmup", "1",
                 "--no-drift", "-K", "3", "--out", str(tmp_path / "p.json")]) == 2
    err = capsys.readouterr().err
    assert "field '--n-req': 100000 requests need" in err and "holds about" in err
    assert not timed and not (tmp_path / "p.json").exists()


def test_measure_live_refuses_drafters_trained_for_another_k(tmp_path, capsys, monkeypatch):
    # the committed drafters are K=7: -K 3 ended in a numpy broadcast traceback inside the first cell
    from pathlib import Path
    models = Path(__file__).resolve().parents[1] / "models"
    timed = []
    monkeypatch.setattr(timing, "time_cell", lambda *a, **k: timed.append(1) or [])
    assert main(["measure", "--live", "--models", str(models), "-K", "3", "--n-req", "1,2", "--contexts", "16",
                 "--reps", "3", "--warmup", "1", "--no-drift", "--out", str(tmp_path / "p.json")]) == 2
    err = capsys.readouterr().err
    assert "dspark.pt: field 'K': the drafter was trained for K=7 but this measurement uses K=3" in err
    assert not timed and not (tmp_path / "p.json").exists()


def test_run_real_serves_policy_none_and_prints_na_when_nothing_finished(tmp_path, capsys):
    # `none` (K = 0) crashed in the drafter proxy (max() of an empty tensor); a run in which no request finished
    # crashed printing its per-user speed (None) after writing its files
    import json

    assert main(["run-real", "--policy", "none", "--concurrency", "2", "--duration", "1",
                 "--random-input-len", "16", "--random-output-len", "8", "--out", str(tmp_path / "none")]) == 0
    s = json.loads((tmp_path / "none" / "summary.json").read_text())
    assert s["policy"] == "none" and s["tau"] == 1.0 and s["num_requests_completed"] > 0
    capsys.readouterr()
    assert main(["run-real", "--policy", "fixed:7", "--concurrency", "1", "--duration", "0.05",
                 "--random-input-len", "2000", "--random-output-len", "2000", "--out", str(tmp_path / "short")]) == 0
    out = capsys.readouterr().out
    assert "0 requests" in out and "per-user median n/a tok/s" in out


def test_run_real_live_refuses_policy_none(tmp_path, capsys):
    assert main(["run-real", "--live", "--policy", "none", "--duration", "1", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "none drafts nothing" in err and err.count("\n") == 1 and not (tmp_path / "r").exists()


@pytest.mark.parametrize("argv, flag", [
    (["run-real", "--live", "--acceptance", "/nonexistent.csv", "--duration", "1"], "--acceptance"),
    (["run-real", "--live", "--model", "small", "--duration", "1"], "--model"),
    (["run-real", "--live", "--drafter-layers", "2", "--duration", "1"], "--drafter-layers"),
    (["run-real", "--models", "models", "--duration", "1"], "--models"),
    (["run-real", "--live-drafter", "dflash", "--duration", "1"], "--live-drafter"),
    (["measure", "--prompts-dir", "x"], "--prompts-dir"),
    (["validate", "--live", "--model", "small"], "--model"),
    (["audit", "--models", "x"], "--models"),
    (["audit", "--profile", "cpu-tiny"], "--profile"),
    (["audit", "--live", "--steps", "5"], "--steps"),
])
def test_options_the_mode_would_ignore_are_refused(tmp_path, capsys, no_work, argv, flag):
    # run-real --live --acceptance /nonexistent.csv ran (the trained drafter's acceptance replaced it); --models
    # without --live, audit's live options without --live and --steps with it were dropped silently
    out = [] if argv[0] == "audit" else ["--out", str(tmp_path / "o")]
    assert main([*argv, *out]) == 2
    err = capsys.readouterr().err
    assert f"field '{flag}': would be ignored" in err and err.count("\n") == 1, err
    assert not no_work and not (tmp_path / "o").exists()


@pytest.mark.parametrize("argv, flag", [
    (["measure", "--drift-window", "0.5"], "--drift-window"),
    (["measure", "--no-drift", "--drift-threshold", "0.1"], "--drift-threshold"),
    (["measure", "--no-drift", "--drift-gate", "0.3"], "--drift-gate"),
    (["measure", "--no-drift", "--drift-attempts", "2"], "--drift-attempts"),
    (["validate", "--no-pair-cells", "--pair-baseline", "cell"], "--pair-baseline"),
    (["validate", "--no-drift", "--pair-baseline", "cell"], "--pair-baseline"),
    (["validate", "--context-spread-from", "x.csv", "--cell-spread", "workload"], "--cell-spread"),
])
def test_sweep_options_the_command_would_not_read_are_refused(tmp_path, capsys, no_work, argv, flag):
    out = tmp_path / ("p.json" if argv[0] == "measure" else "v")
    assert main([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"field '{flag}': would be ignored" in err and err.count("\n") == 1, err
    assert not no_work and not out.exists()
