"""Errors raised in workers, Ctrl-C, orphans, corrupt cache cells, missing extras: one line, never a hang.

Subprocess tests poll for a marker (the pool's worker processes exist, a progress bar appeared) instead of sleeping
a fixed time, and every wait has a generous deadline so a loaded 2-core machine does not make them flaky.
"""
from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import pickle
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

import dsparksim
from dsparksim.cli.main import main
from dsparksim.errors import ConfigError, InputError, MissingExtraError, missing_extra, one_line
from dsparksim.results.frontier import cells as frontier_cells
from dsparksim.results.frontier import run_cells
from dsparksim.sweep import run_sweep, spec_from_dict
from dsparksim.sweep.backends import Task, cell_exception

REPO = Path(__file__).resolve().parents[1]
LINUX = sys.platform.startswith("linux")


# ---- every error class survives the trip from a worker ---------------------------------------------------------

def _error_classes() -> list[type]:
    """Every InputError subclass in dsparksim: the modules that define one are found in the source and imported."""
    root = Path(dsparksim.__file__).parent
    for p in sorted(root.rglob("*.py")):
        if re.search(r"^class \w+\(\w*Error\):", p.read_text(encoding="utf-8"), re.M):
            mod = "dsparksim." + ".".join(p.relative_to(root).with_suffix("").parts)
            try:
                importlib.import_module(mod)
            except ImportError:  # an optional extra is missing here: its errors cannot be raised either
                pass
    out, todo = [], [InputError]
    while todo:
        c = todo.pop()
        out.append(c)
        todo.extend(c.__subclasses__())
    return sorted(set(out), key=lambda c: c.__qualname__)


def _sample(cls: type) -> InputError:
    """An instance of ``cls`` built through its own constructor where we know it, else InputError's."""
    known = {
        "InputError": lambda: InputError("lengths.csv", "num_prefill_tokens", "expected an integer, got 'x'", line=7),
        "ConfigError": lambda: ConfigError("cli", "--kv-capacity", "must be positive, got 0"),
        "MissingExtraError": lambda: MissingExtraError("ray", "ray", "--backend ray", "use --backend local"),
        "ProfileRangeError": lambda: cls("h100", "M", 9000, 1, 8192),
    }
    if cls.__name__ in known:
        e = known[cls.__name__]()
        assert type(e) is cls
        return e
    e = cls.__new__(cls)
    InputError.__init__(e, "some/file.json", "field.x", f"a {cls.__name__} message", line=3)
    return e


ERROR_CLASSES = _error_classes()


def test_error_classes_are_found():
    names = {c.__name__ for c in ERROR_CLASSES}
    assert {"InputError", "ConfigError", "MissingExtraError", "ProfileRangeError"} <= names


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda c: c.__name__)
def test_every_error_class_pickles_as_itself(cls):
    e = _sample(cls)
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is cls and str(back) == str(e) and back.args == e.args
    assert back.__dict__ == e.__dict__  # source, field, line and any subclass attributes


def _raise_by_seed(errors):
    """A stand-in for simulate that raises errors[cfg.seed] (a seed past the list: a normal, tiny summary)."""
    def fake(cfg, progress=None):
        if cfg.seed < len(errors):
            raise errors[cfg.seed]
        return type("Out", (), {"summary": {"seed": cfg.seed}, "inputs": {}, "requests": lambda self: None})()
    return fake


def _cfgs(n: int):
    return [_base_config(seed=i) for i in range(n)]


