"""Sweep spec files (TOML): which axes, which values, validated before any cell runs.

Format (every key may appear either fixed in ``[base]`` or as a non-empty list in ``[axes]``, never both)::

    [sweep]                      # optional
    name = "example"
    save_requests = false        # also keep each cell's per-request table

    [base]                       # fixed for every cell
    duration_s = 20.0
    domain = "mix:math=1,code=1,chat=1"

    [axes]                       # the cross product of these lists is the set of cells
    policy = ["mtp1", "confidence", "oracle"]
    acceptance = ["dspark", "dflash"]
    concurrency = [1, 8, 32]     # the load axis: concurrency (closed loop) | rate (open loop) | time_scale (trace)
    seed = [0, 1]

    [capacity]                   # only read by `dsparksim capacity`
    [regress]                    # only read by `dsparksim regress`

A table or key that the command at hand does not read ([capacity] and [regress] for `sweep`, [regress] and
``save_requests`` for `capacity`, ...) is named in one note on stderr (:func:`unread_note`); any other table or key
is refused.

Key names: each key is a run option, defined once on the config dataclasses (``dsparksim.config.run_options``),
spelled with underscores or dashes as on the command line (``duration`` or ``duration_s``,
``num-speculative-tokens`` or ``block_size``, ``request_rate`` or ``rate``; see ``KEY_ALIASES``); a key given twice
under two spellings is an error, an unknown key is rejected with the list of known ones. A few keys have no
command-line flag (``drafter``, ``trace_format``, ``max_prompt_tokens``, ``max_output_tokens``). Cells are built by
``RunConfig.from_options`` as ``dsparksim run`` builds its run (same defaults), so a sweep cell is the very run
``dsparksim run`` would do with the same options. Relative paths are relative to the
working directory, as on the command line.
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from dsparksim.config import NUM, run_options, RunConfig
from dsparksim.errors import ConfigError, InputError
from dsparksim.io.textio import decode
from dsparksim.sweep.cells import expand
from dsparksim.acceptance import load_acceptance
from dsparksim.cost.profile import beside_spec_hint, load_profile
from dsparksim.policies import make_policy
from dsparksim.policies.fixed import Fixed
from dsparksim.sim.inputs import check_deployment
from dsparksim.sim.reads import DRAFT_OPTIONS, engine_reads_router, unread_by_all
from dsparksim.sim.routers import router_class
from dsparksim.traffic.build import check_expected_arrivals
from dsparksim.traffic.readers import read_trace
from dsparksim.traffic.sources import resolve

# Every key is a run option defined once, on the config dataclasses (dsparksim.config.run_options).
_OPTIONS = run_options()
RUN_KEYS = tuple(k for k, o in _OPTIONS.items() if o.section == "run")
ENGINE_KEYS = tuple(k for k, o in _OPTIONS.items() if o.section == "engine")
LOAD_KEYS = tuple(k for k, o in _OPTIONS.items() if o.option.load)
TRAFFIC_KEYS = LOAD_KEYS + tuple(k for k, o in _OPTIONS.items() if o.section == "traffic" and not o.option.load)
KEYS = RUN_KEYS + ENGINE_KEYS + TRAFFIC_KEYS
TABLES = ("sweep", "base", "axes", "capacity", "regress")
SWEEP_KEYS = ("name", "save_requests")
MAX_CELLS = 100_000   # cells of one sweep: each is checked, hashed and tabled in memory before any runs

# Command-line spellings (dashes become underscores first) -> the spec's key.
KEY_ALIASES = {alias: k for k, o in _OPTIONS.items() for alias in o.aliases}


def canonical_key(key: str) -> str:
    """The spec key for a key spelled as a CLI option (``num-speculative-tokens`` -> ``block_size``)."""
    k = key.lstrip("-").replace("-", "_")
    return KEY_ALIASES.get("k" if k == "K" else k, k)


def _canonical_table(source: str, table: str, d: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    for k, v in d.items():
        c = canonical_key(k) if table in ("base", "axes") else k.replace("-", "_")
        if c in out:
            raise ConfigError(source, f"{table}.{k}", f"same key as {table}.{spelled[c]} (both mean {c!r}); "
                              "keep one")
        out[c], spelled[c] = v, k
    return out


# The value types each key accepts in the TOML (checked here so the error names the spec field; ranges are checked
# by the config dataclasses when the cells are built).
TYPES: dict[str, tuple[type, ...]] = {k: o.option.kinds for k, o in _OPTIONS.items()}


@dataclass(frozen=True)
class SweepSpec:
    """A parsed, validated sweep spec. ``axes`` keeps the file's order (it fixes the cell order)."""

    source: str
    name: str
    base: Mapping[str, Any]
    axes: Mapping[str, tuple[Any, ...]]
    save_requests: bool = False
    capacity: Mapping[str, Any] = field(default_factory=dict)
    regress: Mapping[str, Any] = field(default_factory=dict)

    @property
    def load_key(self) -> str:
        """Which load axis the spec uses (concurrency when none is named, as ``dsparksim run``)."""
        for k in LOAD_KEYS:
            if k in self.axes or k in self.base:
                return k
        return "concurrency"

    def n_cells(self) -> int:
        """Cells of the sweep: the product of its axes' lengths."""
        n = 1
        for v in self.axes.values():
            n *= len(v)
        return n

    def to_dict(self) -> dict[str, Any]:
        """The spec as plain values (sweep.json's ``spec``)."""
        return {"source": self.source, "name": self.name, "save_requests": self.save_requests,
                "base": dict(self.base), "axes": {k: list(v) for k, v in self.axes.items()},
                "capacity": dict(self.capacity), "regress": dict(self.regress)}

    def with_axes(self, **axes: Any) -> "SweepSpec":
        """A copy with some axes replaced (a value that is not a list becomes a fixed base value)."""
        b, a = dict(self.base), dict(self.axes)
        for k, v in axes.items():
            k = canonical_key(k)
            a.pop(k, None)
            b.pop(k, None)
            if isinstance(v, (list, tuple)):
                a[k] = tuple(v)
            else:
                b[k] = v
        return spec_from_dict({"sweep": {"name": self.name, "save_requests": self.save_requests}, "base": b,
                               "axes": {k: list(v) for k, v in a.items()}, "capacity": dict(self.capacity),
                               "regress": dict(self.regress)}, source=self.source)


