"""The runs table: one measured serving-benchmark run per row, in dsparksim's own documented format.

``COLUMNS`` is the format (name, type, unit, meaning), in file order. A runs table is a UTF-8 CSV whose first line
is ``MARKER`` and whose second line is the header; an empty cell is a missing value (NaN), never a default.
``read_runs`` validates every cell and raises an InputError naming file, line and column; ``write_runs`` validates
the same way, writes atomically and never replaces a file it did not write itself.
"""
from __future__ import annotations

import csv
import io
import math
import os
import re
import secrets
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Iterable, Mapping

from dsparksim.errors import InputError
from dsparksim.io.textio import escape_controls, read_text
from dsparksim.results.outputs import claim_out_file, register_kind

FORMAT_VERSION = 1
MARKER = f"# dsparksim runs table v{FORMAT_VERSION} (docs/benchmarks.md: Benchmark runs as input)"
TYPES = ("str", "int", "float", "bool")


@dataclass(frozen=True)
class Column:
    """One column of the runs table. ``lo``/``hi``: inclusive bounds of a number (``lo_open``: > lo);
    ``inf``: infinity allowed; ``cli``: `bench import` has an option that sets it for every imported run."""
    name: str
    type: str
    unit: str
    meaning: str
    group: str
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    inf: bool = False
    cli: bool = False
    choices: tuple[str, ...] = ()
    pattern: str = ""      # a str column's values must match this regex (fullmatch)
    pattern_text: str = ""


def _c(group: str, name: str, type_: str, unit: str, meaning: str, **kw: Any) -> Column:
    return Column(name, type_, unit, meaning, group, **kw)


