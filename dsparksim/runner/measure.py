"""Measure a cost profile (format ``dsparksim-profile/1``) on the real engine: the orchestration of
:mod:`.grid` (which cells), :mod:`.timing` (timing them) and :mod:`.fitting` (the profile from the records).

Sweep: for each context length c and number of decoding requests n, the real engine (the simulator's
:class:`~dsparksim.sim.scheduler.Scheduler` stepped by the one :class:`~dsparksim.sim.driver.Driver` on the measured
clock, :class:`~.engine.MeasuredClock`, the very code that serves runs) is loaded with n requests whose prompts of c tokens are prefilled (untimed), then a
uniform verify length L = 0..K is forced on every request; after ``warmup`` discarded steps, ``reps`` steps are
timed. Each timed step yields its measured split: drafter forward, target forward at M = n(1+L) with the KV
tokens it read, and the rest (host: acceptance draw, policy, tensor building, sampling, bookkeeping).

Separation (as TensorRT-LLM's DSpark profiler does, the floor from the verify term):
* verify term: target-forward time = V0(M) + B(n) + s * kv_tokens + q * query_key_pairs, fitted by non-negative
  least squares over the cell medians (:func:`~.fitting.decompose_target`; s and q need >= 2 contexts, otherwise no context
  term; q, written as ``attention.seconds_per_query_kv`` when > 0, prices a request's 1 + L queries each scoring
  its whole cache, which the engine charges per request at its own context). V0 is the profile's
  staircase (floor lookup); B(n), what the forward costs per request whatever is verified, joins the floor.
* non-trimmable floor: drafter forward per n (median; parallel drafter tokens n*K), host time per n (median,
  including a representative scheduler workload: Algorithm 1's ranking and pricing of the n*K candidates) and
  B(n); the minimum over n is ``fixed_overhead_s`` and the rest ``batch_overhead(n)``.
* a cell's contexts are spread over [c/2, 3c/2] (mean c), as in a served batch (:func:`~.grid.cell_contexts`), or, with
  ``context_spread``, follow a workload's own context distribution scaled to mean c (:func:`~.grid.context_spread`;
  ``validate --cell-spread workload`` passes its own workload's, so the cells' attention padding is the served
  batches').
* drafter context: with >= 2 contexts, least squares of the drafter time per cell on D(n) + s_d * kv_tokens
  (:func:`~.fitting.fit_drafter_context`) gives ``drafters.<name>.seconds_per_kv_token`` (its attention over the context),
  written when > 0; the drafter table is then D(n), the time at no context. A negative slope is clipped to 0
  (no term) with a logged note.
* mtp1: a K=1 sweep over n and the same contexts gives its one-forward cost (kind "mtp"), with its own
  context term fitted as the block drafter's.
* anchor context: unless a measured context is at most ``anchor_context`` (32) tokens, the cells are also
  measured there (:attr:`MeasureConfig.grid_contexts`), so V0(M) is measured at (almost) no context (fitted
  jointly with the other contexts; ``decompose_target(v0_at_shortest=True)``, V0 from the anchor cells alone, is
  an option that measured no reliable gain).

A result whose verify term does not grow with M (ratio of the largest to the smallest M's time < min_growth) is
refused as flat, and any non-positive or non-finite median as inert: neither is ever written. An out-of-memory
error is recorded per cell under ``metadata.failed_cells`` and that cell contributes no measurement.
"""
from __future__ import annotations

import datetime as _dt
import platform
import time
from dataclasses import asdict
from typing import Any, Callable

import numpy as np
import torch
from tqdm import tqdm

from dsparksim.cost.profile import profile_from_dict
from dsparksim.errors import ConfigError
from dsparksim.runner import timing
from dsparksim.runner.drift import CALIBRATION_PROBES, DriftMonitor
from dsparksim.runner.executor import build_models, torch_dtype
from dsparksim.runner.fitting import (PREFILL_TIMES, cell_medians, fit_prefill, fit_profile, normalise_records,
                                      prefill_cell_rows, prefill_section)
from dsparksim.runner.grid import (PREFILL_CHUNKS, REFERENCE_CELL, MeasureConfig, prefill_prefixes,
                                   slot_tokens)
from dsparksim.runner.models import device_key, kv_capacity_tokens, load_target, model_key


