"""Acceptance-trace files: recorded draft blocks from a real drafter/target pair (format version 1).

One row per draft block. Formats: CSV (``.csv``, optionally gzip-compressed ``.csv.gz``) or Parquet
(``.parquet``).

Columns (exact names, any order; no other columns allowed, so a renamed column is an error, not ignored):

=================  =====  ====================================================================================
request_id         int    id of the recorded response (any integers; unique per response)
domain             str    ``math`` | ``code`` | ``chat`` (constant within a request)
step               int    block index within the response, 0-based; each request has steps 0,1,...,n-1 exactly
                          once (rows may come in any order; they are sorted by (request_id, step) on read)
K                  int    block size, the same on every row and equal to the header's K
accepted_len       int    0..K: accepted prefix length had all K draft tokens been verified (the rejection-
                          sampling outcome; the bonus token is not counted)
conf_1..conf_K     float  calibrated conditional confidences in [0, 1] (what the scheduler sees), no NaN
raw_conf_1..K      float  optional: the confidence head's raw (pre-calibration) outputs, same rules
=================  =====  ====================================================================================

Metadata (JSON object) with at least ``drafter``, ``K``, ``temperature`` (target sampling temperature),
``target`` (target model), ``source`` (how it was recorded, or "synthetic, ..."), ``created`` (ISO time):

* CSV: the first line is ``# dsparksim-acceptance-trace/1 {json}``; line 2 is the column header; data from line 3.
* Parquet: the same JSON under the schema-metadata key ``dsparksim-acceptance-trace/1``.

Example (CSV, K=3)::

    # dsparksim-acceptance-trace/1 {"drafter": "dspark", "K": 3, "temperature": 1.0, "target": "Qwen3-4B", ...}
    request_id,domain,step,K,accepted_len,conf_1,conf_2,conf_3
    0,math,0,3,2,0.97,0.91,0.40
    0,math,1,3,3,0.99,0.95,0.93

:func:`read_trace` validates everything above and raises :class:`~dsparksim.errors.InputError` naming the file,
the column and the line (CSV; line 1 is the metadata line) or row (Parquet, 0-based) of the first problem.
:func:`write_trace` runs the same validation before writing, so it never produces a file ``read_trace`` rejects.
"""
from __future__ import annotations

import gzip
import io
import json
import re
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pandas as pd

from dsparksim.errors import ConfigError, InputError
from dsparksim.io.textio import MAX_EXACT_INT, is_file, loads_json, escape_controls, read_text
from dsparksim.acceptance.base import DOMAINS
from dsparksim.acceptance.reference import K_MAX

MAGIC = "dsparksim-acceptance-trace/1"
REQUIRED_META = ("drafter", "K", "temperature", "target", "source", "created")
INT_COLUMNS = ("request_id", "step", "K", "accepted_len")
CSV_FIRST_DATA_LINE = 3


