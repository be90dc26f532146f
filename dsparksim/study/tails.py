"""Study p99-tails (issue 29, 2.4): TPOT, ITL and TTFT tails per policy, and a knob that buys tail for mean.

Every policy of the production sweep at the regime's loads, plus the knob: confidence-async:2 with a per-request
minimum verify length m (every decoding request verifies at least m draft tokens; fixed before any draw, so
lossless). Differences are paired against confidence-async:2 on the same seed (same requests, same draws).
"""
from __future__ import annotations

import numpy as np
import math
from dataclasses import dataclass
from typing import Any

from dsparksim.study.common import (MinVerify, Regime, Section, Settings, find_row, fit_probe, fmt_ci, md_table,
                                    new_figure, paired_rows, regime_setup, run_config, save_figure)

NAME = "p99-tails"
TITLE = "P99 tails per policy, and a knob that buys tail for mean"
QUESTION = ("Which verification policy has the shortest TPOT, ITL and TTFT tails in the production regime, and "
            "does a per-request minimum verify length buy P99 TPOT for mean throughput — at what price?")
BASE = "confidence-async:2"
POLICIES_FULL = ("none", "mtp1", "fixed:5", "threshold:0.5", "confidence", "confidence-async:2", "goodput")
POLICIES_FAST = ("mtp1", "confidence-async:2")


@dataclass(frozen=True)
class Plan:
    policies: tuple[str, ...]
    floors: tuple[int, ...]       # minimum verify lengths tried on BASE (0 = BASE itself)
    duration_s: float
    warmup_s: float
    loads_used: int               # how many of the regime's loads, lowest first


FULL = Plan(policies=POLICIES_FULL, floors=(1, 2, 3), duration_s=30.0, warmup_s=10.0, loads_used=3)
FAST = Plan(policies=POLICIES_FAST, floors=(1,), duration_s=8.0, warmup_s=2.0, loads_used=1)


@dataclass(frozen=True)
class Cell:
    regime: Regime
    load: int
    policy: str          # a policy spec, or BASE+minM for the knob
    seed: int
    plan: Plan


def plan(settings: Settings) -> list[Cell]:
    p = FAST if settings.fast else FULL
    regimes = settings.regimes[:1] if settings.fast else settings.regimes
    pols = list(p.policies) + [f"{BASE}+min{m}" for m in p.floors]
    cells = []
    for r in regimes:
        loads = r.loads[:p.loads_used]
        cells += [Cell(r, load, pol, seed, p) for load in loads for seed in settings.seeds for pol in pols]
    return cells


def measure(cell: Cell) -> dict[str, Any]:
    """Simulate one cell; its summary's latency tails and throughput (runs in a worker process)."""
    from dsparksim.sim.simulate import simulate  # lazy: pulls in scipy

    spec, _, floor = cell.policy.partition("+min")
    traffic = {"concurrency": cell.load, "duration_s": cell.plan.duration_s, "warmup_s": cell.plan.warmup_s}
    cfg = run_config(cell.regime, spec, cell.seed, traffic)
    holder: list[MinVerify] = []

    def wrap(p):
        holder.append(MinVerify(p, int(floor)))
        return holder[0]

    out = simulate(cfg, wrap_policy=wrap if floor else None)
    s = out.summary
    row = {"regime": cell.regime.name, "profile": cell.regime.profile, "load": cell.load, "policy": cell.policy,
           "seed": cell.seed}
    for k in ("output_throughput_tok_s", "tpot_mean_s", "tpot_median_s", "tpot_p99_s", "itl_median_s", "itl_p99_s",
              "ttft_mean_s", "ttft_p99_s", "tps_user_p10", "mean_verify_len", "num_requests_completed"):
        row[k] = s[k]
    row["knob_overflow_steps"] = holder[0].overflow_steps if holder else 0
    return row | fit_probe(cfg, s)


