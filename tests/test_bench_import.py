"""``dsparksim bench import``: every imported value checked against its source file, the runs table round-trips,
and bad input is one line, exit 2, nothing written.

Fixtures (tests/data/bench/) are written exactly as the tools write them: ``vllm_result.json`` /
``vllm_plain.json`` with vLLM's key set (vllm/benchmarks/serve.py: ``json.dump`` of ``result_json``, without
--save-detailed; the first with ``--metadata gpu=H200 tp=8 engine=vllm`` and spec-decode counters),
``sglang_runs.jsonl`` with three lines appended by sglang.bench_serving (two of the current key set with
``server_info``, one of the older key set), ``inferencex_rows.csv`` six rows copied verbatim from the shared table.
"""
from __future__ import annotations

import csv
import io
import json
import math
import os
import re
from collections import Counter
from pathlib import Path

import pytest

from dsparksim.bench.importers import FILLED_BY, import_file
from dsparksim.bench.runs import COLUMNS, MARKER, NAMES, read_runs, runs_frame, write_runs
from dsparksim.cli.main import main
from dsparksim.errors import InputError

DATA = Path(__file__).resolve().parent / "data" / "bench"
REPO = Path(__file__).resolve().parents[1]
SHARED_CSV = Path(os.environ.get("DSPARKSIM_SHARED", REPO / ".." / "shared")) / "data" / "inferencex" / \
    "deepseek_r1_single_node.csv"
VLLM, VLLM_PLAIN, SGLANG, IX = (DATA / n for n in ("vllm_result.json", "vllm_plain.json", "sglang_runs.jsonl",
                                                   "inferencex_rows.csv"))
STATS = tuple(f"{s}_{m}_ms" for m in ("tpot", "ttft", "e2el") for s in ("mean", "median", "p99"))


