"""The plan search: per deployment and traffic scale, the fewest replicas meeting the SLO, by bisection.

Assumption (stated in the output): at a fixed traffic, feasibility is monotone in the replica count -- more
replicas never break an SLO that fewer met. Every probe runs the same requests (same seeds: common random
numbers), so this holds up to the router's spreading; a violation seen among the probes is reported.

Rounds: every running search proposes its probes, all probes (x seeds) run together on the backend as cached
sweep cells (``dsparksim.sweep``: content-hashed, resumable), then each search takes its results.

Pruning (``prune = true``): the family's cheapest so far is a key (cost per hour, deployment index); a deployment
searches only replica counts whose (cost, index) sorts before it, since nothing above can be the family's
cheapest. A deployment whose smallest replica count already costs as much is skipped without a probe. With
ties broken by the deployment's order in the spec, the answer equals a brute-force scan of every replica count.

Seeds: each probe runs once per seed; each SLO metric's mean and two-sided t-interval at ``confidence`` over
seeds are computed, and the probe meets a term only if the interval's pessimistic end does (the lower end for
``>=``, the upper end for ``<=``). One seed: the interval is the value itself. A saturated seed fails the probe
when ``require_unsaturated``; a seed that rejected requests on arrival (prompt + output + K beyond the KV capacity
or max_model_len) always fails it.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
from tqdm import tqdm

from dsparksim.plan.cost import cost_per_hour, cost_per_mtok, max_replicas_below
from dsparksim.plan.spec import Deployment, PlanSpec, SLOTerm
from dsparksim.results.notes import fit_range_cautions
from dsparksim.results.stats import t_interval
from dsparksim.sweep.backends import import_ray
from dsparksim.sweep.capacity import rejected_term
from dsparksim.sweep.cells import build_config, Cell, cell_hash
from dsparksim.sweep import runner as sweep_runner  # called through the module: tests patch run_cells_cached

SATURATED = "not saturated"   # the pseudo-term a saturated probe violates
SPEED = "tps_user_median"     # the per-user speed of the Pareto set
THROUGHPUT = "output_throughput_tok_s"


def interval(values: Sequence[float], confidence: float) -> tuple[float, float, float]:
    """(mean, low, high): the two-sided Student-t interval of the mean at ``confidence`` (dsparksim.results.stats, the
    rule every seed interval of dsparksim uses); one value: the value itself (no spread to estimate)."""

    iv = t_interval(values, confidence)
    if iv.n < 2:
        return iv.mean, iv.mean, iv.mean
    return iv.mean, iv.lo, iv.hi


@dataclass
class Probe:
    """One deployment at one replica count and traffic scale, over the plan's seeds."""

    replicas: int
    feasible: bool
    cost_per_hour: float
    gpus: int
    metrics: dict[str, dict[str, Any]]     # spelled SLO metric -> mean, low, high, pessimistic, headroom, ok
    violations: list[dict[str, Any]]       # term, headroom (relative miss, < 0)
    saturated: bool
    throughput: float | None
    speed: float | None
    cost_per_mtok: float | None
    cell_hashes: list[str]
    round: int
    mean_running: float | None = None   # requests running per step, mean over seeds (fit-range caution; not saved)

    def to_dict(self) -> dict[str, Any]:
        return {"replicas": self.replicas, "feasible": self.feasible, "gpus": self.gpus,
                "cost_per_hour": self.cost_per_hour, "cost_per_mtok": self.cost_per_mtok,
                "output_throughput_tok_s": self.throughput, SPEED: self.speed, "saturated": self.saturated,
                "metrics": self.metrics, "violations": self.violations, "cell_hashes": self.cell_hashes,
                "round": self.round}


def evaluate(spec: PlanSpec, d: Deployment, replicas: int, summaries: Sequence[dict[str, Any]],
             hashes: list[str], rnd: int) -> Probe:
    """A probe's verdict from its per-seed run summaries (the feasibility rule of the module docstring)."""
    metrics: dict[str, dict[str, Any]] = {}
    bad: list[dict[str, Any]] = []
    for t in spec.slo:
        vals = [s.get(t.metric) for s in summaries]
        if any(not _num(v) for v in vals):
            metrics[t.spelled] = {"values": vals, "ok": False, "why": "no value in some seed"}
            bad.append({"term": str(t), "headroom": None, "why": "no value"})
            continue
        m, lo, hi = interval(vals, spec.confidence)
        pess = lo if t.higher_is_better else hi
        ok = t.holds(pess)
        metrics[t.spelled] = {"mean": m, "low": lo, "high": hi, "pessimistic": pess, "headroom": t.headroom(pess),
                              "ok": ok, **({"values": vals} if len(vals) > 1 else {})}
        if not ok:
            bad.append({"term": str(t), "headroom": t.headroom(pess)})
    sat = any(bool(s.get("saturated")) for s in summaries)
    if sat and spec.require_unsaturated:
        bad.append({"term": SATURATED, "headroom": None})
    rejected = next((r for r in map(rejected_term, summaries) if r), None)
    if rejected:    # requests it cannot hold (KV capacity, max_model_len): it does not serve this traffic
        bad.append({"term": rejected, "headroom": None})
    thr = _mean([s.get(THROUGHPUT) for s in summaries])
    cph = cost_per_hour(replicas, d.gpus_per_replica, d.price, d.prefill_gpus)
    return Probe(replicas=replicas, feasible=not bad, cost_per_hour=cph, gpus=d.gpus(replicas), metrics=metrics,
                 violations=bad, saturated=sat, throughput=thr, speed=_mean([s.get(SPEED) for s in summaries]),
                 cost_per_mtok=cost_per_mtok(cph, thr), cell_hashes=hashes, round=rnd,
                 mean_running=_mean([s.get("mean_running") for s in summaries]))


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _mean(vals: Sequence[Any]) -> float | None:
    return float(np.mean(vals)) if vals and all(_num(v) for v in vals) else None


