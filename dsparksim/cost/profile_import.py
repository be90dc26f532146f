"""Import the step-cost tables engines already write into a dsparksim :class:`CostProfile`.

Formats (field semantics read from the public loaders; the code here is our own):

* ``vllm`` / ``sglang`` -- ``SpsCostTable`` JSON: ``sample_batch_tokens`` (strictly increasing probes, total
  verified tokens M incl. each request's bonus position), ``sample_steps_per_sec`` (measured target steps per
  second at each probe), ``max_batch_tokens`` (>= the last probe). The engine looks up by FLOOR over the probes
  and CLAMPS outside them (below the first probe -> first; above the last, up to max_batch_tokens -> last).
  SPS is measured on whole decode steps, so the per-step floor (host overhead, batch term, and in a live
  sweep also drafting) is folded into 1/SPS: the imported profile has verify_time = 1/SPS and
  fixed_overhead_s = 0, and says so in its metadata.
* ``sglang`` additive table (sniffed by ``bias_seconds``): T(R, M) = bias_seconds + alpha(R) + theta(M) with
  ``bs_probes``/``alpha_seconds`` and ``m_probes``/``theta_seconds``, looked up by clamped LINEAR interpolation.
  Imported as fixed_overhead_s = bias, batch_overhead = alpha, verify = theta.
* ``trt`` -- TensorRT-LLM ``sps_table.json``: ``token_counts``, ``step_time_ms`` (theta(M) = the verify term
  only), optional ``fixed_overhead_ms`` (bias, default 0), ``batch_sizes``/``batch_overhead_ms`` (alpha(bs),
  default none). Current TensorRT-LLM interpolates linearly (tables carry ``_meta.lookup == "interp"``); older
  tables were written for floor lookup. ``lookup="auto"`` follows the marker.

dsparksim always looks up by floor over integer breakpoints. An interpolating table is converted EXACTLY for
integer M by densifying it: one breakpoint at every integer between its first and last probe, valued by the
engine's own linear interpolation. Breakpoints at 0 (TensorRT-LLM allows M=0) are mapped onto M=1 with the
same floor/interp meaning. Nothing is extended beyond the table unless ``engine_clamp=True``, which reproduces
the engine's clamp by adding breakpoints at 1 and at max_batch_tokens (recorded in metadata).

Imported tables carry no drafter cost, KV capacity or max_model_len. Pass ``drafters_from`` (a profile name or
path) to copy its drafters (recorded in metadata), and/or :func:`complete_profile` to add the KV capacity,
max_model_len and flat per-forward drafter costs (``dsparksim profile import --kv-capacity-tokens N
--max-model-len N --drafter-cost NAME[:KIND]=SECONDS``); all recorded in metadata. :func:`run_readiness` lists what
a default ``dsparksim run --profile`` would still need. Without drafters, ``draft_time`` raises a ConfigError that
says how to add them.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from dsparksim.errors import InputError
from dsparksim.io.textio import MAX_EXACT_INT, decode, finite_float, loads_json, escape_controls, read_bytes
from dsparksim.cost.profile import FORMAT, CostProfile, load_profile, profile_from_dict, profile_to_dict

__all__ = ["FORMATS", "import_sps_table", "import_sps_dict", "parse_drafter_cost", "complete_profile", "run_readiness"]

FORMATS = ("vllm", "sglang", "trt")
LOOKUPS = ("auto", "floor", "interp")
MAX_DENSIFY = 1 << 17  # an interpolating table wider than this many tokens is refused rather than approximated


def _short(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 80 else r[:77] + "..."


class _Src:
    def __init__(self, source: str):
        self.source = source

    def err(self, fld: str, msg: str) -> InputError:
        return InputError(self.source, escape_controls(fld), escape_controls(msg))

    def field(self, d: Mapping[str, Any], key: str, required: bool = True, default: Any = None) -> Any:
        if key not in d:
            if required:
                raise self.err(key, f"missing (present keys: {', '.join(sorted(map(str, d))) or 'none'})")
            return default
        return d[key]

    def ints(self, v: Any, fld: str, min_first: int) -> list[int]:
        if not isinstance(v, list) or not v:
            raise self.err(fld, f"expected a non-empty list of integers, got {_short(v)}")
        out = []
        for i, x in enumerate(v):
            if isinstance(x, bool) or not (isinstance(x, int) or (isinstance(x, float) and x.is_integer())):
                raise self.err(fld, f"(index {i}): expected an integer, got {_short(x)}")
            if abs(x) > MAX_EXACT_INT:
                raise self.err(fld, f"(index {i}): expected an integer of magnitude <= {MAX_EXACT_INT} (2^53-1), "
                                    f"got {_short(x)}")
            out.append(int(x))
        if out[0] < min_first:
            raise self.err(fld, f"(index 0): expected >= {min_first}, got {out[0]}")
        for i in range(1, len(out)):
            if out[i] <= out[i - 1]:
                raise self.err(fld, f"(index {i}): must be strictly increasing, got {out[i]} after {out[i - 1]}")
        return out

    def floats(self, v: Any, fld: str, n: int, positive: bool) -> list[float]:
        if not isinstance(v, list):
            raise self.err(fld, f"expected a list of {n} numbers, got {type(v).__name__}")
        if len(v) != n:
            raise self.err(fld, f"length mismatch: {len(v)} values for {n} breakpoints")
        for i, x in enumerate(v):
            f = finite_float(x)
            if f is None or (f <= 0 if positive else f < 0):
                raise self.err(fld, f"(index {i}): expected a finite number {'> 0' if positive else '>= 0'}, "
                                    f"got {_short(x)}")
        return [float(x) for x in v]

    def scalar(self, v: Any, fld: str, positive: bool) -> float:
        f = finite_float(v)
        if f is None or (f <= 0 if positive else f < 0):
            raise self.err(fld, f"expected a finite number {'> 0' if positive else '>= 0'}, got {_short(v)}")
        return float(v)


def _to_floor(xs: list[int], ys: list[float], lookup: str, src: _Src, fld: str, notes: list[str]
              ) -> tuple[list[int], list[float]]:
    """Express an engine table (floor or interp semantics) as floor breakpoints over integers >= 1."""
    x = np.asarray(xs, dtype=np.int64)
    y = np.asarray(ys, dtype=np.float64)
    if lookup == "interp" and len(x) > 1:
        lo, hi = max(int(x[0]), 1), int(x[-1])
        if hi - lo + 1 > MAX_DENSIFY:
            raise src.err(fld, f"interpolating table spans {hi - lo + 1} tokens, more than {MAX_DENSIFY} to densify; "
                               "import with lookup='floor' if the table was written for floor lookup")
        grid = np.arange(lo, hi + 1, dtype=np.int64)
        vals = np.interp(grid.astype(np.float64), x.astype(np.float64), y)
        notes.append(f"{fld}: engine interpolates linearly; densified to {len(grid)} integer breakpoints "
                     f"{lo}..{hi} (exact for integer token counts)")
        return [int(v) for v in grid], [float(v) for v in vals]
    if x[0] == 0:
        if len(x) > 1 and x[1] == 1:
            notes.append(f"{fld}: breakpoint 0 dropped (the breakpoint at 1 covers every M >= 1)")
            x, y = x[1:], y[1:]
        else:
            notes.append(f"{fld}: breakpoint 0 moved to 1 (same floor value for every M >= 1)")
            x = x.copy()
            x[0] = 1
    return [int(v) for v in x], [float(v) for v in y]


def _clamp_extend(xs: list[int], ys: list[float], hi: int | None, fld: str, notes: list[str],
                  hi_why: str = "max_batch_tokens") -> tuple[list[int], list[float]]:
    """Reproduce an engine's clamp: hold the first value down to 1 and the last value up to `hi`."""
    xs, ys = list(xs), list(ys)
    if xs[0] > 1:
        notes.append(f"{fld}: engine clamp reproduced: breakpoint 1 added with the value at {xs[0]}")
        xs.insert(0, 1)
        ys.insert(0, ys[0])
    if hi is not None and hi > xs[-1]:
        notes.append(f"{fld}: engine clamp reproduced: breakpoint {hi} ({hi_why}) added with the value at "
                     f"{xs[-1]} -- the range {xs[-1]}..{hi} was NOT measured")
        xs.append(hi)
        ys.append(ys[-1])
    return xs, ys


