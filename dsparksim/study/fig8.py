"""Study fig8-production (issue 29, 2.7): the paper's Fig. 8 (verify length and gain over MTP-1 against load) in
the production regime, with intervals.

Closed-loop loads from light to past the KV cache, on the built DeepSeek-V3 TP8 profile and, beside it, a fitted
InferenceX DeepSeek-R1 profile with the same engine options. Per load: confidence-async:2's mean verify length per
decoding request per step, and its output throughput and per-user speed as ratios over mtp1 on the same seed (same
requests, same draws). mtp1 runs with DeepSeek-V3's reported acceptance (0.87, the default) and, as a second
baseline, with DeepSeek-V4's (0.775, the paper's production baseline). The frontier comparison (per-user speed at
matched throughput, the paper's headline axis) comes from each seed's own Pareto frontiers.
"""
from __future__ import annotations

import dataclasses
import numpy as np
import math
from dataclasses import dataclass
from typing import Any

from dsparksim.study.common import (Regime, Section, Settings, find_row, fit_probe, fmt_ci, md_table, new_figure,
                                    paired_rows, regime_setup, run_config, save_figure)

NAME = "fig8-production"
TITLE = "Fig. 8 in the production regime: verify length and gain over MTP-1 against load"
QUESTION = ("In the production regime (DeepSeek-V3/R1 on 8 x H200, decode-only), how do confidence-async's mean "
            "verify length and its throughput and per-user speed over MTP-1 change with load, and how sure are "
            "we of each point?")
FITTED = "fitted-h200x8-deepseek-r1-sglang-0.5.12"
BASE = "mtp1"
POLICY = "confidence-async:2"
# pseudo-policies: mtp1 with DeepSeek-V4's acceptance (the paper's production baseline)
V4 = "mtp1-v4"


@dataclass(frozen=True)
class Plan:
    policies: tuple[str, ...]
    loads: dict[str, tuple[int, ...]]     # regime name -> closed-loop user counts
    duration_s: float
    warmup_s: float
    fitted: bool                          # also the fitted InferenceX profile beside the primary one
    contrast: bool                        # also the dense contrast regime


FULL = Plan(policies=(BASE, V4, "fixed:5", POLICY),
            loads={"production": (16, 64, 128, 256, 512, 768), "dense": (4, 16, 32, 64, 128)},
            duration_s=30.0, warmup_s=10.0, fitted=True, contrast=True)
FAST = Plan(policies=(BASE, POLICY), loads={"production": (16, 256)}, duration_s=8.0, warmup_s=2.0,
            fitted=False, contrast=False)


@dataclass(frozen=True)
class Cell:
    regime: Regime
    load: int
    policy: str
    seed: int
    plan: Plan


def regimes(settings: Settings, p: Plan) -> list[Regime]:
    """The primary regime, the fitted profile beside it (as regime ``production-fitted``), the contrast."""

    prim = settings.regimes[0]
    out = [prim]
    if p.fitted and prim.profile != FITTED:
        out.append(dataclasses.replace(prim, name=f"{prim.name}-fitted", profile=FITTED,
                                       why=prim.why.split(" (")[0] + "; the cost profile fitted on InferenceX's "
                                       "published SGLang 0.5.12 DeepSeek-R1 runs (dsparksim profile fit) instead "
                                       "of the built one, on the server it was fitted under (study.json: "
                                       "options_from_profile_fit; its memory fraction sets the KV capacity)"))
    if p.contrast:
        out += list(settings.regimes[1:])
    return out


def _loads(p: Plan, regime: Regime) -> tuple[int, ...]:
    base = regime.name.removesuffix("-fitted")
    return p.loads.get(base, regime.loads)


def plan(settings: Settings) -> list[Cell]:
    p = FAST if settings.fast else FULL
    return [Cell(r, load, pol, seed, p) for r in regimes(settings, p) for load in _loads(p, r)
            for seed in settings.seeds for pol in p.policies]


def measure(cell: Cell) -> dict[str, Any]:
    """Simulate one cell; its throughput, per-user speed and verify length."""
    from dsparksim.sim.simulate import simulate  # lazy: pulls in scipy

    traffic = {"concurrency": cell.load, "duration_s": cell.plan.duration_s, "warmup_s": cell.plan.warmup_s}
    if cell.policy == V4:
        traffic["mtp1_acceptance"] = "mtp1-v4"
    cfg = run_config(cell.regime, BASE if cell.policy == V4 else cell.policy, cell.seed, traffic)
    s = simulate(cfg).summary
    row = {"regime": cell.regime.name, "profile": cell.regime.profile, "load": cell.load, "policy": cell.policy,
           "seed": cell.seed}
    for k in ("output_throughput_tok_s", "tps_user_mean", "tps_user_median", "tpot_mean_s", "mean_verify_len",
              "tau", "mean_running", "num_requests_completed", "num_preemptions", "saturated"):
        row[k] = s[k]
    row["saturated"] = bool(row["saturated"])
    return row | fit_probe(cfg, s)


