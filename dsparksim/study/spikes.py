"""Study load-spikes (issue 29, 2.1): how stale may the asynchronous capacity estimate be before a load change hurts?

confidence-async:LAG admits this step's draft candidates by rank up to the budget a global search chose LAG steps
ago. LAG 0 is the synchronous search on the step's own information (``confidence-global``: the fresh capacity; not
lossless on a real engine, which the simulator cannot see, so it serves here only as the reference capacity).
Two kinds of load change: a closed-loop step (users low -> high over 1 s, held, back to low) and bursty open-loop
arrivals (gamma gaps, CV 1..8). Per run: the per-step verify budget against the fresh one (over- and
under-verification), throughput, TPOT tails, and the recovery time after each change; each against LAG 0 on the
same seed (same requests, same draws).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from dsparksim.study.common import (BudgetRecorder, Regime, Section, Settings, find_row, fit_probe, fmt_ci, interval,
                                    md_table, new_figure, p99, paired_rows, recorded_steps, recovery_time, run_config,
                                    save_figure, throughput_series, window_throughput)

NAME = "load-spikes"
TITLE = "Load spikes vs stale capacity"
QUESTION = ("How stale may confidence-async's capacity estimate (LAG steps old) be before a load change costs "
            "more than 2% against the fresh (LAG 0) capacity, in throughput or mean TPOT?")
LIMIT_PCT = 2.0


@dataclass(frozen=True)
class Timeline:
    """The closed-loop step: ``low`` users from 0, ramp to ``high`` over [t_up, t_up + ramp) in 8 equal steps, back
    to ``low`` at t_down (surplus users retire as their requests finish), end at t_end; warm-up before warmup_s."""

    warmup_s: float
    t_up: float
    t_down: float
    t_end: float
    ramp_s: float = 1.0
    after_s: float = 4.0          # the "during" windows: [t_up, t_up + ramp + after) and [t_down, t_down + after)

    def user_steps(self, low: int, high: int) -> tuple[tuple[float, int], ...]:
        k = 8
        ups = tuple((self.t_up + self.ramp_s * i / k, low + round((high - low) * (i + 1) / k)) for i in range(k))
        return ups + ((self.t_down, low),)


@dataclass(frozen=True)
class Plan:
    """lags/cvs: of the primary regime; the contrast regimes run ``contrast_lags`` on ``contrast_scenarios``.
    constant: also run the high user count held constant (the staleness cost without a load change)."""

    lags: tuple[int, ...]
    cvs: tuple[float, ...]
    timeline: Timeline
    gamma_duration_s: float
    gamma_warmup_s: float
    oracle: bool
    constant: bool
    contrast_lags: tuple[int, ...] = ()
    contrast_scenarios: tuple[str, ...] = ()


FULL = Plan(lags=(0, 1, 2, 3, 4, 6, 8), cvs=(1.0, 2.0, 4.0, 8.0),
            timeline=Timeline(warmup_s=4.0, t_up=8.0, t_down=18.0, t_end=28.0), gamma_duration_s=25.0,
            gamma_warmup_s=5.0, oracle=True, constant=True, contrast_lags=(0, 1, 2, 8),
            contrast_scenarios=("step", "gamma-cv8"))
FAST = Plan(lags=(0, 1, 8), cvs=(8.0,), timeline=Timeline(warmup_s=2.0, t_up=4.0, t_down=8.0, t_end=12.0,
                                                          after_s=2.0),
            gamma_duration_s=10.0, gamma_warmup_s=2.0, oracle=False, constant=False)


def policy_of(lag: int) -> str:
    return "confidence-global" if lag == 0 else f"confidence-async:{lag}"


@dataclass(frozen=True)
class Cell:
    regime: Regime
    scenario: str        # "step" | "gamma-cvX"
    lag: int             # -1 = the oracle bound
    seed: int
    plan: Plan

    @property
    def policy(self) -> str:
        return "oracle" if self.lag < 0 else policy_of(self.lag)


def plan(settings: Settings) -> list[Cell]:
    p = FAST if settings.fast else FULL
    scen = ["step"] + (["constant"] if p.constant else []) + [f"gamma-cv{cv:g}" for cv in p.cvs]
    cells = []
    for i, r in enumerate(settings.regimes):
        if i == 0:
            cells += [Cell(r, s, lag, seed, p) for s in scen for seed in settings.seeds for lag in p.lags]
            if p.oracle:   # the bound on the step only
                cells += [Cell(r, "step", -1, seed, p) for seed in settings.seeds]
        else:
            cells += [Cell(r, s, lag, seed, p) for s in p.contrast_scenarios for seed in settings.seeds
                      for lag in p.contrast_lags]
    return cells


def _traffic(cell: Cell) -> tuple[dict[str, Any], Any]:
    p, r = cell.plan, cell.regime
    if cell.scenario == "step":
        tl = p.timeline
        return ({"concurrency": r.users[0], "duration_s": tl.t_end, "warmup_s": tl.warmup_s},
                tl.user_steps(*r.users))
    if cell.scenario == "constant":
        tl = p.timeline
        return {"concurrency": r.users[1], "duration_s": tl.t_end - tl.t_up, "warmup_s": tl.warmup_s}, None
    cv = float(cell.scenario.removeprefix("gamma-cv"))
    return ({"rate": r.rate_rps, "burstiness": 1.0 / cv ** 2, "arrival": "gamma",
             "duration_s": p.gamma_duration_s, "warmup_s": p.gamma_warmup_s}, None)


def _over_under(rec: dict[str, np.ndarray], a: float, b: float) -> dict[str, float]:
    sel = (rec["t"] > a) & (rec["t"] <= b)
    d = (rec["used"] - rec["fresh"])[sel]
    fresh = rec["fresh"][sel].sum()
    if not d.size:
        return {"over": math.nan, "under": math.nan, "over_rel": math.nan, "under_rel": math.nan, "steps": 0}
    over, under = np.clip(d, 0, None), np.clip(-d, 0, None)
    return {"over": float(over.mean()), "under": float(under.mean()),
            "over_rel": float(over.sum() / fresh) if fresh else math.nan,
            "under_rel": float(under.sum() / fresh) if fresh else math.nan, "steps": int(d.size)}


def measure(cell: Cell) -> dict[str, Any]:
    """Simulate one cell and reduce it to its metrics (runs in a worker process)."""
    from dsparksim.sim.simulate import simulate  # lazy: pulls in scipy

    traffic, steps_sched = _traffic(cell)
    cfg = run_config(cell.regime, cell.policy, cell.seed, traffic, steps_sched)
    holder: list[BudgetRecorder] = []

    def wrap(p):
        holder.append(BudgetRecorder(p))
        return holder[0]

    out = simulate(cfg, wrap_policy=wrap)
    res, st = out.result, out.result.steps
    rec = recorded_steps(st, holder[0])
    req = out.requests()
    done = req[req["completed"]]
    end, warm = float(res.sim_time_s), float(cfg.warmup_s)
    row: dict[str, Any] = {"regime": cell.regime.name, "profile": cell.regime.profile, "scenario": cell.scenario,
                           "lag": cell.lag, "policy": cell.policy, "seed": cell.seed,
                           "throughput_tok_s": window_throughput(st, warm, end),
                           "busy_throughput_tok_s": float(np.sum(st["emitted"][st["t_start"] >= warm]) /
                                                          np.sum(st["dt"][st["t_start"] >= warm])),
                           "tpot_mean_s": out.summary["tpot_mean_s"], "tpot_p99_s": out.summary["tpot_p99_s"],
                           "ttft_p99_s": out.summary["ttft_p99_s"], "itl_p99_s": out.summary["itl_p99_s"]}
    for k, v in _over_under(rec, warm, end).items():
        row[f"all_{k}"] = v
    if cell.scenario == "step":
        tl = cell.plan.timeline
        up_end = tl.t_up + tl.ramp_s + tl.after_s
        windows = {"low": (warm, tl.t_up), "up": (tl.t_up, up_end), "high": (up_end, tl.t_down),
                   "down": (tl.t_down, tl.t_down + tl.after_s), "after": (tl.t_down + tl.after_s, end)}
        for w, (a, b) in windows.items():
            for k, v in _over_under(rec, a, b).items():
                row[f"{w}_{k}"] = v
        row["spike_throughput_tok_s"] = window_throughput(st, tl.t_up, tl.t_down + tl.after_s)
        arr = done["arrival_s"].to_numpy()
        row["tpot_p99_during_s"] = p99(done["tpot_s"].to_numpy()[(arr >= tl.t_up) & (arr < tl.t_down)])
        row["tpot_p99_after_s"] = p99(done["tpot_s"].to_numpy()[arr >= tl.t_down])
        starts, thr = throughput_series(st, end, 0.25)
        row["recovery_up_s"] = recovery_time(starts, thr, tl.t_up, ((tl.t_up + tl.t_down) / 2, tl.t_down),
                                             window_s=1.0, band=0.05)
        # after the fall the users are those of before the spike: the level to return to is the pre-spike one
        row["recovery_down_s"] = recovery_time(starts, thr, tl.t_down, (warm, tl.t_up), window_s=1.0, band=0.05)
    return row | fit_probe(cfg, out.summary)


# ------------------------------------------------------------------------------------------------ analysis
_KEYS = ("regime", "scenario", "lag")


def _paired(rows, metric, relative, base_lag=0):
    sub = [r for r in rows if r["lag"] >= base_lag or r["lag"] < 0] if base_lag else rows
    return [r | {"base_lag": base_lag} for r in paired_rows(sub, _KEYS, metric, {"lag": base_lag}, relative,
                                                               vary="lag")]


def analyse(settings: Settings, rows: list[dict[str, Any]]) -> Section:
    p = FAST if settings.fast else FULL
    rows = sorted(rows, key=lambda r: (r["regime"], r["scenario"], r["lag"], r["seed"]))
    tables: dict[str, list[dict[str, Any]]] = {"runs": rows}
    paired, paired1 = [], []
    for metric, rel in (("throughput_tok_s", True), ("busy_throughput_tok_s", True), ("tpot_mean_s", True),
                        ("tpot_p99_s", True), ("spike_throughput_tok_s", True), ("tpot_p99_during_s", True),
                        ("tpot_p99_after_s", True), ("recovery_up_s", False), ("recovery_down_s", False)):
        paired += [r for r in _paired(rows, metric, rel) if not (r["scenario"] != "step" and metric in _STEP_ONLY)]
        paired1 += [r for r in _paired(rows, metric, rel, 1)
                    if not (r["scenario"] != "step" and metric in _STEP_ONLY) and r["lag"] != -1]
    tables["paired_vs_lag0"] = paired
    tables["paired_vs_lag1"] = paired1
    stale = []
    for metric in ("all_over_rel", "all_under_rel", "up_under_rel", "up_over_rel", "down_over_rel",
                   "down_under_rel", "low_over_rel", "low_under_rel"):
        groups: dict[tuple, list[float]] = {}
        for r in rows:
            if metric in r and r["lag"] >= 0:
                groups.setdefault((r["regime"], r["scenario"], r["lag"]), []).append(r[metric])
        for (reg, sc, lag), vals in groups.items():
            m, lo, hi = interval(vals)
            stale.append({"regime": reg, "scenario": sc, "lag": lag, "metric": metric, "mean": m, "lo": lo, "hi": hi,
                          "n_seeds": len(vals)})
    tables["budget_error"] = stale
    headline, md = _text(settings, p, rows, paired, paired1, stale)
    md += f"\n\n![costs against LAG 0 and per-step budget error]({NAME}/costs.png)\n"
    return Section(markdown=md, tables=tables, headline=headline,
                   figures={"costs.png": lambda path: _figure(path, rows, paired, stale)})


def _figure(path, rows, paired, stale) -> None:
    """Per regime: costs against LAG 0 (left) and the per-step budget error (right), with 95% intervals."""
    regimes = list(dict.fromkeys(r["regime"] for r in rows))
    fig = new_figure((11, 3.6 * len(regimes)))
    axes = fig.subplots(len(regimes), 2, squeeze=False)
    series = (("step", "spike_throughput_tok_s", -1, "step: spike-window throughput loss"),
              ("constant", "throughput_tok_s", -1, "constant high load: throughput loss"),
              ("gamma-cv8", "busy_throughput_tok_s", -1, "CV 8: throughput per busy s loss"),
              ("gamma-cv8", "tpot_mean_s", 1, "CV 8: mean TPOT rise"),
              ("step", "tpot_mean_s", 1, "step: mean TPOT rise"))
    errs = (("step", "up_under_rel", "step ramp-up: under-verified"),
            ("step", "down_over_rel", "step drop: over-verified"),
            ("constant", "all_under_rel", "constant: under-verified"),
            ("gamma-cv8", "all_under_rel", "CV 8: under-verified"))
    for i, name in enumerate(regimes):
        ax, bx = axes[i]
        for sc, m, sign, label in series:
            pts = sorted((r["lag"], sign * r["diff"], sign * r["diff_lo"], sign * r["diff_hi"]) for r in paired
                         if r["regime"] == name and r["scenario"] == sc and r["metric"] == m and r["lag"] >= 0)
            if pts:
                x, y, a, b = (np.array(v, float) * (1 if k == 0 else 100) for k, v in enumerate(zip(*pts)))
                ax.errorbar(x, y, yerr=[y - np.minimum(a, b), np.maximum(a, b) - y], marker="o", capsize=3,
                            label=label)
        ax.axhline(LIMIT_PCT, color="grey", ls="--", lw=1)
        ax.set(xlabel="LAG (steps)", ylabel="cost vs LAG 0 (%)", title=f"{name}: cost of stale capacity")
        ax.legend(fontsize=7)
        for sc, m, label in errs:
            pts = sorted((r["lag"], r["mean"], r["lo"], r["hi"]) for r in stale
                         if r["regime"] == name and r["scenario"] == sc and r["metric"] == m)
            if pts:
                x, y, a, b = (np.array(v, float) * (1 if k == 0 else 100) for k, v in enumerate(zip(*pts)))
                bx.errorbar(x, y, yerr=[y - a, b - y], marker="o", capsize=3, label=label)
        bx.set(xlabel="LAG (steps)", ylabel="% of the fresh budget", title=f"{name}: per-step budget error")
        bx.legend(fontsize=7)
    save_figure(fig, path)


_STEP_ONLY = {"spike_throughput_tok_s", "tpot_p99_during_s", "tpot_p99_after_s", "recovery_up_s", "recovery_down_s"}


def costly_lag(paired: list[dict], regime: str, lags: tuple[int, ...], base_lag: int = 0
               ) -> tuple[int | None, dict | None, dict]:
    """The smallest LAG whose paired cost against ``base_lag`` exceeds LIMIT_PCT in any scenario: a throughput
    loss (closed-loop spike window or constant load: throughput; bursty open loop: tokens per busy second) or a
    mean-TPOT rise. Returns (lag or None, the row that crossed, the worst row over all lags by point estimate)."""
    worst: dict = {}
    first = None
    for lag in sorted(x for x in lags if x > base_lag):
        for r in paired:
            if r["regime"] != regime or r["lag"] != lag:
                continue
            if (r["scenario"], r["metric"]) in (("step", "spike_throughput_tok_s"), ("constant", "throughput_tok_s")) \
                    or r["scenario"].startswith("gamma") and r["metric"] == "busy_throughput_tok_s":
                cost = -r["diff"]
            elif r["metric"] == "tpot_mean_s":
                cost = r["diff"]
            else:
                continue
            if not math.isfinite(cost):
                continue
            if not worst or cost > worst["cost"]:
                worst = r | {"cost": cost}
            if first is None and 100 * cost > LIMIT_PCT:
                first = (lag, r | {"cost": cost})
    return (first[0], first[1], worst) if first else (None, None, worst)


def _cost_text(r: dict) -> str:
    sign = -1 if r["metric"] != "tpot_mean_s" else 1
    what = {"spike_throughput_tok_s": "spike-window throughput loss", "throughput_tok_s": "throughput loss",
            "busy_throughput_tok_s":
            "throughput-per-busy-second loss", "tpot_mean_s": "mean TPOT rise"}[r["metric"]]
    lo, hi = sorted((sign * r["diff_lo"], sign * r["diff_hi"]))
    return (f"{what} {fmt_ci(sign * r['diff'], lo, hi, 100, 2, '%')} ({r['scenario']}, LAG {r['lag']} vs "
            f"{r.get('base_lag', 0)})")


def _verdict(paired, name, lags, base_lag) -> str:
    lag, crossed, worst = costly_lag(paired, name, lags, base_lag)
    if lag is None:
        return (f"no LAG up to {max(lags)} costs more than {LIMIT_PCT:g}% against LAG {base_lag}; the largest cost "
                "is " + (_cost_text(worst) if worst else "n/a"))
    above = 100 * (-crossed["diff_hi"] if crossed["metric"] != "tpot_mean_s" else crossed["diff_lo"]) > LIMIT_PCT
    return (f"LAG {lag} is the first to cost more than {LIMIT_PCT:g}% against LAG {base_lag}: " + _cost_text(crossed)
            + ("; its interval lies above the limit" if above else "; its interval still reaches below the limit"))


def _setup(settings: Settings, p: Plan, regimes: list[str]) -> list[str]:
    """The question and the setup paragraph."""
    reg_of = {r.name: r for r in settings.regimes}
    tl = p.timeline
    out = [f"**Question.** {QUESTION}\n", "**Setup.**"]
    for name in regimes:
        rg = reg_of[name]
        out.append(f"- Regime `{name}`: profile `{rg.profile}`; {rg.why}.")
    out.append(f"- Step: users low -> high over {tl.ramp_s:g} s from t = {tl.t_up:g} s (8 equal steps), back to low "
               f"at t = {tl.t_down:g} s (users retire as their requests finish), end {tl.t_end:g} s, warm-up "
               f"{tl.warmup_s:g} s. Spike window = [{tl.t_up:g}, {tl.t_down + tl.after_s:g}) s.")
    if p.constant:
        out.append(f"- Constant: the high user count from t = 0 for {tl.t_end - tl.t_up:g} s (warm-up "
                   f"{tl.warmup_s:g} s): the cost of staleness without a load change.")
    out.append(f"- Bursty: open-loop gamma arrivals at the regime's rate, CV {', '.join(f'{c:g}' for c in p.cvs)} "
               f"(burstiness 1/CV^2), {p.gamma_duration_s:g} s with {p.gamma_warmup_s:g} s warm-up.")
    out.append(f"- Policies: LAG {', '.join(str(x) for x in p.lags)} (LAG 0 = `confidence-global`, the fresh "
               "capacity)" + ("; `oracle` as the waste-free bound (step only)" if p.oracle else "") +
               (f"; the contrast regime runs LAG {', '.join(map(str, p.contrast_lags))} on "
                f"{', '.join(p.contrast_scenarios)}" if len(regimes) > 1 and p.contrast_lags else "") +
               f". Seeds {', '.join(str(s) for s in settings.seeds)}, paired: every policy serves the same requests "
               "with the same acceptance draws at a seed; intervals are 95% t-intervals over seeds of the per-seed "
               "differences against LAG 0.\n")
    return out


def _answer(regimes: list[str], rows, paired, paired1) -> tuple[list[str], list[str]]:
    """The answer paragraph: (headlines, lines)."""
    heads, out = [], ["**Answer.**"]
    for name in regimes:
        lags = tuple(sorted(dict.fromkeys(r["lag"] for r in rows if r["regime"] == name and r["lag"] >= 0)))
        h = f"`{name}`: staleness beyond the lossless minimum: {_verdict(paired1, name, lags, 1)}"
        h0 = f"against the synchronous search: {_verdict(paired, name, lags, 0)}"
        heads.append(f"{h}; {h0}")
        out.append(f"- {h}.\n  - {h0[0].upper() + h0[1:]}.")
        one = {sc: find_row(paired, regime=name, scenario=sc, lag=1, metric=m) for sc, m in (
               ("step", "spike_throughput_tok_s"), ("constant", "throughput_tok_s"))}
        if one["step"] is not None and one["constant"] is not None:
            a, c = one["step"], one["constant"]
            la = fmt_ci(-a['diff'], -a['diff_hi'], -a['diff_lo'], 100, 2, '%')
            lc = fmt_ci(-c['diff'], -c['diff_hi'], -c['diff_lo'], 100, 2, '%')
            out.append(f"  - LAG 1 against LAG 0 loses {la} of the spike window's throughput and {lc}"
                       " at a constant high load: the one-step cost is the price of not seeing the step's own "
                       "confidences (what keeps the policy lossless), present without any load change.")
    return heads, out


def _lags(rows, name: str) -> list:
    """The regime's lags in first-seen order (oracle = -1 included)."""
    return list(dict.fromkeys(r["lag"] for r in rows if r["regime"] == name))