class CellSweep:
    """Times every (context, n) cell of one drafter at a time, each normalised to the baseline speed by the drift
    monitor; a cell that cannot fit or runs out of memory is recorded under ``failed``, never measured."""

    def __init__(self, mc: MeasureConfig, target, proxy, cap: int, contexts: tuple[int, ...],
                 live: timing.LiveDrafters | None, progress: bool, log: Callable[[str], None]) -> None:
        self.mc, self.target, self.proxy, self.cap, self.live, self.log = mc, target, proxy, cap, live, log
        cells = [(c, n) for c in contexts for n in mc.n_reqs]
        # Shuffled (fixed seed) so a drift in background load does not line up with the n or context axis.
        self.cells = [cells[i] for i in np.random.default_rng(mc.executor.seed).permutation(len(cells))]
        self.failed: list[dict] = []
        self.bar = tqdm(total=len(self.cells) * (2 if mc.mtp1 else 1), desc="measure", disable=not progress)
        # interleaved reference timings: every cell is brought to the speed of the first one (the baseline that
        # validate normalises real runs to) and re-measured while the machine drifts past the threshold
        self.mon = (DriftMonitor(timing.reference_probe(target, proxy, mc.executor), threshold=mc.drift_threshold,
                                 gate=mc.drift_gate) if mc.drift else None)
        if self.mon is not None:
            self.mon.probe()           # untimed: the first forward of a process pays one-off allocation costs
            self.mon.calibrate("before the cells", probes=CALIBRATION_PROBES)

    def timed(self, fn: Callable[[], Any], label: str):
        """``fn()`` bracketed by reference timings (and its drift bracket), or plainly without drift checks."""
        if self.mon is None:
            return fn(), None
        mc = self.mc
        out, b, kept = self.mon.measure(fn, label, attempts=mc.drift_attempts)
        if not kept:
            self.log(f"measure: {label} drifted {100 * b.drift:.1f}% (threshold {100 * mc.drift_threshold:.0f}%) or "
                     f"ran outside the fast state (reference x{b.before / b.baseline:.2f}/x{b.after / b.baseline:.2f} "
                     f"of the baseline) on all {mc.drift_attempts} attempts; kept the last, normalised")
        return out, b

    def speed(self, b):
        return self.mon.speed(b) if b is not None else None

    def sweep(self, K: int, drafter: str, Lv: list[int], label: str) -> list[dict]:
        mc, ex = self.mc, self.mc.executor
        out = []
        for c, n in self.cells:
            need = n * slot_tokens(c, K, mc.warmup, mc.reps, spread=mc.context_spread)
            if need > self.cap:
                self.failed.append({"context": c, "n_req": n, "K": K, "error": f"skipped: needs {need} KV tokens, "
                                    f"the device holds about {self.cap}"})
            else:
                try:
                    cr, b = self.timed(lambda: timing.time_cell(self.target, self.proxy, ex, K, drafter, n, c, Lv,
                                                                mc.warmup, mc.reps, self.live, mc.context_spread),
                                       f"{label}ctx={c} n={n}")
                    out += normalise_records(cr, b, factor=self.speed(b))
                except Exception as e:  # noqa: BLE001 - OOM is recorded per cell; anything else is a bug
                    if not timing.is_oom(e):
                        raise
                    self.failed.append({"context": c, "n_req": n, "K": K, "error": f"out of memory: {str(e)[:200]}"})
                    self.log(f"measure: {label}ctx={c} n={n} ran out of memory; recorded as failed, not measured")
                    if torch.cuda.is_available():
                        torch.cuda.empty_cache()
                timing.release(ex)
            self.bar.update()
        return out

    def prefill_cells(self, max_M: int, contexts: tuple[int, ...]) -> list[dict] | None:
        """The paired prefill cells, normalised; None when they ran out of memory (no prefill term, reported)."""
        mc = self.mc
        try:
            pf, b = self.timed(lambda: timing.time_prefill_cells(self.target, self.proxy, mc.executor, mc.K,
                                                                 mc.block_drafter, max_M, mc.reps, self.live,
                                                                 prefill_prefixes(contexts)), "prefill cells")
            return normalise_records(pf, b, PREFILL_TIMES, factor=self.speed(b))
        except Exception as e:  # noqa: BLE001 - OOM: no prefill term (reported), never a partial one
            if not timing.is_oom(e):
                raise
            self.failed.append({"cell": "prefill", "error": f"out of memory: {str(e)[:200]}"})
            self.log("measure: the prefill cells ran out of memory; the profile gets no prefill term")
            return None


def check_contexts(mc: MeasureConfig, contexts: tuple[int, ...], cap: int) -> None:
    """A context no cell of which fits is refused before anything is timed, never written as measured."""
    for c in contexts:
        need = min(mc.n_reqs) * slot_tokens(c, mc.K, mc.warmup, mc.reps, spread=mc.context_spread)
        if need > cap:
            raise ConfigError("measure", "--contexts", f"context {c}: even {min(mc.n_reqs)} request(s) need {need} "
                              f"KV tokens and {mc.executor.device} holds about {cap} for this model; measure "
                              "shorter contexts")
    # likewise a batch size that fits no context (--n-req 1,100000; validate --concurrency 100000 profiled
    # 100001 batch sizes, every large one skipped, for hours before the run refused the users)
    c = min(contexts)
    for n in mc.n_reqs:
        need = n * slot_tokens(c, mc.K, mc.warmup, mc.reps, spread=mc.context_spread)
        if need > cap:
            raise ConfigError("measure", "--n-req", f"{n} requests need {need} KV tokens even at context {c} and "
                              f"{mc.executor.device} holds about {cap} for this model; measure fewer requests "
                              "(validate: fewer --concurrency users)")


