"""A table of numpy columns written as CSV without pandas, byte for byte as ``DataFrame(cols).to_csv(path,
index=False, float_format=...)`` writes it (a run's requests.csv: importing pandas and its formatter took a large
share of a long run's whole-process time and ~60 MiB of its peak memory).

pandas' rules, reproduced (pandas/core/indexes/base.py ``get_values_for_csv``, io/formats/csvs.py): float columns
``float_format % value`` with NaN written empty; integer and boolean columns ``str`` of each value; other columns
(strings) as they are, None and NaN empty; rows written by the standard library's ``csv.writer`` (minimal quoting,
``"`` doubled, lines ending in ``\\n``), the header first. A column of any other kind (datetimes, complex, ...) is
not handled here: :func:`table_cells` answers None and the caller uses pandas.
"""
from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Mapping

import numpy as np

__all__ = ["PlainCells", "csv_cells", "table_cells", "write_csv_cells"]

_SPECIAL = (",", '"', "\n", "\r")   # what makes csv.writer (minimal quoting, "," and "\n") quote a field


class PlainCells(list):
    """A column's cells known to need no quoting (numbers: digits, sign, ".", "e", inf, nan, True, False)."""


def csv_cells(col: np.ndarray, float_format: str) -> list | None:
    """The cells of one column as pandas' to_csv writes them; None for a column kind it leaves to pandas."""
    a = np.asarray(col)
    if a.ndim != 1:
        return None
    kind = a.dtype.kind
    if kind == "f":
        cells = list(map(float_format.__mod__, a.tolist()))
        for i in np.flatnonzero(np.isnan(a)).tolist():
            cells[i] = ""
        # numbers through a format without a quoting character: no cell needs quoting
        return PlainCells(cells) if not any(c in float_format for c in _SPECIAL) else cells
    if kind == "b":
        return PlainCells(map(("False", "True").__getitem__, a.tolist()))
    if kind in "iu":
        return PlainCells(_int_cells(a))
    if kind == "U":
        return a.tolist()
    if kind == "O":
        return ["" if v is None or (isinstance(v, float) and math.isnan(v)) else v for v in a.tolist()]
    return None


def _int_cells(a: np.ndarray) -> list[str]:
    """``str`` of each integer; a column of few distinct values (counts, ids of replicas, flags) formats each value
    of its range once and looks the cells up."""
    n = len(a)
    if n < 64:
        return list(map(str, a.tolist()))
    lo, hi = int(a.min()), int(a.max())
    if hi - lo >= n // 2 or hi >= 2**63:
        return list(map(str, a.tolist()))
    table = list(map(str, range(lo, hi + 1)))
    return list(map(table.__getitem__, (a.astype(np.int64) - lo).tolist()))


def table_cells(cols: Mapping[str, np.ndarray], float_format: str = "%.9g") -> list[list] | None:
    """Every column's cells (:func:`csv_cells`); None if a column is of a kind only pandas formats."""
    cells = []
    for c in cols.values():
        x = csv_cells(c, float_format)
        if x is None:
            return None
        cells.append(x)
    if len({len(x) for x in cells}) > 1:
        raise ValueError(f"columns of unequal lengths: {[len(x) for x in cells]}")
    return cells


def _plain(col: list) -> bool:
    """Every cell a str csv.writer writes as it is (no quoting)."""
    if isinstance(col, PlainCells):
        return True
    try:
        text = "".join(col)
    except TypeError:        # a cell that is not a str: csv.writer formats it
        return False
    return not any(c in text for c in _SPECIAL)


def write_csv_cells(path: str | Path, header: list[str], cells: list[list]) -> None:
    """Write the header and the columns' cells (:func:`table_cells`) at ``path``, one row per index. When no cell
    needs quoting (numbers and plain strings) the lines are the cells joined by "," -- the same bytes csv.writer
    writes, without its per-field checks; otherwise csv.writer writes them."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        if len(header) > 1 and _plain(header) and all(_plain(c) for c in cells):
            f.write(",".join(header) + "\n")
            if cells and cells[0]:
                f.write("\n".join(map(",".join, zip(*cells))) + "\n")
            return
        w = csv.writer(f, lineterminator="\n")
        w.writerow(header)
        w.writerows(zip(*cells))