def _err(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err and err.startswith("dsparksim: error:"), err
    return err


def _num(s: str) -> float | None:
    return float(s) if s.strip() else None


# --- vLLM -----------------------------------------------------------------------------------------------------

def test_vllm_result_values_match_the_file():
    src = json.loads(VLLM.read_text())
    (row,) = import_file(VLLM)
    assert row["source_format"] == "vllm" and row["source_row"] == 1 and row["run_id"] == f"{VLLM}:1"
    assert row["source_ref"] == src["label"] == "h200-tp8-mtp"
    assert row["measurement_date"] == "2026-11-25T10:15:02"       # 20261125-101502
    assert row["model"] == src["model_id"]
    assert row["request_rate"] == math.inf and src["request_rate"] == "inf"
    for col, key in (("num_prompts", "num_prompts"), ("max_concurrency", "max_concurrency"),
                     ("duration_s", "duration"), ("completed", "completed"), ("failed", "failed"),
                     ("total_input_tokens", "total_input_tokens"), ("total_output_tokens", "total_output_tokens"),
                     ("output_throughput", "output_throughput"),
                     ("acceptance_length", "spec_decode_acceptance_length"),
                     *((f"{s}_{m}_ms",) * 2 for m in ("ttft", "tpot") for s in ("mean", "median", "p99"))):
        assert row[col] == src[key], col
    # --metadata gpu=H200 tp=8 engine=vllm fills those columns (typed); what vLLM does not record stays empty
    assert (row["gpu"], row["tp"], row["engine"]) == ("H200", 8, "vllm")
    for col in ("gpu_count", "ep", "dataset_name", "random_input_len", "num_warmup_prompts", "ignore_eos",
                "spec_method", "mean_e2el_ms", "output_throughput_per_gpu", "engine_version"):
        assert row[col] is None, col


def test_vllm_options_fill_what_the_file_lacks_and_per_gpu_is_derived(tmp_path, capsys):
    out = tmp_path / "runs.csv"
    assert main(["bench", "import", str(VLLM_PLAIN), "--out", str(out), "--gpu", "H200", "--gpu-count", "8",
                 "--tp", "8", "--dataset-name", "random", "--random-input-len", "1024", "--random-output-len",
                 "1024", "--random-range-ratio", "0.25", "--ignore-eos", "true", "--num-warmup-prompts", "32"]) == 0
    src = json.loads(VLLM_PLAIN.read_text())
    (row,) = read_runs(out)
    assert row["request_rate"] == 8.0 and row["max_concurrency"] == 16 and row["source_ref"] is None
    assert (row["gpu"], row["gpu_count"], row["tp"], row["ignore_eos"], row["num_warmup_prompts"]) == \
        ("H200", 8, 8, True, 32)
    assert row["random_range_convention"] == "symmetric"   # vllm bench serve: [L(1-R), L(1+R)]
    assert row["output_throughput_per_gpu"] == src["output_throughput"] / 8
    assert row["acceptance_length"] is None   # no spec_decode_* keys in the file


def test_an_option_that_contradicts_the_file_is_an_error(tmp_path, capsys):
    out = tmp_path / "runs.csv"
    assert main(["bench", "import", str(VLLM), "--out", str(out), "--tp", "4"]) == 2
    err = _err(capsys)
    assert "vllm_result.json:1" in err and "'tp'" in err and "8" in err and "--tp" in err
    assert not out.exists()
    # the same value is no contradiction
    assert main(["bench", "import", str(VLLM), "--out", str(out), "--tp", "8"]) == 0


def test_an_option_that_differs_from_the_file_only_in_case_is_no_contradiction(tmp_path, capsys):
    """InferenceX writes 'h200', the walk-through types `--gpu H200`: a difference of case only was refused as a
    contradiction, while --where matches text case-insensitively. The file's spelling is kept."""
    out = tmp_path / "runs.csv"
    assert main(["bench", "import", str(VLLM), "--gpu", "h200", "--out", str(out)]) == 0, capsys.readouterr().err
    assert {r["gpu"] for r in read_runs(out)} == {"H200"}
    assert main(["bench", "import", str(VLLM), "--gpu", "H100", "--out", str(tmp_path / "o2.csv")]) == 2
    assert "'gpu'" in _err(capsys)


# --- SGLang ---------------------------------------------------------------------------------------------------

def test_sglang_jsonl_values_match_each_line():
    srcs = [json.loads(s) for s in SGLANG.read_text().splitlines()]
    rows = import_file(SGLANG)
    assert [r["source_row"] for r in rows] == [1, 2, 3] and {r["source_format"] for r in rows} == {"sglang"}
    for row, src in zip(rows, srcs):
        assert row["request_rate"] == math.inf == src["request_rate"]     # written as Infinity by json.dumps
        assert row["engine"] == "sglang" and row["dataset_name"] == "random"
        for col, key in (("max_concurrency", "max_concurrency"), ("random_input_len", "random_input_len"),
                         ("random_output_len", "random_output_len"), ("random_range_ratio", "random_range_ratio"),
                         ("duration_s", "duration"), ("completed", "completed"),
                         ("total_input_tokens", "total_input_tokens"),
                         ("total_output_tokens", "total_output_tokens"), ("output_throughput", "output_throughput"),
                         ("mean_e2el_ms", "mean_e2e_latency_ms"), ("median_e2el_ms", "median_e2e_latency_ms"),
                         ("p99_e2el_ms", "p99_e2e_latency_ms"),
                         *((f"{s}_{m}_ms",) * 2 for m in ("ttft", "tpot") for s in ("mean", "median", "p99"))):
            assert row[col] == src[key], col
        assert row["random_range_convention"] == "low"
        assert row["num_prompts"] is None and row["measurement_date"] is None   # SGLang does not record them
    # server_info (ServerArgs + version) fills the deployment of the two current-format lines
    a, b, old = rows
    assert (a["model"], a["tp"], a["ep"], a["dp_attention"], a["gpu_count"], a["engine_version"], a["spec_method"]) \
        == ("deepseek-ai/DeepSeek-R1-0528", 8, 1, False, 8, "0.5.12", "none")
    assert a["source_ref"] == "h200-c4" and a["acceptance_length"] is None and a["spec_num_steps"] is None
    assert a["output_throughput_per_gpu"] == srcs[0]["output_throughput"] / 8
    assert (b["spec_method"], b["spec_num_steps"], b["spec_num_draft_tokens"], b["spec_topk"],
            b["acceptance_length"]) == ("eagle", 2, 3, 1, srcs[1]["accept_length"])
    # the older key set: no tag, no server_info -> deployment empty, never guessed
    assert all(old[c] is None for c in ("source_ref", "model", "tp", "gpu_count", "spec_method",
                                        "output_throughput_per_gpu"))


def test_sglang_dp_attention_and_dp_replicas_count_gpus(tmp_path):
    rec = json.loads(SGLANG.read_text().splitlines()[0])
    lines = []
    for dpa, dp in ((True, 8), (False, 2)):
        rec["server_info"].update(tp_size=8, dp_size=dp, enable_dp_attention=dpa, ep_size=8)
        lines.append(json.dumps(rec))
    p = tmp_path / "dp.jsonl"
    p.write_text("\n".join(lines) + "\n")
    a, b = import_file(p)
    assert (a["gpu_count"], a["dp_attention"], a["ep"]) == (8, True, 8)     # DP attention splits the TP group
    assert (b["gpu_count"], b["dp_attention"]) == (16, False)                # 2 DP replicas of TP8
    # DP attention with --dp-size below --tp-size (attention TP 2 per rank) is not what the table's column means
    rec["server_info"].update(tp_size=8, dp_size=4, enable_dp_attention=True)
    p.write_text(json.dumps(rec) + "\n")
    with pytest.raises(InputError, match=r"server_info.dp_size.*4 with enable_dp_attention and tp_size 8"):
        import_file(p)


# --- InferenceX -----------------------------------------------------------------------------------------------

def test_inferencex_rows_match_the_table():
    with open(IX, newline="") as f:
        srcs = list(csv.DictReader(f))
    rows = import_file(IX)
    assert [r["source_row"] for r in rows] == list(range(2, 2 + len(srcs)))
    for row, s in zip(rows, srcs):
        assert row["source_format"] == "inferencex"
        assert row["source_ref"] == (s["run_url"] or s["source"])
        assert (row["model"], row["gpu"], row["precision"], row["measurement_date"]) == \
            (s["model"], s["hardware"], s["precision"], s["measurement_date"])
        assert (row["gpu_count"], row["tp"], row["ep"]) == (int(s["gpu_count_total"]), int(s["tp"]), int(s["ep"]))
        assert row["dp_attention"] == (s["dp_attention"] == "True")
        assert row["engine"] == {"sglang": "sglang", "trt": "trtllm"}[s["framework"]]
        assert row["engine_version"] == (s["framework_image"] or None)
        assert (row["dataset_name"], row["random_input_len"], row["random_output_len"], row["random_range_ratio"],
                row["random_range_convention"]) == ("random", int(s["isl"]), int(s["osl"]), 0.8, "low")
        c = int(s["concurrency"])
        assert (row["max_concurrency"], row["num_prompts"], row["request_rate"], row["ignore_eos"]) == \
            (c, int(float(s["num_prompts"])), math.inf, True)
        assert row["num_warmup_prompts"] == (2 * c if s["measurement_date"] >= "2026-01-21" else 0)
        assert row["output_throughput"] == _num(s["output_tput_aggregate"])
        assert row["output_throughput_per_gpu"] == _num(s["output_tput_per_gpu"])
        for m in ("tpot", "ttft"):
            for st in ("mean", "median", "p99"):
                assert row[f"{st}_{m}_ms"] == _num(s[f"{st}_{m}_ms"])
        for st in ("mean", "median", "p99"):
            v = _num(s[f"{st}_e2el_s"])
            assert row[f"{st}_e2el_ms"] == (None if v is None else pytest.approx(1000 * v, rel=1e-12))
        assert row["acceptance_length"] == _num(s["acceptance_length_reported"])
        assert row["completed"] is None and row["duration_s"] is None     # not published
        if s["mtp"] == "off":
            assert row["spec_method"] == "none" and row["spec_num_steps"] is None
        else:   # EAGLE(MTP head) num_steps=2 num_draft_tokens=3 topk=1
            assert (row["spec_method"], row["spec_num_steps"], row["spec_num_draft_tokens"], row["spec_topk"]) == \
                ("eagle", 2, 3, 1)
    assert sum(r["acceptance_length"] == 2.49 for r in rows) == 1
    assert {r["dp_attention"] for r in rows} == {True, False} and {r["tp"] for r in rows} == {4, 8}


@pytest.mark.skipif(not SHARED_CSV.is_file(), reason="../shared/data/inferencex absent")
def test_whole_shared_inferencex_table(tmp_path, capsys):
    out = tmp_path / "ix.csv"
    assert main(["bench", "import", str(SHARED_CSV), "--out", str(out)]) == 0
    rows = read_runs(out)
    assert len(rows) == 440
    # the README's table: hardware x framework x MTP
    assert Counter((r["gpu"], r["engine"], r["spec_method"]) for r in rows) == Counter({
        ("h200", "sglang", "none"): 116, ("h200", "sglang", "eagle"): 14, ("h200", "trtllm", "none"): 96,
        ("b200", "sglang", "none"): 106, ("b200", "sglang", "eagle"): 24, ("b200", "trtllm", "none"): 84})
    assert Counter((r["random_input_len"], r["random_output_len"]) for r in rows) == \
        Counter({(1024, 1024): 162, (8192, 1024): 160, (1024, 8192): 118})
    assert sum(r["dp_attention"] for r in rows) == 17 and sum(r["tp"] == 4 for r in rows) == 13
    assert all(r["num_prompts"] == 10 * r["max_concurrency"] for r in rows)


# --- the runs table -------------------------------------------------------------------------------------------

def test_runs_table_round_trips_exactly(tmp_path, capsys):
    out = tmp_path / "runs.csv"
    assert main(["bench", "import", str(VLLM), str(SGLANG), str(IX), "--out", str(out)]) == 0
    assert "10 runs from 3 file(s)" in capsys.readouterr().out
    text = out.read_text().splitlines()
    assert text[0] == MARKER and text[1].split(",") == list(NAMES)
    want = import_file(VLLM) + import_file(SGLANG) + import_file(IX)
    assert read_runs(out) == want     # every value, floats bit for bit, inf and empties included


def test_every_column_is_documented_in_the_docs():
    doc = (REPO / "docs" / "benchmarks.md").read_text()
    sec = re.split(r"\n#{1,3} ", doc.split("## Benchmark runs as input", 1)[1], maxsplit=1)[0]
    for c in COLUMNS:
        assert f"`{c.name}`" in sec, c.name
        if c.cli:
            assert f"`--{c.name.replace('_', '-')}`" in sec, c.name


def test_filled_by_says_what_each_importer_fills():
    """The documented field map (FILLED_BY, the docs/benchmarks.md table) against the fixtures: every column a format
    fills is filled in some fixture row, and no other column is (vLLM --metadata columns aside)."""
    tool = {"run_id", "source_format", "source_file", "source_row"}
    meta = {"gpu", "tp", "engine"}   # vllm_result.json's --metadata pairs
    for fmt, rows in (("vllm", import_file(VLLM) + import_file(VLLM_PLAIN, overrides={"random_range_ratio": 0.5,
                                                                                      "gpu_count": 8})),
                      ("sglang", import_file(SGLANG)), ("inferencex", import_file(IX))):
        filled = {n for n in NAMES if any(r[n] is not None for r in rows)} - tool
        if fmt == "vllm":
            filled -= meta | {"random_range_ratio", "gpu_count"}   # set by the options above
            want = set(FILLED_BY[fmt]) - {f"{s}_e2el_ms" for s in ("mean", "median", "p99")}  # not in the file
        else:
            want = set(FILLED_BY[fmt])
        assert filled == want, (fmt, filled ^ want)


@pytest.mark.parametrize("edit, field, msg", [
    (lambda r: r.update(tp="eight"), "tp", "expected a number"),
    (lambda r: r.update(tp="8.5"), "tp", "expected an integer"),
    (lambda r: r.update(random_range_ratio="1.5"), "random_range_ratio", "<= 1"),
    (lambda r: r.update(request_rate="0"), "request_rate", "> 0"),
    (lambda r: r.update(ignore_eos="yes"), "ignore_eos", "true or false"),
    (lambda r: r.update(source_format="csv"), "source_format", "expected one of"),
    (lambda r: r.update(run_id=""), "run_id", "must not be empty"),
])
def test_read_runs_names_file_line_and_column(tmp_path, edit, field, msg):
    rows = import_file(IX)[:3]
    good = tmp_path / "good.csv"
    write_runs(rows, good)
    lines = good.read_text().splitlines()
    header = lines[1].split(",")
    rd = list(csv.DictReader(lines[1:]))
    edit(rd[1])
    bad = tmp_path / "bad.csv"
    with open(bad, "w", newline="") as f:
        f.write(lines[0] + "\n")
        w = csv.DictWriter(f, header, lineterminator="\n")
        w.writeheader()
        w.writerows(rd)
    with pytest.raises(InputError) as e:
        read_runs(bad)
    assert e.value.line == 4 and e.value.field == field and msg in str(e.value), str(e.value)
    assert str(bad) in str(e.value)


def test_read_runs_refuses_missing_unknown_and_duplicate(tmp_path):
    good = tmp_path / "good.csv"
    write_runs(import_file(IX)[:2], good)
    lines = good.read_text().splitlines()
    p = tmp_path / "x.csv"
    p.write_text("\n".join([lines[1].replace(",p99_ttft_ms", ""), *(ln.rsplit(",", 1)[0] for ln in lines[2:])]))
    with pytest.raises(InputError, match="p99_ttft_ms.*missing column"):
        read_runs(p)
    p.write_text("\n".join([lines[1] + ",gpus", *(ln + ",8" for ln in lines[2:])]))
    with pytest.raises(InputError, match="'gpus'.*not a column"):
        read_runs(p)
    p.write_text("\n".join([lines[1], lines[2], lines[2]]))
    with pytest.raises(InputError, match="also on line 2") as e:
        read_runs(p)
    assert e.value.line == 3


@pytest.mark.parametrize("cmd", [["bench", "replay", "{f}", "--profile", "h100-llama2-7b-tp1", "--out", "{o}"],
                                 ["profile", "fit", "{f}", "--model", "deepseek-v3", "--gpu", "h200", "--tp", "8",
                                  "--out", "{o}/p.json"]])
@pytest.mark.parametrize("raw", [IX, SGLANG])
def test_a_raw_benchmark_file_given_as_runs_table_points_to_bench_import(tmp_path, capsys, cmd, raw):
    # a planner's first try hands the benchmark's own file to replay / fit: one line naming the file and the way on
    out = tmp_path / "out"
    assert main([a.format(f=raw, o=out) for a in cmd]) == 2
    err = _err(capsys)
    assert str(raw) in err and "not a column of the runs table" in err and "dsparksim bench import" in err, err
    assert not out.exists()
    # a runs table (marker line present) with one wrong column gets no such hint: it was converted already
    good = tmp_path / "good.csv"
    write_runs(import_file(IX)[:1], good)
    lines = good.read_text().splitlines()
    bad = tmp_path / "bad.csv"
    bad.write_text("\n".join([lines[0], lines[1] + ",gpus", lines[2] + ",8"]) + "\n")
    with pytest.raises(InputError, match="not a column of the runs table$"):
        read_runs(bad)


# --- bad input: one line, exit 2, nothing written -------------------------------------------------------------

def _vllm_with(**change) -> str:
    d = json.loads(VLLM.read_text())
    for k, v in change.items():
        if v is _DROP:
            del d[k]
        else:
            d[k] = v
    return json.dumps(d)


_DROP = object()


def _ix_with(i: int, col: str, value: str) -> str:
    rows = list(csv.reader(IX.read_text().splitlines()))
    rows[i][rows[0].index(col)] = value
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    return buf.getvalue()


def _bad_files(tmp_path):
    sg = SGLANG.read_text().splitlines()
    ix = IX.read_text().splitlines()
    cases = {
        "bad_json": ('{"date": "20261125-101502", "model_id": ', None, "invalid JSON"),
        "missing": (_vllm_with(duration=_DROP), "duration", "missing field"),
        "non_numeric": (_vllm_with(completed="forty"), "completed", "expected a number"),
        "negative": (_vllm_with(duration=-1.0), "duration", "> 0"),
        "bad_date": (_vllm_with(date="yesterday"), "date", "YYYYMMDD-HHMMSS"),
        "sg_line3": ("\n".join([sg[0], sg[1], sg[2].replace('"completed": 640', '"completed": "all"')]), "completed",
                     "expected a number"),
        "sg_trace": (sg[0].replace('"request_rate": Infinity', '"request_rate": "trace"'), "request_rate",
                     "not supported"),
        "ix_conc": (_ix_with(2, "concurrency", "four"), "concurrency", "expected a number"),
        "ix_column": ("\n".join([ix[0].replace("concurrency", "conc"), *ix[1:]]), "concurrency", "missing column"),
        "unknown_csv": ("a,b,c\n1,2,3\n", None, "unknown format"),
        "unknown_json": ('{"hello": 1}\n', None, "unknown format"),
        "empty": ("", None, "empty file"),
    }
    out = {}
    for name, (content, field, msg) in cases.items():
        p = tmp_path / f"{name}.{'csv' if name.startswith(('ix', 'unknown_csv')) else 'jsonl'}"
        p.write_text(content)
        out[name] = (p, field, msg)
    return out


def test_bad_files_give_one_line_exit_2_and_no_output(tmp_path, capsys):
    out = tmp_path / "runs.csv"
    for name, (p, field, msg) in _bad_files(tmp_path).items():
        # the bad file after a good one: still nothing written
        assert main(["bench", "import", str(VLLM_PLAIN), str(p), "--out", str(out)]) == 2, name
        err = _err(capsys)
        assert str(p) in err, (name, err)
        if field:
            assert f"'{field}'" in err, (name, err)
        if msg:
            assert msg in err, (name, err)
        assert not out.exists(), name
        assert not list(tmp_path.glob(".runs.csv*")), name      # no temporary file left behind


def test_bad_lines_are_named(tmp_path, capsys):
    files = _bad_files(tmp_path)
    main(["bench", "import", str(files["sg_line3"][0]), "--out", str(tmp_path / "o.csv")])
    assert "sg_line3.jsonl:3: field 'completed'" in _err(capsys)
    main(["bench", "import", str(files["ix_conc"][0]), "--out", str(tmp_path / "o.csv")])
    assert "ix_conc.csv:3: field 'concurrency'" in _err(capsys)


def test_format_option_overrides_sniffing(tmp_path, capsys):
    assert main(["bench", "import", str(SGLANG), "--format", "vllm", "--out", str(tmp_path / "o.csv")]) == 2
    assert "sglang_runs.jsonl:1: field 'model_id': missing field" in _err(capsys)
    assert main(["bench", "import", str(SGLANG), "--format", "sglang", "--out", str(tmp_path / "o.csv")]) == 0


def test_option_values_are_checked(tmp_path, capsys):
    out = tmp_path / "o.csv"
    assert main(["bench", "import", str(VLLM_PLAIN), "--out", str(out), "--gpu-count", "zero"]) == 2
    assert "--gpu-count" in _err(capsys) and not out.exists()
    assert main(["bench", "import", str(VLLM_PLAIN), "--out", str(out), "--random-range-convention", "wide"]) == 2
    assert "expected one of low, symmetric" in _err(capsys)
    assert main(["bench", "import", str(VLLM_PLAIN), "--out", str(out), "--measurement-date", "26/11/2026"]) == 2
    assert "'--measurement-date': expected YYYY-MM-DD[THH:MM:SS]" in _err(capsys) and not out.exists()


def test_a_runs_table_is_not_imported_again(tmp_path, capsys):
    p = tmp_path / "runs.csv"
    write_runs(import_file(IX), p)
    assert main(["bench", "import", str(p), "--out", str(tmp_path / "again.csv")]) == 2
    assert "already a dsparksim runs table" in _err(capsys)


# --- never overwrite ------------------------------------------------------------------------------------------

def test_existing_out_is_refused_force_replaces_only_a_runs_table(tmp_path, capsys):
    out = tmp_path / "runs.csv"
    out.write_text("my,own,data\n1,2,3\n")
    assert main(["bench", "import", str(VLLM), "--out", str(out)]) == 2
    assert "exists" in _err(capsys)
    assert main(["bench", "import", str(VLLM), "--out", str(out), "--force"]) == 2
    assert "never replaced" in _err(capsys)
    assert out.read_text() == "my,own,data\n1,2,3\n"
    out.unlink()
    assert main(["bench", "import", str(VLLM), "--out", str(out)]) == 0
    assert main(["bench", "import", str(VLLM), "--out", str(out)]) == 2
    _err(capsys)
    assert main(["bench", "import", str(SGLANG), "--out", str(out), "--force"]) == 0
    assert len(read_runs(out)) == 3


def test_an_input_is_never_the_output(tmp_path, capsys):
    p = tmp_path / "runs.csv"
    write_runs(import_file(IX), p)
    assert main(["bench", "import", str(p), "--out", str(p), "--force"]) == 2
    assert "also an input" in _err(capsys)


def test_the_same_file_twice_is_refused(tmp_path, capsys):
    out = tmp_path / "o.csv"
    assert main(["bench", "import", str(VLLM), str(VLLM), "--out", str(out)]) == 2
    assert "imported twice" in _err(capsys) and not out.exists()


def test_the_same_file_under_two_spellings_is_refused(tmp_path, capsys, monkeypatch):
    """x.csv and ./x.csv are one file: its runs would be imported twice under two run ids."""
    (tmp_path / "x.csv").write_bytes(IX.read_bytes())
    monkeypatch.chdir(tmp_path)
    assert main(["bench", "import", "x.csv", "./x.csv", "--out", "o.csv"]) == 2
    err = _err(capsys)
    assert "./x.csv" in err and "given twice" in err and not (tmp_path / "o.csv").exists()


def test_a_nan_cell_is_refused_not_read_as_missing(tmp_path, capsys):
    """'nan' text is not an empty cell: in a required column (InferenceX concurrency) it would pass as missing."""
    rows = list(csv.reader(io.StringIO(IX.read_text())))
    rows[1][rows[0].index("concurrency")] = "nan"
    src, out = tmp_path / "ix.csv", tmp_path / "o.csv"
    with open(src, "w", newline="") as f:
        csv.writer(f).writerows(rows)
    assert main(["bench", "import", str(src), "--out", str(out)]) == 2
    err = _err(capsys)
    assert "ix.csv:2: field 'concurrency'" in err and "'nan'" in err and not out.exists()
    assert main(["bench", "import", str(IX), "--out", str(out), "--max-concurrency", "nan"]) == 2
    assert "--max-concurrency" in _err(capsys) and not out.exists()
    good = tmp_path / "runs.csv"
    write_runs(import_file(IX), good)
    lines = good.read_text().splitlines()
    col = lines[1].split(",").index("max_concurrency")
    cells = next(csv.reader([lines[2]]))
    cells[col] = "nan"
    buf = io.StringIO()
    csv.writer(buf, lineterminator="").writerow(cells)
    lines[2] = buf.getvalue()
    good.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError, match=r"runs.csv:3: field 'max_concurrency'.*'nan'"):
        read_runs(good)