_P, _D, _W, _R = "provenance", "deployment", "workload", "results"
COLUMNS: tuple[Column, ...] = (
    _c(_P, "run_id", "str", "", "unique id of the run: SOURCE_FILE:SOURCE_ROW"),
    _c(_P, "source_format", "str", "", "format of the file it was imported from",
       choices=("vllm", "sglang", "inferencex")),
    _c(_P, "source_file", "str", "", "the imported file, as given on the command line"),
    _c(_P, "source_row", "int", "", "line of the run in that file (JSONL line; CSV line, header = 1; 1 for a "
       "vLLM JSON)", lo=1),
    _c(_P, "source_ref", "str", "", "upstream reference: vLLM `label`, SGLang `tag`, InferenceX `run_url` "
       "(else its `source`)"),
    _c(_P, "measurement_date", "str", "", "when the run was measured: YYYY-MM-DD or YYYY-MM-DDTHH:MM:SS",
       cli=True, pattern=r"\d{4}-\d{2}-\d{2}(T\d{2}:\d{2}:\d{2})?", pattern_text="YYYY-MM-DD[THH:MM:SS]"),
    _c(_D, "model", "str", "", "served model (HF id or name)", cli=True),
    _c(_D, "gpu", "str", "", "accelerator, as the source names it (e.g. h200, H200-SXM-141GB)", cli=True),
    _c(_D, "gpu_count", "int", "GPUs", "GPUs serving the run (all replicas)", lo=1, cli=True),
    _c(_D, "tp", "int", "", "tensor-parallel size", lo=1, cli=True),
    _c(_D, "ep", "int", "", "expert-parallel size (1 = no expert parallelism)", lo=1, cli=True),
    _c(_D, "dp_attention", "bool", "", "data-parallel attention: the engine's tp GPUs are its attention ranks "
       "(SGLang --enable-dp-attention with --dp-size = --tp-size, TRT-LLM enable_attention_dp)", cli=True),
    _c(_D, "engine", "str", "", "serving engine: sglang, vllm, trtllm, lmdeploy, ...", cli=True),
    _c(_D, "engine_version", "str", "", "engine version or container image", cli=True),
    _c(_D, "precision", "str", "", "weight precision (e.g. fp8, bf16)", cli=True),
    _c(_D, "spec_method", "str", "", "speculative decoding: none, or the engine's algorithm lower-cased "
       "(eagle, nextn, mtp, ngram, ...)", cli=True),
    _c(_D, "spec_num_steps", "int", "", "draft steps per verification (EAGLE-style --speculative-num-steps)",
       lo=1, cli=True),
    _c(_D, "spec_num_draft_tokens", "int", "tokens", "draft tokens verified per step "
       "(--speculative-num-draft-tokens)", lo=1, cli=True),
    _c(_D, "spec_topk", "int", "", "draft tree branching (--speculative-eagle-topk)", lo=1, cli=True),
    _c(_D, "spec_mtp_nextn", "int", "layers", "MTP next-n modules (TRT-LLM num_nextn_predict_layers)", lo=1,
       cli=True),
    _c(_D, "acceptance_length", "float", "tokens/step", "mean tokens emitted per verification step, as "
       "reported by the engine", lo=1.0),
    _c(_W, "dataset_name", "str", "", "benchmark dataset (random, sharegpt, ...)", cli=True),
    _c(_W, "random_input_len", "int", "tokens", "random dataset: nominal input length L_in", lo=1, cli=True),
    _c(_W, "random_output_len", "int", "tokens", "random dataset: nominal output length L_out", lo=1, cli=True),
    _c(_W, "random_range_ratio", "float", "", "random dataset: range ratio R (see random_range_convention)",
       lo=0.0, hi=1.0, cli=True),
    _c(_W, "random_range_convention", "str", "", "how R draws lengths: low = uniform in [R*L, L] (SGLang, "
       "InferenceX, vLLM before mid-2025); symmetric = uniform in [L*(1-R), L*(1+R)] (vllm bench serve)",
       choices=("low", "symmetric"), cli=True),
    _c(_W, "lengths_file", "str", "", "file of per-request lengths the client replayed, if any", cli=True),
    _c(_W, "max_concurrency", "int", "requests", "client cap on requests in flight (empty: no cap or not "
       "recorded)", lo=1, cli=True),
    _c(_W, "request_rate", "float", "req/s", "client release rate; inf = all released at once", lo=0.0,
       lo_open=True, inf=True, cli=True),
    _c(_W, "num_prompts", "int", "requests", "measured prompts", lo=1, cli=True),
    _c(_W, "num_warmup_prompts", "int", "requests", "unmeasured warm-up prompts run first", lo=0, cli=True),
    _c(_W, "ignore_eos", "bool", "", "every request generates exactly its drawn output length", cli=True),
    _c(_R, "completed", "int", "requests", "requests that completed", lo=0),
    _c(_R, "failed", "int", "requests", "requests that failed", lo=0),
    _c(_R, "duration_s", "float", "s", "benchmark duration (first release to last completion)", lo=0.0,
       lo_open=True),
    _c(_R, "total_input_tokens", "int", "tokens", "input tokens of the measured requests", lo=0),
    _c(_R, "total_output_tokens", "int", "tokens", "output tokens of the measured requests", lo=0),
    _c(_R, "output_throughput", "float", "tok/s", "output tokens / duration, whole deployment", lo=0.0),
    _c(_R, "output_throughput_per_gpu", "float", "tok/s/GPU", "output_throughput / GPUs (InferenceX: as "
       "published, aggregate / tp)", lo=0.0),
    *(_c(_R, f"{s}_{m}_ms", "float", "ms", f"{label} {what} over requests", lo=0.0)
      for m, what in (("tpot", "TPOT ((E2E - TTFT) / (output tokens - 1))"), ("ttft", "time to first token"),
                      ("e2el", "end-to-end latency"))
      for s, label in (("mean", "mean"), ("median", "median"), ("p99", "99th percentile"))),
)
BY_NAME: dict[str, Column] = {c.name: c for c in COLUMNS}
NAMES: tuple[str, ...] = tuple(BY_NAME)
REQUIRED = ("run_id", "source_format", "source_file", "source_row")   # never empty


def parse_cell(col: Column, text: str, source: str | Path, line: int | None) -> Any:
    """The value of one CSV cell (``None`` for an empty cell); InputError naming file, line and column."""
    s = text.strip()
    if s == "":
        return None
    if col.type == "str":
        return check_value(col, s, source, line)
    if col.type == "bool":
        low = s.lower()
        if low in ("true", "false"):
            return low == "true"
        raise InputError(source, col.name, f"expected true or false, got {escape_controls(s)!r}", line=line)
    try:
        v = float(s)
    except ValueError:
        raise InputError(source, col.name, f"expected a number ({col.unit or col.type}), got "
                         f"{escape_controls(s)!r}", line=line) from None
    if math.isnan(v):   # a missing value is an empty cell; 'nan' text would pass a required cell as missing
        raise InputError(source, col.name, f"expected a number ({col.unit or col.type}) or an empty cell for a "
                         f"missing value, got {escape_controls(s)!r}", line=line)
    return check_value(col, v, source, line)