# The engine clamps its batch-size axis above the last probe too; a step never holds more decoding requests than
# tokens, so the last value held up to the verify table's last M covers every batch a run can form.
_BATCH_HI = "the verify table's last M: no step has more requests than tokens"


def import_sps_dict(data: Any, fmt: str, *, source: str = "<dict>", name: str | None = None,
                    drafters_from: str | Path | CostProfile | None = None, lookup: str = "auto",
                    engine_clamp: bool = False, metadata: Mapping[str, Any] | None = None,
                    source_sha256_16: str | None = None) -> CostProfile:
    """Convert a parsed engine table (see module doc) into a validated CostProfile."""
    if fmt not in FORMATS:
        raise InputError(source, "format", f"unknown import format {fmt!r}; expected one of {', '.join(FORMATS)}")
    if lookup not in LOOKUPS:
        raise InputError(source, "lookup", f"expected one of {', '.join(LOOKUPS)}, got {lookup!r}")
    s = _Src(source)
    if not isinstance(data, Mapping):
        raise s.err("", f"expected a JSON object at the top level, got {type(data).__name__}")
    notes: list[str] = []
    missing = ["drafter costs (not in engine SPS tables)",
               "context axis (the table is 1-D in batch tokens, measured at the profiler's context lengths)"]
    imported: dict[str, Any] = {"format": fmt}
    if fmt in ("vllm", "sglang"):
        read = _read_sps if "bias_seconds" not in data else _read_additive
    else:
        read = _read_trt
    vx, vy, fixed, batch = read(s, data, lookup, engine_clamp, notes, imported, missing)
    meta: dict[str, Any] = {"device": "unknown", "model": "unknown", "dtype": "unknown", "tensor_parallel": None}
    drafters = _copy_drafters(drafters_from, imported, meta, missing) if drafters_from is not None else {}
    meta.update(dict(metadata or {}))
    meta.update({
        "source": source, "method": f"imported from a {fmt} step-cost table by dsparksim.cost.profile_import",
        "date": meta.get("date") or _dt.date.today().isoformat(),
        "imported": {**imported, **({"sha256_16": source_sha256_16} if source_sha256_16 else {})},
        "import_notes": notes, "missing": missing,
    })
    out = {"format": FORMAT, "name": name or Path(source).stem, "metadata": meta,
           "verify": {"M": vx, "time_s": vy}, "fixed_overhead_s": fixed, "drafters": drafters}
    if batch is not None:
        out["batch_overhead"] = batch
    return profile_from_dict(out, source)


