"""Plan spec files (TOML): traffic, SLOs, candidate deployments and GPU prices, validated before any cell runs.

Format::

    [plan]                          # optional except slo
    name = "plan-example"
    slo = ["tps_user_p50 >= 60", "ttft_p99_s <= 2"]   # METRIC OP NUMBER on run-summary fields (aliases: p50)
    seeds = [0, 1, 2]               # each probe runs once per seed [0]
    confidence = 0.95               # interval level of the feasibility rule with >= 2 seeds
    require_unsaturated = true      # a saturated probe never meets the SLO
    prune = true                    # skip deployments that cannot beat their family's cheapest so far

    [traffic]                       # one load: rate (open loop, req/s) or trace (replayed at time_scale)
    rate = 8.0
    scales = [1.0, 2.0]             # plan for each multiple of the load
    duration_s = 20.0               # and any other traffic option (domain, lengths, arrival, warmup_s, ...)

    [base]                          # run options shared by every candidate (acceptance, router, ...)

    [prices]                        # $ per GPU-hour, keyed by the profile's metadata.device or a short GPU name (H100, ...)
    "NVIDIA H100 SXM 80GB" = 3.0

    [[candidates]]
    name = "7b"                     # optional
    profile = "h100-llama2-7b-tp1"  # shipped name or JSON path; a list = one deployment per profile
    replicas = [1, 8]               # inclusive range searched by bisection
    policies = ["mtp1", "confidence", "fixed"]
    K = [3, 7]                      # draft block sizes for policies that take the run's K [7]
    router = "least-outstanding"    # any run option; a list = one deployment per value
    gpus_per_replica = 8            # optional: overrides the profile's metadata

Every key of ``[base]``, ``[traffic]`` (besides the load and ``scales``) and a candidate (besides ``name``,
``replicas``, ``policies``, ``K``, ``gpus_per_replica``, ``prefill_gpus_per_replica``) is a run option defined once
on the config dataclasses (``dsparksim.config.run_options``), spelled as in sweep specs, so options added there
(e.g. ``kv_policy``, ``disaggregated``, ``prefill_replicas``) are plan keys with no change here.
"""
from __future__ import annotations

import dataclasses as dc
import itertools
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from dsparksim.config import run_options
from dsparksim.cost.analytic.hardware import SHORT_NAMES
from dsparksim.cost.fitted import FitDefaults, fit_defaults, fit_lines
from dsparksim.cost.profile import beside_spec_hint, load_profile
from dsparksim.errors import ConfigError, InputError, raise_all
from dsparksim.policies import make_policy
from dsparksim.policies.fixed import Fixed
from dsparksim.results.notes import request_latency_note
from dsparksim.results.stats import MAX_SEEDS
from dsparksim.sim.reads import DRAFT_OPTIONS, collapsed_reason, identity, policy_reads, unread_by_all
# the one SLO vocabulary of capacity, plan and frontier (percentile spellings: *_p50 = *_median)
from dsparksim.sweep.capacity import METRIC_ALIASES, SLO_METRICS  # noqa: F401
from dsparksim.sweep.capacity import parse_slo
from dsparksim.sweep.cells import build_config
from dsparksim.sweep.spec import canonical_key, check_value, read_toml, spec_from_dict
from dsparksim.traffic.build import check_expected_arrivals

TABLES = ("plan", "traffic", "base", "prices", "candidates")
PLAN_KEYS = ("name", "slo", "seeds", "confidence", "require_unsaturated", "prune")
CANDIDATE_KEYS = ("name", "replicas", "policies", "K", "gpus_per_replica", "prefill_gpus_per_replica")
LOADS = ("rate", "trace")   # the [traffic] load; scales multiply rate or the trace's time_scale
# Run options a plan sets itself: the load (from [traffic] x scale), the seed ([plan] seeds), the replica count
# (searched) and the policy / K (candidates' policies and K).
RESERVED = ("concurrency", "rate", "time_scale", "trace", "seed", "replicas", "policy", "block_size")
# Run options that make a deployment disaggregated and size its prefill pool ([regime]); read by name so the
# planner counts their GPUs as soon as the options exist.
DISAGG_KEY, PREFILL_KEY = "disaggregated", "prefill_replicas"


def profile_label(prof_name: object) -> str:
    """A profile's short name in labels: a file's name without ``.json``; a shipped name as it is (shipped names
    may contain dots, e.g. ``fitted-...-sglang-0.5.12``, which ``Path.stem`` would cut)."""
    s = Path(str(prof_name)).name
    return s[:-5] if s.endswith(".json") else s


def slo_metrics() -> tuple[str, ...]:
    """Run-summary fields an SLO may constrain (dsparksim.results.metrics.summarize)."""
    return tuple(SLO_METRICS)


