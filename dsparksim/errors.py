"""Input errors that name the file, the place in it and what was expected."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence


CLI = "cli"   # the source of a value typed on the command line; messages say "command line"


class InputError(ValueError):
    """A bad input file or config value.

    The message always carries the source (file path, config name, or ``"cli"``, shown as "command line"), the
    field and, where it applies, the
    line/row, e.g. ``profiles/x.json: field 'verify.M' (index 3): breakpoints must be strictly increasing, got 64
    after 128``.

    Every subclass pickles (whatever its ``__init__`` takes), so an error raised in a worker process or on Ray
    arrives in the parent as the same class with the same message and attributes.
    """

    def __init__(self, source: str | Path | None, field: str | None, message: str, line: int | None = None):
        self.source = str(source) if source is not None else None
        self.field = field
        self.line = line
        self.message = message
        parts = []
        if self.source:
            # source "cli": the value was typed on the command line (never blamed on a file)
            shown = "command line" if self.source == CLI else self.source
            parts.append(shown + (f":{line}" if line is not None else ""))
        elif line is not None:
            parts.append(f"line {line}")
        if field:
            parts.append(f"field '{field}'")
        super().__init__(": ".join(parts + [message]) if parts else message)

    def __reduce__(self):
        # The default (cls(*self.args)) calls __init__ with the formatted message only, which fails for this
        # signature and for subclasses with their own; rebuild from the message and the instance state instead.
        return _rebuild, (type(self), self.args, dict(self.__dict__))


class ConfigError(InputError):
    """An impossible or inconsistent configuration (e.g. a policy spec that does not parse, K out of range)."""


class ConfigErrors(ConfigError):
    """Several independent problems of one input (``source``), reported at once: ``errors``, each a ConfigError
    naming the file and its field, one a line."""

    def __init__(self, source: str | Path | None, errors: Sequence[InputError]):
        self.errors = list(errors)
        super().__init__(None, None, f"{len(self.errors)} problems in {source}:\n"
                         + "\n".join(f"  {e}" for e in self.errors))
        self.source = str(source) if source is not None else None


def raise_all(source: str | Path | None, errors: Sequence[InputError]) -> None:
    """Raise nothing for no error, the error itself for one, :class:`ConfigErrors` for several. A problem said
    twice in the same words (a shared value every deployment checks) is said once."""
    seen: set[str] = set()
    errors = [e for e in errors if not (str(e) in seen or seen.add(str(e)))]
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise ConfigErrors(source, errors)


class MissingExtraError(ConfigError):
    """A command needs an optional dependency that is not installed; names the extra that provides it."""

    def __init__(self, module: str, extra: str, what: str | None = None, alternative: str | None = None):
        self.module, self.extra = module, extra
        super().__init__(None, None, f"{what or 'this command'} needs the optional module '{module}', which is not "
                                     f"installed: pip install \"dsparksim[{extra}]\""
                                     + (f" (or {alternative})" if alternative else ""))


def _rebuild(cls: type, args: tuple, state: dict[str, Any]) -> InputError:
    e = cls.__new__(cls)
    e.args = args
    e.__dict__.update(state)
    return e


# Optional modules -> the extra that installs them (pyproject.toml [project.optional-dependencies]).
EXTRAS = {"torch": "torch", "tokenizers": "torch", "ray": "ray", "pyarrow": "parquet"}


def missing_extra(exc: BaseException, what: str | None = None) -> MissingExtraError | None:
    """The MissingExtraError an ImportError stands for, if it is a missing optional module (else None).

    Only the optional module itself missing counts (``import torch`` failing with name 'torch'); an installed
    extra that fails to import is a different problem and keeps its traceback.
    """
    if not isinstance(exc, ImportError):
        return None
    name = getattr(exc, "name", None)
    if isinstance(exc, ModuleNotFoundError) and name in EXTRAS:
        return MissingExtraError(name, EXTRAS[name], what)
    # pandas reports a missing Parquet engine as a plain ImportError (no module name) that mentions pyarrow
    if name is None and "pyarrow" in str(exc) and "parquet" in str(exc).lower():
        return MissingExtraError("pyarrow", "parquet", f"{what or 'this command'} (Parquet files)")
    return None


def error_lines(exc: BaseException) -> list[str]:
    """:func:`one_line`, or for :class:`ConfigErrors` its count and then each of its problems on a line."""
    if isinstance(exc, ConfigErrors):
        return [f"{len(exc.errors)} problems in {exc.source}:", *(one_line(e) for e in exc.errors)]
    return [one_line(exc)]


def one_line(exc: BaseException) -> str:
    """The error as one line: the message of an InputError, ``Type: message`` for anything else."""
    msg = str(exc) if isinstance(exc, InputError) else f"{type(exc).__name__}: {exc}"
    return " ".join(part.strip() for part in msg.splitlines() if part.strip()) or type(exc).__name__