def check_value(col: Column, v: Any, source: str | Path, line: int | None) -> Any:
    """``v`` (None, or a value of the column's type; numbers may come as float) checked against the column:
    type, integrality, bounds, infinity, choices. Returns the normalised value (int for int columns)."""
    if v is None:
        return None
    if col.type == "str":
        if not isinstance(v, str):
            raise InputError(source, col.name, f"expected text, got {v!r}", line=line)
        if col.choices and v not in col.choices:
            raise InputError(source, col.name, f"expected one of {', '.join(col.choices)}, got "
                             f"{escape_controls(v)!r}", line=line)
        if col.pattern and not re.fullmatch(col.pattern, v):
            raise InputError(source, col.name, f"expected {col.pattern_text}, got {escape_controls(v)!r}", line=line)
        if col.pattern_text.startswith("YYYY-MM-DD"):   # the shape matched: it must also be a calendar date
            try:
                datetime.fromisoformat(v)
            except ValueError:
                raise InputError(source, col.name, f"not a calendar date or time: {escape_controls(v)!r}",
                                 line=line) from None
        return v
    if col.type == "bool":
        if not isinstance(v, bool):
            raise InputError(source, col.name, f"expected true or false, got {v!r}", line=line)
        return v
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise InputError(source, col.name, f"expected a number, got {escape_controls(repr(v))}", line=line)
    if isinstance(v, float) and math.isnan(v):
        return None
    if math.isinf(v) and not (col.inf and v > 0):
        raise InputError(source, col.name, f"expected a finite number, got {v}", line=line)
    if col.type == "int" and not math.isinf(v):
        if float(v) != int(v):
            raise InputError(source, col.name, f"expected an integer, got {v!r}", line=line)
        v = int(v)
    if col.lo is not None and (v < col.lo or (col.lo_open and v == col.lo)):
        raise InputError(source, col.name, f"expected a value {'>' if col.lo_open else '>='} {col.lo:g}, got {v}",
                         line=line)
    if col.hi is not None and v > col.hi:
        raise InputError(source, col.name, f"expected a value <= {col.hi:g}, got {v}", line=line)
    return v


def check_row(row: Mapping[str, Any], source: str | Path, line: int | None) -> dict[str, Any]:
    """A complete, normalised row (every column, None where missing); InputError on an unknown column, a bad
    value, an empty required column or counts that contradict each other."""
    unknown = [k for k in row if k not in BY_NAME]
    if unknown:
        raise InputError(source, unknown[0], "not a column of the runs table", line=line)
    out = {c.name: check_value(c, row.get(c.name), source, line) for c in COLUMNS}
    for k in REQUIRED:
        if out[k] is None:
            raise InputError(source, k, "must not be empty", line=line)
    for k in ("tp", "ep"):   # a TP or EP group spans that many of the run's GPUs
        if out[k] is not None and out["gpu_count"] is not None and out[k] > out["gpu_count"]:
            raise InputError(source, k, f"{k} ({out[k]}) exceeds gpu_count ({out['gpu_count']}): a {k.upper()} group "
                             f"spans {out[k]} GPUs", line=line)
    done, n = out["completed"], out["num_prompts"]
    if done is not None and n is not None and done + (out["failed"] or 0) > n:
        raise InputError(source, "completed", f"completed ({done}) + failed ({out['failed'] or 0}) exceeds "
                         f"num_prompts ({n})", line=line)
    _check_latency_units(out, source, line)
    return out


