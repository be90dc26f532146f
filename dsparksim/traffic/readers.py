"""Strict readers for the request traces people already have.

Formats (all give a :class:`TraceTable`):

- ``azure``: Azure LLM inference trace 2023 CSV — ``TIMESTAMP`` (wall clock, e.g. ``2023-11-16 18:17:03.9799600``),
  ``ContextTokens``, ``GeneratedTokens``.
- ``mooncake``: Mooncake FAST'25 JSONL — one object per line with ``timestamp`` (milliseconds), ``input_length``,
  ``output_length`` and optionally ``hash_ids`` (512-token prefix blocks; checked to be a list, not used).
- ``lengths``: length-only CSV — ``num_prefill_tokens``, ``num_decode_tokens`` (sarathi/vidur processed traces), or
  ``ContextTokens``, ``GeneratedTokens`` (an Azure trace without timestamps). Other columns are ignored.

Any format may carry an optional ``domain`` column/key (``math`` | ``code`` | ``chat``).

Every problem raises :class:`~dsparksim.errors.InputError` naming the file, the column and the 1-based line (the
CSV header is line 1). Nothing is sorted, clipped or dropped: unsorted timestamps are an error at the first line
where time goes backwards. Blank lines carry no data and are skipped (line numbers still count them).
"""
from __future__ import annotations

import functools
import gzip
import hashlib
import io
import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from dsparksim.errors import InputError

FORMATS = ("azure", "mooncake", "lengths")
DOMAINS = ("math", "code", "chat")
LENGTH_COLUMNS = (("num_prefill_tokens", "num_decode_tokens"), ("ContextTokens", "GeneratedTokens"))
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
MOONCAKE_KEYS = ("timestamp", "input_length", "output_length")


@dataclass(frozen=True)
class TraceTable:
    """Validated rows of one trace file, in file order. Arrays are read-only (they may be cached).

    arrival_s: seconds since the first row (unscaled), or None for a length-only file.
    line:      1-based line of each row in the file, for error messages downstream.
    time_origin: the first row's raw timestamp (wall clock for Azure, ms for Mooncake).
    columns:   names of the (prompt, output) token columns in this file, for error messages.
    """

    source: str
    format: str
    sha256: str
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    line: np.ndarray
    arrival_s: np.ndarray | None = None
    domain: np.ndarray | None = None
    time_origin: str | None = None
    columns: tuple[str, str] = ("prompt_tokens", "output_tokens")

    def __len__(self) -> int:
        return len(self.prompt_tokens)


def sha256_prefix(path: Path) -> str:
    """First 16 hex digits of the file's sha256 (the convention of data/SOURCES.md)."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def _open_text(path: Path) -> io.TextIOBase:
    # utf-8-sig: a BOM written by spreadsheet tools must not rename the first column
    if path.name.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8-sig")
    return open(path, encoding="utf-8-sig")


def _stem_suffix(path: Path) -> str:
    name = path.name[:-3] if path.name.endswith(".gz") else path.name
    return name.rsplit(".", 1)[-1].lower() if "." in name else ""


def detect_format(path: str | Path) -> str:
    """``azure`` | ``mooncake`` | ``lengths`` from the extension and the first non-blank line."""
    path = Path(path)
    if not path.is_file():
        raise InputError(path, None, "file not found")
    with _open_text(path) as f:
        first = ""
        for first in f:
            if first.strip():
                break
    first = first.strip()
    if not first:
        raise InputError(path, None, "empty file: expected a header line (CSV) or a JSON object per line (JSONL)",
                         line=1)
    if _stem_suffix(path) in ("jsonl", "json") or first.startswith("{"):
        return "mooncake"
    cols = set(c.strip() for c in first.split(","))
    if "TIMESTAMP" in cols:
        return "azure"
    if any(set(pair) <= cols for pair in LENGTH_COLUMNS):
        return "lengths"
    raise InputError(path, None, f"cannot tell the trace format from header {first!r}: expected Azure columns "
                     f"{list(AZURE_COLUMNS)}, length columns {list(LENGTH_COLUMNS[0])} or {list(LENGTH_COLUMNS[1])},"
                     " or a .jsonl file (Mooncake)", line=1)


def read_trace(path: str | Path, fmt: str | None = None) -> TraceTable:
    """Read and validate a trace; ``fmt`` forces the format, None detects it. Cached by (path, size, mtime)."""
    path = Path(path)
    if fmt is not None and fmt not in FORMATS:
        raise InputError(path, "format", f"expected one of {FORMATS} or None (detect), got {fmt!r}")
    if not path.is_file():
        raise InputError(path, None, "file not found")
    st = path.stat()
    return _read_cached(str(path), st.st_size, st.st_mtime_ns, fmt or detect_format(path))


@functools.lru_cache(maxsize=16)
def _read_cached(path: str, size: int, mtime_ns: int, fmt: str) -> TraceTable:
    del size, mtime_ns  # only part of the cache key: a rewritten file is read again
    return {"azure": read_azure, "mooncake": read_mooncake, "lengths": read_lengths}[fmt](Path(path))


# ---------------------------------------------------------------- CSV


def _read_csv_strings(path: Path) -> tuple[pd.DataFrame, np.ndarray]:
    """All cells as strings, blank lines removed; returns the frame and each row's 1-based file line."""
    try:
        with _open_text(path) as f:
            text = f.read()
    except UnicodeDecodeError as e:
        raise InputError(path, None, f"not UTF-8 text ({e.reason} at byte {e.start})") from None
    if not text.strip():
        raise InputError(path, None, "empty file: expected a header line and at least one data row", line=1)
    try:
        # skip_blank_lines=False keeps row i on file line i + 2, so line numbers stay exact.
        df = pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False, skip_blank_lines=False)
    except pd.errors.ParserError as e:
        m = re.search(r"line (\d+)", str(e))
        raise InputError(path, None, f"malformed CSV: {str(e).strip()}", line=int(m.group(1)) if m else None) from None
    line = np.arange(len(df), dtype=np.int64) + 2
    blank = (df == "").all(axis=1).to_numpy()
    if blank.any():
        df, line = df.loc[~blank].reset_index(drop=True), line[~blank]
    if len(df) == 0:
        raise InputError(path, None, "no data rows after the header", line=2)
    return df, line