def test_a_runs_table_of_another_format_version_is_refused(tmp_path):
    p = tmp_path / "runs.csv"
    write_runs(import_file(IX), p)
    text = p.read_text()
    assert text.startswith(MARKER + "\n")
    p.write_text(text.replace(MARKER, "# dsparksim runs table v9 (README: Benchmark runs as input)", 1))
    with pytest.raises(InputError, match=r"runs.csv:1: .*format v9; this dsparksim reads v1"):
        read_runs(p)
    p.write_text(text.replace(MARKER, "# dsparksim runs table", 1))    # no version: read as it is
    assert len(read_runs(p)) == len(import_file(IX))


@pytest.mark.parametrize("opts,needle", [
    (["--measurement-date", "2026-02-30"], "--measurement-date': not a calendar date"),
    (["--measurement-date", "2026-02-28T25:00:00"], "--measurement-date': not a calendar date"),
    (["--tp", "8", "--gpu-count", "4"], "field 'tp': tp (8) exceeds gpu_count (4)"),
    (["--ep", "16", "--gpu-count", "8"], "field 'ep': ep (16) exceeds gpu_count (8)")])
def test_impossible_dates_and_parallel_sizes_are_refused(tmp_path, capsys, opts, needle):
    """A date of the right shape that is no calendar date, and a TP/EP group larger than the run's GPUs."""
    out = tmp_path / "o.csv"
    assert main(["bench", "import", str(SGLANG if opts[0] == "--measurement-date" else VLLM_PLAIN), *opts,
                 "--out", str(out)]) == 2
    assert needle in _err(capsys) and not out.exists()
    assert main(["bench", "import", str(SGLANG), "--measurement-date", "2026-02-28T23:00:00", "--out", str(out)]) == 0