@dataclass(frozen=True)
class SLOTerm:
    """One SLO term on a run-summary field: ``metric op value`` (``spelled``: as the spec wrote the metric)."""

    metric: str
    op: str
    value: float
    spelled: str

    def __str__(self) -> str:
        return f"{self.spelled} {self.op} {self.value:g}"

    @property
    def higher_is_better(self) -> bool:
        return self.op in (">=", ">")

    def holds(self, x: float) -> bool:
        return {">=": x >= self.value, "<=": x <= self.value, ">": x > self.value, "<": x < self.value}[self.op]

    def headroom(self, x: float) -> float:
        """Relative slack of ``x`` against the threshold: > 0 met with room, < 0 missed by that fraction."""
        d = (x - self.value) if self.higher_is_better else (self.value - x)
        return d / abs(self.value) if self.value else d


@dataclass(frozen=True)
class Deployment:
    """One point of the search space but the replica count: a profile, options, policy and K.

    ``gpus_per_replica``: GPUs of one decode replica; ``prefill_gpus``: GPUs of the prefill pool (disaggregated
    deployments: prefill_replicas x prefill GPUs per replica, else 0). Cost per hour at r replicas =
    (r x gpus_per_replica + prefill_gpus) x price."""

    index: int
    candidate: str
    label: str
    family: str
    policy: str
    K: int
    options: Mapping[str, Any]     # run options, without load, seed and replicas
    device: str
    price: float
    gpus_per_replica: int
    gpus_note: str
    prefill_gpus: int
    lo: int
    hi: int
    fit: FitDefaults | None = None   # the profile's fitted server settings this deployment took (cost/fitted.py)

    def gpus(self, replicas: int) -> int:
        return replicas * self.gpus_per_replica + self.prefill_gpus

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "candidate": self.candidate, "label": self.label, "family": self.family,
                "policy": self.policy, "K": self.K, "options": dict(self.options), "device": self.device,
                "price_per_gpu_hour": self.price, "gpus_per_replica": self.gpus_per_replica,
                "gpus_per_replica_from": self.gpus_note, "prefill_gpus": self.prefill_gpus,
                "replicas": [self.lo, self.hi],
                **({"options_from_profile_fit": dict(self.fit.used)} if self.fit and self.fit.used else {})}


@dataclass(frozen=True)
class PlanSpec:
    """A parsed, validated plan spec (``raw``: the file's tables, saved next to the results as resolved)."""

    source: str
    name: str
    slo: tuple[SLOTerm, ...]
    seeds: tuple[int, ...]
    confidence: float
    require_unsaturated: bool
    prune: bool
    load_key: str                 # "rate" | "time_scale"
    load_base: float
    scales: tuple[float, ...]
    traffic: Mapping[str, Any]    # traffic options (trace included) but the load
    base: Mapping[str, Any]
    prices: Mapping[str, float]
    deployments: tuple[Deployment, ...]
    raw: Mapping[str, Any] = field(default_factory=dict)
    # deployments left out as the same run as one kept (label, same_as label, why): dsparksim.sim.reads
    collapsed: tuple[Mapping[str, str], ...] = ()

    def profile_lines(self) -> list[str]:
        """What the deployments' profiles call for, each line once: the server settings taken from a fitted
        profile (and a caution where the spec sets another value), and a fitted request latency that the probes'
        engine-side TTFT and E2E leave out."""
        lines = dict.fromkeys(fit_lines(d.fit for d in self.deployments if d.fit))   # one caution per profile
        latency: dict[str, float] = {}
        for d in self.deployments:
            prof = str({**self.traffic, **self.base, **d.options}["profile"])
            if prof not in latency:
                latency[prof] = load_profile(prof).request_latency_s
            note = request_latency_note(prof, latency[prof])
            if note:
                lines[f"dsparksim: note: {note}"] = None
        return list(lines)

    def price_note(self) -> str | None:
        """One line naming the [prices] entries no deployment's GPU takes (:func:`price_key_for`), with the key
        each GPU does take; None when every entry prices some deployment. Not an error: a shared price list may
        cover more GPUs than one plan's candidates, but a misspelt or ambiguous key is seen here."""
        used: dict[str, list[str]] = {}
        for d in self.deployments:
            key = price_key_for(d.device, self.prices)
            if key is not None and d.device not in used.setdefault(key, []):
                used[key].append(d.device)
        unused = [k for k in self.prices if k not in used]
        if not unused:
            return None
        taken = "; ".join(f"{', '.join(repr(dev) for dev in devs)} by {k!r}" for k, devs in used.items())
        return (f"[prices] {', '.join(repr(k) for k in unused)} {'prices' if len(unused) == 1 else 'price'} no "
                f"deployment (unused; the deployments' GPUs are priced {taken})")

    def load(self, scale: float) -> float:
        return self.load_base * scale

    def options(self, d: Deployment, scale: float, replicas: int, seed: int) -> dict[str, Any]:
        """Flat run options of one probe (``RunConfig.from_options`` keys); no K for plain decoding (K = 0)."""
        k = {"block_size": d.K} if d.K >= 1 else {}
        return {**self.traffic, **self.base, **d.options, self.load_key: self.load(scale), "replicas": replicas,
                "seed": seed, "policy": d.policy, **k}

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "name": self.name, "slo": [str(t) for t in self.slo],
                "slo_metrics": {t.spelled: t.metric for t in self.slo}, "seeds": list(self.seeds),
                "confidence": self.confidence, "require_unsaturated": self.require_unsaturated, "prune": self.prune,
                "traffic": {**self.traffic, "load": self.load_key, "load_at_scale_1": self.load_base,
                            "scales": list(self.scales)},
                "base": dict(self.base), "prices_per_gpu_hour": dict(self.prices),
                "deployments": [d.to_dict() for d in self.deployments],
                "collapsed": [dict(c) for c in self.collapsed], "file": dict(self.raw)}


