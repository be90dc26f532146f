"""Simulator vs real: the same workloads, policies and acceptance replayed on the real engine and simulated on
the profile measured by the same command; a table of relative errors, an overlay plot and an error breakdown.

Relative error = (simulated - real) / real for output throughput, median per-user tokens/s, mean verify length
and tau. The breakdown prices every real step with the profile (verify term at the step's M and KV tokens read,
drafting at its n, floor at its n) and compares with the measured split (t_target, t_draft, t_host), so a
throughput error can be traced to the term that causes it.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

from ..config import EngineConfig, RunConfig
from ..errors import ConfigError
from ..profile import load_profile, save_profile
from ..simulate import simulate, write_run
from ..traffic import TrafficConfig
from .executor import build_models
from .measure import MeasureConfig, _cell, measure
from .models import load_target
from .run import RunnerConfig, real_run

POLICIES = ("mtp1", "fixed:7", "threshold:0.5", "goodput", "confidence", "confidence-async:2")
METRICS = {"throughput": "output_throughput_tok_s", "tps_user_median": "tps_user_median",
           "mean_verify_len": "mean_verify_len", "tau": "tau"}


@dataclass(frozen=True)
class ValidateConfig:
    """What to validate. ``requests_per_user``: closed-loop pool = max(min_requests, users * this)."""

    policies: tuple[str, ...] = POLICIES
    concurrency: tuple[int, ...] = (1, 4, 16)
    acceptance: str = "traces/sample_dspark_k7.csv"
    mtp1_acceptance: str = "mtp1"
    K: int = 7
    requests_per_user: int = 4
    min_requests: int = 8
    prompt_tokens: tuple[int, int] = (16, 64)
    output_tokens: tuple[int, int] = (32, 96)
    prefill_chunk_tokens: int = 128
    warmup_frac: float = 0.1
    repeats: int = 1             # real runs per cell; the fastest is kept (interference only ever slows a run)
    seed: int = 0
    profile: str | None = None   # an already measured profile (same model/device, checked); None = measure now
    measure: MeasureConfig = field(default_factory=MeasureConfig)
    runner: RunnerConfig = field(default_factory=RunnerConfig)

    def __post_init__(self) -> None:
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
    from .live import PromptSource
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
    from ..metrics import summarize
    from ..simulate import load_label
    res = out.result
    s = summarize(res, policy=out.summary["policy"], load=load_label(out.config), warmup_s=frac * res.sim_time_s,
                  closed_loop=True)
    return s


def breakdown(res, profile, K: int, drafter: str) -> dict[str, float]:
    """Mean per-step (model - real) seconds per cost term over decode steps, and the real step's mean."""
    st = res.steps
    dec = st["n_decode"] > 0
    if not dec.any():
        return {}
    n, M, kv = st["n_decode"][dec], st["M"][dec], st["kv_read"][dec]
    v = np.asarray(profile.verify_time(M, kv))
    d = np.asarray(profile.draft_time(drafter, n, K))
    if profile.prefill_note is not None and "pf_qk" in st:
        pf_tok, qk = st["n_prefill_tokens"][dec], st["pf_qk"][dec]
        v = v + profile.prefill_s_per_token * pf_tok + profile.prefill_s_per_query_key * qk
        f_pf = profile.prefill_s_per_chunk * st["pf_chunks"][dec]      # group + bookkeeping: counted as host
        if drafter in profile.drafters:
            d = d + profile.drafters[drafter].prefill_s_per_token * pf_tok
    f = profile.fixed_overhead_s + np.asarray(profile.batch_overhead_time(n))
    fit = profile.metadata.get("fit", {})
    bt = fit.get("target_per_request_s_by_n")
    if bt is not None:
        # the target forward's per-request part sits in batch_overhead; compare it with the target forward
        grid = np.asarray(profile.metadata["grid"]["n_req"])
        b = np.asarray(bt)[np.clip(np.searchsorted(grid, n, side="right") - 1, 0, len(grid) - 1)]
        v, f = v + b, f - b
    if profile.prefill_note is not None and "pf_qk" in st:
        f = f + f_pf
    real = {"verify": st["t_target"][dec], "draft": st["t_draft"][dec], "host": st["t_host"][dec]}
    model = {"verify": v, "draft": d, "host": f}
    total = float(st["dt"][dec].mean())
    out = {"real_step_mean_s": total, "model_step_mean_s": float((v + d + f).mean())}
    for k in real:
        out[f"{k}_real_s"] = float(real[k].mean())
        out[f"{k}_err_frac_of_step"] = float((model[k] - real[k]).mean() / total)
    return out


