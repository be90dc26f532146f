"""The torch runner's commands refuse bad options before any model is built (hostile-tester findings 2026-12-03:
--threads 0 wrote a garbage profile, --seed -3 / --device cuda / an unwritable --out ended in tracebacks after
the work, validate ran the default policies for an empty list and measured before refusing --concurrency 0)."""
from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

import dsparksim.runner.timing as timing  # noqa: E402
import dsparksim.runner.validate as validate_mod  # noqa: E402
from cli_guard import stub_runner_work  # noqa: E402
from dsparksim.cli.main import main  # noqa: E402


@pytest.fixture
def no_work(monkeypatch):
    return stub_runner_work(monkeypatch)


CASES = [
    (["measure", "--threads", "0"], "--threads", "at least 1 CPU thread"),
    (["measure", "--threads", "-1"], "--threads", "got -1"),
    (["measure", "--seed", "-3"], "--seed", "non-negative"),
    (["measure", "--temperature", "-1"], "--temperature", ">= 0"),
    (["measure", "--temperature", "nan"], "--temperature", ">= 0"),
    (["measure", "--device", "tpu"], "--device", "not a torch device"),
    (["measure", "-K", "300"], "--num-speculative-tokens", "1..15"),
    (["measure", "--contexts", "16,16"], "--contexts", "each context once"),
    (["validate", "--concurrency", "0"], "--concurrency", "user counts >= 1"),
    (["validate", "--policies", ","], "--policies", "at least one policy"),
    (["validate", "--policies", "fixed:3,fixed:3"], "--policies", "each policy once"),
    (["validate", "--max-error", "-1"], "--max-error", "> 0"),
    (["validate", "--profile", "cpu-tiny", "--n-req", "1,2"], "--n-req", "drop --n-req or --profile"),
    (["validate", "-K", "3", "--profile", "cpu-tiny"], "-K", "measured with K=7 but this validation uses K=3"),
]


