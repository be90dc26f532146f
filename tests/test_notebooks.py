"""The notebooks: stored without outputs, and they execute headless with the expected results.

FAST mode (DSPARKSIM_NOTEBOOK_FAST=1, tiny settings) runs in every test run. Full mode (the notebooks' real
settings, tens of minutes on 2 cores) is marked ``slow`` and skipped -- with that reason in the skip summary --
unless DSPARKSIM_SLOW=1: ``DSPARKSIM_SLOW=1 python -m pytest tests/test_notebooks.py -m slow -rs``.
"""
from __future__ import annotations

import os
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


SLOW = os.environ.get("DSPARKSIM_SLOW") == "1"
needs_slow = pytest.mark.skipif(not SLOW, reason="full-mode notebook run (tens of minutes): set DSPARKSIM_SLOW=1")


def _execute(name: str, out: Path, monkeypatch, fast: bool = True) -> tuple[object, float]:
    if fast:
        monkeypatch.setenv("DSPARKSIM_NOTEBOOK_FAST", "1")
    else:
        monkeypatch.delenv("DSPARKSIM_NOTEBOOK_FAST", raising=False)
    monkeypatch.setenv("DSPARKSIM_NOTEBOOK_OUT", str(out))
    nb = nbformat.read(NB_DIR / name, as_version=4)
    t0 = time.perf_counter()
    nbclient.NotebookClient(nb, timeout=120 if fast else 4 * 3600, kernel_name="python3",
                            resources={"metadata": {"path": str(NB_DIR)}}).execute()
    return nb, time.perf_counter() - t0


def _outputs(nb, kind: str) -> list:
    return [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if kind in o.get("data", {})]


def _text(nb) -> str:
    return "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)


def test_frontier_notebook_executes(tmp_path, monkeypatch):
    nb, wall = _execute("frontier.ipynb", tmp_path, monkeypatch)
    assert wall < 60, wall
    assert _outputs(nb, "image/png"), "no frontier figure"
    table = pd.read_csv(tmp_path / "frontier" / "results.csv")
    # FAST settings: 2 profiles x 2 acceptance sources x 4 policies (none, mtp1, confidence, oracle) x 3 loads
    assert len(table) == 48 and set(table["cfg.acceptance"]) == {"dspark", "traces/sample_dspark_k7.csv"}
    html = "".join(o["data"]["text/html"] for o in _outputs(nb, "text/html"))
    assert "confidence" in html and "oracle" in html and "none" in html


def test_whatif_notebook_executes(tmp_path, monkeypatch):
    nb, wall = _execute("whatif.ipynb", tmp_path, monkeypatch)
    assert wall < 60, wall
    assert _outputs(nb, "image/png"), "no frontier figure"
    text = _text(nb)
    assert "SLO: tps_user_median >= 150" in text
    # the scenarios' cells all landed in one cache (5 scenarios x 3 policies x 3 loads + capacity probes)
    assert len(list((tmp_path / "whatif" / "cells").glob("*/summary.json"))) >= 45


@pytest.mark.slow
@needs_slow
def test_frontier_notebook_full_mode(tmp_path, monkeypatch):
    """Full settings: every shipped profile x acceptance source it can price; the pairs it cannot are announced."""
    from dsparksim.acceptance import load_acceptance
    from dsparksim.cost.profile import list_profiles, load_profile

    nb, wall = _execute("frontier.ipynb", tmp_path, monkeypatch, fast=False)
    print(f"frontier.ipynb full mode: {wall:.0f} s")
    table = pd.read_csv(tmp_path / "frontier" / "results.csv")
    text = _text(nb)
    sources = ["dspark", "dflash", "eagle3", "traces/sample_dspark_k7.csv"]
    n_pairs = 0
    for prof in list_profiles():
        have = set(load_profile(prof).drafters)
        got = set(table.loc[table["cfg.profile"] == prof, "cfg.acceptance"])
        for acc in sources:
            drafter = load_acceptance(acc, 7).drafter
            if drafter in have:
                assert acc in got, (prof, acc)
                n_pairs += 1
            else:
                assert acc not in got and f"note: skipping {prof} x {acc}" in text, (prof, acc)
    assert len(table) == n_pairs * 8 * 8   # 8 policies (none included) x 8 loads per priced pair
    assert _outputs(nb, "image/png")


@pytest.mark.slow
@needs_slow
def test_whatif_notebook_full_mode(tmp_path, monkeypatch):
    nb, wall = _execute("whatif.ipynb", tmp_path, monkeypatch, fast=False)
    print(f"whatif.ipynb full mode: {wall:.0f} s")
    assert "SLO: tps_user_median >= 150" in _text(nb)
    # 5 scenarios x 5 policies (none included) x 7 loads, plus the capacity probes
    assert len(list((tmp_path / "whatif" / "cells").glob("*/summary.json"))) >= 175
    assert _outputs(nb, "image/png")


def test_whatif_peak_and_best_are_over_unsaturated_points_as_the_cli_prints_them():
    """whatif.ipynb's "peak throughput" was g[X].max() over every point, saturated ones included, while
    `dsparksim frontier` prints the peak over unsaturated points: the notebook now calls the CLI's helper."""
    from dsparksim.results.frontier import peak_and_best

    g = pd.DataFrame({"output_throughput_tok_s": [100.0, 300.0, 500.0], "tps_user_median": [90.0, 40.0, 95.0],
                      "saturated": [False, False, True]})
    assert peak_and_best(g) == (300.0, 90.0)                    # the saturated 500 / 95 never count
    assert all(x != x for x in peak_and_best(g.assign(saturated=True)))   # every point saturated: NaN, NaN
    src = "".join("".join(c.source) for c in nbformat.read(NB_DIR / "whatif.ipynb", as_version=4).cells
                  if c.cell_type == "code")
    assert "peak_and_best(g)" in src and "g[X].max()" not in src


def test_frontier_notebook_runs_a_data_parallel_profile_as_its_ranks():
    """Full mode sweeps every shipped profile; built-h200x8-deepseek-v3-dp8ep8 prices one of 8 DP ranks and ran at
    dp_ranks 1 (each cell warned "pass --dp-ranks 8" in a worker): the notebook gives such a profile its ranks."""
    from dsparksim.cost.profile import list_profiles, load_profile

    assert any(int(load_profile(p).metadata.get("data_parallel") or 1) > 1 for p in list_profiles())
    src = "".join("".join(c.source) for c in nbformat.read(NB_DIR / "frontier.ipynb", as_version=4).cells
                  if c.cell_type == "code")
    assert 'DP[prof] = int(load_profile(prof).metadata.get("data_parallel") or 1)' in src
    assert '**({"dp_ranks": DP[prof]} if DP[prof] > 1 else {})' in src
