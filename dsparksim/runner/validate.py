"""Simulator vs real: the same workloads, policies and acceptance replayed on the real engine and simulated on
the profile measured by the same command; a table of relative errors, an overlay plot and per-step residuals.

Relative error = (simulated - real) / real for output throughput, median per-user tokens/s, mean verify length
and tau, the real figures brought to the profile's machine speed (:mod:`.drift`): each cell is run ``repeats``
times, every window of ``window_s`` measured seconds starts in the machine's fast state and is re-timed against a
reference cell, and each step's time is the median over the repeats. Every real step is priced by the profile at
its exact shape and compared with its measured split (:mod:`.residuals`), by step shape and by cost term, so an
error can be traced to the term that causes it. Policies that cannot run for real are refused before anything is
measured (:func:`precheck`).
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

from dsparksim.backend.checkpoint import load_target as load_checkpoint
from dsparksim.runner.live import PromptSource
from dsparksim.results.metrics import summarize
from dsparksim.acceptance import load_acceptance
from dsparksim.policies import make_policy
from dsparksim.config import EngineConfig, RunConfig, jsonable
from dsparksim.errors import ConfigError
from dsparksim.cost.profile import load_profile, profile_from_dict, read_profile_dict, save_profile
from dsparksim.sim.simulate import load_label, RunOutput, simulate, write_run
from dsparksim.results.outputs import previous_kept_on_error
from dsparksim.traffic import TrafficConfig
from dsparksim.runner.executor import build_models
from dsparksim.runner.drift import (CALIBRATION_PROBES, DEFAULT_GATE, DEFAULT_THRESHOLD, DriftMonitor, RunWindows,
                    warp_result)
from dsparksim.runner.grid import REFERENCE_CELL, MeasureConfig, context_spread_from_csv
from dsparksim.runner.measure import measure
from dsparksim.runner.timing import LiveDrafters, reference_probe
from dsparksim.runner.residuals import attribute, by_shape, by_term, step_residuals
from dsparksim.runner.models import load_target
from dsparksim.runner.paired import BASELINES, PairedCells, RunPairs, fit_vs_cells
from dsparksim.runner.run import RunnerConfig, real_run

POLICIES = ("mtp1", "fixed:7", "threshold:0.5", "goodput", "confidence", "confidence-async:2")
METRICS = {"throughput": "output_throughput_tok_s", "tps_user_median": "tps_user_median",
           "mean_verify_len": "mean_verify_len", "tau": "tau"}


CELL_SPREADS = ("workload", "even")


@dataclass(frozen=True)
class ValidateConfig:
    """What to validate. ``requests_per_user``: closed-loop pool = max(min_requests, users * this)."""

    policies: tuple[str, ...] = POLICIES
    concurrency: tuple[int, ...] = (1, 4, 16)
    acceptance: str = "traces/sample_dspark_k7.csv"
    mtp1_acceptance: str = "mtp1"
    K: int = 7
    requests_per_user: int = 8
    min_requests: int = 16
    prompt_tokens: tuple[int, int] = (16, 64)
    output_tokens: tuple[int, int] = (32, 96)
    prefill_chunk_tokens: int = 128
    warmup_frac: float = 0.1
    repeats: int = 5             # real runs per cell; each step's time is the median over them
    drift_threshold: float = DEFAULT_THRESHOLD   # largest reference-cell drift across one window that is steady
    drift_gate: float | None = DEFAULT_GATE      # windows start (wait) and must end in the fast state; None: off
    window_s: float = 0.25       # measured run time between in-run reference timings
    max_unsteady_share: float = 0.25   # a run with more of its measured time in unsteady windows is discarded
    drift_attempts: int = 1      # real runs tried per repeat while the machine drifts past the threshold
    normalise: bool = True       # False: real figures as measured (drift still timed and reported, nothing discarded)
    pair_cells: bool = True      # re-time the profile cell nearest each real decode step right after it (paired.py)
    pair_span: int = 4           # a step's paired factor: median over this many paired steps each side
    pair_baseline: str = "fit"   # a paired cell's reference time: the profile's price of its shape, or "cell" median
    drift_profile_baseline: bool = True   # --profile: normalise to the profile's own reference timing if stored
    seed: int = 0
    # the profile cells' contexts: "even" = evenly over [c/2, 3c/2]; "workload" = the spread of this validation's
    # own decode contexts (measure.context_spread of lengths.csv). One A/B on the issue-13 grid (2026-12-02) moved
    # the 32-user bias from +3..+7.5% to -1.4..+3.2% but 4-16 users from -1..+2.8% to +1.5..+5.9% (medians
    # 1.0%/1.2% even vs 2.3%/2.7% workload), so the default stays "even"
    cell_spread: str = "even"
    profile: str | None = None   # an already measured profile (same model/device, checked); None = measure now
    measure: MeasureConfig = field(default_factory=MeasureConfig)
    runner: RunnerConfig = field(default_factory=RunnerConfig)

    def __post_init__(self) -> None:
        if self.drift_attempts < 1:
            raise ConfigError("validate", "drift_attempts", f"must be >= 1, got {self.drift_attempts}")
        if not self.drift_threshold > 0:
            raise ConfigError("validate", "drift_threshold", f"must be > 0, got {self.drift_threshold}")
        if self.drift_gate is not None and not self.drift_gate > 0:
            raise ConfigError("validate", "drift_gate", f"must be > 0 (or None: off), got {self.drift_gate}")
        if not self.window_s > 0:
            raise ConfigError("validate", "window_s", f"must be > 0, got {self.window_s}")
        if not 0 <= self.max_unsteady_share <= 1:
            raise ConfigError("validate", "max_unsteady_share", f"must be in [0, 1], got {self.max_unsteady_share}")
        if self.pair_baseline not in BASELINES:
            raise ConfigError("validate", "pair_baseline", f"expected one of {BASELINES}, got {self.pair_baseline!r}")
        if self.cell_spread not in CELL_SPREADS:
            raise ConfigError("validate", "cell_spread", f"expected one of {CELL_SPREADS}, got {self.cell_spread!r}")
        if self.pair_span < 0:
            raise ConfigError("validate", "pair_span", f"must be >= 0, got {self.pair_span}")
        if self.repeats < 1:
            raise ConfigError("validate", "repeats", f"must be >= 1, got {self.repeats}")
        if not self.policies or not self.concurrency:
            raise ConfigError("validate", "policies/concurrency", "need at least one policy and one level")
        if self.profile is None and max(self.concurrency) * (1 + self.K) + self.prefill_chunk_tokens > max(self.measure.n_reqs) * (1 + self.measure.K):
            raise ConfigError("validate", "concurrency", f"{max(self.concurrency)} users x (1+K) plus a prefill chunk "
                              f"of {self.prefill_chunk_tokens} exceed the profile's largest measured batch "
                              f"{max(self.measure.n_reqs)} x (1+{self.measure.K}); measure larger n_req")


def write_lengths(path: Path, vc: ValidateConfig, n: int = 400) -> Path:
    """A length-only CSV (prompt, output) drawn uniformly from the configured ranges (fixed seed)."""
    rng = np.random.default_rng(vc.seed + 12345)
    p = rng.integers(vc.prompt_tokens[0], vc.prompt_tokens[1] + 1, n)
    o = rng.integers(vc.output_tokens[0], vc.output_tokens[1] + 1, n)
    pd.DataFrame({"num_prefill_tokens": p, "num_decode_tokens": o}).to_csv(path, index=False)
    return path


def write_live_lengths(path: Path, vc: ValidateConfig) -> Path:
    """Live mode: every eval prompt at its native token length, with its domain, and a drawn output length, so
    no prompt is packed and the live contexts are the ones the traces were collected on."""
    ps = PromptSource.from_models(vc.runner.models, vc.runner.prompts_dir)
    nat = ps.native_lengths()
    rng = np.random.default_rng(vc.seed + 12345)
    o = rng.integers(vc.output_tokens[0], vc.output_tokens[1] + 1, len(nat))
    pd.DataFrame({"num_prefill_tokens": [n for _, n in nat], "num_decode_tokens": o,
                  "domain": [d for d, _ in nat]}).to_csv(path, index=False)
    return path


def run_config(vc: ValidateConfig, policy: str, users: int, profile: str, lengths: str) -> RunConfig:
    n = max(vc.min_requests, users * vc.requests_per_user)
    dom = "trace" if vc.runner.mode == "live" else "mix:math=1,code=1,chat=1"
    t = TrafficConfig(mode="closed", concurrency=users, num_requests=n, lengths=lengths, domain=dom)
    # kv_policy reserve: the real runner reserves KV at admission, so the simulated side must too
    e = EngineConfig(block_size=vc.K, max_num_seqs=users, prefill_chunk_tokens=vc.prefill_chunk_tokens,
                     kv_policy="reserve")
    return RunConfig(policy=policy, profile=profile, acceptance=vc.acceptance, mtp1_acceptance=vc.mtp1_acceptance,
                     engine=e, traffic=t, seed=vc.seed)


def _warm(out, frac: float) -> Any:
    """Re-summarise a RunOutput with the first ``frac`` of its run time discarded as warm-up."""
    res = out.result
    s = summarize(res, policy=out.summary["policy"], load=load_label(out.config), warmup_s=frac * res.sim_time_s,
                  closed_loop=True)
    return s


def precheck(vc: ValidateConfig) -> None:
    """Everything that can be refused without measuring, refused first: policy specs, policies that cannot run
    for real (the oracle reads the true accepted length), verify lengths beyond K, and an acceptance trace
    recorded for another K. Runs before any model is built or any profile cell is timed."""
    for spec in vc.policies:
        pol = make_policy(spec)
        if pol.needs_oracle:
            raise ConfigError("validate", "policies", f"{spec!r} reads the true accepted length: it exists only in "
                              "the simulator and cannot run on the real engine; drop it (nothing was measured)")
        pol.reset(vc.K, np.random.default_rng(0))        # e.g. fixed:7 at K=5 is refused here, not mid-run
    if vc.runner.mode == "live":                         # the eval prompts are read after the profile otherwise
        PromptSource.from_models(vc.runner.models, vc.runner.prompts_dir)
    for spec, K in ((vc.acceptance, vc.K), (vc.mtp1_acceptance, 1)):
        d = load_acceptance(spec, K).describe()
        tK = d.get("trace_K")
        if tK is not None and tK != K:
            raise ConfigError(spec, "K", f"the acceptance trace was recorded with K={tK} but the validation "
                              f"uses K={K}; pass an acceptance source for K={K} (e.g. --acceptance dspark)")
        if vc.runner.mode == "live":
            check_live_trace(vc, spec, d, "mtp1" if K == 1 else vc.runner.live_drafter)


def no_draft_caution(vc: ValidateConfig, prof: dict | None) -> str | None:
    """The caution for a validated policy that drafts nothing (``none``, K = 0) on a profile without K = 0 cells.

    `measure` times every cell with the drafter (proxy or live) and a speculative step's host loop (the policy's
    ranking of n*K candidates, the acceptance draw), and the profile's floor (fixed_overhead_s + batch_overhead) is
    that host loop whatever K is: a ``none`` step, which runs neither, is priced with it. Measured 2026-12-05 on the
    shipped cpu-tiny profile (validate --profile cpu-tiny --policies none,fixed:7 --concurrency 1,4): host priced
    0.52 ms vs 0.34-0.36 ms measured per none step at 1 user in two runs (+44-54% of the host loop, 7-9% of the step), 0.78 vs 0.68 ms at
    4 users, while fixed:7's host was priced within 0.03 ms. The profile format has one floor, so K = 0 cells cannot
    be measured into it; the comparison is still run (it shows the gap), and said to include this term."""
    if all(make_policy(p).drafts for p in vc.policies):
        return None
    if "none" in (((prof or {}).get("metadata") or {}).get("cells") or {}):   # prof None: measured now, without
        return None
    nodraft = ", ".join(p for p in vc.policies if not make_policy(p).drafts)
    return (f"{nodraft} drafts nothing (K = 0) but the profile has no K = 0 cells: its floor is a speculative step's "
            "host loop (measured with the drafter and the verify-length search), so its steps are priced with that "
            "loop and its error includes it (on cpu-tiny: host +44-54% at 1 user, 7-9% of a step)")


def check_live_trace(vc: ValidateConfig, spec: str, described: dict, drafter: str) -> None:
    """--live compares the trained pair with the simulator replaying traces collected from that same pair: a
    parametric source or a trace of another drafter or target (the synthetic sample: a 159% "error", `dspark`:
    181%) is refused."""
    if described.get("trace_K") is None:
        raise ConfigError(spec, "acceptance", f"--live compares the trained pair with the simulator replaying the "
                          f"{drafter} trace collected from it (`dsparksim collect`), got the {described.get('kind')} "
                          f"source {spec!r}")
    meta = described.get("trace_metadata") or {}
    if meta.get("drafter") != drafter:
        raise ConfigError(spec, "drafter", f"the trace was recorded for drafter {meta.get('drafter')!r}, but --live "
                          f"serves {drafter!r}; pass the trace `dsparksim collect` wrote for it")
    short = load_checkpoint(Path(vc.runner.models) / "target.pt")[1]["sha256"][:12]
    if f"sha256 {short}" not in str(meta.get("target", "")):
        raise ConfigError(spec, "target", f"the trace was collected from another target ({meta.get('target')!r}), "
                          f"not {Path(vc.runner.models) / 'target.pt'} (sha256 {short}); collect traces from these "
                          "models (`dsparksim collect --models ...`)")


# what `validate` writes into OUT: a folder holding anything else is refused by the CLI; an earlier validation's
# files are replaced only when a new one finishes (REPORT.md last written, so a folder with it is a finished one)
OUT_NAMES = frozenset(("REPORT.md", "summary.json", "errors.csv", "step_residuals.csv", "residuals_by_shape.csv",
                       "residuals_by_term.csv", "frontier_overlay.png", "runs", "lengths.csv", "profile.json",
                       "profile_raw.json"))


def given_profile(vc: ValidateConfig) -> tuple[dict, Path, Any] | None:
    """``--profile``, read and checked before any model is built or file written: shipped names resolve, a bad file
    names its line, a profile of another K is refused as such (not as a range error of the simulated side)."""
    if vc.profile is None:
        return None
    d, p = read_profile_dict(vc.profile)
    given = d, p, profile_from_dict(d, str(p))      # read once; the core loader's checks too
    gK = ((d.get("metadata") or {}).get("grid") or {}).get("K")
    if gK is not None and int(gK) != vc.K:
        raise ConfigError(str(p), "-K", f"the profile was measured with K={gK} but this validation uses "
                          f"K={vc.K}: validate with -K {gK}, or measure a profile with -K {vc.K}")
    return given


def obtain_profile(vc: ValidateConfig, out: Path, lengths: Path, given, target, proxy, progress: bool,
                   log: Callable[[str], None]) -> tuple[dict, Path, Any]:
    """The profile the simulated side runs on: ``given`` (``--profile``) or one measured now into OUT."""
    if given is not None:
        log(f"validate: using the measured profile {given[1]}")
        return given
    mc = replace(vc.measure, model=vc.runner.model, executor=vc.runner.executor, K=vc.K,
                 drift_threshold=vc.drift_threshold)
    if vc.cell_spread == "workload" and mc.context_spread is None:
        # cells whose contexts spread like the served batches': the runner pads each attention group to its
        # longest context, so a cell spread less widely than the real batches under-prices them
        mc = replace(mc, context_spread=context_spread_from_csv(lengths))
        q = mc.context_spread
        log(f"validate: profile cells spread like this workload's decode contexts ({q[0]:.2f}-{q[-1]:.2f} x "
            "the mean)")
    log(f"validate: measuring the profile ({len(mc.n_reqs)} n_req x {mc.K + 1} L x {len(mc.grid_contexts)} contexts)")
    prof, raw = measure(mc, progress=progress, log=log, target=target, proxy=proxy)
    ppath = save_profile(prof, out / "profile.json")
    # the raw per-step cell records, as `measure --raw` writes them: refits offline without re-measuring
    (out / "profile_raw.json").write_text(json.dumps(raw) + "\n")
    return prof, ppath, load_profile(str(ppath))


def drift_monitor(vc: ValidateConfig, prof: dict, probe: Callable[[], float]) -> DriftMonitor:
    """The run-time drift monitor; the profile's own reference timing is the speed every real figure is brought
    back to (when it timed the same reference cell)."""
    pd_ = prof["metadata"].get("drift") or {}
    same_cell = pd_.get("reference_cell") == REFERENCE_CELL
    base = pd_.get("baseline_s") if same_cell and (vc.profile is None or vc.drift_profile_baseline) else None
    mon = DriftMonitor(probe, threshold=vc.drift_threshold, baseline=base, gate=vc.drift_gate)
    mon.calibrate("before the runs", probes=1 if base is not None else CALIBRATION_PROBES)
    return mon


def paired_cells(vc: ValidateConfig, prof: dict, ppath: Path, target, proxy,
                 log: Callable[[str], None]) -> PairedCells | None:
    """The profile's cells re-timed beside every real step (:mod:`.paired`), or None (drift windows only)."""
    if not (vc.pair_cells and vc.normalise):
        return None
    drafting = str(prof["metadata"].get("drafting", "proxy"))
    live = vc.runner.mode == "live"
    if live != drafting.startswith("live:"):
        # the stored cells are steps of the other kind (proxy vs trained drafter): not this run's shape
        log(f"validate: the profile's cells were measured on {drafting!r} steps, not on this run's "
            f"{'live' if live else 'drafter-proxy'} steps; real runs are normalised by the drift windows")
        return None
    lv = None
    if live and prof["metadata"].get("cells"):
        lv = LiveDrafters.load(vc.runner.models, sorted(prof["metadata"]["cells"]), target, vc.K)
    cells = PairedCells.from_profile(prof, target, proxy, vc.runner.executor, vc.pair_baseline, live=lv)
    if cells is None:
        log(f"validate: the profile {ppath} stores no cell timings (metadata.cells, written by `dsparksim "
            "measure` since 2026-12-01): real runs are normalised by the drift windows, not paired cells")
    return cells


