"""dsparksim plan: bad specs are rejected before any cell runs, with the field and what was expected."""
from __future__ import annotations

import pytest

import dsparksim.plan as plan_mod
from dsparksim.cli.main import main
from dsparksim.plan import plan_from_dict
from dsparksim.plan import search as search_mod
from plan_toml import toml

H100 = "NVIDIA H100 SXM 80GB"


def good():
    return {"plan": {"slo": ["tps_user_p50 >= 60", "ttft_p99_s <= 2"]},
            "traffic": {"rate": 8.0, "scales": [1.0, 2.0], "duration_s": 2.0},
            "prices": {H100: 3.0},
            "candidates": [{"name": "a", "profile": "h100-llama2-7b-tp1", "replicas": [1, 4],
                            "policies": ["mtp1", "confidence"], "K": [3, 7]}]}


@pytest.fixture
def no_cells(monkeypatch):
    """Any cell run fails the test: validation must stop a bad spec first."""
    def boom(*a, **k):
        raise AssertionError("a cell ran for a bad spec")
    monkeypatch.setattr(search_mod, "run_cells", boom)
    import dsparksim.sweep.backends as backends
    monkeypatch.setattr(backends, "execute_cell", boom)


def _stderr_before_probes(d, tmp_path, monkeypatch, capsys) -> str:
    """`dsparksim plan` on spec ``d``, stopped where the first probe would run (the notes and cautions come
    before it: exit 130); its stderr."""
    def stop(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(plan_mod, "run_plan", stop)
    spec = tmp_path / "plan.toml"
    spec.write_text(toml(d))
    assert main(["plan", str(spec), "--out", str(tmp_path / "out")]) == 130
    return capsys.readouterr().err


def edit(f):
    d = good()
    f(d)
    return d


BAD = {
    "unknown candidate key": (lambda d: d["candidates"][0].update(replicaz=3), ["candidates[0].replicaz", "unknown"]),
    "unknown plan key": (lambda d: d["plan"].update(sloo=["x"]), ["plan.sloo", "unknown key"]),
    "unknown table": (lambda d: d.update(extra={"a": 1}), ["extra", "unknown table"]),
    "unknown metric": (lambda d: d["plan"].update(slo=["tps_user_p42 >= 1"]),
                       ["plan.slo[0]", "unknown metric 'tps_user_p42'", "tps_user_median"]),
    "bad operator": (lambda d: d["plan"].update(slo=["ttft_p99_s => 2"]), ["plan.slo[0]", "'=>'", ">="]),
    "missing price": (lambda d: d.update(prices={"NVIDIA A100 SXM 80GB": 1.0}),
                      ["candidates[0].profile", "no price for GPU 'NVIDIA H100 SXM 80GB'", "[prices]",
                       # it printed "(profile 'h100-llama2-7b-tp1''s metadata.device)": a doubled quote
                       "(the metadata.device of profile 'h100-llama2-7b-tp1')"]),
    "empty candidates": (lambda d: d.update(candidates=[]), ["candidates", "no candidate deployments"]),
    "no candidates": (lambda d: d.pop("candidates"), ["candidates", "no candidate deployments"]),
    "inverted replicas": (lambda d: d["candidates"][0].update(replicas=[5, 2]),
                          ["candidates[0].replicas", "inverted", "5 > max 2"]),
    "bad policy": (lambda d: d["candidates"][0].update(policies=["mtp2"]), ["candidates[0].policies[0]", "mtp2"]),
    "no load": (lambda d: d["traffic"].pop("rate"), ["traffic", "no load"]),
    "closed loop": (lambda d: d["traffic"].update(concurrency=4), ["traffic.concurrency"]),
    "reserved option": (lambda d: d["candidates"][0].update(seed=3), ["candidates[0].seed", "set by the plan"]),
    "bad option value": (lambda d: d["candidates"][0].update(router="nearest"), ["router", "nearest"]),
    "bad K": (lambda d: d["candidates"][0].update(K=[0]), ["candidates[0].K", "1..15"]),
    # fixed:5 at K=3 ran as fixed:3 under the label 'fixed:5 K=3' (silently clipped)
    "fixed above K": (lambda d: d["candidates"][0].update(policies=["mtp1", "fixed:5"]),
                      ["candidates[0].policies[1]", "fixed:5", "K=3"]),
    "negative price": (lambda d: d["prices"].update({H100: -1}), ["prices.NVIDIA H100", "> 0"]),
    "unknown profile": (lambda d: d["candidates"][0].update(profile="h900-nothing"), ["candidates[0].profile",
                                                                                      "h900-nothing"]),
    "empty slo": (lambda d: d["plan"].update(slo=[]), ["plan.slo", "non-empty"]),
    "duplicate seeds": (lambda d: d["plan"].update(seeds=[1, 1]), ["plan.seeds", "duplicate"]),
    "zero duration": (lambda d: d["traffic"].update(duration_s=0), ["duration_s", "> 0"]),
    # a policy or K listed twice was searched once, the repeat silently dropped
    "duplicate policy": (lambda d: d["candidates"][0].update(policies=["mtp1", "confidence", "mtp1"]),
                         ["candidates[0].policies[2]", "duplicate policy 'mtp1'", "policies[0]"]),
    "duplicate K": (lambda d: d["candidates"][0].update(K=[3, 7, 3]), ["candidates[0].K", "duplicate", "[3, 7, 3]"]),
    # an input named in [traffic] or [base] was blamed on "candidates (a/...): field 'base.trace'"
    "missing trace in traffic": (lambda d: (d["traffic"].pop("rate"), d["traffic"].update(
        trace="/no-such-dsparksim/t.csv")), ["field 'traffic.trace'", "/no-such-dsparksim/t.csv"]),
    "missing acceptance in base": (lambda d: d.update(base={"acceptance": "/no-such-dsparksim/a.csv"}),
                                   ["field 'base.acceptance'", "/no-such-dsparksim/a.csv"]),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_spec_rejected_before_any_cell_runs(tmp_path, capsys, no_cells, case):
    f, words = BAD[case]
    p = tmp_path / "plan.toml"
    p.write_text(toml(edit(f)))
    rc = main(["plan", str(p), "--out", str(tmp_path / "out"), "--backend", "serial", "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("dsparksim: error:") and str(p) in lines[0], err
    assert lines[0].count(str(p)) == 1, lines[0]   # named once, not again inside a wrapped message
    for w in words:
        assert w in lines[0], (w, lines[0])
    assert not (tmp_path / "out").exists()   # nothing written either


def test_good_spec_resolves_deployments():
    spec = plan_from_dict(good(), "g.toml")
    # mtp1 forces K=1: one mtp1 deployment; confidence at K=3 and K=7
    assert [(d.policy, d.K) for d in spec.deployments] == [("mtp1", 1), ("confidence", 3), ("confidence", 7)]
    assert spec.slo[0].metric == "tps_user_median" and str(spec.slo[0]) == "tps_user_p50 >= 60"
    assert all(d.gpus_per_replica == 1 and d.price == 3.0 and d.prefill_gpus == 0 for d in spec.deployments)
    # a run option given as a list makes one deployment per value
    d = good()
    d["candidates"][0]["router"] = ["round-robin", "least-outstanding"]
    assert len(plan_from_dict(d).deployments) == 6
    # the GPU count can be stated on the candidate
    d = good()
    d["candidates"][0]["gpus_per_replica"] = 8
    assert {x.gpus_per_replica for x in plan_from_dict(d).deployments} == {8}


def test_short_gpu_name_prices_built_and_vidur_profiles_alike():
    from dsparksim.plan.spec import price_key_for

    # vidur-derived 'NVIDIA H100 SXM 80GB' and built 'H100-SXM5-80GB' both take the price of 'H100'
    d = good()
    d["prices"] = {"H100": 2.5}
    d["candidates"].append({"name": "b", "profile": "built-h100-llama2-7b-tp1", "replicas": [1, 2],
                            "policies": ["mtp1"]})
    assert {x.price for x in plan_from_dict(d).deployments} == {2.5}
    # the exact device string wins; a short name must be a whole token (H20 does not price an H200)
    assert price_key_for(H100, {H100: 3.0, "H100": 2.5}) == H100
    assert price_key_for("H200-SXM-141GB", {"H20": 1.0}) is None
    assert price_key_for("H200-SXM-141GB", {"h200": 4.0}) == "h200"
    d["prices"] = {"H20": 1.0}
    with pytest.raises(Exception, match="no price for GPU"):
        plan_from_dict(d)


def test_disaggregated_deployments_pay_for_their_prefill_pool(monkeypatch):
    """When the run options `disaggregated` and `prefill_replicas` exist ([regime]), a disaggregated candidate's
    GPUs are replicas x GPUs per replica + prefill_replicas x prefill GPUs. Simulated here by declaring the two
    options; building their runs is left to the engine that defines them (probe checks are skipped)."""
    import dsparksim.config as config
    import dsparksim.plan.spec as ps
    import dsparksim.sweep.spec as ss
    from dsparksim.config import BOOL, INT, Option, OptionSpec

    opts = dict(config.run_options())
    opts["disaggregated"] = OptionSpec("disaggregated", "engine", "disaggregated", Option(kinds=BOOL), False)
    opts["prefill_replicas"] = OptionSpec("prefill_replicas", "engine", "prefill_replicas", Option(kinds=INT), 1)
    monkeypatch.setattr(config, "run_options", lambda: opts)
    monkeypatch.setitem(ss.TYPES, "disaggregated", BOOL)
    monkeypatch.setitem(ss.TYPES, "prefill_replicas", INT)
    monkeypatch.setattr(ps, "_check_probes", lambda spec: None)
    d = good()
    d["candidates"] = [{"profile": "h100-llama2-70b-tp4", "replicas": [1, 3], "policies": ["mtp1"],
                        "disaggregated": [False, True], "prefill_replicas": 2},
                       {"profile": "h100-llama2-70b-tp4", "replicas": [1, 3], "policies": ["mtp1"],
                        "disaggregated": True, "prefill_gpus_per_replica": 8}]
    deps = plan_from_dict(d).deployments
    assert [(x.gpus_per_replica, x.prefill_gpus, x.gpus(3)) for x in deps] == [(4, 0, 12), (4, 8, 20), (4, 8, 20)]
    assert [x.options.get("disaggregated") for x in deps] == [False, True, True]


def test_bad_out_and_missing_or_broken_spec_file_exit_2(tmp_path, capsys, no_cells):
    p = tmp_path / "plan.toml"
    p.write_text(toml(good()))
    f = tmp_path / "afile"
    f.write_text("x = 1\n")
    cases = [([str(p), "--out", str(f)], "is a file"),
             ([str(tmp_path / "nope.toml"), "--out", str(tmp_path / "o")], "cannot read plan spec"),
             ([str(f), "--out", str(tmp_path / "o")], "unknown table [x]")]
    (tmp_path / "bad.toml").write_text("[plan\n")
    cases.append(([str(tmp_path / "bad.toml"), "--out", str(tmp_path / "o")], "not valid TOML"))
    for argv, words in cases:
        rc = main(["plan", *argv, "--backend", "serial", "--quiet"])
        err = capsys.readouterr().err
        assert rc == 2 and words in err and len(err.strip().splitlines()) == 1, (argv, err)


def test_profile_label_keeps_dots_of_shipped_names():
    """A shipped name with dots (fitted-...-0.5.12) is not cut like a file suffix; a .json file loses only .json."""
    from dsparksim.plan.spec import profile_label
    assert profile_label("fitted-h200x8-deepseek-r1-sglang-0.5.12") == "fitted-h200x8-deepseek-r1-sglang-0.5.12"
    assert profile_label("/tmp/x/my-h200.json") == "my-h200"
    assert profile_label("h100-llama2-7b-tp1") == "h100-llama2-7b-tp1"


def test_independent_spec_problems_are_reported_together(tmp_path, capsys, no_cells):
    # a spec with only mtp1 and keys K, acceptance and router that do not apply failed three times in a row, one
    # problem a run
    def f(d):
        d["candidates"][0].update(policies=["mtp1"], K=3, acceptance="parametric", router="round-robin",
                                  replicas=[1, 1])
        d["prices"] = {H100: -1}
    p = tmp_path / "plan.toml"
    p.write_text(toml(edit(f)))
    assert main(["plan", str(p), "--out", str(tmp_path / "out"), "--backend", "serial", "--quiet"]) == 2
    lines = capsys.readouterr().err.splitlines()
    # the prices table fails first, alone: the candidates are checked once the tables parse
    assert lines == [f"dsparksim: error: {p}: field 'prices.{H100}': expected a finite number > 0, got -1"], lines
    def g(d):
        f(d)
        d["prices"] = {H100: 3.0}
        d["extra"] = {}
        d["more"] = {}
    p.write_text(toml(edit(g)))
    assert main(["plan", str(p), "--out", str(tmp_path / "out"), "--backend", "serial", "--quiet"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == f"dsparksim: error: 2 problems in {p}:" and "field 'extra'" in lines[1] and \
        "field 'more'" in lines[2] and len(lines) == 3, lines
    d = edit(f)
    d["prices"] = {H100: 3.0}
    p.write_text(toml(d))
    assert main(["plan", str(p), "--out", str(tmp_path / "out"), "--backend", "serial", "--quiet"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == f"dsparksim: error: 3 problems in {p}:" and len(lines) == 4, lines
    for line, key in zip(lines[1:], ("candidates[0].K", "candidates[0].acceptance", "router")):
        assert line.startswith(f"dsparksim: error: {p}: field '") and key in line and "has no effect" in line, line


def test_several_candidates_problems_come_in_one_error():
    from dsparksim.errors import ConfigErrors
    d = good()
    d["candidates"].append({"name": "b", "profile": "h100-llama2-7b-tp1", "replicas": [3, 1], "policies": [],
                            "K": [0]})
    d["candidates"][0]["replicas"] = [0, 1]
    with pytest.raises(ConfigErrors) as ei:
        plan_from_dict(d, "s.toml")
    assert [e.field for e in ei.value.errors] == ["candidates[0].replicas", "candidates[1].replicas",
                                                  "candidates[1].policies", "candidates[1].K"]
    assert all(e.source == "s.toml" for e in ei.value.errors) and str(ei.value).startswith("4 problems in s.toml:")


def test_a_problem_every_deployment_finds_in_a_shared_value_is_said_once():
    """raise_all: the same problem in the same words (a [traffic] rate each deployment checks) is one problem, so a
    spec with just that one gets its one error line, not one per deployment; distinct problems all stay."""
    from dsparksim.errors import ConfigError, ConfigErrors, raise_all
    same = [ConfigError("plan.toml", "traffic.rate", "too many arrivals") for _ in range(6)]
    with pytest.raises(ConfigError) as one:
        raise_all("plan.toml", same)
    assert not isinstance(one.value, ConfigErrors)
    other = ConfigError("plan.toml", "plan.seeds", "expected 1..1000")
    with pytest.raises(ConfigErrors) as many:
        raise_all("plan.toml", [*same, other, same[0]])
    assert [str(e) for e in many.value.errors] == [str(same[0]), str(other)]


def test_a_bad_candidate_does_not_hide_another_candidates_unread_option():
    """One candidate's missing profile stopped the spec before the options another candidate's policies never
    read were reported: fixing the profile brought a second round of errors."""
    from dsparksim.errors import ConfigErrors
    d = good()
    d["candidates"].append({"name": "b", "profile": "no-such-profile.json", "replicas": [1, 1], "policies": ["mtp1"]})
    d["candidates"][0].update(policies=["mtp1"], K=3, replicas=[1, 1])
    with pytest.raises(ConfigErrors) as ei:
        plan_from_dict(d, "s.toml")
    assert [e.field for e in ei.value.errors] == ["candidates[1].profile", "candidates[0].K"]
    assert "has no effect" in ei.value.errors[1].message


def test_prices_no_deployment_takes_are_noted_once(tmp_path, capsys, monkeypatch):
    """A [prices] entry no candidate's GPU takes (a misspelt device, a GPU of no candidate, the second of two keys
    for one GPU) was never mentioned: the plan ran on the other key, or refused 'no price' without saying the
    entry that was meant went unused. One note names them; not an error."""
    d = good()
    d["prices"] = {H100: 3.0, "A100": 1.5, "NVIDIA H100 SXM 80 GB": 9.0}
    spec = plan_from_dict(d)
    note = spec.price_note()
    assert note is not None and "'A100', 'NVIDIA H100 SXM 80 GB' price no deployment" in note
    assert f"'{H100}' by '{H100}'" in note
    assert plan_from_dict(good()).price_note() is None        # every entry used: nothing said
    d["prices"] = {"H100": 2.5}
    assert plan_from_dict(d).price_note() is None             # a short name taken by the device is used

    d["prices"] = {"H100": 2.5, "B200": 6.0}
    err = _stderr_before_probes(d, tmp_path, monkeypatch, capsys)
    lines = [ln for ln in err.splitlines() if "[prices]" in ln]
    assert lines == [f"dsparksim: note: [prices] 'B200' prices no deployment (unused; the deployments' GPUs are "
                     f"priced '{H100}' by 'H100')"], lines


def test_a_profile_beside_the_spec_but_not_in_the_working_directory_is_pointed_to(tmp_path, monkeypatch, capsys,
                                                                                 no_cells):
    """A plan (or sweep) naming `my-h200.json`, the fitted profile saved beside it, run from another folder said
    only 'profile file not found'; relative paths are read from the working directory (docs/sweeps.md), and the
    error now says so and names the file beside the spec."""
    import shutil
    from dsparksim.cost.profile import profile_path
    folder = tmp_path / "mine"
    folder.mkdir()
    shutil.copy(profile_path("h100-llama2-7b-tp1"), folder / "my.json")
    d = good()
    d["candidates"][0]["profile"] = "my.json"
    (folder / "plan.toml").write_text(toml(d))
    monkeypatch.chdir(tmp_path)
    assert main(["plan", "mine/plan.toml", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "read from the working directory" in err and "'mine/my.json'" in err, err
    monkeypatch.chdir(folder)   # from the spec's folder the same spec loads the profile
    assert plan_from_dict(d, str(folder / "plan.toml")).deployments
    sweep = folder / "sweep.toml"
    sweep.write_text('[base]\nprofile = "my.json"\npolicy = "none"\nconcurrency = 2\nduration = 1.0\n')
    monkeypatch.chdir(tmp_path)
    assert main(["sweep", "mine/sweep.toml", "--out", str(tmp_path / "sw")]) == 2
    err = capsys.readouterr().err
    assert "read from the working directory" in err and "'mine/my.json'" in err, err


def test_an_slo_latency_that_reads_as_milliseconds_is_cautioned(tmp_path, monkeypatch, capsys):
    """`tpot_p99_s <= 50` (meant 50 ms) is 50 s per token: every deployment meets it, and the plan's answer is the
    cheapest one, without a word. The plan cautions on each such bound before any probe runs; 0.05 and a
    throughput floor do not."""
    from dsparksim.results.notes import slo_unit_notes
    d = good()
    d["plan"]["slo"] = ["tps_user_p50 >= 60", "tpot_p99_s <= 50", "ttft_p99_s <= 3000", "ttft_p99_s <= 2"]
    notes = slo_unit_notes(plan_from_dict(d).slo, "plan.slo")
    assert len(notes) == 2 and notes[0].startswith("plan.slo[1] tpot_p99_s <= 50: 50 s") and "0.05" in notes[0], notes
    assert notes[1].startswith("plan.slo[2] ttft_p99_s <= 3000: 3000 s") and "is 3" in notes[1], notes
    err = _stderr_before_probes(d, tmp_path, monkeypatch, capsys)
    assert "dsparksim: caution: plan.slo[1] tpot_p99_s <= 50: 50 s" in err, err
    d["plan"]["slo"] = ["tps_user_p50 >= 60", "tpot_p99_s <= 0.05"]
    assert slo_unit_notes(plan_from_dict(d).slo, "plan.slo") == []


def test_a_one_second_stall_bound_is_not_cautioned_as_milliseconds():
    """`itl_p99_s <= 1` ("no stall over a second") is a real bound, and 1 ms per token is out of GPU decoding's
    reach, but it was cautioned as "1 ms is 0.001" (TPOT/ITL were cautioned from 1 s on). TPOT/ITL are cautioned
    strictly above 1 s: 1 is not, 2 and `tpot_p99_s <= 50` (meant 50 ms) are, for `<` as for `<=`."""
    from dsparksim.results.notes import slo_unit_notes
    d = good()
    d["plan"]["slo"] = ["itl_p99_s <= 1", "tpot_p99_s <= 1", "itl_p99_s < 1", "tpot_p99_s < 1.0"]
    assert slo_unit_notes(plan_from_dict(d).slo, "plan.slo") == []
    d["plan"]["slo"] = ["tpot_p99_s <= 50", "itl_p99_s <= 2", "itl_p99_s < 1.5", "ttft_p99_s <= 1000"]
    notes = slo_unit_notes(plan_from_dict(d).slo, "plan.slo")
    assert [n.split(":")[0] for n in notes] == ["plan.slo[0] tpot_p99_s <= 50", "plan.slo[1] itl_p99_s <= 2",
                                                "plan.slo[2] itl_p99_s < 1.5", "plan.slo[3] ttft_p99_s <= 1000"], notes


def test_a_long_e2e_bound_of_a_long_output_workload_is_not_cautioned(tmp_path, monkeypatch, capsys):
    """`e2e_p99_s <= 1200` on 8k-token outputs (InferenceX 1k/8k: p99 E2E up to 655 s) is 0.15 s per token, a
    real bound; it was cautioned as '1200 ms is 1.2' (every E2E bound from 1000 s on was). With the workload's
    output length known, an E2E bound is cautioned only from 1 s per output token (the TPOT limit) up; a 30000
    (30 s meant in ms) on 1k-token outputs still is, and so is any bound from 1000 s when no length is set."""
    from dsparksim.results.notes import slo_unit_notes
    d = good()
    d["plan"]["slo"] = ["tps_user_p50 >= 5", "e2e_p99_s <= 1200"]
    d["traffic"]["random_output_len"] = 8192
    err = _stderr_before_probes(d, tmp_path, monkeypatch, capsys)
    assert "e2e_p99_s <= 1200" not in err, err
    slo = plan_from_dict(d).slo
    assert slo_unit_notes(slo, "plan.slo") != []                       # no length known: 1000 s and up, as before
    assert slo_unit_notes(slo, "plan.slo", [None, 8192]) == []
    d["plan"]["slo"] = ["e2e_p99_s <= 30000"]
    (note,) = slo_unit_notes(plan_from_dict(d).slo, "plan.slo", [1024])
    assert note.startswith("plan.slo[0] e2e_p99_s <= 30000: 30000 s") and "is 30" in note, note


def test_a_floor_on_the_fast_tail_of_per_user_speed_is_cautioned(tmp_path, monkeypatch, capsys):
    """`tps_user_p99 >= 10` (new in summary.json) floors the 99th percentile of per-user speed, the fastest 1%
    of users: it holds while 98% of users are slower, and InferenceX's 'p99 interactivity' (1000 / p99 TPOT) is
    the slowest users. It passed without a word; the plan cautions on a floor on tps_user_p90/p99 before any
    probe, and not on tps_user_p10, a median floor or a ceiling."""
    from dsparksim.results.notes import slo_tail_notes
    d = good()
    d["plan"]["slo"] = ["tps_user_p99 >= 10", "tps_user_p10 >= 5", "tps_user_p50 >= 5", "tps_user_p90 <= 900"]
    err = _stderr_before_probes(d, tmp_path, monkeypatch, capsys)
    assert "dsparksim: caution: plan.slo[0] tps_user_p99 >= 10 floors the fastest 1% of users only" in err, err
    assert err.count("floors the fastest") == 1, err
    d["plan"]["slo"] = ["tps_user_p90 > 20"]
    (note,) = slo_tail_notes(plan_from_dict(d).slo, "plan.slo")
    assert "fastest 10%" in note and "tps_user_p10" in note, note