def _read_sps(s: "_Src", data: Mapping[str, Any], lookup: str, engine_clamp: bool, notes: list[str],
              imported: dict[str, Any], missing: list[str]) -> tuple[list[int], list[float], float, dict | None]:
    """vLLM/SGLang SpsCostTable: 1/SPS per probed batch size, the floor folded into every probe."""
    fixed, batch = 0.0, None
    xs = s.ints(s.field(data, "sample_batch_tokens"), "sample_batch_tokens", 1)
    sps = s.floats(s.field(data, "sample_steps_per_sec"), "sample_steps_per_sec", len(xs), positive=True)
    mbt = s.field(data, "max_batch_tokens")
    if isinstance(mbt, bool) or not isinstance(mbt, int) or not xs[-1] <= mbt <= MAX_EXACT_INT:
        raise s.err("max_batch_tokens", f"expected an integer >= the largest probe {xs[-1]} (and <= 2^53-1), "
                                        f"got {_short(mbt)}")
    use = "floor" if lookup == "auto" else lookup
    vx, vy = _to_floor(xs, [1.0 / v for v in sps], use, s, "sample_batch_tokens", notes)
    if engine_clamp:
        vx, vy = _clamp_extend(vx, vy, mbt, "verify.M", notes)
    elif mbt > vx[-1]:
        notes.append(f"max_batch_tokens {mbt} is above the last probe {vx[-1]}: runs default to a {vx[-1]}-token "
                     f"budget (the measured range); engine_clamp (--engine-clamp) prices M up to {mbt} as the "
                     "engine does")
    imported.update(table="SpsCostTable", engine_lookup="floor with clamp at both ends",
                    lookup_used=use, probes=len(xs), max_batch_tokens=mbt)
    notes.append("verify.time_s = 1 / sample_steps_per_sec; fixed_overhead_s = 0 because SPS is measured on "
                 "whole decode steps, which folds the per-step floor (host overhead, batch term and, in a "
                 "live sweep, drafting) into every probe")
    missing.append("a separate non-trimmable floor (folded into 1/SPS)")
    return vx, vy, fixed, batch


