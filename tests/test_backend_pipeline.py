"""Smoke training (what CI runs instead of retraining), trace collection, round trip, committed artifacts,
and bad-input errors that name the file."""
import json
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("tokenizers")

import numpy as np  # noqa: E402

from dsparksim.acceptance import load_acceptance  # noqa: E402
from dsparksim.acceptance.trace_format import read_trace, write_trace  # noqa: E402
from dsparksim.backend.checkpoint import load_drafter, load_target  # noqa: E402
from dsparksim.backend.data import load_prompts  # noqa: E402
from dsparksim.backend.tokenizer import load_tokenizer  # noqa: E402
from dsparksim.errors import InputError  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
PROMPTS = REPO / ".." / "shared" / "data" / "prompts"
MODELS = REPO / "models"
TRACES = REPO / "traces"


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    if not PROMPTS.is_dir():
        pytest.skip("../shared/data/prompts not available")
    from dsparksim.backend.collect import collect
    from dsparksim.backend.config import preset
    from dsparksim.backend.train import run_pipeline
    root = tmp_path_factory.mktemp("smoke")
    log = run_pipeline(preset("smoke"), root / "models", prompts_dir=PROMPTS, progress=False, threads=1)
    paths = collect(root / "models", root / "traces", prompts_dir=PROMPTS, progress=False, threads=1)
    return root, log, paths


def test_smoke_training_writes_every_artifact(smoke):
    root, log, paths = smoke
    m = root / "models"
    for f in ("tokenizer.json", "target.pt", "mtp1.pt", "eagle3.pt", "dflash.pt", "dspark.pt", "calibration.json"):
        assert (m / f).is_file(), f
    assert set(log["seconds"]) >= {"tokenizer", "target", "mtp1", "eagle3", "dflash", "dspark", "calibrate"}
    cal = json.loads((m / "calibration.json").read_text())
    assert len(cal["dspark"]["temperatures"]) == 3 and len(cal["mtp1"]["temperatures"]) == 1


def test_collected_traces_round_trip_through_core_reader(smoke, tmp_path):
    root, _, paths = smoke
    assert sorted(p.name for p in paths) == ["real_dflash_k3.csv.gz", "real_dspark_k3.csv.gz",
                                             "real_eagle3_k3.csv.gz", "real_mtp1_k1.csv.gz"]
    tr = read_trace(root / "traces" / "real_dspark_k3.csv.gz")
    assert tr.K == 3 and set(tr.domain) == {"math", "code", "chat"}
    assert tr.raw_conf is not None and tr.metadata["drafter"] == "dspark" and tr.metadata["temperature"] == 1.0
    # smoke preset: 4 eval prompts x 1 sample x 3 blocks per domain
    assert tr.n_blocks == 3 * 4 * 3
    again = write_trace(tmp_path / "again.csv.gz", tr, tr.metadata)
    tr2 = read_trace(again)
    assert np.array_equal(tr2.accepted, tr.accepted) and np.allclose(tr2.conf, tr.conf, atol=1e-5)
    assert load_acceptance(str(root / "traces" / "real_mtp1_k1.csv.gz"), 1).K == 1


def test_missing_and_mismatched_checkpoints_name_the_file(smoke, tmp_path):
    root, _, _ = smoke
    m = root / "models"
    with pytest.raises(InputError, match="nowhere.pt"):
        load_target(tmp_path / "nowhere.pt")
    with pytest.raises(InputError, match=r"dflash\.pt.*kind"):          # a dflash file loaded as dspark
        target, meta = load_target(m / "target.pt")
        load_drafter(m / "dflash.pt", "dspark", target, meta["sha256"])
    target, meta = load_target(m / "target.pt")
    with pytest.raises(InputError, match=r"dspark\.pt.*target_sha256"):
        load_drafter(m / "dspark.pt", "dspark", target, "0" * 64)
    bad = tmp_path / "garbage.pt"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(InputError, match="garbage.pt"):
        load_target(bad)


