"""`bench import` against the result files the benchmark clients really write, version by version.

Each record below is built with the keys, in the order and under the conditions of the writer's own source, and
written the way it writes them (``json.dump`` / ``json.dumps(...) + "\\n"``, so ``inf`` and NaN floats become the
``Infinity`` / ``NaN`` literals):

* vLLM ``vllm bench serve`` (vllm-project/vllm ``vllm/benchmarks/serve.py`` at 009e6d4a): ``main_async`` writes
  ``date, endpoint_type, backend, label, model_id, tokenizer_id, num_prompts``, the ``--metadata`` pairs (text),
  ``request_rate`` (a float, or the string "inf"), ``burstiness``, ``max_concurrency`` (null without the flag), the
  ``ramp_up_*`` keys with ``--ramp-up-strategy``, then ``benchmark``'s result: ``duration, completed, failed,
  total_input_tokens, total_output_tokens, request_throughput, request_goodput, output_throughput,
  total_token_throughput, max_output_tokens_per_s, max_concurrent_requests, rtfx``, ``probe_*`` with
  ``--probe-request-rate``, ``spec_decode_*`` when the server speculates, and ``mean_/median_/std_/p{P}_{metric}_ms``
  for each metric of ``--percentile-metrics`` (default ttft,tpot,itl; ttft/tpot/itl only with a tokenizer) and each P
  of ``--metric-percentiles`` (default 99). ``calculate_metrics`` takes every statistic over ``x or 0``: a run with
  no completed request reports 0.0 ms for all of them. ``--append-result`` writes "\\n" before each further object.
* vLLM ``benchmarks/benchmark_serving.py`` (at 0049e29c): no ``endpoint_type``, ``label`` or ``failed``; the
  per-request arrays are always kept (its ``--save-detailed`` check runs before the merge).
* SGLang ``python -m sglang.bench_serving --output-file`` (sgl-project/sglang ``python/sglang/bench_serving.py`` at
  0033168f): ``backend, dataset_name, request_rate, max_concurrency, sharegpt_output_len, random_input_len,
  random_output_len, random_range_ratio, duration, completed, total_input_tokens, ..., accept_length``; the E2E
  statistics are ``np.mean(e2e_latencies)`` without ``or 0`` (NaN when nothing completed), the others ``or 0``.
  ``--output-details`` adds ``input_lens, output_lens, ttfts, itls, generated_texts, errors``. At 50a61368 (2024)
  the line had only ``backend, dataset_name, request_rate, total_input_tokens, total_output_tokens,
  total_output_tokens_retokenized, mean_e2e_latency_ms, median_e2e_latency_ms, median_ttft_ms, median_itl_ms,
  output_throughput, sharegpt_output_len, random_*, duration, completed``.
* SGLang's ``sglang.benchmark`` package (``python/sglang/benchmark/metrics.py`` ``save_results`` at 6e48df33; a
  version of ``sglang/bench_serving.py`` is a shim over it, ``from sglang.benchmark.serving import do_benchmark,
  main``): the line is the arguments plus ``**metrics.__dict__``, so the token counts are ``total_input`` /
  ``total_output``; no ``tag`` or ``server_info``; ``--output-details`` nests the arrays under ``details``.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from dsparksim.bench.importers import import_file
from dsparksim.bench.runs import read_runs
from dsparksim.cli.main import main
from dsparksim.errors import InputError

STATS = ("ttft", "tpot", "itl")


def _vllm(percentiles=(99,), metrics=STATS, **over) -> dict:
    """A `vllm bench serve --save-result` object (serve.py at 009e6d4a), 40 prompts at c=4, all completed."""
    d = {"date": "20261201-120000", "endpoint_type": "openai", "backend": "openai", "label": None,
         "model_id": "deepseek-ai/DeepSeek-R1-0528", "tokenizer_id": "deepseek-ai/DeepSeek-R1-0528",
         "num_prompts": 40, "request_rate": "inf", "burstiness": 1.0, "max_concurrency": 4,
         "duration": 80.0, "completed": 40, "failed": 0, "total_input_tokens": 40960, "total_output_tokens": 40960,
         "request_throughput": 0.5, "request_goodput": None, "output_throughput": 512.0,
         "total_token_throughput": 1024.0, "max_output_tokens_per_s": 560.0, "max_concurrent_requests": 4,
         "rtfx": 0.0}
    for m in metrics:   # consistent with the duration: 40 x ~8 s / 80 s = 4 in flight, the cap (bench/runs.py)
        base = {"ttft": 300.0, "tpot": 7.5, "itl": 7.5, "e2el": 8000.0}[m]
        d.update({f"mean_{m}_ms": base, f"median_{m}_ms": base + 1, f"std_{m}_ms": 0.5})
        for p in percentiles:
            p_word = str(int(p)) if int(p) == p else str(p)
            d[f"p{p_word}_{m}_ms"] = base + p / 10
    d.update(over)
    return d


def _sglang(**over) -> dict:
    """An `sglang.bench_serving --output-file` line (bench_serving.py at 0033168f), 40 prompts at c=4."""
    d = {"backend": "sglang", "dataset_name": "random", "request_rate": math.inf, "max_concurrency": 4,
         "sharegpt_output_len": None, "random_input_len": 1024, "random_output_len": 1024, "random_range_ratio": 0.8,
         "duration": 80.0, "completed": 40, "total_input_tokens": 37000, "total_output_tokens": 36800,
         "total_output_tokens_retokenized": 36790, "request_throughput": 0.5, "input_throughput": 462.5,
         "output_throughput": 460.0, "mean_e2e_latency_ms": 8000.0, "median_e2e_latency_ms": 7990.0,
         "std_e2e_latency_ms": 300.0, "p99_e2e_latency_ms": 8700.0, "mean_ttft_ms": 300.0, "median_ttft_ms": 290.0,
         "std_ttft_ms": 50.0, "p99_ttft_ms": 450.0, "mean_tpot_ms": 7.5, "median_tpot_ms": 7.4, "std_tpot_ms": 0.2,
         "p99_tpot_ms": 8.0, "mean_itl_ms": 7.5, "median_itl_ms": 7.4, "std_itl_ms": 0.2, "p95_itl_ms": 7.9,
         "p99_itl_ms": 8.0, "concurrency": 3.99, "accept_length": None}
    d.update(over)
    return d


def _write(tmp_path: Path, name: str, *records: dict, sep: str = "\n", end: str = "\n") -> Path:
    p = tmp_path / name
    p.write_text(sep.join(json.dumps(r) for r in records) + end)
    return p


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err and err.startswith("dsparksim: error:"), err
    return err


def _refused(tmp_path, capsys, src: Path, *opts: str) -> str:
    out = tmp_path / "runs.csv"
    assert main(["bench", "import", str(src), *opts, "--out", str(out)]) == 2
    assert not out.exists()
    err = _one_line_error(capsys)
    assert str(src) in err, err
    return err


# --- files that must read, value for value --------------------------------------------------------------------

def test_vllm_percentile_set_and_e2el_are_read_by_their_own_keys(tmp_path):
    """--metric-percentiles 50,90,99.9 --percentile-metrics ttft,tpot,e2el: no p99 key exists, so p99 stays empty
    (p99.9 or p90 is never taken for it); e2el's statistics come from its own keys."""
    rec = _vllm(percentiles=(50, 90, 99.9), metrics=("ttft", "tpot", "e2el"))
    assert "p99.9_tpot_ms" in rec and "p99_tpot_ms" not in rec
    (row,) = import_file(_write(tmp_path, "v.json", rec, end=""))
    for m in ("ttft", "tpot", "e2el"):
        assert row[f"p99_{m}_ms"] is None
        assert (row[f"mean_{m}_ms"], row[f"median_{m}_ms"]) == (rec[f"mean_{m}_ms"], rec[f"median_{m}_ms"])