def load_plan(path: str | Path) -> PlanSpec:
    """Read and validate a TOML plan spec (structure, SLOs, prices, every probe's configuration) -- no cell runs."""

    return plan_from_dict(read_toml(path, "plan spec"), source=str(Path(path)))


# ------------------------------------------------------------------------------------------------ helpers
def _table(src: str, d: Mapping[str, Any], name: str, required: bool = False) -> dict[str, Any]:
    v = d.get(name)
    if v is None:
        if required:
            raise ConfigError(src, name, f"required table [{name}] is missing")
        return {}
    if not isinstance(v, Mapping):
        raise ConfigError(src, name, f"expected a table [{name}], got {v!r}")
    return dict(v)


def _run_options(src: str, where: str, d: Mapping[str, Any], allow_lists: bool) -> dict[str, Any]:
    """Run options of a table, keys canonical, values type-checked (lists: one value each)."""

    out: dict[str, Any] = {}
    for k, v in d.items():
        c = canonical_key(k)
        if c in RESERVED:
            raise ConfigError(src, f"{where}.{k}", "is set by the plan itself (load: [traffic]; seed: plan.seeds; "
                              "replicas: the candidate's range; policy/K: the candidate's policies and K)")
        if c in out:
            raise ConfigError(src, f"{where}.{k}", f"same key as another spelling (both mean {c!r}); keep one")
        if allow_lists and isinstance(v, list):
            if not v:
                raise ConfigError(src, f"{where}.{k}", "empty list: give at least one value")
            vals = [check_value(src, f"{where}.{k}[{i}]", c, x) for i, x in enumerate(v)]
            if len(set(map(repr, vals))) != len(vals):
                raise ConfigError(src, f"{where}.{k}", f"duplicate values in {v!r}")
            out[c] = vals
        else:
            out[c] = check_value(src, f"{where}.{k}", c, v)
    return out


def _pos_number(src: str, where: str, v: Any, integer: bool = False) -> float:
    kinds = (int,) if integer else (int, float)
    if isinstance(v, bool) or not isinstance(v, kinds) or not (0 < v < math.inf):
        raise ConfigError(src, where, f"expected {'an integer >= 1' if integer else 'a finite number > 0'}, "
                          f"got {v!r}")
    return v


def parse_slo_terms(src: str, terms: Any) -> tuple[SLOTerm, ...]:
    """SLO terms ``METRIC OP NUMBER`` (OP in >=, <=, >, <) on known run-summary metrics."""

    if not isinstance(terms, list):
        raise ConfigError(src, "plan.slo", f"expected a non-empty list of terms like 'tps_user_p50 >= 60', "
                          f"got {terms!r}")
    return tuple(SLOTerm(c.metric, c.op, c.value, c.spelled) for c in parse_slo(terms, src, "plan.slo"))


def _family(policy: str) -> str:
    return policy.partition(":")[0]


def gpus_per_replica(meta: Mapping[str, Any], dp_ranks: int = 1) -> tuple[int, str]:
    """GPUs of one replica from profile metadata, and where the figure came from.

    ``gpus`` (or ``num_gpus``/``gpu_count``) when the profile states it; else tensor_parallel x pipeline_parallel
    x the run's dp_ranks (the ranks simulated), at least expert_parallel (experts are laid out over those GPUs,
    not beside them). A profile whose metadata ``data_parallel``/``dp`` D > 1 prices one of D ranks: dp_ranks must
    be D (ValueError otherwise). tensor_parallel absent -> (0, "none") (the caller refuses).
    """
    for k in ("gpus", "num_gpus", "gpu_count"):
        v = meta.get(k)
        if isinstance(v, int) and not isinstance(v, bool) and v >= 1:
            return v, f"metadata.{k}"

    def num(*keys: str) -> tuple[int | None, str | None]:
        for k in keys:
            v = meta.get(k)
            if isinstance(v, int) and not isinstance(v, bool) and v >= 1:
                return v, k
        return None, None

    tp, _ = num("tensor_parallel", "tp")
    if tp is None:
        return 0, "none"
    pp, ppk = num("pipeline_parallel", "pp")
    dp, dpk = num("data_parallel", "dp")
    ep, epk = num("expert_parallel", "ep")
    parts = [f"tensor_parallel {tp}"]
    n = tp
    if pp:
        n *= pp
        parts.append(f"{ppk} {pp}")
    if dp and dp > 1 and dp != dp_ranks:
        # the profile prices ONE of dp data-parallel ranks (its EP all-to-all assumes dp of them): simulating
        # another number of ranks would cost GPUs the simulation does not model, or model GPUs nobody pays for
        raise ValueError(f"the profile prices one of {dp} data-parallel ranks ({dpk} {dp}) but the deployment "
                         f"simulates dp_ranks = {dp_ranks}: set dp_ranks = {dp}")
    if dp_ranks > 1:
        n *= dp_ranks
        parts.append(f"dp_ranks {dp_ranks}")
    if ep and ep > n:
        n = ep
        parts.append(f"raised to {epk} {ep}")
    return n, "metadata: " + " x ".join(parts)