def read_toml(path: str | Path, label: str) -> dict[str, Any]:
    """The parsed TOML file; InputError naming the file when it cannot be read or is not UTF-8 TOML (a leading BOM
    is dropped: tomllib refused such a file with 'Invalid statement (at line 1, column 1)')."""
    if not str(path).strip():
        raise InputError(repr(str(path)), None, f"expected the path of a {label} file, got an empty path")
    p = Path(path)
    if p.is_dir():
        raise InputError(str(p), None, f"is a directory; expected a {label} file (TOML)")
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise InputError(str(p), None, f"cannot read {label}: {e.strerror or e}") from None
    text = decode(raw, str(p))   # a leading UTF-8 BOM (Windows editors) dropped, as every text input's
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise InputError(str(p), None, f"not valid TOML: {e}") from None


def load_spec(path: str | Path) -> SweepSpec:
    """Read and validate a TOML sweep spec (structure, types, policies, input files) -- no cell runs."""
    return spec_from_dict(read_toml(path, "sweep spec"), source=str(Path(path)))


def spec_from_dict(d: Mapping[str, Any], source: str = "sweep spec", check_inputs: bool = True) -> SweepSpec:
    """Validate a spec given as a dict (the parsed TOML). ``check_inputs`` also opens every named input."""
    if not isinstance(d, Mapping):
        raise ConfigError(source, None, f"expected a table, got {type(d).__name__}")
    for t in d:
        if t not in TABLES:
            what = f"table [{t}]" if isinstance(d[t], Mapping) else f"top-level key {t!r} (keys belong in a table)"
            raise ConfigError(source, t, f"unknown {what}; expected some of the tables {', '.join(TABLES)}")
        if not isinstance(d[t], Mapping):
            raise ConfigError(source, t, f"expected a table [{t}], got {d[t]!r}")
    d = {t: _canonical_table(source, t, v) for t, v in d.items()}
    if not d.get("base") and not d.get("axes"):
        raise ConfigError(source, None, "has no [base] or [axes] keys: nothing to sweep (an empty spec would run "
                          "one default cell)")
    sw = dict(d.get("sweep", {}))
    for k in sw:
        if k not in SWEEP_KEYS:
            raise ConfigError(source, f"sweep.{k}", f"unknown key; expected some of {', '.join(SWEEP_KEYS)}")
    name = sw.get("name", Path(source).stem)
    if not isinstance(name, str):
        raise ConfigError(source, "sweep.name", f"expected a string, got {name!r}")
    save_req = sw.get("save_requests", False)
    if not isinstance(save_req, bool):
        raise ConfigError(source, "sweep.save_requests", f"expected true or false, got {save_req!r}")
    base = {k: check_value(source, f"base.{k}", k, v) for k, v in dict(d.get("base", {})).items()}
    axes: dict[str, tuple[Any, ...]] = {}
    for k, vals in dict(d.get("axes", {})).items():
        if k in base:
            raise ConfigError(source, f"axes.{k}", f"also fixed in [base] ({base[k]!r}); keep one of the two")
        if not isinstance(vals, list):
            raise ConfigError(source, f"axes.{k}", f"an axis is a list of values, got {vals!r} (fixed values "
                              "belong in [base])")
        if not vals:
            raise ConfigError(source, f"axes.{k}", "empty axis: give at least one value")
        checked = tuple(check_value(source, f"axes.{k}[{i}]", k, v) for i, v in enumerate(vals))
        seen = set()
        for i, v in enumerate(checked):
            if v in seen:
                raise ConfigError(source, f"axes.{k}[{i}]", f"duplicate value {v!r} (each cell would run twice)")
            seen.add(v)
        axes[k] = checked
    loads = [k for k in LOAD_KEYS if k in axes or k in base]
    if len(loads) > 1:
        raise ConfigError(source, loads[1], f"only one load key may be set, got {loads} (concurrency = closed loop, "
                          "rate = open loop, time_scale = trace replay)")
    spec = SweepSpec(source=source, name=name, base=base, axes=axes, save_requests=save_req,
                     capacity=dict(d.get("capacity", {})), regress=dict(d.get("regress", {})))
    _check_semantics(spec, check_inputs)
    return spec