def test_vllm_without_a_cap_and_with_a_finite_rate(tmp_path):
    (row,) = import_file(_write(tmp_path, "v.json", _vllm(request_rate=4.0, max_concurrency=None), end=""))
    assert row["request_rate"] == 4.0 and row["max_concurrency"] is None


def test_vllm_append_result_file_has_one_run_per_line(tmp_path):
    """--append-result: json.dump, then "\\n" + json.dump for each later run, no newline at the end."""
    p = _write(tmp_path, "v.json", _vllm(max_concurrency=4), _vllm(max_concurrency=8, label="c8"), end="")
    a, b = import_file(p)
    assert (a["source_row"], a["max_concurrency"], b["source_row"], b["max_concurrency"]) == (1, 4, 2, 8)
    assert b["source_ref"] == "c8"


def test_vllm_legacy_benchmark_serving_file(tmp_path):
    """benchmarks/benchmark_serving.py (0049e29c): no endpoint_type/label/failed, the arrays always present, and the
    goodput key spelled 'request_goodput:'."""
    rec = _vllm()
    for k in ("endpoint_type", "label", "failed", "max_output_tokens_per_s", "max_concurrent_requests", "rtfx",
              "request_goodput"):
        del rec[k]
    rec.update({"request_goodput:": None, "input_lens": [1024] * 40, "output_lens": [1024] * 40,
                "ttfts": [0.3] * 40, "itls": [[0.0075] * 1023] * 40, "generated_texts": ["x"] * 40,
                "errors": [""] * 40})
    (row,) = import_file(_write(tmp_path, "v.json", rec, end=""))
    assert row["source_format"] == "vllm" and row["failed"] is None and row["completed"] == 40
    assert row["mean_tpot_ms"] == rec["mean_tpot_ms"] and row["source_ref"] is None