def test_the_simulators_own_vllm_shaped_result_imports(tmp_path, capsys):
    """`dsparksim run` writes bench_result.json in vLLM's shape (pretty-printed, one key per line, with e2el
    statistics): it imports as a vLLM run with every statistic taken from it."""
    assert main(["run", "--concurrency", "2", "--duration", "2", "--quiet", "--out", str(tmp_path / "r")]) == 0
    src = json.loads((tmp_path / "r" / "bench_result.json").read_text())
    (row,) = import_file(tmp_path / "r" / "bench_result.json")
    assert row["source_format"] == "vllm" and row["model"] == src["model_id"]
    assert row["acceptance_length"] == src["spec_decode_acceptance_length"]
    for col in STATS:
        assert row[col] == src[col], col
    for col, key in (("completed", "completed"), ("failed", "failed"), ("duration_s", "duration"),
                     ("num_prompts", "num_prompts"), ("max_concurrency", "max_concurrency")):
        assert row[col] == src[key], col


def test_runs_frame_types(tmp_path):
    df = runs_frame(import_file(IX) + import_file(SGLANG))
    assert list(df.columns) == list(NAMES) and len(df) == 9
    assert str(df["tp"].dtype) == "Int64" and str(df["dp_attention"].dtype) == "boolean"
    assert df["num_prompts"].isna().sum() == 3 and df["request_rate"].eq(math.inf).all()


