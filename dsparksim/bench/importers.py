"""Readers that turn serving-benchmark result files into rows of the runs table (``dsparksim.bench.runs``).

Three formats, told apart by content (or named with ``fmt``):

* ``vllm``: the result JSON of ``vllm bench serve --save-result`` (keys as written by ``main_async`` and
  ``benchmark`` in vllm/benchmarks/serve.py, vllm-project/vllm at 009e6d4a: ``date, endpoint_type, backend, label,
  model_id, tokenizer_id, num_prompts``, any ``--metadata KEY=VALUE`` pairs, ``request_rate`` (a number or the
  string "inf"), ``burstiness, max_concurrency, duration, completed, failed, total_input_tokens,
  total_output_tokens, request_throughput, ..., output_throughput, ...``, ``spec_decode_acceptance_length`` when
  the server speculates, and ``mean_/median_/std_/pNN_{ttft,tpot,itl,e2el}_ms`` for the selected metrics). A file
  of several such objects, one per line, is read too.
* ``sglang``: the JSONL that ``python -m sglang.bench_serving --output-file`` appends, one object per run (the
  ``result`` dict of ``benchmark`` in python/sglang/bench_serving.py: ``tag, backend, dataset_name, request_rate,
  max_concurrency, sharegpt_output_len, random_input_len, random_output_len, random_range_ratio, server_info,
  duration, completed, total_input_tokens, ..., output_throughput, {mean,median,std,p99}_e2e_latency_ms,
  {mean,median,std,p99}_{ttft,tpot}_ms, ..., concurrency, accept_length``; older versions write a subset, and
  the ``sglang.benchmark`` package's ``save_results`` (python/sglang/benchmark/metrics.py at 6e48df33) writes
  ``BenchmarkMetrics.__dict__``, whose token counts are ``total_input`` / ``total_output``).
  ``server_info`` (the server's /get_server_info: its ServerArgs and version) fills the deployment columns.
* ``inferencex``: the table of ../shared/data/inferencex (one published closed-loop point per row).

What the runs table cannot state is refused, naming the field, never imported as something else: a vLLM ramp-up
(``ramp_up_strategy``; its ``request_rate`` then reads "inf"), ``burstiness`` other than 1 at a finite rate
(gamma or constant gaps; bench replay draws Poisson), probe requests (``probe_completed``), a run with
``completed`` 0 (the clients write 0.0 or NaN for every statistic then), a NaN statistic, SGLang's
``request_rate: "trace"``. ``max_concurrency: null`` means no cap (both clients write it without
``--max-concurrency``; SGLang's 0 too), so ``--max-concurrency`` contradicts it.

Columns a format does not carry stay empty unless an option of `bench import` sets them (``overrides``); a value
the file carries and an option contradicts is an error, never silently replaced.
"""
from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import re
from datetime import datetime
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, Iterator, Mapping

from dsparksim.bench.runs import BY_NAME, check_row, check_value, duplicate_run, parse_cell
from dsparksim.cost.analytic.builder import M_GRID
from dsparksim.cost.analytic.hardware import same_gpu
from dsparksim.errors import InputError
from dsparksim.io.textio import escape_controls, loads_json, read_text

FORMATS = ("vllm", "sglang", "inferencex")
EXPECTED = ("expected a vLLM `bench serve --save-result` JSON, an SGLang `bench_serving --output-file` JSONL or "
            "an InferenceX CSV")
# Runs with 2 x concurrency unmeasured warm-up prompts (InferenceX README: since 2026-01-21)
INFERENCEX_WARMUP_SINCE = "2026-01-21"
INFERENCEX_COLUMNS = ("row_id", "source", "measurement_date", "run_url", "model", "hardware", "gpu_count_total",
                      "framework", "framework_image", "precision", "disaggregated", "tp", "ep", "dp_attention",
                      "mtp", "spec_config", "acceptance_length_reported", "isl", "osl", "random_range_ratio",
                      "concurrency", "num_prompts", "output_tput_per_gpu", "output_tput_aggregate",
                      "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms", "mean_ttft_ms", "median_ttft_ms",
                      "p99_ttft_ms", "mean_e2el_s", "median_e2el_s", "p99_e2el_s")
# Engine of a client's backend name (sglang.bench_serving --backend names the server it talks to).
_ENGINES = {"sglang": "sglang", "sglang-native": "sglang", "sglang-oai": "sglang", "sglang-oai-chat": "sglang",
            "vllm": "vllm", "vllm-chat": "vllm", "trt": "trtllm", "lmdeploy": "lmdeploy",
            "lmdeploy-chat": "lmdeploy"}
# A JSON null that states something (vs a key the writer did not have): column -> (key, what null means). Both
# clients write max_concurrency = args.max_concurrency, None without the flag (no semaphore: no cap).
NULL_MEANS = {"max_concurrency": ("max_concurrency", "no cap (max_concurrency null: the client ran without "
                                  "--max-concurrency)")}