def test_vllm_skip_tokenizer_init_writes_no_token_statistics(tmp_path):
    """--skip-tokenizer-init: tokenizer_id null and no ttft/tpot/itl statistics (process_one_metric needs a
    tokenizer); e2el only if selected."""
    rec = _vllm(metrics=("e2el",), tokenizer_id=None)
    (row,) = import_file(_write(tmp_path, "v.json", rec, end=""))
    assert row["mean_tpot_ms"] is None and row["mean_ttft_ms"] is None and row["mean_e2el_ms"] == rec["mean_e2el_ms"]


def test_sglang_2024_line_and_output_details_line(tmp_path):
    """The 2024 key set (bench_serving.py at 50a61368: medians only, no cap key) and a line with --output-details
    (0033168f), blank lines between appended runs and CRLF endings."""
    old = {k: _sglang()[k] for k in ("backend", "dataset_name", "request_rate", "total_input_tokens",
                                      "total_output_tokens", "total_output_tokens_retokenized",
                                      "mean_e2e_latency_ms", "median_e2e_latency_ms", "median_ttft_ms",
                                      "median_itl_ms", "output_throughput", "sharegpt_output_len",
                                      "random_input_len", "random_output_len", "random_range_ratio", "duration",
                                      "completed")}
    det = _sglang(input_lens=[1000] * 40, output_lens=[920] * 40, ttfts=[0.3] * 40, itls=[[0.0075] * 919] * 40,
                  generated_texts=["x"] * 40, errors=[""] * 40)
    p = _write(tmp_path, "s.jsonl", old, det, sep="\r\n\r\n", end="\r\n")
    a, b = import_file(p)
    assert (a["source_row"], b["source_row"]) == (1, 3)
    assert a["max_concurrency"] is None and a["mean_tpot_ms"] is None and a["median_ttft_ms"] == old["median_ttft_ms"]
    assert a["mean_e2el_ms"] == old["mean_e2e_latency_ms"] and a["request_rate"] == math.inf
    assert b["mean_tpot_ms"] == det["mean_tpot_ms"] and b["total_output_tokens"] == det["total_output_tokens"]


# --- defects: a valid file refused ----------------------------------------------------------------------------

def test_sglang_benchmark_package_line_with_total_input_and_total_output(tmp_path):
    """sglang.benchmark.metrics.save_results (6e48df33) writes **metrics.__dict__: total_input / total_output, and
    --output-details nests the arrays under 'details'. Such a line was refused ('total_input_tokens': missing)."""
    rec = _sglang(details={"input_lens": [1000] * 40, "output_lens": [920] * 40})
    rec["total_input"], rec["total_output"] = rec.pop("total_input_tokens"), rec.pop("total_output_tokens")
    rec.update(output_throughput_retokenized=459.0, total_throughput=922.5, total_throughput_retokenized=921.5,
               max_itl_ms=20.0)
    (row,) = import_file(_write(tmp_path, "s.jsonl", rec))
    assert (row["total_input_tokens"], row["total_output_tokens"]) == (rec["total_input"], rec["total_output"])
    assert row["output_throughput"] == rec["output_throughput"] and row["source_format"] == "sglang"


def test_both_spellings_of_a_token_count_are_refused(tmp_path, capsys):
    rec = _sglang(total_input=1)
    err = _refused(tmp_path, capsys, _write(tmp_path, "s.jsonl", rec))
    assert "'total_input'" in err and "total_input_tokens" in err


# --- defects: a run silently misread --------------------------------------------------------------------------

def test_vllm_ramp_up_run_is_refused_not_read_as_an_unpaced_client(tmp_path, capsys):
    """--ramp-up-strategy requires the default request_rate inf; the file then says "inf" although requests were
    released at a rate ramping from ramp_up_start_rps to ramp_up_end_rps. It was imported as request_rate inf."""
    rec = _vllm(ramp_up_strategy="linear", ramp_up_start_rps=1, ramp_up_end_rps=16)
    err = _refused(tmp_path, capsys, _write(tmp_path, "v.json", rec, end=""))
    assert "field 'ramp_up_strategy'" in err and "'linear'" in err and "1" in err and "16" in err


