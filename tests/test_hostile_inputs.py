"""Found by a hostile new-user pass: inputs that are the wrong kind of thing get an error that says so."""
from __future__ import annotations

from cli_guard import classify, run_cli, sample_replay_argv


def test_a_directory_given_as_a_file_is_called_a_directory_not_missing(tmp_path):
    d = tmp_path / "results"
    d.mkdir()
    for argv in (["bench", "import", str(d), "--out", str(tmp_path / "r.csv")],
                 ["run", "--profile", str(d), "--num-requests", "2", "--out", str(tmp_path / "o")]):
        o = run_cli(argv)
        assert classify(o) == "error", o.describe()
        assert str(d) in o.stderr and "is a directory" in o.stderr and "not found" not in o.stderr, o.stderr
    assert not (tmp_path / "r.csv").exists() and not (tmp_path / "o").exists()


def test_study_refuses_a_profile_its_production_regime_cannot_price_naming_its_own_option(tmp_path):
    """The production regime runs decode-only behind a prefill pool: a profile without metadata.kv_bytes_per_token
    failed in the first cell with advice to pass --kv-bytes-per-token, which `study` does not have."""
    out = tmp_path / "st"
    o = run_cli(["study", "early-exit", "--fast", "--profile", "h100-llama2-7b-tp1", "--out", str(out), "--quiet"])
    assert classify(o) == "error", o.describe()
    assert "--profile" in o.stderr and "kv_bytes_per_token" in o.stderr and "--kv-bytes-per-token" not in o.stderr
    assert not out.exists()


def test_an_absurd_max_num_seqs_is_refused_not_a_memory_error(tmp_path):
    """Every engine pre-allocates its max_num_seqs request slots (and the acceptance model sizes its state by the
    largest slot id): --max-num-seqs 10**12 ended in a MemoryError traceback."""
    for extra in (["--max-num-seqs", str(10**12)], ["--max-num-seqs", str(2**21), "--replicas", "4"]):
        o = run_cli(["run", "--num-requests", "2", "--quiet", "--out", str(tmp_path / "o"), *extra])
        assert classify(o) == "error", o.describe()
        assert "--max-num-seqs" in o.stderr and "4,194,304" in o.stderr, o.stderr
    assert not (tmp_path / "o").exists()


def test_a_request_count_past_the_per_run_limit_is_refused_as_a_rate_is(tmp_path):
    """A rate x duration above 2,000,000 expected arrivals is refused (memory bound); --num-requests 10**12 started
    a run that would never end, holding every request's state."""
    o = run_cli(["run", "--num-requests", str(10**12), "--quiet", "--out", str(tmp_path / "o")], limit_s=20)
    assert classify(o) == "error", o.describe()
    assert "num_requests" in o.stderr and "2,000,000" in o.stderr, o.stderr
    assert not (tmp_path / "o").exists()


def test_more_users_than_requests_do_not_stall_the_start(tmp_path):
    """Closed loop: every user beyond the request count sent nothing, but the start still walked all of them
    (`run --concurrency 10**9 --num-requests 4`, or a runs-table row with max_concurrency 1e9, never answered)."""
    import json
    outs = {}
    for conc in ("4", str(10**9)):
        out = tmp_path / f"c{conc}"
        o = run_cli(["run", "--policy", "none", "--concurrency", conc, "--num-requests", "4", "--quiet",
                     "--out", str(out)], limit_s=20)
        assert classify(o) == "ok", o.describe()
        outs[conc] = json.loads((out / "summary.json").read_text())
    a, b = outs.values()
    for k in ("num_requests_completed", "output_throughput_tok_s", "ttft_mean_s", "tps_user_median"):
        assert a[k] == b[k], k


def test_a_date_that_is_not_a_date_is_refused_before_it_reaches_metadata(tmp_path):
    """`--date` went into the profile's metadata verbatim: `--date 2026-13-04` or `--date yesterday` wrote a
    profile whose date no tool can read."""
    runs = tmp_path / "runs.csv"
    for argv in (["profile", "build", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--out",
                  str(tmp_path / "p.json")],
                 ["profile", "fit", str(runs), "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--out",
                  str(tmp_path / "p.json")]):
        for bad in ("2026-13-04", "yesterday", "04/12/2026"):
            o = run_cli([*argv, "--date", bad])
            assert classify(o) == "error", o.describe()
            assert "--date" in o.stderr and repr(bad) in o.stderr and "YYYY-MM-DD" in o.stderr, o.stderr
    assert not (tmp_path / "p.json").exists()
    o = run_cli(["profile", "build", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--date", "2026-12-04",
                 "--out", str(tmp_path / "p.json")])
    assert classify(o) == "ok", o.describe()
    assert '"date": "2026-12-04"' in (tmp_path / "p.json").read_text()


