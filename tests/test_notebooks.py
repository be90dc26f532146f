"""The notebooks: stored without outputs, and they execute headless (small settings) with the expected results."""
from __future__ import annotations

import time
from pathlib import Path

import pandas as pd
import pytest

nbformat = pytest.importorskip("nbformat", reason="notebook tests need the test extra (nbformat, nbclient)")
nbclient = pytest.importorskip("nbclient", reason="notebook tests need the test extra (nbformat, nbclient)")

NB_DIR = Path(__file__).resolve().parents[1] / "notebooks"
NOTEBOOKS = ["frontier.ipynb", "whatif.ipynb"]


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_is_stored_without_outputs(name):
    nb = nbformat.read(NB_DIR / name, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code, "a notebook without code"
    for i, c in enumerate(code):
        assert c.get("outputs") == [] and c.get("execution_count") is None, f"{name}: code cell {i} has outputs"


def _execute(name: str, out: Path, monkeypatch) -> tuple[object, float]:
    monkeypatch.setenv("DSPARKSIM_NOTEBOOK_FAST", "1")
    monkeypatch.setenv("DSPARKSIM_NOTEBOOK_OUT", str(out))
    nb = nbformat.read(NB_DIR / name, as_version=4)
    t0 = time.perf_counter()
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(NB_DIR)}}).execute()
    return nb, time.perf_counter() - t0


def _outputs(nb, kind: str) -> list:
    return [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if kind in o.get("data", {})]


def test_frontier_notebook_executes(tmp_path, monkeypatch):
    nb, wall = _execute("frontier.ipynb", tmp_path, monkeypatch)
    assert wall < 60, wall
    assert _outputs(nb, "image/png"), "no frontier figure"
    table = pd.read_csv(tmp_path / "frontier" / "results.csv")
    # FAST settings: 2 profiles x 2 acceptance sources x 3 policies x 3 loads, all finished
    assert len(table) == 36 and set(table["cfg.acceptance"]) == {"dspark", "traces/sample_dspark_k7.csv"}
    html = "".join(o["data"]["text/html"] for o in _outputs(nb, "text/html"))
    assert "confidence" in html and "oracle" in html


def test_whatif_notebook_executes(tmp_path, monkeypatch):
    nb, wall = _execute("whatif.ipynb", tmp_path, monkeypatch)
    assert wall < 60, wall
    assert _outputs(nb, "image/png"), "no frontier figure"
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "SLO: tps_user_median >= 150" in text
    # the scenarios' cells all landed in one cache (5 scenarios x 2 policies x 3 loads + capacity probes)
    assert len(list((tmp_path / "whatif" / "cells").glob("*/summary.json"))) >= 30