def _cost_table(name: str, rows, paired, const: bool, cvs: list[str]) -> list[str]:
    """Costs against LAG 0, one row per lag."""
    out = [f"*Regime `{name}`: costs against LAG 0 (positive = worse), mean [95% CI] in %.*\n"]
    hdr = ["LAG", "step: spike thr. loss", "step: P99 TPOT during", "step: P99 TPOT after",
           "step: recovery up (s, diff)", "step: recovery down (s, diff)"]
    hdr += (["constant high load: thr. loss, mean TPOT"] if const else [])
    hdr += [f"CV {c.removeprefix('gamma-cv')}: thr/busy-s loss, mean TPOT" for c in cvs]
    body = []
    for lag in sorted(x for x in _lags(rows, name) if x != 0):
        def g(sc, m, sign=1.0, scale=100.0, unit=""):
            r = find_row(paired, regime=name, scenario=sc, lag=lag, metric=m)
            if r is None:
                return "n/a"
            lo, hi = sorted((sign * r["diff_lo"], sign * r["diff_hi"]))
            return fmt_ci(sign * r["diff"], lo, hi, scale, 2 if scale == 100 else 2, unit, signed=True)
        line = ["oracle" if lag < 0 else str(lag), g("step", "spike_throughput_tok_s", -1),
                g("step", "tpot_p99_during_s"), g("step", "tpot_p99_after_s"),
                g("step", "recovery_up_s", scale=1.0), g("step", "recovery_down_s", scale=1.0)]
        line += [f"{g('constant', 'throughput_tok_s', -1)}; {g('constant', 'tpot_mean_s')}"] if const else []
        line += [f"{g(c, 'busy_throughput_tok_s', -1)}; {g(c, 'tpot_mean_s')}" for c in cvs]
        body.append(line)
    out.append(md_table(hdr, body) + "\n")
    return out