def add_prefill(prof: dict[str, Any], fit: dict[str, Any], run: CellSweep, contexts: tuple[int, ...]
                ) -> tuple[list[dict] | None, list[dict] | None]:
    """Time the paired prefill cells and fit the profile's ``prefill`` section (and, live, the drafters' prompt
    cost); returns the block drafter's and mtp1's prefill records."""
    mc, max_M, pm = run.mc, prof["verify"]["M"][-1], None
    pf = run.prefill_cells(max_M, contexts)
    if pf is None:
        fit["prefill"] = {"skipped": "out of memory"}
    elif not pf:
        run.log(f"measure: no prefill term: even 4 decoding requests plus one {PREFILL_CHUNKS[0]}-token chunk exceed "
                f"the largest measured M={max_M}")
        fit["prefill"] = {"skipped": "largest measured M too small for a paired prefill cell"}
    else:
        pfit = fit_prefill(pf, prof)
        prof["prefill"] = prefill_section(
            pfit, f"fitted: NNLS over {pfit['cells']} paired steps ({pfit['decode_rows']} decoding requests "
                  f"without / with 1-2 prompt chunks of {list(PREFILL_CHUNKS)} tokens after "
                  f"{list(prefill_prefixes(contexts))} cached prompt tokens) of the added step time beyond the verify "
                  "term's growth")
        if run.live is not None:
            prof["drafters"][mc.block_drafter]["prefill_s_per_token"] = pfit["drafter_s_per_token"]
            if "mtp1" in prof["drafters"] and mc.mtp1:
                pm = timing.time_prefill_cells(run.target, run.proxy, mc.executor, 1, "mtp1", max_M, mc.reps,
                                               run.live, prefill_prefixes(contexts))
                prof["drafters"]["mtp1"]["prefill_s_per_token"] = fit_prefill(pm, prof)["drafter_s_per_token"]
        fit["prefill"] = pfit
    return pf, pm


METHOD = ("n_req x uniform verify length L=0..K x context sweep (a cell's contexts spread over {spread}); verify "
          "lengths interleaved step by step, warm-up rounds discarded, median of timed steps; target forward = "
          "V0(M) + B(n) + s*kv + q*qk by non-negative least squares over the cell medians (V0: verify staircase, "
          "made non-decreasing; B(n) = b*(n - n_min): per-request part, moved into the floor); drafter forward and "
          "host time (incl. a representative Algorithm-1 ranking) per n_req; floor = fixed_overhead_s + "
          "batch_overhead(n)")


def measure_metadata(mc: MeasureConfig, mcfg, ck: str, cap: int, contexts: tuple[int, ...], fit: dict[str, Any],
                     failed: list[dict], t_start: float) -> dict[str, Any]:
    """The measured profile's ``metadata``: what was measured, where, on which grid, and the fit's diagnostics."""
    ex = mc.executor
    mkey = model_key(mcfg, ck, ex.drafter_layers, ex.dtype, live=mc.live_models is not None)
    dkey = device_key(ex.device, ex.threads, ex.clock_name())
    return {
        "device": dkey, "model": mkey, "runner_device": dkey, "runner_model": mkey,
        "source": "measured by `dsparksim measure` on the real engine (dsparksim.runner)",
        "method": METHOD.format(spread="[c/2, 3c/2], mean c" if mc.context_spread is None else
                                "c x the quantiles of grid.context_spread, mean c"),
        "dtype": ex.dtype, "tensor_parallel": 1,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "kv_capacity_tokens": cap,
        "torch": torch.__version__, "python": platform.python_version(), "host": platform.node(),
        "target_config": asdict(mcfg), "checkpoint": ck, "drafter_proxy_layers": ex.drafter_layers,
        "drafting": f"live:{mc.live_models}" if mc.live_models is not None else "proxy",
        "grid": {"K": mc.K, "n_req": list(mc.n_reqs), "L": list(range(mc.K + 1)), "contexts": list(contexts),
                 "requested_contexts": list(mc.contexts), "warmup": mc.warmup,
                 "reps": mc.reps,
                 "context_spread": None if mc.context_spread is None else list(mc.context_spread)},
        "fit": fit, "failed_cells": failed, "wall_s": round(time.time() - t_start, 1),
    }


