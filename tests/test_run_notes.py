"""What `run` and `frontier` say about a result a reader could otherwise misread: a closed-loop run whose
measurement window saw fewer finished requests than users, a typed prefill chunk the token budget caps.

Found by a newcomer: `frontier --profile fitted-h200x8-deepseek-r1-sglang-0.5.12 --concurrency-levels 4,16,64,256
--duration 20` reported the 256-user cells (1-4 finished requests, the start-up burst) as unsaturated, Pareto-
ranked points with a per-user speed from one to four short requests, and said nothing."""
from __future__ import annotations

from dsparksim.cli.main import main
from dsparksim.results.notes import short_window_count


def _s(**kw):
    return {"num_requests_completed": 4, "ended_by": "duration", **kw}


def test_short_window_count_fires_only_below_the_users_of_a_duration_bound_run():
    assert short_window_count(_s(), 64) == "4 finished for 64 users"
    assert short_window_count(_s(num_requests_completed=64), 64) is None        # one request per user: fine
    assert short_window_count(_s(num_requests_completed=0), 64) is None         # the empty-window warning's case
    assert short_window_count(_s(ended_by="all_requests_done"), 64) is None     # --num-requests serves them all
    assert short_window_count(_s(), None) is None                               # open loop: no users


def test_run_warns_when_the_window_saw_fewer_requests_than_users(tmp_path, capsys):
    # default profile (7B on H100), 64 users for 4 s: 4 requests finish in the 3.6 s window
    assert main(["run", "--policy", "mtp1", "--concurrency", "64", "--duration", "4", "--out", str(tmp_path / "a"),
                 "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "fewer requests finished in the measurement window than there are users (4 finished for 64 users)" in err
    assert main(["run", "--policy", "mtp1", "--concurrency", "64", "--duration", "10", "--out",
                 str(tmp_path / "b"), "--quiet"]) == 0
    assert "fewer requests finished" not in capsys.readouterr().err


def test_frontier_names_each_short_window_cell(tmp_path, capsys):
    assert main(["frontier", "--policies", "none,mtp1", "--concurrency-levels", "2,64", "--duration", "4",
                 "--workers", "1", "--quiet", "--out", str(tmp_path / "f")]) == 0
    err = capsys.readouterr().err
    assert "cell(s): fewer requests finished in the measurement window than there are users" in err
    assert "mtp1@64: 4 finished for 64 users" in err and "@2:" not in err


def test_a_typed_prefill_chunk_above_the_token_budget_is_noted(tmp_path, capsys):
    # `run --prefill-chunk 32768` on a 16384-token profile simulated 16384-token chunks (requests.csv identical to
    # --prefill-chunk 16384) and said nothing; the default profile's budget is 4096
    from dsparksim.results.notes import prefill_chunk_note
    assert prefill_chunk_note(4096, 4096) is None and "at most 4096 tokens" in prefill_chunk_note(4097, 4096)
    base = ["--policy", "mtp1", "--concurrency", "2", "--duration", "2", "--quiet"]
    assert main(["run", *base, "--prefill-chunk", "8192", "--out", str(tmp_path / "a")]) == 0
    assert "note: the prefill chunk 8192 is above the token budget 4096" in capsys.readouterr().err
    assert main(["run", *base, "--prefill-chunk", "4096", "--out", str(tmp_path / "b")]) == 0
    assert "token budget" not in capsys.readouterr().err
    assert (tmp_path / "a" / "requests.csv").read_text() == (tmp_path / "b" / "requests.csv").read_text()
    assert main(["frontier", "--policies", "mtp1", "--concurrency-levels", "2", "--duration", "2", "--workers", "1",
                 "--quiet", "--chunked-prefill-size", "8192", "--out", str(tmp_path / "f")]) == 0
    assert "note: the prefill chunk 8192 is above the token budget 4096" in capsys.readouterr().err
    assert main(["run", "--profile", "cpu-tiny", *base, "--out", str(tmp_path / "c")]) == 0   # its default 2048 > 512
    assert "token budget" not in capsys.readouterr().err


def test_a_trace_replay_cut_short_by_the_duration_says_how_much_it_replayed(tmp_path, capsys):
    # `run --trace .../AzureLLMInferenceTrace_conv.csv` replayed 191 of 19,366 rows (the default 60 s of a 3,502 s
    # trace) and said so only in config.json (inputs.workload.trace.rows_used)
    from dsparksim.results.notes import trace_cover_note
    assert trace_cover_note(600.0, 60.0, [20.0]) is None                  # 60 s x 20 covers the whole trace
    assert trace_cover_note(600.0, None, [1.0]) is None                   # --num-requests: no duration
    assert "replays only its first 60 s at time scale 1, 120 s at time scale 2:" in \
        trace_cover_note(600.0, 60.0, [1.0, 2.0, 20.0])
    trace = "azure-conv-window"                                           # shipped, 600 s
    assert main(["run", "--policy", "mtp1", "--trace", trace, "--duration", "5", "--quiet",
                 "--out", str(tmp_path / "a")]) == 0
    assert "note: the trace spans 600 s and a 5 s run replays only its first 5 s at time scale 1:" in \
        capsys.readouterr().err
    assert main(["run", "--policy", "mtp1", "--trace", trace, "--num-requests", "5", "--quiet",
                 "--out", str(tmp_path / "b")]) == 0
    assert "trace spans" not in capsys.readouterr().err
    assert main(["frontier", "--policies", "mtp1", "--trace", trace, "--time-scales", "1,200", "--duration", "5",
                 "--workers", "1", "--quiet", "--out", str(tmp_path / "f")]) == 0
    err = capsys.readouterr().err
    assert "replays only its first 5 s at time scale 1:" in err and "time scale 200" not in err


def test_a_plan_on_a_trace_its_duration_cuts_short_says_so(tmp_path, capsys):
    spec = tmp_path / "p.toml"
    spec.write_text('[plan]\nslo = ["tps_user_p50 >= 1"]\n[traffic]\ntrace = "azure-conv-window"\nscales = [1.0, 200.0]\n'
                    'duration_s = 5.0\n[prices]\nH100 = 3.0\n[[candidates]]\nprofile = "h100-llama2-7b-tp1"\n'
                    'replicas = [1, 1]\npolicies = ["none"]\n', encoding="utf-8")
    assert main(["plan", str(spec), "--out", str(tmp_path / "plan"), "--backend", "serial", "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "note: the trace spans 600 s and a 5 s run replays only its first 5 s at time scale 1: [traffic] " \
           "duration_s ends the replay" in err, err
    assert "time scale 200" not in err                                  # 5 s x 200 covers the whole trace


def test_sweep_and_plan_note_a_prefill_chunk_above_the_token_budget(tmp_path, capsys):
    # a plan's [base] prefill_chunk_tokens = 32768 (SGLang's InferenceX launch script) on a 16384-token profile was
    # simulated at 16384 without a word; h100-llama2-7b-tp1's budget is 4096
    sweep = tmp_path / "s.toml"
    sweep.write_text('[sweep]\nname = "s"\n[base]\nduration_s = 2.0\npolicy = "mtp1"\nconcurrency = 2\n[axes]\n'
                     'prefill_chunk_tokens = [4096, 8192]\n', encoding="utf-8")
    assert main(["sweep", str(sweep), "--out", str(tmp_path / "sw"), "--backend", "serial", "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "note: profile h100-llama2-7b-tp1: the prefill chunk 8192 is above the token budget 4096" in err, err
    assert "prefill chunk 4096" not in err
    plan = tmp_path / "p.toml"
    plan.write_text('[plan]\nslo = ["tps_user_p50 >= 1"]\n[traffic]\nrate = 1.0\nscales = [1.0]\nduration_s = 3.0\n'
                    '[base]\nprefill_chunk_tokens = 8192\n[prices]\nH100 = 3.0\n[[candidates]]\n'
                    'profile = "h100-llama2-7b-tp1"\nreplicas = [1, 1]\npolicies = ["none"]\n', encoding="utf-8")
    assert main(["plan", str(plan), "--out", str(tmp_path / "plan"), "--backend", "serial", "--quiet"]) == 0
    assert "note: profile h100-llama2-7b-tp1: the prefill chunk 8192 is above the token budget 4096" in \
        capsys.readouterr().err


def test_sweep_names_each_short_window_cell(tmp_path, capsys):
    # `sweep` ran 64 users for 4 s (4 requests finished) without the warning `run` and `frontier` print
    spec = tmp_path / "s.toml"
    spec.write_text('[sweep]\nname = "s"\n[base]\nduration_s = 4.0\npolicy = "mtp1"\n[axes]\nconcurrency = [2, 64]\n',
                    encoding="utf-8")
    assert main(["sweep", str(spec), "--out", str(tmp_path / "sw"), "--backend", "serial", "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "warning: 1 cell(s): fewer requests finished in the measurement window than there are users (cell 1 " \
           "[concurrency=64]: 4 finished for 64 users)" in err, err
    assert "concurrency=2]" not in err


def test_capacity_names_each_short_window_probe(tmp_path, capsys):
    import json
    spec = tmp_path / "c.toml"
    spec.write_text('[base]\nduration_s = 4.0\npolicy = "mtp1"\n[capacity]\nload = "concurrency"\nmin = 2\n'
                    'max = 64\nslo = ["tps_user_median >= 1"]\n', encoding="utf-8")
    assert main(["capacity", str(spec), "--out", str(tmp_path / "c"), "--backend", "serial", "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "capacity probe(s): fewer requests finished in the measurement window than there are users" in err, err
    assert "concurrency=64: 4 finished for 64 users" in err and "concurrency=2:" not in err
    trace = json.loads((tmp_path / "c" / "capacity.json").read_text())["results"][0]["trace"]
    assert {t["load"]: t.get("short_window") for t in trace}[64] == "4 finished for 64 users"
    assert all("short_window" not in t for t in trace if t["load"] == 2)


def test_short_window_list_names_a_dozen_then_counts():
    from dsparksim.results.notes import short_window_list
    named = [f"c{i}: 1 finished for 9 users" for i in range(15)]
    text = short_window_list(named, "results.csv")
    assert "c11:" in text and "c12:" not in text and text.endswith("; and 3 more (results.csv)")
    assert short_window_list(named[:2], "x") == "c0: 1 finished for 9 users; c1: 1 finished for 9 users"