# ------------------------------------------------------------------------------------------------- parsing
def plan_from_dict(d: Mapping[str, Any], source: str = "plan spec") -> PlanSpec:
    """Validate a plan spec given as the parsed TOML and resolve its deployments (loads profiles; runs nothing)."""
    src = source
    if not isinstance(d, Mapping):
        raise ConfigError(src, None, f"expected a table, got {type(d).__name__}")
    raise_all(src, [ConfigError(src, t, f"unknown table [{t}]; expected some of {', '.join(TABLES)}")
                    for t in d if t not in TABLES])
    problems: list[InputError] = []   # the tables are independent: all their problems are reported together
    parsed = [_collect(problems, f, src, d) for f in (_plan_table, _traffic_table, _base_table, _prices_table)]
    raise_all(src, problems)
    (name, slo, seeds, conf, flags), (topts, load_key, load_base, scales), base, prices = parsed
    raise_all(src, [ConfigError(src, f"base.{k}", f"also set in [traffic] ({topts[k]!r}); keep one")
                    for k in base if k in topts])
    # options no policy reads do not stop the checks after them: every such problem is reported with the rest
    unread: list[InputError] = []
    deps = _deployments(src, d.get("candidates"), prices, {**topts, **base}, unread)
    _collect(unread, _check_unread_shared, src, {"traffic": topts, "base": base}, [x.policy for x in deps])
    spec = PlanSpec(source=src, name=name, slo=slo, seeds=tuple(seeds), confidence=float(conf),
                    require_unsaturated=flags["require_unsaturated"], prune=flags["prune"], load_key=load_key,
                    load_base=load_base, scales=tuple(scales), traffic=topts, base=base, prices=prices,
                    deployments=tuple(deps), raw=_plain(d))
    spec = _collapse(spec)
    _collect(unread, _check_probes, spec)
    raise_all(src, unread)
    return spec


def _collect(problems: list[InputError], check: Any, *args: Any) -> Any:
    """``check(*args)``, or None with its ConfigError appended to ``problems``."""
    try:
        return check(*args)
    except ConfigError as e:
        problems.extend(getattr(e, "errors", [e]))
        return None


def _base_table(src: str, d: Mapping[str, Any]) -> dict[str, Any]:
    """[base]: run options for every candidate (no lists)."""
    return _run_options(src, "base", _table(src, d, "base"), allow_lists=False)


def _prices_table(src: str, d: Mapping[str, Any]) -> dict[str, float]:
    """[prices]: $/GPU-hour by device or short GPU name, each a number > 0."""
    prices = _table(src, d, "prices")
    problems: list[InputError] = []
    for k, v in prices.items():
        prices[k] = _collect(problems, lambda x, key=k: float(_pos_number(src, f"prices.{key}", x)), v)
    raise_all(src, problems)
    return prices


def _plan_table(src: str, d: Mapping[str, Any]) -> tuple[str, Any, list[int], float, dict[str, bool]]:
    """[plan]: name, SLO terms, seeds, confidence and the two flags, each checked."""
    plan = _table(src, d, "plan", required=True)
    for k in plan:
        if k not in PLAN_KEYS:
            raise ConfigError(src, f"plan.{k}", f"unknown key; expected some of {', '.join(PLAN_KEYS)}")
    name = plan.get("name", Path(src).stem)
    if not isinstance(name, str) or not name:
        raise ConfigError(src, "plan.name", f"expected a non-empty string, got {name!r}")
    slo = parse_slo_terms(src, plan.get("slo"))
    seeds = plan.get("seeds", [0])
    if (not isinstance(seeds, list) or not seeds or len(seeds) > MAX_SEEDS
            or any(isinstance(s, bool) or not isinstance(s, int) or not 0 <= s < 2**63 for s in seeds)):
        raise ConfigError(src, "plan.seeds", f"expected a list of 1..{MAX_SEEDS} integers >= 0, got {seeds!r}")
    if len(set(seeds)) != len(seeds):
        raise ConfigError(src, "plan.seeds", f"duplicate seeds in {seeds!r}")
    conf = plan.get("confidence", 0.95)
    if isinstance(conf, bool) or not isinstance(conf, (int, float)) or not 0 < conf < 1:
        raise ConfigError(src, "plan.confidence", f"expected a number in (0, 1), got {conf!r}")
    flags = {}
    for k, default in (("require_unsaturated", True), ("prune", True)):
        flags[k] = plan.get(k, default)
        if not isinstance(flags[k], bool):
            raise ConfigError(src, f"plan.{k}", f"expected true or false, got {flags[k]!r}")
    return name, slo, seeds, conf, flags


