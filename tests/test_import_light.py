"""Start-up stays light: the run path does not import the heavy libraries it does not use."""
import subprocess
import sys

HEAVY = ("scipy.optimize", "scipy.stats", "pandas", "matplotlib")


def _loaded(code: str) -> list[str]:
    code += f"\nimport sys\nprint(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    return eval(r.stdout.strip().splitlines()[-1])


def test_importing_the_simulator_loads_no_heavy_library():
    assert _loaded("import dsparksim.sim.simulate, dsparksim.cli.main") == []


def test_a_simulated_run_needs_neither_scipy_optimize_nor_scipy_stats():
    loaded = _loaded(
        "from dsparksim.config import RunConfig\n"
        "from dsparksim.traffic import TrafficConfig\n"
        "from dsparksim.sim.simulate import simulate\n"
        "t = TrafficConfig(mode='closed', concurrency=4, duration_s=2.0)\n"
        "o = simulate(RunConfig(policy='confidence', traffic=t))\n"
        "assert o.summary['num_requests_completed'] > 0\n")
    assert "scipy.optimize" not in loaded and "scipy.stats" not in loaded
