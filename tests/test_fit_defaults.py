"""A `profile fit` profile carries the server it was fitted under (metadata.fit.client_model): run, frontier,
sweep, capacity and plan simulate that server where the user sets no other (prefill chunk, most running requests,
memory fraction, mixed prefill), say so in one line, and caution when a set value differs; other profiles keep the
run's defaults (2048-token chunk, 1024 requests, the profile's KV capacity, mixed prefill)."""
from __future__ import annotations

import json
import re

import pytest

from dsparksim.cli.main import main
from dsparksim.cost.profile import read_profile_dict
from dsparksim.errors import ConfigError
from plan_toml import toml

BASE = "built-h100-llama2-7b-tp1"          # a built profile (memory metadata for the fraction), fast to simulate
FIT = {"prefill_chunk_tokens": 4096, "max_num_seqs": 64, "mem_fraction_static": 0.8,
       "mixed_prefill": {"value": False, "source": "test"}}
RUN = ["--policy", "none", "--concurrency", "2", "--duration", "2", "--quiet"]


def fitted_profile(tmp_path, latency: float = 0.05, **client_model) -> str:
    """BASE with a fit record as `profile fit` writes it (its client_model replaced by FIT + ``client_model``)."""
    d, _ = read_profile_dict(BASE)
    d["metadata"]["fit"] = {"command": "dsparksim profile fit", "client_model": {**FIT, **client_model}}
    d["request_latency_s"] = latency
    p = tmp_path / "fitted.json"
    p.write_text(json.dumps(d))
    return str(p)


def engine_of(out_dir) -> dict:
    return json.loads((out_dir / "config.json").read_text())["config"]["engine"]


def fit_lines(err: str, kind: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith(f"dsparksim: {kind}:") and "fitted under" in ln]


def test_run_on_a_fitted_profile_simulates_the_fit_server_and_says_so(tmp_path, capsys):
    prof = fitted_profile(tmp_path)
    assert main(["run", "--profile", prof, *RUN, "--out", str(tmp_path / "o")]) == 0
    eng = engine_of(tmp_path / "o")
    assert (eng["prefill_chunk_tokens"], eng["max_num_seqs"], eng["mem_fraction_static"], eng["mixed_prefill"]) \
        == (4096, 64, 0.8, False)
    err = capsys.readouterr().err
    notes = fit_lines(err, "note")
    assert len(notes) == 1, err
    assert "--prefill-chunk 4096, --max-num-seqs 64, --mem-fraction-static 0.8, --no-mixed-prefill" in notes[0]
    assert not fit_lines(err, "caution"), err
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["kv_capacity_tokens"] != read_profile_dict(BASE)[0]["metadata"]["kv_capacity_tokens"]


def test_a_typed_option_wins_and_a_different_value_is_cautioned(tmp_path, capsys):
    prof = fitted_profile(tmp_path)
    assert main(["run", "--profile", prof, *RUN, "--prefill-chunk", "2048", "--mixed-prefill",
                 "--out", str(tmp_path / "o")]) == 0
    eng = engine_of(tmp_path / "o")
    assert (eng["prefill_chunk_tokens"], eng["mixed_prefill"], eng["max_num_seqs"]) == (2048, True, 64)
    err = capsys.readouterr().err
    (note,), (caution,) = fit_lines(err, "note"), fit_lines(err, "caution")
    assert "--prefill-chunk" not in note and "--max-num-seqs 64" in note
    assert "--prefill-chunk 2048, --mixed-prefill differ from" in caution
    assert "(--prefill-chunk 4096, --no-mixed-prefill)" in caution
    # the fit's own value typed (its other spelling): used, no caution
    assert main(["run", "--profile", prof, *RUN, "--chunked-prefill-size", "4096", "--out", str(tmp_path / "p")]) == 0
    err = capsys.readouterr().err
    assert engine_of(tmp_path / "p")["prefill_chunk_tokens"] == 4096
    assert not fit_lines(err, "caution") and "--prefill-chunk" not in fit_lines(err, "note")[0]