_KEYS = ("regime", "load", "policy")
METRICS = (("output_throughput_tok_s", True), ("tps_user_mean", True), ("mean_verify_len", False), ("tau", False))


def frontier_gains(rows: list[dict[str, Any]], baseline: str) -> list[dict[str, Any]]:
    """Per regime and policy: per-user speed gain at matched throughput and throughput gain at matched per-user
    speed over ``baseline``, from each seed's own Pareto frontiers over the loads (paired per seed; 95% interval)."""
    import pandas as pd  # lazy: pandas

    from dsparksim.results.frontier_seeds import comparison_with_intervals, seed_means  # lazy: pulls in pandas, pyarrow
    from dsparksim.results.frontier import mark_pareto, SERIES  # lazy: pulls in pandas, pyarrow

    out = []
    for reg in dict.fromkeys(r["regime"] for r in rows):
        sub = [r for r in rows if r["regime"] == reg]
        pols = set(r["policy"] for r in sub)
        if baseline not in pols:
            continue
        df = pd.DataFrame(sub)
        df["replicas"], df["router"] = 1, "round-robin"
        cols = ["seed", "replicas", "router", "policy", "load", "output_throughput_tok_s", "tps_user_median",
                "saturated"]
        per_seed = mark_pareto(df[cols].copy(), SERIES + ("seed",))
        comp = comparison_with_intervals(seed_means(per_seed), per_seed, baseline=baseline)
        for _, c in comp.iterrows():
            if c["metric"] not in ("tps_user_gain_at_matched_throughput", "throughput_gain_at_matched_slo") or \
                    c["policy"] in (BASE, V4):    # the two baselines against each other: not a question asked
                continue
            out.append({"regime": reg, "policy": c["policy"], "baseline": baseline, "metric": c["metric"],
                        "gain": c["gain_seed_mean"], "gain_lo": c["gain_lo"], "gain_hi": c["gain_hi"],
                        "range_lo": c["range_lo"], "range_hi": c["range_hi"], "narrow_overlap": c["narrow_overlap"],
                        "n_seeds": c["n_seeds"], "note": c["note"]})
    return out


def analyse(settings: Settings, rows: list[dict[str, Any]]) -> Section:
    p = FAST if settings.fast else FULL
    order = {pol: i for i, pol in enumerate(p.policies)}
    rows = sorted(rows, key=lambda r: (r["regime"], r["load"], order.get(r["policy"], 99), r["seed"]))
    paired = []
    for m, rel in METRICS:
        paired += paired_rows(rows, _KEYS, m, {"policy": BASE}, rel)
        if V4 in p.policies:
            paired += [r | {"baseline": V4} for r in paired_rows(rows, _KEYS, m, {"policy": V4}, rel)]
    for r in paired:
        r.setdefault("baseline", BASE)
    gains = frontier_gains(rows, BASE) + (frontier_gains(rows, V4) if V4 in p.policies else [])
    heads, md = _text(settings, p, rows, paired, gains, order)
    md += f"\n\n![verify length and ratio over mtp1 against load]({NAME}/fig8.png)\n"
    return Section(markdown=md, tables={"runs": rows, "paired_vs_mtp1": paired, "frontier_gains": gains},
                   headline=heads, figures={"fig8.png": lambda path: _figure(path, paired, order)})