def _check_latency_units(run: Mapping[str, Any], source: str | Path, line: int | None) -> None:
    """Refuse latencies that contradict the run's own duration by Little's law (a statistic written in seconds
    or microseconds where the column says ms): completed x mean latency / duration is the mean number of requests
    in flight, which never exceeds the client's cap (or its prompts), and, for a run released at once (request
    rate inf) with every prompt completed, is at least 1 (a request is in flight from the first release to the
    last completion). The mean latency is mean_e2el_ms, else mean TTFT + mean TPOT x (output tokens per request
    - 1); a factor 2 either way covers that estimate. A duration padded with time no completed request was in
    flight (a profiled run: both clients time the profiler's stop in it; requests that failed unrecorded) also reads
    below 1, and the refusal names those causes as well."""
    done, dur, out_tok = run["completed"], run["duration_s"], run["total_output_tokens"]
    if not done or not dur or out_tok is None:
        return
    col, lat = "mean_e2el_ms", run["mean_e2el_ms"]
    if lat is None and run["mean_ttft_ms"] is not None and run["mean_tpot_ms"] is not None:
        col, lat = "mean_tpot_ms", run["mean_ttft_ms"] + run["mean_tpot_ms"] * max(out_tok / done - 1, 0)
    if lat is None:
        return
    flight = done * lat / 1000 / dur
    cap = run["max_concurrency"] or run["num_prompts"] or done
    whole = math.isinf(run["request_rate"] or 0) and not run["failed"] and run["num_prompts"] in (None, done)
    if flight > 2 * cap or (whole and flight < 0.5):
        high = flight > 2 * cap
        bound = f"above the cap of {cap}" if high else "below the 1 a run released at once always has"
        idle = "" if high else (" Or does the duration count time no completed request was in flight: a --profile "
                                "run (SGLang's bench_serving and vLLM's benchmark_serving.py time the profiler's "
                                "stop in it, so its throughput is understated too), or requests that failed "
                                "unrecorded (SGLang's file has no failed count)?")
        raise InputError(source, col, f"{lat:.4g} ms mean latency x {done} completed requests / duration {dur:.4g} s "
                         f"= {flight:.3g} requests in flight on average, {bound}: are the latency statistics in "
                         f"milliseconds (and duration_s in seconds)?{idle}", line=line)


_SAME_RUN_IGNORES = ("run_id", "source_file", "source_row", "source_ref")   # where a copy was read from


def duplicate_run(runs: Iterable[Mapping[str, Any]]) -> tuple[Mapping[str, Any], Mapping[str, Any]] | None:
    """The first two runs that are one measurement twice (every column equal but where they were read from, and
    some result measured: two real runs never agree on a duration and every statistic), or None. One file
    appended twice, or a copy of a result file imported beside it, would count that run twice."""
    seen: dict[tuple, Mapping[str, Any]] = {}
    for r in runs:
        if all(r.get(c.name) is None for c in COLUMNS if c.group == _R):
            continue
        key = tuple(format_cell(r.get(c.name)) for c in COLUMNS if c.name not in _SAME_RUN_IGNORES)
        if key in seen:
            return seen[key], r
        seen[key] = r
    return None


def format_cell(v: Any) -> str:
    """Lossless text of a value: '' for missing, true/false, ints as ints, floats as Python's shortest repr."""
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return "inf" if math.isinf(v) else repr(v)
    return str(v)


def import_hint(first: int) -> str:
    """A pointer to `bench import` when a file without the marker line is no runs table at all: a benchmark's own
    result file (vLLM JSON, SGLang JSONL, the InferenceX table) handed straight to `bench replay` / `profile fit`."""
    if first != 1:   # the marker line is there: a runs table with a wrong column, no converted file
        return ""
    return ("; a benchmark's own result file (vLLM JSON, SGLang JSONL, InferenceX CSV) is converted first: "
            "dsparksim bench import FILE... --out RUNS.csv")


