"""Sweeps: many configurations from one TOML spec, cached by content hash, on a local pool or Ray.

``load_spec(path)`` -> :class:`SweepSpec`; ``run_sweep(spec, out_dir, backend=...)`` -> :class:`SweepResult`;
``capacity_search`` (max load meeting an SLO, by bisection) and ``regress`` (frontier check against a baseline)
build on them. Importing this package never imports Ray.
"""
from dsparksim.sweep.backends import BACKENDS, make_backend
from dsparksim.sweep.cells import Cell, build_config, cell_hash, expand
from dsparksim.sweep.runner import SweepResult, failure_text, results_table, run_sweep
from dsparksim.sweep.spec import KEYS, SweepSpec, load_spec, spec_from_dict

__all__ = ["BACKENDS", "Cell", "KEYS", "SweepResult", "SweepSpec", "build_config", "cell_hash", "expand",
           "failure_text", "load_spec", "make_backend", "results_table", "run_sweep", "spec_from_dict"]
