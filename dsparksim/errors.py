"""Input errors that name the file, the place in it and what was expected."""
from __future__ import annotations

from pathlib import Path


class InputError(ValueError):
    """A bad input file or config value.

    The message always carries the source (file path or config name), the field and, where it applies, the
    line/row, e.g. ``profiles/x.json: field 'verify.M' (index 3): breakpoints must be strictly increasing, got 64
    after 128``.
    """

    def __init__(self, source: str | Path | None, field: str | None, message: str, line: int | None = None):
        self.source = str(source) if source is not None else None
        self.field = field
        self.line = line
        parts = []
        if self.source:
            parts.append(self.source + (f":{line}" if line is not None else ""))
        elif line is not None:
            parts.append(f"line {line}")
        if field:
            parts.append(f"field '{field}'")
        super().__init__(": ".join(parts + [message]) if parts else message)


class ConfigError(InputError):
    """An impossible or inconsistent configuration (e.g. a policy spec that does not parse, K out of range)."""
