"""The Python API as a notebook uses it: bad values from Python get the same one-line ConfigErrors as the CLI
(never an AttributeError or TypeError from deep inside a run), and nothing is silently truncated or reinterpreted."""
from __future__ import annotations

import pytest

from dsparksim.config import EngineConfig, RunConfig
from dsparksim.errors import ConfigError
from dsparksim.sim.simulate import simulate
from dsparksim.traffic.config import TrafficConfig

TRAFFIC = TrafficConfig(concurrency=2, duration_s=1.0)


def test_run_without_traffic_is_a_config_error():
    with pytest.raises(ConfigError, match=r"field 'traffic': a run needs its load"):
        simulate(RunConfig())


@pytest.mark.parametrize("kw, field", [({"traffic": {"concurrency": 4}}, "traffic"),
                                       ({"engine": None, "traffic": TRAFFIC}, "engine"),
                                       ({"engine": {"block_size": 3}, "traffic": TRAFFIC}, "engine")])
def test_run_parts_must_be_their_configs(kw, field):
    with pytest.raises(ConfigError, match=rf"field '{field}': expected an? (Engine|Traffic)Config"):
        RunConfig(**kw)


@pytest.mark.parametrize("field, value", [("block_size", 6.5), ("block_size", "7"), ("max_num_seqs", 2.5),
                                          ("prefill_chunk_tokens", 512.5), ("kv_capacity_tokens", 100000.5),
                                          ("max_batched_tokens", 4096.0), ("replicas", True)])
def test_engine_integer_fields_take_integers(field, value):
    # before: block_size 6.5 ran as K=6, "7" and 2.5 raised TypeError, 512.5 an IndexError, 100000.5 was kept
    with pytest.raises(ConfigError, match=rf"field '{field}': expected an integer, got {value!r}"):
        EngineConfig(**{field: value})


@pytest.mark.parametrize("field", ["pad_verify", "mixed_prefill", "extrapolate", "disaggregated"])
def test_engine_switches_take_booleans(field):
    # before: pad_verify="no" is truthy and padded every step
    with pytest.raises(ConfigError, match=rf"field '{field}': expected True or False, got 'no'"):
        EngineConfig(**{field: "no"})


def test_recalibrate_takes_a_boolean():
    with pytest.raises(ConfigError, match=r"field 'recalibrate': expected True or False, got 'no'"):
        RunConfig(recalibrate="no", traffic=TRAFFIC)


def test_numpy_integers_are_stored_as_int():
    np = pytest.importorskip("numpy")
    e = EngineConfig(block_size=np.int64(5), max_num_seqs=np.int32(8), kv_capacity_tokens=np.int64(100_000))
    assert (e.block_size, e.max_num_seqs, e.kv_capacity_tokens) == (5, 8, 100_000)
    assert {type(e.block_size), type(e.max_num_seqs), type(e.kv_capacity_tokens)} == {int}
    assert EngineConfig().kv_capacity_tokens is None and EngineConfig(mixed_prefill=False).mixed_prefill is False


def test_numpy_loads_and_seeds_are_stored_as_int():
    # before: TrafficConfig(concurrency=np.int64(4)) was refused as "expected an integer >= 1, got np.int64(4)"
    np = pytest.importorskip("numpy")
    t = TrafficConfig(concurrency=np.int64(4), duration_s=np.float64(2.0))
    assert t.concurrency == 4 and type(t.concurrency) is int
    t = TrafficConfig(mode="poisson", rate=2.0, num_requests=np.int32(10), max_concurrency=np.int64(3),
                      num_warmup_prompts=np.int64(2))
    assert (t.num_requests, t.max_concurrency, t.num_warmup_prompts) == (10, 3, 2)
    assert {type(t.num_requests), type(t.max_concurrency), type(t.num_warmup_prompts)} == {int}
    cfg = RunConfig(seed=np.int64(3), traffic=TRAFFIC)
    assert cfg.seed == 3 and type(cfg.seed) is int
    with pytest.raises(ConfigError, match=r"field 'concurrency': expected an integer >= 1, got 2.5"):
        TrafficConfig(concurrency=2.5, duration_s=1.0)