def _base_config(**kw):
    from dsparksim.sweep.cells import build_config

    return build_config({"policy": "mtp1", "concurrency": 4, "duration_s": 2.0, **kw})


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda c: c.__name__)
def test_every_error_class_crosses_the_local_pool(cls, monkeypatch):
    # The pool forks, so the workers inherit the patched simulate; cell 0 raises, cells 1-2 succeed.
    e = _sample(cls)
    monkeypatch.setattr("dsparksim.sim.simulate.simulate", _raise_by_seed([e]))
    with pytest.raises(cls) as got:
        run_cells(_cfgs(3), jobs=2, backend="local")
    if cls in (ConfigError, InputError):   # frontier's run_cells names the failing cell (results/frontier.py)
        tag = " [frontier cell: policy mtp1, 4 users, seed 0]"
        assert str(got.value) == str(e) + tag and got.value.message == e.message + tag
        assert (got.value.source, got.value.field, got.value.line) == (e.source, e.field, e.line)
    else:
        assert str(got.value) == str(e) and got.value.__dict__ == e.__dict__
    assert "\n" not in one_line(got.value)


def test_frontier_local_pool_is_bit_identical_to_serial():
    cfgs = frontier_cells(_base_config(), ["mtp1", "fixed:7"], [1, 4])
    a = pd.DataFrame(run_cells(cfgs, jobs=1))
    b = pd.DataFrame(run_cells(cfgs, jobs=2))
    pd.testing.assert_frame_equal(a, b, check_exact=True)
    assert a["output_throughput_tok_s"].nunique() == 4


@pytest.mark.skipif(not LINUX, reason="reads /proc")
def test_a_failing_cell_aborts_the_frontier_promptly(monkeypatch):
    # Cell 0 fails at once; the others would run for a minute: the error must arrive within seconds, with the
    # running cells' workers terminated, not after every cell finished.
    boom = ConfigError("config", "kv_capacity_tokens", "too small")

    def fake(cfg, progress=None):
        if cfg.seed == 0:
            time.sleep(0.5)  # let the pool pick up the slow cells first
            raise boom
        time.sleep(60)

    monkeypatch.setattr("dsparksim.sim.simulate.simulate", fake)
    before = set(_children(os.getpid()))
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match="too small"):
        run_cells(_cfgs(4), jobs=2, backend="local")
    assert time.perf_counter() - t0 < 30
    assert _wait_gone(set(_children(os.getpid())) - before, 10) == []


def test_an_unpicklable_worker_exception_still_arrives_as_one_line(monkeypatch):
    class Local(RuntimeError):  # defined in a function: cannot be pickled by reference
        pass

    monkeypatch.setattr("dsparksim.sim.simulate.simulate", _raise_by_seed([Local("disk on fire")]))
    with pytest.raises(RuntimeError, match="cell 0 failed: Local: disk on fire"):
        run_cells(_cfgs(2), jobs=2, backend="local")


def test_sweep_failures_json_holds_the_one_line_message(tmp_path):
    # kv_capacity_tokens=50 is a valid config but no request fits (the shortest azure-conv row has 95 tokens; a
    # capacity that fits some rows serves those and rejects the rest): every cell fails at run time with a
    # ConfigError; failures.json must carry the very line the CLI prints for `dsparksim run`, nothing more.
    spec = spec_from_dict({"base": {"duration_s": 2.0, "policy": "mtp1", "kv_capacity_tokens": 50},
                           "axes": {"concurrency": [1, 2]}})
    res = run_sweep(spec, tmp_path / "o", backend="local", workers=2, progress=False)
    from dsparksim.sim.simulate import simulate
    from dsparksim.sweep import expand

    with pytest.raises(ConfigError) as direct:
        simulate(expand(spec)[0].config)
    written = json.loads((tmp_path / "o" / "failures.json").read_text())
    assert [f["cell"] for f in written] == [0, 1]
    assert written[0]["error"] == str(direct.value) and "\n" not in written[0]["error"]


