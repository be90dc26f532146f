"""Issue 14, defects 7 and 8 and the option names: every option is checked before anything is simulated, nothing is
silently coerced or ignored, and the vLLM spellings map to the same configuration."""
from __future__ import annotations

import json
import sys

import pandas as pd
import pytest

import dsparksim.results.frontier as frontier_mod
import dsparksim.sim.simulate as simulate_mod
import dsparksim.sweep.runner as sweep_runner
from dsparksim.cli.main import _run_config, build_parser, main, run_traffic
from dsparksim.errors import ConfigError


def _never(*a, **k):
    raise AssertionError("a simulation started before the options were checked")


@pytest.fixture
def no_sim(monkeypatch):
    monkeypatch.setattr(simulate_mod, "simulate", _never)
    monkeypatch.setattr(frontier_mod, "run_cells", _never)
    monkeypatch.setattr(sweep_runner, "run_cells_cached", _never)


def _fails(argv: list[str], capsys) -> str:
    """Run the CLI; assert exit code 2 and exactly one stderr line without a traceback; return that line."""
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse's own checks
        rc = e.code
    err = capsys.readouterr().err.strip()
    assert rc == 2, (argv, rc, err)
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


@pytest.fixture
def a_file(tmp_path):
    f = tmp_path / "file.txt"
    f.write_text("x")
    return f


RUN_CASES = [
    (["--out", "{file}"], "--out"),
    (["--out", "{file}/sub"], "--out"),
    (["--out", "/proc/dsparksim-nope"], "--out"),
    (["--warmup", "60"], "--warmup"),
    (["--duration", "5", "--warmup", "7"], "--warmup"),
    (["--warmup", "-1"], "--warmup"),
    (["--warmup", "nan"], "--warmup"),
    (["--duration", "nan"], "--duration"),
    (["--duration", "inf"], "--duration"),
    (["--duration", "0"], "--duration"),
    (["--duration", "-3"], "--duration"),
    (["--seed", "-1"], "--seed"),
    (["--concurrency", "0"], "--concurrency"),
    (["--max-concurrency", "-2"], "--max-concurrency"),
    (["--rate", "0"], "--rate"),
    (["--num-requests", "0"], "--num-requests"),
    (["--time-scale", "2"], "--time-scale"),
    (["--concurrency", "4", "--time-scale", "2"], "--time-scale"),
    (["--arrival", "gamma"], "--arrival"),
    (["--concurrency", "4", "--arrival", "constant"], "--arrival"),
    # found by the hostile test of the merged branch: options the chosen policy never reads, absurd seeds,
    # inputs that used to be read only after the progress bar started
    (["--policy", "mtp1", "--acceptance", "dflash"], "--acceptance"),
    (["--policy", "mtp1", "-K", "5"], "--num-speculative-tokens"),
    (["--policy", "confidence", "--mtp1-acceptance", "tau:2"], "--mtp1-acceptance"),
    # --confidence with a policy that never reads the confidences (it was silently accepted)
    (["--policy", "fixed:7", "--confidence", "raw"], "--confidence"),
    (["--policy", "mtp1", "--confidence", "raw"], "--confidence"),
    (["--policy", "none", "--confidence", "sts"], "--confidence"),
    (["--policy", "goodput", "--confidence", "raw"], "--confidence"),
    (["--seed", str(2**63)], "seed"),
    (["--profile", "nosuch"], "nosuch"),
    (["--lengths", "{file}.missing.csv"], "lengths"),
    # fixed:k above K ran as fixed:K under the name fixed:k (silently clipped)
    (["--policy", "fixed:9"], "--policy"),
    (["--policy", "fixed:5", "-K", "4"], "--policy"),
]


@pytest.mark.parametrize("args, option", RUN_CASES)
def test_run_rejects_bad_options_before_simulating(tmp_path, capsys, no_sim, a_file, args, option):
    argv = ["run", *[a.replace("{file}", str(a_file)) for a in args]]
    if "--out" not in argv:
        argv += ["--out", str(tmp_path / "o")]
    err = _fails(argv, capsys)
    assert option in err
    assert not (tmp_path / "o").exists()