_KEYS = ("regime", "load", "policy")
METRICS = (("output_throughput_tok_s", True), ("tpot_mean_s", True), ("tpot_p99_s", True), ("itl_p99_s", True),
           ("ttft_p99_s", True), ("tps_user_p10", True))


def analyse(settings: Settings, rows: list[dict[str, Any]]) -> Section:
    p = FAST if settings.fast else FULL
    order = {pol: i for i, pol in enumerate(list(p.policies) + [f"{BASE}+min{m}" for m in p.floors])}
    rows = sorted(rows, key=lambda r: (r["regime"], r["load"], order.get(r["policy"], 99), r["seed"]))
    paired = []
    for m, rel in METRICS:
        paired += paired_rows(rows, _KEYS, m, {"policy": BASE}, rel)
    heads, md = _text(settings, p, rows, paired, order)
    md += f"\n\n![P99 TPOT against throughput per policy]({NAME}/tails.png)\n"
    return Section(markdown=md, tables={"runs": rows, "paired_vs_base": paired}, headline=heads,
                   figures={"tails.png": lambda path: _figure(path, paired, order)})


def _figure(path, paired, order) -> None:
    """One panel per regime and load: P99 TPOT against throughput per policy, 95% intervals on both."""
    panels = list(dict.fromkeys((r["regime"], r["load"]) for r in paired))
    fig = new_figure((4.2 * len(panels), 4.0))
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (reg, load) in zip(axes, panels):
        pols = sorted(dict.fromkeys(r["policy"] for r in paired if r["regime"] == reg and r["load"] == load),
                      key=lambda x: order.get(x, 99))
        for pol in pols:
            t = find_row(paired, regime=reg, load=load, policy=pol, metric="output_throughput_tok_s")
            q = find_row(paired, regime=reg, load=load, policy=pol, metric="tpot_p99_s")
            x, y = t["value"], 1e3 * q["value"]
            xe = np.nan_to_num([[x - t["value_lo"]], [t["value_hi"] - x]])
            ye = np.nan_to_num([[y - 1e3 * q["value_lo"]], [1e3 * q["value_hi"] - y]])
            ax.errorbar([x], [y], xerr=xe, yerr=ye, marker="s" if "+min" in pol else "o", capsize=3, label=pol)
        ax.set(xlabel="output throughput (tok/s)", ylabel="P99 TPOT (ms)", title=f"{reg}, {load} users")
    axes[0].legend(fontsize=6)
    save_figure(fig, path)