def unread_note(spec: SweepSpec, command: str) -> str | None:
    """One line naming what of ``spec`` the spec-driven ``command`` (sweep, capacity, regress) does not read (one
    file format serves all three: [capacity] is read by `capacity` only, [regress] by `regress` only,
    sweep.save_requests by `sweep` only), or None when it reads all of it. Nothing is silently ignored."""
    parts = [f"{what} (read by `dsparksim {reader}`)" for what, reader, given in (
        ("[capacity]", "capacity", bool(spec.capacity)), ("[regress]", "regress", bool(spec.regress)),
        ("sweep.save_requests", "sweep", spec.save_requests)) if given and reader != command]
    if not parts:
        return None
    return f"dsparksim: note: {spec.source}: `dsparksim {command}` does not read {' or '.join(parts)}; ignored here"


def check_value(source: str, where: str, key: str, v: Any) -> Any:
    """The value ``v`` of run option ``key`` at ``where`` in a spec, type-checked (NUM values as floats); raises
    ConfigError naming ``source`` and ``where`` for an unknown key or a value of the wrong type."""
    if key not in TYPES:
        raise ConfigError(source, where, f"unknown key {key!r}; known keys: {', '.join(KEYS)} (or their "
                          f"command-line spellings: {', '.join(sorted(KEY_ALIASES))})")
    want = TYPES[key]
    ok = isinstance(v, want) and not (isinstance(v, bool) and bool not in want)
    if not ok:
        names = " or ".join(t.__name__ for t in want)
        raise ConfigError(source, where, f"expected {names}, got {v!r}")
    if isinstance(v, int) and not isinstance(v, bool) and not -2**63 <= v < 2**63:
        # TOML integers are 64-bit (tomllib reads larger ones); results.parquet stores axis values as int64
        raise ConfigError(source, where, f"expected a 64-bit integer (TOML's range, -2^63 .. 2^63 - 1), got {v}")
    return float(v) if want is NUM else v


