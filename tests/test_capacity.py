"""Capacity search: bisection agrees with a dense scan; SLO parsing and settings errors; CLI output."""
from __future__ import annotations

import json

import pytest

from dsparksim.cli.main import main
from dsparksim.errors import ConfigError
from dsparksim.sweep import load_spec, run_sweep, spec_from_dict
from dsparksim.sweep.capacity import (CapacitySettings, _Search, capacity_search, capacity_settings, capacity_table,
                                      check_slo, parse_slo)

BASE = {"duration_s": 4.0, "seed": 3}
SLO = ["tps_user_median >= 190", "ttft_p99_s <= 1.0"]


def test_bisection_matches_a_dense_scan(tmp_path):
    spec = spec_from_dict({"base": BASE, "axes": {"policy": ["mtp1", "confidence"]}})
    st = capacity_settings(spec, load="concurrency", min=1, max=32, slo=SLO)
    res = capacity_search(spec, st, tmp_path / "cap", backend="local", workers=2, progress=False)
    dense = run_sweep(spec.with_axes(concurrency=list(range(1, 33))), tmp_path / "dense", backend="local",
                      workers=2, progress=False).table
    slo = parse_slo(SLO)
    for r in res["results"]:
        pol = r["group"]["policy"]
        rows = dense[dense["cfg.policy"] == pol].sort_values("cfg.concurrency")
        ok = [check_slo(s, slo)[0] for s in rows.to_dict("records")]
        # expected: the end of the feasible prefix; the case is chosen so feasibility is monotone (else bisection
        # has no single answer) -- checked here so a change in the simulator shows up as such.
        n_prefix = next((i for i, x in enumerate(ok) if not x), len(ok))
        assert not any(ok[n_prefix:]), f"{pol}: feasibility not monotone in this case: {ok}"
        assert 1 <= n_prefix < 32, f"{pol}: boundary must lie inside the range for a meaningful test"
        assert r["status"] == "ok" and r["capacity"] == n_prefix, (pol, r["capacity"], n_prefix)
        assert r["bracket"] == [n_prefix, n_prefix + 1]
        # the trace records every probe with its verdict, and bisection needs far fewer runs than the scan
        assert all(t["feasible"] == ok[t["load"] - 1] for t in r["trace"])
        assert r["n_probes"] <= 2 + 5
    caps = {r["group"]["policy"]: r["capacity"] for r in res["results"]}
    assert caps["confidence"] > caps["mtp1"]
    assert res["settings"]["slo"] == ["tps_user_median >= 190", "ttft_p99_s <= 1"]


def _drive(st: CapacitySettings, feasible) -> _Search:
    s = _Search({}, st, st.lo, st.hi)
    while probes := s.probes():
        for x in probes:
            s.feed(x, feasible(x))
    return s


@pytest.mark.parametrize("boundary", [1.0, 3.3, 7.77, 9.999])
def test_search_on_a_continuous_rate_brackets_the_boundary(boundary):
    st = CapacitySettings("rate", 1.0, 10.0, 0.01, ())
    s = _drive(st, lambda x: x <= boundary)
    assert s.status == "ok" and s.lo <= boundary < s.hi and s.hi - s.lo <= 0.01


def test_search_reports_both_ends_outside_the_range():
    st = CapacitySettings("concurrency", 1, 64, 1, ())
    assert _drive(st, lambda x: False).status == "infeasible_at_min"
    assert _drive(st, lambda x: False).capacity is None
    s = _drive(st, lambda x: True)
    assert (s.status, s.capacity) == ("feasible_at_max", 64)


@pytest.mark.parametrize("terms, words", [
    (["tps_user_median => 5"], "expected 'METRIC OP NUMBER'.*operator '=>'"),
    (["ttft <= x"], "expected 'METRIC OP NUMBER'"),
    ([], "non-empty list"),
])
def test_bad_slo_terms_are_config_errors(terms, words):
    with pytest.raises(ConfigError, match=words):
        parse_slo(terms)