@pytest.mark.parametrize("spec, what", [(7, "expected a spec string"), (None, "expected a spec string"),
                                        ("  ", "empty")])
def test_policy_spec_that_is_not_a_string(spec, what):
    # before: RunConfig(policy=7) failed as "bad spec 7: empty"
    with pytest.raises(ConfigError, match=rf"field 'policy': bad spec {spec!r}: {what}; valid specs: none, mtp1"):
        simulate(RunConfig(policy=spec, traffic=TRAFFIC))


def test_requests_in_process_are_requests_csv(tmp_path):
    # before: RunOutput.requests() had no ``measured`` column, the one docs/outputs.md says to select by
    import pandas as pd

    from dsparksim.sim.simulate import write_run

    out = simulate(RunConfig(traffic=TrafficConfig(concurrency=4, duration_s=3.0), seed=2))
    req = out.requests()
    arr = req["arrival_s"].to_numpy(float)
    assert (req["measured"] == (arr >= out.summary["warmup_s"])).all() and (~req["measured"]).any()
    write_run(out, tmp_path / "run")
    back = pd.read_csv(tmp_path / "run" / "requests.csv")
    assert list(back.columns) == list(req.columns)
    assert (back["measured"] == req["measured"]).all()


def test_plot_helpers_return_their_figure(tmp_path):
    # before: plot_frontier / plot_verify_budget only saved (returned None); a notebook could not show the figure
    from matplotlib.figure import Figure

    from dsparksim.results.frontier import cells, frontier_table, run_cells
    from dsparksim.results.plots import plot_frontier, plot_verify_budget

    cfgs = cells(RunConfig(traffic=TRAFFIC), ["mtp1", "confidence"], [1, 4])
    df = frontier_table(run_cells(cfgs), cfgs)
    for plot, name in ((plot_frontier, "f.png"), (plot_verify_budget, "v.png")):
        fig = plot(df, tmp_path / name)
        assert isinstance(fig, Figure) and fig.axes and (tmp_path / name).stat().st_size > 0


def test_notebook_api_is_documented():
    """Every public function, class and method of the modules a notebook uses has a docstring."""
    import importlib
    import inspect

    missing = []
    for name in ("dsparksim.config", "dsparksim.sim.simulate", "dsparksim.traffic.config", "dsparksim.results.frontier",
                 "dsparksim.results.plots", "dsparksim.sweep.capacity", "dsparksim.sweep.spec",
                 "dsparksim.cost.profile", "dsparksim.acceptance", "dsparksim.policies"):
        mod = importlib.import_module(name)
        for n in getattr(mod, "__all__", None) or [n for n in dir(mod) if not n.startswith("_")]:
            obj = getattr(mod, n)
            if not (inspect.isfunction(obj) or inspect.isclass(obj)) or obj.__module__ != name:
                continue
            doc = inspect.getdoc(obj) or ""
            if not doc or (inspect.isclass(obj) and doc.startswith(f"{obj.__name__}(")):   # dataclass's own
                missing.append(f"{name}.{n}")
            if inspect.isclass(obj):
                missing += [f"{name}.{n}.{a}" for a, f in vars(obj).items()
                            if not a.startswith("_") and inspect.isfunction(f) and not (f.__doc__ or "").strip()]
    assert not missing, missing