def test_write_runs_itself_never_replaces_another_file(tmp_path):
    rows = import_file(IX)[:1]
    mine = tmp_path / "notes.csv"
    mine.write_text("keep me\n")
    with pytest.raises(InputError, match="exists"):
        write_runs(rows, mine)
    with pytest.raises(InputError, match="never replaced"):
        write_runs(rows, mine, force=True)
    assert mine.read_text() == "keep me\n"
    ours = tmp_path / "runs.csv"
    write_runs(rows, ours)
    assert write_runs(import_file(IX), ours, force=True) == 6 and len(read_runs(ours)) == 6


def test_a_key_given_twice_is_refused_not_read_as_the_last(tmp_path, capsys):
    # json keeps the last of two equal keys silently: max_concurrency 4 then 64 would import a c=64 run
    text = VLLM_PLAIN.read_text()
    bad = tmp_path / "dup.json"
    bad.write_text(text.replace('{', '{"max_concurrency": 4, "max_concurrency": 64, ', 1))
    out = tmp_path / "o.csv"
    assert main(["bench", "import", str(bad), "--out", str(out)]) == 2
    err = _err(capsys)
    assert "dup.json" in err and "'max_concurrency' appears twice" in err and not out.exists()


def test_an_inferencex_column_given_twice_is_refused(tmp_path):
    # csv.DictReader keeps the last cell of a repeated header name: a second 'isl' column replaced every run's
    # input length silently
    lines = (DATA / "inferencex_rows.csv").read_text().splitlines()
    p = tmp_path / "ix.csv"
    p.write_text("\n".join([lines[0] + ",isl"] + [ln + ",99" for ln in lines[1:]]) + "\n")
    with pytest.raises(InputError, match=r"ix.csv:1: field 'isl': column given twice"):
        import_file(p)
    p.write_text("\n".join([lines[0] + ",extra"] + [ln + ",99" for ln in lines[1:]]) + "\n")
    assert 99 not in {r["random_input_len"] for r in import_file(p)}     # a column it does not read is no harm