def _read_additive(s: "_Src", data: Mapping[str, Any], lookup: str, engine_clamp: bool, notes: list[str],
                   imported: dict[str, Any], missing: list[str]) -> tuple[list[int], list[float], float, dict | None]:
    """vLLM/SGLang SpsAdditiveCostTable: bias + alpha(bs) + theta(M)."""
    bias = s.scalar(s.field(data, "bias_seconds"), "bias_seconds", positive=False)
    bs = s.ints(s.field(data, "bs_probes"), "bs_probes", 0)
    al = s.floats(s.field(data, "alpha_seconds"), "alpha_seconds", len(bs), positive=False)
    ms = s.ints(s.field(data, "m_probes"), "m_probes", 0)
    th = s.floats(s.field(data, "theta_seconds"), "theta_seconds", len(ms), positive=True)
    use = "interp" if lookup == "auto" else lookup
    vx, vy = _to_floor(ms, th, use, s, "m_probes", notes)
    bx, by = _to_floor(bs, al, use, s, "bs_probes", notes)
    if engine_clamp:
        vx, vy = _clamp_extend(vx, vy, None, "verify.M", notes)
        bx, by = _clamp_extend(bx, by, vx[-1], "batch_overhead.n_req", notes, _BATCH_HI)
    fixed, batch = bias, {"n_req": bx, "time_s": by}
    imported.update(table="SpsAdditiveCostTable", engine_lookup="clamped linear interpolation",
                    lookup_used=use, m_probes=len(ms), bs_probes=len(bs))
    notes.append("fixed_overhead_s = bias_seconds; batch_overhead = alpha(bs); verify = theta(M)")
    return vx, vy, fixed, batch


def _read_trt(s: "_Src", data: Mapping[str, Any], lookup: str, engine_clamp: bool, notes: list[str],
              imported: dict[str, Any], missing: list[str]) -> tuple[list[int], list[float], float, dict | None]:
    """TensorRT-LLM sps_table.json: theta(M), fixed overhead and batch overhead in ms."""
    batch = None
    xs = s.ints(s.field(data, "token_counts"), "token_counts", 0)
    ms_ = s.floats(s.field(data, "step_time_ms"), "step_time_ms", len(xs), positive=True)
    fixed = s.scalar(s.field(data, "fixed_overhead_ms", required=False, default=0.0), "fixed_overhead_ms",
                     positive=False) / 1e3
    bsz = s.field(data, "batch_sizes", required=False, default=[])
    bov = s.field(data, "batch_overhead_ms", required=False, default=[])
    meta_in = data.get("_meta") if isinstance(data.get("_meta"), Mapping) else {}
    marker = meta_in.get("lookup")
    use = lookup if lookup != "auto" else ("interp" if marker == "interp" else "floor")
    vx, vy = _to_floor(xs, [v / 1e3 for v in ms_], use, s, "token_counts", notes)
    if bsz or bov:
        bx_ = s.ints(bsz, "batch_sizes", 0)
        by_ = s.floats(bov, "batch_overhead_ms", len(bx_), positive=False)
        bx, by = _to_floor(bx_, [v / 1e3 for v in by_], use, s, "batch_sizes", notes)
        if engine_clamp:
            bx, by = _clamp_extend(bx, by, vx[-1], "batch_overhead.n_req", notes, _BATCH_HI)
        batch = {"n_req": bx, "time_s": by}
    if engine_clamp:
        vx, vy = _clamp_extend(vx, vy, None, "verify.M", notes)
    imported.update(table="TensorRT-LLM sps_table.json", engine_lookup="clamped linear interpolation "
                    "(current); floor (tables without _meta.lookup='interp')", lookup_marker=marker,
                    lookup_used=use, token_counts=len(xs), batch_sizes=len(bsz) if bsz else 0,
                    synthetic=bool(data.get("SYNTHETIC", False)))
    if meta_in:
        imported["engine_meta"] = json.loads(json.dumps(meta_in))
    notes.append("verify.time_s = step_time_ms / 1000 (theta(M), the verify term only); fixed_overhead_s = "
                 "fixed_overhead_ms / 1000; batch_overhead = batch_overhead_ms / 1000")
    if "fixed_overhead_ms" not in data:
        notes.append("fixed_overhead_ms absent: the engine then assumes step_time_ms already measures whole "
                     "steps, so fixed_overhead_s = 0")
    if data.get("SYNTHETIC"):
        notes.append("the table is marked SYNTHETIC: it is not a measurement")
    return vx, vy, fixed, batch