@pytest.mark.parametrize("burst", [0.5, math.inf])
def test_vllm_gamma_or_constant_arrivals_are_refused(tmp_path, capsys, burst):
    """--burstiness != 1 with a finite rate: gamma gaps (inf: constant gaps). The runs table has no such column and
    bench replay draws Poisson gaps, so the run was imported as a Poisson run."""
    rec = _vllm(request_rate=8.0, burstiness=burst)
    err = _refused(tmp_path, capsys, _write(tmp_path, "v.json", rec, end=""))
    assert "field 'burstiness'" in err and "Poisson" in err and str(burst) in err
    # at request_rate inf burstiness does nothing (every delay is 0): imported
    (row,) = import_file(_write(tmp_path, "ok.json", _vllm(request_rate="inf", burstiness=burst), end=""))
    assert row["request_rate"] == math.inf


def test_vllm_probe_requests_are_refused(tmp_path, capsys):
    """--probe-request-rate sends extra requests past the cap; their counts land as probe_* keys."""
    rec = _vllm(probe_completed=12, probe_failed=0, probe_median_e2el_ms=40.0, probe_p99_e2el_ms=90.0,
                probe_max_e2el_ms=95.0)
    err = _refused(tmp_path, capsys, _write(tmp_path, "v.json", rec, end=""))
    assert "field 'probe_completed'" in err and "12" in err


def test_vllm_run_with_nothing_completed_is_refused(tmp_path, capsys):
    """calculate_metrics writes 0.0 for every statistic of a run whose requests all failed (np.mean(x or 0)):
    it imported as a run with 0 ms TPOT and TTFT."""
    rec = _vllm(completed=0, failed=40, total_input_tokens=0, total_output_tokens=0, output_throughput=0.0,
                request_throughput=0.0, total_token_throughput=0.0)
    for k in list(rec):
        if k.endswith("_ms"):
            rec[k] = 0.0
    err = _refused(tmp_path, capsys, _write(tmp_path, "v.json", rec, end=""))
    assert "v.json:1: field 'completed'" in err and "40 failed" in err


def test_sglang_run_with_nothing_completed_is_refused_by_its_line(tmp_path, capsys):
    """SGLang writes 0.0 for TTFT/TPOT/ITL and NaN for the E2E statistics of such a run; one line of a JSONL."""
    zero = _sglang(completed=0, total_input_tokens=0, total_output_tokens=0, output_throughput=0.0,
                   concurrency=0.0, **{f"{s}_e2e_latency_ms": math.nan for s in ("mean", "median", "std", "p99")},
                   **{f"{s}_{m}_ms": 0.0 for m in ("ttft", "tpot") for s in ("mean", "median", "std", "p99")})
    p = _write(tmp_path, "s.jsonl", _sglang(), zero)
    assert "NaN" in p.read_text()
    err = _refused(tmp_path, capsys, p)
    assert "s.jsonl:2: field 'completed'" in err and "0" in err


def test_a_nan_statistic_is_refused_not_read_as_missing(tmp_path, capsys):
    """A NaN literal in a statistic was silently turned into an empty cell."""
    p = _write(tmp_path, "v.json", _vllm(mean_tpot_ms=math.nan), end="")
    assert "NaN" in p.read_text()
    err = _refused(tmp_path, capsys, p)
    assert "field 'mean_tpot_ms'" in err and "NaN" in err


def test_an_explicit_no_cap_contradicts_a_max_concurrency_option(tmp_path, capsys):
    """max_concurrency null is written when the client ran without --max-concurrency: no cap. --max-concurrency 16
    filled it silently, as if the file did not say."""
    p = _write(tmp_path, "v.json", _vllm(request_rate=4.0, max_concurrency=None), end="")
    err = _refused(tmp_path, capsys, p, "--max-concurrency", "16")
    assert "field 'max_concurrency'" in err and "no cap" in err and "16" in err
    # a key the writer did not have (SGLang 2024) is not recorded: the option fills it
    old = {k: v for k, v in _sglang().items() if k != "max_concurrency"}
    out = tmp_path / "ok.csv"
    assert main(["bench", "import", str(_write(tmp_path, "s.jsonl", old)), "--max-concurrency", "16",
                 "--out", str(out)]) == 0
    assert read_runs(out)[0]["max_concurrency"] == 16


def test_vllm_pooling_benchmark_is_named(tmp_path, capsys):
    """A pooling/embedding run (TaskType.POOLING) has no output tokens: refused as what it is."""
    rec = {k: v for k, v in _vllm(metrics=("e2el",)).items()
           if k not in ("failed", "total_output_tokens", "output_throughput", "request_goodput",
                        "max_output_tokens_per_s", "max_concurrent_requests", "rtfx")}
    rec.update(total_input_sequences=40, input_sequence_throughput=0.5)
    err = _refused(tmp_path, capsys, _write(tmp_path, "v.json", rec, end=""))
    assert "pooling" in err and "total_input_sequences" in err