def test_a_gpu_option_spelled_as_nvidia_smi_names_it_is_no_contradiction(tmp_path):
    # --gpu "NVIDIA H200" against an InferenceX row's 'h200' was refused as a contradiction
    lines = IX.read_text().splitlines()
    p = tmp_path / "ix.csv"
    p.write_text("\n".join([lines[0]] + [ln for ln in lines[1:] if ",h200," in ln]) + "\n")
    rows = import_file(p, overrides={"gpu": "NVIDIA H200"})
    assert len(rows) > 1 and {r["gpu"] for r in rows} == {"h200"}      # the file's spelling is kept
    with pytest.raises(InputError, match="field 'gpu'.*the file says 'h200' but --gpu says 'NVIDIA H20'"):
        import_file(p, overrides={"gpu": "NVIDIA H20"})


def test_sglang_server_settings_in_server_info_are_said_not_dropped(tmp_path, capsys):
    """server_info records the server's chunked prefill size, max running requests and memory fraction; the runs
    table has no column for them, so bench import names them as the options profile fit / bench replay take,
    once per file and settings (lines 1-2 of the fixture: 32768 / 512 / 0.82; line 3 has no server_info)."""
    out = tmp_path / "runs.csv"
    assert main(["bench", "import", str(SGLANG), "--out", str(out)]) == 0
    notes = [ln for ln in capsys.readouterr().out.splitlines() if "server_info records" in ln]
    assert len(notes) == 1, notes
    assert f"{SGLANG}: lines 1-2:" in notes[0], notes[0]
    assert "--chunked-prefill-size 32768 --max-running-requests 512 --mem-fraction-static 0.82" in notes[0]
    # a line with mixed chunks on and another chunk gets its own note, naming --mixed-prefill
    recs = [json.loads(s) for s in SGLANG.read_text().splitlines()[:2]]
    recs[1]["server_info"].update(chunked_prefill_size=8192, enable_mixed_chunk=True)
    src = tmp_path / "two.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    assert main(["bench", "import", str(src), "--out", str(tmp_path / "two.csv")]) == 0
    notes = [ln for ln in capsys.readouterr().out.splitlines() if "server_info records" in ln]
    assert len(notes) == 2 and "line 1:" in notes[0] and "line 2:" in notes[1], notes
    assert "--chunked-prefill-size 8192 --max-running-requests 512 --mem-fraction-static 0.82 --mixed-prefill" \
        in notes[1], notes[1]