def _traffic_table(src: str, d: Mapping[str, Any]) -> tuple[dict[str, Any], str, float, list[float]]:
    """[traffic]: its run options, the load (rate or trace time_scale) and the scales the plan searches."""
    traffic = _table(src, d, "traffic", required=True)
    scales = traffic.pop("scales", [1.0])
    if not isinstance(scales, list) or not scales:
        raise ConfigError(src, "traffic.scales", f"expected a non-empty list of numbers > 0, got {scales!r}")
    scales = [float(_pos_number(src, f"traffic.scales[{i}]", s)) for i, s in enumerate(scales)]
    if len(set(scales)) != len(scales):
        raise ConfigError(src, "traffic.scales", f"duplicate scales in {scales!r}")
    loads = [k for k in traffic if k in LOADS or k in ("request_rate", "concurrency", "time_scale")]
    if "concurrency" in loads:
        raise ConfigError(src, "traffic.concurrency", "a plan serves a given traffic: set rate (open loop, req/s) "
                          "or trace (replayed, scaled by time_scale); closed-loop users are not a traffic level")
    if "rate" in traffic and "request_rate" in traffic:
        raise ConfigError(src, "traffic.request_rate", "same key as traffic.rate; keep one")
    if "request_rate" in traffic:
        traffic["rate"] = traffic.pop("request_rate")
    if "rate" in traffic and "trace" in traffic:
        raise ConfigError(src, "traffic.trace", "set one load: rate (open loop) or trace (replay), not both")
    if "rate" in traffic:
        load_key, load_base = "rate", float(_pos_number(src, "traffic.rate", traffic.pop("rate")))
        if "time_scale" in traffic:
            raise ConfigError(src, "traffic.time_scale", "applies to a trace; this plan's load is a rate")
    elif "trace" in traffic:
        load_key = "time_scale"
        load_base = float(_pos_number(src, "traffic.time_scale", traffic.pop("time_scale", 1.0)))
    else:
        raise ConfigError(src, "traffic", "no load: set rate (open loop, req/s) or trace (an arrival trace to "
                          "replay; time_scale multiplies its rate)")
    trace = traffic.pop("trace", None)
    topts = _run_options(src, "traffic", traffic, allow_lists=False)
    if trace is not None:
        if not isinstance(trace, str):
            raise ConfigError(src, "traffic.trace", f"expected a trace path or shipped name, got {trace!r}")
        topts["trace"] = trace
    return topts, load_key, load_base, scales


def _deployments(src: str, cands: Any, prices: dict[str, float], shared: dict[str, Any],
                 unread: list[InputError]) -> list[Deployment]:
    """[[candidates]] expanded into deployments (names unique, at least one); a candidate's options that none of
    its policies reads are appended to ``unread`` (the deployments are still built)."""
    if cands is None or (isinstance(cands, list) and not cands):
        raise ConfigError(src, "candidates", "no candidate deployments: add at least one [[candidates]] table")
    if not isinstance(cands, list) or not all(isinstance(c, Mapping) for c in cands):
        raise ConfigError(src, "candidates", f"expected [[candidates]] tables, got {cands!r}")
    deps: list[Deployment] = []
    names: dict[str, int] = {}
    problems: list[InputError] = []   # every candidate is checked: its problems are reported together
    for i, c in enumerate(cands):
        cname = c.get("name", f"c{i}")
        if isinstance(cname, str) and cname in names:
            problems.append(ConfigError(src, f"candidates[{i}].name", f"duplicate candidate name {cname!r} (also "
                                        f"candidates[{names[cname]}]): each candidate needs its own name"))
        names.setdefault(cname, i)
        try:
            deps.extend(_candidate(src, i, dict(c), prices, len(deps), shared, unread))
        except ConfigError as e:
            problems.extend(getattr(e, "errors", [e]))
    if problems:   # with the unread options found so far: every problem at once, not one round per kind
        raise_all(src, problems + unread)
    if not deps:
        raise ConfigError(src, "candidates", "no deployment to search")
    return deps


