"""build_workload: modes, replay semantics, time scaling, lengths, domains, determinism, config errors."""
import json
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from dsparksim.errors import ConfigError, InputError
from dsparksim.traffic import TrafficConfig, build_workload, mooncake_groups, parse_domain, read_trace, shipped_path

DATA = Path(__file__).resolve().parent / "data"
AZURE = str(DATA / "traffic_azure_small.csv")
MOONCAKE = str(DATA / "traffic_mooncake_small.jsonl")
LENGTHS_DOM = str(DATA / "traffic_lengths_domain.csv")


def rng(seed=0):
    return np.random.default_rng(seed)


def _same(a, b):
    for f in ("prompt_tokens", "output_tokens", "domain"):
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f))
    if a.arrival_s is None:
        assert b.arrival_s is None
    else:
        np.testing.assert_array_equal(a.arrival_s, b.arrival_s)
    assert a.metadata == b.metadata


# ------------------------------------------------------------------ synthetic open loop + closed loop


@pytest.mark.parametrize("cfg", [
    TrafficConfig(mode="poisson", rate=3.0, duration_s=100, domain="mix:math=1,code=1,chat=1"),
    TrafficConfig(mode="gamma", rate=3.0, burstiness=0.5, num_requests=200),
    TrafficConfig(mode="trace", trace="mooncake-window", mooncake_spread=True, lengths="sharegpt",
                  domain="mix:math=0.5,chat=0.5"),
    TrafficConfig(concurrency=4, pool_size=300, lengths="azure-code")])
def test_same_seed_same_workload_different_seed_differs(cfg):
    a, b, c = build_workload(cfg, rng(7)), build_workload(cfg, rng(7)), build_workload(cfg, rng(8))
    _same(a, b)
    assert not np.array_equal(a.prompt_tokens[:len(c)], c.prompt_tokens[:len(a)])
    json.dumps(a.metadata)  # metadata must be serialisable into result files


def test_poisson_workload_metadata_and_default_lengths():
    w = build_workload(TrafficConfig(mode="poisson", rate=5.0, duration_s=400), rng(1))
    md = w.metadata
    assert not w.closed_loop and w.arrival_s[0] == 0.0 and w.arrival_s.max() < 400
    # 2000 expected arrivals, s.d. 45: +-10% is > 4 s.d.
    assert len(w) == pytest.approx(2000, rel=0.1) and md["stopped_by"] == "duration_s"
    assert md["process"] == "poisson" and md["cv"] == 1.0 and md["rate_rps"] == 5.0
    assert md["lengths"]["source"].startswith("azure-conv (shipped") and md["lengths"]["rows_available"] == 2000
    assert md["domain"]["counts"] == {"math": 0, "code": 0, "chat": len(w)}
    # every (prompt, output) pair is a row of the source: resampled, never synthesised
    src = read_trace(shipped_path("azure-conv"))
    pairs = set(zip(src.prompt_tokens.tolist(), src.output_tokens.tolist()))
    assert set(zip(w.prompt_tokens.tolist(), w.output_tokens.tolist())) <= pairs


def test_gamma_metadata_states_parametrisation():
    w = build_workload(TrafficConfig(mode="gamma", rate=2.0, burstiness=0.25, num_requests=50), rng(2))
    md = w.metadata
    assert len(w) == 50 and md["stopped_by"] == "num_requests"
    assert md["burstiness"] == 0.25 and md["cv"] == 2.0 and "shape=burstiness" in md["gamma_parametrisation"]


def test_closed_loop_pool():
    w = build_workload(TrafficConfig(concurrency=16, num_requests=500, duration_s=60), rng(3))
    assert w.closed_loop and w.concurrency == 16 and w.arrival_s is None and len(w) == 500
    assert w.metadata["pool_size"] == 500 and w.metadata["duration_s"] == 60
    assert w.prompt_tokens.dtype == np.int64 and w.prompt_tokens.min() >= 1


@pytest.mark.parametrize("mode,kw", [("poisson", {}), ("gamma", {"burstiness": 0.5}), ("constant", {})])
def test_time_scale_divides_synthetic_arrivals(mode, kw):
    base = build_workload(TrafficConfig(mode=mode, rate=2.0, num_requests=300, **kw), rng(4))
    fast = build_workload(TrafficConfig(mode=mode, rate=2.0, num_requests=300, time_scale=2.0, **kw), rng(4))
    np.testing.assert_allclose(np.diff(fast.arrival_s), np.diff(base.arrival_s) / 2, rtol=1e-12)
    np.testing.assert_array_equal(fast.prompt_tokens, base.prompt_tokens)
    assert fast.metadata["effective_rate_rps"] == 4.0


def test_time_scale_with_duration_scales_the_count():
    # duration is wall time of the run: twice the rate fits (about) twice the requests into it.
    base = build_workload(TrafficConfig(mode="constant", rate=2.0, duration_s=50), rng(0))
    fast = build_workload(TrafficConfig(mode="constant", rate=2.0, duration_s=50, time_scale=2.0), rng(0))
    assert len(base) == 100 and len(fast) == 200 and fast.arrival_s.max() < 50


