torch = __import__("pytest").importorskip("torch")

import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import pandas as pd  # noqa: E402

from dsparksim.profile import load_profile  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def test_gpu_checklist_runs_in_tiny_cpu_mode(tmp_path):
    env = dict(os.environ, PYTHON=sys.executable)
    r = subprocess.run(["bash", str(REPO / "scripts" / "gpu_checklist.sh"), str(tmp_path / "out"), "--tiny"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    out = tmp_path / "out"
    prof = load_profile(str(out / "cpu-checklist-tiny.json"))
    assert prof.metadata["grid"]["contexts"] == [16, 48]
    df = pd.read_csv(out / "validation" / "errors.csv")
    assert sorted(set(df["policy"])) == ["confidence", "fixed:7", "mtp1"] and sorted(set(df["users"])) == [1, 2, 4]
    assert (out / "validation" / "REPORT.md").is_file()
    log = (out / "checklist.log").read_text()
    assert "done in" in log
    # the validation table and the drift seen are in the log (what a GPU session reports back)
    assert "| policy | users | throughput_rel_err" in log and "## Machine drift" in log and "Reference cell" in log