def _cost1_table(name: str, rows, paired1, const: bool, cvs: list[str]) -> list[str]:
    """Costs against LAG 1, for lags above 1 (empty when there are none)."""
    body1 = []
    for lag in sorted(x for x in _lags(rows, name) if x > 1):
        def g1(sc, m, sign=1.0):
            r = find_row(paired1, regime=name, scenario=sc, lag=lag, metric=m)
            if r is None:
                return "n/a"
            lo, hi = sorted((sign * r["diff_lo"], sign * r["diff_hi"]))
            return fmt_ci(sign * r["diff"], lo, hi, 100, 2, "", signed=True)
        body1.append([str(lag), f"{g1('step', 'spike_throughput_tok_s', -1)}; {g1('step', 'tpot_mean_s')}"] +
                     ([f"{g1('constant', 'throughput_tok_s', -1)}; {g1('constant', 'tpot_mean_s')}"]
                      if const else []) +
                     [f"{g1(c, 'busy_throughput_tok_s', -1)}; {g1(c, 'tpot_mean_s')}" for c in cvs])
    if not body1:
        return []
    return [f"*Regime `{name}`: the same costs against LAG 1 (the freshest lossless budget): throughput "
            "loss; mean-TPOT rise, in %.*\n",
            md_table(["LAG", "step (spike window)"] + (["constant high load"] if const else []) +
                     [f"CV {c.removeprefix('gamma-cv')}" for c in cvs], body1) + "\n"]