STAT_COLUMNS = tuple(f"{s}_{m}_ms" for m in ("tpot", "ttft", "e2el") for s in ("mean", "median", "p99"))
_STATS = ("mean", "median", "p99")
# Which columns each format fills from the file itself, and from what (the docs/benchmarks.md table says the same; a test
# checks it against the fixtures). Provenance columns are always filled; anything else comes from an option (or,
# for vLLM, a `--metadata KEY=VALUE` pair whose KEY is an option column) or stays empty.
FILLED_BY: dict[str, dict[str, str]] = {
    "vllm": {
        "source_ref": "label", "measurement_date": "date", "model": "model_id", "num_prompts": "num_prompts",
        "request_rate": "request_rate", "max_concurrency": "max_concurrency", "duration_s": "duration",
        "completed": "completed", "failed": "failed", "total_input_tokens": "total_input_tokens",
        "total_output_tokens": "total_output_tokens", "output_throughput": "output_throughput",
        "output_throughput_per_gpu": "output_throughput / gpu_count",
        "acceptance_length": "spec_decode_acceptance_length",
        "random_range_convention": "symmetric when a range ratio is set",
        **{f"{s}_{m}_ms": f"{s}_{m}_ms" for m in ("tpot", "ttft") for s in _STATS},
        **{f"{s}_e2el_ms": f"{s}_e2el_ms (with --percentile-metrics ...,e2el)" for s in _STATS},
    },
    "sglang": {
        "source_ref": "tag", "model": "server_info.served_model_name or model_path", "tp": "server_info.tp_size",
        "ep": "server_info.ep_size", "dp_attention": "server_info.enable_dp_attention (dp_size != tp_size refused)",
        "gpu_count": "server_info: tp_size x pp_size (x dp_size without DP attention)",
        "engine": "backend (sglang*, vllm*, trt -> trtllm, lmdeploy*)", "engine_version": "server_info.version",
        "spec_method": "server_info.speculative_algorithm (null -> none)",
        "spec_num_steps": "server_info.speculative_num_steps",
        "spec_num_draft_tokens": "server_info.speculative_num_draft_tokens",
        "spec_topk": "server_info.speculative_eagle_topk", "acceptance_length": "accept_length",
        "dataset_name": "dataset_name", "random_input_len": "random_input_len (random datasets)",
        "random_output_len": "random_output_len (random datasets)",
        "random_range_ratio": "random_range_ratio (random datasets)", "random_range_convention": "low",
        "max_concurrency": "max_concurrency", "request_rate": "request_rate", "duration_s": "duration",
        "completed": "completed", "total_input_tokens": "total_input_tokens (or total_input)",
        "total_output_tokens": "total_output_tokens (or total_output)", "output_throughput": "output_throughput",
        "output_throughput_per_gpu": "output_throughput / gpu_count",
        **{f"{s}_{m}_ms": f"{s}_{m}_ms" for m in ("tpot", "ttft") for s in _STATS},
        **{f"{s}_e2el_ms": f"{s}_e2e_latency_ms" for s in _STATS},
    },
    "inferencex": {
        "source_ref": "run_url (else source)", "measurement_date": "measurement_date", "model": "model",
        "gpu": "hardware", "gpu_count": "gpu_count_total", "tp": "tp", "ep": "ep", "dp_attention": "dp_attention",
        "engine": "framework (trt -> trtllm)", "engine_version": "framework_image", "precision": "precision",
        "spec_method": "mtp off -> none; on -> spec_config's method", "spec_num_steps": "spec_config num_steps",
        "spec_num_draft_tokens": "spec_config num_draft_tokens", "spec_topk": "spec_config topk",
        "acceptance_length": "acceptance_length_reported", "dataset_name": "random", "random_input_len": "isl",
        "random_output_len": "osl", "random_range_ratio": "random_range_ratio", "random_range_convention": "low",
        "max_concurrency": "concurrency", "request_rate": "inf", "num_prompts": "num_prompts",
        "num_warmup_prompts": "2 x concurrency from 2026-01-21, else 0", "ignore_eos": "true",
        "output_throughput": "output_tput_aggregate", "output_throughput_per_gpu": "output_tput_per_gpu",
        **{f"{s}_{m}_ms": f"{s}_{m}_ms" for m in ("tpot", "ttft") for s in _STATS},
        **{f"{s}_e2el_ms": f"{s}_e2el_s x 1000" for s in _STATS},
    },
}


def import_files(paths: list[str | Path], fmt: str = "auto", overrides: Mapping[str, Any] | None = None,
                 notes: list[str] | None = None) -> list[dict[str, Any]]:
    """The runs of every file, in order; the first bad file or record raises an InputError (nothing partial).
    ``notes`` (if given) receives one line per value the files hold but the runs table leaves empty, and why."""
    rows: list[dict[str, Any]] = []
    seen: dict[Path, str | Path] = {}
    for p in paths:
        key = Path(p).resolve()
        if key in seen:   # x.csv and ./x.csv: the same runs under two run ids
            raise InputError(p, None, f"the same file as {str(seen[key])!r}, given twice (its runs would be "
                             "imported twice)")
        seen[key] = p
        rows.extend(import_file(p, fmt, overrides, notes))
    dup = duplicate_run(rows)
    if dup is not None:
        a, b = dup
        raise InputError(b["source_file"], None, f"run {b['run_id']} is run {a['run_id']} again (every field but its "
                         "place equal: the same measurement appended or copied twice); import each run once",
                         line=b["source_row"])
    return rows


def import_file(path: str | Path, fmt: str = "auto", overrides: Mapping[str, Any] | None = None,
                notes: list[str] | None = None) -> list[dict[str, Any]]:
    """The runs in one file as checked runs-table rows (see the module docstring); ``notes``: see import_files."""
    if fmt not in ("auto", *FORMATS):
        raise InputError("bench import", "--format", f"expected auto, {', '.join(FORMATS)}; got {fmt!r}")
    text = read_text(path, "benchmark file")
    if not text.strip():
        raise InputError(path, None, f"empty file; {EXPECTED}")
    kind = fmt if fmt != "auto" else sniff(text, path)
    if kind == "inferencex":
        pairs: Iterator[tuple[str, int, dict[str, Any]]] = _inferencex_rows(text, path)
    else:
        pairs = ((kind if fmt != "auto" else classify(rec, path, line), line, rec)
                 for line, rec in json_records(text, path))
    out = []
    server: dict[str, list[int]] = {}   # SGLang: the server settings of server_info -> the lines that record them
    for k, line, rec in pairs:
        row = {"vllm": _vllm_row, "sglang": _sglang_row, "inferencex": _inferencex_row}[k](rec, path, line)
        said = {} if k == "inferencex" else {col: what for col, (key, what) in NULL_MEANS.items()
                                             if key in rec and rec[key] is None}
        if k == "sglang" and _sglang_uncapped(rec):
            said["max_concurrency"] = "no cap (max_concurrency 0: bench_serving runs without a semaphore then)"
        out.append(finish_row(row, k, path, line, overrides or {}, said, notes))
        if k == "vllm" and notes is not None:
            notes.extend(vllm_metadata_notes(rec, out[-1], path, line))
        if k == "sglang":
            server.setdefault(sglang_server_settings(rec), []).append(line)
    if not out:
        raise InputError(path, None, f"no runs in the file; {EXPECTED}")
    if notes is not None:
        notes.extend(sglang_server_note(path, opts, lines) for opts, lines in server.items() if opts)
    return out