def _figure(path, paired, order) -> None:
    """Per regime: mean verify length against load (top) and the throughput / per-user ratio over mtp1 (bottom),
    95% intervals as error bars."""
    from matplotlib.ticker import NullFormatter  # lazy: matplotlib

    regs = list(dict.fromkeys(r["regime"] for r in paired))
    fig = new_figure((4.4 * len(regs), 6.4))
    axes = fig.subplots(2, len(regs), squeeze=False)
    for j, reg in enumerate(regs):
        top, bot = axes[0][j], axes[1][j]
        pols = sorted(dict.fromkeys(r["policy"] for r in paired if r["regime"] == reg),
                      key=lambda x: order.get(x, 99))
        for pol in pols:
            v = sorted((r for r in paired if r["regime"] == reg and r["policy"] == pol and r["baseline"] == BASE
                        and r["metric"] == "mean_verify_len"), key=lambda r: r["load"])
            x = [r["load"] for r in v]
            top.errorbar(x, [r["value"] for r in v], yerr=_err(v, "value"), marker="o", capsize=3, label=pol)
            if pol in (BASE, V4):
                continue
            for metric, ls in (("output_throughput_tok_s", "-"), ("tps_user_mean", "--")):
                t = sorted((r for r in paired if r["regime"] == reg and r["policy"] == pol and r["baseline"] == BASE
                            and r["metric"] == metric), key=lambda r: r["load"])
                bot.errorbar([r["load"] for r in t], [1 + r["diff"] for r in t], yerr=_err(t, "diff"), marker="o",
                             ls=ls, capsize=3, label=f"{pol}: {'throughput' if ls == '-' else 'per-user'}")
        bot.axhline(1.0, color="grey", lw=0.8)
        top.set(xscale="log", xlabel="users (closed loop)", ylabel="mean verify length", title=reg)
        bot.set(xscale="log", xlabel="users (closed loop)", ylabel=f"ratio over {BASE}")
        loads = sorted({r["load"] for r in paired if r["regime"] == reg})
        for ax in (top, bot):     # the loads as plain tick labels (no log-scale minor labels)
            ax.set_xticks(loads, [str(x) for x in loads])
            ax.xaxis.set_minor_formatter(NullFormatter())
        top.legend(fontsize=6)
        bot.legend(fontsize=6)
    save_figure(fig, path)


def _err(rows, key):

    lo = [r[key] - r[f"{key}_lo"] for r in rows]
    hi = [r[f"{key}_hi"] - r[key] for r in rows]
    return np.nan_to_num(np.array([lo, hi], float))


def _pct(r) -> str:
    return fmt_ci(r["diff"], r["diff_lo"], r["diff_hi"], 100, 1, "%", True) if r else "n/a"


def _setup(settings: Settings, p: Plan, rows, regs: list[str]) -> list[str]:
    """The question and the setup paragraph."""
    out = regime_setup(QUESTION, regimes(settings, p), rows, regs)
    v4 = (f"; `{V4}` is `mtp1` with DeepSeek-V4's MTP acceptance (0.775, `--mtp1-acceptance mtp1-v4`, the paper's "
          "production baseline)") if V4 in p.policies else ""
    out.append(f"- {p.duration_s:g} s runs with {p.warmup_s:g} s warm-up; policies "
               f"{', '.join(f'`{x}`' for x in p.policies)} (`{BASE}` with DeepSeek-V3's acceptance 0.87{v4}). "
               f"Seeds {', '.join(map(str, settings.seeds))}; ratios are paired per seed against `{BASE}`; 95% "
               "t-intervals over seeds. Verify length = draft tokens verified per decoding request per step.\n")
    return out


def _v4_line(name: str, lo_l, hi_l, paired, gains) -> str | None:
    """The answer's sub-line against the DeepSeek-V4 baseline; None when its throughputs are missing."""
    t4 = [find_row(paired, regime=name, load=ld, policy=POLICY, metric="output_throughput_tok_s", baseline=V4)
          for ld in (lo_l, hi_l)]
    g4 = find_row(gains, regime=name, policy=POLICY, baseline=V4, metric="tps_user_gain_at_matched_throughput")
    if None in t4:
        return None
    line = (f"  - Against `{V4}` (the paper's baseline): throughput {_pct(t4[0])} at {lo_l} users, "
            f"{_pct(t4[1])} at {hi_l}")
    if g4 is not None:
        line += (f"; per-user speed at matched throughput "
                 f"{fmt_ci(g4['gain'], g4['gain_lo'], g4['gain_hi'], 100, 1, '%', True)} (the paper "
                 "reports +60-85% in DeepSeek-V4 production)")
    return line + "."


def _answer(p: Plan, regs: list[str], rows, paired, gains) -> tuple[list[str], list[str]]:
    """The answer paragraph: (headlines, lines)."""
    heads, out = [], ["**Answer.**"]
    for name in regs:
        loads = sorted(dict.fromkeys(r["load"] for r in rows if r["regime"] == name))
        lo_l, hi_l = loads[0], loads[-1]
        vl, th, us = ([find_row(paired, regime=name, load=ld, policy=POLICY, metric=m, baseline=BASE)
                       for ld in (lo_l, hi_l)]
                      for m in ("mean_verify_len", "output_throughput_tok_s", "tps_user_mean"))
        if None in vl or None in th or None in us:
            continue
        best = max((r for r in paired if r["regime"] == name and r["policy"] == POLICY and r["baseline"] == BASE
                    and r["metric"] == "output_throughput_tok_s"), key=lambda r: r["diff"])
        text = (f"`{name}`: `{POLICY}` verifies "
                f"{fmt_ci(vl[0]['value'], vl[0]['value_lo'], vl[0]['value_hi'], 1, 2)} draft tokens per request per "
                f"step at {lo_l} users and {fmt_ci(vl[1]['value'], vl[1]['value_lo'], vl[1]['value_hi'], 1, 2)} at "
                f"{hi_l}; throughput over `{BASE}` {_pct(th[0])} at {lo_l} users, {_pct(th[1])} at {hi_l} (largest "
                f"{_pct(best)} at {best['load']}); per-user speed {_pct(us[0])} and {_pct(us[1])}")
        g = find_row(gains, regime=name, policy=POLICY, baseline=BASE, metric="tps_user_gain_at_matched_throughput")
        if g is not None:
            text += ("; at matched throughput (frontier over the loads) per-user speed "
                     f"{fmt_ci(g['gain'], g['gain_lo'], g['gain_hi'], 100, 1, '%', True)}")
        heads.append(text)
        out.append(f"- {text}.")
        if V4 in p.policies:
            line = _v4_line(name, lo_l, hi_l, paired, gains)
            if line is not None:
                out.append(line)
    return heads, out