def test_a_benchmark_result_or_runs_table_given_as_a_profile_points_to_profile_fit(tmp_path, capsys):
    """A new user passes their own benchmark file as --profile: a vLLM result said only "field 'format': missing
    (present keys: ...)" with ~40 keys, a runs table "not valid JSON: Expecting value"; both now say what the
    file is and how to learn a profile from it (bench import, profile fit)."""
    from dsparksim.cost.profile import load_profile  # the profile loader pulls in numpy; only this test needs it
    runs = tmp_path / "runs.csv"
    assert main(["bench", "import", str(VLLM_PLAIN), "--gpu", "H200", "--out", str(runs)]) == 0
    capsys.readouterr()
    for src, what in ((VLLM_PLAIN, "a benchmark's result"), (runs, "a runs table")):
        with pytest.raises(InputError) as ei:
            load_profile(src)
        msg = str(ei.value)
        assert str(src) in msg and what in msg and "not a cost profile" in msg, msg
        assert "dsparksim bench import" in msg and "dsparksim profile fit" in msg, msg
    sg = json.loads(SGLANG.read_text().splitlines()[0])
    one = tmp_path / "sg.json"
    one.write_text(json.dumps(sg))
    with pytest.raises(InputError, match="a benchmark's result"):
        load_profile(one)
    assert main(["frontier", "--profile", str(VLLM_PLAIN), "--out", str(tmp_path / "fr")]) == 2
    assert "not a cost profile" in _err(capsys)