def test_the_refusals_do_not_touch_a_plain_run(tmp_path):
    """The same records without the refused feature import (the checks key on the feature, not on the writer)."""
    rows = import_file(_write(tmp_path, "v.json", _vllm(), _vllm(request_rate=2.0, burstiness=1.0), end=""))
    assert [r["request_rate"] for r in rows] == [math.inf, 2.0]
    with pytest.raises(InputError, match="ramp_up_strategy"):
        import_file(_write(tmp_path, "r.json", _vllm(), _vllm(ramp_up_strategy="exponential", ramp_up_start_rps=1,
                                                             ramp_up_end_rps=8), end=""))


@pytest.mark.parametrize("key, value, needle", [
    ("duration", None, "field 'duration': is null; expected a value"),
    ("completed", None, "field 'completed': is null; expected a value"),
    ("request_rate", None, "field 'request_rate': is null; expected a value"),
    ("request_rate", -math.inf, "field 'request_rate'"),
    ("output_throughput", math.inf, "field 'output_throughput': expected a finite number"),
])
def test_required_keys_null_or_not_finite_are_refused(tmp_path, capsys, key, value, needle):
    err = _refused(tmp_path, capsys, _write(tmp_path, "v.json", _vllm(**{key: value}), end=""))
    assert needle in err


def test_optional_keys_null_stay_empty(tmp_path):
    """A statistic or count written as null (e.g. request_goodput, a label, spec keys) is an empty cell."""
    (row,) = import_file(_write(tmp_path, "v.json", _vllm(label=None, p99_tpot_ms=None, failed=None,
                                                          spec_decode_acceptance_length=None), end=""))
    assert row["p99_tpot_ms"] is None and row["failed"] is None and row["acceptance_length"] is None
    assert row["mean_tpot_ms"] == 7.5


def test_a_run_cut_off_while_appending_names_its_line(tmp_path, capsys):
    """sglang.bench_serving appends json.dumps(result) + "\\n": a client killed mid-write leaves a partial last
    line. The error names that line; nothing is written."""
    p = tmp_path / "s.jsonl"
    p.write_text(json.dumps(_sglang()) + "\n" + json.dumps(_sglang())[:200])
    err = _refused(tmp_path, capsys, p)
    assert "s.jsonl:2:" in err and "invalid JSON" in err


def test_sglang_max_concurrency_zero_is_no_cap(tmp_path, capsys):
    """bench_serving.py (0033168f): `asyncio.Semaphore(max_concurrency) if max_concurrency else None`, so
    --max-concurrency 0 ran without a cap. It was refused ('expected a value >= 1')."""
    p = _write(tmp_path, "s.jsonl", _sglang(max_concurrency=0, request_rate=2.0))
    (row,) = import_file(p)
    assert row["max_concurrency"] is None and row["request_rate"] == 2.0
    err = _refused(tmp_path, capsys, p, "--max-concurrency", "4")
    assert "field 'max_concurrency'" in err and "no cap" in err and "0" in err


def test_import_names_every_empty_column_that_replay_and_fit_need(tmp_path, capsys):
    # a vLLM file records no lengths, ignore_eos or speculative config: bench import said only "gpu_count, engine,
    # dataset_name", and profile fit then refused the runs one missing column at a time
    src = _write(tmp_path, "c4.json", _vllm())
    assert main(["bench", "import", str(src), "--gpu", "H200", "--tp", "8", "--out", str(tmp_path / "r.csv")]) == 0
    hint = [ln for ln in capsys.readouterr().out.splitlines() if "empty in some runs" in ln]
    assert len(hint) == 1, hint
    for opt in ("--gpu-count", "--engine", "--spec-method", "--dataset-name", "--random-input-len",
                "--random-output-len", "--random-range-ratio", "--ignore-eos"):
        assert opt in hint[0], (opt, hint[0])
    assert "--gpu " not in hint[0] and "--tp " not in hint[0] and "--num-prompts" not in hint[0]