def _stale_table(name: str, rows, stale, const: bool, cvs: list[str]) -> list[str]:
    """Over/under-verification against the fresh budget, one row per lag >= 0."""
    out = [f"*Regime `{name}`: per-step verify budget against the fresh capacity, as a share of the fresh "
           "budget (over = verified beyond it, under = short of it), mean [95% CI] in %.*\n"]
    hdr2 = ["LAG", "step low: over / under", "step ramp-up: over / under", "step drop: over / under"]
    hdr2 += (["constant: over / under"] if const else [])
    hdr2 += [f"CV {c.removeprefix('gamma-cv')}: over / under" for c in cvs]
    body2 = []
    for lag in sorted(x for x in _lags(rows, name) if x >= 0):
        def s(sc, m):
            r = find_row(stale, regime=name, scenario=sc, lag=lag, metric=m)
            return "n/a" if r is None else fmt_ci(r["mean"], r["lo"], r["hi"], 100, 2)
        body2.append([str(lag), f"{s('step', 'low_over_rel')} / {s('step', 'low_under_rel')}",
                      f"{s('step', 'up_over_rel')} / {s('step', 'up_under_rel')}",
                      f"{s('step', 'down_over_rel')} / {s('step', 'down_under_rel')}"] +
                     ([f"{s('constant', 'all_over_rel')} / {s('constant', 'all_under_rel')}"] if const else []) +
                     [f"{s(c, 'all_over_rel')} / {s(c, 'all_under_rel')}" for c in cvs])
    out.append(md_table(hdr2, body2) + "\n")
    return out