def test_a_file_that_is_no_inferencex_table_given_as_one_says_so(tmp_path, capsys):
    # a vLLM result JSON on one line, its per-request list read as CSV cells, was refused with
    # "field '0.01': column given twice"; any other JSON with "missing column of the InferenceX table (33 missing)"
    rec = json.loads(VLLM.read_text().splitlines()[0])
    js = tmp_path / "result.json"
    js.write_text(json.dumps({**rec, "itls": [0.01, 0.01, 0.01, 0.01]}) + "\n")
    for src in (js, VLLM, SGLANG):
        assert main(["bench", "import", "--format", "inferencex", str(src), "--out", str(tmp_path / "o.csv")]) == 2
        err = _err(capsys)
        assert f"{src}: a JSON file, not an InferenceX CSV: --format inferencex reads InferenceX's results table, " \
               "a CSV whose first line names row_id, source, measurement_date" in err, err
        assert "given twice" not in err and "--format vllm / sglang" in err, err
    other = tmp_path / "other.csv"
    other.write_text("a,b,b\n1,2,3\n")
    assert main(["bench", "import", "--format", "inferencex", str(other), "--out", str(tmp_path / "o.csv")]) == 2
    assert f"{other}:1: not an InferenceX CSV: its first line names none of the table's columns" in _err(capsys)
    assert not (tmp_path / "o.csv").exists()


def test_an_sglang_jsonl_given_as_a_profile_points_to_profile_fit(tmp_path, capsys):
    # SGLang's bench_serving JSONL (one result per line) as --profile said "sglang_runs.jsonl:2: not valid JSON:
    # Extra data (column 1)"; a vLLM JSON and a runs table already said what the file is
    from dsparksim.cost.profile import load_profile  # the profile loader pulls in numpy; only this test needs it
    with pytest.raises(InputError) as ei:
        load_profile(SGLANG)
    msg = str(ei.value)
    assert str(SGLANG) in msg and "one JSON line per run (sglang bench_serving" in msg, msg
    assert "not a cost profile" in msg and "dsparksim bench import" in msg and "dsparksim profile fit" in msg, msg
    for cmd in (["run", "--duration", "2"], ["frontier"]):
        assert main(cmd + ["--profile", str(SGLANG), "--out", str(tmp_path / cmd[0])]) == 2
        err = _err(capsys)
        assert "Extra data" not in err and "not a cost profile" in err, err
    bad = tmp_path / "two.json"        # two JSON lines that are no benchmark results keep json's own error
    bad.write_text('{"a": 1}\n{"b": 2}\n')
    with pytest.raises(InputError, match="not valid JSON: Extra data"):
        load_profile(bad)


def test_sglang_chunk_above_the_builder_budget_note_says_profile_fit_refuses_it(tmp_path, capsys):
    """The fixture's chunked_prefill_size 32768 is above profile build's token budget (16384): the note used to send
    --chunked-prefill-size 32768 to profile fit, which refuses it; it now says so and what to do there. A chunk
    within the budget gets no such clause."""
    out = tmp_path / "runs.csv"
    assert main(["bench", "import", str(SGLANG), "--out", str(out)]) == 0
    notes = [ln for ln in capsys.readouterr().out.splitlines() if "server_info records" in ln]
    assert len(notes) == 1, notes
    assert "the chunk 32768 is above profile build's token budget 16384" in notes[0], notes[0]
    assert "profile fit refuses a --chunked-prefill-size above its profile's budget, so leave it out there" \
        in notes[0], notes[0]
    recs = [json.loads(s) for s in SGLANG.read_text().splitlines()[:1]]
    recs[0]["server_info"].update(chunked_prefill_size=16384)
    src = tmp_path / "one.jsonl"
    src.write_text(json.dumps(recs[0]) + "\n")
    assert main(["bench", "import", str(src), "--out", str(tmp_path / "one.csv")]) == 0
    notes = [ln for ln in capsys.readouterr().out.splitlines() if "server_info records" in ln]
    assert len(notes) == 1 and "--chunked-prefill-size 16384" in notes[0], notes
    assert "refuses" not in notes[0] and "token budget" not in notes[0], notes[0]