def test_a_speculating_server_contradicts_spec_method_none(tmp_path, capsys):
    # vllm bench serve writes spec_decode_* only when the server speculates: a blanket --spec-method none made such a
    # run plain decoding in the runs table, and profile fit then fitted it as one
    src = _write(tmp_path, "mtp.json", _vllm(spec_decode_acceptance_length=2.6, spec_decode_num_drafts=100))
    err = _refused(tmp_path, capsys, src, "--spec-method", "none")
    assert "field 'spec_method'" in err and "2.6" in err and "--spec-method" in err, err
    out = tmp_path / "ok.csv"
    assert main(["bench", "import", str(src), "--spec-method", "mtp", "--out", str(out)]) == 0
    assert read_runs(out)[0]["spec_method"] == "mtp"
    plain = _write(tmp_path, "plain.json", _vllm())
    assert main(["bench", "import", str(plain), "--spec-method", "none", "--out", str(tmp_path / "p.csv")]) == 0


# --- defects: a client placeholder imported as a measurement ----------------------------------------------------

def _one_token(rec: dict) -> dict:
    """Every request emitted one token: calculate_metrics (serve.py 009e6d4a, bench_serving.py 0033168f) keeps a
    TPOT only for output_len > 1 and writes np.mean(tpots or 0) etc.: 0.0 for every TPOT statistic."""
    n = rec["completed"]
    rec.update(total_output_tokens=n, output_throughput=n / rec["duration"])
    for k in list(rec):
        if "_tpot_ms" in k:
            rec[k] = 0.0
    return rec


@pytest.mark.parametrize("writer, name", [(_vllm, "v.json"), (_sglang, "s.jsonl")])
def test_tpot_of_a_run_of_one_token_outputs_is_imported_as_missing_with_a_note(tmp_path, capsys, writer, name):
    rec = _one_token(writer())
    src = _write(tmp_path, name, rec)
    out = tmp_path / "r.csv"
    assert main(["bench", "import", str(src), "--out", str(out)]) == 0
    (row,) = read_runs(out)
    assert (row["mean_tpot_ms"], row["median_tpot_ms"], row["p99_tpot_ms"]) == (None, None, None)
    assert row["mean_ttft_ms"] == rec["mean_ttft_ms"]           # the rest is read as before
    text = capsys.readouterr().out
    assert f"note: {src}:1: TPOT imported as missing, not 0" in text and "more than one output token" in text
    # a multi-token run keeps its TPOT, and a TPOT of 0 over multi-token outputs (not streamed) is refused
    (ok,) = import_file(_write(tmp_path, "ok" + name, writer()))
    assert ok["mean_tpot_ms"] > 0
    flat = {**writer(), **{k: 0.0 for k in writer() if "_tpot_ms" in k}}
    err = _refused(tmp_path, capsys, _write(tmp_path, "flat" + name, flat))
    assert "field 'mean_tpot_ms'" in err and "streamed" in err


# --- defects: --metadata pairs silently ignored -----------------------------------------------------------------

def _with_metadata(rec: dict, **pairs) -> dict:
    """main_async (serve.py 009e6d4a) writes the --metadata pairs after num_prompts and before request_rate, KEY as
    typed (stripped), VALUE as text."""
    out: dict = {}
    for k, v in rec.items():
        if k == "request_rate":
            out.update(pairs)
        out[k] = v
    return out


def test_vllm_metadata_keys_are_read_in_their_dashed_spelling_and_unknown_ones_are_named(tmp_path, capsys):
    # --metadata gpu-count=8 was dropped silently: only the exact column name gpu_count was read
    rec = _with_metadata(_vllm(), **{"gpu-count": "8", "GPU": "H200", "tp": "8", "commit": "abc123",
                                     "model": "deepseek-r1"})
    src = _write(tmp_path, "v.json", rec, end="")
    out = tmp_path / "r.csv"
    assert main(["bench", "import", str(src), "--out", str(out)]) == 0
    (row,) = read_runs(out)
    assert (row["gpu_count"], row["gpu"], row["tp"]) == (8, "H200", 8)
    assert row["output_throughput_per_gpu"] == rec["output_throughput"] / 8
    assert row["model"] == rec["model_id"]
    text = capsys.readouterr().out
    assert "--metadata key(s) not read, no runs-table column: 'commit'" in text
    assert "--metadata model=deepseek-r1 not read: the file's own field gives model" in text
    assert "'gpu-count'" not in text and "'GPU'" not in text
    # the option contradicting a dashed pair is an error, as for the plain spelling
    err = _refused(tmp_path, capsys, src, "--gpu-count", "16")
    assert "field 'gpu_count'" in err and "8" in err and "16" in err