def write_cell_runs(cell: Path, real: Any, sim: Any, tries: list["TimedRun"]) -> None:
    """One (policy, users) cell's real and simulated runs, with every repeat's paired-cell tables."""
    write_run(real, cell / "real", steps=True)
    for i, t in enumerate(tries):
        if t.pairs is None:
            continue
        t.pairs.table().to_csv(cell / "real" / f"paired_{i + 1}.csv", index=False, float_format="%.9g")
        if t.pairs.pf_log:
            t.pairs.prefill_table().to_csv(cell / "real" / f"paired_prefill_{i + 1}.csv", index=False,
                                           float_format="%.9g")
        if t.pairs.mx_log:
            t.pairs.mixed_table().to_csv(cell / "real" / f"paired_mixed_{i + 1}.csv", index=False,
                                         float_format="%.9g")
    write_run(sim, cell / "sim", steps=True)


def cell_row(vc: ValidateConfig, pol: str, users: int, tr: "TimedRun", tries: list["TimedRun"], real: Any,
             sim: Any, kept: bool, factor: float) -> dict[str, Any]:
    """The errors table's row of one cell: how it was measured, and each metric real vs simulated."""
    rs, ss = _warm(real, vc.warmup_frac), _warm(sim, vc.warmup_frac)
    rraw = _warm(tr.raw, vc.warmup_frac)
    pairs = [t.pairs for t in tries if t.pairs is not None]
    row: dict[str, Any] = {"policy": pol, "users": users, "kept": kept, "speed_factor": factor,
                           "drift": tr.max_drift, "unsteady_share": tr.unsteady_share, "windows": tr.windows,
                           "paired_steps": tr.paired,
                           "paired_prefill_steps": sum(len(p.pf_log) for p in pairs),
                           "paired_mixed_steps": sum(len(p.mx_log) for p in pairs),
                           "paired_cell_over_fit": _mean_or_nan(
                               t.norm.summary["speed_normalised"].get("paired_cell_median_over_fit")
                               for t in tries),
                           "ref_min_ms": 1e3 * tr.ref_min, "ref_max_ms": 1e3 * tr.ref_max,
                           "real_repeats_throughput_raw": ";".join(
                               f"{_warm(t.raw, vc.warmup_frac)['output_throughput_tok_s']:.1f}" for t in tries)}
    for short, key in METRICS.items():
        r, s = rs[key], ss[key]
        if short in RATES:
            row[f"{short}_real_raw"] = rraw[key]
        row[f"{short}_real"], row[f"{short}_sim"] = r, s
        row[f"{short}_rel_err"] = (s - r) / r if r else float("nan")
    return row