@dataclass
class AcceptanceTrace:
    """A validated trace, rows sorted by (request_id, step).

    conf: (N, K) float64; raw_conf: (N, K) or None; accepted: (N,) int64; request_id, step: (N,) int64;
    domain: (N,) object (str).
    """

    path: str
    metadata: dict[str, Any]
    K: int
    request_id: np.ndarray
    domain: np.ndarray
    step: np.ndarray
    accepted: np.ndarray
    conf: np.ndarray
    raw_conf: np.ndarray | None = None

    @property
    def n_blocks(self) -> int:
        return int(self.accepted.size)

    def responses(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(start row, number of blocks, domain) of every recorded response, in request_id order."""
        if self.n_blocks == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, object)
        starts = np.flatnonzero(np.r_[True, self.request_id[1:] != self.request_id[:-1]])
        lengths = np.diff(np.r_[starts, self.n_blocks])
        return starts, lengths, self.domain[starts]

    def truncated(self, K: int) -> "AcceptanceTrace":
        """The same blocks at a smaller block size: conf[:, :K], accepted = min(A, K) (exact)."""
        if not 1 <= K <= self.K:
            raise ConfigError(self.path, "K", f"K mismatch: cannot view a trace recorded with K={self.K} at K={K} "
                              "(a trace can be truncated to a smaller K, never extended)")
        return replace(self, K=K, conf=self.conf[:, :K], accepted=np.minimum(self.accepted, K),
                       raw_conf=None if self.raw_conf is None else self.raw_conf[:, :K])

    def to_frame(self) -> pd.DataFrame:
        """The trace as a DataFrame in file layout."""
        cols: dict[str, Any] = {"request_id": self.request_id, "domain": self.domain, "step": self.step,
                                "K": np.full(self.n_blocks, self.K), "accepted_len": self.accepted}
        for k in range(self.K):
            cols[f"conf_{k + 1}"] = self.conf[:, k]
        if self.raw_conf is not None:
            for k in range(self.K):
                cols[f"raw_conf_{k + 1}"] = self.raw_conf[:, k]
        return pd.DataFrame(cols)


# ---- locating errors ---------------------------------------------------------------------------------------
class _Where:
    """Builds InputErrors that name the file, column and CSV line / Parquet row."""

    def __init__(self, path: str, kind: str):
        self.path, self.kind = path, kind

    def err(self, column: str | None, message: str, row: int | None = None) -> InputError:
        column = None if column is None else escape_controls(column)   # a quoted CSV header may hold a line break
        message = escape_controls(message)
        if row is None:
            return InputError(self.path, column, message)
        if self.kind == "csv":
            return InputError(self.path, column, message, line=int(row) + CSV_FIRST_DATA_LINE)
        return InputError(self.path, column, f"row {int(row)}: {message}")


def _suffix_kind(path: Path) -> str:
    name = path.name.lower()
    if name.endswith(".csv") or name.endswith(".csv.gz"):
        return "csv"
    if name.endswith(".parquet"):
        return "parquet"
    raise InputError(path, None, "unknown acceptance-trace extension; expected .csv, .csv.gz or .parquet")


# ---- validation --------------------------------------------------------------------------------------------
def _check_metadata(meta: Any, where: _Where, line: int | None) -> dict[str, Any]:
    def fail(field: str, msg: str):
        e = InputError(where.path, field, msg, line=line)
        return e

    if not isinstance(meta, dict):
        raise fail("metadata", f"expected a JSON object, got {type(meta).__name__}")
    for key in REQUIRED_META:
        if key not in meta:
            raise fail(f"metadata.{key}", f"missing; the header needs {list(REQUIRED_META)}")
    K = meta["K"]
    if not isinstance(K, int) or isinstance(K, bool) or not 1 <= K <= K_MAX:
        raise fail("metadata.K", f"expected an integer block size in 1..{K_MAX}, got {K!r}")
    return dict(meta)


def _show(v: Any) -> str:
    """A cell value for an error message (numpy scalars as plain Python, missing as 'empty')."""
    if v is None or (isinstance(v, float) and np.isnan(v)) or v is pd.NA:
        return "empty/NaN"
    if hasattr(v, "item"):
        v = v.item()
        if isinstance(v, float) and np.isnan(v):
            return "empty/NaN"
    return repr(v)


def _int_column(df: pd.DataFrame, col: str, where: _Where) -> np.ndarray:
    s = df[col]
    if pd.api.types.is_integer_dtype(s.dtype) and not pd.api.types.is_extension_array_dtype(s.dtype):
        return s.to_numpy(np.int64)
    try:
        num = pd.to_numeric(s, errors="coerce").to_numpy(dtype=float, na_value=np.nan)
    except (TypeError, ValueError):   # e.g. a Parquet column of lists
        raise where.err(col, f"expected integers, got a column of {s.dtype}") from None
    # |x| > 2^53-1 is refused rather than wrapped by the int64 cast (a float no longer holds it exactly)
    bad = ~np.isfinite(num) | (num != np.round(num)) | (np.abs(num) > MAX_EXACT_INT)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise where.err(col, f"expected an integer of magnitude <= {MAX_EXACT_INT}, got {_show(s.iloc[i])}", i)
    return num.astype(np.int64)


def _float_block(df: pd.DataFrame, cols: list[str], where: _Where) -> np.ndarray:
    out = np.empty((len(df), len(cols)))
    for j, col in enumerate(cols):
        try:
            vals = pd.to_numeric(df[col], errors="coerce").to_numpy(dtype=float, na_value=np.nan)
        except (TypeError, ValueError):   # e.g. a Parquet column of lists
            raise where.err(col, f"expected confidences in [0, 1], got a column of {df[col].dtype}") from None
        bad = ~np.isfinite(vals) | (vals < 0.0) | (vals > 1.0)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise where.err(col, f"confidence must be a number in [0, 1] (no NaN), got {_show(df[col].iloc[i])}", i)
        out[:, j] = vals
    return out


def validate_frame(df: pd.DataFrame, meta: Mapping[str, Any], where: _Where) -> AcceptanceTrace:
    """Check a trace table against the format; return it sorted as an :class:`AcceptanceTrace`."""
    K = int(meta["K"])
    conf_cols = [f"conf_{k}" for k in range(1, K + 1)]
    raw_cols = [f"raw_conf_{k}" for k in range(1, K + 1)]
    required = ["request_id", "domain", "step", "K", "accepted_len"] + conf_cols
    cols = [str(c) for c in df.columns]
    unknown = [c for c in cols if c not in required and c not in raw_cols]
    for c in required:
        if c not in cols:
            hint = f"; unexpected columns {unknown}" if unknown else ""
            raise where.err(c, f"missing column (header K={K} needs {required}){hint}")
    if unknown:
        raise where.err(unknown[0], f"unknown column (header K={K}; allowed: {required} and optional "
                        f"raw_conf_1..raw_conf_{K})")
    has_raw = any(c in cols for c in raw_cols)
    if has_raw:
        for c in raw_cols:
            if c not in cols:
                raise where.err(c, f"raw confidences are all-or-nothing: raw_conf_1..raw_conf_{K} needed")
    if len(df) == 0:
        raise where.err(None, "empty trace: no blocks")

    ints = {c: _int_column(df, c, where) for c in INT_COLUMNS}
    bad = np.flatnonzero(ints["K"] != K)
    if bad.size:
        i = int(bad[0])
        raise where.err("K", f"K mismatch: row says K={ints['K'][i]}, header says K={K}", i)
    acc = ints["accepted_len"]
    bad = np.flatnonzero((acc < 0) | (acc > K))
    if bad.size:
        i = int(bad[0])
        raise where.err("accepted_len", f"must be in 0..K={K}, got {acc[i]}", i)
    dom = df["domain"].to_numpy(dtype=object)
    bad = np.flatnonzero(~np.isin(dom.astype(str), DOMAINS) | pd.isna(df["domain"]).to_numpy())
    if bad.size:
        i = int(bad[0])
        raise where.err("domain", f"unknown domain {_show(dom[i])}; expected one of {DOMAINS}", i)
    conf = _float_block(df, conf_cols, where)
    raw = _float_block(df, raw_cols, where) if has_raw else None

    rid, step = ints["request_id"], ints["step"]
    order = np.lexsort((step, rid))          # stable: by request, then step
    r, s = rid[order], step[order]
    new_req = np.r_[True, r[1:] != r[:-1]]
    expected = np.arange(r.size) - np.maximum.accumulate(np.where(new_req, np.arange(r.size), 0))
    bad = np.flatnonzero(s != expected)
    if bad.size:
        j = int(bad[0])
        i = int(order[j])
        if j > 0 and not new_req[j] and s[j] == s[j - 1]:
            msg = f"request {r[j]}: step {s[j]} appears twice"
        elif new_req[j]:
            msg = f"request {r[j]}: steps must start at 0, first step is {s[j]}"
        else:
            msg = f"request {r[j]}: step {s[j]} follows step {s[j - 1]} (steps must be consecutive)"
        raise where.err("step", msg, i)
    d_sorted = dom[order].astype(str)
    bad = np.flatnonzero(~new_req & (d_sorted != np.r_[d_sorted[:1], d_sorted[:-1]]))
    if bad.size:
        j = int(bad[0])
        raise where.err("domain", f"request {r[j]} changes domain from {d_sorted[j - 1]!r} to {d_sorted[j]!r}",
                        int(order[j]))
    return AcceptanceTrace(path=where.path, metadata=dict(meta), K=K, request_id=r, domain=d_sorted.astype(object),
                           step=s, accepted=acc[order], conf=conf[order],
                           raw_conf=None if raw is None else raw[order])


# ---- reading -----------------------------------------------------------------------------------------------
def _first_line(path: Path) -> tuple[str, str]:
    """(metadata line, rest of the file) of a CSV trace; unreadable, non-UTF-8 or broken gzip -> InputError."""
    fh = io.StringIO(read_text(path, "acceptance trace", bom=False), newline="")
    return fh.readline(), fh.read()


def _metadata_line(path: Path, first: str, where: _Where) -> dict:
    prefix = f"# {MAGIC} "
    if not first.startswith(prefix):
        raise InputError(path, "header", f"line 1 must start with '{prefix}' followed by JSON metadata, got "
                         f"{first[:60].rstrip()!r}", line=1)
    meta = loads_json(first[len(prefix):], f"{path}", line=1, label=f"invalid JSON after '{prefix.strip()}'",
                      field="metadata")
    return _check_metadata(meta, where, 1)


def _read_csv(path: Path, where: _Where) -> tuple[pd.DataFrame, dict]:
    first, rest = _first_line(path)
    if not first.strip():
        raise InputError(path, None, "empty file (expected the metadata line "
                         f"'# {MAGIC} {{json}}' then a CSV header)", line=1)
    meta = _metadata_line(path, first, where)
    if not rest.strip():
        raise InputError(path, None, "no column header / no blocks after the metadata line", line=2)
    try:
        df = pd.read_csv(io.StringIO(rest), dtype={"domain": object}, skip_blank_lines=False,
                         keep_default_na=True)
    except (pd.errors.ParserError, ValueError) as e:
        # pandas counts lines from the column header (file line 2): shift to file lines
        m = re.search(r"line (\d+)", str(e))
        line = int(m.group(1)) + 1 if m else None
        msg = re.sub(r"\s+", " ", str(e)).strip()
        if m:
            msg = msg.replace(m.group(0), f"file line {line}")
        raise InputError(path, "columns", f"CSV parse error: {msg}", line=line) from None
    return df, meta


def _parquet_metadata(path: Path, raw: bytes | None, where: _Where) -> dict:
    if raw is None:
        raise InputError(path, "metadata", f"schema metadata key '{MAGIC}' (JSON) is missing")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(path, "metadata", f"metadata under '{MAGIC}' is not UTF-8: {e.reason}") from None
    meta = loads_json(text, path, label=f"invalid JSON under '{MAGIC}'", field="metadata")
    return _check_metadata(meta, where, None)


def _read_parquet(path: Path, where: _Where) -> tuple[pd.DataFrame, dict]:
    try:
        import pyarrow.parquet as pq  # optional: pyarrow
    except ImportError:  # pragma: no cover - pyarrow is an optional dependency
        raise InputError(path, None, "reading Parquet needs pyarrow (pip install 'dsparksim[parquet]')") from None
    try:
        table = pq.read_table(path)
        meta = _parquet_metadata(path, (table.schema.metadata or {}).get(MAGIC.encode()), where)
        table.validate(full=True)   # Parquet does not check UTF-8: a damaged string would fail later, lazily
        df = table.to_pandas()
        for c in df.columns:        # materialise Arrow-backed text now, inside this error handler
            if not pd.api.types.is_numeric_dtype(df[c].dtype):
                df[c] = df[c].to_numpy(dtype=object)
        return df, meta
    except InputError:
        raise
    except Exception as e:  # pyarrow raises several types for corrupt / non-parquet files
        raise InputError(path, None, f"cannot read Parquet file: {_one_line(e)}") from None


def read_trace(path: str | Path) -> AcceptanceTrace:
    """Read and validate an acceptance trace (.csv, .csv.gz or .parquet)."""
    path = Path(path)
    kind = _suffix_kind(path)
    if not is_file(path):
        raise InputError(path, None, "acceptance trace file not found")
    if path.stat().st_size == 0:
        raise InputError(path, None, "empty file")
    where = _Where(str(path), kind)
    df, meta = (_read_csv if kind == "csv" else _read_parquet)(path, where)
    return validate_frame(df, meta, where)


def read_trace_metadata(path: str | Path) -> dict[str, Any]:
    """Only the metadata (cheap: the first CSV line / the Parquet schema)."""
    path = Path(path)
    kind = _suffix_kind(path)
    where = _Where(str(path), kind)
    if kind == "csv":
        return _metadata_line(path, _first_line(path)[0], where)
    if not is_file(path):
        raise InputError(path, None, "acceptance trace file not found")
    import pyarrow.parquet as pq  # optional: pyarrow
    try:
        raw = (pq.read_schema(path).metadata or {}).get(MAGIC.encode())
    except Exception as e:  # corrupt / non-parquet file
        raise InputError(path, None, f"cannot read Parquet file: {_one_line(e)}") from None
    return _parquet_metadata(path, raw, where)


def _one_line(e: BaseException) -> str:
    return re.sub(r"\s+", " ", str(e)).strip()[:300]


# ---- writing -----------------------------------------------------------------------------------------------
def _to_frame(data: Any) -> pd.DataFrame:
    if isinstance(data, AcceptanceTrace):
        return data.to_frame()
    if isinstance(data, pd.DataFrame):
        return data.copy()
    if isinstance(data, Mapping):
        d = dict(data)
        if "accepted" in d and "accepted_len" not in d:
            d["accepted_len"] = d.pop("accepted")
        cols: dict[str, Any] = {}
        for key in ("conf", "raw_conf"):
            if key in d:
                arr = np.asarray(d.pop(key), dtype=float)
                for k in range(arr.shape[1]):
                    cols[f"{key}_{k + 1}"] = arr[:, k]
        base = {k: np.asarray(v) for k, v in d.items()}
        if "K" not in base and cols:
            n = len(next(iter(cols.values())))
            base["K"] = np.full(n, sum(c.startswith("conf_") for c in cols), dtype=np.int64)
        return pd.DataFrame({**base, **cols})
    raise TypeError("write_trace data must be a DataFrame, an AcceptanceTrace or a mapping of arrays")


def write_trace(path: str | Path, data: Any, metadata: Mapping[str, Any], *, float_format: str = "%.6g") -> Path:
    """Validate and write a trace.

    data: a DataFrame in file layout, an :class:`AcceptanceTrace`, or a mapping with arrays ``request_id``,
    ``domain``, ``step``, ``accepted_len`` (or ``accepted``), ``conf`` (N, K) and optional ``raw_conf`` (N, K).
    metadata: needs drafter, temperature, target, source; ``K`` is taken from the data when absent and
    ``created`` defaults to now (UTC). CSV floats use ``float_format`` (6 significant digits by default;
    Parquet stores float64 exactly).
    """
    path = Path(path)
    kind = _suffix_kind(path)
    df = _to_frame(data)
    meta = dict(metadata)
    if "K" not in meta:
        meta["K"] = sum(1 for c in df.columns if str(c).startswith("conf_"))
    meta.setdefault("created", datetime.now(timezone.utc).replace(microsecond=0).isoformat())
    where = _Where(f"{path} (being written)", "memory")
    meta = _check_metadata(meta, where, None)
    trace = validate_frame(df, meta, where)        # same rules as read_trace
    out = trace.to_frame()
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "csv":
        text = f"# {MAGIC} {json.dumps(meta, sort_keys=False)}\n" + out.to_csv(index=False, float_format=float_format,
                                                                                   lineterminator="\n")
        if path.name.lower().endswith(".gz"):
            with gzip.open(path, "wt", encoding="utf-8", newline="") as fh:
                fh.write(text)
        else:
            path.write_text(text, encoding="utf-8", newline="")
    else:
        import pyarrow as pa  # optional: pyarrow
        import pyarrow.parquet as pq  # optional: pyarrow
        table = pa.Table.from_pandas(out, preserve_index=False)
        schema_meta = {**(table.schema.metadata or {}), MAGIC.encode(): json.dumps(meta).encode()}
        table = table.replace_schema_metadata(schema_meta)
        pq.write_table(table, path)
    return path
