"""The simulator core must work without torch: importing and running it never loads torch."""
import subprocess
import sys


def test_core_never_imports_torch():
    code = (
        "import sys\n"
        "import dsparksim, dsparksim.cli.main, dsparksim.sim.simulate, dsparksim.results.frontier, dsparksim.results.plots\n"
        "import dsparksim.acceptance, dsparksim.traffic, dsparksim.policies, dsparksim.cost.profile\n"
        "dsparksim.cli.main.build_parser()\n"
        "from dsparksim.cli.main import main\n"
        "assert main(['run', '--concurrency', '2', '--duration', '3', '--quiet', '--out', sys.argv[1]]) == 0\n"
        "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.') or m == 'ray')\n"
        "print(bad)\n"
        "sys.exit(1 if bad else 0)\n"
    )
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        r = subprocess.run([sys.executable, "-c", code, d], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
