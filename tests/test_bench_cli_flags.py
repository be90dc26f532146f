"""`run` / `frontier` with vllm bench serve's flags (issue 30 part 2, issue 31 items 14-15): parsing, meanings,
bench_result.json fields, and one-line refusals."""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dsparksim.cli.main import _run_config, build_parser, main, run_traffic
from dsparksim.results.bench_json import bench_result

SMALL = ["--profile", "h100-llama2-7b-tp1"]


def _cfg(*args: str):
    ns = build_parser().parse_args(["run", *args])
    ns._argv = list(args)
    return _run_config(ns, run_traffic(ns, default_concurrency=32))


def _fails(argv: list[str], capsys) -> str:
    try:
        rc = main(argv)
    except SystemExit as e:
        rc = e.code
    err = capsys.readouterr().err.strip()
    assert rc == 2, (argv, rc, err)
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


def test_max_concurrency_is_the_cap_over_num_prompts():
    t = _cfg("--max-concurrency", "4", "--num-prompts", "40").traffic
    assert (t.mode, t.concurrency, t.num_requests, t.max_concurrency) == ("closed", 4, 40, None)
    # without --num-prompts it stays the closed loop's users (duration-bound), as before
    t = _cfg("--max-concurrency", "5").traffic
    assert (t.mode, t.concurrency, t.num_requests) == ("closed", 5, None)
    # at a finite rate: open loop capped by the client
    t = _cfg("--request-rate", "5", "--max-concurrency", "3", "--num-prompts", "20").traffic
    assert (t.mode, t.rate, t.max_concurrency, t.num_requests) == ("poisson", 5.0, 3, 20)


def test_request_rate_inf():
    t = _cfg("--request-rate", "inf", "--num-prompts", "12").traffic
    assert (t.mode, t.concurrency, t.num_requests) == ("closed", 12, 12)   # every prompt at once
    t = _cfg("--request-rate", "inf", "--max-concurrency", "3", "--num-prompts", "12").traffic
    assert (t.mode, t.concurrency) == ("closed", 3)


def test_random_dataset_flags():
    t = _cfg("--dataset-name", "random", "--random-input-len", "1000", "--random-output-len", "100",
             "--random-range-ratio", "0.8", "--num-prompts", "5").traffic
    assert (t.dataset_name, t.input_len, t.output_len, t.range_ratio) == ("random", 1000, 100, 0.8)
    t = _cfg("--random-input-len", "64", "--num-prompts", "5").traffic      # a random length names the dataset
    assert (t.dataset_name, t.input_len, t.output_len) == ("random", 64, 128)  # vLLM's default output length
    t = _cfg("--num-warmup-prompts", "6", "--num-prompts", "5").traffic
    assert t.num_warmup_prompts == 6 and t.total_requests == 11


def test_server_flags_and_aliases():
    e = _cfg("--chunked-prefill-size", "4096", "--max-running-requests", "64", "--max-num-batched-tokens", "8192",
             "--data-parallel-size", "2", "--cuda-graph-max-bs", "128", "--tensor-parallel-size", "1").engine
    assert (e.prefill_chunk_tokens, e.max_num_seqs, e.max_batched_tokens, e.dp_ranks, e.cuda_graph_max_bs,
            e.tensor_parallel_size) == (4096, 64, 8192, 2, 128, 1)
    assert _cfg("--mem-fraction-static", "0.8").engine.mem_fraction_static == 0.8


@pytest.mark.parametrize("args,flag", [
    (["--request-rate", "inf"], "--rate"),
    (["--concurrency", "4", "--max-concurrency", "4", "--num-prompts", "8"], "--max-concurrency"),
    (["--dataset-name", "sharegpt"], "--dataset-name"),
    (["--random-range-ratio", "1.5"], "--random-range-ratio"),
    (["--num-warmup-prompts", "3"], "--num-warmup-prompts"),
    (["--num-warmup-prompts", "3", "--num-prompts", "9", "--warmup", "1"], "--warmup"),
    (["--random-input-len", "64", "--lengths", "sharegpt", "--num-prompts", "5"], "conflicts with lengths"),
    (["--mem-fraction-static", "0.8"], "metadata.build.memory"),            # the 7B profile has no memory metadata
    (["--mem-fraction-static", "0.8", "--kv-capacity", "1000"], "--mem-fraction-static"),
    (["--tensor-parallel-size", "4"], "--tensor-parallel-size"),
    (["--metric-percentiles", "0"], "--metric-percentiles"),
    (["--percentile-metrics", "ttft,foo"], "--percentile-metrics"),
    (["--metadata", "novalue"], "--metadata"),
    (["--metadata", "duration=3"], "--metadata"),
    (["--goodput", "tpot=50"], "--goodput"),
    (["--goodput", "speed:50"], "--goodput"),
    (["--result-filename", "a/b.json", "--num-prompts", "4"], "--result-filename"),
])
def test_bad_client_flags_one_line(tmp_path, capsys, args, flag):
    err = _fails(["run", *SMALL, *args, "--out", str(tmp_path / "o"), "--quiet"], capsys)
    assert flag in err
    assert not (tmp_path / "o").exists()


