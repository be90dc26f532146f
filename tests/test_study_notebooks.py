"""Every studies/*.ipynb is a plain nbformat-4 notebook whose code cells run, top to bottom, against the study
tables committed beside it (matplotlib's Agg backend; no jupyter needed), and draws at least one figure."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

STUDIES = Path(__file__).resolve().parents[1] / "studies"
NOTEBOOKS = sorted(STUDIES.glob("*.ipynb"))


def test_there_are_notebooks():
    assert NOTEBOOKS, f"no notebooks in {STUDIES}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    nb = json.loads(path.read_text())
    assert nb["nbformat"] == 4
    cells = nb["cells"]
    assert cells and cells[0]["cell_type"] == "markdown"
    assert "**Question.**" in "".join(cells[0]["source"])
    code = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    assert code
    monkeypatch.chdir(STUDIES)                # notebooks read their tables relative to studies/
    plt.close("all")
    ns: dict = {"__name__": "__notebook__"}
    try:
        for i, src in enumerate(code):
            exec(compile(src, f"{path.name}[code cell {i}]", "exec"), ns)
        assert plt.get_fignums(), f"{path.name} drew no figure"
    finally:
        plt.close("all")
    assert os.getcwd() == str(STUDIES)
