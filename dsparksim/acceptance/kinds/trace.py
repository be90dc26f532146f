"""``PATH.csv|.csv.gz|.parquet``: replay an acceptance trace (format: :mod:`dsparksim.acceptance.trace_format`)."""
from __future__ import annotations

from importlib import resources
from pathlib import Path

from dsparksim.acceptance.registry import AcceptanceKind, AcceptanceSpec, arg_names, src
from dsparksim.errors import ConfigError
from dsparksim.io.textio import is_file

TRACE_SUFFIXES = (".csv", ".csv.gz", ".parquet")


def resolve_trace_path(path: str) -> Path:
    """A trace path as given, or (for ``traces/NAME``) the copy shipped inside the installed package."""
    p = Path(path)
    if is_file(p):
        return p
    parts = p.parts
    if len(parts) == 2 and parts[0] == "traces":
        try:
            res = resources.files("dsparksim._traces").joinpath(parts[1])
            if res.is_file():
                return Path(str(res))
        except ModuleNotFoundError:
            pass
    return p


class Trace(AcceptanceKind):
    kind = "trace"
    usage = f"a trace file ({', '.join(TRACE_SUFFIXES)})"

    @classmethod
    def match_text(cls, text: str) -> AcceptanceSpec | None:
        # a trace file by its suffix, unless a prefix says it is an engine log ('vllm:x.csv')
        if text.lower().endswith(TRACE_SUFFIXES) and text.partition(":")[0] not in arg_names():
            return AcceptanceSpec(text, cls.kind, cls.kind, text)
        return None

    @classmethod
    def path(cls, ps) -> Path:
        return resolve_trace_path(ps.arg)

    @classmethod
    def load(cls, ps, K, domain_default, confidence):
        from dsparksim.acceptance.trace_model import TraceAcceptance  # heavy: pandas (trace reader), on use only
        path = ps.path
        if not is_file(path):
            raise ConfigError(src(ps.text), "path", f"acceptance trace file not found: {ps.text}")
        return TraceAcceptance(path, K, domain_default=domain_default, source=ps.text)

    @classmethod
    def drafter(cls, ps) -> str:
        from dsparksim.acceptance.trace_format import read_trace_metadata  # heavy: pandas, on use only
        return str(read_trace_metadata(ps.path).get("drafter", "unknown"))