def _regime_tables(name: str, p: Plan, rows, paired, paired1, stale) -> list[str]:
    """One regime's three tables and its LAG 0 reference line."""
    present = set(r["scenario"] for r in rows if r["regime"] == name)
    cvs = [f"gamma-cv{c:g}" for c in p.cvs if f"gamma-cv{c:g}" in present]
    const = "constant" in present
    out = _cost_table(name, rows, paired, const, cvs)
    out += _cost1_table(name, rows, paired1, const, cvs)
    out += _stale_table(name, rows, stale, const, cvs)
    base = [r for r in rows if r["regime"] == name and r["lag"] == 0 and r["scenario"] == "step"]
    if base:
        m = interval(r["spike_throughput_tok_s"] for r in base)
        ru = interval(r["recovery_up_s"] for r in base)
        out.append(f"LAG 0 reference (`{name}`, step): spike-window throughput {fmt_ci(*m, 1, 0, ' tok/s')}, "
                   f"recovery after the rise {fmt_ci(*ru, 1, 2, ' s')}.\n")
    return out


_DEFINITIONS = (
    "**Definitions.** Over/under-verification: per decoding step, the draft tokens verified minus the "
    "fresh budget b_t (the global search on the step's own confidences and batch), summed over the "
    "window's steps and divided by the fresh budgets' sum. Throughput: output tokens per second over the "
    "window (closed loop); in open loop served tokens follow the arrivals, so the cost is tokens per "
    "busy second of the engine. Recovery: seconds after a change until the trailing 1 s throughput lies "
    "within 5% of the settled level — after the rise, the mean over the second half of the high phase; "
    "after the fall, the pre-spike level (same users) — as a diff against LAG 0 on the same seed; n/a "
    "when some seed never gets there before the run ends. "
    "P99 TPOT during/after: requests arriving in the high phase / after the drop.\n")

_LIMITS = (
    "**Limits.** The simulator draws acceptance outcomes, not tokens: LAG 0 (`confidence-global`) is "
    "not lossless on a real engine, so it is a capacity reference only. One engine (no DP ranks, no "
    "replicas); users have no think time; the step's users arrive with their prefills at once (the "
    "prefill pool, or chunked prefill in the dense regime, absorbs the burst). Staleness is counted in "
    "steps: at a fixed LAG, slower steps (the production profile's) mean older information in seconds. "
    "The oracle row (full mode) bounds what any policy with this drafter and K could reach.")


def _text(settings: Settings, p: Plan, rows, paired, paired1, stale) -> tuple[str, str]:
    regimes = list(dict.fromkeys(r["regime"] for r in rows))
    out = _setup(settings, p, regimes)
    heads, answer = _answer(regimes, rows, paired, paired1)
    out += answer
    out.append("")
    for name in regimes:
        out += _regime_tables(name, p, rows, paired, paired1, stale)
    out.append(_DEFINITIONS)
    out.append(_LIMITS + (" FAST mode: few seeds, short runs, the primary regime only — shape, not answers." if
                          settings.fast else ""))
    return "; ".join(heads), "\n".join(out)
