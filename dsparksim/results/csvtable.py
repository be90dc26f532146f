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
import re
from itertools import repeat
from pathlib import Path
from typing import Mapping

import numpy as np

__all__ = ["PlainCells", "csv_cells", "csv_kinds_supported", "table_cells", "write_csv_cells", "write_csv_columns"]

_SPECIAL = (",", '"', "\n", "\r")   # what makes csv.writer (minimal quoting, "," and "\n") quote a field
_SPEC_ONLY = re.compile(r"%(\.[0-9]+)?[eEfFgG]")   # a float format that is one conversion, precision at most


class PlainCells(list):
    """A column's cells known to need no quoting (numbers: digits, sign, ".", "e", inf, nan, True, False)."""


def csv_cells(col: np.ndarray, float_format: str) -> list | None:
    """The cells of one column as pandas' to_csv writes them; None for a column kind it leaves to pandas."""
    a = np.asarray(col)
    if a.ndim != 1:
        return None
    kind = a.dtype.kind
    if kind == "f":
        if _SPEC_ONLY.fullmatch(float_format):    # "%.9g" % x is format(x, ".9g"): without the % parsing, ~25% faster
            cells = list(map(float.__format__, a.tolist(), repeat(float_format[1:])))
        else:
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
        _write_rows(f, [header])
        _write_rows(f, cells, len(header))


def _write_rows(f, cells: list[list], width: int | None = None) -> None:
    """The rows of these columns' cells (``width`` None: ``cells`` is one row, the header), as csv.writer writes
    them; joined by "," when no cell needs quoting. One column is left to csv.writer: it writes an empty cell
    as "" (a line, not a blank line)."""
    if width is None:
        rows, plain = cells, len(cells[0]) > 1 and _plain(cells[0])
    else:
        rows, plain = zip(*cells), width > 1 and all(_plain(c) for c in cells)
        if not cells or not cells[0]:
            return
    if plain:
        f.write("\n".join(map(",".join, rows)) + "\n")
    else:
        csv.writer(f, lineterminator="\n").writerows(rows)


def csv_kinds_supported(cols: Mapping[str, np.ndarray]) -> bool:
    """Whether :func:`write_csv_columns` writes these columns (one dimension each, of a kind :func:`csv_cells`
    formats); pandas writes the others."""
    return all(np.ndim(c) == 1 and csv_cells(np.asarray(c)[:0], "%g") is not None for c in cols.values())


def write_csv_columns(path: str | Path, cols: Mapping[str, np.ndarray], float_format: str = "%.9g",
                      block: int = 4096) -> None:
    """``write_csv_cells(path, list(cols), table_cells(cols, float_format))`` -- the same bytes -- formatting
    ``block`` rows at a time (a long run's requests.csv has ~10^6 cells: as str objects all at once they took
    ~60 MB). Only for columns :func:`csv_kinds_supported` accepts."""
    arrays = [np.asarray(c) for c in cols.values()]
    if len({len(a) for a in arrays}) > 1:
        raise ValueError(f"columns of unequal lengths: {[len(a) for a in arrays]}")
    n = len(arrays[0]) if arrays else 0
    with open(path, "w", newline="", encoding="utf-8") as f:
        _write_rows(f, [list(cols)])
        for start in range(0, n, block):
            cells = [csv_cells(a[start:start + block], float_format) for a in arrays]
            if any(c is None for c in cells):
                raise ValueError("a column of a kind only pandas writes (check csv_kinds_supported first)")
            _write_rows(f, cells, len(arrays))