def test_slo_unknown_metric_and_saturation():
    with pytest.raises(ConfigError, match="unknown metric 'tps'"):
        check_slo({"tps_user_median": 5.0}, parse_slo(["tps >= 1"]))
    s = {"tps_user_median": 50.0, "saturated": True}
    assert check_slo(s, parse_slo(["tps_user_median >= 10"])) == (False, ["saturated"])
    assert check_slo(s, parse_slo(["tps_user_median >= 10"]), require_unsaturated=False) == (True, [])
    assert check_slo({"tps_user_median": None}, parse_slo(["tps_user_median >= 10"]))[0] is False


def test_settings_reject_the_load_as_an_axis_and_bad_bounds():
    spec = spec_from_dict({"base": BASE, "axes": {"concurrency": [1, 2]}})
    with pytest.raises(ConfigError, match="axes.concurrency"):
        capacity_settings(spec, min=1, max=8, slo=SLO)
    spec = spec_from_dict({"base": BASE})
    with pytest.raises(ConfigError, match="'--max': must exceed min"):   # keyword values are the CLI's flags
        capacity_settings(spec, min=8, max=4, slo=SLO)
    with pytest.raises(ConfigError, match="capacity.min"):
        capacity_settings(spec, max=4, slo=SLO)


def test_settings_reject_a_fixed_value_of_the_searched_load():
    """[base] concurrency = 2 beside a search over concurrency: every probe set its own load and the 2 was dropped
    silently; now refused naming the field and the value (rate or time_scale likewise)."""
    for load, v in (("concurrency", 2), ("rate", 3.0)):
        spec = spec_from_dict({"base": {**BASE, load: v}}, source="s.toml")
        with pytest.raises(ConfigError, match=rf"s.toml.*base.{load}.*its value {v!r} would be ignored; remove it "
                                              rf"\(capacity.load = '{load}' names the load\)"):
            capacity_settings(spec, min=1, max=8, slo=SLO)
        with pytest.raises(ConfigError, match=rf"base.{load}.*would be ignored; remove it$"):
            capacity_settings(spec, load=load, min=1, max=8, slo=SLO)