def test_parquet_without_pyarrow_fails_before_simulating(tmp_path, capsys, no_sim, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow -> ImportError
    err = _fails(["run", "--format", "parquet", "--out", str(tmp_path / "o")], capsys)
    assert "--format" in err and "pyarrow" in err


FRONTIER_CASES = [
    (["--rates", ","], "--rates"),
    (["--rates", "1,,2"], "--rates"),
    (["--concurrency-levels", ""], "--concurrency-levels"),
    (["--concurrency-levels", "0,4"], "--concurrency-levels"),
    (["--concurrency-levels", "1.5"], "--concurrency-levels"),
    (["--rates", "1,2", "--trace", "azure-conv-window"], "--rates"),
    (["--concurrency-levels", "1,2", "--trace", "azure-conv-window"], "--concurrency-levels"),
    (["--rates", "1", "--concurrency-levels", "2"], "--rates"),
    (["--time-scales", "1,2"], "--time-scales"),
    (["--baseline", "nosuch"], "--baseline"),
    (["--arrival", "gamma"], "--arrival"),
    (["--warmup", "9", "--duration", "9"], "--warmup"),
    (["--format", "parquet"], "--format"),
    (["--slo", "0"], "--slo"),
    (["--workers", "0"], "--workers"),
    (["--out", "{file}"], "--out"),
    (["--policies", "fixed:3,confidence", "--out", "{file}"], "--out"),   # the baseline note waits for the checks
    (["--policies", "mtp1,fixed:8"], "--policies"),   # fixed:8 would run as fixed:7 under its own name
    # options no swept policy reads
    (["--policies", "mtp1,fixed:7,goodput", "--confidence", "raw"], "--confidence"),
    (["--policies", "fixed:7,confidence", "--mtp1-acceptance", "tau:2"], "--mtp1-acceptance"),
]


@pytest.mark.parametrize("args, option", FRONTIER_CASES)
def test_frontier_rejects_bad_options_before_simulating(tmp_path, capsys, no_sim, a_file, args, option):
    argv = ["frontier", *[a.replace("{file}", str(a_file)) for a in args]]
    if "--out" not in argv:
        argv += ["--out", str(tmp_path / "o")]
    assert option in _fails(argv, capsys)
    assert not (tmp_path / "o").exists()


def _spec(tmp_path, extra: str = "") -> str:
    p = tmp_path / "s.toml"
    p.write_text('[base]\nduration_s = 3.0\n[axes]\npolicy = ["mtp1"]\n' + extra)
    return str(p)


@pytest.mark.parametrize("args, words", [
    (["--slo", "tps_usr_median>=5", "--min", "1", "--max", "4"], "tps_usr_median"),
    (["--sla", "tps_user_median=>5", "--min", "1", "--max", "4"], "METRIC OP NUMBER"),
    (["--slo", "tps_user_median>=5", "--min", "1", "--max", "4", "--out", "{file}"], "--out"),
    (["--slo", "tps_user_median>=5", "--min", "1", "--max", "4", "--workers", "0"], "--workers"),
])
def test_capacity_checks_slo_and_out_before_any_probe(tmp_path, capsys, no_sim, a_file, args, words):
    argv = ["capacity", _spec(tmp_path), *[a.replace("{file}", str(a_file)) for a in args]]
    if "--out" not in argv:
        argv += ["--out", str(tmp_path / "o")]
    assert words in _fails(argv, capsys)


def test_sweep_checks_out_before_any_cell(tmp_path, capsys, no_sim, a_file):
    assert "--out" in _fails(["sweep", _spec(tmp_path), "--out", str(a_file)], capsys)
    assert "arrival" in _fails(["sweep", _spec(tmp_path, 'arrival = ["gamma"]\n'), "--out", str(tmp_path / "o")],
                               capsys)


def test_capacity_missing_metric_is_infeasible_with_the_reason():
    from dsparksim.sweep.capacity import check_slo, parse_slo

    ok, bad = check_slo({"tps_user_median": None, "ttft_p99_s": 0.5, "saturated": False},
                        parse_slo(["tps_user_median >= 10", "ttft_p99_s <= 1"]))
    assert not ok and bad == ["tps_user_median >= 10 (no value: None)"]


def test_frontier_says_which_cells_finished_no_request(tmp_path, capsys):
    out = tmp_path / "f"
    rc = main(["frontier", "--policies", "mtp1,fixed:7", "--concurrency-levels", "1,2", "--duration", "1",
               "--warmup", "0.5", "--workers", "1", "--quiet", "--out", str(out)])
    assert rc == 0
    err = capsys.readouterr().err
    df = pd.read_csv(out / "frontier.csv")
    empty = df[df["num_requests_completed"] == 0]
    assert len(empty) >= 1 and len(df) == 4  # kept in the table
    assert empty["tps_user_median"].isna().all() and not empty["pareto"].any()
    line = next(x for x in err.splitlines() if "finished no request" in x)
    for _, r in empty.iterrows():
        assert f"{r['policy']}@{r['load']:g}" in line


# ---------------------------------------------------------------------------------------------- option names
def _cfg(*args: str):
    ns = build_parser().parse_args(["run", *args])
    return _run_config(ns, run_traffic(ns, default_concurrency=32)), ns


@pytest.mark.parametrize("vllm, ours", [
    (["--request-rate", "3", "--num-prompts", "40"], ["--rate", "3", "--num-requests", "40"]),
    (["--max-concurrency", "5"], ["--concurrency", "5"]),
    (["--num-speculative-tokens", "5"], ["-K", "5"]),
])
def test_vllm_spellings_give_the_same_config(vllm, ours):
    a, _ = _cfg(*vllm)
    b, _ = _cfg(*ours)
    assert a == b


def test_result_dir_and_deprecated_block_size(capsys):
    # run: --result-dir adds vLLM's result file to a folder (tests/test_bench_cli_flags.py), it is not --out
    _, ns = _cfg("--result-dir", "somewhere")
    assert ns.result_dir == "somewhere" and ns.out == "results/run"
    capsys.readouterr()
    a, _ = _cfg("--block-size", "5")
    assert a == _cfg("--num-speculative-tokens", "5")[0] and a.engine.block_size == 5
    err = capsys.readouterr().err
    assert "--block-size is deprecated" in err and "--num-speculative-tokens" in err
    _cfg("-K", "5")
    assert capsys.readouterr().err == ""


def test_one_spelling_per_concept_across_commands():
    p = build_parser()
    f1 = p.parse_args(["frontier", "--jobs", "2", "--sla", "50,100", "--result-dir", "x"])
    f2 = p.parse_args(["frontier", "--workers", "2", "--slo", "50,100", "--out", "x"])
    assert (f1.workers, f1.slo, f1.out) == (f2.workers, f2.slo, f2.out) == (2, ["50", "100"], "x")
    c1 = p.parse_args(["capacity", "s.toml", "--result-dir", "o", "--jobs", "3", "--sla", "tau>=2"])
    c2 = p.parse_args(["capacity", "s.toml", "--out", "o", "--workers", "3", "--slo", "tau>=2"])
    assert (c1.out, c1.workers, c1.slo) == (c2.out, c2.workers, c2.slo) == ("o", 3, ["tau>=2"])
    s = p.parse_args(["sweep", "s.toml", "--result-dir", "o", "--jobs", "2"])
    assert (s.out, s.workers) == ("o", 2)


def test_version(capsys):
    from dsparksim import __version__

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"dsparksim {__version__}"


def test_toml_keys_may_be_spelled_as_the_options():
    from dsparksim.sweep import spec_from_dict
    from dsparksim.sweep.cells import expand

    ours = spec_from_dict({"base": {"duration_s": 5.0, "block_size": 5, "warmup_s": 1.0, "kv_capacity_tokens": 90000},
                           "axes": {"rate": [1.0, 2.0]}})
    cli = spec_from_dict({"base": {"duration": 5.0, "num-speculative-tokens": 5, "warmup": 1.0,
                                   "kv-capacity": 90000}, "axes": {"request-rate": [1.0, 2.0]}})
    assert [c.config for c in expand(ours)] == [c.config for c in expand(cli)]
    assert [c.hash for c in expand(ours)] == [c.hash for c in expand(cli)]
    with pytest.raises(ConfigError, match="both mean 'duration_s'"):
        spec_from_dict({"base": {"duration": 5.0, "duration_s": 5.0}})
    with pytest.raises(ConfigError, match="unknown key 'durations'; known keys: .*duration_s"):
        spec_from_dict({"base": {"durations": 5.0}})


def test_argparse_errors_are_one_line(capsys):
    err = _fails(["run", "--nosuch-option"], capsys)
    assert err.startswith("dsparksim") and "error: unrecognized arguments: --nosuch-option" in err


def test_capacity_report_names_missing_values_in_the_trace(tmp_path):
    # A probe whose SLO metric has no value is infeasible, and the trace says why (documented choice).
    p = _spec(tmp_path, '[capacity]\nload = "concurrency"\nmin = 1\nmax = 2\nslo = ["tps_user_median >= 1"]\n')
    txt = (tmp_path / "s.toml").read_text().replace("duration_s = 3.0", "duration_s = 1.0\nwarmup_s = 0.5")
    (tmp_path / "s.toml").write_text(txt)
    assert main(["capacity", p, "--out", str(tmp_path / "o"), "--backend", "serial", "--quiet"]) == 0
    d = json.loads((tmp_path / "o" / "capacity.json").read_text())
    trace = d["results"][0]["trace"]
    assert any("no value" in v for t in trace for v in t["violations"]), trace
    from dsparksim.results.outputs import result_set_complete

    assert result_set_complete(tmp_path / "o", "capacity.manifest.json")


def test_sweep_spec_warmup_not_below_duration_fails_at_load(tmp_path, capsys, no_sim):
    p = tmp_path / "w.toml"
    p.write_text('[base]\nwarmup_s = 5.0\n[axes]\nduration_s = [10.0, 5.0]\n')
    assert "warmup_s" in _fails(["sweep", str(p), "--out", str(tmp_path / "o")], capsys)


@pytest.mark.parametrize("argv, option", [
    (["capacity", "{spec}", "--slo", "tau>=2", "--min", "1", "--max", "inf"], "--max"),
    (["capacity", "{spec}", "--slo", "tau>=2", "--min", "nan", "--max", "4"], "--min"),
    (["trace", "inspect", "dspark", "--seed", "-1"], "--seed"),
    (["trace", "inspect", "dspark", "--K", "0"], "--K"),
])
def test_numeric_options_of_other_commands(tmp_path, capsys, no_sim, argv, option):
    argv = [a.replace("{spec}", _spec(tmp_path)) for a in argv]
    if argv[0] == "capacity":
        argv += ["--out", str(tmp_path / "o")]
    assert option in _fails(argv, capsys)


@pytest.mark.parametrize("args, words", [
    (["--profile", "nosuch"], "nosuch"),
    (["--acceptance", "dspark-chat"], "dspark-chat"),
    (["--lengths", "tests/data/no_such_lengths.csv"], "no_such_lengths.csv"),
    (["--profile", "cpu-tiny", "--acceptance", "eagle3", "--policies", "mtp1,fixed:3"], "eagle3"),
])
def test_frontier_loads_its_inputs_before_any_cell(tmp_path, capsys, no_sim, args, words):
    argv = ["frontier", "--concurrency-levels", "1,2", "--duration", "2", "--workers", "1", *args,
            "--out", str(tmp_path / "o")]
    assert words in _fails(argv, capsys)


def test_capacity_table_accepts_the_option_names():
    from dsparksim.sweep import spec_from_dict
    from dsparksim.sweep.capacity import capacity_settings

    a = spec_from_dict({"base": {"duration_s": 3.0}, "capacity": {"min": 1, "max": 8, "sla": ["tau >= 2"],
                                                                  "allow-saturated": True}})
    b = spec_from_dict({"base": {"duration_s": 3.0}, "capacity": {"min": 1, "max": 8, "slo": ["tau >= 2"],
                                                                  "require_unsaturated": False}})
    assert capacity_settings(a) == capacity_settings(b)
    assert capacity_settings(a).require_unsaturated is False
    c = spec_from_dict({"base": {"duration_s": 3.0}, "capacity": {"min": 1, "max": 8, "sla": ["tau >= 2"],
                                                                  "slo": ["tau >= 1"]}})
    with pytest.raises(ConfigError, match="capacity.sla"):
        capacity_settings(c)


def test_frontier_backend_serial_matches_local_and_ray_address_needs_ray(tmp_path, capsys):
    base = ["frontier", "--policies", "mtp1,fixed:3", "--concurrency-levels", "1,4", "--duration", "3", "--quiet"]
    assert main([*base, "--backend", "serial", "--out", str(tmp_path / "s")]) == 0
    assert main([*base, "--backend", "local", "--workers", "2", "--out", str(tmp_path / "l")]) == 0
    a = (tmp_path / "s" / "frontier.csv").read_text()
    assert a == (tmp_path / "l" / "frontier.csv").read_text()
    capsys.readouterr()
    assert main([*base, "--ray-address", "auto", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--ray-address" in err[0] and not (tmp_path / "r").exists()


# ------------------------------------------------------------------ found by the hostile test of the merged branch
def test_warmup_past_the_end_of_a_num_requests_run_is_one_line(tmp_path, capsys):
    err = _fails(["run", "--num-requests", "4", "--warmup", "1000", "--quiet", "--out", str(tmp_path / "o")], capsys)
    assert "warmup" in err and not (tmp_path / "o").exists()


def test_run_warns_when_no_request_is_measured(tmp_path, capsys):
    assert main(["run", "--num-requests", "4", "--warmup", "0.001", "--quiet", "--out", str(tmp_path / "o")]) == 0
    assert "no request both arrived inside the measurement window" in capsys.readouterr().err


@pytest.mark.parametrize("args, option", [
    (["--policies", ""], "--policies"),
    (["--policies", "mtp1,fixed:3,mtp1"], "--policies"),
    (["--concurrency-levels", "4,4"], "load levels"),
])
def test_frontier_rejects_empty_and_duplicate_lists(tmp_path, capsys, no_sim, args, option):
    err = _fails(["frontier", *args, "--out", str(tmp_path / "o")], capsys)
    assert option in err


def test_frontier_slo_and_sla_both_count():
    from dsparksim.cli.main import frontier_slos
    a = build_parser().parse_args(["frontier", "--slo", "50", "--sla", "60,tps_user_median>=70"])
    assert frontier_slos(a)[0] == [50.0, 60.0, 70.0]


def test_frontier_without_mtp1_measures_against_the_first_policy_and_says_so(tmp_path, capsys):
    out = tmp_path / "o"
    assert main(["frontier", "--policies", "fixed:3,confidence", "--concurrency-levels", "1,4", "--duration", "3",
                 "--quiet", "--out", str(out)]) == 0
    assert "gains are measured against fixed:3" in capsys.readouterr().err
    comp = pd.read_csv(out / "comparison.csv")
    assert set(comp["policy"]) == {"confidence"}


def test_a_directory_in_place_of_a_cached_summary_is_recomputed(tmp_path):
    from dsparksim.sweep.cache import CellCache
    c = CellCache(tmp_path)
    (c.dir("abc") / "summary.json").mkdir(parents=True)
    assert c.get("abc") is None and not (c.dir("abc") / "summary.json").exists()


def test_empty_sweep_spec_is_refused(tmp_path, capsys, no_sim):
    spec = tmp_path / "empty.toml"
    spec.write_text("")
    err = _fails(["sweep", str(spec), "--out", str(tmp_path / "o")], capsys)
    assert "nothing to sweep" in err


def test_vllm_prefix_wins_over_a_csv_suffix(tmp_path, capsys):
    log = tmp_path / "metrics.csv"
    log.write_bytes(b"\xff\xfe not a log")
    err = _fails(["run", "--acceptance", f"vllm:{log}", "--num-requests", "2", "--quiet", "--out",
                  str(tmp_path / "o")], capsys)
    assert "not found" not in err and str(log) in err


def test_confidence_option_reaches_the_policies_that_read_it(tmp_path, capsys):
    # the policies that read the confidences accept --confidence; reads_confidence marks exactly those
    from dsparksim.policies import make_policy
    readers = {s for s in ("none", "mtp1", "fixed:7", "threshold:0.5", "goodput", "confidence",
                           "confidence-global", "confidence-async:2", "oracle") if make_policy(s).reads_confidence}
    assert readers == {"threshold:0.5", "confidence", "confidence-global", "confidence-async:2"}
    rc = main(["run", "--policy", "threshold:0.5", "--confidence", "raw", "--num-requests", "8", "--concurrency", "2",
               "--out", str(tmp_path / "o"), "--quiet"])
    assert rc == 0 and (tmp_path / "o" / "summary.json").is_file()


@pytest.mark.parametrize("args", [["--policies", "fixed:7,confidence", "--confidence", "raw"],
                                  ["--policies", "mtp1,fixed:7", "--mtp1-acceptance", "tau:1.8"]])
def test_frontier_accepts_options_one_swept_policy_reads(tmp_path, no_sim, args):
    # the checks pass (the first cell is the next thing to run: the no_sim guard stops it there)
    with pytest.raises(AssertionError, match="a simulation started"):
        main(["frontier", *args, "--concurrency-levels", "1", "--out", str(tmp_path / "o"), "--quiet"])


def test_frontier_default_policies_verify_the_whole_block_at_any_k():
    """The default list's fixed:7 is fixed:K at another --num-speculative-tokens (fixed:7 at K=4 ran as fixed:4)."""
    from dsparksim.cli.main import frontier_policies
    assert "fixed:4" in frontier_policies(build_parser().parse_args(["frontier", "-K", "4"]))[0]
    assert "fixed:7" in frontier_policies(build_parser().parse_args(["frontier"]))[0]