def test_tokenizer_vocabulary_mismatch_is_an_error(smoke):
    root, _, _ = smoke
    with pytest.raises(InputError, match=r"tokenizer\.json.*vocab_size.*mismatch"):
        load_tokenizer(root / "models" / "tokenizer.json", expect_vocab=999, checkpoint="target.pt")


def test_collect_refuses_a_tokenizer_that_is_not_the_targets(smoke, tmp_path):
    root, _, _ = smoke
    from dsparksim.backend.collect import load_models
    m = tmp_path / "models"
    shutil.copytree(root / "models", m)
    tok = json.loads((m / "tokenizer.json").read_text())
    tok["model"]["vocab"] = dict(list(tok["model"]["vocab"].items())[:-1])        # one token fewer
    (m / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(InputError, match="tokenizer.json"):
        load_models(m)


@pytest.mark.parametrize("line,field", [('{"text": "hi"}', "turns"), ('{"turns": []}', "turns"),
                                        ('{"turns": ["a", 3]}', "turns"), ('["turns"]', "turns"),
                                        ("not json", None)])
def test_prompts_file_with_wrong_shape_names_file_and_line(tmp_path, line, field):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"turns": ["fine"]}\n' + line + "\n")
    with pytest.raises(InputError) as e:
        load_prompts(p)
    assert "bad.jsonl:2" in str(e.value)
    if field:
        assert f"'{field}'" in str(e.value)


def test_committed_checkpoints_load_and_fit_the_size_budget():
    if not (MODELS / "target.pt").is_file():
        pytest.skip("no committed checkpoints")
    from dsparksim.backend.collect import load_models
    cfg, tok, target, meta, cal = load_models(MODELS)
    for kind in ("mtp1", "eagle3", "dflash", "dspark"):
        load_drafter(MODELS / f"{kind}.pt", kind, target, meta["sha256"])
        assert kind in cal
    assert sum(p.stat().st_size for p in MODELS.glob("*.pt")) <= 30e6


@pytest.mark.parametrize("kind,K", [("dspark", 7), ("dflash", 7), ("eagle3", 7), ("mtp1", 1)])
def test_shipped_real_traces_read_and_cover_all_domains(kind, K):
    p = TRACES / f"real_{kind}_k{K}.csv.gz"
    if not p.is_file():
        pytest.skip(f"{p.name} not shipped")
    tr = read_trace(p)
    assert tr.K == K and tr.metadata["drafter"] == kind and tr.metadata["temperature"] == 1.0
    assert set(tr.domain) == {"math", "code", "chat"} and tr.raw_conf is not None
    assert "synthetic" not in tr.metadata["source"]


def test_report_is_regenerated_from_models_and_traces(smoke, tmp_path):
    root, _, _ = smoke
    from dsparksim.backend.report import write_report
    md = write_report(root / "models", root / "traces", tmp_path / "rep")
    text = md.read_text()
    summary = json.loads((tmp_path / "rep" / "summary.json").read_text())
    assert (tmp_path / "rep" / "quality.png").stat().st_size > 10_000
    assert set(summary["drafters"]) == {"dspark", "dflash", "eagle3", "mtp1"}
    tau = summary["drafters"]["dspark"]["domains"]["math"]["tau"]
    assert f"{tau:.3f}" in text and "tau(dspark) - tau(dflash)" in text
    with pytest.raises(InputError, match="no real_"):
        write_report(root / "models", tmp_path / "empty", tmp_path / "rep2")


def test_cli_collect_without_models_exits_2_naming_the_file(tmp_path, capsys):
    from dsparksim.cli.main import main
    rc = main(["collect", "--models", str(tmp_path / "none"), "--out", str(tmp_path / "t"), "--quiet"])
    assert rc == 2
    assert "training_log.json" in capsys.readouterr().err
    rc = main(["train", "--preset", "nope", "--out", str(tmp_path / "m"), "--quiet"])
    assert rc == 2 and "unknown preset" in capsys.readouterr().err