def test_kv_capacity_replaces_the_fit_memory_fraction_with_a_caution(tmp_path, capsys):
    prof = fitted_profile(tmp_path)
    assert main(["run", "--profile", prof, *RUN, "--kv-capacity", "50000", "--out", str(tmp_path / "o")]) == 0
    eng = engine_of(tmp_path / "o")
    assert (eng["kv_capacity_tokens"], eng["mem_fraction_static"]) == (50000, None)
    caution = fit_lines(capsys.readouterr().err, "caution")
    assert len(caution) == 1 and "--kv-capacity 50000 differs" in caution[0] and "--mem-fraction-static 0.8" \
        in caution[0]


def test_a_profile_without_a_fit_keeps_the_run_defaults_silently(tmp_path, capsys):
    assert main(["run", "--profile", BASE, *RUN, "--out", str(tmp_path / "o")]) == 0
    eng = engine_of(tmp_path / "o")
    assert (eng["prefill_chunk_tokens"], eng["max_num_seqs"], eng["mem_fraction_static"], eng["mixed_prefill"]) \
        == (2048, 1024, None, True)
    err = capsys.readouterr().err
    assert "fitted under" not in err


def test_runs_that_mixed_engines_leave_mixed_prefill_at_the_run_default(tmp_path, capsys):
    prof = fitted_profile(tmp_path, mixed_prefill={"value": [False, True], "source": "each run's engine default"})
    assert main(["run", "--profile", prof, *RUN, "--out", str(tmp_path / "o")]) == 0
    assert engine_of(tmp_path / "o")["mixed_prefill"] is True
    assert "mixed-prefill" not in fit_lines(capsys.readouterr().err, "note")[0]


def test_frontier_base_config_is_the_fit_server(tmp_path, capsys):
    prof = fitted_profile(tmp_path)
    argv = ["frontier", "--profile", prof, "--policies", "none", "--concurrency-levels", "2", "--duration", "2",
            "--quiet", "--workers", "1", "--out", str(tmp_path / "f")]
    assert main(argv) == 0
    eng = json.loads((tmp_path / "f" / "config.json").read_text())["base_config"]["engine"]
    assert (eng["prefill_chunk_tokens"], eng["max_num_seqs"], eng["mixed_prefill"]) == (4096, 64, False)
    err = capsys.readouterr().err
    assert len(fit_lines(err, "note")) == 1 and not fit_lines(err, "caution")
    assert err.count("request_latency_s = 50.0 ms") == 1


def test_sweep_cells_take_the_fit_server_unless_the_spec_sets_it(tmp_path, capsys):
    from dsparksim.sweep.cells import build_config

    prof = fitted_profile(tmp_path)
    eng = build_config({"profile": prof, "policy": "none"}).engine
    assert (eng.prefill_chunk_tokens, eng.max_num_seqs, eng.mem_fraction_static, eng.mixed_prefill) == \
        (4096, 64, 0.8, False)
    eng = build_config({"profile": prof, "policy": "none", "prefill_chunk_tokens": 1024}).engine
    assert (eng.prefill_chunk_tokens, eng.max_num_seqs) == (1024, 64)
    assert build_config({"profile": BASE, "policy": "none"}).engine.prefill_chunk_tokens == 2048
    spec = tmp_path / "s.toml"
    spec.write_text(toml({"sweep": {"name": "s"}, "base": {"policy": "none", "duration_s": 2.0,
                                                            "prefill_chunk_tokens": 1024},
                          "axes": {"profile": [prof, BASE], "concurrency": [2]}}))
    assert main(["sweep", str(spec), "--out", str(tmp_path / "o"), "--quiet", "--backend", "serial"]) == 0
    err = capsys.readouterr().err
    (note,), (caution,) = fit_lines(err, "note"), fit_lines(err, "caution")
    assert "max_num_seqs = 64, mem_fraction_static = 0.8, mixed_prefill = false" in note
    assert "prefill_chunk_tokens = 1024 differs" in caution and "(prefill_chunk_tokens = 4096)" in caution
    assert err.count("request_latency_s = 50.0 ms") == 1


def plan_dict(prof: str, **base) -> dict:
    return {"plan": {"slo": ["tps_user_p50 >= 1"]}, "traffic": {"rate": 1.0, "duration_s": 2.0},
            "base": base, "prices": {"H100": 3.0},
            "candidates": [{"name": "a", "profile": prof, "replicas": [1, 2], "policies": ["none", "mtp1"]}]}