def _values(spec: SweepSpec, key: str) -> list[tuple[str, Any]]:
    """(spec field, value) for every value a key takes in the spec."""
    if key in spec.axes:
        return [(f"axes.{key}[{i}]", v) for i, v in enumerate(spec.axes[key])]
    if key in spec.base:
        return [(f"base.{key}", spec.base[key])]
    return []


def _check_semantics(spec: SweepSpec, check_inputs: bool) -> None:
    """Policies parse, named inputs exist and load; every cell's configuration is constructible."""

    src = spec.source
    if spec.n_cells() > MAX_CELLS:   # 1000 x 1000 x 2 cells: 2 GB and a minute of checking without a word, then more
        sizes = " x ".join(f"{len(v)} {k}" for k, v in spec.axes.items())
        raise ConfigError(src, "axes", f"{sizes} = {spec.n_cells():,} cells, above the limit of {MAX_CELLS:,} per "
                          "sweep: split it into several sweeps")
    for where, pol in _values(spec, "policy"):
        try:
            make_policy(pol)
        except InputError as e:
            raise ConfigError(src, where, f"invalid policy spec {pol!r}: {e}") from None
    for key in ("arrival", "burstiness"):
        if _values(spec, key) and spec.load_key != "rate":
            raise ConfigError(src, _values(spec, key)[0][0], f"applies to open-loop arrivals only (a rate load); "
                              f"this spec's load is {spec.load_key}")
    if spec.load_key == "time_scale" and not _values(spec, "trace"):
        raise ConfigError(src, "base.trace", "a time_scale load axis replays a trace: set trace")
    if check_inputs:
        _check_inputs(spec)
    cells = expand(spec)  # builds every RunConfig: raises ConfigError naming the spec and the cell's values
    _check_unread(spec)   # after the values themselves are known valid
    _check_fixed_lengths(spec, cells)
    if check_inputs:
        _check_deployments(spec, cells)


def _check_unread(spec: SweepSpec) -> None:
    """An option that no policy of the spec reads would change no cell: refused, as `run` and `frontier` refuse it
    (dsparksim.sim.reads); so is a router when every cell runs one engine."""

    policies = [v for _, v in _values(spec, "policy")] or [RunConfig.policy]
    for key in DRAFT_OPTIONS:
        vals = _values(spec, key)
        hit = unread_by_all(policies, [key]) if vals else None
        if hit:
            raise ConfigError(spec.source, vals[0][0].split("[")[0], f"has no effect: no policy of this sweep "
                              f"reads {key} ({hit[1]}); remove it")
    vals = _values(spec, "router")
    if vals:
        reps = [v for _, v in _values(spec, "replicas")] or [1]
        dps = [v for _, v in _values(spec, "dp_ranks")] or [1]
        if not any(engine_reads_router(r, d) for r in reps for d in dps):
            raise ConfigError(spec.source, vals[0][0].split("[")[0], "has no effect on one engine (every cell "
                              "runs replicas x dp_ranks = 1): set replicas or dp_ranks above 1, or remove it")