def _load_table(p: Plan, name: str, rows, paired) -> list[str]:
    """Per load: the baseline's throughput and each policy's verify length and paired changes."""
    out = [f"*`{name}`: mean verify length (value [95% CI]) and paired change against `{BASE}` in % "
           "(throughput; per-user mean tok/s).*\n"]
    pols = [x for x in p.policies if x != BASE]
    hdr = ["users", f"`{BASE}` thr. tok/s"] + [f"`{x}` verify len; thr.; per-user" for x in pols]
    body = []
    for ld in sorted(dict.fromkeys(r["load"] for r in rows if r["regime"] == name)):
        b = find_row(paired, regime=name, load=ld, policy=BASE, metric="output_throughput_tok_s", baseline=BASE)
        line = [str(ld), fmt_ci(b["value"], b["value_lo"], b["value_hi"], 1, 0) if b else "n/a"]
        for pol in pols:
            v = find_row(paired, regime=name, load=ld, policy=pol, metric="mean_verify_len", baseline=BASE)
            t = find_row(paired, regime=name, load=ld, policy=pol, metric="output_throughput_tok_s", baseline=BASE)
            u = find_row(paired, regime=name, load=ld, policy=pol, metric="tps_user_mean", baseline=BASE)
            line.append(f"{fmt_ci(v['value'], v['value_lo'], v['value_hi'], 1, 2) if v else 'n/a'}; "
                        f"{_pct(t)}; {_pct(u)}")
        body.append(line)
    out.append(md_table(hdr, body) + "\n")
    return out


def _gains_table(gains) -> list[str]:
    """The frontier gains over the loads (empty when there are none)."""
    if not gains:
        return []
    body = [[f"`{g['regime']}`", f"`{g['policy']}`", f"`{g['baseline']}`",
             g["metric"].replace("_", " "), fmt_ci(g["gain"], g["gain_lo"], g["gain_hi"], 100, 1, "%", True),
             f"{g['range_lo']:.0f}..{g['range_hi']:.0f}" if g["range_lo"] is not None and
             math.isfinite(g["range_lo"]) else "n/a", g["note"] or ""] for g in gains]
    return ["*Frontier gains over the loads (each seed's own Pareto frontiers; interval over seeds).*\n",
            md_table(["regime", "policy", "baseline", "gain", "mean [95% CI]", "range", "note"], body) + "\n"]


def _limits(settings: Settings, rows) -> str:
    """The limits paragraph, naming the saturated cells."""
    sat = sorted({(r["regime"], r["load"], r["policy"]) for r in rows if r["saturated"]})
    return ("**Limits.** Closed-loop users without think time, one engine; the parametric dspark acceptance "
            "(paper-calibrated on Qwen3-4B, not DeepSeek's drafter); K = 5 as in the paper's production. "
            "Saturated cells (the queue still growing at the end) are kept in the per-load table and never "
            f"enter a frontier: {', '.join(f'{a} {b} {c}' for a, b, c in sat) if sat else 'none'}."
            + (" FAST mode: two loads, two policies, short runs — shape, not answers." if settings.fast else ""))


def _text(settings: Settings, p: Plan, rows, paired, gains, order) -> tuple[str, str]:
    regs = list(dict.fromkeys(r["regime"] for r in rows))
    out = _setup(settings, p, rows, regs)
    heads, answer = _answer(p, regs, rows, paired, gains)
    out += answer
    out.append("")
    for name in regs:
        out += _load_table(p, name, rows, paired)
    out += _gains_table(gains)
    out.append(_limits(settings, rows))
    return "; ".join(heads), "\n".join(out)


__all__ = ["NAME", "TITLE", "QUESTION", "plan", "measure", "analyse"]