def test_a_traffic_error_from_the_command_line_names_the_flag_not_the_dataclass_field(tmp_path):
    """The traffic section's checks named `TrafficConfig: field 'num_warmup_prompts'` for a value typed as
    --num-warmup-prompts (the engine and run sections already named their flags)."""
    o = run_cli(["run", "--num-warmup-prompts", "5", "--quiet", "--out", str(tmp_path / "o")])
    assert classify(o) == "error", o.describe()
    assert "command line: field '--num-warmup-prompts'" in o.stderr and "TrafficConfig" not in o.stderr, o.stderr
    assert not (tmp_path / "o").exists()


def test_a_sweep_cell_with_fixed_k_above_its_block_size_is_refused_before_any_cell_runs(tmp_path):
    """`run`, `frontier` and `plan` refuse fixed:k above K; a sweep crossing fixed:7 with block_size 3 ran the
    K=3 cells as fixed:3 under the name fixed:7."""
    spec = tmp_path / "s.toml"
    spec.write_text('[sweep]\nname = "t"\n[base]\nduration_s = 2.0\n[axes]\npolicy = ["mtp1", "fixed:7"]\n'
                    'block_size = [3, 7]\nconcurrency = [4]\n')
    o = run_cli(["sweep", str(spec), "--out", str(tmp_path / "o"), "--quiet"])
    assert classify(o) == "error", o.describe()
    assert str(spec) in o.stderr and "policy=fixed:7, block_size=3" in o.stderr and "k <= 3" in o.stderr, o.stderr
    assert not (tmp_path / "o").exists()


def test_a_failing_frontier_cell_is_named_by_its_policy_and_load_level(tmp_path):
    """One level of --concurrency-levels far past saturation failed with '(lower --concurrency)', an option
    frontier does not have, without saying which of the levels it was."""
    o = run_cli(["frontier", "--policies", "none,mtp1", "--concurrency-levels", "1,3000000", "--duration", "1",
                 "--out", str(tmp_path / "f"), "--quiet"])
    assert classify(o) == "error", o.describe()
    assert "[frontier cell: policy " in o.stderr and "3000000 users]" in o.stderr, o.stderr
    assert not (tmp_path / "f").exists()


def test_a_date_in_the_basic_or_week_iso_form_is_refused_as_the_help_says_yyyy_mm_dd(tmp_path):
    """Python 3.11's fromisoformat also reads `20261204` and `2026-W49-5`: `--date` took them and wrote them into
    the profile's metadata verbatim, where every other date is YYYY-MM-DD."""
    for bad in ("20261204", "2026-W49-5", "2026-12-04x"):
        o = run_cli(["profile", "build", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--date", bad,
                     "--out", str(tmp_path / "p.json")])
        assert classify(o) == "error", o.describe()
        assert "--date" in o.stderr and repr(bad) in o.stderr and "YYYY-MM-DD" in o.stderr, o.stderr
    assert not (tmp_path / "p.json").exists()
    o = run_cli(["profile", "build", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--date",
                 "2026-12-04T10:00:00", "--out", str(tmp_path / "p.json")])
    assert classify(o) == "ok", o.describe()
    assert '"date": "2026-12-04T10:00:00"' in (tmp_path / "p.json").read_text()


def test_bench_replay_attention_dp_errors_name_the_flag_and_the_value(tmp_path):
    """`bench replay --attention-dp-batching-wait-iters 5` without a timeout named ServerSettings' field
    ('server: field attention_dp_batching_wait_iters'), not the flag given; the timeout given with no DP-attention
    run selected did not say its value."""
    replay = sample_replay_argv(tmp_path)
    o = run_cli([*replay, "--attention-dp-batching-wait-iters", "5"])
    assert classify(o) == "error", o.describe()
    assert "field '--attention-dp-batching-wait-iters'" in o.stderr and ": 5:" in o.stderr, o.stderr
    assert "--attention-dp-timeout-iters" in o.stderr and "server" not in o.stderr, o.stderr
    o = run_cli([*replay, "--attention-dp-timeout-iters", "60"])
    assert classify(o) == "error", o.describe()
    assert "field '--attention-dp-timeout-iters': 60 given" in o.stderr and "dp_attention=true" in o.stderr, o.stderr
    assert not (tmp_path / "rp").exists()