def test_frontier_cap_needs_rates(tmp_path, capsys):
    err = _fails(["frontier", *SMALL, "--policies", "none", "--baseline", "none", "--num-prompts", "8", "--concurrency-levels", "2,4",
                  "--max-concurrency", "4", "--out", str(tmp_path / "f")], capsys)
    assert "--max-concurrency" in err


def _run(tmp_path: Path, *args: str, out: str = "out") -> tuple[dict, dict, pd.DataFrame]:
    o = tmp_path / out
    assert main(["run", *SMALL, "--policy", "none", *args, "--quiet", "--out", str(o)]) == 0
    return (json.loads((o / "bench_result.json").read_text()), json.loads((o / "summary.json").read_text()),
            pd.read_csv(o / "requests.csv"))


def test_client_run_bench_json_agrees_with_the_summary_and_the_api(tmp_path):
    from dsparksim.bench.client import ClientWorkload, run_client

    args = ("--random-input-len", "300", "--random-output-len", "40", "--random-range-ratio", "0.5",
            "--num-prompts", "30", "--max-concurrency", "5", "--num-warmup-prompts", "7", "--seed", "3")
    d, s, req = _run(tmp_path, *args)
    assert d["num_prompts"] == 30 and d["completed"] == 30 and d["failed"] == 0
    assert d["max_concurrency"] == 5 and d["request_rate"] == "inf"
    # duration: the benchmark's (after the warm-up); output throughput as the summary's
    assert d["duration"] == pytest.approx(s["window_s"], rel=1e-9)   # summary.json keeps 10 digits
    assert d["output_throughput"] == pytest.approx(s["output_throughput_tok_s"], rel=1e-9)
    assert d["output_throughput"] == pytest.approx(d["total_output_tokens"] / d["duration"], rel=1e-12)
    # the API simulates the very same run
    r = run_client("h100-llama2-7b-tp1", ClientWorkload(300, 40, 0.5, num_prompts=30, max_concurrency=5,
                                                        num_warmup_prompts=7), seed=3)
    m = r.metrics
    assert m["duration_s"] == pytest.approx(d["duration"], rel=1e-9)
    assert m["mean_tpot_ms"] == pytest.approx(d["mean_tpot_ms"], rel=1e-9)
    assert m["p99_ttft_ms"] == pytest.approx(d["p99_ttft_ms"], rel=1e-9)
    assert m["output_throughput"] == pytest.approx(d["output_throughput"], rel=1e-9)
    assert sorted(r.requests["prompt_len"]) == sorted(d["input_lens"])


def test_failed_counts_refused_requests_not_those_in_flight(tmp_path):
    # a duration-bound closed loop ends with requests in flight: they are not failed
    d, s, _ = _run(tmp_path, "--concurrency", "8", "--duration", "3", out="a")
    unfinished = sum(e.startswith(("unfinished", "not admitted")) for e in d["errors"])
    assert unfinished >= 1 and d["failed"] == 0
    assert d["completed"] + d["failed"] + unfinished == d["num_prompts"]
    # requests longer than max_model_len... here: beyond the KV capacity are refused: failed
    d, _, req = _run(tmp_path, "--random-input-len", "900", "--random-output-len", "20", "--random-range-ratio",
                     "0.0", "--num-prompts", "40", "--max-concurrency", "4", "--kv-capacity", "600", out="b")
    refused = int(req["rejected"].sum())
    assert refused >= 1 and d["failed"] == refused and d["completed"] == 40 - refused


def _hand_built():
    from dsparksim.sim.cluster import SimResult
    nan = np.nan
    steps = {"t_start": np.array([0.0, 1.0, 2.0, 3.0]), "dt": np.array([1.0, 1.0, 1.0, 1.0]),
             "verify_tokens": np.zeros(4, int), "drafts": np.zeros(4, int), "accepted": np.zeros(4, int)}
    # A: ttft 1, e2e 3, 5 tokens -> tpot 0.5 s; B: ttft 0.5, e2e 1.5, 1 token -> tpot 0 (vLLM); C: refused
    return SimResult(
        arrival_s=np.array([0.0, 0.5, 0.5]), admitted_s=np.array([0.0, 0.5, nan]),
        first_token_s=np.array([1.0, 1.0, nan]), finish_s=np.array([3.0, 2.0, nan]),
        prompt_tokens=np.array([7, 10, 99]), output_tokens=np.array([5, 1, 9]), emitted_tokens=np.array([5, 1, 0]),
        decode_steps=np.array([2, 0, 0]), verify_tokens=np.zeros(3, int), accepted_tokens=np.zeros(3, int),
        domain=np.array(["chat"] * 3), steps=steps, sim_time_s=4.0, ended_by="all_requests_done",
        kv_capacity_tokens=1000, max_batched_tokens=64, block_size=0, drafter=None,
        reject_reason=np.array([0, 0, 2]), step_accepted_per_pos=np.zeros((4, 0), int))