def _check_unread_shared(src: str, tables: Mapping[str, Mapping[str, Any]], policies: list[str]) -> None:
    """A draft option in [traffic] or [base] that no candidate policy reads is refused, as everywhere
    (dsparksim.sim.reads)."""

    problems = []
    for t, opts in tables.items():
        for key in DRAFT_OPTIONS:
            if key in opts:
                hit = unread_by_all(policies, [key])
                if hit:
                    problems.append(ConfigError(src, f"{t}.{key}", f"has no effect: no candidate policy reads {key} "
                                                f"({hit[1]}); remove it"))
    raise_all(src, problems)


def _collapse(spec: PlanSpec) -> PlanSpec:
    """The spec without deployments that are the same run as an earlier one at every replica count (they differ
    only in options their runs never read, e.g. mtp1's acceptance): each is recorded in ``collapsed``."""

    seen: dict[Any, Deployment] = {}
    keep, gone = [], []
    for d in spec.deployments:
        try:
            cfgs = [build_config(spec.options(d, spec.scales[0], r, spec.seeds[0]), spec.source) for r in (d.lo, d.hi)]
        except ConfigError:
            keep.append(d)   # _check_probes reports it, naming the candidate
            continue
        key = (repr([identity(c).to_dict() for c in cfgs]), d.family, d.price, d.gpus_per_replica, d.prefill_gpus,
               d.lo, d.hi)
        if key in seen:
            first = seen[key]
            c0 = build_config(spec.options(first, spec.scales[0], d.lo, spec.seeds[0]), spec.source)
            why = collapsed_reason([c0, cfgs[0]], [None, 0])
            gone.append({"label": d.label, "same_as": first.label,
                         "why": f"same run as {first.label}" + (f" ({why})" if why else "")})
            continue
        seen[key] = d
        keep.append(d)
    if not gone:
        return spec
    keep = [dc.replace(d, index=i) for i, d in enumerate(keep)]
    return dc.replace(spec, deployments=tuple(keep), collapsed=tuple(gone))


def _plain(d: Any) -> Any:
    if isinstance(d, Mapping):
        return {k: _plain(v) for k, v in d.items()}
    if isinstance(d, list):
        return [_plain(v) for v in d]
    return d if isinstance(d, (str, int, float, bool)) or d is None else str(d)


def price_key_for(device: str, prices: Mapping[str, float]) -> str | None:
    """The [prices] key for a profile's metadata.device: the exact string, else the one short GPU name (A100,
    H100, ...) that appears in it as a whole token (built profiles say 'H100-SXM5-80GB', vidur-derived ones
    'NVIDIA H100 SXM 80GB': 'H100' prices both). Two matching short names are ambiguous: None."""
    if device in prices:
        return device

    hits = [k for k in prices if k.upper() in SHORT_NAMES
            and re.search(rf"(?<![A-Za-z0-9]){re.escape(k.upper())}(?![A-Za-z0-9])", device.upper())]
    return hits[0] if len(hits) == 1 else None


def _candidate(src: str, i: int, c: dict[str, Any], prices: Mapping[str, float], start: int,
               shared: Mapping[str, Any], unread: list[InputError]) -> list[Deployment]:
    """One [[candidates]] table expanded over its listed options, policies and K into deployments. Its
    independent problems (name, replicas, policies, K, profile) are raised together; each option no policy of it
    reads is appended to ``unread``."""
    where = f"candidates[{i}]"
    problems: list[InputError] = []
    cname = c.pop("name", f"c{i}")
    if not isinstance(cname, str) or not cname:
        problems.append(ConfigError(src, f"{where}.name", f"expected a non-empty string, got {cname!r}"))
    rng = c.pop("replicas", None)
    if (not isinstance(rng, list) or len(rng) != 2
            or any(isinstance(r, bool) or not isinstance(r, int) or r < 1 for r in rng)):
        problems.append(ConfigError(src, f"{where}.replicas", f"expected [MIN, MAX], integers >= 1, got {rng!r}"))
    elif rng[0] > rng[1]:
        problems.append(ConfigError(src, f"{where}.replicas", f"range is inverted: min {rng[0]} > max {rng[1]}"))
    pols = c.pop("policies", None)
    if not isinstance(pols, list) or not pols or not all(isinstance(p, str) for p in pols):
        problems.append(ConfigError(src, f"{where}.policies", f"expected a non-empty list of policy specs, got "
                                    f"{pols!r}"))
    k_given = "K" in c or "k" in c
    ks = c.pop("K", c.pop("k", [7]))
    ks = ks if isinstance(ks, list) else [ks]
    if not ks or any(isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= 15 for k in ks):
        problems.append(ConfigError(src, f"{where}.K", f"expected draft block sizes in 1..15, got {ks!r}"))
    elif len(set(ks)) != len(ks):
        problems.append(ConfigError(src, f"{where}.K", f"duplicate values in {ks!r}; list each K once"))
    over = {}
    for k in ("gpus_per_replica", "prefill_gpus_per_replica"):
        if k in c:
            try:
                over[k] = int(_pos_number(src, f"{where}.{k}", c.pop(k), integer=True))
            except ConfigError as e:
                problems.append(e)
    opts = _run_options(src, where, c, allow_lists=True)
    if "profile" not in opts and "profile" not in shared:
        problems.append(ConfigError(src, f"{where}.profile", "required: the cost profile (shipped name or JSON "
                                    "path)"))
    raise_all(src, problems)
    policies = _candidate_policies(src, where, pols, ks)
    unread += _unread_keys(src, where, [p for p, _, _ in policies],
                           ("block_size",) * k_given + tuple(k for k in DRAFT_OPTIONS if k in opts))
    return _expand(src, where, cname, (rng[0], rng[1]), opts, policies, prices, start, shared, over)


