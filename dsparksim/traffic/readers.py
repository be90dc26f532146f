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
CSV header is line 1): bytes that are not UTF-8, a corrupt or truncated ``.gz``, empty or header-only files, token
counts that are not integers in 1..2^53-1 (larger ones cannot be stored exactly), timestamps outside 1678..2261
or with differing timezone offsets. Nothing is sorted, clipped or dropped: unsorted timestamps are an error at the first line
where time goes backwards. Blank lines carry no data and are skipped (line numbers still count them).
"""
from __future__ import annotations

import csv
import functools
import hashlib
import io
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from dsparksim.errors import InputError
from dsparksim.io.textio import MAX_EXACT_INT, finite_float, is_file, loads_json, read_text

if TYPE_CHECKING:  # pandas is imported by the CSV readers that use it (lazy: ~0.4 s of start-up)
    import pandas as pd

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
    session: np.ndarray | None = None   # per row: prefix id (Mooncake: see _prefix_ids; -1 = none), for routing

    def __len__(self) -> int:
        return len(self.prompt_tokens)


def sha256_prefix(path: Path) -> str:
    """First 16 hex digits of the file's sha256 (the convention of data/SOURCES.md)."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def _text(path: Path) -> str:
    # utf-8-sig (the default of read_text): a BOM written by spreadsheet tools must not rename the first column
    return read_text(path, "trace file")


def _stem_suffix(path: Path) -> str:
    name = path.name[:-3] if path.name.endswith(".gz") else path.name
    return name.rsplit(".", 1)[-1].lower() if "." in name else ""


def detect_format(path: str | Path, text: str | None = None) -> str:
    """``azure`` | ``mooncake`` | ``lengths`` from the extension and the first non-blank line."""
    path = Path(path)
    if text is None:
        text = _text(path)
    first = next((ln for ln in io.StringIO(text, newline=None) if ln.strip()), "")
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
    if not is_file(path):
        raise InputError(path, None, "file not found")
    st = path.stat()
    return _read_cached(str(path), st.st_size, st.st_mtime_ns, fmt)


@functools.lru_cache(maxsize=16)
def _read_cached(path: str, size: int, mtime_ns: int, fmt: str | None) -> TraceTable:
    del size, mtime_ns  # only part of the cache key: a rewritten file is read again
    p = Path(path)
    text = _text(p)
    fmt = fmt or detect_format(p, text)
    return {"azure": _parse_azure, "mooncake": _parse_mooncake, "lengths": _parse_lengths}[fmt](p, text)


# ---------------------------------------------------------------- CSV


def _read_csv_strings(path: Path, text: str, cols: tuple[str, ...] = ()) -> tuple[pd.DataFrame, np.ndarray]:
    """All cells as strings, blank lines removed; returns the frame and each row's 1-based file line. ``cols``: the
    required columns, checked in the header before the rows' field counts (a missing column is the clearer error)."""
    if not text.strip():
        raise InputError(path, None, "empty file: expected a header line and at least one data row", line=1)
    import pandas as pd  # lazy: pandas

    _check_fields(path, text, cols)
    try:
        # skip_blank_lines=False keeps row i on file line i + 2, so line numbers stay exact.
        df = pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False, skip_blank_lines=False)
    except (pd.errors.ParserError, ValueError) as e:   # EmptyDataError is a ValueError
        m = re.search(r"line (\d+)", str(e))
        msg = re.sub(r"\s+", " ", str(e)).strip()
        raise InputError(path, None, f"malformed CSV: {msg}", line=int(m.group(1)) if m else None) from None
    line = np.arange(len(df), dtype=np.int64) + 2
    blank = (df == "").all(axis=1).to_numpy()
    if blank.any():
        df, line = df.loc[~blank].reset_index(drop=True), line[~blank]
    if len(df) == 0:
        raise InputError(path, None, "no data rows after the header", line=2)
    return df, line