def sniff(text: str, path: str | Path) -> str:
    """'json' content (vLLM or SGLang, told apart per record) or 'inferencex'; InputError for anything else."""
    head = text.lstrip()
    if head[:1] in "{[":
        return "json"
    first = head.splitlines()[0]
    if first.startswith("# dsparksim runs table"):
        raise InputError(path, None, "already a dsparksim runs table (bench import writes these; the commands that "
                         "take runs read it as it is)")
    cols = {c.strip() for c in next(csv.reader([first]), [])}
    if {"hardware", "framework", "framework_image"} <= cols:   # then every column it needs is checked
        return "inferencex"
    raise InputError(path, None, f"unknown format: {EXPECTED}")


def classify(rec: Mapping[str, Any], path: str | Path, line: int) -> str:
    """'vllm' or 'sglang' from a result object's keys."""
    if "model_id" in rec and ("tokenizer_id" in rec or "endpoint_type" in rec):
        return "vllm"
    if {"backend", "dataset_name", "random_input_len", "completed"} <= rec.keys():
        return "sglang"
    raise InputError(path, None, "unknown format: a JSON object that is neither a vLLM result (no 'model_id') "
                     f"nor an SGLang bench_serving record (no 'dataset_name'); {EXPECTED}, or name it with "
                     "--format", line=line)


def json_records(text: str, path: str | Path) -> list[tuple[int, dict[str, Any]]]:
    """(line, object) for a JSON document holding one object, or for each non-blank line of a JSONL file."""
    lines = text.splitlines()
    first_i = next(i for i, s in enumerate(lines) if s.strip())
    try:   # parsed once: a --save-detailed result is one line of tens of MB
        first = loads_json(lines[first_i], path, line=first_i + 1)
    except InputError:
        if sum(1 for s in lines if s.strip()) == 1:
            raise
        first = None   # not a whole object on its first line: one pretty-printed document
    if first is not None:
        recs = [(first_i + 1, first)] + [(i + 1, loads_json(s, path, line=i + 1))
                                         for i, s in enumerate(lines) if i > first_i and s.strip()]
    else:
        recs = [(first_i + 1, loads_json(text, path))]
    for line, rec in recs:
        if not isinstance(rec, dict):
            raise InputError(path, None, f"expected a JSON object per run, got a JSON {type(rec).__name__}",
                             line=line)
    return recs


class _Rec:
    """Typed access to one result object; every failure names file, line and field."""

    def __init__(self, d: Mapping[str, Any], path: str | Path, line: int, prefix: str = "") -> None:
        self.d, self.path, self.line, self.prefix = d, path, line, prefix

    def err(self, key: str, msg: str) -> InputError:
        return InputError(self.path, self.prefix + key, msg, line=self.line)

    def get(self, key: str, required: bool) -> Any:
        if key not in self.d:
            if required:
                raise self.err(key, "missing field")
            return None
        v = self.d[key]
        if v is None and required:
            raise self.err(key, "is null; expected a value")
        return v

    def num(self, key: str, col: str, required: bool = False, inf_text: bool = False) -> Any:
        v = self.get(key, required)
        if v is None:
            return None
        if inf_text and isinstance(v, str) and v.strip().lower() in ("inf", "infinity"):
            v = math.inf
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise self.err(key, f"expected a number, got {escape_controls(repr(v))}")
        if isinstance(v, float) and math.isnan(v):   # never an empty cell: null is how a tool says "none"
            raise self.err(key, "is NaN; expected a number" + ("" if required else " or null"))
        return check_value(dataclasses.replace(BY_NAME[col], name=self.prefix + key), v, self.path, self.line)

    def text(self, key: str, required: bool = False) -> str | None:
        v = self.get(key, required)
        if v is None:
            return None
        if not isinstance(v, str):
            raise self.err(key, f"expected text, got {escape_controls(repr(v))}")
        return v.strip() or None

    def flag(self, key: str) -> bool | None:
        v = self.get(key, False)
        if v is None or isinstance(v, bool):
            return v
        raise self.err(key, f"expected true or false, got {escape_controls(repr(v))}")


def _vllm_date(r: _Rec) -> str | None:
    s = r.text("date")
    if s is None:
        return None
    try:
        return datetime.strptime(s, "%Y%m%d-%H%M%S").isoformat()
    except ValueError:
        raise r.err("date", f"expected YYYYMMDD-HHMMSS (as vllm bench serve writes it), got "
                    f"{escape_controls(s)!r}") from None