def test_a_bad_profile_in_a_sweep_fails_before_any_cell_runs(tmp_path, capsys):
    spec = tmp_path / "s.toml"
    spec.write_text('[base]\nprofile = "nosuch"\nduration_s = 2.0\n[axes]\nconcurrency = [1, 2]\n')
    rc = main(["sweep", str(spec), "--out", str(tmp_path / "o"), "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("dsparksim: error: ") and "nosuch" in err[0]
    assert not (tmp_path / "o" / "cells").exists()


# ---- the frontier reproductions of issue 14 (a hang on the old code: run under a deadline) ----------------------

FRONTIER_CASES = {
    "profile": ["--profile", "nosuch"],
    "acceptance": ["--acceptance", "dspark-chat"],
    "kv_capacity": ["--kv-capacity", "100"],
    "lengths": ["--lengths", "{tmp}/bad_lengths.csv"],
    "nan_trace": ["--acceptance", "{tmp}/nan_trace.csv", "-K", "3"],
}


def test_frontier_input_errors_exit_2_with_one_line(tmp_path):
    (tmp_path / "bad_lengths.csv").write_text("num_prefill_tokens,num_decode_tokens\n12,abc\n")
    rows = (REPO / "tests" / "data" / "acc_trace_k3.csv").read_text().splitlines()
    rows[2] = re.sub(r"0\.95", "nan", rows[2])
    (tmp_path / "nan_trace.csv").write_text("\n".join(rows) + "\n")
    cases = {k: [a.replace("{tmp}", str(tmp_path)) for a in v] for k, v in FRONTIER_CASES.items()}
    # One interpreter runs every case (in-process main, a 2-worker pool each) to keep the test fast.
    script = f"""
import contextlib, io, json, sys
from dsparksim.cli.main import main
out = {{}}
for name, extra in {json.dumps(cases)}.items():
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = main(["frontier", "--policies", "confidence,mtp1", "--concurrency-levels", "1,2", "--duration", "2",
                   "--jobs", "2", "--quiet", "--out", {json.dumps(str(tmp_path / "out"))}] + extra)
    out[name] = [rc, err.getvalue()]
print(json.dumps(out))
"""
    p = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    for name, (rc, err) in got.items():
        lines = err.strip().splitlines()
        assert rc == 2 and len(lines) == 1 and lines[0].startswith("dsparksim: error: "), (name, err)
    assert "Traceback" not in p.stderr
    assert "nosuch" in got["profile"][1] and "dspark-chat" in got["acceptance"][1]
    assert "bad_lengths.csv" in got["lengths"][1] and "nan_trace.csv" in got["nan_trace"][1]


# ---- Ray: the same errors arrive through the Ray backend (one Ray start for the module) --------------------------

@pytest.fixture(scope="module")
def ray_instance():
    ray = pytest.importorskip("ray", reason="Ray is an optional extra; not installed")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def _execute_raising(e: BaseException, task: Task) -> dict:
    """Runs in a Ray worker: execute_cell with simulate raising ``e`` (shipped by value, see the test)."""
    import dsparksim.sim.simulate as sim
    from dsparksim.sweep.backends import execute_cell as run

    orig = sim.simulate

    def fake(cfg, progress=None):
        raise e

    sim.simulate = fake
    try:
        return run(task)
    finally:
        sim.simulate = orig


def test_every_error_class_crosses_ray(ray_instance):
    ray = ray_instance
    import ray.cloudpickle as cp

    # The wrapper is shipped by value (the worker cannot import this test module); execute_cell, the errors and
    # the result's trip back are the production ones.
    cp.register_pickle_by_value(sys.modules[__name__])
    try:
        remote = ray.remote(num_cpus=1, max_retries=0)(_execute_raising)
        cfg = _cfgs(1)[0]
        refs = [remote.remote(_sample(cls), Task(i, cfg)) for i, cls in enumerate(ERROR_CLASSES)]
        results = ray.get(refs)
    finally:
        cp.unregister_pickle_by_value(sys.modules[__name__])
    for cls, res in zip(ERROR_CLASSES, results):
        e = _sample(cls)
        assert res["pid"] != os.getpid() and not res["ok"]
        assert res["error"] == str(e)  # the one line, no class-name prefix
        back = cell_exception(res)
        assert type(back) is cls and str(back) == str(e) and back.__dict__ == e.__dict__


def test_ray_backend_aborts_the_frontier_with_the_workers_error(ray_instance, tmp_path):
    bad = tmp_path / "bad_lengths.csv"
    bad.write_text("num_prefill_tokens,num_decode_tokens\n12,abc\n")
    cfgs = frontier_cells(_base_config(lengths=str(bad)), ["mtp1"], [1, 2])
    with pytest.raises(InputError) as got:
        run_cells(cfgs, jobs=2, backend="ray")
    assert str(bad) in str(got.value) and "\n" not in str(got.value)
    assert ray_instance.is_initialized()  # an instance the backend did not start is left running


# ---- Ctrl-C and SIGKILL: one line, exit 130, no orphans --------------------------------------------------------

def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited
    except OSError:
        return False


def _wait_gone(pids, timeout: float) -> list[int]:
    deadline = time.time() + timeout
    while time.time() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


def _start(args: list[str], tmp_path: Path) -> tuple[subprocess.Popen, list[str]]:
    """Start the CLI in its own process group; a thread collects stderr so the test can poll it."""
    # stderr is a pipe here: DSPARKSIM_PROGRESS=1 keeps the progress bar the tests poll for
    proc = subprocess.Popen([sys.executable, "-m", "dsparksim.cli.main", *args], cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env=dict(os.environ, DSPARKSIM_PROGRESS="1"))
    err: list[str] = []
    threading.Thread(target=lambda: err.extend(iter(lambda: proc.stderr.read(1), "")), daemon=True).start()
    return proc, err


def _wait_for(cond, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while not cond():
        if proc.poll() is not None or time.time() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"marker not seen (exit {proc.returncode})")
        time.sleep(0.05)


def _workers(proc: subprocess.Popen, n: int) -> list[int]:
    _wait_for(lambda: len(_children(proc.pid)) >= n, proc)
    time.sleep(0.5)  # past the initializer, inside a cell
    return _children(proc.pid)


def _sweep_spec(tmp_path: Path) -> Path:
    p = tmp_path / "long.toml"
    p.write_text('[base]\nduration_s = 600.0\npolicy = "mtp1"\n[axes]\nconcurrency = [4, 8, 16]\n')
    return p


LONG_FRONTIER = ["frontier", "--policies", "mtp1,fixed:7", "--concurrency-levels", "4,8", "--duration", "600",
                 "--jobs", "2"]


@pytest.mark.skipif(not LINUX, reason="reads /proc")
@pytest.mark.parametrize("command", ["frontier", "sweep"])
def test_ctrl_c_prints_one_line_exits_130_and_stops_the_workers(command, tmp_path):
    args = (LONG_FRONTIER + ["--out", str(tmp_path / "f")] if command == "frontier"
            else ["sweep", str(_sweep_spec(tmp_path)), "--out", str(tmp_path / "s"), "--workers", "2"])
    proc, err = _start(args, tmp_path)
    workers = _workers(proc, 2)
    os.killpg(proc.pid, signal.SIGINT)  # as a terminal does: the whole foreground group gets it
    try:
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    time.sleep(0.2)  # the reader thread drains the pipe
    text = "".join(err)
    assert proc.returncode == 130, text
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text
    lines = [ln for ln in text.replace("\r", "\n").splitlines() if ln.startswith("dsparksim:")]
    assert len(lines) == 1 and lines[0].startswith("dsparksim: interrupted"), text
    assert _wait_gone(workers, 10) == []


@pytest.mark.skipif(not LINUX, reason="reads /proc")
def test_ctrl_c_during_run_prints_one_line(tmp_path):
    proc, err = _start(["run", "--policy", "mtp1", "--concurrency", "8", "--duration", "600", "--out",
                        str(tmp_path / "r")], tmp_path)
    _wait_for(lambda: "sim-s" in "".join(err), proc)  # the progress bar: the simulation is running
    os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    time.sleep(0.2)
    text = "".join(err)
    assert proc.returncode == 130 and "Traceback" not in text and "dsparksim: interrupted" in text, text


@pytest.mark.skipif(not LINUX, reason="reads /proc")
@pytest.mark.parametrize("command", ["sweep", "frontier"])
def test_sigkill_of_the_parent_leaves_no_workers(command, tmp_path):
    args = (["sweep", str(_sweep_spec(tmp_path)), "--out", str(tmp_path / "s"), "--workers", "2", "--quiet"]
            if command == "sweep" else LONG_FRONTIER + ["--out", str(tmp_path / "f"), "--quiet"])
    proc, _ = _start(args, tmp_path)
    workers = _workers(proc, 2)
    assert len(workers) == 2
    os.kill(proc.pid, signal.SIGKILL)  # only the parent: its workers must follow on their own
    proc.wait()
    left = _wait_gone(workers, 10)
    for p in left:  # do not leave them to the next test
        os.kill(p, signal.SIGKILL)
    assert left == []


@pytest.mark.skipif(not LINUX, reason="reads /proc")
def test_pool_workers_ignore_sigint_and_the_fallback_watcher_ends_an_orphan():
    # The portable fallback (no prctl): a watcher thread ends the worker once it is re-parented. The child reports
    # its pid through a pipe after the initializer ran; the parent then exits at once.
    code = ("import os, sys, time, signal; from dsparksim.sweep import backends as b\n"
            "me = os.getpid(); r, w = os.pipe(); pid = os.fork()\n"
            "if pid == 0:\n"
            "    b._set_pdeathsig = lambda sig: False; b._worker_init(me)\n"
            "    ok = signal.getsignal(signal.SIGINT) is signal.SIG_IGN\n"
            "    os.write(w, f'{os.getpid()} {ok}'.encode()); time.sleep(60); os._exit(3)\n"
            "os.close(w); print(os.read(r, 100).decode(), flush=True)\n")
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    pid, ignored = p.stdout.split()
    assert ignored == "True"
    assert _wait_gone([int(pid)], 10) == []


# ---- corrupt cache cells ---------------------------------------------------------------------------------------

def test_corrupt_cached_cells_are_warned_about_and_recomputed(tmp_path, caplog):
    spec = spec_from_dict({"base": {"duration_s": 2.0, "policy": "mtp1"}, "axes": {"concurrency": [1, 2, 4]}})
    out = tmp_path / "o"
    first = run_sweep(spec, out, backend="serial", progress=False)
    files = sorted(out.glob("cells/*/summary.json"))
    assert len(files) == 3
    files[0].write_text('{"cell_hash": "abc", "summ')  # truncated
    rec = json.loads(files[1].read_text())
    del rec["summary"]["output_throughput_tok_s"]
    files[1].write_text(json.dumps(rec))  # parses, but lacks a field
    files[2].write_bytes(b"\xff\xfe not utf-8")
    with caplog.at_level("WARNING"):
        again = run_sweep(spec, out, backend="serial", progress=False)
    warned = [r.getMessage() for r in caplog.records if "corrupt cached cell" in r.getMessage()]
    assert len(warned) == 3 and all("\n" not in w for w in warned)
    assert {Path(re.search(r"cell (\S+summary\.json)", w).group(1)) for w in warned} == set(files)
    assert "output_throughput_tok_s" in " ".join(warned)
    assert (again.n_cached, again.n_ran) == (0, 3)
    pd.testing.assert_frame_equal(first.table, again.table, check_exact=True)
    third = run_sweep(spec, out, backend="serial", progress=False)  # repaired: all cached now
    assert (third.n_cached, third.n_ran) == (3, 0)


def test_corrupt_cache_on_the_cli_is_one_warning_line(tmp_path):
    spec = tmp_path / "s.toml"
    spec.write_text('[base]\nduration_s = 20.0\npolicy = "mtp1"\n[axes]\nconcurrency = [1]\n')
    assert main(["sweep", str(spec), "--out", str(tmp_path / "o"), "--backend", "serial", "--quiet"]) == 0
    f = next((tmp_path / "o").glob("cells/*/summary.json"))
    f.write_text("not json")
    p = subprocess.run([sys.executable, "-m", "dsparksim.cli.main", "sweep", str(spec), "--out", str(tmp_path / "o"),
                        "--backend", "serial", "--quiet"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and str(f) in lines[0] and "warning" in lines[0]


# ---- missing extras, broken pipes -------------------------------------------------------------------------------

def test_missing_extra_maps_only_the_optional_module_itself():
    e = missing_extra(ModuleNotFoundError("No module named 'torch'", name="torch"), "dsparksim run-real")
    assert isinstance(e, MissingExtraError) and 'pip install "dsparksim[torch]"' in str(e)
    assert "dsparksim run-real" in str(e)
    assert missing_extra(ModuleNotFoundError("x", name="torch._C")) is None  # installed but broken: a bug
    assert missing_extra(ModuleNotFoundError("x", name="numpy")) is None
    pq = ImportError("Unable to find a usable engine; tried using: 'pyarrow', 'fastparquet'.\n"
                     "A suitable version of pyarrow or fastparquet is required for parquet support.")
    assert 'dsparksim[parquet]' in str(missing_extra(pq))


def _without(module: str, argv: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    """Run the CLI in a fresh interpreter where ``import module`` fails as if it were not installed."""
    # A finder that refuses the module (a None in sys.modules would also confuse libraries probing for it).
    code = ("import importlib.abc, sys\n"
            "class Block(importlib.abc.MetaPathFinder):\n"
            "    def find_spec(self, name, path, target=None):\n"
            f"        if name.split('.')[0] == {module!r}:\n"
            "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
            "sys.meta_path.insert(0, Block())\n"
            f"from dsparksim.cli.main import main; sys.exit(main({argv!r}))")
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=240)


def test_run_real_without_torch_is_one_line(tmp_path):
    p = _without("torch", ["run-real", "--policy", "mtp1", "--duration", "1", "--out", str(tmp_path / "r"),
                           "--quiet"], tmp_path)
    err = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(err) == 1, p.stderr
    assert err[0].startswith("dsparksim: error: dsparksim run-real needs")
    assert 'pip install "dsparksim[torch]"' in err[0]


def test_parquet_without_pyarrow_is_one_line(tmp_path):
    p = _without("pyarrow", ["run", "--policy", "mtp1", "--concurrency", "1", "--duration", "1", "--format",
                             "parquet", "--out", str(tmp_path / "r"), "--quiet"], tmp_path)
    err = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(err) == 1 and "pyarrow" in err[0], p.stderr


def test_train_without_torch_is_one_line_exit_2(tmp_path):
    p = _without("torch", ["train", "--out", str(tmp_path / "m")], tmp_path)
    err = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(err) == 1 and 'pip install "dsparksim[torch]"' in err[0], p.stderr


def test_backend_ray_without_ray_is_one_line(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "ray", None)
    spec = tmp_path / "s.toml"
    spec.write_text('[base]\nduration_s = 2.0\npolicy = "mtp1"\n')
    rc = main(["sweep", str(spec), "--out", str(tmp_path / "o"), "--backend", "ray", "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and 'pip install "dsparksim[ray]"' in err[0], err


def test_broken_pipe_is_quiet(monkeypatch, capsys):
    class Closed(io.StringIO):
        def write(self, s):
            raise BrokenPipeError(32, "Broken pipe")

        def fileno(self):
            raise io.UnsupportedOperation("no fd")

    monkeypatch.setattr(sys, "stdout", Closed())
    rc = main(["profile", "list"])
    assert rc == 141 and capsys.readouterr().err == ""