def _check_fields(path: Path, text: str, cols: tuple[str, ...] = ()) -> None:
    """Every data row has the header's number of fields, and no column is named twice (pandas would take a row
    with one field too many as an index and shift every value, or rename a second ``X`` to ``X.1`` and read the
    first)."""

    rows = csv.reader(io.StringIO(text))
    try:
        header = next(rows)
        for c in cols:
            if c not in header:
                raise InputError(path, c, f"missing column; expected columns {list(cols)}, found {header}", line=1)
        dup = sorted({h for h in header if header.count(h) > 1})
        if dup:
            raise InputError(path, dup[0], f"column named twice in the header {header}: which one to read is "
                             "ambiguous", line=1)
        for r in rows:
            if len(r) != len(header) and any(x.strip() for x in r):
                raise InputError(path, None, f"malformed CSV: expected {len(header)} fields as in the header "
                                 f"{header}, got {len(r)}: {r[:8]}", line=rows.line_num)
    except csv.Error as e:
        raise InputError(path, None, f"malformed CSV: {e}", line=rows.line_num) from None


def _require(path: Path, df: pd.DataFrame, cols: tuple[str, ...]) -> None:
    for c in cols:
        if c not in df.columns:
            raise InputError(path, c, f"missing column; expected columns {list(cols)}, found {list(df.columns)}",
                             line=1)


def _token_counts(path: Path, df: pd.DataFrame, col: str, line: np.ndarray) -> np.ndarray:
    import pandas as pd  # lazy: pandas

    raw = df[col]
    x = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=np.float64)
    return _check_counts(path, col, x, raw.to_numpy(), line)


def _check_counts(path: Path, col: str, x: np.ndarray, raw: np.ndarray, line: np.ndarray) -> np.ndarray:
    # x is float64; counts above 2^53-1 are refused (not wrapped into int64): a float no longer holds them exactly
    with np.errstate(invalid="ignore"):
        bad = ~np.isfinite(x) | (x < 1) | (x != np.floor(x)) | (x > MAX_EXACT_INT)
    if bad.any():
        i = int(np.argmax(bad))
        if np.isnan(x[i]):
            what = "not a number"
        elif not np.isfinite(x[i]):
            what = "not finite"
        elif x[i] < 0:
            what = "negative"
        elif x[i] == 0:
            what = "zero"
        elif x[i] > MAX_EXACT_INT:
            what = "too large"
        else:
            what = "not an integer"
        raise InputError(path, col, f"token count must be an integer in 1..{MAX_EXACT_INT} (2^53-1), got "
                         f"{raw[i]!r} ({what}); {int(bad.sum())} bad row(s) in total", line=int(line[i]))
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
    # membership by equality per value: np.isin would sort mixed objects (a JSON dict/list) and raise
    bad = np.array([not (isinstance(v, str) and v in DOMAINS) for v in values], dtype=bool)
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


_TZ = re.compile(r"(Z|[+-]\d{2}(?::?\d{2})?)$")


def _offset(v: str) -> str | None:
    """The timezone offset of an ISO time, normalised to +HHMM ('Z' is +0000); None for a naive time."""
    v = v.strip()
    m = _TZ.search(v) if ":" in v else None     # a date alone ('2023-11-16') ends in '-16', not an offset
    if m is None:
        return None
    o = m.group(1)
    if o == "Z":
        return "+0000"
    o = o.replace(":", "")
    return o if len(o) == 5 else o + "00"


def _check_offsets(path: Path, raw_t: np.ndarray, line: np.ndarray) -> None:
    """Every TIMESTAMP has the same timezone offset, or none: a change is refused rather than guessed at."""
    offs = [_offset(str(v)) for v in raw_t]
    for i in range(1, len(offs)):
        if offs[i] != offs[0]:
            raise InputError(path, "TIMESTAMP", f"timezone offset {offs[i] or 'none'!s} differs from "
                             f"{offs[0] or 'none'!s} on line {int(line[0])}: give every timestamp the same offset "
                             f"(or none), e.g. convert them to UTC; got {raw_t[i]!r}", line=int(line[i]))


