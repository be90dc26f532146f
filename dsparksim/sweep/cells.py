"""Cells of a sweep: one RunConfig per point of the axes' cross product, and its content hash.

A cell's hash covers everything its result depends on: the full RunConfig, the bytes of every file it reads
(profile JSON, acceptance trace or engine log, length source, arrival trace, the paper reference data behind the
parametric models), the dsparksim version and a fingerprint of the simulator's source code (so editing a policy
never serves a stale cached result).
"""
from __future__ import annotations

import functools
import hashlib
import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Protocol

from dsparksim.config import DEFAULT_CONCURRENCY, reserved_kv_conflict, run_options, RunConfig
from dsparksim.errors import ConfigError, InputError
from dsparksim import __version__
from dsparksim.acceptance import parse_spec
from dsparksim.cost.fitted import fit_defaults, fit_lines as merged_fit_lines, fitted_options
from dsparksim.cost.profile import profile_path
from dsparksim.sim.reads import identity, same_as
from dsparksim.traffic.config import DEFAULT_LENGTHS
from dsparksim.traffic.sources import resolve



class SpecAxes(Protocol):
    """What :func:`expand` reads of a :class:`dsparksim.sweep.spec.SweepSpec` (a protocol, not an import: spec.py
    validates a spec by expanding its cells, so importing it here would make a circle)."""
    axes: Mapping[str, list[Any]]
    base: Mapping[str, Any]
    source: str

__all__ = ["DEFAULT_CONCURRENCY", "Cell", "build_config", "cell_hash", "expand", "fit_lines", "input_hashes"]

DEFAULT_PROFILE = run_options()["profile"].default


@dataclass(frozen=True)
class Cell:
    """One point of a sweep: its position, the axis values that define it, its RunConfig and content hash."""

    index: int
    key: dict[str, Any]
    config: RunConfig
    hash: str
    same_as: int | None = None   # index of the earlier cell that is the same run (dsparksim.sim.reads), if any


def build_config(values: dict[str, Any], source: str = "sweep spec") -> RunConfig:
    """RunConfig for one cell from spec keys (missing keys take `dsparksim run`'s defaults: both build runs with
    :meth:`RunConfig.from_options`, so a cell is exactly the run the CLI would do with the same options)."""

    try:
        if "trace" in values and "time_scale" not in values:
            # the spec's load axis names the traffic mode; a trace under another load would be ignored
            raise ConfigError(source, "trace", "a trace is replayed on a time_scale load axis; set time_scale")
        hit = reserved_kv_conflict(values.get("kv_policy"), values, flags=False)
        if hit:   # a paged-only key the spec set, whatever its value (its default too)
            raise ConfigError(source, *hit)
        # a fitted profile's server (prefill chunk, ...) where the spec sets none, as `dsparksim run` does
        return RunConfig.from_options(fitted_options(values, values.get("profile", DEFAULT_PROFILE)), source)
    except InputError as e:
        # the source once: the inner error of this spec names it already
        raise ConfigError(source, e.field, f"cell {values}: {e.message if e.source == source else e}") from None


def fit_lines(base: Mapping[str, Any], axes: Mapping[str, Any]) -> list[str]:
    """The notes (and cautions) of the fitted profiles the cells of ``base`` x ``axes`` run on: which server
    settings each took from its profile's fit (:func:`build_config`), each line once, and one caution per fitted
    profile for the set values that differ (:func:`dsparksim.cost.fitted.fit_lines`)."""
    names = list(axes)
    values = ({**base, **dict(zip(names, combo))} for combo in itertools.product(*(axes[k] for k in names)))
    return merged_fit_lines(fit_defaults(v.get("profile", DEFAULT_PROFILE), v) for v in values)


def expand(spec: SpecAxes) -> list[Cell]:
    """All cells of a spec, in the order of the axes' cross product (first axis slowest). A cell that differs
    from an earlier one only in options its run never reads (e.g. mtp1's acceptance) is the same run: it shares
    that cell's hash and names it in ``same_as``."""

    names = list(spec.axes)
    built = []
    for combo in itertools.product(*(spec.axes[k] for k in names)):
        key = dict(zip(names, combo))
        built.append((key, build_config({**spec.base, **key}, spec.source)))
    same = same_as([cfg for _, cfg in built])
    cells: list[Cell] = []
    for i, ((key, cfg), s) in enumerate(zip(built, same)):
        cells.append(Cell(index=i, key=key, config=cfg, hash=cells[s].hash if s is not None else cell_hash(cfg),
                          same_as=s))
    return cells


def cell_hash(cfg: RunConfig) -> str:
    """sha256 of the canonical JSON of the config's identity (options its run never reads at their defaults:
    the same run, the same hash), its inputs' content hashes, version and code fingerprint."""

    cfg = identity(cfg)
    payload = {"config": cfg.to_dict(), "inputs": input_hashes(cfg), "dsparksim_version": __version__,
               "code": code_fingerprint()}
    return hashlib.sha256(canonical_json(payload).encode()).hexdigest()


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=True)


def input_hashes(cfg: RunConfig) -> dict[str, str | None]:
    """sha256 of the bytes of every file the run reads (None for an input that is not a file)."""

    t = cfg.traffic
    out = {"profile": _file_sha(_profile_path(cfg.profile)),
           "acceptance": _acceptance_sha(cfg.acceptance),
           "mtp1_acceptance": _acceptance_sha(cfg.mtp1_acceptance)}
    try:
        out["lengths"] = _file_sha(resolve(t.lengths or DEFAULT_LENGTHS, "lengths")[0])
    except InputError:
        out["lengths"] = None  # trace mode with the trace's own lengths and no shipped default present
    out["trace"] = _file_sha(resolve(t.trace, "trace")[0]) if t.trace else None
    return out


def _profile_path(name: str) -> Path | None:

    try:
        return profile_path(name)          # the loader's own rule: a file, else a shipped name
    except InputError:                     # ConfigError included: the run itself reports the missing profile
        return None


def _acceptance_sha(spec: str) -> str | None:

    try:
        ps = parse_spec(spec)
    except InputError:
        return None  # not a source at all: the cell fails when it runs, with this very error
    if ps.path is not None:
        return _file_sha(ps.path)  # a trace, or an engine log (also one named .csv: 'vllm:run.csv')
    return _file_sha(_reference_path())  # parametric models are calibrated on the shipped paper figures


def _reference_path() -> Path:
    return Path(__file__).resolve().parents[1] / "data" / "dspark_acceptance.json"


def _file_sha(path: Path | None) -> str | None:
    if path is None or not Path(path).is_file():
        return None
    st = Path(path).stat()
    return _sha_cached(str(Path(path).resolve()), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=256)
def _sha_cached(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@functools.lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """sha256 over the simulator's source files. Excluded, as they cannot change a simulated result: the sweep
    machinery, the planner (dsparksim.plan), the CLI modules, plotting and the torch runner (dsparksim.backend)."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root).as_posix()
        if rel.startswith(("sweep/", "plan/", "backend/", "cli", "plots")):
            continue
        h.update(rel.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()
