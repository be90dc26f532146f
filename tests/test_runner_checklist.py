torch = __import__("pytest").importorskip("torch")

import os  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tarfile  # noqa: E402
from pathlib import Path  # noqa: E402

import pandas as pd  # noqa: E402

from dsparksim.cost.profile import load_profile  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def _device_run(tmp_path, budget=None):
    """scripts/gpu_checklist_device.sh --tiny as the device call runs it: $OUT is what comes back, the work folder
    is the checklist's own output; no wheels to install (this environment has the dependencies)."""
    (tmp_path / "nowheels").mkdir()
    env = dict(os.environ, PYTHON=sys.executable, OUT=str(tmp_path / "out"), CHECKLIST_WORK=str(tmp_path / "work"),
               CHECKLIST_WHEELS=str(tmp_path / "nowheels"))
    if budget is not None:
        env["CHECKLIST_BUDGET_S"] = str(budget)
    return subprocess.run(["bash", str(REPO / "scripts" / "gpu_checklist_device.sh"), "--tiny"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def test_gpu_checklist_runs_in_tiny_cpu_mode_and_packs_for_the_device_tool(tmp_path):
    r = _device_run(tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    work = tmp_path / "work"
    prof = load_profile(str(work / "cpu-checklist-tiny.json"))
    assert prof.metadata["grid"]["contexts"] == [16, 48]
    df = pd.read_csv(work / "validation" / "errors.csv")
    assert sorted(set(df["policy"])) == ["confidence", "fixed:7", "mtp1"] and sorted(set(df["users"])) == [1, 2, 4]
    assert (work / "validation" / "REPORT.md").is_file()
    log = (work / "checklist.log").read_text()
    assert "done in" in log
    # stages in the order that keeps the profile if the budget runs out, each marked done
    assert log.index("== (a) done") < log.index("== (c) done") < log.index("== (b) done")
    # the validation table and the drift seen are in the log (what a GPU session reports back)
    assert "| policy | users | throughput_rel_err" in log and "## Machine drift" in log and "Reference cell" in log
    # what comes back from a device call: <= 8 plain files, no folders, names of letters, digits, '.', '_', '-'
    out = sorted((tmp_path / "out").iterdir())
    assert 0 < len(out) <= 8 and all(p.is_file() and re.fullmatch(r"[A-Za-z0-9._-]+", p.name) for p in out)
    names = {p.name for p in out}
    assert {"checklist.log", "environment.txt", "cpu-checklist-tiny.json", "validation_REPORT.md",
            "validation_errors.csv", "builder_vs_measured.md", "checklist_all.tgz"} <= names
    assert all(p.stat().st_size < 15_000_000 for p in out)
    assert pd.read_csv(tmp_path / "out" / "validation_errors.csv").equals(df)
    with tarfile.open(tmp_path / "out" / "checklist_all.tgz") as t:
        members = set(t.getnames())
    assert "work/validation/errors.csv" in members and "work/cpu-checklist-tiny.json" in members
    assert "dsparksim" in (tmp_path / "out" / "environment.txt").read_text()


def test_gpu_checklist_over_budget_says_so_and_writes_no_profile(tmp_path):
    # 1 s: the measure stage is killed while it loads; the log must say the run stopped, and no profile (nothing
    # partial) may be packed as if the stage had finished
    r = _device_run(tmp_path, budget=1)
    assert r.returncode in (124, 137), r.stdout[-2000:] + r.stderr[-2000:]
    log = (tmp_path / "out" / "checklist.log").read_text()
    assert "STOPPED: the checklist ran past its budget of 1 s" in log and "== (a) done" not in log
    assert not list((tmp_path / "out").glob("*.json")) and (tmp_path / "out" / "checklist_all.tgz").is_file()