def validate_cell(vc: ValidateConfig, pol: str, users: int, ppath: Path, lengths: Path, profile: Any,
                  mon: DriftMonitor, target, proxy, cells: PairedCells | None, out: Path,
                  log: Callable[[str], None]) -> tuple[dict[str, Any], pd.DataFrame]:
    """One (policy, users) cell: ``vc.repeats`` real runs, the simulated run, their files, the errors row and
    the real steps' residuals against the profile."""
    cfg = run_config(vc, pol, users, str(ppath), str(lengths))
    label = f"{pol} users={users}"
    tries = [timed_run(vc, cfg, mon, f"{label} #{i + 1}", target, proxy, cells) for i in range(vc.repeats)]
    # per-step median over the repeats (normalised figures; interference is removed by the windows'
    # reference timings and the median, not by picking the fastest)
    tr = combine_runs(tries, cfg)
    real, kept, factor = (tr.norm, tr.kept, tr.factor) if vc.normalise else (tr.raw, True, 1.0)
    sim = simulate(cfg)
    cell = out / "runs" / f"{pol.replace(':', '_')}-c{users}"
    write_cell_runs(cell, real, sim, tries)
    row = cell_row(vc, pol, users, tr, tries, real, sim, kept, factor)
    drafter = real.inputs["policy"]["drafter"]
    # the steps are at baseline speed already (warped); factor 1 keeps them as they are
    st = step_residuals(real.result.steps, profile, real.inputs["policy"]["block_size"], drafter)
    st.insert(0, "users", users)
    st.insert(0, "policy", pol)
    st.to_csv(cell / "real" / "residuals.csv", index=False, float_format="%.9g")
    row["real_steps"] = int(len(st))
    row["step_time_resid_pct"] = 100 * float(st["r_total"].sum() / st["dt"].sum())
    for t in ("target", "draft", "host"):
        row[f"{t}_resid_pct"] = 100 * float(st[f"r_{t}"].sum() / st["dt"].sum())
    log(f"validate: {pol:>20} users={users:<3} throughput real {row['throughput_real']:.1f} (raw "
        f"{row['throughput_real_raw']:.1f}, speed x{factor:.3f}, {tr.windows} windows, "
        f"{100 * tr.unsteady_share:.0f}% unsteady{'' if kept else ', DRIFTING'}) "
        f"sim {row['throughput_sim']:.1f} "
        f"({100 * row['throughput_rel_err']:+.1f}%), per-user median "
        f"{100 * row['tps_user_median_rel_err']:+.1f}%")
    return row, st


