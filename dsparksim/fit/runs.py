"""The fit's view of a runs table: selection (``--where``), checks, one :class:`FitRun` per measured run.

Reads the package's runs table through ``dsparksim.bench.runs.read_runs`` when that module exists; until then
(and for tables with the InferenceX column names) through a minimal CSV reader of the columns below. Every
refusal is an InputError naming the file, the row id and the field.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsparksim.errors import InputError
from dsparksim.fit.trace import ClientSpec

__all__ = ["FitRun", "load_fit_runs", "parse_where", "file_sha256"]

# measured metric -> the metric the re-pricer computes for it, in order of preference per kind
METRIC_CHOICES = {"tpot": ("mean_tpot_ms", "median_tpot_ms"), "ttft": ("mean_ttft_ms", "median_ttft_ms"),
                  "tput": ("output_tput_per_gpu",)}
REQUIRED = ("row_id", "concurrency", "num_prompts", "isl", "osl")
_SPEC_OFF = ("", "off", "none", "false", "0", "nan")


@dataclass(frozen=True)
class FitRun:
    """One selected run: its row id, the client spec to simulate and its measured metrics (name -> value)."""

    row_id: str
    spec: ClientSpec
    measured: dict[str, float] = field(default_factory=dict)

    @property
    def concurrency(self) -> int:
        return self.spec.concurrency


def file_sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def parse_where(text: str | None) -> dict[str, str]:
    """``KEY=VALUE,KEY=VALUE`` -> dict (values compared as strings, case-insensitive)."""
    out: dict[str, str] = {}
    if not text:
        return out
    for part in text.split(","):
        k, eq, v = part.partition("=")
        if not eq or not k.strip():
            raise InputError("--where", "where", f"expected KEY=VALUE[,KEY=VALUE...], got {part!r}")
        out[k.strip()] = v.strip()
    return out


def _read_table(path: Path) -> list[dict[str, Any]]:
    try:
        from dsparksim.bench.runs import read_runs  # type: ignore[import-not-found]
    except ImportError:
        read_runs = None
    if read_runs is not None:
        df = read_runs(path)
        return df.to_dict("records") if hasattr(df, "to_dict") else list(df)
    import pandas as pd
    try:
        df = pd.read_csv(path, dtype=str, keep_default_na=False)
    except FileNotFoundError:
        raise InputError(str(path), None, "runs table not found") from None
    except (OSError, ValueError, pd.errors.ParserError) as e:
        raise InputError(str(path), None, f"not a readable CSV runs table: {e}") from None
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise InputError(str(path), missing[0], "missing column (a runs table needs "
                         f"{', '.join(REQUIRED)} and measured metrics; see `dsparksim bench import`)")
    return df.to_dict("records")


def _num(path: Path, row: dict[str, Any], key: str, kind: type = float, required: bool = True) -> Any:
    v = row.get(key, "")
    if v is None or (isinstance(v, float) and math.isnan(v)) or str(v).strip() == "":
        if required:
            raise InputError(str(path), key, f"row {row.get('row_id')}: empty; expected a number")
        return None
    try:
        x = float(v)
    except (TypeError, ValueError):
        raise InputError(str(path), key, f"row {row.get('row_id')}: expected a number, got {v!r}") from None
    if not math.isfinite(x) or x <= 0 or (kind is int and not x.is_integer()):
        raise InputError(str(path), key, f"row {row.get('row_id')}: expected a positive "
                         f"{'integer' if kind is int else 'number'}, got {v!r}")
    return kind(x)


def load_fit_runs(path: str | Path, where: dict[str, str], *, server: dict[str, int] | None = None
                  ) -> tuple[list[FitRun], list[dict[str, Any]]]:
    """(the selected runs, their raw rows). InputError on an empty selection, a speculative, open-loop or
    non-``ignore_eos`` run, or a run without the fields the fit needs."""
    path = Path(path)
    rows = _read_table(path)
    if rows:
        for k in where:
            if k not in rows[0]:
                raise InputError("--where", k, f"no such column in {path} (columns: {', '.join(rows[0])})")
    sel = [r for r in rows if all(str(r.get(k, "")).strip().lower() == v.lower() for k, v in where.items())]
    if not sel:
        raise InputError(str(path), "--where", f"no run matches {where or 'the whole table (it is empty)'}")
    server = server or {}
    runs = []
    for r in sel:
        rid = str(r.get("row_id"))
        for key in ("mtp", "spec_config", "speculative"):
            v = str(r.get(key, "") or "").strip().lower()
            if v not in _SPEC_OFF:
                raise InputError(str(path), key, f"row {rid}: {v!r}: the fit re-prices non-speculative runs only; "
                                 "select the MTP-off runs (e.g. --where mtp=off)")
        for key, bad in (("ignore_eos", ("false", "0", "no")), ("request_rate", None)):
            v = str(r.get(key, "") or "").strip().lower()
            if key == "ignore_eos" and v in bad:
                raise InputError(str(path), key, f"row {rid}: the fit needs ignore_eos runs (step shapes must not "
                                 "depend on what the model generates)")
            if key == "request_rate" and v not in ("", "inf", "nan"):
                raise InputError(str(path), key, f"row {rid}: {v}: the fit needs closed-loop runs at request rate "
                                 "inf (a finite rate makes step shapes depend on step prices)")
        c = _num(path, r, "concurrency", int)
        rr = _num(path, r, "random_range_ratio", float, required=False) or 1.0
        # per-GPU throughput is over one engine's GPUs (InferenceX: tokens/s / TP; a profile prices one engine)
        gpus = _num(path, r, "gpus", int, required=False) or _num(path, r, "tp", int)
        spec = ClientSpec(concurrency=c, num_prompts=_num(path, r, "num_prompts", int), input_len=_num(path, r, "isl", int),
                          output_len=_num(path, r, "osl", int), range_ratio=rr, gpus=gpus, **server)
        meas: dict[str, float] = {}
        for kind, names in METRIC_CHOICES.items():
            for n in names:
                v = _num(path, r, n, float, required=False)
                if v is not None:
                    meas[n] = v
                    break
        if not meas:
            raise InputError(str(path), "mean_tpot_ms", f"row {rid}: no measured TPOT, TTFT or output throughput")
        runs.append(FitRun(row_id=rid, spec=spec, measured=meas))
    return runs, sel
