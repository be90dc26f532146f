"""`train`, `collect` and `report` under hostile input (hostile-tester findings 2026-12-05): a garbage or
mistyped calibration.json / training_log.json ended in tracebacks, an unknown name late in --drafters was refused
after the first trace was written, --drafters '' wrote nothing with exit 0, a drafter's trace depended on which
other drafters the command collected, --out '' trained into the working directory, --stages tokenizer failed
after writing, --threads 100000 crashed, report picked one of two traces of a drafter silently."""
from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("tokenizers")

from dsparksim.cli.main import main  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma".split()


def _prompts(root: Path) -> Path:
    """A tiny prompts directory in the layout of ../shared/data/prompts (30 prompts per file)."""
    root.mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(("gsm8k", "math500", "arena-hard-v2", "mt-bench")):
        lines = [json.dumps({"turns": [f"{name} question {j}: " + " ".join(WORDS[(i + j + k) % len(WORDS)]
                                                                         for k in range(12))]})
                 for j in range(30)]
        (root / f"{name}.jsonl").write_text("\n".join(lines) + "\n")
    return root


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    prompts = _prompts(root / "prompts")
    assert main(["train", "--preset", "smoke", "--out", str(root / "models"), "--prompts-dir", str(prompts),
                 "--quiet"]) == 0
    return root, prompts


def _trace_rows(path: Path) -> list[str]:
    return gzip.decompress(path.read_bytes()).decode().splitlines()[1:]     # the rows, not the metadata line


def test_a_drafters_trace_does_not_depend_on_the_others_collected(smoke, tmp_path):
    root, prompts = smoke
    common = ["--models", str(root / "models"), "--prompts-dir", str(prompts), "--quiet"]
    assert main(["collect", *common, "--out", str(tmp_path / "all")]) == 0
    assert main(["collect", *common, "--drafters", "eagle3", "--out", str(tmp_path / "one")]) == 0
    assert sorted(p.name for p in (tmp_path / "one").iterdir()) == ["real_eagle3_k3.csv.gz"]
    assert _trace_rows(tmp_path / "one" / "real_eagle3_k3.csv.gz") == \
        _trace_rows(tmp_path / "all" / "real_eagle3_k3.csv.gz")