def test_time_scale_halves_trace_gaps():
    base = build_workload(TrafficConfig(mode="trace", trace=AZURE), rng(0))
    fast = build_workload(TrafficConfig(mode="trace", trace=AZURE, time_scale=2.0), rng(0))
    np.testing.assert_allclose(base.arrival_s, [0.0, 1.0, 1.25, 2.5, 4.0], atol=1e-9)
    np.testing.assert_allclose(fast.arrival_s, base.arrival_s / 2, atol=1e-12)


def test_domain_mix_proportions_chi_square():
    w = build_workload(TrafficConfig(mode="constant", rate=100.0, num_requests=6000,
                                     domain="mix:math=0.3,code=0.3,chat=0.4"), rng(5))
    counts = w.metadata["domain"]["counts"]
    obs = [counts[d] for d in ("math", "code", "chat")]
    assert obs == [int(np.sum(w.domain == d)) for d in ("math", "code", "chat")]
    # chi-square goodness of fit against 0.3/0.3/0.4; fixed seed, p > 0.01
    assert stats.chisquare(obs, [1800, 1800, 2400]).pvalue > 0.01
    # and it has power: the same counts are far from a uniform mix
    assert stats.chisquare(obs, [2000, 2000, 2000]).pvalue < 1e-6


def test_parse_domain():
    assert parse_domain("mix:math=3,chat=1") == {"math": 0.75, "code": 0.0, "chat": 0.25}
    assert parse_domain("code") == {"math": 0.0, "code": 1.0, "chat": 0.0}
    assert parse_domain("trace") is None
    for bad in ("poetry", "mix:math=-1,chat=1", "mix:math=0", "mix:math=1,math=2", "mix:math", "mix:art=1"):
        with pytest.raises(ConfigError, match="domain"):
            parse_domain(bad)


def test_domain_from_trace_column():
    w = build_workload(TrafficConfig(concurrency=2, pool_size=400, lengths=LENGTHS_DOM, domain="trace"), rng(6))
    # the domain travels with its row: prompt 10/40 -> math, 20 -> code, 30 -> chat
    expect = {10: "math", 20: "code", 30: "chat", 40: "math"}
    assert [expect[p] for p in w.prompt_tokens] == list(w.domain)
    with pytest.raises(ConfigError, match="domain"):
        build_workload(TrafficConfig(concurrency=2, pool_size=10, domain="trace"), rng(6))


# ------------------------------------------------------------------ trace replay


def test_mooncake_fire_at_once():
    w = build_workload(TrafficConfig(mode="trace", trace=MOONCAKE), rng(0))
    np.testing.assert_array_equal(w.arrival_s, [0, 0, 0, 3, 3, 6, 6, 6, 6])
    np.testing.assert_array_equal(w.prompt_tokens, np.arange(100, 109))
    assert "at once" in w.metadata["trace"]["replay"] and w.metadata["trace"]["groups"] == 3


def test_mooncake_spread_exact_times():
    w = build_workload(TrafficConfig(mode="trace", trace=MOONCAKE, mooncake_spread=True), rng(0))
    # groups of 3, 2, 4 at 0, 3, 6 s; gaps 3, 3 and (median) 3 for the last group
    np.testing.assert_allclose(w.arrival_s, [0, 1, 2, 3, 4.5, 6, 6.75, 7.5, 8.25])
    np.testing.assert_array_equal(w.prompt_tokens, np.arange(100, 109))  # file order kept
    assert "spread" in w.metadata["trace"]["replay"]


def test_mooncake_spread_stays_inside_group_gap_on_real_window():
    tab = read_trace(shipped_path("mooncake-window"))
    t, info = mooncake_groups(tab.arrival_s, spread=True)
    g_start = tab.arrival_s
    nxt = np.unique(g_start)
    gap_end = np.r_[nxt[1:], nxt[-1] + info["last_group_gap_s"]][np.searchsorted(nxt, g_start)]
    assert np.all(t >= g_start) and np.all(t < gap_end)
    assert np.all(np.diff(t) > 0)  # order preserved, no two requests at once any more
    assert info["groups"] == len(nxt)


def test_trace_truncation_and_rows_used():
    w = build_workload(TrafficConfig(mode="trace", trace="azure-conv-window", duration_s=60.0), rng(0))
    md = w.metadata["trace"]
    assert w.arrival_s.max() < 60.0 and md["rows_used"] == len(w) and md["rows_total"] == 4123
    assert md["stopped_by"] == "duration_s" and md["sha256_16"] == read_trace(shipped_path("azure-conv-window")).sha256
    w = build_workload(TrafficConfig(mode="trace", trace="azure-conv-window", num_requests=10, duration_s=60.0),
                       rng(0))
    assert len(w) == 10 and w.metadata["trace"]["stopped_by"] == "num_requests"
    with pytest.raises(ConfigError, match="only 5 rows"):
        build_workload(TrafficConfig(mode="trace", trace=AZURE, num_requests=6), rng(0))
    w = build_workload(TrafficConfig(mode="trace", trace=AZURE, duration_s=100.0), rng(0))
    assert len(w) == 5 and "ends at" in w.metadata["trace"]["note"]