def test_plan_deployments_take_the_fit_server_and_record_it(tmp_path):
    from dsparksim.plan import plan_from_dict

    prof = fitted_profile(tmp_path)
    spec = plan_from_dict(plan_dict(prof))
    for d in spec.deployments:
        opts = spec.options(d, 1.0, 1, 0)
        assert (opts["prefill_chunk_tokens"], opts["max_num_seqs"], opts["mixed_prefill"]) == (4096, 64, False)
        assert d.to_dict()["options_from_profile_fit"]["prefill_chunk_tokens"] == 4096
    spec = plan_from_dict(plan_dict(prof, prefill_chunk_tokens=2048))
    assert {spec.options(d, 1.0, 1, 0)["prefill_chunk_tokens"] for d in spec.deployments} == {2048}
    assert any("prefill_chunk_tokens = 2048 differs" in ln for ln in spec.profile_lines())
    spec = plan_from_dict(plan_dict(BASE))
    assert spec.deployments[0].options.get("prefill_chunk_tokens") is None and not spec.profile_lines()


def test_plan_says_the_fitted_request_latency_and_server_once(tmp_path, capsys, monkeypatch):
    import dsparksim.plan as plan_pkg

    def stop(*a, **k):     # the notes come before any probe: stop there
        raise KeyboardInterrupt
    monkeypatch.setattr(plan_pkg, "run_plan", stop)
    spec = tmp_path / "p.toml"
    spec.write_text(toml(plan_dict(fitted_profile(tmp_path))))
    assert main(["plan", str(spec), "--out", str(tmp_path / "o")]) == 130
    err = capsys.readouterr().err
    assert err.count("request_latency_s = 50.0 ms") == 1 and "engine-side" in err   # two deployments, one line
    assert len(fit_lines(err, "note")) == 1


def test_fit_record_is_read_only_from_profile_fit_and_checked(tmp_path):
    from dsparksim.cost.fitted import fit_server, profile_fit_server

    assert profile_fit_server("cpu-tiny") == {}          # `measure`'s fit record: no benchmark server
    assert profile_fit_server(BASE) == {}
    assert profile_fit_server("fitted-h200x8-deepseek-r1-sglang-0.5.12") == {
        "prefill_chunk_tokens": 16384, "max_num_seqs": 512, "mem_fraction_static": 0.82, "mixed_prefill": False}
    meta = {"fit": {"command": "dsparksim profile fit", "client_model": {**FIT, "prefill_chunk_tokens": "4k"}}}
    with pytest.raises(ConfigError, match=r"metadata\.fit\.client_model\.prefill_chunk_tokens.*'4k'"):
        fit_server(meta, "x.json")
    with pytest.raises(ConfigError, match=r"metadata\.fit\.client_model\b"):
        fit_server({"fit": {"command": "dsparksim profile fit"}}, "x.json")
    with pytest.raises(ConfigError, match=r"client_model\.mixed_prefill"):
        fit_server({"fit": {"command": "dsparksim profile fit", "client_model": {**FIT, "mixed_prefill": "off"}}}, "x")
    # a fit older than the mixed-prefill and memory-fraction records (its engine always mixed; the profile's KV)
    old = {k: v for k, v in FIT.items() if k in ("prefill_chunk_tokens", "max_num_seqs")}
    assert fit_server({"fit": {"command": "dsparksim profile fit", "client_model": old}}, "x") == old


def replay_runs(tmp_path):
    """One SGLang run of BASE's deployment (H100, TP 1) as `bench import` writes it."""
    import csv
    import math

    from dsparksim.bench.runs import NAMES
    row = dict.fromkeys(NAMES)
    row.update(run_id="t.csv:1", source_format="sglang", source_file="t.csv", source_row=1, model="llama",
               gpu="h100", gpu_count=1, tp=1, ep=1, engine="sglang", engine_version="x", spec_method="none",
               dataset_name="random", random_input_len=256, random_output_len=16, random_range_ratio=1.0,
               random_range_convention="low", max_concurrency=2, request_rate=math.inf, num_prompts=4,
               num_warmup_prompts=0, ignore_eos=True)
    path = tmp_path / "runs.csv"
    with open(path, "w", newline="") as f:
        f.write("# dsparksim runs table v1 (README: Benchmark runs as input)\n")
        w = csv.writer(f)
        w.writerow(NAMES)
        w.writerow(["" if row[n] is None else "inf" if row[n] == math.inf else "true" if row[n] is True else row[n]
                    for n in NAMES])
    return str(path)