def write_outputs(vc: ValidateConfig, out: Path, rows: list[dict], resid: list[pd.DataFrame], prof: dict,
                  mon: DriftMonitor, cells: PairedCells | None, t0: float) -> pd.DataFrame:
    """errors.csv, the residual tables, summary.json, the overlay plot and REPORT.md (last: a folder with it is a
    finished validation)."""
    df = pd.DataFrame(rows)
    df.to_csv(out / "errors.csv", index=False, float_format="%.6g")
    steps = pd.concat(resid, ignore_index=True)
    steps.to_csv(out / "step_residuals.csv", index=False, float_format="%.9g")   # exact enough to re-add
    shape, term = by_shape(steps), by_term(steps)
    shape.to_csv(out / "residuals_by_shape.csv", index=False, float_format="%.4g")
    term.to_csv(out / "residuals_by_term.csv", index=False, float_format="%.6g")
    summ = error_summary(df)
    summ["wall_s"] = round(time.time() - t0, 1)
    summ["cautions"] = [c for c in (no_draft_caution(vc, prof),) if c]
    summ["drift"] = mon.summary()
    summ["profile_drift"] = prof["metadata"].get("drift")
    summ["profile_fit_vs_cells"] = fit_vs_cells(cells) if cells is not None else None
    summ["target_term_scale_error"] = attribute(
        steps["r_target"].to_numpy(), {"verify": steps["m_verify"].to_numpy(), "context": steps["m_context"].to_numpy(),
                                       "prefill": steps["m_prefill_target"].to_numpy(),
                                       "per_request": steps["m_per_request"].to_numpy()})
    (out / "summary.json").write_text(json.dumps({"summary": summ, "config": _jsonable(vc),
                                                  "profile": prof["name"]}, indent=2, default=float) + "\n")
    plot_overlay(df, out / "frontier_overlay.png")
    write_report(df, summ, vc, out / "REPORT.md", prof, shape, term)
    return df