def _vllm_row(d: Mapping[str, Any], path: str | Path, line: int) -> dict[str, Any]:
    r = _Rec(d, path, line)
    if "total_input_sequences" in d:   # benchmark() of a POOLING task: no output tokens, no TPOT
        raise r.err("total_input_sequences", "a pooling/embedding benchmark (no output tokens); expected a "
                    "generation run")
    _vllm_traffic(r)
    _some_completed(r, r.num("failed", "failed"))
    row: dict[str, Any] = {
        "source_ref": r.text("label"), "measurement_date": _vllm_date(r), "model": r.text("model_id", True),
        "num_prompts": r.num("num_prompts", "num_prompts", True),
        "request_rate": r.num("request_rate", "request_rate", True, inf_text=True),
        "max_concurrency": r.num("max_concurrency", "max_concurrency"),
        "duration_s": r.num("duration", "duration_s", True), "completed": r.num("completed", "completed", True),
        "failed": r.num("failed", "failed"),
        "total_input_tokens": r.num("total_input_tokens", "total_input_tokens", True),
        "total_output_tokens": r.num("total_output_tokens", "total_output_tokens", True),
        "output_throughput": r.num("output_throughput", "output_throughput", True),
        "acceptance_length": r.num("spec_decode_acceptance_length", "acceptance_length"),
    }
    for col in STAT_COLUMNS:
        row[col] = r.num(col, col)
    for name, (key, v) in _vllm_metadata(r).items():
        if name not in _VLLM_OWN:
            row[name] = v
    return row


_VLLM_OWN = {"model", "num_prompts", "request_rate", "max_concurrency", "measurement_date"}   # filled by the file
_VLLM_KEYS = {"num_prompts", "request_rate", "max_concurrency"}   # vLLM's own keys spelled as a column
# The keys `vllm bench serve --save-result` writes itself (main_async and benchmark in vllm/benchmarks/serve.py at
# 009e6d4a, and best_of / use_beam_search of the older benchmarks/benchmark_serving.py), beside the statistics
# (mean_/median_/std_/pNN_<metric>_ms) and the probe_ / spec_decode_ / diffusion_ groups: a key outside the
# --metadata block that is none of these and names no column is a pair the importer does not read. The older
# script spells its goodput "request_goodput:" (with the colon; its copy in InferenceX's bench_serving too).
_VLLM_FIELDS = frozenset((
    "date", "endpoint_type", "backend", "label", "model_id", "tokenizer_id", "best_of", "use_beam_search",
    "num_prompts", "request_rate", "burstiness", "max_concurrency", "ramp_up_strategy", "ramp_up_start_rps",
    "ramp_up_end_rps", "duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
    "total_input_sequences", "request_throughput", "request_goodput", "request_goodput:", "output_throughput",
    "total_token_throughput", "input_sequence_throughput", "input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times",
    "queue_times", "generated_texts", "errors", "max_output_tokens_per_s", "max_concurrent_requests", "rtfx",
    "rps_change_events"))
_VLLM_FIELD_PREFIXES = ("probe_", "spec_decode_", "diffusion_")
_VLLM_STAT = re.compile(r"(mean|median|std|p\d+(\.\d+)?)_[a-z0-9_]+_ms")


def _vllm_field(key: str) -> bool:
    """Whether ``key`` is one `vllm bench serve` writes itself (not a --metadata pair)."""
    return key in _VLLM_FIELDS or key.startswith(_VLLM_FIELD_PREFIXES) or _VLLM_STAT.fullmatch(key) is not None


def metadata_column(key: str) -> str | None:
    """The option column a ``--metadata KEY=VALUE`` key names, in any spelling of it (``gpu_count``,
    ``gpu-count``, ``GPU-Count``), or None."""
    name = key.strip().lower().replace("-", "_")
    col = BY_NAME.get(name)
    return name if col is not None and col.cli else None


def _vllm_metadata(r: _Rec) -> dict[str, tuple[str, Any]]:
    """column -> (key, value) of the file's keys that name an option column (``vllm bench serve --metadata
    KEY=VALUE`` writes each pair as a top-level text key, KEY as typed), typed as the column. vLLM's own keys
    (num_prompts, request_rate, max_concurrency) are not metadata. Two spellings of one column with different
    values are refused."""
    out: dict[str, tuple[str, Any]] = {}
    for key, v in r.d.items():
        name = metadata_column(key)
        if name is None or key in _VLLM_KEYS or v is None:
            continue
        col = BY_NAME[name]
        v = (parse_cell(dataclasses.replace(col, name=f"metadata {key}"), v, r.path, r.line) if isinstance(v, str)
             else r.num(key, name) if col.type in ("int", "float") else v)
        if name in out and out[name][1] != v:
            raise r.err(key, f"{v!r} beside {out[name][0]!r} {out[name][1]!r}: two spellings of the column "
                        f"{name!r} with different values; expected one")
        out[name] = (key, v)
    return out


def vllm_metadata_notes(d: Mapping[str, Any], row: Mapping[str, Any], path: str | Path, line: int) -> list[str]:
    """What a vLLM file's ``--metadata`` pairs hold that the runs table does not take, said rather than dropped:
    keys naming no column (the pairs sit between ``num_prompts`` and ``request_rate``, where main_async writes them
    in serve.py at 009e6d4a), keys elsewhere in the file that are neither a field vLLM writes nor a column (pairs
    added after the run, or a file whose keys were reordered), and pairs naming a column the file itself fills
    (model from model_id, the date)."""
    keys = list(d)
    out = []
    meta: list[str] = []
    if "num_prompts" in keys and "request_rate" in keys and keys.index("num_prompts") < keys.index("request_rate"):
        meta = keys[keys.index("num_prompts") + 1:keys.index("request_rate")]
    unread = [k for k in meta if metadata_column(k) is None and not _vllm_field(k)]
    if unread:
        out.append(f"{path}:{line}: --metadata key(s) not read, no runs-table column: "
                   f"{', '.join(escape_controls(repr(k)) for k in unread)} (the option columns, e.g. gpu, "
                   "gpu_count, tp, ep, engine, are read in either spelling, gpu_count or gpu-count)")
    elsewhere = [k for k in keys if k not in meta and metadata_column(k) is None and not _vllm_field(k)]
    if elsewhere:
        out.append(f"{path}:{line}: key(s) outside the --metadata block not read, neither a field vllm bench serve "
                   f"writes nor a runs-table column: {', '.join(escape_controls(repr(k)) for k in elsewhere)} "
                   "(--metadata pairs sit between num_prompts and request_rate; an option column, e.g. gpu, "
                   "gpu_count, tp, is read wherever it is)")
    for name, (key, v) in _vllm_metadata(_Rec(d, path, line)).items():
        if name in _VLLM_OWN and row.get(name) is not None and str(v).lower() != str(row[name]).lower():
            out.append(f"{path}:{line}: --metadata {escape_controls(key)}={escape_controls(str(v))} not read: the "
                       f"file's own field gives {name} {row[name]!r}")
    return out