@pytest.mark.parametrize("drafters, text", [
    ("dspark,foo", "unknown drafter 'foo'"),
    ("", "expected at least one"),
    (" , ", "expected at least one"),
    ("dspark,dspark", "each drafter once"),
])
def test_bad_drafter_lists_write_nothing(smoke, tmp_path, capsys, drafters, text):
    root, prompts = smoke
    out = tmp_path / "traces"
    assert main(["collect", "--models", str(root / "models"), "--prompts-dir", str(prompts), "--quiet",
                 "--drafters", drafters, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "field '--drafters'" in err and text in err and err.count("\n") == 1
    assert not out.exists()


def _models(tmp_path: Path, log, cal) -> Path:
    m = tmp_path / "models"
    m.mkdir()
    (m / "training_log.json").write_text(log if isinstance(log, str) else json.dumps(log))
    (m / "calibration.json").write_text(cal if isinstance(cal, str) else json.dumps(cal))
    return m


GOOD_CAL = {"dspark": {"temperatures": [1.0, 1.0, 1.0]}}


@pytest.mark.parametrize("log, cal, where, text", [
    ({"preset": "smoke"}, "garbage", "calibration.json:1", "invalid JSON"),
    ({"preset": "smoke"}, [3], "calibration.json", "expected a JSON object"),
    ({"preset": "smoke"}, {"dspark": 3}, "calibration.json: field 'dspark'", "expected an object"),
    ({"preset": "smoke"}, {"dspark": {"temperatures": [1, "nan", 1]}}, "field 'dspark.temperatures[1]'",
     "finite number > 0, got 'nan'"),
    ({"preset": "smoke"}, {"dspark": {"temperatures": [1, 1, 0]}}, "field 'dspark.temperatures[2]'", "got 0"),
    ({"preset": "smoke"}, {"dspark": {"temperatures": [1, -1, 1]}}, "field 'dspark.temperatures[1]'", "got -1"),
    ([1], GOOD_CAL, "training_log.json", "expected a JSON object"),
    ({"preset": 5}, GOOD_CAL, "training_log.json: field 'preset'", "got 5"),
    ({"preset": "zzz"}, GOOD_CAL, "training_log.json: field 'preset'", "got 'zzz'"),
])
def test_bad_calibration_or_training_log_is_one_line(tmp_path, capsys, log, cal, where, text):
    m = _models(tmp_path, log, cal)
    out = tmp_path / "traces"
    assert main(["collect", "--models", str(m), "--drafters", "dspark", "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert where in err and text in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert not out.exists()


def test_collect_refuses_a_preset_whose_block_size_the_drafters_were_not_trained_for(tmp_path, capsys):
    # the committed drafters are K=7 (quick); smoke collects K=3: it decoded, and only the calibration's
    # temperature count caught it (an edited calibration.json would not have)
    assert main(["collect", "--models", str(REPO / "models"), "--preset", "smoke", "--drafters", "dflash",
                 "--out", str(tmp_path / "t"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "dflash.pt: field 'K'" in err and "trained for K=7" in err and "collects K=3" in err
    assert not (tmp_path / "t").exists()


@pytest.mark.parametrize("argv, flag", [
    (["train", "--preset", "smoke", "--out", ""], "--out"),
    (["train", "--preset", "smoke", "--out", "x", "--prompts-dir", ""], "--prompts-dir"),
    (["collect", "--models", "", "--out", "x"], "--models"),
    (["collect", "--out", ""], "--out"),
    (["report", "--out", ""], "--out"),
    (["report", "--traces", " ", "--out", "x"], "--traces"),
])
def test_an_empty_path_is_refused_not_the_working_directory(tmp_path, monkeypatch, capsys, argv, flag):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"field '{flag}'" in err and "empty path" in err
    assert list(tmp_path.iterdir()) == []


def test_threads_above_the_limit_are_refused(tmp_path, capsys):
    assert main(["train", "--preset", "smoke", "--threads", "100000", "--out", str(tmp_path / "m")]) == 2
    assert "field '--threads'" in capsys.readouterr().err and not (tmp_path / "m").exists()


def test_stages_read_only_what_they_need_and_check_it_first(smoke, tmp_path, capsys):
    _, prompts = smoke
    out = tmp_path / "m"
    assert main(["train", "--preset", "smoke", "--stages", "drafters", "--out", str(out),
                 "--prompts-dir", str(prompts), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "tokenizer.json: field '--stages'" in err and "needed by --stages drafters" in err
    assert not out.exists()
    # the tokenizer stage alone: it trained the tokenizer, then failed loading target.pt
    assert main(["train", "--preset", "smoke", "--stages", "tokenizer", "--out", str(out),
                 "--prompts-dir", str(prompts), "--quiet"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["tokenizer.json", "training_log.json"]


def test_report_refuses_two_traces_of_one_drafter_and_a_file_as_out(smoke, tmp_path, capsys):
    root, _ = smoke
    traces = tmp_path / "traces"
    traces.mkdir()
    shutil.copy(REPO / "traces" / "real_dspark_k7.csv.gz", traces)
    shutil.copy(REPO / "traces" / "real_dspark_k7.csv.gz", traces / "real_dspark_k3.csv.gz")
    assert main(["report", "--models", str(root / "models"), "--traces", str(traces),
                 "--out", str(tmp_path / "rep")]) == 2
    err = capsys.readouterr().err
    assert "2 dspark traces (real_dspark_k3.csv.gz, real_dspark_k7.csv.gz)" in err and not (tmp_path / "rep").exists()
    (traces / "real_dspark_k3.csv.gz").unlink()
    (tmp_path / "afile").write_text("mine")
    assert main(["report", "--models", str(root / "models"), "--traces", str(traces),
                 "--out", str(tmp_path / "afile")]) == 2
    assert "afile: field '--out': is a file" in capsys.readouterr().err
    assert (tmp_path / "afile").read_text() == "mine"


@pytest.mark.parametrize("log, cal, text", [
    ("[", GOOD_CAL, "training_log.json:1: invalid JSON"),
    ({"config": []}, GOOD_CAL, "training_log.json: unexpected content"),
    ({}, "[3]", "calibration.json: expected a JSON object"),
    ({}, {"dspark": {"temperatures": [1, 0]}}, "field 'dspark.temperatures[1]'"),
])
def test_report_bad_training_files_are_one_line(tmp_path, capsys, log, cal, text):
    m = _models(tmp_path, log, cal)
    traces = tmp_path / "traces"
    traces.mkdir()
    shutil.copy(REPO / "traces" / "real_mtp1_k1.csv.gz", traces)
    assert main(["report", "--models", str(m), "--traces", str(traces), "--out", str(tmp_path / "rep")]) == 2
    err = capsys.readouterr().err
    assert text in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert not (tmp_path / "rep").exists()


@pytest.mark.parametrize("edit, field, text", [
    (lambda ck: ck.pop("state_dict"), "state_dict", "expected the weights"),
    (lambda ck: ck.pop("config"), "config", "expected the model configuration"),
    (lambda ck: ck["config"].update(d_model=-4), "config.d_model", "integer >= 1, got -4"),
])
def test_a_mangled_target_checkpoint_is_one_line(smoke, tmp_path, capsys, edit, field, text):
    # missing keys were KeyError tracebacks, a negative size a RuntimeError from torch
    root, _ = smoke
    models = tmp_path / "models"
    shutil.copytree(root / "models", models)
    ck = torch.load(models / "target.pt", weights_only=True)
    edit(ck)
    torch.save(ck, models / "target.pt")
    assert main(["collect", "--models", str(models), "--out", str(tmp_path / "t"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"target.pt: field '{field}'" in err and text in err and err.count("\n") == 1, err
    assert main(["run-real", "--model", f"ckpt:{models / 'target.pt'}", "--no-profile-check", "--duration", "1",
                 "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "target.pt" in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert not (tmp_path / "t").exists() and not (tmp_path / "r").exists()


@pytest.mark.parametrize("missing", ["training_log.json", "calibration.json"])
def test_report_refuses_a_models_folder_without_its_training_files(tmp_path, capsys, missing):
    # the report's models and STS sections were silently left out
    m = _models(tmp_path, {"preset": "smoke"}, GOOD_CAL)
    (m / missing).unlink()
    traces = tmp_path / "traces"
    traces.mkdir()
    shutil.copy(REPO / "traces" / "real_mtp1_k1.csv.gz", traces)
    assert main(["report", "--models", str(m), "--traces", str(traces), "--out", str(tmp_path / "rep")]) == 2
    err = capsys.readouterr().err
    assert f"{missing}: field '--models': not found" in err and not (tmp_path / "rep").exists()


def test_an_interrupted_trace_write_leaves_no_truncated_trace(smoke, tmp_path, monkeypatch):
    import dsparksim.backend.collect as collect_mod

    root, prompts = smoke
    real = collect_mod.write_trace

    def interrupted(path, data, meta, **kw):
        if meta["drafter"] == "eagle3":
            Path(path).write_bytes(b"\x1f\x8b half a gzip stream")      # Ctrl-C in the middle of the write
            raise KeyboardInterrupt
        return real(path, data, meta, **kw)

    monkeypatch.setattr(collect_mod, "write_trace", interrupted)
    out = tmp_path / "traces"
    with pytest.raises(KeyboardInterrupt):
        collect_mod.collect(root / "models", out, ["dspark", "eagle3"], prompts_dir=prompts, progress=False,
                            threads=1)
    # no truncated trace, and no partial set either: collect renames its traces into place only once all are whole
    # (tests/test_runner_partial_outputs.py), so an interrupted run leaves --out as it found it
    assert not out.exists() or not any(out.iterdir()), sorted(p.name for p in out.iterdir())


def test_an_interrupted_checkpoint_save_leaves_the_old_file(smoke, tmp_path, monkeypatch):
    import dsparksim.backend.checkpoint as ckpt

    root, _ = smoke
    models = tmp_path / "models"
    shutil.copytree(root / "models", models)
    before = (models / "target.pt").read_bytes()

    def interrupted(obj, f):
        Path(f).write_bytes(b"PK half a zip")         # Ctrl-C in the middle of torch.save
        raise KeyboardInterrupt

    monkeypatch.setattr(ckpt.torch, "save", interrupted)
    target, _ = ckpt.load_target(models / "target.pt")
    with pytest.raises(KeyboardInterrupt):
        ckpt.save(models / "target.pt", "target", target.cfg, target, tokenizer_sha256="x")
    assert (models / "target.pt").read_bytes() == before
    assert sorted(p.name for p in models.iterdir()) == sorted(p.name for p in (root / "models").iterdir())


def test_validate_live_refuses_traces_not_collected_from_its_pair(smoke, tmp_path, capsys, monkeypatch):
    # the synthetic sample (another target) gave a 159% "error", the parametric `dspark` 181%, both exit 0
    import dsparksim.runner.validate as validate_mod

    built = []
    monkeypatch.setattr(validate_mod, "build_models", lambda *a, **k: built.append(1))
    root, prompts = smoke
    traces = tmp_path / "traces"
    assert main(["collect", "--models", str(root / "models"), "--prompts-dir", str(prompts), "--quiet",
                 "--drafters", "dspark,dflash,mtp1", "--out", str(traces)]) == 0
    other = tmp_path / "real_dspark_k3.csv.gz"     # the same trace, claimed for another target
    lines = gzip.decompress((traces / "real_dspark_k3.csv.gz").read_bytes()).decode().split("\n", 1)
    head = lines[0].split(" ", 2)
    meta = json.loads(head[2])
    meta["target"] = "some other model, sha256 0123456789ab"
    other.write_bytes(gzip.compress((f"{head[0]} {head[1]} {json.dumps(meta)}\n" + lines[1]).encode()))
    common = ["validate", "--live", "--models", str(root / "models"), "--prompts-dir", str(prompts), "-K", "3",
              "--policies", "fixed:3", "--concurrency", "1", "--mtp1-acceptance", str(traces / "real_mtp1_k1.csv.gz")]
    for acc, text in ((traces / "real_dflash_k3.csv.gz", "field 'drafter': the trace was recorded for drafter "
                       "'dflash', but --live serves 'dspark'"),
                      ("dspark", "field 'acceptance': --live compares the trained pair"),
                      (other, "field 'target': the trace was collected from another target")):
        out = tmp_path / "v"
        assert main([*common, "--acceptance", str(acc), "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert text in err and err.count("\n") == 1, err
        assert not out.exists() and not built


def test_collect_never_replaces_a_trace_it_did_not_write(smoke, tmp_path, capsys):
    root, prompts = smoke
    out = tmp_path / "traces"
    out.mkdir()
    (out / "real_dspark_k3.csv.gz").write_text("my notes")        # a user's file under the name collect writes
    common = ["collect", "--models", str(root / "models"), "--prompts-dir", str(prompts), "--quiet",
              "--drafters", "dspark", "--out", str(out)]
    assert main(common) == 2
    err = capsys.readouterr().err
    assert "real_dspark_k3.csv.gz: field '--out': exists and was not written by `dsparksim collect`" in err
    assert (out / "real_dspark_k3.csv.gz").read_text() == "my notes"
    (out / "real_dspark_k3.csv.gz").unlink()
    assert main(common) == 0 and main(common) == 0        # its own trace is replaced by the same command


def test_report_never_replaces_files_it_did_not_write(smoke, tmp_path, capsys):
    root, _ = smoke
    traces = tmp_path / "traces"
    traces.mkdir()
    shutil.copy(REPO / "traces" / "real_mtp1_k1.csv.gz", traces)
    run = tmp_path / "run"                          # e.g. a run's folder: its summary.json was overwritten
    run.mkdir()
    (run / "summary.json").write_text('{"mine": 1}')
    common = ["report", "--models", str(root / "models"), "--traces", str(traces)]
    assert main([*common, "--out", str(run)]) == 2
    assert "summary.json: field '--out': exists and no `dsparksim report` wrote it" in capsys.readouterr().err
    assert (run / "summary.json").read_text() == '{"mine": 1}'
    rep = tmp_path / "rep"
    assert main([*common, "--out", str(rep)]) == 0 and main([*common, "--out", str(rep)]) == 0   # its own: replaced


@pytest.mark.parametrize("argv", [
    ["train", "--preset", "smoke"],
    ["collect", "--drafters", "dspark"],
    ["report", "--models", str(REPO / "models"), "--traces", str(REPO / "traces")],
])
def test_an_out_that_cannot_be_created_is_one_line(tmp_path, capsys, argv):
    # FILE/sub was a NotADirectoryError traceback (collect's after decoding every drafter)
    f = tmp_path / "afile"
    f.write_text("mine")
    assert main([*argv, "--out", str(f / "sub")]) == 2
    err = capsys.readouterr().err
    assert "field '--out': cannot create" in err and "is a file" in err and err.count("\n") == 1, err
    assert f.read_text() == "mine"
