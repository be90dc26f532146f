"""Studies on a `profile fit` profile simulate the server it was fitted under, as `run` does (its prefill chunk,
most running requests, memory fraction, mixed prefill and, when every fitted run had one, TensorRT-LLM batch
waiting), say so in one line and record it in study.json per regime; other profiles keep the regimes' options,
so the checked-in studies (built profiles) are unchanged. A fit's batch waiting reaches run, frontier, sweep and
plan the same way."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from dsparksim.cli.main import main
from dsparksim.config import RunConfig
from dsparksim.errors import ConfigError
from dsparksim.study.common import DENSE, PRODUCTION, run_config
from dsparksim.study.run import settings_for, study_fit_lines, write_study
from test_fit_defaults import RUN, engine_of, fit_lines, fitted_profile

FIT_KEYS = ("prefill_chunk_tokens", "max_num_seqs", "mem_fraction_static", "mixed_prefill",
            "batch_wait_timeout_iters", "batch_wait_max_tokens_ratio")
WAIT = {"timeout_iters": [40], "max_tokens_ratio": [0.8], "run_ids": "all"}


def test_a_study_cell_on_a_fitted_profile_is_the_server_run_simulates(tmp_path, capsys):
    """A study cell built its config from the regime's options alone: on a fitted profile it simulated a
    2048-token chunk, 1024 requests, the profile's KV capacity and mixed prefill, where `run` simulates the fit's."""
    prof = fitted_profile(tmp_path)
    cfg = run_config(DENSE.with_profile(prof), "none", 0, {"concurrency": 2, "duration_s": 2.0})
    assert main(["run", "--profile", prof, *RUN, "--out", str(tmp_path / "o")]) == 0
    ran = engine_of(tmp_path / "o")
    eng = cfg.engine
    assert tuple(getattr(eng, k) for k in FIT_KEYS) == tuple(ran[k] for k in FIT_KEYS) \
        == (4096, 64, 0.8, False, None, None)


@pytest.mark.parametrize("regime", [PRODUCTION, DENSE])
def test_a_study_cell_on_a_profile_without_a_fit_is_built_from_the_regime_alone(regime):
    """The checked-in studies run on built profiles: their cells' configs are what they were."""
    traffic = {"concurrency": 8, "duration_s": 5.0, "warmup_s": 1.0}
    opts = regime.run_options() | {"policy": "confidence-async:2", "seed": 3} | traffic
    assert run_config(regime, "confidence-async:2", 3, traffic) == RunConfig.from_options(opts, "x")
    assert regime.fit().used == {} and regime.fit().fitted == {}


def _fake_run(name, settings, workers=1, progress=None):
    return SimpleNamespace(headline="h", tables={"t": [{"a": 1}]}, markdown="m", figures={}), [], 0.0


def test_study_says_the_fitted_server_once_and_records_it(tmp_path, capsys, monkeypatch):
    import dsparksim.study.run as study_run

    prof = fitted_profile(tmp_path)
    monkeypatch.setattr(study_run, "run_study", _fake_run)
    out = tmp_path / "s"
    assert main(["study", "all", "--fast", "--profile", prof, "--out", str(out), "--quiet"]) == 0
    err = capsys.readouterr().err
    (note,) = fit_lines(err, "note")
    assert note.startswith("dsparksim: note: prefill_chunk_tokens = 4096, max_num_seqs = 64, mem_fraction_static = "
                           f"0.8, mixed_prefill = false: the server profile {prof} was fitted under"), note
    assert "the study's regimes set none of them" in note and not fit_lines(err, "caution")
    meta = json.loads((out / "p99-tails" / "study.json").read_text())
    prod, dense = meta["regimes"]
    assert prod["profile"] == prof and prod["options_from_profile_fit"] == {
        "prefill_chunk_tokens": 4096, "max_num_seqs": 64, "mem_fraction_static": 0.8, "mixed_prefill": False}
    assert "options_from_profile_fit" not in dense          # a built profile: nothing taken, the key absent


def test_study_on_built_profiles_says_nothing_and_records_nothing(tmp_path, capsys, monkeypatch):
    import dsparksim.study.run as study_run

    monkeypatch.setattr(study_run, "run_study", _fake_run)
    assert main(["study", "p99-tails", "--fast", "--out", str(tmp_path / "s"), "--quiet"]) == 0
    assert "fitted under" not in capsys.readouterr().err
    meta = json.loads((tmp_path / "s" / "p99-tails" / "study.json").read_text())
    assert all(set(r) == {"name", "profile", "options"} for r in meta["regimes"])