@dataclass
class Search:
    """Bisection state of one deployment at one scale: the smallest feasible replica count in [lo, hi]."""

    d: Deployment
    scale: float
    probes: dict[int, Probe] = field(default_factory=dict)
    status: str = "running"    # running | feasible | infeasible | pruned | error
    error: str | None = None

    @property
    def g(self) -> int:
        """Largest replica count seen infeasible below the smallest seen feasible (lo - 1 if none): with monotone
        feasibility simply the largest infeasible one; without, the bisection still ends on a feasible count."""
        f = self.f
        return max([r for r, p in self.probes.items() if not p.feasible and (f is None or r < f)],
                   default=self.d.lo - 1)

    @property
    def f(self) -> int | None:   # smallest replica count seen feasible
        return min([r for r, p in self.probes.items() if p.feasible], default=None)

    @property
    def answer(self) -> Probe | None:
        return self.probes[self.f] if self.status == "feasible" else None

    def next_probes(self, cap: int) -> list[int]:
        """Replica counts to probe next, given the largest count that could still be its family's cheapest."""
        if self.status != "running":
            return []
        top = min(self.d.hi, cap)
        g, f = self.g, self.f
        if f is not None and f == g + 1:
            self.status = "feasible"
            return []
        if g >= top:
            self.status = "infeasible" if g >= self.d.hi else "pruned"
            return []
        if f is None or f > top:
            # the top of the range is not known feasible: probe it (with the bottom in the first round)
            return sorted({top, self.d.lo} if not self.probes and top > self.d.lo else {top})
        return [(g + f) // 2]

    def monotonicity_violations(self) -> list[str]:
        rs = sorted(self.probes)
        return [f"feasible at {a} replicas but not at {b}" for i, a in enumerate(rs) for b in rs[i + 1:]
                if self.probes[a].feasible and not self.probes[b].feasible]


@dataclass
class PlanRun:
    """Everything the search produced (``report`` turns it into files)."""

    spec: PlanSpec
    searches: list[Search]
    n_probes: int = 0
    n_cells: int = 0
    n_cached: int = 0
    n_ran: int = 0
    rounds: int = 0
    failures: list[dict[str, Any]] = field(default_factory=list)


def run_cells(cells, out_dir, backend, workers, ray_address, bar):
    """Run cells through the sweep machinery (cache under OUT/cells); a seam tests can replace."""

    return sweep_runner.run_cells_cached(cells, out_dir, backend, workers, ray_address, False, bar is not None, bar=bar)


def run_plan(spec: PlanSpec, out_dir: str | Path, backend: str = "local", workers: int | None = None,
             ray_address: str | None = None, progress: bool = True,
             on_round: Callable[[PlanRun], None] | None = None) -> PlanRun:
    """Search every deployment at every traffic scale (see the module docstring); cells cached in OUT/cells."""

    run = PlanRun(spec, [Search(d, s) for s in spec.scales for d in spec.deployments])
    best: dict[tuple[str, float], tuple[float, int]] = {}
    n_seeds = len(spec.seeds)
    bar = tqdm(total=_estimate(run.searches) * n_seeds, unit="cell", desc=f"plan {spec.name}",
               disable=not progress, dynamic_ncols=True)
    ray_started = _start_ray(backend, workers, ray_address)
    try:
        while True:
            batch: list[tuple[Search, int, list[Cell]]] = []
            idx = 0
            for s in run.searches:
                key = best.get((s.d.family, s.scale))
                cap = s.d.hi if key is None or not spec.prune else max_replicas_below(
                    key, s.d.index, s.d.gpus_per_replica, s.d.prefill_gpus, s.d.price, s.d.lo, s.d.hi)
                for r in s.next_probes(cap):
                    cells = []
                    for seed in spec.seeds:
                        cfg = build_config(spec.options(s.d, s.scale, r, seed), spec.source)
                        cells.append(Cell(index=idx, key={"deployment": s.d.label, "scale": s.scale,
                                                          "replicas": r, "seed": seed}, config=cfg,
                                          hash=cell_hash(cfg)))
                        idx += 1
                    batch.append((s, r, cells))
            if not batch:
                break
            run.rounds += 1
            bar.total = bar.n + (sum(len(c) for _, _, c in batch)
                                 + max(0, _estimate(run.searches) - len(batch)) * n_seeds)
            bar.set_postfix_str(f"round {run.rounds}")
            flat = [c for _, _, cs in batch for c in cs]
            summaries, failures, n_cached, n_ran = run_cells(flat, out_dir, backend, workers, ray_address,
                                                              bar if progress else None)
            run.n_cells += len(flat)
            run.n_cached += n_cached
            run.n_ran += n_ran
            failed = {f["cell"]: f["error"] for f in failures}
            for s, r, cells in batch:
                errs = [failed[c.index] for c in cells if c.index in failed]
                if errs:
                    s.status, s.error = "error", errs[0]
                    run.failures.append({"deployment": s.d.label, "scale": s.scale, "replicas": r, "error": errs[0]})
                    continue
                run.n_probes += 1
                s.probes[r] = evaluate(spec, s.d, r, [summaries[c.index] for c in cells], [c.hash for c in cells],
                                       run.rounds)
            # settle finished searches now, so this round's answers prune the next round
            for s in run.searches:
                if s.status == "running" and s.f is not None and s.f == s.g + 1:
                    s.status = "feasible"
                if s.status == "feasible":
                    p = s.answer
                    k = (s.d.family, s.scale)
                    cand = (p.cost_per_hour, s.d.index)
                    if k not in best or cand < best[k]:
                        best[k] = cand
            if on_round:
                on_round(run)
        bar.total = bar.n
        bar.refresh()
    finally:
        bar.close()
        if ray_started:
            import ray  # optional: ray

            ray.shutdown()
    return run


def _start_ray(backend: str, workers: int | None, address: str | None) -> bool:
    """One local Ray instance for all rounds (the Ray backend would start and stop one per round, seconds each);
    a cluster address is left to the backend, which connects per round. True if this call started it."""
    if backend != "ray" or address:
        return False

    ray = import_ray()
    if ray.is_initialized():
        return False
    ray.init(address="local", num_cpus=max(1, workers or os.cpu_count() or 1), include_dashboard=False,
             log_to_driver=False)
    return True


def _estimate(searches: Sequence[Search]) -> int:
    """Probes still ahead, at most: log2 of each running search's open bracket, plus its ends."""
    n = 0
    for s in searches:
        if s.status != "running":
            continue
        width = max(1, s.d.hi - max(s.g, s.d.lo - 1))
        n += (2 if not s.probes else 0) + math.ceil(math.log2(width)) if width > 1 else (0 if s.probes else 1)
    return n


def brute_force(spec: PlanSpec, summaries_for: Callable[[Deployment, float, int], Sequence[dict[str, Any]]]
                ) -> dict[tuple[str, float], tuple[Deployment, Probe] | None]:
    """Reference answer: every replica count of every deployment evaluated; per (family, scale) the feasible probe
    with the smallest (cost per hour, deployment index). For tests and checks of the search."""
    out: dict[tuple[str, float], tuple[Deployment, Probe] | None] = {}
    for scale in spec.scales:
        for d in spec.deployments:
            k = (d.family, scale)
            out.setdefault(k, None)
            for r in range(d.lo, d.hi + 1):
                p = evaluate(spec, d, r, summaries_for(d, scale, r), [], 0)
                if p.feasible:
                    if out[k] is None or (p.cost_per_hour, d.index) < (out[k][1].cost_per_hour, out[k][0].index):
                        out[k] = (d, p)
                    break
    return out


def binding_slo(searches: Sequence[Search]) -> dict[str, Any] | None:
    """The SLO that binds where nothing is feasible: at each deployment's largest replica count, the violated
    terms; the binding one is violated by the most deployments, ties broken by the largest relative miss."""
    tally: dict[str, list[float]] = {}
    for s in searches:
        if s.status != "infeasible":
            continue
        p = s.probes[s.d.hi]
        for v in p.violations:
            tally.setdefault(v["term"], []).append(v["headroom"] if v["headroom"] is not None else -math.inf)
    if not tally:
        return None
    term = max(tally, key=lambda t: (len(tally[t]), -min(tally[t])))
    worst = min(tally[term])
    return {"term": term, "violated_by": len(tally[term]),
            "worst_miss": None if worst == -math.inf else -worst,
            "all": {t: {"violated_by": len(h), "worst_miss": None if min(h) == -math.inf else -min(h)}
                    for t, h in tally.items()}}


def slo_term(spec: PlanSpec, text: str) -> SLOTerm | None:
    return next((t for t in spec.slo if str(t) == text), None)


def fit_range_lines(run: PlanRun) -> list[str]:
    """The fit-range cautions (:func:`dsparksim.results.notes.fit_range_cautions`) of every probe the plan ran,
    once per fitted profile."""
    spec = run.spec
    cfgs, summaries = [], []
    for se in run.searches:
        for r, p in sorted(se.probes.items()):
            cfgs.append(build_config(spec.options(se.d, se.scale, r, spec.seeds[0]), spec.source))
            summaries.append({"mean_running": p.mean_running})
    return fit_range_cautions(cfgs, summaries)