def validate(vc: ValidateConfig, out_dir: str | Path, progress: bool = True,
             log: Callable[[str], None] = print) -> pd.DataFrame:
    """Measure, run real + simulated for every (policy, users), write the report; returns the error table.

    Refusals that need no measurement come first (:func:`precheck`). Every real run is bracketed by timings of
    the reference cell (:mod:`.drift`): its figures and step times are brought to the profile's machine speed,
    and a run during which the speed moved past ``vc.drift_threshold`` is re-run (``vc.drift_attempts`` in all)
    and counted as discarded; a cell with no steady attempt is kept in the table but flagged and left out of
    the medians."""
    precheck(vc)
    given = given_profile(vc)
    caution = no_draft_caution(vc, given[0] if given else None)
    if caution:
        log(f"validate: caution: {caution}")
    # an earlier validation's files are moved aside and deleted only once this one has finished; an error or
    # Ctrl-C removes what this one wrote and puts them back (a --profile inside OUT stays where it is)
    with previous_kept_on_error(out_dir, sorted(OUT_NAMES), keep=(given[1],) if given else ()) as out:
        return validate_into(vc, out, given, progress, log)


def validate_into(vc: ValidateConfig, out: Path, given, progress: bool, log: Callable[[str], None]) -> pd.DataFrame:
    """:func:`validate`'s work, writing into ``out`` (which :func:`validate` restores if this raises)."""
    t0 = time.time()
    ex = vc.runner.executor
    mcfg, tmodel, _ = load_target(vc.runner.model, ex.device, ex.dtype)
    target, proxy = build_models(mcfg, ex, tmodel)
    probe = reference_probe(target, proxy, ex)
    lengths = (write_live_lengths if vc.runner.mode == "live" else write_lengths)(out / "lengths.csv", vc)
    prof, ppath, profile = obtain_profile(vc, out, lengths, given, target, proxy, progress, log)
    mon = drift_monitor(vc, prof, probe)
    cells = paired_cells(vc, prof, ppath, target, proxy, log)
    rows, resid = [], []
    for users in vc.concurrency:
        for pol in vc.policies:
            row, st = validate_cell(vc, pol, users, ppath, lengths, profile, mon, target, proxy, cells, out, log)
            rows.append(row)
            resid.append(st)
    return write_outputs(vc, out, rows, resid, prof, mon, cells, t0)


RATES = ("throughput", "tps_user_median")


@dataclass
class TimedRun:
    """One real run with its drift windows: as measured (``raw``) and at baseline speed (``norm``)."""

    raw: Any
    norm: Any
    factor: float            # measured / normalised step time over the run (> 1: the machine was slower)
    windows: int
    unsteady_share: float    # share of the run's measured time in windows that were not steady
    max_drift: float         # largest max/min - 1 of a window's two reference timings
    ref_min: float
    ref_max: float
    kept: bool
    paired: int = 0          # steps normalised by their own paired profile cell (0: by the drift windows)
    pairs: RunPairs | None = None


def timed_run(vc: ValidateConfig, cfg: RunConfig, mon: DriftMonitor, label: str, target, proxy,
              cells: PairedCells | None = None) -> TimedRun:
    """A real run re-timed against the reference every ``vc.window_s`` of its measured time (each window starts
    in the fast state, :class:`~.drift.RunWindows`), its steps normalised and its timeline rebuilt
    (:func:`~.drift.warp_result`); re-run (``vc.drift_attempts`` in all) while more than ``max_unsteady_share``
    of its time fell in unsteady windows. Every attempt is counted kept or discarded on the monitor. A step's
    factor is its paired profile cell's (``cells``, :mod:`.paired`) when the run had paired steps, else its
    window's."""
    drafter = make_policy(cfg.policy).drafter or vc.measure.block_drafter
    for i in range(vc.drift_attempts):
        lab = label if i == 0 else f"{label} (retry {i})"
        win = RunWindows(mon, vc.window_s)
        pairs = RunPairs(cells, drafter, vc.pair_span) if cells is not None else None
        raw = real_run(cfg, vc.runner, target=target, proxy=proxy, checkpoint=win.checkpoint,
                       checkpoint_every_s=vc.window_s, after_step=pairs.after_step if pairs else None)
        n = len(raw.result.steps["dt"])
        win.close(n)
        f, ok = win.step_factors(n)
        fp = pairs.factors(n) if pairs is not None else None
        if fp is not None:
            f = fp
        dt = np.asarray(raw.result.steps["dt"], float)
        share = float(dt[~ok].sum() / dt.sum()) if dt.sum() > 0 else 0.0
        res = warp_result(raw.result, f)
        norm = _normalised_output(raw, res, cfg, {
            "windows": len(win.marks) - 1, "unsteady_share": share, "factor": float(dt.sum() / res.steps["dt"].sum()),
            "reference_s": [[s_, t] for s_, t in win.marks], "baseline_s": mon.baseline,
            "normalised_by": "paired profile cells" if fp is not None else "drift windows",
            "paired_steps": len(pairs.idx) if pairs is not None else 0,
            "paired_prefill_steps": len(pairs.pf_log) if pairs is not None else 0,
            "paired_mixed_steps": len(pairs.mx_log) if pairs is not None else 0,
            "pair_baseline": vc.pair_baseline if fp is not None else None,
            # > 1: the raw cell medians sat above the fit here, so a "cell" baseline would make the run faster
            "paired_cell_median_over_fit": float(np.mean(pairs.median_over_fit))
            if pairs is not None and pairs.median_over_fit else None})
        refs = [t for _, t in win.marks]
        adjacent = zip(refs[:-1], refs[1:])
        tr = TimedRun(raw, norm, norm.summary["speed_normalised"]["factor"], len(refs) - 1, share,
                      max((max(a, b) / min(a, b) - 1.0 for a, b in adjacent), default=0.0), min(refs), max(refs),
                      share <= vc.max_unsteady_share, len(pairs.idx) if fp is not None else 0,
                      pairs if fp is not None else None)
        if tr.kept:
            mon.kept += 1
            return tr
        mon.discarded.append(lab)
    return tr