def _copy_drafters(drafters_from: str | Path | CostProfile, imported: dict[str, Any], meta: dict[str, Any],
                   missing: list[str]) -> dict[str, Any]:
    """--drafters-from: another profile's drafter costs, said so in ``meta`` (and dropped from ``missing``)."""
    dp = drafters_from if isinstance(drafters_from, CostProfile) else load_profile(drafters_from)
    drafters = profile_to_dict(dp)["drafters"]
    if not drafters:
        raise InputError(dp.source, "drafters", f"--drafters-from profile '{dp.name}' has no drafters to copy")
    meta["drafters_from"] = {"profile": dp.name, "source": dp.source, "drafters": sorted(drafters),
                             "note": "drafter costs copied from another profile, not measured with this table"}
    if imported["table"] == "SpsCostTable":
        meta["drafters_from"]["warning"] = ("SPS measured on whole steps may already include drafting; "
                                            "adding copied drafter costs can count it twice")
    missing[:] = [m for m in missing if not m.startswith("drafter costs")]
    return drafters


def import_sps_table(path: str | Path, fmt: str, **kw: Any) -> CostProfile:
    """Read an engine table file and convert it (keyword arguments as :func:`import_sps_dict`)."""
    path = Path(path)
    raw = read_bytes(path, "engine table")
    data = loads_json(decode(raw, str(path), bom=False), str(path), label="not valid JSON")
    return import_sps_dict(data, fmt, source=str(path), source_sha256_16=hashlib.sha256(raw).hexdigest()[:16], **kw)


# ------------------------------------------------------------------------------------------ runnable profile
# Kind of a drafter named on the command line without one (the names the shipped profiles and acceptance use).
DRAFTER_KINDS_BY_NAME = {"dspark": "parallel", "dflash": "parallel", "eagle3": "autoregressive", "mtp1": "mtp",
                         "mtp": "chain"}   # mtp: the MTP module chained K times (acceptance kind `mtp`)
_DRAFTER_COST_SRC = "--drafter-cost"


def parse_drafter_cost(text: str) -> tuple[str, str, float]:
    """``NAME=SECONDS`` or ``NAME:KIND=SECONDS`` -> (name, kind, seconds of one drafter forward)."""
    spec, eq, sec = str(text).partition("=")
    name, colon, kind = spec.strip().partition(":")
    name, kind = name.strip(), kind.strip()
    if not eq or not name:
        raise InputError(_DRAFTER_COST_SRC, None, f"expected NAME=SECONDS or NAME:KIND=SECONDS, got {text!r}")
    if not colon:
        if name not in DRAFTER_KINDS_BY_NAME:
            raise InputError(_DRAFTER_COST_SRC, name,
                             f"no default kind for drafter {name!r}: write {name}:KIND=SECONDS with KIND one of "
                             f"{', '.join(('parallel', 'autoregressive', 'mtp', 'chain'))}")
        kind = DRAFTER_KINDS_BY_NAME[name]
    elif kind not in ("parallel", "autoregressive", "mtp", "chain"):
        raise InputError(_DRAFTER_COST_SRC, name, f"unknown kind {kind!r}; expected parallel, autoregressive, mtp "
                         "or chain")
    try:
        s = float(sec)
    except ValueError:
        s = float("nan")
    if not (math.isfinite(s) and s >= 0):
        raise InputError(_DRAFTER_COST_SRC, name, f"expected SECONDS as a finite number >= 0, got {sec.strip()!r}")
    return name, kind, s


