"""Reading input files so that every failure is an :class:`~dsparksim.errors.InputError`, never a traceback.

Readers get the whole text of a file (``.gz`` decompressed) or parsed JSON from here; bad bytes, broken gzip
streams, unreadable paths and pathological JSON (too deep, integers too long) become one-line errors that name
the file and, where known, the line.
"""
from __future__ import annotations

import gzip
import json
import math
import zlib
from pathlib import Path
from typing import Any

from dsparksim.errors import InputError

MAX_EXACT_INT = 2 ** 53 - 1   # largest count a float64 (and so a CSV/JSON number) carries exactly
MAX_JSON_DEPTH = 64           # no input format nests deeper than a few levels


def is_file(path: str | Path) -> bool:
    """``Path.is_file`` that answers False (instead of raising) for names the OS cannot even look up."""
    try:
        return Path(path).is_file()
    except (OSError, ValueError):
        return False


def not_a_file(path: str | Path, what: str = "file") -> str:
    """Why ``path`` cannot be read as a ``what``: it is a directory, or it is not there."""
    try:
        is_dir = Path(path).is_dir()
    except (OSError, ValueError):
        is_dir = False
    return f"is a directory; expected a {what}" if is_dir else f"{what} not found"


def expand_user(value: str) -> Path:
    """``~`` expanded when possible; an unknown ``~user`` stays literal (then it is simply not found)."""
    try:
        return Path(value).expanduser()
    except (RuntimeError, KeyError):
        return Path(value)


def read_bytes(path: str | Path, what: str = "file") -> bytes:
    """The file's bytes, gunzipped when the name ends in ``.gz``; InputError when that is impossible."""
    path = Path(path)
    if not is_file(path):
        raise InputError(path, None, not_a_file(path, what))
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise InputError(path, None, f"cannot read {what}: {e.strerror or e}") from None
    if path.name.lower().endswith(".gz"):
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as e:   # BadGzipFile is an OSError; truncation is EOFError
            raise InputError(path, None, f"corrupt or truncated gzip data ({e}); expected a complete .gz file"
                             ) from None
    return raw


def decode(raw: bytes, source: str | Path, bom: bool = True) -> str:
    """UTF-8 text (a leading BOM dropped when ``bom``); InputError naming the line of the first bad byte."""
    try:
        return raw.decode("utf-8-sig" if bom else "utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise InputError(source, None, f"not UTF-8 text: byte 0x{raw[e.start]:02x} at byte offset {e.start} cannot "
                         f"be decoded ({e.reason}); expected UTF-8", line=line) from None


def read_text(path: str | Path, what: str = "file", bom: bool = True) -> str:
    """Whole text of a (possibly gzipped) UTF-8 file; every failure is an InputError naming it."""
    return decode(read_bytes(path, what), path, bom=bom)


def loads_json(text: str, source: str | Path, line: int | None = None, label: str = "invalid JSON",
               field: str | None = None) -> Any:
    """``json.loads`` with one-line errors; ``line`` is the file line of ``text`` when it is a single line. A key
    given twice in one object is an error (json keeps the last silently: which one the tool meant is unknown)."""
    try:
        obj = json.loads(text, object_pairs_hook=_unique_keys)
    except _DuplicateKey as e:
        raise InputError(source, field, f"{label}: key {e.args[0]!r} appears twice in one object", line=line) from None
    except json.JSONDecodeError as e:
        where = line if line is not None else e.lineno
        raise InputError(source, field, f"{label}: {e.msg} (column {e.colno})", line=where) from None
    except RecursionError:
        raise InputError(source, field, f"{label}: nested too deeply", line=line) from None
    except ValueError as e:   # e.g. an integer literal longer than Python's digit limit
        raise InputError(source, field, f"{label}: {e}", line=line) from None
    if _too_deep(obj):
        raise InputError(source, field, f"{label}: nested too deeply (more than {MAX_JSON_DEPTH} levels)", line=line)
    return obj


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _DuplicateKey(k)
        out[k] = v
    return out


def _too_deep(obj: Any) -> bool:
    """Nesting beyond MAX_JSON_DEPTH (checked without recursion): later recursive code must not overflow."""
    if not isinstance(obj, (dict, list)):
        return False
    stack = [(obj, 1)]
    while stack:
        v, d = stack.pop()
        if d > MAX_JSON_DEPTH:
            return True
        # only containers are pushed: a detailed benchmark result holds millions of numbers in its arrays
        stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v) if isinstance(x, (dict, list)))
    return False


def escape_controls(s: Any) -> str:
    """``str(s)`` with line breaks and other control characters escaped (``\\n``, ``\\x1c``): an error
    message quoting a key or name from a file must stay one line."""
    s = str(s)
    if all(c.isprintable() or c == "\t" for c in s):
        return s
    return "".join(c if c.isprintable() or c == "\t" else repr(c)[1:-1] for c in s)


def finite_float(v: Any) -> float | None:
    """``float(v)`` for a JSON number (int or float, not bool), or None when it is not one or not finite."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        f = float(v)
    except OverflowError:     # a Python int beyond the float range
        return None
    return f if math.isfinite(f) else None