def _unread_keys(src: str, where: str, policies: list[str], keys: Sequence[str]) -> list[InputError]:
    """An error for each of a candidate's ``keys`` that none of its policies reads (block_size is spelled K)."""
    problems: list[InputError] = []
    for key in keys:
        hit = unread_by_all(policies, [key])
        if hit:
            problems.append(ConfigError(src, f"{where}.{'K' if key == 'block_size' else key}", f"has no effect: no "
                                        f"policy of this candidate reads {key} ({hit[1]}); remove it"))
    return problems


def _expand(src: str, where: str, cname: str, replicas: tuple[int, int], opts: Mapping[str, Any],
            policies: list[tuple[str, int, bool]], prices: Mapping[str, float], start: int,
            shared: Mapping[str, Any], over: Mapping[str, int]) -> list[Deployment]:
    """A checked candidate's deployments: one per combination of its listed options, policy and K."""
    lo, hi = replicas
    lists = {k: v for k, v in opts.items() if isinstance(v, list)}
    fixed = {k: v for k, v in opts.items() if not isinstance(v, list)}
    out: list[Deployment] = []
    for combo in itertools.product(*lists.values()):
        o = {**fixed, **dict(zip(lists, combo))}
        merged = {**shared, **o}
        prof_name = merged["profile"]
        try:
            prof = load_profile(prof_name)
        except InputError as e:
            raise ConfigError(src, f"{where}.profile", f"profile {prof_name!r} cannot be loaded: {e}"
                              f"{beside_spec_hint(prof_name, src)}") from None
        fit = fit_defaults(prof_name, merged)   # its fitted server where the spec sets none, as `run` does
        o = {**o, **fit.used}
        meta = prof.metadata
        device = str(meta.get("device", ""))
        price_key = price_key_for(device, prices)
        if price_key is None:
            raise ConfigError(src, f"{where}.profile", f"no price for GPU {device!r} (the metadata.device of "
                              f"profile {prof_name!r}): add it, or its short name (A100, H100, H200, H800, H20, B200), "
                              f"to [prices] in $/GPU-hour"
                              + (f"; priced: {', '.join(prices)}" if prices else ""))
        g, note = _gpus(src, where, prof_name, meta, merged, over)
        prefill = 0
        if merged.get(DISAGG_KEY):
            spec_pre = run_options().get(PREFILL_KEY)
            n_pre = merged.get(PREFILL_KEY, spec_pre.default if spec_pre is not None else 1) or 1
            prefill = int(n_pre) * over.get("prefill_gpus_per_replica", g)
        vary = ", ".join(f"{k}={v}" for k, v in zip(lists, combo) if k != "profile")
        for pspec, K, takes_k in policies:
            label = (f"{cname}/{profile_label(prof_name)}" + (f" [{vary}]" if vary else "") + f" {pspec}"
                     + (f" K={K}" if takes_k else ""))
            out.append(Deployment(index=start + len(out), candidate=cname, label=label,
                                  family=_family(pspec), policy=pspec, K=K, options=o, device=device,
                                  price=prices[price_key], gpus_per_replica=int(g), gpus_note=note,
                                  prefill_gpus=prefill, lo=lo, hi=hi, fit=fit))
    return out


def _candidate_policies(src: str, where: str, pols: list[str], ks: list[int]) -> list[tuple[str, int, bool]]:
    """(policy spec, effective K, whether the policy reads K) for every listed policy and K, without duplicates."""
    policies = []
    seen: dict[str, int] = {}
    for j, p in enumerate(pols):
        try:
            pol = make_policy(p)
        except InputError as e:
            raise ConfigError(src, f"{where}.policies[{j}]", f"invalid policy spec {p!r}: {e}") from None
        if pol.spec in seen:   # listed twice: refused, never searched once silently
            raise ConfigError(src, f"{where}.policies[{j}]", f"duplicate policy {p!r} (the same policy as "
                              f"{where}.policies[{seen[pol.spec]}]); list each policy once")
        seen[pol.spec] = j
        takes_k = "block_size" in policy_reads(pol.spec)     # none: K = 0; mtp1: K = 1, whatever K lists
        for K in ks:
            if isinstance(pol, Fixed) and pol.k > K:          # it would run as fixed:K under its own name
                raise ConfigError(src, f"{where}.policies[{j}]", f"{p} verifies {pol.k} draft tokens but K lists "
                                  f"K={K}; expected fixed:k with k <= every K")
            eff = int(K if takes_k else (pol.block_size or 0) if getattr(pol, "drafts", True) else 0)
            if (pol.spec, eff, takes_k) not in policies:
                policies.append((pol.spec, eff, takes_k))
    return policies