def read_runs(path: str | Path) -> list[dict[str, Any]]:
    """Every run of a runs table, each a dict over ``NAMES`` (None where empty), validated cell by cell.

    The header must hold exactly the columns of ``COLUMNS`` (any order); the marker line is optional (a table
    written by hand or exported from a spreadsheet has none). run_id must be unique.
    """
    text = read_text(path, "runs table")
    lines = text.splitlines(keepends=True)
    first = 1
    if lines and lines[0].startswith("#"):
        if not lines[0].startswith("# dsparksim runs table"):
            raise InputError(path, None, "comment line is not a dsparksim runs table marker", line=1)
        ver = re.match(r"# dsparksim runs table v(\S*)", lines[0])
        if ver and ver.group(1) != str(FORMAT_VERSION):   # a table of another format version is not read as v1
            raise InputError(path, None, f"runs table format v{escape_controls(ver.group(1))}; this dsparksim reads "
                             f"v{FORMAT_VERSION}", line=1)
        lines, first = lines[1:], 2
    rd = csv.reader(io.StringIO("".join(lines)))
    try:
        header = next(rd)
    except StopIteration:
        raise InputError(path, None, "empty file; expected a runs table header", line=first) from None
    except csv.Error as e:
        raise InputError(path, None, f"not CSV: {e}", line=first) from None
    header = [h.strip() for h in header]
    for h in header:
        if h not in BY_NAME:
            raise InputError(path, escape_controls(h), "not a column of the runs table" + import_hint(first),
                             line=first)
        if header.count(h) > 1:
            raise InputError(path, h, "column given twice", line=first)
    missing = [n for n in NAMES if n not in header]
    if missing:
        raise InputError(path, missing[0], f"missing column ({len(missing)} missing in all)", line=first)
    runs: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    try:
        for cells in rd:
            line = first + rd.line_num - 1
            if not cells or all(not c.strip() for c in cells):
                continue
            if len(cells) != len(header):
                raise InputError(path, None, f"expected {len(header)} cells, got {len(cells)}", line=line)
            row = {h: parse_cell(BY_NAME[h], c, path, line) for h, c in zip(header, cells)}
            row = check_row(row, path, line)
            if row["run_id"] in seen:
                raise InputError(path, "run_id", f"{row['run_id']!r} also on line {seen[row['run_id']]}",
                                 line=line)
            seen[row["run_id"]] = line
            runs.append(row)
    except csv.Error as e:
        raise InputError(path, None, f"not CSV: {e}", line=first + rd.line_num - 1) from None
    return runs


def runs_frame(runs: Iterable[Mapping[str, Any]]):
    """The runs as a pandas DataFrame in column order (ints as nullable Int64, bools as nullable boolean)."""
    import pandas as pd  # lazy: pandas

    df = pd.DataFrame([dict(r) for r in runs], columns=list(NAMES))
    for c in COLUMNS:
        if c.type == "int":
            df[c.name] = df[c.name].astype("Int64")
        elif c.type == "float":
            df[c.name] = df[c.name].astype(float)
        elif c.type == "bool":
            df[c.name] = df[c.name].astype("boolean")
    return df


def written_by_us(path: Path) -> bool:
    """True when ``path`` starts with a runs-table marker line (a file `bench import` wrote)."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.readline().startswith("# dsparksim runs table")
    except (OSError, UnicodeDecodeError):
        return False


register_kind("runs", written_by_us)   # the overwrite rule knows a runs table by its marker line


def check_out(path: str | Path, force: bool, inputs: Iterable[str | Path] = (), option: str = "--out") -> Path:
    """Raise ConfigError unless ``path`` may be written, by the one overwrite rule
    (:func:`dsparksim.results.outputs.claim_out_file`): it does not exist, or ``force`` is set and it is a runs
    table dsparksim wrote; never a directory or one of the ``inputs``. Checked before any input is read."""
    return claim_out_file(path, "runs", force, option, inputs=list(inputs))


def write_runs(runs: Iterable[Mapping[str, Any]], path: str | Path, force: bool = False) -> int:
    """Write the runs (each validated with ``check_row``) as a runs table, atomically: the file appears complete
    or not at all. An existing ``path`` is refused unless ``force`` and it is a runs table (``check_out``; a
    command checks that before reading its inputs too). Returns the number of rows."""
    path = check_out(path, force)
    rows = [check_row(r, f"run {r.get('run_id')!r}", None) for r in runs]
    ids = [r["run_id"] for r in rows]
    dup = next((i for i in ids if ids.count(i) > 1), None)
    if dup is not None:
        raise InputError(str(dup).rsplit(":", 1)[0], None, f"run {dup!r} imported twice (the same file given "
                         "twice?)")
    buf = io.StringIO()
    buf.write(MARKER + "\n")
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(NAMES)
    for r in rows:
        w.writerow([format_cell(r[n]) for n in NAMES])
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp"
    try:
        with open(tmp, "x", encoding="utf-8", newline="") as f:
            f.write(buf.getvalue())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return len(rows)