def _vllm_traffic(r: _Rec) -> None:
    """Refuse release patterns the runs table cannot state (serve.py ``get_request`` / ``benchmark``): a ramp-up
    (its file says request_rate "inf"), gamma or constant gaps at a finite rate, probe requests past the cap."""
    ramp = r.get("ramp_up_strategy", False)
    if ramp is not None:
        raise r.err("ramp_up_strategy", f"{escape_controls(repr(ramp))}: requests were released at a rate ramping "
                    f"from ramp_up_start_rps {escape_controls(r.d.get('ramp_up_start_rps'))} to ramp_up_end_rps "
                    f"{escape_controls(r.d.get('ramp_up_end_rps'))} (the file's request_rate "
                    f"{escape_controls(repr(r.d.get('request_rate')))} is not the rate it ran at); expected a run at "
                    "one request rate")
    rate = r.num("request_rate", "request_rate", True, inf_text=True)
    burst = r.get("burstiness", False)
    if burst is not None and not math.isinf(rate):
        if isinstance(burst, bool) or not isinstance(burst, (int, float)) or math.isnan(burst):
            raise r.err("burstiness", f"expected a number, got {escape_controls(repr(burst))}")
        if burst != 1:
            gaps = "constant gaps" if math.isinf(burst) else "gamma-distributed gaps"
            raise r.err("burstiness", f"{burst} at request_rate {rate}: {gaps} between requests; the runs table "
                        "records Poisson arrivals (burstiness 1) only, and bench replay simulates those")
    probes = r.get("probe_completed", False)
    if probes is not None:
        raise r.err("probe_completed", f"{escape_controls(repr(probes))}: the run sent probe requests alongside "
                    "(--probe-request-rate), past the concurrency cap; they loaded the server and are not in the "
                    "runs table")


def _some_completed(r: _Rec, failed: Any) -> None:
    """Refuse a run in which no request completed: the clients then write 0.0 (``np.mean(x or 0)``) or NaN for
    every latency statistic and 0 for the throughput, no measurement at all."""
    done = r.num("completed", "completed", True)
    if done == 0:
        why = f" ({failed} failed)" if failed else ""
        raise r.err("completed", f"0{why}: no request completed, so the file's latencies and throughput are the "
                    "client's placeholders (0 or NaN), not measurements; expected a run with completed requests")


def _sglang_row(d: Mapping[str, Any], path: str | Path, line: int) -> dict[str, Any]:
    r = _Rec(d, path, line)
    rate = r.get("request_rate", True)
    if isinstance(rate, str) and rate.strip().lower() == "trace":
        raise r.err("request_rate", "'trace' (arrival times from a trace) is not supported; expected a rate or inf")
    backend = r.text("backend", True)
    dataset = r.text("dataset_name", True)
    rnd = dataset is not None and dataset.startswith("random")   # random, random-ids: the random_* keys apply
    _some_completed(r, None)
    row: dict[str, Any] = {
        "source_ref": r.text("tag"), "engine": _ENGINES.get(backend or ""), "dataset_name": dataset,
        "random_input_len": r.num("random_input_len", "random_input_len") if rnd else None,
        "random_output_len": r.num("random_output_len", "random_output_len") if rnd else None,
        "random_range_ratio": r.num("random_range_ratio", "random_range_ratio") if rnd else None,
        "request_rate": r.num("request_rate", "request_rate", True, inf_text=True),
        "max_concurrency": None if _sglang_uncapped(d) else r.num("max_concurrency", "max_concurrency"),
        "duration_s": r.num("duration", "duration_s", True), "completed": r.num("completed", "completed", True),
        "total_input_tokens": _either(r, "total_input_tokens", "total_input"),
        "total_output_tokens": _either(r, "total_output_tokens", "total_output"),
        "output_throughput": r.num("output_throughput", "output_throughput", True),
        "acceptance_length": r.num("accept_length", "acceptance_length"),
    }
    if row["random_range_ratio"] is not None:
        row["random_range_convention"] = "low"   # SGLang draws uniform in [int(L*R), L]
    for m in ("ttft", "tpot"):
        for s in ("mean", "median", "p99"):
            row[f"{s}_{m}_ms"] = r.num(f"{s}_{m}_ms", f"{s}_{m}_ms")
    for s in ("mean", "median", "p99"):
        row[f"{s}_e2el_ms"] = r.num(f"{s}_e2e_latency_ms", f"{s}_e2el_ms")
    info = r.get("server_info", False)
    if info is not None:
        if not isinstance(info, dict):
            raise r.err("server_info", f"expected a JSON object, got {type(info).__name__}")
        if "decode" in info:   # a PD-disaggregated server reports per-role info: not a one-engine deployment
            raise r.err("server_info.decode", "the server is PD-disaggregated (prefill and decode servers: "
                        "bench_serving reads the decode servers' info from this key); the runs table records one "
                        "engine serving both, as InferenceX's disaggregated rows are refused")
        row.update(_sglang_server(_Rec(info, path, line, "server_info.")))
    return row


# SGLang ServerArgs fields (server_info) that set the server bench replay / profile fit simulate -> their option
_SGLANG_SERVER_OPTIONS = (("chunked_prefill_size", "--chunked-prefill-size"),
                          ("max_running_requests", "--max-running-requests"),
                          ("mem_fraction_static", "--mem-fraction-static"))