def _positive_int(v: Any, fld: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise InputError("profile import", fld, f"expected an integer >= 1, got {v!r}")
    return int(v)


def complete_profile(p: CostProfile, *, kv_capacity_tokens: int | None = None, max_model_len: int | None = None,
                     drafter_costs: Any = ()) -> CostProfile:
    """Add what an engine table does not carry but a run needs, each recorded in the metadata.

    kv_capacity_tokens -> metadata.kv_capacity_tokens (the engine's KV cache in tokens, as vLLM logs it);
    max_model_len      -> metadata.max_model_len (longest prompt+output the engine accepts; <= the KV capacity);
    drafter_costs      -> (name, kind, seconds) from :func:`parse_drafter_cost`: a drafter whose one forward costs
                          ``seconds`` at every batch size (flat over tokens 1..the profile's last breakpoint).
                          It replaces a drafter of the same name copied with ``drafters_from``.
    """
    d = profile_to_dict(p)
    meta = dict(d["metadata"])
    missing = list(meta.get("missing", []))
    if kv_capacity_tokens is not None:
        meta["kv_capacity_tokens"] = _positive_int(kv_capacity_tokens, "--kv-capacity-tokens")
    if max_model_len is not None:
        meta["max_model_len"] = _positive_int(max_model_len, "--max-model-len")
    kv = meta.get("kv_capacity_tokens")
    if kv is not None and meta.get("max_model_len") is not None and meta["max_model_len"] > kv:
        # vLLM refuses to start in this case: one sequence of max_model_len must fit in the KV cache
        raise InputError("profile import", "--max-model-len",
                         f"{meta['max_model_len']} exceeds the KV capacity {kv} tokens: one request of that length "
                         "could never be admitted")
    costs = list(drafter_costs or ())
    if costs:
        top = max(p.max_tokens, 1)
        axis = [1, top] if top > 1 else [1]
        given = {}
        for name, kind, sec in costs:
            if name in given:
                raise InputError(_DRAFTER_COST_SRC, name, "given twice")
            # 0 is allowed: drafting already folded into a whole-step SPS measurement
            d["drafters"][name] = {"kind": kind, "tokens": axis, "time_s": [sec] * len(axis),
                                   "note": f"flat {sec:g} s per forward from {_DRAFTER_COST_SRC} (not measured)"}
            given[name] = {"kind": kind, "seconds_per_forward": sec}
        meta["drafter_costs"] = {"drafters": given, "source": f"{_DRAFTER_COST_SRC} on the import command line",
                                 "note": "flat over batch size, not measured with this table"}
        if meta.get("imported", {}).get("table") == "SpsCostTable" and any(s > 0 for _, _, s in costs):
            meta["drafter_costs"]["warning"] = ("SPS measured on whole steps may already include drafting; a "
                                                "drafter cost on top can count it twice (use NAME=0 if it does)")
        missing = [m for m in missing if not m.startswith("drafter costs")]
    if meta.get("kv_capacity_tokens") is None:
        note = "KV capacity (dsparksim run needs --kv-capacity TOKENS; import with --kv-capacity-tokens to store it)"
        if note not in missing:
            missing.append(note)
    meta["missing"] = missing
    d["metadata"] = meta
    return profile_from_dict(d, p.source)


def run_readiness(p: CostProfile) -> list[str]:
    """What ``dsparksim run --profile`` with default options would still need from this profile (empty = ready)."""
    need = []
    if not p.metadata.get("kv_capacity_tokens"):
        need.append("a KV capacity (--kv-capacity-tokens)")
    if "dspark" not in p.drafters:
        need.append("a drafting cost for 'dspark', the default acceptance source's drafter "
                    "(--drafter-cost dspark=SECONDS or --drafters-from PROFILE)")
    if p.min_tokens > 1:
        need.append(f"costs below M={p.min_tokens} (--engine-clamp holds the first probe's value down to 1)")
    return need