def test_cli_capacity_writes_slo_and_trace(tmp_path, capsys):
    p = tmp_path / "cap.toml"
    p.write_text('[base]\nduration_s = 4.0\nseed = 3\n[axes]\npolicy = ["mtp1"]\n'
                 '[capacity]\nload = "concurrency"\nmin = 1\nmax = 16\nslo = ["tps_user_median >= 190"]\n')
    rc = main(["capacity", str(p), "--out", str(tmp_path / "o"), "--backend", "serial"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "tps_user_median >= 190" in out and "capacity" in out
    d = json.loads((tmp_path / "o" / "capacity.json").read_text())
    r = d["results"][0]
    assert d["settings"]["slo"] == ["tps_user_median >= 190"] and r["capacity"] == 6 and len(r["trace"]) >= 3
    # flags override the spec's [capacity] table
    assert main(["capacity", str(p), "--out", str(tmp_path / "o"), "--backend", "serial", "--quiet",
                 "--slo", "tps_user_median>=1000"]) == 0
    d = json.loads((tmp_path / "o" / "capacity.json").read_text())
    assert d["results"][0]["status"] == "infeasible_at_min"



def test_cli_capacity_names_a_failed_probe_and_marks_the_set_incomplete(tmp_path, capsys):
    """A probe that cannot run (here a load far past saturation) stops its search: the error is printed (with --quiet
    too), the exit status is 1 and capacity.manifest.json says the set is not complete."""
    p = tmp_path / "cap.toml"
    p.write_text('[base]\nduration_s = 2.0\n[axes]\npolicy = ["mtp1"]\n'
                 '[capacity]\nload = "concurrency"\nmin = 1\nmax = 1000000000\nslo = ["tps_user_median >= 1"]\n')
    assert main(["capacity", str(p), "--out", str(tmp_path / "o"), "--backend", "serial", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "1 capacity probe(s) failed" in err and "[policy=mtp1] concurrency=1000000000" in err
    assert "far past saturation" in err
    man = json.loads((tmp_path / "o" / "capacity.manifest.json").read_text())
    assert man["complete"] is False and man["n_failed_probes"] == 1

def test_capacity_over_seeds_reports_a_t_interval_of_the_per_seed_capacities(tmp_path):
    from dsparksim.results.stats import t_interval

    # seeds 5, 6, 7 give capacities 6, 5, 7 (seeds 3-5 all give 6 since paged KV and the step-weighted acceptance)
    spec = spec_from_dict({"base": {**BASE, "seed": 5}, "axes": {"policy": ["mtp1"]}})
    out = tmp_path / "cap"
    one = {}
    for seed in (5, 6, 7):  # each seed alone: the per-seed searches of the multi-seed run must equal these
        sp = spec_from_dict({"base": {**BASE, "seed": seed}, "axes": {"policy": ["mtp1"]}})
        st1 = capacity_settings(sp, load="concurrency", min=1, max=32, slo=SLO)
        one[seed] = capacity_search(sp, st1, out, backend="serial", progress=False)["results"][0]["capacity"]
    st = capacity_settings(spec, load="concurrency", min=1, max=32, slo=SLO, seeds=3)
    res = capacity_search(spec, st, out, backend="serial", progress=False)
    (r,) = res["results"]
    assert [x["seed"] for x in r["seeds"]] == [5, 6, 7] and r["capacities"] == [one[5], one[6], one[7]]
    iv = t_interval(r["capacities"])
    assert r["capacity"] == pytest.approx(iv.mean) and (r["capacity_lo"], r["capacity_hi"]) == (iv.lo, iv.hi)
    assert r["status"] == "ok" and r["n_seeds"] == 3 and res["settings"]["seeds"] == 3
    assert len(set(r["capacities"])) > 1 and r["capacity_lo"] < r["capacity"] < r["capacity_hi"]  # seeds differ here
    table = capacity_table(res)
    assert list(table.columns[:8]) == ["policy", "load", "capacity", "capacity_lo", "capacity_hi", "n_seeds",
                                       "capacities", "status"]


def test_capacity_over_seeds_censored_at_a_range_end_has_no_interval():
    from dsparksim.sweep.capacity import _over_seeds

    r = _over_seeds({"policy": "x"}, [{"group": {"seed": 1}, "capacity": 64, "status": "feasible_at_max",
                                       "bracket": [64, 64], "n_probes": 2, "trace": []},
                                      {"group": {"seed": 2}, "capacity": 40, "status": "ok", "bracket": [40, 41],
                                       "n_probes": 7, "trace": []}])
    assert r["capacity"] is None and r["capacity_lo"] is None and r["capacities"] == [64, 40]
    assert r["status"] == "mixed: 1 feasible_at_max, 1 ok"
    with pytest.raises(ConfigError, match="'--seeds': expected an integer in 1..1000"):   # a keyword = the CLI's flag
        capacity_settings(spec_from_dict({"base": BASE, "axes": {"policy": ["mtp1"]}}), load="concurrency", min=1,
                          max=8, slo=SLO, seeds=0)


def test_cli_capacity_interrupted_says_the_probes_are_kept_for_a_resume(tmp_path, capsys, monkeypatch):
    """Ctrl-C in the search: like sweep and plan, it says where the finished probes are and how to resume."""
    import dsparksim.sweep.capacity as cap

    def interrupted(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(cap, "capacity_search", interrupted)
    p = tmp_path / "cap.toml"
    p.write_text('[base]\nduration_s = 2.0\n[axes]\npolicy = ["mtp1"]\n'
                 '[capacity]\nload = "concurrency"\nmin = 1\nmax = 8\nslo = ["tps_user_median >= 1"]\n')
    assert main(["capacity", str(p), "--out", str(tmp_path / "o"), "--backend", "serial", "--quiet"]) == 130
    err = capsys.readouterr().err
    assert f"finished probes are saved in {tmp_path / 'o'}/cells" in err and "run the same command again" in err
    assert not (tmp_path / "o" / "capacity.manifest.json").exists()


@pytest.mark.parametrize("table,key,load", [("base", "rate", "concurrency"), ("base", "concurrency", "rate"),
                                             ("axes", "rate", "concurrency")])
def test_a_second_load_key_in_the_spec_is_blamed_on_itself(tmp_path, table, key, load):
    """A [base] or [axes] rate under a concurrency search failed every probe's config with "field 'concurrency':
    has no meaning in mode 'poisson'", blaming the key the search sets rather than the one the user wrote."""
    val = "4" if key == "concurrency" else "5.0"
    p = tmp_path / "cap.toml"
    p.write_text(f'[base]\nduration_s = 2.0\n{key} = {val}\n[axes]\npolicy = ["mtp1"]\n' if table == "base" else
                 f'[base]\nduration_s = 2.0\n[axes]\npolicy = ["mtp1"]\n{key} = [{val}]\n')
    with open(p, "a") as f:
        f.write(f'[capacity]\nload = "{load}"\nmin = 1\nmax = 8\nslo = ["tps_user_median >= 1"]\n')
    with pytest.raises(ConfigError) as ei:
        capacity_settings(load_spec(p))
    assert ei.value.field == f"{table}.{key}" and f"the capacity search varies {load}" in str(ei.value)


def test_a_probe_that_rejected_requests_on_arrival_is_infeasible(tmp_path):
    """kv_capacity_tokens too small for the workload's prompts: every probe rejects most requests on arrival, and
    capacity reported the top of the range as served (feasible_at_max) from the admitted few's speed."""
    from dsparksim.sweep.capacity import check_slo
    spec = spec_from_dict({"base": {**BASE, "domain": "math", "kv_capacity_tokens": 300}, "axes": {"policy": ["mtp1"]}})
    st = capacity_settings(spec, load="concurrency", min=1, max=4, slo=["tps_user_median >= 1"],
                           require_unsaturated=False)
    res = capacity_search(spec, st, tmp_path / "cap", backend="serial", progress=False)["results"][0]
    assert res["status"] == "infeasible_at_min" and res["capacity"] is None
    why = res["trace"][0]["violations"]
    assert len(why) == 1 and why[0].startswith("no request rejected on arrival (") and "kv_capacity:" in why[0]
    assert check_slo({"tps_user_median": 5.0, "num_requests_rejected": 0}, st.slo) == (True, [])


def test_a_load_flag_other_than_the_table_load_takes_none_of_its_range(tmp_path, capsys):
    """`capacity --load rate` on a spec whose [capacity] range was written for concurrency (min 1, max 64,
    tolerance 1) searched 1..64 req/s with that tolerance without a word; now refused naming the values to give."""
    p = tmp_path / "cap.toml"
    p.write_text('[base]\nduration_s = 2.0\n[axes]\npolicy = ["mtp1"]\n[capacity]\nload = "concurrency"\n'
                 'min = 1\nmax = 64\ntolerance = 1\nslo = ["tps_user_median >= 1"]\n')
    spec = load_spec(p)
    with pytest.raises(ConfigError, match=r"'--load': searches rate, but .*cap.toml's capacity.min = 1, "
                                          r"capacity.max = 64, capacity.tolerance = 1 were written for load "
                                          r"'concurrency' \(capacity.load\): give --min, --max, --tolerance for rate"):
        capacity_settings(spec, load="rate")
    with pytest.raises(ConfigError, match=r"capacity.tolerance = 1 was written .*: give --tolerance for rate"):
        capacity_settings(spec, load="rate", min=0.5, max=8.0)
    st = capacity_settings(spec, load="rate", min=0.5, max=8.0, tolerance=0.1)     # all given: searched as typed
    assert (st.load, st.lo, st.hi, st.tolerance) == ("rate", 0.5, 8.0, 0.1)
    assert capacity_settings(spec, load="concurrency").hi == 64      # the table's own load: its range
    # no capacity.load: the range was written for the spec's load (concurrency)
    p.write_text('[base]\nduration_s = 2.0\n[axes]\npolicy = ["mtp1"]\n[capacity]\nmin = 1\nmax = 64\n'
                 'slo = ["tps_user_median >= 1"]\n')
    out = tmp_path / "o"
    assert main(["capacity", str(p), "--load", "rate", "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "capacity.min = 1, capacity.max = 64 were written for load 'concurrency' (the spec's load)" in err, err
    assert not out.exists()