SHAPE_COLS = ("n_decode", "M", "n_prefill_tokens", "verify_tokens", "kv_read")


def _normalised_output(raw: Any, res: Any, cfg: RunConfig, extra: dict[str, Any]) -> Any:
    summ = {**raw.summary, **summarize(res, policy=raw.summary["policy"], load=load_label(cfg), warmup_s=0.0,
                                       closed_loop=True)}
    summ["speed_normalised"] = {**raw.summary.get("speed_normalised", {}), **extra}
    return RunOutput(config=raw.config, summary=summ, result=res, inputs=raw.inputs)


def combine_runs(tries: list[TimedRun], cfg: RunConfig) -> TimedRun:
    """The repeats of one cell as one run: every step's normalised time is the median over all repeats. The
    engine's decisions depend on the profile's prices and the keyed draws, never on measured time, so repeats run
    the same steps (checked: the step shapes must agree, else the steadiest repeat alone is used); the median then
    drops a slow spell that hit fewer than half the repeats at a step, which the windows' reference timings cannot
    always see (measured: a quarter-second spell slowed 4 concurrent requests by 14-20% inside a window whose two
    reference timings were both fast). The cell is kept (steady) when at least half its repeats were steady."""
    best = min(tries, key=lambda t: (not t.kept, t.unsteady_share, t.max_drift))
    n_steady = sum(t.kept for t in tries)
    if len(tries) < 2:
        return best
    shapes = [np.stack([np.asarray(t.raw.result.steps[k]) for k in SHAPE_COLS]) for t in tries]
    if any(x.shape != shapes[0].shape or not np.array_equal(x, shapes[0]) for x in shapes[1:]):
        return best
    dts = np.stack([np.asarray(t.norm.result.steps["dt"], float) for t in tries])
    med = np.median(dts, axis=0)
    base = tries[0]
    raw_dt = np.asarray(base.raw.result.steps["dt"], float)
    res = warp_result(base.raw.result, raw_dt / med)
    norm = _normalised_output(base.raw, res, cfg, {
        "median_of_repeats": len(tries), "steady_repeats": n_steady, "factor": float(raw_dt.sum() / med.sum()),
        "repeat_spread": float((dts.sum(axis=1).max() / dts.sum(axis=1).min()) - 1.0)})
    return TimedRun(base.raw, norm, float(raw_dt.sum() / med.sum()), sum(t.windows for t in tries),
                    float(np.mean([t.unsteady_share for t in tries])), max(t.max_drift for t in tries),
                    min(t.ref_min for t in tries), max(t.ref_max for t in tries), 2 * n_steady >= len(tries),
                    sum(t.paired for t in tries))