def _timestamps_ns(path: Path, df: pd.DataFrame, line: np.ndarray) -> np.ndarray:
    import pandas as pd  # lazy: pandas

    raw_t = df["TIMESTAMP"].to_numpy()
    _check_offsets(path, raw_t, line)
    try:
        ts = pd.to_datetime(df["TIMESTAMP"], format="ISO8601", errors="coerce")
    except (ValueError, TypeError, OverflowError) as e:
        raise InputError(path, "TIMESTAMP", f"expected wall-clock times like '2023-11-16 18:17:03.9799600': "
                         f"{e}") from None
    nat = ts.isna().to_numpy()
    if nat.any():
        i = int(np.argmax(nat))
        raise InputError(path, "TIMESTAMP", f"expected a wall-clock time like '2023-11-16 18:17:03.9799600', "
                         f"got {raw_t[i]!r}", line=int(line[i]))
    years = ts.dt.year.to_numpy()
    out = (years < 1678) | (years > 2261)   # nanoseconds since 1970 in int64; beyond, they would wrap
    if out.any():
        i = int(np.argmax(out))
        raise InputError(path, "TIMESTAMP", f"expected a time in the years 1678..2261, got {raw_t[i]!r}",
                         line=int(line[i]))
    return ts.dt.as_unit("ns").to_numpy(dtype="datetime64[ns]").astype(np.int64)


def read_azure(path: str | Path) -> TraceTable:
    """Azure LLM inference trace 2023 CSV (TIMESTAMP, ContextTokens, GeneratedTokens)."""
    path = Path(path)
    return _parse_azure(path, _text(path))


def _parse_azure(path: Path, text: str) -> TraceTable:
    df, line = _read_csv_strings(path, text, AZURE_COLUMNS)
    _require(path, df, AZURE_COLUMNS)
    raw_t = df["TIMESTAMP"].to_numpy()
    ns = _timestamps_ns(path, df, line)
    _check_sorted(path, "TIMESTAMP", ns, raw_t, line)
    p = _token_counts(path, df, "ContextTokens", line)
    o = _token_counts(path, df, "GeneratedTokens", line)
    dom = _domains(path, df["domain"].to_numpy(), line) if "domain" in df.columns else None
    return _table(path, "azure", p, o, line, columns=AZURE_COLUMNS[1:], arrival_s=(ns - ns[0]) / 1e9, domain=dom,
                  time_origin=str(raw_t[0]))


def read_lengths(path: str | Path) -> TraceTable:
    """Length-only CSV: num_prefill_tokens/num_decode_tokens, or ContextTokens/GeneratedTokens."""
    path = Path(path)
    return _parse_lengths(path, _text(path))


_PLAIN_COUNT = re.compile(r"[0-9]{1,15}")   # a token count pandas and numpy read alike (below 2^53: exact)


def _plain_lengths(path: Path, text: str) -> TraceTable | None:
    """:func:`_parse_lengths` without pandas, for a plain file: no quotes or carriage returns, a header naming a
    length-column pair once each, every non-empty line with the header's number of fields, and every count a plain
    run of digits. The very table the pandas path reads (same values, lines and checks); None for any other file,
    which the pandas path reads (its checks and messages are the rule). A run reads its lengths file without
    importing pandas (~60 MiB and a large share of start-up)."""
    if '"' in text or "\r" in text:
        return None
    lines = text.split("\n")
    header = lines[0].split(",")
    cols = next((pair for pair in LENGTH_COLUMNS if pair[0] in header), None)
    if cols is None or cols[1] not in header or len(set(header)) != len(header):
        return None
    rows, line = [], []
    for i, ln in enumerate(lines[1:], start=2):
        if ln:
            f = ln.split(",")
            if len(f) != len(header):
                return None
            rows.append(f)
            line.append(i)
    if not rows:
        return None
    cells = dict(zip(header, zip(*rows)))
    if not all(_PLAIN_COUNT.fullmatch(v) for c in cols for v in cells[c]):
        return None
    at = np.array(line, dtype=np.int64)
    p, o = (_check_counts(path, c, np.array(cells[c], dtype=np.int64).astype(np.float64),
                          np.array(cells[c], dtype=object), at) for c in cols)
    dom = _domains(path, np.array(cells["domain"], dtype=object), at) if "domain" in cells else None
    return _table(path, "lengths", p, o, at, columns=cols, domain=dom)