def _gpus(src: str, where: str, prof_name: str, meta: Mapping[str, Any], merged: Mapping[str, Any],
          over: Mapping[str, int]) -> tuple[int, str]:
    """GPUs per replica: the candidate's override, else from the profile's metadata (TP x DP ranks)."""
    if "gpus_per_replica" in over:
        g, note = over["gpus_per_replica"], "candidate gpus_per_replica"
    else:
        try:
            g, note = gpus_per_replica(meta, int(merged.get("dp_ranks", 1)))
        except ValueError as e:
            raise ConfigError(src, f"{where}.dp_ranks", f"profile {prof_name!r}: {e}") from None
        if not g:
            raise ConfigError(src, f"{where}.profile", f"profile {prof_name!r} states neither gpus nor "
                              "tensor_parallel in its metadata: set gpus_per_replica on the candidate")
    return g, note


def _check_arrivals(spec: PlanSpec, cfg: Any, scale: float) -> None:
    """An open-loop probe whose expected arrivals exceed the per-run limit is refused here, as `run` refuses it,
    naming the plan's [traffic] rate (not after a round of probes has failed)."""

    t = cfg.traffic
    if t.rate is None or t.duration_s is None:
        return
    try:
        check_expected_arrivals(t.rate * t.time_scale, t.duration_s)
    except ConfigError as e:
        why = e.message.replace(" (--rate / --time-scale)", "")
        raise ConfigError(spec.source, "traffic.rate", f"at scale {scale:g}: {why} (or [traffic] scales)") from None


def _check_probes(spec: PlanSpec) -> None:
    """Every probe the search may run builds a valid RunConfig; the inputs it reads open (no cell runs)."""

    seen: set[str] = set()
    problems: dict[Any, InputError] = {}   # each deployment's first problem, all reported together
    for d in spec.deployments:
        try:
            _check_deployment(spec, d, seen)
        except ConfigError as e:
            # one bad value (of a shared option, or an option over several policies) is one problem, said once
            field_ = getattr(e, "option", None)
            key = (field_, repr(spec.options(d, spec.scales[0], d.hi, spec.seeds[0]).get(field_))) if field_ else e
            problems.setdefault(key, e)
    raise_all(spec.source, list(problems.values()))


def _check_deployment(spec: PlanSpec, d: Deployment, seen: set[str]) -> None:
    """One deployment's probes (:func:`_check_probes`); ``seen``: the option sets already checked for inputs."""
    where = f"candidates ({d.label})"
    for scale in (min(spec.scales), max(spec.scales)):
        for r in (d.lo, d.hi):
            try:
                cfg = build_config(spec.options(d, scale, r, spec.seeds[0]), spec.source)
            except ConfigError as e:
                raise _about(ConfigError(spec.source, where, f"replicas={r}, scale={scale:g}: "
                                         f"{_unprefixed(e, spec.source)}"), e.field) from None
            _check_arrivals(spec, cfg, scale)
    # Input files (acceptance sources, traces, length tables, routers) are checked as a sweep checks them.
    reads = policy_reads(d.policy)   # a shared option another candidate's policy reads is not this probe's
    opts = {k: v for k, v in spec.options(d, spec.scales[0], d.hi, spec.seeds[0]).items()
            if k not in DRAFT_OPTIONS or k in reads}
    key = repr(sorted((k, repr(v)) for k, v in opts.items() if k not in ("replicas", "seed")))
    if key in seen:
        return
    seen.add(key)
    try:
        spec_from_dict({"sweep": {"name": spec.name}, "base": opts}, source=spec.source)
    except ConfigError as e:
        key = e.field[len("base."):] if isinstance(e.field, str) and e.field.startswith("base.") else None
        if key is not None and key not in d.options:   # set in [traffic] or [base], not by this candidate
            table = "base" if key in spec.base else "traffic" if key in spec.traffic else None
            if table is not None:
                raise _about(ConfigError(spec.source, f"{table}.{key}", e.message), key) from None
        raise _about(ConfigError(spec.source, where, _unprefixed(e, spec.source)), key) from None


def _about(e: ConfigError, option: str | None) -> ConfigError:
    """``e``, marked with the run option it is about (:func:`_check_probes` says each bad value once)."""
    e.option = option[len("base."):] if isinstance(option, str) and option.startswith("base.") else option
    return e


def _unprefixed(e: InputError, source: str) -> str:
    """``e``'s message without a leading ``source: `` (the wrapping error names the spec file once)."""
    text, head = str(e), f"{source}: "
    return text[len(head):] if text.startswith(head) else text