def _check_fixed_lengths(spec: SweepSpec, cells: list) -> None:
    """A ``fixed:k`` cell with k above its block size K would run as fixed:K under its own name (the policy verifies
    min(k, K)): refused, naming the cell, as `run`, `frontier` and `plan` refuse it."""

    for cell in cells:
        pol, K = make_policy(cell.config.policy), cell.config.engine.block_size
        if isinstance(pol, Fixed) and pol.k > K:
            where = ", ".join(f"{k}={v}" for k, v in cell.key.items()) or "base"
            raise ConfigError(spec.source, f"cell {where}", f"{pol.spec} verifies {pol.k} draft tokens but a block "
                              f"holds only K={K} (block_size); expected fixed:k with k <= {K} (a fixed length "
                              "that follows K needs one sweep per block size)")


def _check_deployments(spec: SweepSpec, cells: list) -> None:
    """Before any cell runs, as `run` checks them before its run: every cell's deployment against its profile (a
    disaggregated cell can price its KV transfer; a tensor_parallel_size is the profile's), an open-loop cell's
    expected arrivals within the per-run limit, and a token budget that holds one request's 1 + K verify tokens
    (each failed every cell at run time, listed as a failure to retry)."""

    profiles: dict[str, Any] = {}
    for cell in cells:
        cfg = cell.config
        if cfg.profile not in profiles:
            profiles[cfg.profile] = load_profile(cfg.profile)
        t, eng = cfg.traffic, cfg.engine
        try:
            check_deployment(cfg, profiles[cfg.profile])
            if t.rate is not None and t.duration_s is not None:
                check_expected_arrivals(t.rate * t.time_scale, t.duration_s)
            forced = make_policy(cfg.policy).block_size      # mtp1 -> 1, none -> 0, else the run's K
            K = eng.block_size if forced is None else forced
            if eng.max_batched_tokens is not None and eng.max_batched_tokens < 1 + K:
                raise ConfigError("config", "max_batched_tokens", f"{eng.max_batched_tokens} cannot hold even one "
                                  f"request's 1+K={1 + K} verify tokens")
        except ConfigError as e:
            where = ", ".join(f"{k}={v}" for k, v in cell.key.items()) or "base"
            raise ConfigError(spec.source, f"cell {where}", str(e)) from None


def _check_inputs(spec: SweepSpec) -> None:

    src = spec.source
    for where, prof in _values(spec, "profile"):
        try:
            load_profile(prof)
        except InputError as e:
            raise ConfigError(src, where, f"profile {prof!r} cannot be loaded: {e}"
                              f"{beside_spec_hint(prof, src)}") from None
    ks = sorted({int(v) for _, v in _values(spec, "block_size")} or {7})
    for key, kset in (("acceptance", ks), ("mtp1_acceptance", [1])):
        for where, acc in _values(spec, key):
            for K in kset:
                try:
                    load_acceptance(acc, K)
                except (InputError, OSError) as e:
                    raise ConfigError(src, where, f"acceptance source {acc!r} (K={K}) cannot be loaded: {e}") from None
    tables = {}
    for key in ("lengths", "trace"):
        for where, val in _values(spec, key):
            try:
                path, _ = resolve(val, key)
                tables[(key, val)] = read_trace(path, spec.base.get("trace_format") if key == "trace" else None)
            except (InputError, OSError) as e:
                raise ConfigError(src, where, f"{key} {val!r} cannot be read: {e}") from None
    for where, r in _values(spec, "router"):
        if not router_class(r)[0].needs_session:
            continue
        traces = _values(spec, "trace")
        bare = [v for _, v in traces if tables[("trace", v)].session is None]
        if not traces or bare:
            raise ConfigError(src, where, f"router {r!r} needs session or prefix ids, which "
                              + (f"trace {bare[0]!r} does not carry" if traces else "only a replayed trace carries")
                              + " (Mooncake traces carry hash_ids)")