def test_vllm_keys_outside_the_metadata_block_that_nothing_reads_are_named(tmp_path, capsys):
    """A pair added after the run (appended at the end) or a file whose keys were sorted (`jq -S`) put --metadata
    keys outside the block between num_prompts and request_rate: those naming no column were dropped without a
    word (a column-named one, gpu, was read). The keys vLLM writes itself are never named."""
    rec = {**_with_metadata(_vllm(percentiles=(50, 99.9)), commit="abc123"), "spec_decode_num_drafts": 7,
           "probe_completed": None, "p99_e2el_including_client_queue_ms": 1.0, "ttfts": [0.1], "cluster": "west",
           "gpu": "H200"}
    src = _write(tmp_path, "v.json", rec, end="")
    out = tmp_path / "r.csv"
    assert main(["bench", "import", str(src), "--out", str(out)]) == 0
    (row,) = read_runs(out)
    assert row["gpu"] == "H200"
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "not read" in ln]
    assert len(lines) == 2, lines
    assert "--metadata key(s) not read, no runs-table column: 'commit' (" in lines[0]
    assert "key(s) outside the --metadata block not read, neither a field vllm bench serve writes nor a runs-table " \
           "column: 'cluster' (" in lines[1]
    # sorted keys: the block holds vLLM's own fields (output_throughput, p99_*), which are not metadata
    src = tmp_path / "sorted.json"
    src.write_text(json.dumps(rec, sort_keys=True))
    assert main(["bench", "import", str(src), "--out", str(tmp_path / "s.csv")]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "not read" in ln]
    assert len(lines) == 1 and "outside the --metadata block" in lines[0], lines
    assert "'cluster', 'commit' (" in lines[0] and "p99" not in lines[0] and "throughput" not in lines[0]
    # a file as vLLM writes it, no pair: nothing said
    assert main(["bench", "import", str(_write(tmp_path, "plain.json", _vllm(), end="")), "--out",
                 str(tmp_path / "p.csv")]) == 0
    assert "not read" not in capsys.readouterr().out


def test_two_spellings_of_one_metadata_column_must_agree(tmp_path, capsys):
    src = _write(tmp_path, "v.json", _with_metadata(_vllm(), gpu_count="8", **{"gpu-count": "4"}), end="")
    err = _refused(tmp_path, capsys, src)
    assert "field 'gpu-count'" in err and "two spellings" in err
    (row,) = import_file(_write(tmp_path, "ok.json", _with_metadata(_vllm(), gpu_count="8", **{"gpu-count": "8"}),
                                end=""))
    assert row["gpu_count"] == 8
    err = _refused(tmp_path, capsys, _write(tmp_path, "bad.json", _with_metadata(_vllm(), **{"gpu-count": "eight"}),
                                            end=""))
    assert "field 'metadata gpu-count'" in err and "'eight'" in err


def test_one_run_imported_twice_is_refused(tmp_path, capsys):
    # a result file appended twice (--append-result rerun on the same file) or copied beside itself was imported as
    # two runs, and profile fit then weighed that measurement twice
    twice = _write(tmp_path, "v.json", _vllm(), _vllm(), end="")
    err = _refused(tmp_path, capsys, twice)
    assert "v.json:2: run " in err and f"{twice}:1 again" in err
    one = _write(tmp_path, "a.json", _vllm(), end="")
    copy = _write(tmp_path, "b.json", _vllm(label="copy"), end="")      # a label is where it was filed, not the run
    out = tmp_path / "r.csv"
    assert main(["bench", "import", str(one), str(copy), "--out", str(out)]) == 2 and not out.exists()
    assert f"run {copy}:1 is run {one}:1 again" in _one_line_error(capsys)
    # two runs that differ in any measured figure are two runs
    assert len(import_file(_write(tmp_path, "c.json", _vllm(), _vllm(duration=80.5), end=""))) == 2


def test_a_one_line_result_is_parsed_once(tmp_path, monkeypatch):
    # a --save-detailed result is one line of tens of MB (per-request ITL arrays): it was parsed twice, once to
    # tell JSONL from one pretty-printed object and once to read it (58 MB: 5.1-6.1 s -> 2.5-3.6 s with the
    # depth check's walk over containers only)
    calls = []
    real = json.loads
    monkeypatch.setattr(json, "loads", lambda text, *a, **k: calls.append(len(text)) or real(text, *a, **k))
    rec = _vllm(itls=[[0.0075] * 100] * 40)
    (row,) = import_file(_write(tmp_path, "v.json", rec, end=""))
    assert len(calls) == 1 and row["completed"] == 40
    calls.clear()
    assert len(import_file(_write(tmp_path, "a.json", _vllm(), _vllm(duration=81.0)))) == 2 and len(calls) == 2
    p = tmp_path / "pretty.json"
    p.write_text(json.dumps(_vllm(), indent=2))
    assert import_file(p)[0]["completed"] == 40