def test_goodput_percentiles_label_metadata_in_closed_form():
    kw = dict(warmup_s=0.0, duration_s=4.0, model_id="m", request_rate="inf", burstiness=1.0, max_concurrency=2)
    d = bench_result(_hand_built(), **kw, goodput={"tpot": 400.0}, label="L", metadata={"team": "x"},
                     percentiles=(50, 99.9), metrics=("ttft", "tpot"))
    assert d["completed"] == 2 and d["failed"] == 1
    assert d["request_goodput"] == pytest.approx(1 / 4.0)        # A's TPOT 500 ms misses 400; B's counts as 0
    assert bench_result(_hand_built(), **kw, goodput={"tpot": 500.0})["request_goodput"] == pytest.approx(2 / 4)
    assert bench_result(_hand_built(), **kw, goodput={"ttft": 600.0, "e2el": 3000.0})["request_goodput"] == \
        pytest.approx(1 / 4)                                      # A's TTFT 1000 ms misses
    assert bench_result(_hand_built(), **kw)["request_goodput"] is None
    assert d["label"] == "L" and d["team"] == "x"
    assert d["p50_ttft_ms"] == pytest.approx(750.0) and "p99.9_tpot_ms" in d
    assert d["mean_tpot_ms"] == pytest.approx(500.0)             # one-token requests have no TPOT sample
    assert not any(k.endswith("_itl_ms") or k.endswith("_e2el_ms") for k in d)


def test_result_dir_adds_a_file_and_never_replaces(tmp_path, capsys):
    rd = tmp_path / "rd"
    rd.mkdir()
    (rd / "mine.txt").write_text("keep")
    argv = ["run", *SMALL, "--policy", "none", "--num-prompts", "6", "--max-concurrency", "2", "--quiet",
            "--result-dir", str(rd), "--result-filename", "r.json", "--save-result"]
    here = Path.cwd()
    assert main(argv) == 0
    assert (rd / "mine.txt").read_text() == "keep"
    d = json.loads((rd / "r.json").read_text())
    assert d["num_prompts"] == 6
    assert not (here / "results" / "run" / "r.json").exists()
    err = _fails(argv, capsys)                                   # the same name again: refused, kept
    assert "--result-dir" in err and "exists" in err
    assert json.loads((rd / "r.json").read_text()) == d
    # with --out too: the folder and the file; vLLM's default name
    out = tmp_path / "o"
    assert main([*argv[:-3], "--save-result", "--out", str(out), "--label", "lab"]) == 0
    assert (out / "bench_result.json").exists()
    names = sorted(p.name for p in rd.iterdir())
    assert any(n.startswith("lab-infqps-concurrency2-") and n.endswith(".json") for n in names)
    assert math.isfinite(d["duration"])


@pytest.mark.parametrize("sub", ["", "sub"])
def test_result_dir_inside_out_is_refused(tmp_path, capsys, sub):
    """--result-dir == --out (or a folder in it): the file was written, listed as written, then deleted with the
    folder --out replaces whole."""
    out = tmp_path / "o"
    err = _fails(["run", *SMALL, "--policy", "none", "--num-prompts", "4", "--quiet", "--out", str(out),
                  "--result-dir", str(out / sub), "--save-result"], capsys)
    assert "--result-dir" in err and "inside --out" in err and not out.exists()


@pytest.mark.parametrize("label", ["../escaped", "a/b", "line\nbreak"])
def test_a_label_that_is_not_a_plain_name_is_refused_with_result_dir(tmp_path, capsys, label):
    """vLLM's result file name starts with --label: '../escaped' wrote the file outside --result-dir."""
    rd = tmp_path / "rd" / "inner"
    err = _fails(["run", *SMALL, "--policy", "none", "--num-prompts", "4", "--quiet", "--out", str(tmp_path / "o"),
                  "--result-dir", str(rd), "--label", label, "--save-result"], capsys)
    assert "--label" in err and not (tmp_path / "o").exists()
    assert not any(p.is_file() for p in tmp_path.rglob("*"))


def _subparser(parser, path: tuple[str, ...]):
    for name in path:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[name]
    return parser


@pytest.mark.parametrize("path", [("run",), ("frontier",), ("plan",), ("bench", "import"), ("bench", "replay"),
                                  ("profile", "fit")])
def test_every_option_of_the_walk_through_commands_says_what_it_does(path):
    """`--help` of the commands docs/from-benchmark-to-frontier.md walks through: every option has a help line
    (run, frontier and bench replay listed a bare `--quiet`), and bench replay's server settings name the fitted
    profile's server as their default (they said the token budget / nothing, while a fitted profile's fit wins)."""
    parser = _subparser(build_parser(), path)
    bare = [a.option_strings[0] for a in parser._actions if a.option_strings and not a.help]
    assert not bare, f"{' '.join(path)}: options without help: {bare}"
    if path == ("bench", "replay"):
        helps = {a.option_strings[0]: a.help for a in parser._actions if a.option_strings}
        for flag in ("--chunked-prefill-size", "--max-running-requests", "--mem-fraction-static"):
            assert "fitted profile" in helps[flag], (flag, helps[flag])