def test_a_frontier_load_level_out_of_range_is_named_by_the_load_flag(tmp_path):
    """`frontier --rates 1,1e20` was refused as "TrafficConfig: field 'rate'" (as "field '--rate'" when the bad level
    came first), `--time-scales 1,1e8` as "TrafficConfig: field 'time_scale'": frontier's flags are --rates and
    --time-scales."""
    from pathlib import Path
    trace = str(Path(__file__).parent / "data" / "traffic_azure_small.csv")
    for loads, flag, bad in ((["--rates", "1,1e20"], "--rates", "1e+20"), (["--rates", "1e20,1"], "--rates", "1e+20"),
                             (["--trace", trace, "--time-scales", "1,1e8"], "--time-scales", "100000000.0")):
        o = run_cli(["frontier", "--policies", "none,mtp1", *loads, "--duration", "1", "--quiet",
                     "--out", str(tmp_path / "f")])
        assert classify(o) == "error", o.describe()
        assert f"field '{flag}'" in o.stderr and bad in o.stderr and "TrafficConfig" not in o.stderr, o.stderr
    assert not (tmp_path / "f").exists()


def test_a_failing_frontier_cell_names_its_deployment_when_several_are_swept(tmp_path):
    """650,000 users overflow the admission queue of one replica (100,000 slots) but not of four: the error named
    the policy and the load only, not which of --replicas 1,4 failed."""
    o = run_cli(["frontier", "--policies", "none", "--baseline", "none", "--concurrency-levels", "650000",
                 "--replicas", "1,4", "--max-num-seqs", "100000", "--duration", "1", "--out", str(tmp_path / "f"),
                 "--quiet"])
    assert classify(o) == "error", o.describe()
    assert "[frontier cell: policy none, 650000 users, deployment x1 " in o.stderr, o.stderr
    assert not (tmp_path / "f").exists()


def test_a_frontier_deployment_the_engine_refuses_is_named_by_its_flag(tmp_path):
    """`frontier --replicas 1,5000` or a --max-num-seqs too large for one of the --replicas said `config: field
    'replicas'` / `'max_num_seqs'` (the dataclass field), not the flag typed."""
    for extra, flag in ((["--replicas", "1,5000"], "--replicas"),
                        (["--replicas", "1,4", "--max-num-seqs", "2000000"], "--max-num-seqs")):
        o = run_cli(["frontier", "--policies", "none,mtp1", "--concurrency-levels", "4", "--duration", "1",
                     "--out", str(tmp_path / "f"), "--quiet", *extra])
        assert classify(o) == "error", o.describe()
        assert f"command line: field '{flag}'" in o.stderr and "config: field" not in o.stderr, o.stderr
    assert not (tmp_path / "f").exists()


def test_workers_on_a_one_replica_run_is_refused_naming_the_flag(tmp_path):
    """A run is sharded by replica: `run --workers 2` on one replica advised `--router pinned` (closed loop), which is
    then refused with one replica; with --rate it silently ran as one shard."""
    for extra in ([], ["--rate", "2"]):
        o = run_cli(["run", "--workers", "2", "--duration", "5", "--quiet", "--out", str(tmp_path / "o"), *extra])
        assert classify(o) == "error", o.describe()
        assert "field '--workers'" in o.stderr and "one replica" in o.stderr and "pinned" not in o.stderr, o.stderr
    assert not (tmp_path / "o").exists()


def test_a_sweep_spec_given_as_empty_or_a_directory_says_so(tmp_path):
    """`sweep ''` read Path('') = '.' and said ".: cannot read sweep spec: Is a directory"."""
    for spec, want in (("", "expected the path of a sweep spec file, got an empty path"),
                       (str(tmp_path), "is a directory; expected a sweep spec file (TOML)")):
        o = run_cli(["sweep", spec, "--out", str(tmp_path / "o")])
        assert classify(o) == "error", o.describe()
        assert want in o.stderr, o.stderr
    assert not (tmp_path / "o").exists()