def _require(path: Path, df: pd.DataFrame, cols: tuple[str, ...]) -> None:
    for c in cols:
        if c not in df.columns:
            raise InputError(path, c, f"missing column; expected columns {list(cols)}, found {list(df.columns)}",
                             line=1)


def _token_counts(path: Path, df: pd.DataFrame, col: str, line: np.ndarray) -> np.ndarray:
    raw = df[col]
    x = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=np.float64)
    return _check_counts(path, col, x, raw.to_numpy(), line)


def _check_counts(path: Path, col: str, x: np.ndarray, raw: np.ndarray, line: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        bad = ~np.isfinite(x) | (x < 1) | (x != np.floor(x))
    if bad.any():
        i = int(np.argmax(bad))
        if not np.isfinite(x[i]):
            what = "not a number"
        elif x[i] < 0:
            what = "negative"
        elif x[i] == 0:
            what = "zero"
        else:
            what = "not an integer"
        raise InputError(path, col, f"token count must be an integer >= 1, got {raw[i]!r} ({what}); "
                         f"{int(bad.sum())} bad row(s) in total", line=int(line[i]))
    return x.astype(np.int64)


def _check_sorted(path: Path, col: str, t: np.ndarray, raw: np.ndarray, line: np.ndarray) -> None:
    back = np.flatnonzero(np.diff(t) < 0)
    if back.size:
        i = int(back[0]) + 1
        raise InputError(path, col, f"timestamps must be non-decreasing (the trace is replayed in file order, never "
                         f"re-sorted): {raw[i]!r} comes after {raw[i - 1]!r} on line {int(line[i - 1])}",
                         line=int(line[i]))


def _domains(path: Path, values: np.ndarray, line: np.ndarray) -> np.ndarray:
    values = np.asarray(values, dtype=object)
    bad = ~np.isin(values, DOMAINS)
    if bad.any():
        i = int(np.argmax(bad))
        raise InputError(path, "domain", f"expected one of {DOMAINS}, got {values[i]!r}", line=int(line[i]))
    return values


def _table(path: Path, fmt: str, p: np.ndarray, o: np.ndarray, line: np.ndarray, **kw) -> TraceTable:
    arrays = [p, o, line] + [v for v in kw.values() if isinstance(v, np.ndarray)]
    for a in arrays:
        a.setflags(write=False)
    return TraceTable(source=str(path), format=fmt, sha256=sha256_prefix(path), prompt_tokens=p, output_tokens=o,
                      line=line, **kw)


def read_azure(path: str | Path) -> TraceTable:
    """Azure LLM inference trace 2023 CSV (TIMESTAMP, ContextTokens, GeneratedTokens)."""
    path = Path(path)
    df, line = _read_csv_strings(path)
    _require(path, df, AZURE_COLUMNS)
    raw_t = df["TIMESTAMP"].to_numpy()
    ts = pd.to_datetime(df["TIMESTAMP"], format="ISO8601", errors="coerce")
    nat = ts.isna().to_numpy()
    if nat.any():
        i = int(np.argmax(nat))
        raise InputError(path, "TIMESTAMP", f"expected a wall-clock time like '2023-11-16 18:17:03.9799600', "
                         f"got {raw_t[i]!r}", line=int(line[i]))
    ns = ts.to_numpy(dtype="datetime64[ns]").astype(np.int64)
    _check_sorted(path, "TIMESTAMP", ns, raw_t, line)
    p = _token_counts(path, df, "ContextTokens", line)
    o = _token_counts(path, df, "GeneratedTokens", line)
    dom = _domains(path, df["domain"].to_numpy(), line) if "domain" in df.columns else None
    return _table(path, "azure", p, o, line, columns=AZURE_COLUMNS[1:], arrival_s=(ns - ns[0]) / 1e9, domain=dom,
                  time_origin=str(raw_t[0]))


def read_lengths(path: str | Path) -> TraceTable:
    """Length-only CSV: num_prefill_tokens/num_decode_tokens, or ContextTokens/GeneratedTokens."""
    path = Path(path)
    df, line = _read_csv_strings(path)
    cols = next((pair for pair in LENGTH_COLUMNS if pair[0] in df.columns), LENGTH_COLUMNS[0])
    _require(path, df, cols)
    p = _token_counts(path, df, cols[0], line)
    o = _token_counts(path, df, cols[1], line)
    dom = _domains(path, df["domain"].to_numpy(), line) if "domain" in df.columns else None
    return _table(path, "lengths", p, o, line, columns=cols, domain=dom)


# ---------------------------------------------------------------- JSONL


def read_mooncake(path: str | Path) -> TraceTable:
    """Mooncake JSONL (timestamp in ms, input_length, output_length[, hash_ids])."""
    path = Path(path)
    vals: dict[str, list] = {k: [] for k in MOONCAKE_KEYS}
    doms: list = []
    lines: list[int] = []
    with _open_text(path) as f:
        for n, text in enumerate(f, start=1):
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as e:
                raise InputError(path, None, f"malformed JSON: {e.msg} (column {e.colno})", line=n) from None
            if not isinstance(obj, dict):
                raise InputError(path, None, f"expected a JSON object, got {type(obj).__name__}", line=n)
            for k in MOONCAKE_KEYS:
                v = obj.get(k)
                if k not in obj:
                    raise InputError(path, k, f"missing key; expected keys {list(MOONCAKE_KEYS)}, "
                                     f"found {list(obj)}", line=n)
                if isinstance(v, bool) or not isinstance(v, (int, float)):
                    raise InputError(path, k, f"expected a number, got {v!r}", line=n)
                vals[k].append(v)
            if "hash_ids" in obj and not isinstance(obj["hash_ids"], list):
                raise InputError(path, "hash_ids", f"expected a list of block ids, got {obj['hash_ids']!r}", line=n)
            doms.append(obj.get("domain"))
            lines.append(n)
    if not lines:
        raise InputError(path, None, "empty file: expected one JSON object per line", line=1)
    line = np.asarray(lines, dtype=np.int64)
    t = np.asarray(vals["timestamp"], dtype=np.float64)
    raw_t = np.asarray(vals["timestamp"], dtype=object)
    neg = ~np.isfinite(t) | (t < 0)
    if neg.any():
        i = int(np.argmax(neg))
        raise InputError(path, "timestamp", f"expected a finite time >= 0 ms, got {raw_t[i]!r}", line=int(line[i]))
    _check_sorted(path, "timestamp", t, raw_t, line)
    p = _check_counts(path, "input_length", np.asarray(vals["input_length"], dtype=np.float64),
                      np.asarray(vals["input_length"], dtype=object), line)
    o = _check_counts(path, "output_length", np.asarray(vals["output_length"], dtype=np.float64),
                      np.asarray(vals["output_length"], dtype=object), line)
    present = [d is not None for d in doms]
    dom = None
    if any(present):
        if not all(present):
            i = present.index(False)
            raise InputError(path, "domain", "missing key (other lines have it)", line=int(line[i]))
        dom = _domains(path, np.asarray(doms, dtype=object), line)
    return _table(path, "mooncake", p, o, line, columns=MOONCAKE_KEYS[1:], arrival_s=(t - t[0]) / 1000.0,
                  domain=dom, time_origin=str(raw_t[0]))