def dense_n_reqs(concurrency, K: int, prefill_chunk_tokens: int) -> tuple[int, ...]:
    """validate's own profile grid: every decode batch size 1..max(concurrency) (the profile is a floor lookup, so
    a batch between two measured sizes is priced at the smaller one: the drafter was 20% under at 13-15 requests
    between 12 and 16 on this CPU), then sparser sizes up to the largest step M (every user verifying K plus a prefill chunk)."""
    c = max(concurrency)
    top = -(-(c * (1 + K) + prefill_chunk_tokens) // (1 + K))
    return tuple(range(1, c + 1)) + tuple(x for x in (40, 48, 56, 64, 80, 96, 128) if c < x < top) + (top,)


def _mean_or_nan(xs) -> float:
    xs = [x for x in xs if x is not None]
    return float(np.mean(xs)) if xs else float("nan")


def error_summary(df: pd.DataFrame) -> dict[str, Any]:
    """Median, 95th percentile and max |relative error| per metric over the steady cells (all cells when none is
    steady, stated by ``cells_in_stats``)."""
    use = df[df["kept"]] if df["kept"].any() else df
    out: dict[str, Any] = {"cells": int(len(df)), "cells_in_stats": int(len(use)),
                           "cells_drifting": int((~df["kept"]).sum())}
    for k in METRICS:
        a = use[f"{k}_rel_err"].abs()
        out[f"median_abs_rel_err_{k}"] = float(a.median())
        out[f"p95_abs_rel_err_{k}"] = float(a.quantile(0.95))
        out[f"max_abs_rel_err_{k}"] = float(a.max())
        if k in RATES:
            raw = ((use[f"{k}_sim"] - use[f"{k}_real_raw"]) / use[f"{k}_real_raw"]).abs()
            out[f"median_abs_rel_err_{k}_unnormalised"] = float(raw.median())
            # every cell, steady or not (paired cells normalise each step, so a cell's windows being unsteady
            # no longer leaves it without a measured speed)
            al = df[f"{k}_rel_err"].abs()
            out[f"median_abs_rel_err_{k}_all_cells"] = float(al.median())
            out[f"p95_abs_rel_err_{k}_all_cells"] = float(al.quantile(0.95))
    return out


def _jsonable(vc: ValidateConfig) -> Any:
    return jsonable(asdict(vc))


def plot_overlay(df: pd.DataFrame, path: Path) -> None:
    import matplotlib  # lazy: matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: matplotlib
    fig, ax = plt.subplots(figsize=(7, 5))
    for i, (pol, g) in enumerate(df.groupby("policy", sort=False)):
        g = g.sort_values("users")
        c = f"C{i}"
        ax.plot(g["throughput_real"], g["tps_user_median_real"], "o-", color=c, label=f"{pol} real")
        ax.plot(g["throughput_sim"], g["tps_user_median_sim"], "x--", color=c, label=f"{pol} sim")
    ax.set_xlabel("output throughput (tok/s)")
    ax.set_ylabel("median per-user tok/s")
    ax.set_title("real (solid) vs simulated (dashed) frontiers")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report_errors(df: pd.DataFrame, summ: dict, vc: ValidateConfig, prof: dict) -> list[str]:
    """REPORT.md's head: what was compared, and the errors per cell and over the cells."""
    cols = ["policy", "users"] + [f"{k}_rel_err" for k in METRICS]
    lines = ["# Simulator vs real validation", "",
             f"Profile `{prof['name']}` ({prof['metadata']['device']}; {prof['metadata']['model']}; drafting "
             f"{prof['metadata'].get('drafting', 'proxy')}), "
             + ("measured in the same command. " if vc.profile is None else f"from `{vc.profile}`. ")
             + (f"Real side: LIVE drafters from `{vc.runner.models}` (drafter {vc.runner.live_drafter}; mtp1 for "
                f"mtp1), acceptance by rejection sampling at temperature {vc.runner.executor.temperature}; prompts "
                "are the held-out eval prompts at their native lengths. Simulated side: acceptance traces "
                if vc.runner.mode == "live" else "Both sides replay the acceptance ")
             + f"`{vc.acceptance}` (mtp1: `{vc.mtp1_acceptance}`), K={vc.K}. "
             f"Closed loop, {vc.requests_per_user} requests per user (>= {vc.min_requests}), prompts "
             f"{'native' if vc.runner.mode == 'live' else vc.prompt_tokens}, outputs {vc.output_tokens} tokens, "
             f"warm-up {vc.warmup_frac:.0%} of each run discarded; {vc.repeats} real run(s) per cell, the steadiest "
             "kept. Relative error = (sim - real) / real, real figures at the profile's machine speed (drift "
             "normalised, below); `raw` = as measured.",
             "",
             "| " + " | ".join(cols) + " | raw throughput err | speed x | unsteady | kept |",
             "|" + "---|" * (len(cols) + 4)]
    for _, r in df.iterrows():
        raw = (r["throughput_sim"] - r["throughput_real_raw"]) / r["throughput_real_raw"]
        lines.append("| " + " | ".join(str(r[c]) if c in ("policy", "users") else f"{100 * r[c]:+.1f}%"
                                         for c in cols)
                     + f" | {100 * raw:+.1f}% | {r['speed_factor']:.3f} | {100 * r['unsteady_share']:.0f}% | "
                       f"{'yes' if r['kept'] else 'NO'} |")
    if summ["cells_drifting"] == summ["cells"]:
        lines += ["", f"No cell had half its real runs steady; over all {summ['cells']} cells:", ""]
    else:
        lines += ["", f"Over {summ['cells_in_stats']} of {summ['cells']} cells (cells with fewer than half their real "
                      f"runs steady are left out: {summ['cells_drifting']}):", ""]
    for k in METRICS:
        lines.append(f"- {k}: median |rel err| {100 * summ[f'median_abs_rel_err_{k}']:.1f}%, p95 "
                     f"{100 * summ[f'p95_abs_rel_err_{k}']:.1f}%, max {100 * summ[f'max_abs_rel_err_{k}']:.1f}%"
                     + (f" (unnormalised median {100 * summ[f'median_abs_rel_err_{k}_unnormalised']:.1f}%)"
                        if k in RATES else ""))
    lines.append(f"- all {summ['cells']} cells, steady or not: " + "; ".join(
        f"{k} median |rel err| {100 * summ[f'median_abs_rel_err_{k}_all_cells']:.1f}%, p95 "
        f"{100 * summ[f'p95_abs_rel_err_{k}_all_cells']:.1f}%" for k in RATES))
    lines += [f"- caution: {c}" for c in summ.get("cautions", ())]
    return lines


def report_drift(df: pd.DataFrame, summ: dict, vc: ValidateConfig) -> list[str]:
    """REPORT.md's machine-drift section: the reference cell, the windows, the paired cells."""
    d = summ["drift"]
    rc = REFERENCE_CELL
    lines = ["", "## Machine drift", "",
              f"Reference cell ({rc['n_req']} requests, context {rc['context']}, L={rc['L']} of K={rc['K']}, median "
              f"of {rc['reps']} steps) re-timed every {vc.window_s:g} s of each real run's measured time (windows); "
              + (f"every window starts in the machine's fast state (reference within {100 * vc.drift_gate:.0f}% of "
                 "the baseline; the run waits between steps, which its measured clock does not see) and "
                 if vc.drift_gate is not None else "")
              + f"every step is divided by the mean of its window's two timings over the baseline, and the run's "
              f"timeline rebuilt from those times. A window is unsteady when its timings differ by more than "
              f"{100 * d['threshold']:.0f}%" + (" or either leaves the fast state" if vc.drift_gate is not None else "")
              + f"; a run with more than {100 * vc.max_unsteady_share:.0f}% of its time in unsteady windows is "
              f"discarded and re-run. Baseline {1e3 * d['baseline_s']:.3f} ms"
              + (" (the profile's, measured with it)" if summ.get("profile_drift") else " (timed before the runs)")
              + f". Reference over the runs: {100 * d['drift_over_command']:.1f}% max/min; machine speed vs baseline "
              + (f"x{d['speed_vs_baseline_range'][0]:.3f}..x{d['speed_vs_baseline_range'][1]:.3f}; "
                 if d["speed_vs_baseline_range"] else "")
              + f"waited for the fast state {d.get('waits_for_fast_state', 0)} time(s) "
              f"({d.get('probes_while_waiting', 0)} probes, gave up {d.get('gave_up_waiting', 0)}); "
              f"{d['kept']} run(s) kept, {d['discarded']} discarded"
              + (f" ({', '.join(d['discarded_labels'])})" if d["discarded"] else "") + "."]
    if "paired_steps" in df and df["paired_steps"].sum() > 0:
        lines += ["", f"**Paired cells.** {int(df['paired_steps'].sum())} steps with decoding requests were each followed by one step "
                  "of the profile cell nearest their shape (same drafter; nearest measured n_req, context and "
                  "uniform verify length), timed on the same clock; a step's factor is that cell's time now over "
                  + ("the profile's own price of the cell's shape (`--pair-baseline fit`: the comparison is then "
                     "relative to the profile at the nearest measured shape; the profile's absolute level at its "
                     "own cells is stated below)" if vc.pair_baseline == "fit" else
                     "its median when the profile was measured (`metadata.cells`, `--pair-baseline cell`)")
                  + f", the median over {2 * vc.pair_span + 1} neighbouring paired steps, and these factors (not the "
                  "windows') normalise the run ("
                  + (f"{int(df['paired_prefill_steps'].sum())} prefill-only steps were each followed by one step of "
                     "the profile's nearest prefill-only cell (`metadata.prefill_cells`: chunk length, chunk count, "
                     f"cached prefix) and take those factors; {int(df['paired_mixed_steps'].sum())} steps with both "
                     "decoding requests and chunks were followed by their decode part's cell and their chunks' "
                     "prefill-only cell, and take the two factors blended (the prefill one weighted by the share of "
                     "the step's price beyond its decode part)"
                     if df.get("paired_prefill_steps", pd.Series(dtype=float)).sum()
                     + df.get("paired_mixed_steps", pd.Series(dtype=float)).sum() > 0 else
                     "the profile stores no prefill-only cells: a step with prefill chunks is paired by its decode "
                     "part, a prefill-only step takes the nearest paired step's factor")
                  + "). The "
                  "windows above still gate the runs and decide which are steady."]
        cof = df["paired_cell_over_fit"].dropna() if "paired_cell_over_fit" in df else pd.Series(dtype=float)
        if len(cof):
            lines.append(f"Raw cell medians over the fit's price, averaged over each cell's paired steps: "
                         f"{cof.min():.3f}..{cof.max():.3f} (median {cof.median():.3f}); with the other baseline "
                         "each normalised real step time would be multiplied by about that ratio.")
    pdr = summ.get("profile_drift")
    if pdr:
        lines.append(f"Profile measurement: drift {100 * pdr['drift_over_command']:.1f}% over "
                     f"{len(pdr['reference_s'])} reference timings, {pdr['kept']} cell(s) kept, {pdr['discarded']} "
                     "discarded and re-measured.")
    fvc = summ.get("profile_fit_vs_cells")
    if fvc:
        lines.append("Profile fit at its own cells (fit price / raw cell median - 1): " + "; ".join(
            f"{d}: median {100 * v['median_err']:+.1f}%, median |.| {100 * v['median_abs_err']:.1f}%, p95 |.| "
            f"{100 * v['p95_abs_err']:.1f}% over {v['cells']} cells" for d, v in fvc.items()) + ".")
    return lines


def report_residuals(df: pd.DataFrame, summ: dict, shape: pd.DataFrame, term: pd.DataFrame) -> list[str]:
    """REPORT.md's per-step residuals: by cost term, by step shape and per cell."""
    lines = ["", "## Where the bias lives: per-step residuals (model - measured)", "",
              "Every real step priced by the profile at its exact shape (`step_residuals.csv`, per cell "
              "`runs/*/real/residuals.csv`). By cost term over all steps (% of all measured step time; the terms "
              "sum to the total; `prefill` is the target-forward part, the drafter and per-chunk parts sit in "
              "`drafter` and `host_loop`):", "",
              "| term | model s | residual s | % of measured time | % of the term |", "|---|---|---|---|---|"]
    for _, r in term.iterrows():
        lines.append(f"| {r['term']} | {r['model_s']:.4g} | {r['resid_s']:+.4g} | "
                     f"{r['resid_pct_of_measured_time']:+.2f}% | {r['resid_pct_of_term']:+.1f}% |")
    se = summ.get("target_term_scale_error") or {}
    if se:
        lines += ["", "Target-forward residual attributed by least squares (+x: measured below the model's price "
                      "by x of it): " + ", ".join(f"{k} {100 * v:+.1f}%" for k, v in se.items())]
    lines += ["", "By step shape (top 15 groups by |contribution|; `resid` = group residual / group time, "
                  "`contrib` = over all steps' time):", "",
              "| n decode | M | prefill | context | steps | time share | measured ms | resid | contrib | "
              "target | draft | host |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    top = shape.reindex(shape["contrib_pct"].abs().sort_values(ascending=False).index).head(15)
    for _, r in top.iterrows():
        lines.append(f"| {r['n_decode']} | {r['M']} | {r['prefill']} | {r['context']} | {r['steps']} | "
                     f"{r['time_share_pct']:.1f}% | {r['measured_ms']:.3f} | {r['resid_pct']:+.1f}% | "
                     f"{r['contrib_pct']:+.2f}% | {r['target_resid_pct']:+.1f}% | {r['draft_resid_pct']:+.1f}% | "
                     f"{r['host_resid_pct']:+.1f}% |")
    lines += ["", "Per cell (residual of the summed step time, and per timer, % of the cell's measured time):", "",
              "| policy | users | steps | step time | target | draft | host |", "|---|---|---|---|---|---|---|"]
    for _, r in df.iterrows():
        lines.append(f"| {r['policy']} | {r['users']} | {r['real_steps']} | {r['step_time_resid_pct']:+.1f}% | "
                     f"{r['target_resid_pct']:+.1f}% | {r['draft_resid_pct']:+.1f}% | {r['host_resid_pct']:+.1f}% |")
    return lines


def write_report(df: pd.DataFrame, summ: dict, vc: ValidateConfig, path: Path, prof: dict,
                 shape: pd.DataFrame, term: pd.DataFrame) -> None:
    lines = report_errors(df, summ, vc, prof) + report_drift(df, summ, vc) + report_residuals(df, summ, shape, term)
    path.write_text("\n".join(lines) + "\n")