def test_bench_replay_defaults_to_the_server_the_profile_was_fitted_under(tmp_path, capsys):
    # replay defaulted its chunk to the profile's token budget (profile fit's own default), not the chunk the fit
    # was made at, and its other settings to the simulator's (1024 requests, the profile's KV, engine's mixing)
    prof = fitted_profile(tmp_path, mixed_prefill={"value": True, "source": "--mixed-prefill/--no-mixed-prefill"})
    runs = replay_runs(tmp_path)
    assert main(["bench", "replay", runs, "--profile", prof, "--out", str(tmp_path / "r")]) == 0
    cfg = json.loads((tmp_path / "r" / "config.json").read_text())
    assert (cfg["server"]["chunked_prefill_size"], cfg["server"]["max_running_requests"],
            cfg["server"]["mem_fraction_static"], cfg["mixed_prefill"]) == (4096, 64, 0.8, True)
    out = capsys.readouterr().out
    assert "(chunked prefill 4096 tokens, the fit's)" in out
    assert "--chunked-prefill-size 4096 --max-running-requests 64 --mem-fraction-static 0.8 --mixed-prefill" in out
    assert main(["bench", "replay", runs, "--profile", prof, "--chunked-prefill-size", "2048", "--no-mixed-prefill",
                 "--out", str(tmp_path / "s"), "--quiet"]) == 0
    cfg = json.loads((tmp_path / "s" / "config.json").read_text())
    assert (cfg["server"]["chunked_prefill_size"], cfg["server"]["max_running_requests"], cfg["mixed_prefill"]) \
        == (2048, 64, False)
    # a fit that took each run's engine default leaves replay's per-run default (SGLang: off) alone
    prof = fitted_profile(tmp_path)
    assert main(["bench", "replay", runs, "--profile", prof, "--out", str(tmp_path / "t"), "--quiet"]) == 0
    assert json.loads((tmp_path / "t" / "config.json").read_text())["mixed_prefill"].startswith("each run's")


def test_an_abbreviated_flag_set_to_the_run_default_still_wins(tmp_path, capsys):
    # argparse takes a unique prefix: `--prefill-ch 2048` is the user's chunk, though it equals the run's default
    prof = fitted_profile(tmp_path)
    assert main(["run", "--profile", prof, *RUN, "--prefill-ch", "2048", "--max-num-s=1024",
                 "--out", str(tmp_path / "o")]) == 0
    eng = engine_of(tmp_path / "o")
    assert (eng["prefill_chunk_tokens"], eng["max_num_seqs"]) == (2048, 1024)
    caution = fit_lines(capsys.readouterr().err, "caution")
    assert len(caution) == 1 and "--prefill-chunk 2048, --max-num-seqs 1024 differ" in caution[0]


def test_capacity_says_the_fitted_server_and_request_latency_once(tmp_path, capsys, monkeypatch):
    import dsparksim.sweep.capacity as capacity

    def stop(*a, **k):     # the notes come before any probe: stop there
        raise KeyboardInterrupt
    monkeypatch.setattr(capacity, "capacity_search", stop)
    spec = tmp_path / "c.toml"
    spec.write_text(toml({"sweep": {"name": "c"}, "base": {"profile": fitted_profile(tmp_path), "duration_s": 2.0},
                          "axes": {"policy": ["none", "mtp1"]},
                          "capacity": {"load": "concurrency", "min": 1, "max": 4, "slo": ["tps_user_median>=1"]}}))
    assert main(["capacity", str(spec), "--out", str(tmp_path / "o")]) == 130
    err = capsys.readouterr().err
    assert err.count("request_latency_s = 50.0 ms") == 1 and len(fit_lines(err, "note")) == 1