def probe(target, proxy, vc: ValidateConfig) -> float:
    """Median step seconds of a fixed reference cell (4 requests, context 64, L=3): tracks machine-speed drift
    over the command (on a shared machine, other processes change how fast the same work runs)."""
    recs = _cell(target, proxy, vc.runner.executor, vc.K, "dspark", 4, 64, [3], 2, 7)
    return float(np.median([r["t_step"] for r in recs]))


def validate(vc: ValidateConfig, out_dir: str | Path, progress: bool = True,
             log: Callable[[str], None] = print) -> pd.DataFrame:
    """Measure, run real + simulated for every (policy, users), write the report; returns the error table."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    ex = vc.runner.executor
    mcfg, tmodel, _ = load_target(vc.runner.model, ex.device, ex.dtype)
    target, proxy = build_models(mcfg, ex, tmodel)
    if vc.profile is None:
        mc = replace(vc.measure, model=vc.runner.model, executor=ex, K=vc.K)
        log(f"validate: measuring the profile ({len(mc.n_reqs)} n_req x {mc.K + 1} L x {len(mc.contexts)} contexts)")
        prof, raw = measure(mc, progress=progress, log=log, target=target, proxy=proxy)
        ppath = save_profile(prof, out / "profile.json")
    else:
        ppath = Path(vc.profile)
        prof = json.loads(ppath.read_text())
        log(f"validate: using the measured profile {ppath}")
    profile = load_profile(str(ppath))
    lengths = (write_live_lengths if vc.runner.mode == "live" else write_lengths)(out / "lengths.csv", vc)
    rows = []
    drift = [("after profile", probe(target, proxy, vc))]
    for users in vc.concurrency:
        for pol in vc.policies:
            cfg = run_config(vc, pol, users, str(ppath), str(lengths))
            reals = [real_run(cfg, vc.runner, target=target, proxy=proxy) for _ in range(vc.repeats)]
            thr = [_warm(r, vc.warmup_frac)["output_throughput_tok_s"] for r in reals]
            real = reals[int(np.argmax(thr))]
            sim = simulate(cfg)
            cell = out / "runs" / f"{pol.replace(':', '_')}-c{users}"
            write_run(real, cell / "real", steps=True)
            write_run(sim, cell / "sim", steps=True)
            rs, ss = _warm(real, vc.warmup_frac), _warm(sim, vc.warmup_frac)
            row: dict[str, Any] = {"policy": pol, "users": users,
                                   "real_repeats_throughput": ";".join(f"{x:.1f}" for x in thr)}
            for short, key in METRICS.items():
                r, s = rs[key], ss[key]
                row[f"{short}_real"], row[f"{short}_sim"] = r, s
                row[f"{short}_rel_err"] = (s - r) / r if r else float("nan")
            drafter = real.inputs["policy"]["drafter"]
            bd = breakdown(real.result, profile, real.inputs["policy"]["block_size"], drafter)
            row.update({f"bd_{k}": v for k, v in bd.items()})
            row["real_steps"] = int(len(real.result.steps["dt"]))
            rows.append(row)
            log(f"validate: {pol:>20} users={users:<3} throughput real {row['throughput_real']:.1f} sim "
                f"{row['throughput_sim']:.1f} ({100 * row['throughput_rel_err']:+.1f}%), per-user median "
                f"{100 * row['tps_user_median_rel_err']:+.1f}%")
        drift.append((f"after users={users}", probe(target, proxy, vc)))
    df = pd.DataFrame(rows)
    df.to_csv(out / "errors.csv", index=False, float_format="%.6g")
    summ = {f"median_abs_rel_err_{k}": float(df[f"{k}_rel_err"].abs().median()) for k in METRICS}
    summ.update({f"max_abs_rel_err_{k}": float(df[f"{k}_rel_err"].abs().max()) for k in METRICS})
    summ["wall_s"] = round(time.time() - t0, 1)
    ref = [t for _, t in drift]
    summ["reference_cell_step_ms"] = {k: round(1e3 * t, 3) for k, t in drift}
    summ["machine_speed_drift"] = float(max(ref) / min(ref) - 1.0)
    (out / "summary.json").write_text(json.dumps({"summary": summ, "config": _jsonable(vc),
                                                  "profile": prof["name"]}, indent=2) + "\n")
    plot_overlay(df, out / "frontier_overlay.png")
    write_report(df, summ, vc, out / "REPORT.md", prof)
    return df


def _jsonable(vc: ValidateConfig) -> Any:
    from ..config import _jsonable as j
    return j(asdict(vc))


def plot_overlay(df: pd.DataFrame, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
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


def write_report(df: pd.DataFrame, summ: dict, vc: ValidateConfig, path: Path, prof: dict) -> None:
    cols = ["policy", "users"] + [f"{k}_rel_err" for k in METRICS]
    lines = ["# Simulator vs real validation", "",
             f"Profile `{prof['name']}` ({prof['metadata']['device']}; {prof['metadata']['model']}; drafting "
             f"{prof['metadata'].get('drafting', 'proxy')}), measured in the same command. "
             + (f"Real side: LIVE drafters from `{vc.runner.models}` (drafter {vc.runner.live_drafter}; mtp1 for "
                f"mtp1), acceptance by rejection sampling at temperature {vc.runner.executor.temperature}; prompts "
                "are the held-out eval prompts at their native lengths. Simulated side: acceptance traces "
                if vc.runner.mode == "live" else "Both sides replay the acceptance ")
             + f"`{vc.acceptance}` (mtp1: `{vc.mtp1_acceptance}`), K={vc.K}. "
             f"Closed loop, {vc.requests_per_user} requests per user (>= {vc.min_requests}), prompts "
             f"{'native' if vc.runner.mode == 'live' else vc.prompt_tokens}, outputs {vc.output_tokens} tokens, warm-up {vc.warmup_frac:.0%} of each run "
             f"discarded; {vc.repeats} real run(s) per cell, the fastest kept. Relative error = (sim - real) / real.",
             "",
             "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, r in df.iterrows():
        lines.append("| " + " | ".join(str(r[c]) if c in ("policy", "users") else f"{100 * r[c]:+.1f}%"
                                         for c in cols) + " |")
    lines += ["", "Median |relative error|: " + ", ".join(f"{k} {100 * summ[f'median_abs_rel_err_{k}']:.1f}%"
                                                          for k in METRICS),
              "", f"Machine-speed drift over the command (reference cell: 4 requests, context 64, L=3; max/min "
                 f"median step - 1): {100 * summ['machine_speed_drift']:.1f}% — "
                 + ", ".join(f"{k} {v} ms" for k, v in summ["reference_cell_step_ms"].items()),
             "", "## Error breakdown (model - real per decode step, as a fraction of the real step)", "",
              "| policy | users | real step ms | verify | draft | host |", "|---|---|---|---|---|---|"]
    for _, r in df.iterrows():
        if "bd_real_step_mean_s" in r and np.isfinite(r.get("bd_real_step_mean_s", np.nan)):
            lines.append(f"| {r['policy']} | {r['users']} | {1e3 * r['bd_real_step_mean_s']:.2f} | "
                         f"{100 * r['bd_verify_err_frac_of_step']:+.1f}% | {100 * r['bd_draft_err_frac_of_step']:+.1f}% "
                         f"| {100 * r['bd_host_err_frac_of_step']:+.1f}% |")
    path.write_text("\n".join(lines) + "\n")
