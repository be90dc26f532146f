"""One definition per run option (issue 10, item 6): the config fields' metadata generates the CLI's shared run
options and the sweep keys; RunConfig.from_options builds runs for both; input resolution and acceptance spec
parsing happen in one place each; the replica/router/DP fields are defined, validated and exposed."""
from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dsparksim.cli.main import build_parser, main, run_config
from dsparksim.config import EngineConfig, RunConfig, run_options
from dsparksim.errors import ConfigError
from dsparksim.sweep import spec_from_dict
from dsparksim.sweep.cells import build_config, expand, input_hashes
from dsparksim.sweep.spec import KEY_ALIASES, KEYS, TYPES, canonical_key

REPO = Path(__file__).resolve().parents[1]
DATA = Path(__file__).parent / "data"


def _run_parser():
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return sub.choices["run"]


# ------------------------------------------------------------------------------------ one definition, two uses
def test_sweeps_never_import_the_cli():
    code = ("import sys\n"
            "from dsparksim.sweep import spec_from_dict\n"
            "from dsparksim.sweep.cells import build_config, expand\n"
            "build_config({'policy': 'mtp1', 'concurrency': 4, 'duration_s': 2.0})\n"
            "expand(spec_from_dict({'base': {'duration_s': 2.0}, 'axes': {'rate': [1.0, 2.0]}}))\n"
            "bad = sorted(m for m in sys.modules if m == 'dsparksim.cli.main' or m.startswith('dsparksim.cli_'))\n"
            "print(bad)\n"
            "sys.exit(1 if bad else 0)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_flagged_option_is_a_run_flag_with_its_key_as_dest_and_its_default():
    p = _run_parser()
    by_dest = {a.dest: a for a in p._actions}
    defaults = vars(build_parser().parse_args(["run"]))
    for key, spec in run_options().items():
        if not spec.option.flags:
            continue
        act = by_dest[key]
        assert set(spec.option.flags) <= set(act.option_strings), key
        assert defaults[key] == spec.default, key


def test_every_option_is_a_sweep_key_and_every_flag_spelling_an_alias():
    opts = run_options()
    assert set(KEYS) == set(opts) and len(KEYS) == len(opts)
    for key, spec in opts.items():
        assert TYPES[key] == spec.option.kinds
        for flag in spec.option.flags:
            assert canonical_key(flag) == key, flag
    assert {canonical_key(a) for a in KEY_ALIASES} <= set(KEYS)


def test_cli_and_sweep_build_the_same_run_for_the_same_options():
    cases = [
        (["--rate", "3", "--arrival", "constant", "--num-requests", "40", "--replicas", "2"],
         {"rate": 3.0, "arrival": "constant", "num_requests": 40, "replicas": 2}),
        (["--concurrency", "5", "--duration", "9", "--warmup", "1", "-K", "4", "--router", "least-kv",
          "--dp-ranks", "4", "--kv-capacity", "50000", "--extrapolate"],
         {"concurrency": 5, "duration_s": 9.0, "warmup_s": 1.0, "block_size": 4, "router": "least-kv",
          "dp_ranks": 4, "kv_capacity_tokens": 50000, "extrapolate": True}),
        (["--rate", "2", "--burstiness", "0.5", "--duration", "5", "--seed", "3"],
         {"rate": 2.0, "burstiness": 0.5, "duration_s": 5.0, "seed": 3}),
        (["--concurrency", "4", "--no-mixed-prefill"], {"concurrency": 4, "mixed_prefill": False}),
        (["--concurrency", "4", "--mixed-prefill"], {"concurrency": 4, "mixed_prefill": True}),
    ]
    for argv, keys in cases:
        cli = run_config(build_parser().parse_args(["run", *argv]))
        assert cli == build_config(keys) == RunConfig.from_options(keys), argv
    cfg = RunConfig.from_options({"rate": 2.0, "burstiness": 0.5, "duration_s": 5.0})
    assert cfg.traffic.mode == "gamma" and cfg.traffic.burstiness == 0.5


def test_from_options_defaults_match_dsparksim_run():
    cfg = RunConfig.from_options({})
    assert cfg == run_config(build_parser().parse_args(["run"]))
    assert cfg.traffic.mode == "closed" and cfg.traffic.concurrency == 32 and cfg.traffic.duration_s == 60.0
    assert cfg.traffic.domain == "mix:math=1,code=1,chat=1"


def test_from_options_errors_name_the_source_and_option():
    with pytest.raises(ConfigError, match=r"my spec: field 'concurency': unknown option"):
        RunConfig.from_options({"concurency": 3}, "my spec")
    with pytest.raises(ConfigError, match=r"command line: field '--burstiness': only applies to gamma arrivals"):
        RunConfig.from_options({"rate": 2.0, "arrival": "poisson", "burstiness": 2.0}, "cli", flags=True)
    with pytest.raises(ConfigError, match=r"s: field 'arrival': applies to open-loop arrivals only"):
        RunConfig.from_options({"concurrency": 2, "arrival": "gamma"}, "s")


def test_a_sweep_naming_both_stop_rules_is_an_error_not_a_dropped_duration():
    # Old code: duration_s was silently dropped whenever num_requests was also given.
    with pytest.raises(ConfigError, match=r"field 'duration_s'.*conflicts with num_requests"):
        spec_from_dict({"base": {"num_requests": 10, "duration_s": 30.0}})


@pytest.mark.parametrize("dur", [1e308, 1.0000001e7])
def test_an_absurd_duration_is_refused_with_its_bound_before_anything_runs(tmp_path, capsys, dur):
    """duration_s = 1e308 in a sweep spec (or --duration 1e308) was taken, and a closed-loop run, which no arrival
    count bounds, ran without end; inf and nan were already refused. The bound is stated, never a clip."""
    from dsparksim.plan import plan_from_dict
    from dsparksim.traffic.config import DURATION_MAX_S, TrafficConfig

    bound = r"expected at most 1e\+07 simulated seconds.*float64"
    out = tmp_path / "r"
    assert main(["run", "--policy", "none", "--concurrency", "2", "--duration", repr(dur), "--quiet",
                 "--out", str(out)]) == 2
    assert re.search(rf"command line: field '--duration': {bound}.*got {re.escape(repr(dur))}", capsys.readouterr().err)
    assert not out.exists()
    with pytest.raises(ConfigError, match=rf"s\.toml: field 'duration_s': .*{bound}"):
        spec_from_dict({"base": {"duration_s": dur}, "axes": {"concurrency": [1, 2]}}, "s.toml")
    with pytest.raises(ConfigError, match=rf"s\.toml: field 'duration_s': .*{bound}"):
        spec_from_dict({"base": {"duration_s": dur}, "axes": {"policy": ["none"]},
                        "capacity": {"load": "concurrency", "min": 1, "max": 4, "slo": ["tps_user_median>=1"]}},
                       "s.toml")
    with pytest.raises(ConfigError, match=bound):
        plan_from_dict({"plan": {"slo": ["tps_user_p50 >= 1"]}, "traffic": {"rate": 1e-6, "duration_s": dur},
                        "prices": {"H100": 3.0}, "candidates": [{"profile": "h100-llama2-7b-tp1", "replicas": [1, 2],
                                                                  "policies": ["none"]}]}, "p.toml")
    assert TrafficConfig(mode="closed", concurrency=1, duration_s=DURATION_MAX_S).duration_s == DURATION_MAX_S
    for bad in (math.inf, math.nan):
        with pytest.raises(ConfigError, match="expected a finite number > 0"):
            spec_from_dict({"base": {"duration_s": bad}, "axes": {"concurrency": [1]}}, "s.toml")


def test_a_sweep_trace_under_a_rate_load_is_an_error_not_ignored(tmp_path):
    # Old code: the rate branch built Poisson traffic and silently ignored the trace.
    with pytest.raises(ConfigError, match=r"field 'trace'.*time_scale load axis"):
        spec_from_dict({"base": {"trace": str(DATA / "traffic_azure_small.csv"), "duration_s": 5.0},
                        "axes": {"rate": [1.0, 2.0]}})


# ----------------------------------------------------------------------------- replicas, router, data parallel
def test_new_engine_fields_default_and_land_in_config_json():
    e = RunConfig().to_dict()["engine"]
    assert (e["replicas"], e["router"], e["dp_ranks"]) == (1, "round-robin", 1)
    from dsparksim.sim.routers import ROUTER_NAMES

    assert tuple(_run_parser()._option_string_actions["--router"].choices) == ROUTER_NAMES


@pytest.mark.parametrize("kw, field, bad", [
    ({"replicas": 0}, "replicas", "0"), ({"replicas": True}, "replicas", "True"), ({"dp_ranks": 0}, "dp_ranks", "0"),
    ({"dp_ranks": 2.5}, "dp_ranks", "2.5"), ({"router": "fastest"}, "router", "'fastest'"),
])
def test_engine_config_validates_the_new_fields(kw, field, bad):
    with pytest.raises(ConfigError) as ei:
        EngineConfig(**kw)
    assert f"field '{field}'" in str(ei.value) and bad in str(ei.value)


@pytest.mark.parametrize("argv, words", [
    (["--replicas", "0"], ["--replicas", "'0'"]), (["--dp-ranks", "-1"], ["--dp-ranks", "'-1'"]),
    (["--router", "fastest"], ["--router", "'fastest'"]), (["--replicas", "two"], ["--replicas", "'two'"]),
])
def test_cli_rejects_bad_replica_options_in_one_line(tmp_path, capsys, argv, words):
    try:
        rc = main(["run", *argv, "--out", str(tmp_path / "o")])
    except SystemExit as e:
        rc = e.code
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and all(w in err for w in words), err


def test_replicas_router_dp_ranks_are_sweep_axes():
    d = {"base": {"duration_s": 2.0, "dp-ranks": 2}, "axes": {"replicas": [1, 4], "router": ["round-robin", "session"]}}
    with pytest.raises(ConfigError, match=r"axes.router\[1\].*session or prefix ids"):
        spec_from_dict(d)             # checked before any cell: no trace carries the ids the session router needs
    cells = expand(spec_from_dict(d, check_inputs=False))
    got = [(c.config.engine.replicas, c.config.engine.router, c.config.engine.dp_ranks) for c in cells]
    assert got == [(1, "round-robin", 2), (1, "session", 2), (4, "round-robin", 2), (4, "session", 2)]
    assert len({c.hash for c in cells}) == 4
    with pytest.raises(ConfigError, match=r"field 'router'.*'fastest'"):
        spec_from_dict({"base": {"duration_s": 2.0, "router": "fastest"}})
    with pytest.raises(ConfigError, match=r"base.replicas.*expected int"):
        spec_from_dict({"base": {"duration_s": 2.0, "replicas": 1.5}})


# ------------------------------------------------------------------------------------- acceptance spec registry
@pytest.mark.parametrize("spec, kind, name, arg, params", [
    ("dspark", "parametric", "dspark", "", {}),
    (" mtp1?sigma_req=0.1 ", "parametric", "mtp1", "", {"sigma_req": "0.1"}),
    ("tau:3.2?drafter=eagle3", "tau", "tau", "3.2", {"drafter": "eagle3"}),
    ("vllm:logs/run.csv", "vllm", "vllm", "logs/run.csv", {}),
    ("sglang:x.jsonl?draft_len=4", "sglang", "sglang", "x.jsonl", {"draft_len": "4"}),
    ("traces/sample_dspark_k7.csv", "trace", "trace", "traces/sample_dspark_k7.csv", {}),
])
def test_parse_spec(spec, kind, name, arg, params):
    from dsparksim.acceptance import parse_spec

    ps = parse_spec(spec)
    assert (ps.kind, ps.name, ps.arg, dict(ps.params)) == (kind, name, arg, params)


@pytest.mark.parametrize("spec, words", [("", "non-empty"), ("dspark-chat", "unknown acceptance source"),
                                         ("dspark?x", "name=value"), ("vllm:", "unknown acceptance source")])
def test_parse_spec_errors(spec, words):
    from dsparksim.acceptance import parse_spec

    with pytest.raises(ConfigError, match=words):
        parse_spec(spec)


def test_engine_log_named_csv_is_a_log_everywhere(tmp_path):
    from dsparksim.acceptance import drafter_of

    log = tmp_path / "run.csv"  # a vLLM log that happens to be named .csv
    shutil.copy(DATA / "acc_vllm_responses.json", log)
    # Old code: drafter_of and the cell hash took it for an acceptance trace (and the hash for a missing file).
    assert drafter_of(f"vllm:{log}") == "dspark" and drafter_of(f"vllm:{log}?drafter=eagle3") == "eagle3"
    cfg = RunConfig.from_options({"acceptance": f"vllm:{log}", "duration_s": 2.0})
    h1 = input_hashes(cfg)["acceptance"]
    assert h1 is not None
    log.write_text(log.read_text() + "\n")
    assert input_hashes(cfg)["acceptance"] != h1  # an edited log never serves a stale cached cell


# -------------------------------------------------------------------------------------------- input resolution
def test_resolve_inputs_matches_the_run_and_loads_each_input_once(monkeypatch):
    import dsparksim.acceptance as acc_mod
    from dsparksim.sim.inputs import resolve_inputs

    base = RunConfig.from_options({"duration_s": 2.0, "acceptance": "dflash", "mtp1_acceptance": "tau:1.5?drafter=mtp1"})
    mtp1 = resolve_inputs(base.replace(policy="mtp1"))
    assert (mtp1.K, mtp1.drafter, mtp1.acceptance_spec) == (1, "mtp1", "tau:1.5?drafter=mtp1")
    conf = resolve_inputs(base)
    assert (conf.K, conf.drafter, conf.acceptance_spec) == (7, "dflash", "dflash")
    assert conf.kv_cap == conf.profile.metadata["kv_capacity_tokens"] and conf.max_tokens == conf.profile.max_tokens

    calls = []
    real = acc_mod.load_acceptance
    monkeypatch.setattr(acc_mod, "load_acceptance", lambda s, K, **kw: calls.append((s, K)) or real(s, K, **kw))
    cache: dict = {}
    for pol in ("confidence", "fixed:7", "goodput", "mtp1"):
        resolve_inputs(base.replace(policy=pol), cache=cache)
    assert sorted(calls) == [("dflash", 7), ("tau:1.5?drafter=mtp1", 1)]


def test_missing_drafter_names_the_policy(tmp_path):
    from dsparksim.sim.inputs import resolve_inputs

    cfg = RunConfig.from_options({"profile": "cpu-tiny", "acceptance": "eagle3", "policy": "fixed:3",
                                  "duration_s": 2.0})
    with pytest.raises(ConfigError, match=r"no drafting cost for drafter 'eagle3' \(policy fixed:3"):
        resolve_inputs(cfg)


def test_run_writes_new_fields_to_config_json(tmp_path):
    out = tmp_path / "o"
    assert main(["run", "--policy", "mtp1", "--num-requests", "3", "--quiet", "--out", str(out)]) == 0
    e = json.loads((out / "config.json").read_text())["config"]["engine"]
    assert (e["replicas"], e["router"], e["dp_ranks"]) == (1, "round-robin", 1)