def test_profile_show_states_the_fitted_server_and_request_latency(tmp_path, capsys):
    # show printed the metadata's kv_capacity_tokens and nothing of the server the commands now simulate, nor the
    # request latency bench replay adds
    assert main(["profile", "show", fitted_profile(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "fitted server      --prefill-chunk 4096 --max-num-seqs 64 --mem-fraction-static 0.8 --no-mixed-prefill" \
        in out and "KV capacity at that fraction" in out
    assert "request latency    50.0 ms" in out
    assert main(["profile", "show", BASE]) == 0
    out = capsys.readouterr().out
    assert "fitted server" not in out and "request latency" not in out


def test_max_model_len_of_a_built_profile_follows_the_kv_capacity_the_run_uses():
    # the builder caps max_model_len at its KV capacity (min(max_position, KV) at its default memory fraction):
    # the B200x4 DeepSeek profile states 15729 for both, while the server it was fitted under (fraction 0.95)
    # holds 413012 tokens; runs there rejected every request over 15729 tokens as "max_model_len"
    from dsparksim.config import RunConfig
    from dsparksim.sim.inputs import resolve_inputs

    prof = "fitted-b200x4-deepseek-r1-sglang-0.5.12"
    fit = resolve_inputs(RunConfig.from_options({"profile": prof, "policy": "none", "mem_fraction_static": 0.95}))
    assert fit.kv_cap > 400_000 and fit.max_model_len == 163840            # min(max_position 163840, KV)
    small = resolve_inputs(RunConfig.from_options({"profile": prof, "policy": "none", "kv_capacity_tokens": 9000}))
    assert small.max_model_len == 9000
    as_built = resolve_inputs(RunConfig.from_options({"profile": prof, "policy": "none"}))
    assert (as_built.kv_cap, as_built.max_model_len) == (15729, 15729)
    # a profile that is not built keeps its stated max_model_len whatever the KV capacity
    other = resolve_inputs(RunConfig.from_options({"profile": "h100-llama2-7b-tp1", "policy": "none",
                                                   "kv_capacity_tokens": 9000}))
    assert other.max_model_len is None or other.max_model_len != 9000


def test_run_and_frontier_config_record_what_the_fit_filled_in(tmp_path, capsys):
    # run/frontier config.json recorded the values used but not that they came from the profile's fit (plan.json
    # and bench replay's config.json did)
    prof = fitted_profile(tmp_path)
    assert main(["run", "--profile", prof, *RUN, "--prefill-chunk", "2048", "--out", str(tmp_path / "o")]) == 0
    doc = json.loads((tmp_path / "o" / "config.json").read_text())
    assert doc["options_from_profile_fit"] == {"max_num_seqs": 64, "mem_fraction_static": 0.8,
                                               "mixed_prefill": False}      # the typed chunk is not the fit's
    assert main(["frontier", "--profile", prof, "--policies", "none", "--concurrency-levels", "2", "--duration",
                 "2", "--quiet", "--workers", "1", "--out", str(tmp_path / "f")]) == 0
    doc = json.loads((tmp_path / "f" / "config.json").read_text())
    assert doc["options_from_profile_fit"] == {"prefill_chunk_tokens": 4096, "max_num_seqs": 64,
                                               "mem_fraction_static": 0.8, "mixed_prefill": False}
    assert main(["run", "--profile", BASE, *RUN, "--out", str(tmp_path / "b")]) == 0   # no fit: no key at all
    assert "options_from_profile_fit" not in json.loads((tmp_path / "b" / "config.json").read_text())
    assert main(["frontier", "--profile", BASE, "--policies", "none", "--concurrency-levels", "2", "--duration",
                 "2", "--quiet", "--workers", "1", "--out", str(tmp_path / "g")]) == 0
    assert "options_from_profile_fit" not in json.loads((tmp_path / "g" / "config.json").read_text())


def ranged_profile(tmp_path) -> str:
    """fitted_profile with the runs record `profile fit` writes: concurrencies 2 and 4, one 128/64 workload."""
    p = fitted_profile(tmp_path)
    d = json.loads(open(p).read())
    d["metadata"]["fit"]["runs"] = {"concurrencies": [2, 4], "workloads": ["128/64"], "n_runs": 2}
    open(p, "w").write(json.dumps(d))
    return p


RANDOM = ["--dataset-name", "random", "--random-input-len", "128", "--random-output-len", "64",
          "--random-range-ratio", "0.8", "--duration", "3", "--quiet"]


def cautions(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith("dsparksim: caution: outside what profile")]


def test_fit_range_note_says_by_how_much_a_run_leaves_the_fitted_runs():
    from dsparksim.cost.fitted import FitRange
    from dsparksim.results.notes import fit_range_note
    fr = FitRange(concurrencies=(4, 64), input_lens=(1024, 8192), output_lens=(1024,))
    assert fit_range_note("p", fr, [5.0, 60.0], [900.0], [900.0], []) is None         # inside: silent
    assert fit_range_note("p", fr, [90.0], [9000.0], [700.0], []) is None              # within 1.5x: silent
    note = fit_range_note("p", fr, [2.0, 256.0], [16384.0], [100.0], ["mtp1"])
    assert "requests running per step on average up to 256 (4.0x the fit's largest concurrency, 64)" in note
    assert "down to 2.0 (0.50x the fit's smallest concurrency, 4)" in note
    assert "mean prompt length up to 16,384 (2.0x the fit's largest random_input_len, 8,192)" in note
    assert "mean output length down to 100.0 (0.10x the fit's smallest random_output_len, 1,024)" in note
    assert "mtp1 drafts and verifies several tokens" in note and "non-speculative" in note


def test_run_frontier_and_plan_caution_once_beyond_the_fitted_runs(tmp_path, capsys):
    # nothing said when a run on a fitted profile went outside the fit's concurrencies, lengths or speculation
    prof = ranged_profile(tmp_path)
    assert main(["run", "--profile", prof, "--policy", "none", "--concurrency", "3", *RANDOM,
                 "--out", str(tmp_path / "in")]) == 0
    assert not cautions(capsys.readouterr().err)
    assert main(["run", "--profile", prof, "--policy", "mtp1", "--concurrency", "16", *RANDOM,
                 "--out", str(tmp_path / "out")]) == 0
    (line,) = cautions(capsys.readouterr().err)
    assert "requests running per step on average up to 16 (4.0x the fit's largest concurrency, 4)" in line, line
    assert "mtp1 drafts and verifies" in line and "extrapolated" in line
    assert main(["run", "--profile", BASE, "--policy", "mtp1", "--concurrency", "16", *RANDOM,   # not fitted
                 "--out", str(tmp_path / "base")]) == 0
    assert "caution" not in capsys.readouterr().err
    assert main(["frontier", "--profile", prof, "--policies", "none,mtp1", "--concurrency-levels", "3,16", *RANDOM,
                 "--workers", "1", "--out", str(tmp_path / "f")]) == 0
    (line,) = cautions(capsys.readouterr().err)
    assert "up to 16 (4.0x" in line and "mtp1 drafts" in line and "none drafts" not in line
    d = plan_dict(prof)
    d["traffic"].update(dataset_name="random", random_input_len=128, random_output_len=64, random_range_ratio=0.8)
    p = tmp_path / "plan.toml"
    p.write_text(toml(d))
    assert main(["plan", str(p), "--out", str(tmp_path / "plan"), "--backend", "serial", "--quiet"]) == 0
    (line,) = cautions(capsys.readouterr().err)
    assert "mtp1 drafts and verifies" in line


@pytest.mark.parametrize("edit, field, shown", [
    ({"runs": {"concurrencies": 64, "workloads": ["128/64"]}}, r"runs\.concurrencies", "64"),        # was a traceback
    ({"runs": {"concurrencies": "2,4", "workloads": ["128/64"]}}, r"runs\.concurrencies", "'2,4'"),  # was no caution
    ({"runs": {"concurrencies": [2, True], "workloads": ["128/64"]}}, r"runs\.concurrencies", "True"),
    ({"runs": {"concurrencies": [2, 4], "workloads": "128/64"}}, r"runs\.workloads", "'128/64'"),
    ({"runs": {"concurrencies": [2, 4], "workloads": 5}}, r"runs\.workloads", "5"),
    ({"runs": {"concurrencies": [2, 4], "workloads": ["128x64"]}}, r"runs\.workloads", "128x64"),
    ({"runs": "all of them"}, r"metadata\.fit\.runs", "all of them"),
    ({"client_model": {**FIT, "prefill_chunk_tokens": 10 ** 7}}, r"prefill_chunk_tokens", "10000000.*budget 16384"),
])
def test_a_hand_edited_fit_record_is_refused_before_the_run_naming_file_and_field(tmp_path, capsys, edit, field,
                                                                                 shown):
    """A fit record of the wrong shape is an error naming the file and the field before anything is simulated: a
    runs.concurrencies of 64 crashed after the run (TypeError), a string one silently dropped the fit-range
    caution, and a prefill chunk above the token budget (which `profile fit` refuses) was simulated capped."""
    p = fitted_profile(tmp_path)
    d = json.loads(open(p).read())
    d["metadata"]["fit"].update(edit)
    open(p, "w").write(json.dumps(d))
    out = tmp_path / "r"
    assert main(["run", "--profile", p, *RUN, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and not out.exists()
    assert re.search(rf"error: {re.escape(p)}: field '[^']*{field}[^']*': .*{shown}", err), err


def test_a_fitted_chunk_above_a_set_token_budget_is_noted_as_a_typed_one(tmp_path, capsys):
    """The fit's prefill chunk (4096) above a --max-batched-tokens (2048) is capped to 2048 every step: run, sweep
    and plan noted it only for a chunk the user set (the fitted one was simulated capped without a word)."""
    from dsparksim.results.notes import spec_chunk_notes

    p = fitted_profile(tmp_path)
    assert main(["run", "--profile", p, *RUN, "--max-batched-tokens", "2048", "--out", str(tmp_path / "r")]) == 0
    err = capsys.readouterr().err
    assert err.count("the prefill chunk 4096 is above the token budget 2048") == 1, err
    assert engine_of(tmp_path / "r")["prefill_chunk_tokens"] == 4096
    notes = spec_chunk_notes([{"profile": p, "max_batched_tokens": 2048, "concurrency": c} for c in (2, 4)])
    assert len(notes) == 1 and f"profile {p}: the prefill chunk 4096 is above the token budget 2048" in notes[0]
    assert spec_chunk_notes([{"profile": p, "max_batched_tokens": 8192}]) == []       # within the budget: silent
    assert spec_chunk_notes([{"profile": BASE, "max_batched_tokens": 1024}]) == []    # no fit, no chunk set: silent


def test_an_axis_over_server_settings_gives_one_caution_per_fitted_profile(tmp_path):
    """A sweep with prefill_chunk_tokens x max_num_seqs axes on a fitted profile printed one caution per cell
    (12 lines for 4 x 3); plan likewise per candidate option combination."""
    from dsparksim.plan import plan_from_dict
    from dsparksim.sweep.cells import fit_lines as sweep_fit_lines

    prof = fitted_profile(tmp_path)
    lines = sweep_fit_lines({"profile": prof, "policy": "none"},
                            {"prefill_chunk_tokens": [1024, 2048, 4096], "max_num_seqs": [16, 64, 128]})
    cautions = [ln for ln in lines if ln.startswith("dsparksim: caution:")]
    assert len(cautions) == 1, lines
    assert ("prefill_chunk_tokens = 1024 / 2048, max_num_seqs = 16 / 128 differ from the server profile"
            in cautions[0]) and "(prefill_chunk_tokens = 4096, max_num_seqs = 64)" in cautions[0], cautions
    assert len([ln for ln in lines if ln.startswith("dsparksim: note:")]) == 1     # 0.8, false: in every cell
    d = plan_dict(prof)
    d["candidates"][0]["prefill_chunk_tokens"] = [1024, 2048]
    spec = plan_from_dict(d)
    plan_cautions = [ln for ln in spec.profile_lines() if ln.startswith("dsparksim: caution:")]
    assert len(plan_cautions) == 1 and "prefill_chunk_tokens = 1024 / 2048 differs" in plan_cautions[0], plan_cautions


@pytest.mark.parametrize("fit", ["dsparksim profile fit", None, 5, ["dsparksim profile fit"]])
def test_a_fit_record_that_is_not_an_object_is_refused_naming_file_and_field(tmp_path, capsys, fit):
    """``metadata.fit`` a string (or any non-object) read as "not fitted": the run went on with the run's defaults
    without a word, where every writer of the field (profile fit, measure, refit) writes an object."""
    from dsparksim.cost.fitted import fit_range, fit_server

    p = fitted_profile(tmp_path)
    d = json.loads(open(p).read())
    d["metadata"]["fit"] = fit
    open(p, "w").write(json.dumps(d))
    out = tmp_path / "r"
    assert main(["run", "--profile", p, *RUN, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and not out.exists()
    assert re.search(rf"error: {re.escape(p)}: field 'metadata\.fit': expected an object.*got {re.escape(repr(fit))}",
                     err), err
    with pytest.raises(ConfigError, match=r"metadata\.fit'"):
        fit_server({"fit": fit}, "x.json")
    with pytest.raises(ConfigError, match=r"metadata\.fit'"):
        fit_range(p)
    assert fit_server({}, "x.json") == {}          # no fit record at all: not fitted