def add_cells(meta: dict[str, Any], mc: MeasureConfig, recs: list[dict], mtp: list[dict], pf, pm, live) -> None:
    """The raw cell medians: validate re-times these very cells beside every real step (runner.paired); a live
    profile's cells are live steps, re-timed as such beside live runs."""
    meta["cells"] = {mc.block_drafter: cell_medians(recs, mc.K)}
    if mtp:
        meta["cells"]["mtp1"] = cell_medians(mtp, 1)
    pc = prefill_cell_rows(pf)
    if pc:
        # a prefill-only step of the drafter proxy runs no drafter, so its cells serve every drafter; a live
        # step updates the drafter's state over the prompt, so mtp1 has its own (measured with mtp1's state)
        meta["prefill_cells"] = {mc.block_drafter: {"rows": pc}}
        if mtp:
            rows = pc if live is None else prefill_cell_rows(pm)
            if rows:
                meta["prefill_cells"]["mtp1"] = {"rows": rows}


DRIFT_NOTE = ("every cell started in the machine's fast state (reference within the gate of the baseline, the lower "
              "quartile of the calibration probes), timed between two reference-cell timings and divided by their "
              "mean over the baseline; cells whose reference moved more than the threshold or left the fast state "
              "re-measured")


def measure(mc: MeasureConfig, progress: bool = True, log: Callable[[str], None] = print,
            target=None, proxy=None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run the sweep; returns (profile dict validated by the core loader, raw records)."""
    ex = mc.executor
    mcfg, tmodel, ck = load_target(mc.model, ex.device, ex.dtype)
    if target is None or proxy is None:
        target, proxy = build_models(mcfg, ex, tmodel)
    contexts = mc.grid_contexts
    if contexts != tuple(mc.contexts):
        log(f"measure: also measuring context {contexts[0]} (anchor: the verify staircase V0(M) is the forward's cost "
            "without context, which prefill chunks and short requests pay; measured, not extrapolated to it)")
    wbytes = sum(p.numel() * p.element_size() for p in target.parameters())
    cap = kv_capacity_tokens(mcfg, ex.device, torch_dtype(ex.dtype).itemsize * 8, wbytes)
    check_contexts(mc, contexts, cap)
    t_start = time.time()
    live = None
    if mc.live_models is not None:
        live = timing.LiveDrafters.load(mc.live_models, [mc.block_drafter] + (["mtp1"] if mc.mtp1 else []), target,
                                        mc.K)
        log(f"measure: live-drafter steps with the trained {mc.block_drafter}"
            + (" and mtp1" if mc.mtp1 else "") + f" from {mc.live_models}")
    run = CellSweep(mc, target, proxy, cap, contexts, live, progress, log)
    recs = run.sweep(mc.K, mc.block_drafter, list(range(mc.K + 1)), "cell ")
    # every context, as the block drafter: mtp1's own attention over the context is a per-step term too
    # (measured at one context only, mtp1 at ~1k contexts was priced 19% under)
    mtp = run.sweep(1, "mtp1", [0, 1], "mtp1 cell ") if mc.mtp1 else []
    run.bar.close()
    lost = sorted(set(contexts) - {int(r["ctx"]) for r in recs})
    if lost:
        # every cell at these contexts ran out of memory: a profile claiming them would price what was never timed
        raise ConfigError("measure", "--contexts", f"no cell at context(s) {lost} could be measured ("
                          + "; ".join(f["error"][:80] for f in run.failed[:3]) + "); nothing written: measure shorter "
                          "contexts or fewer requests")
    prof = fit_profile(recs, mtp, mc)
    fit = prof.pop("_fit")
    if fit["drafter_context"]["seconds_per_kv_token"] == 0.0:     # clipped or refused: say so, never silently
        log(f"measure: drafter context term: {fit['drafter_context']['note']}")
    if fit["mtp1_context"] and fit["mtp1_context"]["seconds_per_kv_token"] == 0.0:
        log(f"measure: mtp1 context term: {fit['mtp1_context']['note']}")
    pf, pm = add_prefill(prof, fit, run, contexts) if mc.prefill else (None, None)
    name = mc.name or f"{'cuda' if torch.device(ex.device).type == 'cuda' else 'cpu'}-" \
                      f"{mc.model.split(',')[0].replace(':', '-')}"
    prof["name"] = name
    prof["metadata"] = measure_metadata(mc, mcfg, ck, cap, contexts, fit, run.failed, t_start)
    add_cells(prof["metadata"], mc, recs, mtp, pf, pm, live)
    if run.mon is not None:
        prof["metadata"]["drift"] = {**run.mon.summary(), "reference_cell": dict(REFERENCE_CELL), "note": DRIFT_NOTE}
    profile_from_dict(prof, source=f"measured:{name}")  # refuse to hand back anything the core cannot load
    return prof, {"block": recs, "mtp1": mtp, "prefill": pf}