def header_columns(path: str | Path) -> list[str]:
    """The column names of a CSV file's header (its first line), for messages; [] when it is not a readable CSV."""
    try:
        text = read_text(path, "trace")
    except InputError:
        return []
    first = text.split("\n", 1)[0].strip()
    return [c.strip() for c in next(csv.reader([first]), [])] if first and not first.startswith("{") else []


def _parse_lengths(path: Path, text: str) -> TraceTable:
    plain = _plain_lengths(path, text)
    if plain is not None:
        return plain
    df, line = _read_csv_strings(path, text)
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
    return _parse_mooncake(path, _text(path))


_PREFIX_BLOCKS = 16


def _prefix_ids(heads: list[list[int]]) -> np.ndarray | None:
    """Per row, the id of its first prompt block that not every row shares (Mooncake's block 0 is a system prompt
    common to all requests; the next block tells conversations apart): the prefix a session router keeps on one
    replica. -1 for a row without hash_ids; None if no row has any."""
    if not any(heads):
        return None
    ref = next(h for h in heads if h)
    c = 0
    while c < len(ref) and all(len(h) > c and h[c] == ref[c] for h in heads if h):
        c += 1
    return np.array([(h[c] if len(h) > c else h[-1]) if h else -1 for h in heads], dtype=np.int64)


def _short(v) -> str:
    r = repr(v)
    return r if len(r) <= 80 else r[:77] + "..."


def _parse_mooncake(path: Path, text: str) -> TraceTable:
    vals: dict[str, list] = {k: [] for k in MOONCAKE_KEYS}
    doms: list = []
    lines: list[int] = []
    prefix: list[int] = []
    for n, row in enumerate(io.StringIO(text, newline=None), start=1):
        if not row.strip():
            continue
        obj = loads_json(row, path, line=n, label="malformed JSON")
        if not isinstance(obj, dict):
            raise InputError(path, None, f"expected a JSON object, got {type(obj).__name__}", line=n)
        for k in MOONCAKE_KEYS:
            v = obj.get(k)
            if k not in obj:
                raise InputError(path, k, f"missing key; expected keys {list(MOONCAKE_KEYS)}, "
                                 f"found {_short(list(obj))}", line=n)
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise InputError(path, k, f"expected a number, got {_short(v)}", line=n)
            f = finite_float(v)
            if f is None or (isinstance(v, int) and abs(v) > MAX_EXACT_INT):
                raise InputError(path, k, f"expected a finite number of magnitude <= {MAX_EXACT_INT} (2^53-1), "
                                 f"got {_short(v)}", line=n)
            vals[k].append(v)
        if "hash_ids" in obj and not isinstance(obj["hash_ids"], list):
            raise InputError(path, "hash_ids", f"expected a list of block ids, got {_short(obj['hash_ids'])}",
                             line=n)
        h = (obj.get("hash_ids") or [])[:_PREFIX_BLOCKS]
        for x in h:
            if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x <= MAX_EXACT_INT:
                raise InputError(path, "hash_ids", f"expected integer block ids >= 0, got {_short(x)}", line=n)
        prefix.append(h)
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
    sess = _prefix_ids(prefix)
    return _table(path, "mooncake", p, o, line, columns=MOONCAKE_KEYS[1:], arrival_s=(t - t[0]) / 1000.0,
                  domain=dom, time_origin=str(raw_t[0]), session=sess)