def test_trace_with_lengths_from_elsewhere():
    w = build_workload(TrafficConfig(mode="trace", trace=MOONCAKE, lengths=LENGTHS_DOM), rng(0))
    np.testing.assert_array_equal(w.arrival_s, [0, 0, 0, 3, 3, 6, 6, 6, 6])
    assert set(w.prompt_tokens.tolist()) <= {10, 20, 30, 40}


def test_length_only_file_cannot_be_replayed():
    # the error named neither the missing column nor the flag that takes such a file
    with pytest.raises(InputError) as ei:
        build_workload(TrafficConfig(mode="trace", trace=LENGTHS_DOM), rng(0))
    e = ei.value
    assert (e.source, e.field) == (LENGTHS_DOM, "TIMESTAMP")
    assert "columns num_prefill_tokens, num_decode_tokens, domain" in e.message, e.message
    assert "has no timestamp column" in e.message and f"--lengths {LENGTHS_DOM}" in e.message


def test_cli_run_names_the_lengths_flag_for_a_length_only_trace(tmp_path, capsys):
    from dsparksim.cli.main import main
    assert main(["run", "--trace", LENGTHS_DOM, "--out", str(tmp_path / "o"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"{LENGTHS_DOM}: field 'TIMESTAMP'" in err and f"pass it as --lengths {LENGTHS_DOM}" in err, err


def test_max_tokens_is_an_error_naming_the_row():
    with pytest.raises(InputError) as ei:
        build_workload(TrafficConfig(mode="trace", trace=AZURE, max_prompt_tokens=4096), rng(0))
    e = ei.value
    assert (e.source, e.field, e.line) == (AZURE, "ContextTokens", 4) and "8000" in str(e)
    with pytest.raises(InputError) as ei:
        build_workload(TrafficConfig(mode="trace", trace=AZURE, max_output_tokens=2048), rng(0))
    assert (ei.value.field, ei.value.line) == ("GeneratedTokens", 5)
    w = build_workload(TrafficConfig(mode="trace", trace=AZURE, max_prompt_tokens=8000, max_output_tokens=3000),
                       rng(0))
    assert len(w) == 5  # at the limit is fine; nothing dropped


# ------------------------------------------------------------------ config errors


@pytest.mark.parametrize("kw,field", [
    (dict(mode="poisson", rate=1.0), "num_requests/duration_s"),
    (dict(mode="poisson", num_requests=5), "rate"),
    (dict(mode="poisson", rate=1.0, num_requests=5, burstiness=0.5), "burstiness"),
    (dict(mode="closed", concurrency=4), "num_requests/duration_s"),
    (dict(mode="closed", num_requests=5), "concurrency"),
    (dict(mode="closed", concurrency=4, num_requests=5, pool_size=6), "pool_size"),
    (dict(mode="closed", concurrency=4, num_requests=5, time_scale=2.0), "time_scale"),
    (dict(mode="closed", concurrency=4, num_requests=5, rate=3.0), "rate"),
    (dict(mode="poisson", rate=1.0, num_requests=5, concurrency=3), "concurrency"),
    (dict(mode="poisson", rate=1.0, num_requests=5, trace=AZURE), "trace"),
    (dict(mode="trace"), "trace"),
    (dict(mode="trace", trace=AZURE, trace_format="csv"), "trace_format"),
    (dict(mode="trace", trace=AZURE, rate=2.0), "rate"),
    (dict(mode="uniform"), "mode"),
    (dict(mode="poisson", rate=1.0, num_requests=0), "num_requests"),
    (dict(mode="poisson", rate=1.0, duration_s=-1.0), "duration_s"),
    (dict(mode="poisson", rate=1.0, num_requests=5, time_scale=0), "time_scale"),
    (dict(mode="poisson", rate=1.0, num_requests=5, max_prompt_tokens=0), "max_prompt_tokens"),
    (dict(mode="poisson", rate=1.0, num_requests=5, domain="poetry"), "domain"),
])
def test_config_errors(kw, field):
    with pytest.raises(ConfigError) as ei:
        TrafficConfig(**kw)
    assert ei.value.field == field and f"field '{field}'" in str(ei.value)


def test_build_time_config_errors():
    with pytest.raises(ConfigError, match="mooncake_spread"):
        build_workload(TrafficConfig(mode="trace", trace=AZURE, mooncake_spread=True), rng(0))
    with pytest.raises(ConfigError, match="neither a shipped sample"):
        build_workload(TrafficConfig(mode="poisson", rate=1.0, num_requests=3, lengths="no-such-source"), rng(0))


def test_a_trace_that_is_a_directory_is_named_as_one(tmp_path):
    """It exists: 'neither a shipped sample nor an existing file' sent the user looking for a missing file."""
    d = tmp_path / "trace.csv"
    d.mkdir()
    with pytest.raises(ConfigError, match="trace.csv' is a directory; expected a trace file") as ei:
        build_workload(TrafficConfig(mode="trace", trace=str(d)), rng(0))
    assert ei.value.field == "trace" and "neither" not in str(ei.value)