def test_docs_python_snippet_runs():
    """docs/notebooks.md's Python snippet runs as written (headless)."""
    import re
    from pathlib import Path

    from matplotlib.figure import Figure

    text = (Path(__file__).resolve().parents[1] / "docs" / "notebooks.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) == 1
    ns: dict = {}
    exec(compile(blocks[0], "docs/notebooks.md", "exec"), ns)
    assert isinstance(ns["fig"], Figure) and len(ns["table"]) == 6 and len(ns["measured"]) > 0
    assert set(ns["gains"]["policy"]) == {"confidence"}


@pytest.mark.parametrize("load", [2.5, 7.9, "4", True])
def test_frontier_cells_refuse_fractional_users(load):
    # before: cells(base, pols, [7.9]) ran 7 users and labelled the point 7
    from dsparksim.results.frontier import cells

    with pytest.raises(ConfigError, match=r"field 'loads': a closed-loop load level is a whole number of users"):
        cells(RunConfig(traffic=TRAFFIC), ["mtp1"], [load])


def test_frontier_cells_take_whole_floats_and_numpy():
    np = pytest.importorskip("numpy")
    from dsparksim.results.frontier import cells

    cs = cells(RunConfig(traffic=TRAFFIC), ["mtp1"], [8.0, np.int64(16), *np.geomspace(1, 4, 3).round()])
    assert [c.traffic.concurrency for c in cs] == [8, 16, 1, 2, 4]
    assert {type(c.traffic.concurrency) for c in cs} == {int}


@pytest.mark.parametrize("target", [-5, 0, float("nan"), float("inf"), "60", True])
def test_comparison_table_refuses_targets_that_are_no_per_user_speed(target):
    """comparison_table(slos=[-5]) gave a row that only ever read 'outside the range'; it is refused now, naming
    the argument, as the CLI's --slo is."""
    import pandas as pd
    from dsparksim.results.frontier import comparison_table
    df = pd.DataFrame({"policy": ["mtp1", "mtp1", "fixed:3", "fixed:3"], "load": [1, 4, 1, 4],
                       "output_throughput_tok_s": [100.0, 300.0, 120.0, 330.0],
                       "tps_user_median": [90.0, 70.0, 110.0, 80.0], "saturated": [False] * 4})
    with pytest.raises(ConfigError, match=r"needs the columns \['pareto'\]"):
        comparison_table(df, "mtp1", [75.0])              # before: KeyError 'pareto'
    df["pareto"] = True
    assert len(comparison_table(df, "mtp1", [75.0]))       # a positive target is taken
    with pytest.raises(ConfigError, match="slos.*positive per-user speed"):
        comparison_table(df, "mtp1", [target])


def test_a_saved_config_loads_back_into_the_same_run(tmp_path):
    """config.json's ``config`` (RunConfig.to_dict) had no way back into a RunConfig; from_dict restores it exactly
    (tuple fields included), and the loaded config runs the same summary."""
    import json

    from dsparksim.cli.main import main

    out = tmp_path / "run"
    assert main(["run", "--policy", "fixed:3", "--concurrency", "4", "--duration", "5", "--seed", "3", "--quiet",
                 "--out", str(out)]) == 0
    saved = json.loads((out / "config.json").read_text())["config"]
    cfg = RunConfig.from_dict(saved)
    assert cfg.to_dict() == saved
    got, want = simulate(cfg).summary, json.loads((out / "summary.json").read_text())   # (the file keeps 10 digits)
    assert (got["num_steps"], got["num_requests_completed"]) == (want["num_steps"], want["num_requests_completed"])
    assert got["output_throughput_tok_s"] == pytest.approx(want["output_throughput_tok_s"], rel=1e-9)
    odd = RunConfig(traffic=TrafficConfig(mode="closed", concurrency=4, duration_s=5.0,
                                          user_steps=((1.0, 2), (2.5, 4)),
                                          domain_drift=("mix:math=1,code=1", 0, 40)))
    assert RunConfig.from_dict(json.loads(json.dumps(odd.to_dict()))) == odd
    with pytest.raises(ConfigError, match=r"config.engine.*unknown key\(s\) \['turbo'\]"):
        RunConfig.from_dict(dict(saved, engine=dict(saved["engine"], turbo=True)), source="x/config.json")