def test_a_pd_disaggregated_sglang_run_is_refused(tmp_path, capsys):
    # bench_serving reads a PD-disaggregated server's info from server_info["decode"]; the importer dropped the
    # info and imported the run, which bench replay then simulated as one engine serving prefill and decode
    info = {"tp_size": 8, "dp_size": 1, "ep_size": 1, "version": "0.5.2", "speculative_algorithm": None}
    rec = _sglang(server_info={"decode": [info], "prefill": [info]})
    err = _refused(tmp_path, capsys, _write(tmp_path, "s.jsonl", rec))
    assert "field 'server_info.decode'" in err and "PD-disaggregated" in err
    (row,) = import_file(_write(tmp_path, "ok.jsonl", _sglang(server_info=info)))
    assert row["tp"] == 8 and row["engine_version"] == "0.5.2"


@pytest.mark.parametrize("scale, bound", [(1e-3, "below the 1 a run released at once always has"),
                                          (1e3, "above the cap of 4")])
def test_latencies_in_the_wrong_unit_contradict_the_duration(tmp_path, capsys, scale, bound):
    """A result whose *_ms statistics are in seconds (or microseconds) was imported, and profile fit fitted it
    (40.6% TPOT error, scales at their bounds, no refusal); Little's law against the run's own duration refuses it
    naming the field, and a plain run (4 in flight at a cap of 4) and an open-loop run at a low rate import."""
    stats = {k: v * scale for k, v in _vllm(metrics=("ttft", "tpot", "e2el")).items() if k.endswith("_ms")}
    err = _refused(tmp_path, capsys, _write(tmp_path, "v.json", _vllm(metrics=("ttft", "tpot", "e2el"), **stats),
                                            end=""))
    assert "field 'mean_e2el_ms'" in err and bound in err and "milliseconds" in err, err
    # without e2el (vLLM's default --percentile-metrics), TTFT + TPOT x (tokens per request - 1) stands for it
    stats = {k: v * scale for k, v in _vllm().items() if k.endswith("_ms")}
    err = _refused(tmp_path, capsys, _write(tmp_path, "w.json", _vllm(**stats), end=""))
    assert "field 'mean_tpot_ms'" in err and bound in err, err
    (row,) = import_file(_write(tmp_path, "ok.json", _vllm(metrics=("ttft", "tpot", "e2el")), end=""))
    assert row["mean_e2el_ms"] == 8000.0
    (row,) = import_file(_write(tmp_path, "open.json", _vllm(request_rate=0.01, duration=4000.0, max_concurrency=None,
                                                             output_throughput=10.24), end=""))
    assert row["request_rate"] == 0.01   # 0.08 in flight: idle between arrivals, no contradiction


def test_a_profiled_run_below_one_in_flight_names_the_profiler(tmp_path, capsys):
    """sglang.bench_serving --profile (and vLLM's benchmark_serving.py --profile) time the profiler's stop_profile
    inside the duration: 10 requests of 2 s one at a time and a 40 s trace dump read as 0.33 in flight. The refusal
    named only a unit error ('are the latency statistics in milliseconds?'), which these are; it names the
    padded duration too. A run with too many in flight (the other bound) keeps the unit question alone."""
    line = _sglang(max_concurrency=1, completed=10, duration=60.0, total_output_tokens=2560,
                   mean_e2e_latency_ms=2000.0)
    err = _refused(tmp_path, capsys, _write(tmp_path, "p.jsonl", line))
    assert "0.333 requests in flight" in err and "milliseconds" in err, err
    assert "--profile" in err and "profiler's stop" in err, err
    err = _refused(tmp_path, capsys, _write(tmp_path, "u.jsonl", _sglang(mean_e2e_latency_ms=8e6)))
    assert "above the cap of 4" in err and "--profile" not in err, err


def test_vllm_legacy_goodput_key_is_a_field_vllm_writes_not_an_unread_pair(tmp_path):
    """benchmarks/benchmark_serving.py writes its goodput as 'request_goodput:' (with the colon, after
    request_rate); the note on keys outside the --metadata block named it as a key neither vLLM nor the runs table
    knows, on every legacy file."""
    rec = _vllm()
    del rec["request_goodput"]
    rec["request_goodput:"] = None
    notes: list[str] = []
    import_file(_write(tmp_path, "v.json", rec, end=""), notes=notes)
    assert not [n for n in notes if "request_goodput" in n], notes
    rec["my_pair"] = 1
    notes = []
    import_file(_write(tmp_path, "w.json", rec, end=""), notes=notes)
    (line,) = [n for n in notes if "outside the --metadata block" in n]
    assert "'my_pair'" in line and "request_goodput" not in line, line