@pytest.mark.parametrize("name, regime, profile, fit", [
    ("long-context", "fitted-trtllm", "fitted-h200x8-deepseek-r1-trtllm-1.3.0rc14-ep8",
     {"prefill_chunk_tokens": 16384, "max_num_seqs": 512, "mem_fraction_static": 0.8906, "mixed_prefill": True}),
    ("fig8-production", "production-fitted", "fitted-h200x8-deepseek-r1-sglang-0.5.12",
     {"prefill_chunk_tokens": 16384, "max_num_seqs": 512, "mem_fraction_static": 0.82, "mixed_prefill": False}),
])
def test_a_study_records_the_fitted_regime_it_adds(tmp_path, name, regime, profile, fit):
    """long-context's and fig8-production's full modes also run a shipped fitted profile; study.json listed only
    the settings' regimes, so neither that regime nor what it took from the fit was recorded."""
    from dsparksim.study.common import Section

    settings = settings_for("full")
    write_study(tmp_path, name, settings, Section(markdown="m", tables={"t": [{"a": 1}]}), 0.0)
    regs = {r["name"]: r for r in json.loads((tmp_path / name / "study.json").read_text())["regimes"]}
    assert set(regs) == {"production", "dense", regime}
    assert regs[regime]["profile"] == profile and regs[regime]["options_from_profile_fit"] == fit
    (note,) = study_fit_lines([name], settings)
    assert profile in note and f"mem_fraction_static = {fit['mem_fraction_static']}" in note
    assert study_fit_lines([name], settings_for("fast")) == []    # fast mode: the built profile only


# ------------------------------------------------------------------------------------------ batch waiting
def test_run_takes_the_fit_batch_waiting_and_says_so(tmp_path, capsys):
    """A fit whose every run waited (client_model.batch_wait, run_ids "all") was run without batch waiting."""
    prof = fitted_profile(tmp_path, batch_wait=WAIT)
    assert main(["run", "--profile", prof, *RUN, "--out", str(tmp_path / "o")]) == 0
    eng = engine_of(tmp_path / "o")
    assert (eng["batch_wait_timeout_iters"], eng["batch_wait_max_tokens_ratio"]) == (40, 0.8)
    err = capsys.readouterr().err
    (note,) = fit_lines(err, "note")
    assert "--batch-wait-timeout-iters 40, --batch-wait-max-tokens-ratio 0.8:" in note
    cfg = json.loads((tmp_path / "o" / "config.json").read_text())
    assert cfg["options_from_profile_fit"]["batch_wait_timeout_iters"] == 40
    # a set pair wins, with the caution naming the fit's
    assert main(["run", "--profile", prof, *RUN, "--batch-wait-timeout-iters", "8", "--batch-wait-max-tokens-ratio",
                 "0.8", "--out", str(tmp_path / "p")]) == 0
    assert engine_of(tmp_path / "p")["batch_wait_timeout_iters"] == 8
    (caution,) = fit_lines(capsys.readouterr().err, "caution")
    assert "--batch-wait-timeout-iters 8 differs from" in caution and "(--batch-wait-timeout-iters 40)" in caution


def test_a_decode_only_run_keeps_the_fit_batch_waiting_out_with_a_caution(tmp_path, capsys):
    """Batch waiting is refused on decode-only engines: taken from the fit it would have failed a run that set
    no batch waiting; it is left out, and the caution names what the run changed and the fit's values."""
    prof = fitted_profile(tmp_path, batch_wait=WAIT)
    assert main(["run", "--profile", prof, *RUN, "--disaggregated", "--kv-transfer-gbps", "100",
                 "--out", str(tmp_path / "o")]) == 0
    eng = engine_of(tmp_path / "o")
    assert (eng["batch_wait_timeout_iters"], eng["prefill_chunk_tokens"]) == (None, 4096)
    err = capsys.readouterr().err
    (caution,) = fit_lines(err, "caution")
    assert caution.startswith("dsparksim: caution: --disaggregated differs from the server profile")
    assert "(--batch-wait-timeout-iters 40, --batch-wait-max-tokens-ratio 0.8)" in caution
    assert "batch-wait" not in fit_lines(err, "note")[0]
    # a study's production regime is decode-only: the same caution, in its spelling
    lines = study_fit_lines(["p99-tails"], settings_for("fast", prof))
    assert any(ln.startswith("dsparksim: caution: disaggregated = true differs") for ln in lines), lines
    assert run_config(PRODUCTION.with_profile(prof), "none", 0, {"concurrency": 2}).engine.batch_wait_timeout_iters \
        is None


def test_fit_batch_waiting_of_some_runs_only_is_not_taken(tmp_path, capsys):
    """As mixed prefill: runs that differed in it (the shipped B200 TensorRT-LLM fit waited in 2 runs) leave it at
    the run's default."""
    from dsparksim.cost.fitted import profile_fit_server

    prof = fitted_profile(tmp_path, batch_wait={**WAIT, "run_ids": ["a.csv:1"]})
    assert main(["run", "--profile", prof, *RUN, "--out", str(tmp_path / "o")]) == 0
    assert engine_of(tmp_path / "o")["batch_wait_timeout_iters"] is None
    assert "batch_wait_timeout_iters" not in profile_fit_server("fitted-b200x8-deepseek-r1-trtllm-1.3.0rc14")
    two = fitted_profile(tmp_path, batch_wait={**WAIT, "timeout_iters": [20, 40]})
    assert "batch_wait_timeout_iters" not in profile_fit_server(two)