def _text(settings: Settings, p: Plan, rows, paired, order) -> tuple[str, str]:
    regimes = list(dict.fromkeys(r["regime"] for r in rows))
    out = regime_setup(QUESTION, settings.regimes, rows, regimes)
    pols = ", ".join(f"`{x}`" for x in p.policies)
    out.append(f"- {p.duration_s:g} s runs with {p.warmup_s:g} s warm-up; policies {pols}; "
               f"the knob: `{BASE}` with a minimum verify length m in {{{', '.join(map(str, p.floors))}}} "
               f"(shown as `{BASE}+minM`). Seeds {', '.join(map(str, settings.seeds))}, paired against `{BASE}`; "
               "95% t-intervals over seeds.\n")
    out.append("**Answer.**")
    heads = []
    for name in regimes:
        for load in sorted(dict.fromkeys(r["load"] for r in rows if r["regime"] == name)):
            cand = [r for r in paired if r["regime"] == name and r["load"] == load and r["metric"] == "tpot_p99_s"
                    and "+min" not in r["policy"]]
            if not cand:
                continue
            best = min(cand, key=lambda r: r["value"] if math.isfinite(r["value"]) else math.inf)
            knob = [r for r in paired if r["regime"] == name and r["load"] == load and r["metric"] == "tpot_p99_s"
                    and "+min" in r["policy"]]
            kb = min(knob, key=lambda r: r["diff"] if math.isfinite(r["diff"]) else math.inf) if knob else None

            def cost(pol):
                thr = find_row(paired, regime=name, load=load, policy=pol, metric="output_throughput_tok_s")
                mean = find_row(paired, regime=name, load=load, policy=pol, metric="tpot_mean_s")
                return (f"throughput {fmt_ci(thr['diff'], thr['diff_lo'], thr['diff_hi'], 100, 1, '%', True)}, "
                        f"mean TPOT {fmt_ci(mean['diff'], mean['diff_lo'], mean['diff_hi'], 100, 1, '%', True)}")
            text = (f"`{name}` at {load} users: shortest P99 TPOT `{best['policy']}` "
                    f"{fmt_ci(best['value'], best['value_lo'], best['value_hi'], 1e3, 1, ' ms')}")
            if best["policy"] != BASE:
                text += (f" ({fmt_ci(best['diff'], best['diff_lo'], best['diff_hi'], 100, 1, '%', True)} vs "
                         f"`{BASE}`, at {cost(best['policy'])})")
            if kb is not None:
                buys = math.isfinite(kb["diff_hi"]) and kb["diff_hi"] < 0
                text += ("; the minimum verify length " + ("buys tail" if buys else "buys no tail") +
                         f": best `{kb['policy']}` P99 TPOT "
                         f"{fmt_ci(kb['diff'], kb['diff_lo'], kb['diff_hi'], 100, 1, '%', True)} at "
                         f"{cost(kb['policy'])} vs `{BASE}`")
            heads.append(text)
            out.append(f"- {text}.")
    out.append("")
    for name in regimes:
        for load in sorted(dict.fromkeys(r["load"] for r in rows if r["regime"] == name)):
            out.append(f"*`{name}`, {load} users: values mean [95% CI] over seeds (ms; tok/s); in brackets after "
                       f"the slash, the paired change against `{BASE}` in %.*\n")
            hdr = ["policy", "throughput tok/s", "mean TPOT", "P99 TPOT", "P99 ITL", "P99 TTFT", "P10 user tok/s"]
            body = []
            pols = sorted(dict.fromkeys(r["policy"] for r in rows if r["regime"] == name and r["load"] == load),
                          key=lambda x: order.get(x, 99))
            for pol in pols:
                line = [f"`{pol}`"]
                for m, _rel in METRICS:
                    r = find_row(paired, regime=name, load=load, policy=pol, metric=m)
                    scale = 1.0 if m in ("output_throughput_tok_s", "tps_user_p10") else 1e3
                    v = fmt_ci(r["value"], r["value_lo"], r["value_hi"], scale, 0 if scale == 1 else 1)
                    d = "" if pol == BASE else " / " + fmt_ci(r["diff"], r["diff_lo"], r["diff_hi"], 100, 1, "%", True)
                    line.append(v + d)
                body.append(line)
            out.append(md_table(hdr, body) + "\n")
    over = sum(r["knob_overflow_steps"] for r in rows)
    out.append("**Definitions.** TPOT per request = (finish - first token) / (output tokens - 1), over requests "
               "arriving after the warm-up and completed; ITL = step durations weighted by the requests decoding in "
               "them (each streams one chunk per step); TTFT = arrival to first token (prefill pool queue + prefill "
               "+ KV transfer when disaggregated). P99 over the pooled requests of one run, then averaged over "
               f"seeds. Knob steps where the floor would overflow the token budget kept the policy's choice: {over} "
               "in all runs.\n")
    out.append("**Limits.** A P99 over one run's requests rests on few samples at low load (its spread shows in "
               "the intervals). The knob is a study wrapper (dsparksim.study.common.MinVerify), not yet a "
               "`--policy` spec. Closed-loop users without think time; one engine; lengths resampled from the "
               "Azure conversation sample." + (" FAST mode: two policies, short runs, one load — shape, not answers."
                                               if settings.fast else ""))
    return "; ".join(heads), "\n".join(out)


__all__ = ["NAME", "TITLE", "QUESTION", "plan", "measure", "analyse"]
