"""A runner command that fails after its argument checks leaves its output as it found it (house rule: partial
results are never written as if complete, and no file that existed before the command is deleted).

Each test makes the command fail mid-way by monkeypatching one of its steps to raise, then checks --out."""
torch = __import__("pytest").importorskip("torch")

import json  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from dsparksim.cost.profile import read_profile_dict  # noqa: E402
from dsparksim.results.outputs import previous_kept_on_error  # noqa: E402
from dsparksim.runner import validate as val  # noqa: E402
from dsparksim.runner.validate import ValidateConfig, validate  # noqa: E402


def _tree(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def _stub_until_drift_monitor(monkeypatch, fail: BaseException) -> list[str]:
    """validate's model work replaced by stubs; the profile 'measured' is the shipped cpu-tiny one, so lengths.csv,
    profile.json and profile_raw.json are written before the drift monitor (the step after) raises ``fail``."""
    prof = read_profile_dict("cpu-tiny")[0]
    calls: list[str] = []
    monkeypatch.setattr(val, "load_target", lambda *a, **k: (None, None, None))
    monkeypatch.setattr(val, "build_models", lambda *a, **k: (None, None))
    monkeypatch.setattr(val, "reference_probe", lambda *a, **k: (lambda: 1.0))
    monkeypatch.setattr(val, "measure", lambda *a, **k: calls.append("measure") or (json.loads(json.dumps(prof)),
                                                                                     {"block": []}))

    def boom(*a, **k):
        calls.append("drift_monitor")
        raise fail

    monkeypatch.setattr(val, "drift_monitor", boom)
    return calls


VC = ValidateConfig(policies=("fixed:7",), concurrency=(1,))


@pytest.mark.parametrize("fail", [RuntimeError("boom"), KeyboardInterrupt()])
def test_validate_failing_mid_way_leaves_no_new_out(tmp_path, monkeypatch, fail):
    calls = _stub_until_drift_monitor(monkeypatch, fail)
    out = tmp_path / "new" / "v"
    with pytest.raises(type(fail)):
        validate(VC, out, progress=False, log=lambda s: None)
    assert calls == ["measure", "drift_monitor"]       # it failed after writing lengths.csv and profile.json
    assert not (tmp_path / "new").exists()              # the folders it created are gone too
    assert list(tmp_path.iterdir()) == []               # and no staging folder is left beside


def test_validate_failing_mid_way_keeps_an_earlier_validation(tmp_path, monkeypatch):
    calls = _stub_until_drift_monitor(monkeypatch, RuntimeError("boom"))
    out = tmp_path / "v"
    (out / "runs" / "fixed_7-c1" / "real").mkdir(parents=True)
    for name, text in (("REPORT.md", "old report"), ("summary.json", "{}"), ("lengths.csv", "old lengths"),
                       ("profile.json", "old profile"), ("runs/fixed_7-c1/real/summary.json", "old run")):
        (out / name).write_text(text)
    before = _tree(out)
    with pytest.raises(RuntimeError, match="boom"):
        validate(VC, out, progress=False, log=lambda s: None)
    assert calls == ["measure", "drift_monitor"]
    assert _tree(out) == before                          # every earlier file back, byte for byte, nothing new
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v"]


def test_validate_keeps_a_given_profile_inside_out(tmp_path, monkeypatch):
    """--profile OUT/profile.json is an input: it is neither moved aside nor removed when the validation fails."""
    _stub_until_drift_monitor(monkeypatch, RuntimeError("boom"))
    out = tmp_path / "v"
    out.mkdir()
    src, _ = read_profile_dict("cpu-tiny")
    (out / "profile.json").write_text(json.dumps(src))
    seen = []
    monkeypatch.setattr(val, "drift_monitor", lambda *a, **k: seen.append((out / "profile.json").is_file())
                        or (_ for _ in ()).throw(RuntimeError("boom")))
    vc = ValidateConfig(policies=("fixed:7",), concurrency=(1,), profile=str(out / "profile.json"))
    with pytest.raises(RuntimeError):
        validate(vc, out, progress=False, log=lambda s: None)
    assert seen == [True]                                # in place while the validation ran
    assert sorted(p.name for p in out.iterdir()) == ["profile.json"]
    assert json.loads((out / "profile.json").read_text()) == src


def test_previous_kept_on_error_replaces_only_on_success(tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    (out / "a.txt").write_text("old a")
    (out / "user.txt").write_text("not ours")
    with previous_kept_on_error(out, ["a.txt", "b.txt"]) as d:
        assert not (d / "a.txt").exists()                # the earlier run's file is aside while this one runs
        (d / "b.txt").write_text("new b")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o"]
    assert _tree(out) == {"b.txt": b"new b", "user.txt": b"not ours"}


REPO = Path(__file__).resolve().parents[1]


def test_measure_writes_neither_file_when_the_raw_records_fail(tmp_path, monkeypatch):
    """`measure --out P --raw R`: the raw records failed to serialise after the profile was written (a new profile
    without its records); now neither is written."""
    import dsparksim.runner.measure as measure_mod
    from cli_guard import run_cli
    prof = read_profile_dict("cpu-tiny")[0]
    monkeypatch.setattr(measure_mod, "measure", lambda *a, **k: (prof, {"block": [object()]}))
    o = run_cli(["measure", "--out", str(tmp_path / "p.json"), "--raw", str(tmp_path / "raw.json"), "--quiet"])
    assert isinstance(o.exc, TypeError), o.describe()      # the stub's failure, escaped as it came
    assert list(tmp_path.iterdir()) == []


def test_report_failing_mid_way_keeps_an_earlier_report(tmp_path, monkeypatch):
    from dsparksim.backend import report as rep
    out = tmp_path / "rep"
    rep.write_report(REPO / "models", REPO / "traces", out)
    before = _tree(out)
    assert set(before) == set(rep.REPORT_FILES)

    def boom(x):
        raise RuntimeError("boom")

    monkeypatch.setattr(rep, "_clean", boom)                # the step after the plot
    with pytest.raises(RuntimeError, match="boom"):
        rep.write_report(REPO / "models", REPO / "traces", out)
    assert _tree(out) == before                             # no new quality.png beside the old summary and text
    with pytest.raises(RuntimeError, match="boom"):
        rep.write_report(REPO / "models", REPO / "traces", tmp_path / "new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rep"]


def test_collect_failing_on_a_later_trace_replaces_none(tmp_path, monkeypatch):
    from dsparksim.backend import collect as col
    from dsparksim.backend.config import preset
    cfg = preset("smoke")
    out = tmp_path / "traces"
    out.mkdir()
    for kind in ("dspark", "dflash"):
        (out / f"real_{kind}_k{cfg.collect.K}.csv.gz").write_bytes(b"earlier " + kind.encode())
    before = _tree(out)
    monkeypatch.setattr(col, "load_models", lambda m: (cfg, None, None, {"sha256": "x"}, {}))
    monkeypatch.setattr(col, "_checked_drafter", lambda *a: (None, None))
    monkeypatch.setattr(col, "check_replaceable", lambda p: None)
    monkeypatch.setattr(col, "build_corpus", lambda *a: None)
    monkeypatch.setattr(col, "_decode_trace", lambda *a: {})

    def write_one(folder, kind, *a):
        if kind == "dflash":
            raise OSError(28, "No space left on device")
        p = folder / f"real_{kind}_k{cfg.collect.K}.csv.gz"
        p.write_bytes(b"new " + kind.encode())
        return p

    monkeypatch.setattr(col, "_write_one", write_one)
    with pytest.raises(OSError, match="No space"):
        col.collect(tmp_path / "models", out, ("dspark", "dflash"), progress=False, threads=1)
    assert _tree(out) == before


@pytest.mark.parametrize("fail", [False, True])
def test_previous_kept_on_error_never_takes_an_existing_aside_folder(tmp_path, fail):
    """A killed run (SIGKILL between the two renames) leaves the earlier results in .OUT.previous-<pid>, their only
    copy; a later run that reuses that pid (containers number processes alike) moved its own earlier files into that
    folder, over the killed run's, and deleted it on success."""
    import os

    out = tmp_path / "o"
    out.mkdir()
    (out / "a.txt").write_text("old a")
    stale = tmp_path / f".o.previous-{os.getpid()}"
    stale.mkdir()
    (stale / "a.txt").write_text("a killed run's earlier a")
    with pytest.raises(RuntimeError) if fail else __import__("contextlib").nullcontext():
        with previous_kept_on_error(out, ["a.txt"]) as d:
            (d / "a.txt").write_text("new a")
            if fail:
                raise RuntimeError("mid-way")
    assert _tree(stale) == {"a.txt": b"a killed run's earlier a"}
    assert _tree(out) == {"a.txt": b"old a" if fail else b"new a"}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["o", stale.name])


def test_previous_kept_on_error_through_a_symlinked_out(tmp_path):
    """--out a symlink to a folder: the link stays a link, the folder behind it gets the new files."""
    real = tmp_path / "real"
    real.mkdir()
    (real / "a.txt").write_text("old a")
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(RuntimeError):
        with previous_kept_on_error(link, ["a.txt"]) as d:
            (d / "a.txt").write_text("new a")
            raise RuntimeError("mid-way")
    assert link.is_symlink() and _tree(real) == {"a.txt": b"old a"}
    with previous_kept_on_error(link, ["a.txt"]) as d:
        (d / "a.txt").write_text("new a")
    assert link.is_symlink() and _tree(real) == {"a.txt": b"new a"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "real"]