def sglang_server_settings(d: Mapping[str, Any]) -> str:
    """The ``bench replay`` / ``profile fit`` options that a line's ``server_info`` records (its chunked prefill
    size, max running requests, memory fraction, and ``--mixed-prefill`` for enable_mixed_chunk true), as one
    option string; "" when it records none. The runs table has no column for them (they are the server's settings,
    given to the commands that simulate it), so bench import says them rather than dropping them."""
    info = d.get("server_info")
    if not isinstance(info, dict):
        return ""
    opts = [f"{opt} {info[key]}" for key, opt in _SGLANG_SERVER_OPTIONS
            if isinstance(info.get(key), (int, float)) and not isinstance(info.get(key), bool) and info[key] > 0]
    if info.get("enable_mixed_chunk") is True:
        opts.append("--mixed-prefill")
    return " ".join(opts)


def sglang_server_note(path: str | Path, opts: str, lines: list[int]) -> str:
    """One note per file and server settings: which lines' server_info records them, as the options to pass."""
    if len(lines) == 1:
        where = f"line {lines[0]}"
    elif lines == list(range(lines[0], lines[-1] + 1)):
        where = f"lines {lines[0]}-{lines[-1]}"
    else:
        where = f"{len(lines)} lines ({', '.join(str(n) for n in lines[:5])}{', ...' if len(lines) > 5 else ''})"
    return (f"{path}: {where}: server_info records the server's settings, which the runs table has no column for: "
            f"give them to profile fit and bench replay ({opts}), else they simulate their defaults"
            f"{_chunk_caveat(opts)}")


def _chunk_caveat(opts: str) -> str:
    """What a recorded chunk above profile build's token budget (its largest priced batch, which caps every
    simulated step's prefill) means for the commands the note sends it to; "" for a chunk within it or none. The
    budget of the profile the user will fit is unknown at import time: the note says the builder's and the rule."""
    words = opts.split()
    if "--chunked-prefill-size" not in words:
        return ""
    chunk = float(words[words.index("--chunked-prefill-size") + 1])
    budget = int(M_GRID[-1])
    if chunk <= budget:
        return ""
    return (f"; but the chunk {words[words.index('--chunked-prefill-size') + 1]} is above profile build's token "
            f"budget {budget}, which caps every simulated step's prefill: profile fit refuses a "
            f"--chunked-prefill-size above its profile's budget, so leave it out there (the fit then takes the "
            f"budget) or give the budget; bench replay takes it and simulates at most the budget per step")


def _sglang_uncapped(d: Mapping[str, Any]) -> bool:
    """max_concurrency 0: bench_serving.py builds ``asyncio.Semaphore(max_concurrency) if max_concurrency else
    None``, so 0 ran without a cap (an empty cell, as null)."""
    v = d.get("max_concurrency")
    return not isinstance(v, bool) and isinstance(v, (int, float)) and v == 0


def _either(r: _Rec, key: str, alt: str) -> Any:
    """A required count written as ``key`` (bench_serving.py) or ``alt`` (sglang.benchmark.metrics.save_results
    dumps ``BenchmarkMetrics.__dict__``: total_input, total_output); both at once is refused."""
    if key in r.d and alt in r.d:
        raise r.err(alt, f"given beside {key!r} (two spellings of one count); expected one of them")
    if alt in r.d:
        return r.num(alt, key, True)
    if key not in r.d:
        raise r.err(key, f"missing field (or {alt!r})")
    return r.num(key, key, True)


def _sglang_server(s: _Rec) -> dict[str, Any]:
    """Deployment columns from SGLang's /get_server_info (ServerArgs fields and the version)."""
    tp, dp, pp = (s.num(k, "tp") for k in ("tp_size", "dp_size", "pp_size"))
    dpa = s.flag("enable_dp_attention")
    if dpa and tp is not None and dp is not None and dp != tp:   # the table's DP attention = one rank per TP GPU
        raise s.err("dp_size", f"{dp} with enable_dp_attention and tp_size {tp}: attention TP {tp // max(dp, 1)} "
                    "per DP rank; the runs table records DP attention as tp_size ranks of attention TP 1 "
                    "(--dp-size = --tp-size), so this run cannot be imported as it ran")
    algo = s.get("speculative_algorithm", False)
    if algo is not None and not isinstance(algo, str):
        raise s.err("speculative_algorithm", f"expected text or null, got {algo!r}")
    out = {"model": s.text("served_model_name") or s.text("model_path"), "tp": tp,
           "ep": s.num("ep_size", "ep"), "dp_attention": dpa, "engine": "sglang",
           "engine_version": s.text("version")}
    if "speculative_algorithm" in s.d:
        spec = (algo or "").strip().lower() or "none"
        out["spec_method"] = spec
        if spec != "none":
            out["spec_num_steps"] = s.num("speculative_num_steps", "spec_num_steps")
            out["spec_num_draft_tokens"] = s.num("speculative_num_draft_tokens", "spec_num_draft_tokens")
            out["spec_topk"] = s.num("speculative_eagle_topk", "spec_topk")
    if tp is not None:   # GPUs: tp x pp, x dp unless DP attention splits the TP group
        out["gpu_count"] = tp * (pp or 1) * (1 if dpa or dp is None else dp)
    return out


