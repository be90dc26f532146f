"""Issue 31 items 10, 12, 13: plan traffic, --seeds, SLO terms and option messages -- refused with exit 2 and one
line naming where the bad value came from, before any cell runs. (The regress baseline checks of items 8 and 10
are in the format-3 rewrite of dsparksim.sweep.regress, tests/test_regress*.py.)"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsparksim.cli.main import main

REPO = Path(__file__).resolve().parents[1]


def _one_error(capsys) -> str:
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("dsparksim: error: "), err
    return err[0]


# ------------------------------------------------------------------ item 10: --seeds has a bound; plan's traffic
@pytest.mark.parametrize("argv", [
    ["frontier", "--policies", "none", "--concurrency-levels", "1", "--seeds", "1001"],
    ["frontier", "--policies", "none", "--concurrency-levels", "1", "--seeds", "1000000000"],
    ["capacity", str(REPO / "sweeps" / "capacity.toml"), "--seeds", "5000"],
])
def test_seeds_option_is_bounded(tmp_path, capsys, argv):
    with pytest.raises(SystemExit) as e:
        main([*argv, "--out", str(tmp_path / "o")])
    assert e.value.code == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and "error: argument --seeds" in err[0] and "at most 1000" in err[0], err
    assert not (tmp_path / "o").exists()


def _plan(tmp_path: Path, old: str, new: str) -> Path:
    text = (REPO / "sweeps" / "plan-example.toml").read_text()
    assert old in text
    p = tmp_path / "plan.toml"
    p.write_text(text.replace(old, new))
    return p


@pytest.fixture
def no_probes(monkeypatch):
    import dsparksim.plan as plan
    monkeypatch.setattr(plan, "run_plan", lambda *a, **k: (_ for _ in ()).throw(AssertionError("probes ran")))


@pytest.mark.parametrize("old,new,field,words", [
    ("rate = 12.0 ", "rate = 1e8 ", "traffic.rate", "expected arrivals"),
    ("scales = [1.0, 2.0]", "scales = [1.0, 2e6]", "traffic.rate", "expected arrivals"),
    ("seeds = [0]", "seeds = []", "plan.seeds", "1..1000"),
    ("seeds = [0]", f"seeds = {list(range(1001))}", "plan.seeds", "1..1000"),
])
def test_plan_refuses_impossible_traffic_and_seeds_before_any_probe(tmp_path, capsys, no_probes, old, new, field,
                                                                    words):
    spec = _plan(tmp_path, old, new)
    assert main(["plan", str(spec), "--out", str(tmp_path / "o")]) == 2
    line = _one_error(capsys)
    assert str(spec) in line and f"'{field}'" in line and words in line, line
    assert not (tmp_path / "o").exists()


# ------------------------------------------------------------------ item 12: one SLO vocabulary; where it came from
def _cap_spec(tmp_path: Path, slo: str = '["tps_user_median >= 100", "ttft_p99_s <= 2.0"]', extra: str = "") -> Path:
    text = (REPO / "sweeps" / "capacity.toml").read_text()
    old = 'slo = ["tps_user_median >= 100", "ttft_p99_s <= 2.0"]'
    assert old in text
    p = tmp_path / "cap.toml"
    p.write_text(text.replace(old, f"slo = {slo}\n{extra}"))
    return p


@pytest.fixture
def no_search(monkeypatch):
    import dsparksim.sweep.capacity as cap
    monkeypatch.setattr(cap, "capacity_search", lambda *a, **k: (_ for _ in ()).throw(AssertionError("probes ran")))


@pytest.mark.parametrize("term,canonical", [("tps_user_p50>=100", "tps_user_median"), ("ttft_p50_s<=1", "ttft_median_s"),
                                            ("tpot_p50_s <= 0.05", "tpot_median_s"), ("e2e_p99_s<=9", "e2e_p99_s")])
def test_capacity_takes_the_plan_vocabulary(tmp_path, term, canonical):
    from dsparksim.plan.spec import parse_slo_terms
    from dsparksim.sweep import load_spec
    from dsparksim.sweep.capacity import capacity_settings

    st = capacity_settings(load_spec(_cap_spec(tmp_path)), slo=[term])
    assert [c.metric for c in st.slo] == [canonical]
    assert [t.metric for t in parse_slo_terms("p.toml", [term])] == [canonical]


def _all_metric_spellings():
    from dsparksim.sweep.capacity import METRIC_ALIASES, SLO_METRICS
    return list(SLO_METRICS) + list(METRIC_ALIASES)


@pytest.mark.parametrize("name", ["ttft_p95_s", "tps_user_p51", "foo", "saturated", "policy"])
def test_capacity_and_plan_refuse_the_same_unknown_metrics(tmp_path, name):
    from dsparksim.errors import ConfigError
    from dsparksim.plan.spec import parse_slo_terms
    from dsparksim.sweep import load_spec
    from dsparksim.sweep.capacity import capacity_settings

    with pytest.raises(ConfigError):
        capacity_settings(load_spec(_cap_spec(tmp_path)), slo=[f"{name} >= 1"])
    with pytest.raises(ConfigError):
        parse_slo_terms("p.toml", [f"{name} >= 1"])


def test_every_slo_spelling_is_a_summary_metric_and_accepted_by_both(tmp_path):
    from dsparksim.plan.spec import parse_slo_terms
    from dsparksim.results.metrics import SUMMARY_FIELDS
    from dsparksim.sweep import load_spec
    from dsparksim.sweep.capacity import capacity_settings

    names = _all_metric_spellings()
    terms = [f"{n} >= 1" for n in names]
    a = [c.metric for c in capacity_settings(load_spec(_cap_spec(tmp_path)), slo=terms).slo]
    b = [t.metric for t in parse_slo_terms("p.toml", terms)]
    assert a == b
    summary_keys = set(SUMMARY_FIELDS) | {"num_requests_completed_total", "num_requests_issued", "num_steps",
                                          "kv_peak_used_tokens"}
    assert set(a) <= summary_keys, set(a) - summary_keys


@pytest.mark.parametrize("argv,flag", [
    (["--slo", "tps_user_p5>=100"], "--slo"),
    (["--slo", "tps_user_median>>100"], "--slo"),
    (["--max", "0.5"], "--max"),                 # below the file's min = 1
    (["--tolerance", "0.5"], "--tolerance"),     # concurrency is an integer
    (["--min", "200"], "--min"),                 # above the file's max = 128
])
def test_capacity_blames_the_command_line_for_a_bad_command_line_value(tmp_path, capsys, no_search, argv, flag):
    spec = _cap_spec(tmp_path)
    assert main(["capacity", str(spec), *argv, "--out", str(tmp_path / "o")]) == 2
    line = _one_error(capsys)
    assert line.startswith("dsparksim: error: command line: ") and f"'{flag}'" in line, line
    assert str(spec) not in line.split(":", 3)[2], line


@pytest.mark.parametrize("slo,field", [('["tps_user_p5 >= 100"]', "capacity.slo[0]"),
                                       ('["tps_user_median >= 100", "x <= 2"]', "capacity.slo[1]")])
def test_capacity_blames_the_file_for_a_bad_file_value(tmp_path, capsys, no_search, slo, field):
    spec = _cap_spec(tmp_path, slo)
    assert main(["capacity", str(spec), "--out", str(tmp_path / "o")]) == 2
    line = _one_error(capsys)
    assert line.startswith(f"dsparksim: error: {spec}: field '{field}'"), line
    assert "--slo" not in line


# ------------------------------------------------------------------ item 13: the four messages
@pytest.mark.parametrize("dtype,suggests_fp8", [(None, False), ("fp8", False), ("bf16", True)])
def test_profile_build_suggests_fp8_only_when_the_weights_are_not_fp8(tmp_path, capsys, dtype, suggests_fp8):
    argv = ["profile", "build", "--model", "deepseek-v3", "--gpu", "H100", "--out", str(tmp_path / "p.json")]
    assert main(argv + (["--dtype", dtype] if dtype else [])) == 2     # 671B on one GPU fits in no dtype
    line = _one_error(capsys)
    assert ("--dtype fp8" in line) == suggests_fp8, line
    assert "more GPUs" in line


RUN = ["run", "--duration", "1", "--concurrency", "2", "--quiet", "--kv-policy", "reserve"]


@pytest.mark.parametrize("extra,named,not_named", [
    (["--kv-page-tokens", "32"], "--kv-page-tokens", "--kv-watermark"),
    (["--kv-page-tokens", "16"], "--kv-page-tokens", "--kv-watermark"),    # the default value, given: refused alike
    (["--kv-watermark", "0.01"], "--kv-watermark", "--kv-page-tokens"),
    (["--kv-watermark", "0.2"], "--kv-watermark", "--kv-page-tokens"),
])
def test_run_reserve_refuses_each_paged_option_given_naming_only_it(tmp_path, capsys, extra, named, not_named):
    assert main([*RUN, *extra, "--out", str(tmp_path / "o")]) == 2
    line = _one_error(capsys)
    assert named in line and not_named not in line, line


@pytest.mark.parametrize("base,named,not_named", [("kv_page_tokens = 32", "kv_page_tokens", "kv_watermark"),
                                                  ("kv_page_tokens = 16", "kv_page_tokens", "kv_watermark"),
                                                  ("kv_watermark = 0.05", "kv_watermark", "kv_page_tokens")])
def test_reserve_vs_paged_sweep_names_only_the_key_it_set(tmp_path, capsys, base, named, not_named):
    spec = tmp_path / "kv.toml"
    spec.write_text('[sweep]\nname = "kv"\n[base]\nprofile = "h100-llama2-7b-tp1"\nduration_s = 1.0\n'
                    f'concurrency = 2\n{base}\n[axes]\nkv_policy = ["reserve", "paged"]\n')
    assert main(["sweep", str(spec), "--out", str(tmp_path / "o"), "--backend", "serial", "--quiet"]) == 2
    line = _one_error(capsys)
    assert named in line and not_named not in line and str(spec) in line, line
    assert line.count(str(spec)) == 1, line                                # said once, not nested twice


def test_dp_ranks_warning_has_the_warning_prefix(tmp_path, capsys):
    import dsparksim.sim.inputs as inputs
    inputs._DP_WARNED.clear()
    rc = main(["run", "--profile", "built-h200x8-deepseek-v3-dp8ep8", "--duration", "0.5", "--concurrency", "1",
               "--quiet", "--out", str(tmp_path / "o")])
    err = [ln for ln in capsys.readouterr().err.splitlines() if "data-parallel" in ln]
    assert rc == 0 and len(err) == 1, err
    assert err[0].startswith("dsparksim: warning: profile 'built-h200x8-deepseek-v3-dp8ep8'"), err