@pytest.mark.parametrize("argv, flag, text", CASES)
def test_bad_runner_options_are_refused_before_any_work(tmp_path, capsys, no_work, argv, flag, text):
    out = tmp_path / ("p.json" if argv[0] == "measure" else "v")
    assert main([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"field '{flag}'" in err and text in err, err
    assert not no_work and not out.exists()


def test_cuda_without_cuda_is_one_line(tmp_path, capsys, no_work):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    for cmd in (["measure"], ["validate"], ["run-real", "--duration", "2"]):
        assert main([*cmd, "--device", "cuda", "--out", str(tmp_path / "o")]) == 2
        assert "CUDA is not available" in capsys.readouterr().err
    assert not no_work


def test_measure_out_is_checked_before_the_sweep(tmp_path, capsys, no_work):
    assert main(["measure", "--out", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err
    f = tmp_path / "f"
    f.write_text("x")
    assert main(["measure", "--out", str(f / "p.json")]) == 2 and not no_work


def test_validate_out_takes_only_a_validation_folder(tmp_path, capsys, no_work, monkeypatch):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("x")
    assert main(["validate", "--out", str(mine)]) == 2
    assert "no validation wrote (notes.txt)" in capsys.readouterr().err
    monkeypatch.chdir(mine)
    assert main(["validate", "--out", "."]) == 2
    assert "working directory" in capsys.readouterr().err
    assert not no_work and sorted(p.name for p in mine.iterdir()) == ["notes.txt"]


def test_validate_sets_an_earlier_validations_results_aside_and_back_on_failure(tmp_path, monkeypatch):
    """While a validation runs, an earlier one's files are out of OUT (its runs/ never stands beside the new
    runs); when it fails they are put back as they were (they were deleted at the start, test_runner_partial_outputs
    has the mid-way failures)."""
    out = tmp_path / "v"
    (out / "runs" / "gone-c1").mkdir(parents=True)
    for name in ("REPORT.md", "summary.json", "errors.csv", "profile.json"):
        (out / name).write_text("old")

    class Stop(Exception):
        pass

    seen = []

    def stop(*a, **k):
        seen.append(sorted(p.name for p in out.iterdir()))
        raise Stop

    monkeypatch.setattr(validate_mod, "build_models", stop)
    with pytest.raises(Stop):
        main(["validate", "--policies", "fixed:3", "--concurrency", "1", "--out", str(out)])
    assert seen == [[]]
    assert sorted(p.name for p in out.iterdir()) == ["REPORT.md", "errors.csv", "profile.json", "runs", "summary.json"]
    assert (out / "runs" / "gone-c1").is_dir() and (out / "REPORT.md").read_text() == "old"


def test_validate_profile_by_shipped_name_and_a_truncated_profile(tmp_path, capsys, no_work):
    bad = tmp_path / "trunc.json"
    bad.write_text(json.dumps({"name": "x", "verify": {"M": [1, 2]}})[:-5])
    assert main(["validate", "--profile", str(bad), "--out", str(tmp_path / "v")]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "not valid JSON" in err and "Traceback" not in err
    assert main(["validate", "--profile", "no-such-profile", "--out", str(tmp_path / "v")]) == 2
    assert "unknown profile 'no-such-profile'" in capsys.readouterr().err and not no_work


def test_a_corrupt_checkpoint_is_one_line(tmp_path, capsys):
    models = tmp_path / "models"
    models.mkdir()
    (models / "target.pt").write_bytes(b"\x00" * 1000)
    assert main(["measure", "--live", "--models", str(models), "--out", str(tmp_path / "p.json")]) == 2
    err = capsys.readouterr().err
    assert "field '--models'" in err and "not a readable target checkpoint" in err
    (tmp_path / "bin.json").write_bytes(b"garbage")
    assert main(["measure", "--model", f"ckpt:{tmp_path / 'bin.json'}", "--out", str(tmp_path / "p.json")]) == 2
    assert "field '--model'" in capsys.readouterr().err


def test_a_context_that_cannot_fit_is_refused_before_any_cell(tmp_path, capsys, monkeypatch):
    timed = []
    monkeypatch.setattr(timing, "time_cell", lambda *a, **k: timed.append(1) or [])
    assert main(["measure", "--n-req", "1,2", "--contexts", "100000000", "--reps", "3", "--warmup", "1",
                 "--no-drift", "--out", str(tmp_path / "p.json")]) == 2
    err = capsys.readouterr().err
    assert "context 100000000" in err and "holds about" in err
    assert not timed and not (tmp_path / "p.json").exists()


def test_report_needs_the_models_directory(tmp_path, capsys):
    assert main(["report", "--models", str(tmp_path / "none"), "--out", str(tmp_path / "rep")]) == 2
    assert "models directory not found" in capsys.readouterr().err and not (tmp_path / "rep").exists()


def test_run_real_says_when_requests_outgrow_the_profiles_measured_contexts(capsys):
    import pandas as pd

    from dsparksim.cli.runner import _warn_beyond_measured

    from dsparksim.cost.profile import load_profile

    class Out:       # a finished run: its per-request table and the profile it loaded are read
        def __init__(self, p, e, rej, profile):
            self.df = pd.DataFrame({"prompt_tokens": p, "emitted_tokens": e, "rejected": rej})
            self.inputs = {"profile": {"metadata": load_profile(profile).metadata}}

        def requests(self):
            return self.df

    # cpu-tiny's grid contexts are 32/96/160: its cells reach 1.5 x 160 = 240 tokens
    _warn_beyond_measured(Out([30, 100, 200], [40, 100, 41], [False, False, False], "cpu-tiny"))
    err = capsys.readouterr().err
    assert "1 of 3 requests reached contexts above 240 tokens (up to 241)" in err
    _warn_beyond_measured(Out([30, 100, 5000], [40, 100, 0], [False, False, True], "cpu-tiny"))  # rejected: never served
    _warn_beyond_measured(Out([30], [40], [False], "h100-llama2-7b-tp1"))   # no measured grid: nothing to say
    assert capsys.readouterr().err == ""