def _not_inferencex(text: str, header: list[str], path: str | Path) -> InputError | None:
    """The error for a file given as ``--format inferencex`` that is no InferenceX table at all (a JSON file, a
    runs table, a CSV naming none of its columns), before its header's own faults (a JSON line's repeated list
    items read as a column given twice); None for a file that looks like one."""
    table = (f"--format inferencex reads InferenceX's results table, a CSV whose first line names "
             f"{', '.join(INFERENCEX_COLUMNS[:3])}, ... ({len(INFERENCEX_COLUMNS)} columns)")
    if text.lstrip()[:1] in ("{", "["):
        return InputError(path, None, f"a JSON file, not an InferenceX CSV: {table}; a vLLM `bench serve` JSON or "
                          "an SGLang `bench_serving` JSONL is --format vllm / sglang (or leave --format out: auto "
                          "tells them apart)")
    if text.lstrip().startswith("# dsparksim runs table"):
        return InputError(path, None, "already a dsparksim runs table, not an InferenceX CSV (bench import writes "
                          "these; the commands that take runs read it as it is)")
    if not set(header) & set(INFERENCEX_COLUMNS):
        return InputError(path, None, f"not an InferenceX CSV: its first line names none of the table's columns; "
                          f"{table}", line=1)
    return None


def _inferencex_rows(text: str, path: str | Path) -> Iterator[tuple[str, int, dict[str, Any]]]:
    rd = csv.DictReader(io.StringIO(text))
    try:
        header = [h.strip() for h in (rd.fieldnames or [])]
        wrong = _not_inferencex(text, header, path)
        if wrong is not None:
            raise wrong
        twice = next((h for h in header if header.count(h) > 1), None)
        if twice is not None:   # csv.DictReader keeps the last of two cells silently
            raise InputError(path, escape_controls(twice), "column given twice (which of its cells holds the run's "
                             "value is unknown)", line=1)
        missing = [c for c in INFERENCEX_COLUMNS if c not in header]
        if missing:
            raise InputError(path, missing[0], f"missing column of the InferenceX table ({len(missing)} missing)",
                             line=1)
        for rec in rd:
            line = rd.line_num
            if None in rec or any(v is None for v in rec.values()):
                raise InputError(path, None, f"expected {len(header)} cells", line=line)
            yield "inferencex", line, {k.strip(): v for k, v in rec.items()}
    except csv.Error as e:
        raise InputError(path, None, f"not CSV: {e}", line=rd.line_num) from None


def _spec_config(text: str, r: _Rec) -> dict[str, Any]:
    """'EAGLE(MTP head) num_steps=2 num_draft_tokens=3 topk=1' -> spec_method eagle and its numbers."""
    head, *pairs = text.split()
    method = head.split("(")[0].strip().lower()
    if not method or "=" in head:
        raise r.err("spec_config", f"expected 'METHOD key=value ...', got {escape_controls(text)!r}")
    keys = {"num_steps": "spec_num_steps", "num_draft_tokens": "spec_num_draft_tokens", "topk": "spec_topk",
            "mtp_nextn": "spec_mtp_nextn", "nextn": "spec_mtp_nextn"}
    out: dict[str, Any] = {"spec_method": method}
    for p in pairs:
        if ")" in p and "=" not in p:   # the rest of a parenthesised note, e.g. '(MTP head)'
            continue
        k, _, v = p.partition("=")
        if k not in keys or not v:
            raise r.err("spec_config", f"unknown setting {escape_controls(p)!r}; expected "
                        f"{', '.join(sorted(keys))}=N")
        out[keys[k]] = parse_cell(dataclasses.replace(BY_NAME[keys[k]], name=f"spec_config {k}"), v, r.path,
                                  r.line)
    return out


def _ix(r: _Rec, key: str, col: str, required: bool = False) -> Any:
    """A cell of the InferenceX table, typed and checked as column ``col`` (errors name the table's field)."""
    s = r.d[key].strip()
    if not s:
        if required:
            raise r.err(key, "empty; expected a value")
        return None
    return parse_cell(dataclasses.replace(BY_NAME[col], name=key), s, r.path, r.line)


def _ix_bool(r: _Rec, key: str) -> bool:
    s = r.d[key].strip()
    if s not in ("True", "False"):
        raise r.err(key, f"expected True or False, got {escape_controls(s)!r}")
    return s == "True"


def _inferencex_row(d: Mapping[str, str], path: str | Path, line: int) -> dict[str, Any]:
    r = _Rec(d, path, line)
    if _ix_bool(r, "disaggregated"):
        raise r.err("disaggregated", "disaggregated (prefill/decode split) runs are not supported")
    date = _ix(r, "measurement_date", "measurement_date", True)
    try:
        datetime.strptime(date, "%Y-%m-%d")
    except ValueError:
        raise r.err("measurement_date", f"expected YYYY-MM-DD, got {escape_controls(date)!r}") from None
    framework = _ix(r, "framework", "engine", True)
    if framework not in ("sglang", "trt"):
        raise r.err("framework", f"expected sglang or trt, got {escape_controls(framework)!r}")
    conc = _ix(r, "concurrency", "max_concurrency", True)
    row: dict[str, Any] = {
        "source_ref": _ix(r, "run_url", "source_ref") or _ix(r, "source", "source_ref"),
        "measurement_date": date, "model": _ix(r, "model", "model", True), "gpu": _ix(r, "hardware", "gpu", True),
        "gpu_count": _ix(r, "gpu_count_total", "gpu_count", True), "tp": _ix(r, "tp", "tp", True),
        "ep": _ix(r, "ep", "ep", True), "dp_attention": _ix_bool(r, "dp_attention"),
        "engine": {"sglang": "sglang", "trt": "trtllm"}[framework],
        "engine_version": _ix(r, "framework_image", "engine_version"), "precision": _ix(r, "precision", "precision"),
        "acceptance_length": _ix(r, "acceptance_length_reported", "acceptance_length"),
        "dataset_name": "random", "random_input_len": _ix(r, "isl", "random_input_len", True),
        "random_output_len": _ix(r, "osl", "random_output_len", True),
        "random_range_ratio": _ix(r, "random_range_ratio", "random_range_ratio", True),
        "random_range_convention": "low", "max_concurrency": conc, "request_rate": math.inf,
        "num_prompts": _ix(r, "num_prompts", "num_prompts", True),
        "num_warmup_prompts": 2 * conc if date >= INFERENCEX_WARMUP_SINCE else 0, "ignore_eos": True,
        "output_throughput": _ix(r, "output_tput_aggregate", "output_throughput"),
        "output_throughput_per_gpu": _ix(r, "output_tput_per_gpu", "output_throughput_per_gpu", True),
    }
    mtp = d["mtp"].strip()
    spec = d["spec_config"].strip()
    if mtp == "off":
        if spec:
            raise r.err("spec_config", "set although mtp is off")
        row["spec_method"] = "none"
    elif mtp == "on":
        if not spec:
            raise r.err("spec_config", "empty although mtp is on; expected e.g. 'EAGLE num_steps=2 ...'")
        row.update(_spec_config(spec, r))
    else:
        raise r.err("mtp", f"expected on or off, got {escape_controls(mtp)!r}")
    for col in ("tpot", "ttft"):
        for s in ("mean", "median", "p99"):
            row[f"{s}_{col}_ms"] = _ix(r, f"{s}_{col}_ms", f"{s}_{col}_ms")
    for s in ("mean", "median", "p99"):   # seconds in the table; scaled exactly in decimal
        v = _ix(r, f"{s}_e2el_s", f"{s}_e2el_ms")
        row[f"{s}_e2el_ms"] = None if v is None else _ms(d[f"{s}_e2el_s"].strip())
    return row