def test_sweep_cells_take_the_fit_batch_waiting(tmp_path):
    from dsparksim.sweep.cells import build_config

    prof = fitted_profile(tmp_path, batch_wait=WAIT)
    cfg = build_config({"profile": prof, "policy": "none", "concurrency": 2}, "spec.toml")
    assert (cfg.engine.batch_wait_timeout_iters, cfg.engine.batch_wait_max_tokens_ratio) == (40, 0.8)
    cfg = build_config({"profile": prof, "policy": "none", "concurrency": 2, "dp_ranks": 2}, "spec.toml")
    assert cfg.engine.batch_wait_timeout_iters is None


@pytest.mark.parametrize("bad, field, shown", [
    ("40", r"batch_wait'", "'40'"),
    ({**WAIT, "timeout_iters": [0]}, r"batch_wait\.timeout_iters", r"\[0\]"),
    ({**WAIT, "max_tokens_ratio": [1.5]}, r"batch_wait\.max_tokens_ratio", r"\[1\.5\]"),
    ({**WAIT, "run_ids": "some"}, r"batch_wait\.run_ids", "'some'"),
])
def test_a_hand_edited_batch_wait_record_is_refused_naming_the_field(tmp_path, bad, field, shown):
    from dsparksim.cost.fitted import profile_fit_server

    with pytest.raises(ConfigError, match=rf"client_model\.{field}.*{shown}"):
        profile_fit_server(fitted_profile(tmp_path, batch_wait=bad))


def test_plan_deployments_take_the_fit_batch_waiting_and_record_it(tmp_path):
    from dsparksim.plan import plan_from_dict
    from test_fit_defaults import plan_dict

    spec = plan_from_dict(plan_dict(fitted_profile(tmp_path, batch_wait=WAIT)))
    for d in spec.deployments:
        opts = spec.options(d, 1.0, 1, 0)
        assert (opts["batch_wait_timeout_iters"], opts["batch_wait_max_tokens_ratio"]) == (40, 0.8)
        assert d.to_dict()["options_from_profile_fit"]["batch_wait_timeout_iters"] == 40


def test_a_study_on_a_fitted_profile_cautions_once_beyond_the_fitted_runs(tmp_path, capsys, monkeypatch):
    # run, frontier and plan caution when a fitted profile's runs are left behind; a study's cells never did
    import dataclasses
    import dsparksim.study.fig8 as fig8
    from dsparksim.study.common import FIT_PROBE
    from dsparksim.study.run import run_study, study_fit_cautions
    from test_fit_defaults import cautions, ranged_profile

    prof = ranged_profile(tmp_path)      # fitted at concurrencies 2 and 4, one 128/64 workload, no speculation
    monkeypatch.setattr(fig8, "FAST", dataclasses.replace(fig8.FAST, loads={"production": (16,)}, duration_s=1.0,
                                                          warmup_s=0.2))
    settings = settings_for("fast", prof, None)
    _, rows, _ = run_study("fig8-production", settings)
    assert len(rows) == 2 * 2 and all(FIT_PROBE in r for r in rows)   # two policies x two seeds, each probed
    (line,) = study_fit_cautions(rows)
    assert line.startswith(f"dsparksim: caution: outside what profile {prof} was fitted on"), line
    assert "the fit's largest concurrency, 4)" in line and "random_input_len, 128)" in line, line
    assert "confidence-async:2, mtp1 draft and verify several tokens" in line, line
    assert study_fit_cautions([{k: v for k, v in r.items() if k != FIT_PROBE} for r in rows]) == []
    built = settings_for("fast", None, None)      # the shipped (built) production profile: no fit, no caution
    monkeypatch.setattr(fig8, "plan", lambda s: [fig8.Cell(settings.regimes[0].with_profile(
        "built-h100-llama2-7b-tp1"), 16, fig8.BASE, 0, fig8.FAST)])
    assert study_fit_cautions(run_study("fig8-production", built)[1]) == []
    monkeypatch.undo()
    monkeypatch.setattr(fig8, "FAST", dataclasses.replace(fig8.FAST, loads={"production": (16,)}, duration_s=1.0,
                                                          warmup_s=0.2))
    capsys.readouterr()
    assert main(["study", "fig8-production", "--fast", "--no-contrast", "--profile", prof, "--out",
                 str(tmp_path / "s"), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert len(cautions(err)) == 1, err
    table = (tmp_path / "s" / "fig8-production").iterdir()
    assert not any(FIT_PROBE in p.read_text() for p in table if p.suffix in (".csv", ".json", ".md"))