def _same_text(name: str, have: Any, v: Any) -> bool:
    """An option's text that names what the file's does: equal but for case, or for ``gpu`` the same GPU as a
    profile's device would be matched (``NVIDIA H200`` and ``h200``; :func:`dsparksim.cost.analytic.hardware.same_gpu`)."""
    if not (isinstance(have, str) and isinstance(v, str)):
        return False
    if have.lower() == v.lower():
        return True
    return name == "gpu" and same_gpu(v, have)


def tpot_placeholder(row: Mapping[str, Any], path: str | Path, line: int) -> str | None:
    """Why the row's TPOT statistics are the client's placeholder rather than a measurement (None: they are not,
    or there are none). Both clients average TPOT over the requests with more than one output token and write
    ``np.mean(tpots or 0)``: 0.0 for every statistic when there is none (vllm/benchmarks/serve.py at 009e6d4a,
    sglang bench_serving.py at 0033168f). All-zero TPOT over multi-token outputs is a client that saw every token
    at once (SGLang ``--disable-stream``: TTFT is then the whole latency): InputError, no streamed run."""
    vals = [row.get(f"{s}_tpot_ms") for s in _STATS]
    if not any(v is not None for v in vals) or any(v not in (None, 0) for v in vals):
        return None
    done, tot = row.get("completed"), row.get("total_output_tokens")
    if done and tot is not None and tot > done:
        raise InputError(path, "mean_tpot_ms", f"0 with {tot} output tokens over {done} completed requests: every "
                         "request's tokens arrived at once (a non-streamed run, e.g. SGLang --disable-stream), so its "
                         "TTFT is the whole latency and its TPOT no measurement; expected a streamed run", line=line)
    if done and tot is not None:
        return (f"{tot} output token(s) over {done} completed request(s): no request had more than one output "
                "token, and the client writes TPOT 0 when none had (a placeholder, not a measurement)")
    return ("TPOT 0 is what the client writes when no request had more than one output token (a placeholder, not "
            "a measurement)")


def _ms(seconds_text: str) -> float:
    try:
        return float(Decimal(seconds_text) * 1000)
    except InvalidOperation:   # unreachable after the float check, kept for safety
        return float(seconds_text) * 1000


def finish_row(row: dict[str, Any], kind: str, path: str | Path, line: int, overrides: Mapping[str, Any],
               said: Mapping[str, str] | None = None, notes: list[str] | None = None) -> dict[str, Any]:
    """Provenance, the options' values (a contradiction with the file is an error), derived per-GPU
    throughput and the format's defaults, then the full column check. ``said``: columns the file states as null
    with a meaning (NULL_MEANS), which an option contradicts as much as a value. ``notes``: see import_files."""
    row = {k: v for k, v in row.items()}
    why = tpot_placeholder(row, path, line)
    if why is not None:
        for s in _STATS:
            row[f"{s}_tpot_ms"] = None
        if notes is not None:
            notes.append(f"{path}:{line}: TPOT imported as missing, not 0: {why}")
    for name, v in overrides.items():
        have = row.get(name)
        if have is None and name in (said or {}):
            raise InputError(path, name, f"the file says {(said or {})[name]} but --{name.replace('_', '-')} "
                             f"says {v!r}", line=line)
        if have is None:
            row[name] = v
        elif have != v and not _same_text(name, have, v):
            raise InputError(path, name, f"the file says {have!r} but --{name.replace('_', '-')} says {v!r}",
                             line=line)
    acc, sm = row.get("acceptance_length"), row.get("spec_method")
    if acc is not None and isinstance(sm, str) and sm.lower() in ("none", "off"):   # the server speculated
        raise InputError(path, "spec_method", f"the file reports speculative decoding (acceptance length {acc:g}) but "
                         f"{'--spec-method' if 'spec_method' in overrides else 'the file'} says {sm!r}: import it with "
                         "its method (e.g. --spec-method mtp), or apart from the plain-decoding runs", line=line)
    if kind == "vllm" and row.get("random_range_ratio") is not None and row.get("random_range_convention") is None:
        row["random_range_convention"] = "symmetric"   # vllm bench serve: uniform in [L(1-R), L(1+R)]
    if kind != "inferencex" and row.get("output_throughput") is not None and row.get("gpu_count"):
        row["output_throughput_per_gpu"] = row["output_throughput"] / row["gpu_count"]
    row.update(source_format=kind, source_file=str(path), source_row=line, run_id=f"{path}:{line}")
    return check_row(row, path, line)
