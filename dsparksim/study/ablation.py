"""Study ablation (issue 29, 2.6): the ablation the paper suggests — the drafter's and the scheduler's contributions
separated on one model, traffic and engine, and what padding verify lengths to the batch maximum costs.

Arms (drafter acceptance and drafting cost, verification policy), all on the same requests and draws per seed:

* ``ar-fixed``: an autoregressive drafter (EAGLE-3-style, K sequential forwards) at fixed length K;
* ``par-fixed``: a parallel drafter without the Markov head (DFlash) at fixed length;
* ``sar-fixed``: the semi-autoregressive drafter (parallel + Markov head, DSpark) at fixed length — the drafter alone;
* ``sar-threshold``: a static survival threshold (0.5) on the DSpark drafter;
* ``sar-sync``: synchronous confidence scheduling, the paper's Algorithm 1 (``confidence``);
* ``sar-sync-global``: the synchronous global search on the step's own confidences (``confidence-global``: not
  lossless on a real engine, shown to say what Algorithm 1's early stop costs);
* ``sar-async``: asynchronous confidence scheduling (``confidence-async:2``, the paper's production variant);
* ``ar-async``: the autoregressive drafter under asynchronous scheduling (the 2 x 2 factorial: does the scheduler's
  gain depend on the drafter?);
* ``mtp1``: the production baseline (DeepSeek's one-token MTP), for scale.

Each arm runs on a variable-length engine and on a padded one (``--pad-verify``: every decoding request of a step
runs at the step's longest verify length, as an engine without variable-length attention kernels must).
Contributions are paired per seed as ratios: drafter = sar-fixed / ar-fixed (split into parallelism par-fixed /
ar-fixed and Markov head sar-fixed / par-fixed), scheduler = sar-async / sar-fixed, total = sar-async / ar-fixed
= drafter x scheduler.
"""
from __future__ import annotations

import numpy as np
import math
from dataclasses import dataclass
from typing import Any

from dsparksim.results.stats import t_interval
from dsparksim.study.common import (Regime, Section, Settings, find_row, fit_probe, fmt_ci, md_table, new_figure,
                                    paired_rows, regime_setup, run_config, save_figure)

NAME = "ablation"
TITLE = "The paper's ablation: drafter vs scheduler, and the cost of padded verification"
QUESTION = ("On one model, traffic and engine, how much of DSpark's gain over a fixed-length autoregressive drafter "
            "comes from the semi-autoregressive drafter and how much from confidence scheduling (static threshold, "
            "synchronous, asynchronous)? And how much of it survives an engine that pads verify lengths to the "
            "batch maximum?")
THRESHOLD = 0.5
# arm -> (policy spec, block drafter acceptance)
ARMS = {"mtp1": ("mtp1", "dspark"), "ar-fixed": ("fixed:5", "eagle3"), "par-fixed": ("fixed:5", "dflash"),
        "sar-fixed": ("fixed:5", "dspark"), "sar-threshold": (f"threshold:{THRESHOLD}", "dspark"),
        "sar-sync": ("confidence", "dspark"), "sar-sync-global": ("confidence-global", "dspark"),
        "sar-async": ("confidence-async:2", "dspark"), "ar-async": ("confidence-async:2", "eagle3")}
BASE = "ar-fixed"
# (label, numerator arm, denominator arm): the contributions, paired per seed
CONTRIBUTIONS = (("total (sar-async / ar-fixed)", "sar-async", "ar-fixed"),
                 ("drafter (sar-fixed / ar-fixed)", "sar-fixed", "ar-fixed"),
                 ("  parallel drafting (par-fixed / ar-fixed)", "par-fixed", "ar-fixed"),
                 ("  Markov head (sar-fixed / par-fixed)", "sar-fixed", "par-fixed"),
                 ("scheduler: async (sar-async / sar-fixed)", "sar-async", "sar-fixed"),
                 ("scheduler: static threshold (sar-threshold / sar-fixed)", "sar-threshold", "sar-fixed"),
                 ("scheduler: sync Algorithm 1 (sar-sync / sar-fixed)", "sar-sync", "sar-fixed"),
                 ("scheduler: sync global search (sar-sync-global / sar-fixed)", "sar-sync-global", "sar-fixed"),
                 ("async vs static threshold (sar-async / sar-threshold)", "sar-async", "sar-threshold"),
                 ("scheduler on the AR drafter (ar-async / ar-fixed)", "ar-async", "ar-fixed"))


@dataclass(frozen=True)
class Plan:
    arms: tuple[str, ...]
    loads: dict[str, tuple[int, ...]]
    pads: tuple[bool, ...]
    duration_s: float
    warmup_s: float
    contrast: bool


FULL = Plan(arms=tuple(ARMS), loads={"production": (64, 256, 512), "dense": (64,)}, pads=(False, True),
            duration_s=30.0, warmup_s=10.0, contrast=True)
FAST = Plan(arms=("ar-fixed", "par-fixed", "sar-fixed", "sar-threshold", "sar-async"),
            loads={"production": (256,)}, pads=(False, True), duration_s=5.0, warmup_s=1.5, contrast=False)


@dataclass(frozen=True)
class Cell:
    regime: Regime
    load: int
    arm: str
    pad: bool
    seed: int
    plan: Plan


def plan(settings: Settings) -> list[Cell]:
    p = FAST if settings.fast else FULL
    regs = settings.regimes if p.contrast else settings.regimes[:1]
    return [Cell(r, load, arm, pad, seed, p) for r in regs for load in p.loads.get(r.name, r.loads[:1])
            for pad in p.pads for seed in settings.seeds for arm in p.arms]


def measure(cell: Cell) -> dict[str, Any]:
    """Simulate one cell: throughput, per-user speed, TPOT, verify length, tau, padding and drafting time."""

    from dsparksim.sim.simulate import simulate  # lazy: pulls in scipy

    pol, acc = ARMS[cell.arm]
    opts = {"concurrency": cell.load, "duration_s": cell.plan.duration_s, "warmup_s": cell.plan.warmup_s,
            "acceptance": acc, "pad_verify": cell.pad}
    cfg = run_config(cell.regime, pol, cell.seed, opts)
    out = simulate(cfg)
    s, st = out.summary, out.result.steps
    row = {"regime": cell.regime.name, "profile": cell.regime.profile, "load": cell.load, "arm": cell.arm,
           "policy": pol, "acceptance": acc, "pad": cell.pad, "seed": cell.seed}
    for k in ("output_throughput_tok_s", "tps_user_mean", "tpot_mean_s", "mean_verify_len", "tau", "drafter",
              "num_requests_completed"):
        row[k] = s[k]
    M = np.asarray(st["M"], float)
    pad = np.asarray(st["pad_tokens"], float) if "pad_tokens" in st else np.zeros_like(M)
    row["pad_share"] = float(pad.sum() / (M + pad).sum()) if len(M) else math.nan   # padded share of target tokens
    return row | fit_probe(cfg, s)


_KEYS = ("regime", "load", "pad", "arm")
METRICS = (("output_throughput_tok_s", True), ("tps_user_mean", True), ("tpot_mean_s", True),
           ("mean_verify_len", False), ("tau", False), ("pad_share", False))


def ratio(rows, regime, load, pad, a, b, metric="output_throughput_tok_s") -> dict[str, Any] | None:
    """Paired per seed: x_a / x_b - 1 (mean and 95% t-interval over seeds), or None if an arm is missing."""
    def vals(arm):
        return {r["seed"]: r[metric] for r in rows if r["regime"] == regime and r["load"] == load and r["pad"] == pad
                and r["arm"] == arm}
    va, vb = vals(a), vals(b)
    seeds = sorted(set(va) & set(vb))
    if not seeds:
        return None
    d = [va[s] / vb[s] - 1.0 if vb[s] else math.nan for s in seeds]
    iv = t_interval(d)
    logs = [math.log(va[s] / vb[s]) if va[s] > 0 and vb[s] > 0 else math.nan for s in seeds]
    return {"regime": regime, "load": load, "pad": pad, "numerator": a, "denominator": b, "metric": metric,
            "diff": iv.mean, "diff_lo": iv.lo, "diff_hi": iv.hi, "log_ratio": sum(logs) / len(logs),
            "n_seeds": iv.n}


def analyse(settings: Settings, rows: list[dict[str, Any]]) -> Section:
    p = FAST if settings.fast else FULL
    order = {a: i for i, a in enumerate(ARMS)}
    rows = sorted(rows, key=lambda r: (r["regime"], r["load"], r["pad"], order[r["arm"]], r["seed"]))
    paired = []
    for m, rel in METRICS:
        paired += paired_rows(rows, _KEYS, m, {"arm": BASE}, rel, vary="arm")
    contrib = []
    padcost = []
    for reg in dict.fromkeys(r["regime"] for r in rows):
        for load in sorted(dict.fromkeys(r["load"] for r in rows if r["regime"] == reg)):
            for pad in p.pads:
                for label, a, b in CONTRIBUTIONS:
                    for metric in ("output_throughput_tok_s", "tps_user_mean"):
                        c = ratio(rows, reg, load, pad, a, b, metric)
                        if c is not None:
                            contrib.append(c | {"contribution": label.strip()})
            if True in p.pads and False in p.pads:
                for arm in p.arms:
                    a = _padratio(rows, reg, load, arm)
                    if a is not None:
                        padcost.append(a)
    heads, md = _text(settings, p, rows, paired, contrib, padcost, order)
    md += f"\n\n![throughput per arm, variable-length and padded]({NAME}/ablation.png)\n"
    return Section(markdown=md, tables={"runs": rows, "paired_vs_ar_fixed": paired, "contributions": contrib,
                                        "padding_cost": padcost}, headline=heads,
                   figures={"ablation.png": lambda path: _figure(path, paired, order)})


def _padratio(rows, reg, load, arm) -> dict[str, Any] | None:
    """Paired per seed: an arm's throughput padded / variable-length - 1."""
    on = {r["seed"]: r for r in rows if (r["regime"], r["load"], r["arm"], r["pad"]) == (reg, load, arm, True)}
    off = {r["seed"]: r for r in rows if (r["regime"], r["load"], r["arm"], r["pad"]) == (reg, load, arm, False)}
    seeds = sorted(set(on) & set(off))
    if not seeds:
        return None
    m = "output_throughput_tok_s"
    iv = t_interval([on[s][m] / off[s][m] - 1.0 for s in seeds])
    sh = t_interval([on[s]["pad_share"] for s in seeds])
    return {"regime": reg, "load": load, "arm": arm, "metric": m, "diff": iv.mean, "diff_lo": iv.lo,
            "diff_hi": iv.hi, "pad_share": sh.mean, "pad_share_lo": sh.lo, "pad_share_hi": sh.hi, "n_seeds": iv.n}


def _figure(path, paired, order) -> None:
    """Per regime and load: throughput of every arm (mean, 95% interval), variable-length and padded side by side."""
    panels = list(dict.fromkeys((r["regime"], r["load"]) for r in paired))
    fig = new_figure((max(5.0, 4.6 * len(panels)), 4.2))
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (reg, load) in zip(axes, panels):
        arms = sorted(dict.fromkeys(r["arm"] for r in paired if r["regime"] == reg and r["load"] == load),
                      key=lambda a: order[a])
        x = np.arange(len(arms))
        for k, pad in enumerate((False, True)):
            v = [next((r for r in paired if (r["regime"], r["load"], r["arm"], r["pad"], r["metric"]) ==
                       (reg, load, a, pad, "output_throughput_tok_s")), None) for a in arms]
            if all(r is None for r in v):
                continue
            y = [r["value"] if r else np.nan for r in v]
            err = np.nan_to_num([[r["value"] - r["value_lo"] if r else 0 for r in v],
                                 [r["value_hi"] - r["value"] if r else 0 for r in v]])
            ax.bar(x + (k - 0.5) * 0.4, y, 0.4, yerr=err, capsize=2, label="padded" if pad else "variable-length")
        ax.set_xticks(x)
        ax.set_xticklabels(arms, rotation=45, ha="right", fontsize=7)
        ax.set(ylabel="output throughput (tok/s)", title=f"{reg}, {load} users")
        ax.legend(fontsize=7)
    save_figure(fig, path)


def _pct(r) -> str:
    return fmt_ci(r["diff"], r["diff_lo"], r["diff_hi"], 100, 1, "%", True) if r else "n/a"


def _setup(settings: Settings, p: Plan, rows, regs: list[str]) -> list[str]:
    """The question and the setup paragraph."""
    out = regime_setup(QUESTION, settings.regimes, rows, regs)
    arms = "; ".join(f"`{a}` = `{ARMS[a][0]}` with the `{ARMS[a][1]}` drafter" for a in p.arms)
    out.append(f"- Arms: {arms}. K = 5; each drafter's acceptance (paper-calibrated parametric model) and drafting "
               "cost (the profile's drafter entry: autoregressive = K sequential forwards, parallel = one forward "
               "over n x K tokens, + 0.8% for DSpark's Markov head).")
    out.append(f"- Every arm on a variable-length engine and padded (`--pad-verify`). {p.duration_s:g} s runs with "
               f"{p.warmup_s:g} s warm-up; seeds {', '.join(map(str, settings.seeds))}; ratios paired per seed; "
               "95% t-intervals over seeds.\n")
    return out


def _loads(rows, name: str) -> list:
    """The regime's loads, ascending."""
    return sorted(dict.fromkeys(r["load"] for r in rows if r["regime"] == name))


def _contrib(contrib, name, load, a, b, pad=False, metric="output_throughput_tok_s"):
    """The contribution row a / b at (regime, load, pad, metric), or None."""
    return next((x for x in contrib if (x["regime"], x["load"], x["pad"], x["numerator"],
                                        x["denominator"], x["metric"]) ==
                 (name, load, pad, a, b, metric)), None)


def _answer_item(name: str, load, paired, contrib, padcost) -> tuple[str, list[str]] | None:
    """One (regime, load)'s headline and answer lines; None when its contributions are missing."""
    def c(a, b, pad=False, metric="output_throughput_tok_s"):
        return _contrib(contrib, name, load, a, b, pad, metric)
    tot, dr, sch = c("sar-async", "ar-fixed"), c("sar-fixed", "ar-fixed"), c("sar-async", "sar-fixed")
    if None in (tot, dr, sch):
        return None
    text = (f"`{name}` at {load} users: DSpark (`sar-async`) over a fixed-length autoregressive drafter "
            f"{_pct(tot)} throughput = drafter {_pct(dr)} x scheduler {_pct(sch)}")
    if tot["diff_lo"] > 0 or tot["diff_hi"] < 0:
        share = dr["log_ratio"] / tot["log_ratio"] if tot["log_ratio"] else math.nan
        text += f" (the drafter's share of the log gain {100 * share:.0f}%)"
    th, sy = c("sar-threshold", "sar-fixed"), c("sar-sync", "sar-fixed")
    if th is not None:
        text += f"; a static threshold {_pct(th)}"
    if sy is not None:
        vs = find_row(paired, regime=name, load=load, pad=False, arm="sar-sync", metric="mean_verify_len")
        text += f", synchronous Algorithm 1 {_pct(sy)}"
        if vs is not None:
            text += (f" (it verifies {fmt_ci(vs['value'], vs['value_lo'], vs['value_hi'], 1, 2)} draft "
                     "tokens per request-step: its first-drop stop ends at the first step of the cost "
                     "staircase)" if vs["value"] < 1 else
                     f" (verify length {fmt_ci(vs['value'], vs['value_lo'], vs['value_hi'], 1, 2)})")
    pa = c("sar-async", "sar-fixed", pad=True)
    pc = find_row(padcost, regime=name, load=load, arm="sar-async")
    if pa is not None and pc is not None:
        text += (f"; on a padded engine async scheduling against fixed length {_pct(pa)} (padding "
                 f"changes `sar-async`'s throughput by {_pct(pc)})")
    out = [f"- {text}."]
    ar = c("ar-async", "ar-fixed")
    if ar is not None:
        out.append(f"  - Factorial: the async scheduler on the autoregressive drafter {_pct(ar)} "
                   f"(on DSpark's {_pct(sch)}).")
    return text, out


def _answer(regs: list[str], rows, paired, contrib, padcost) -> tuple[list[str], list[str]]:
    """The answer paragraph: (headlines, lines)."""
    heads, out = [], ["**Answer.**"]
    for name in regs:
        for load in _loads(rows, name):
            item = _answer_item(name, load, paired, contrib, padcost)
            if item is None:
                continue
            heads.append(item[0])
            out += item[1]
    return heads, out


def _contrib_table(p: Plan, name: str, load, contrib) -> list[str]:
    """Contributions as paired ratios, variable-length | padded engine."""
    out = [f"*`{name}`, {load} users: contributions as paired throughput ratios - 1 (per-user speed "
           "after the slash), variable-length | padded engine, mean [95% CI] in %.*\n"]
    body = []
    for label, a, b in CONTRIBUTIONS:
        cells = [label.replace("  ", "- ")]
        for pad in p.pads:
            t = _contrib(contrib, name, load, a, b, pad, "output_throughput_tok_s")
            u = _contrib(contrib, name, load, a, b, pad, "tps_user_mean")
            cells.append(f"{_pct(t)} / {_pct(u)}" if t else "n/a")
        if any(c_ != "n/a" for c_ in cells[1:]):
            body.append(cells)
    hdr = ["contribution"] + ["padded" if pad else "variable-length" for pad in p.pads]
    out.append(md_table(hdr, body) + "\n")
    return out


def _arm_table(name: str, load, rows, paired, padcost, order) -> list[str]:
    """Per-arm values and padding's cost."""
    out = [f"*`{name}`, {load} users: per arm, value mean [95% CI] (variable-length engine); padding's "
           "cost = paired throughput change when padded, and the padded share of the target's tokens.*\n"]
    body = []
    for arm in sorted(dict.fromkeys(r["arm"] for r in rows if r["regime"] == name and r["load"] == load),
                      key=lambda a: order[a]):
        def g(metric, pad=False):
            return find_row(paired, regime=name, load=load, pad=pad, arm=arm, metric=metric)
        t, v, tau, tp = g("output_throughput_tok_s"), g("mean_verify_len"), g("tau"), g("tpot_mean_s")
        pc = find_row(padcost, regime=name, load=load, arm=arm)
        body.append([f"`{arm}`", fmt_ci(t["value"], t["value_lo"], t["value_hi"], 1, 0),
                     fmt_ci(tp["value"], tp["value_lo"], tp["value_hi"], 1e3, 1),
                     fmt_ci(v["value"], v["value_lo"], v["value_hi"], 1, 2),
                     fmt_ci(tau["value"], tau["value_lo"], tau["value_hi"], 1, 2),
                     _pct(pc) if pc else "n/a",
                     fmt_ci(pc["pad_share"], pc["pad_share_lo"], pc["pad_share_hi"], 100, 1, "%")
                     if pc else "n/a"])
    out.append(md_table(["arm", "throughput tok/s", "mean TPOT ms", "verify len", "tau",
                         "padding: throughput", "padding: padded share"], body) + "\n")
    return out


def _limits(settings: Settings) -> str:
    """The limits paragraph."""
    return ("**Limits.** One block size (K = 5) for every drafter; acceptance curves are the paper's Qwen3-4B "
            "calibration for each drafter, not DeepSeek's; the drafters' costs come from the profile's drafter "
            "entries (the built profile's analytic model), so the drafter contribution is as good as those. The "
            f"static threshold is one value ({THRESHOLD}), not tuned per load. Padding prices the padded batch; "
            "no policy here knows it pads (a padding-aware scheduler would choose differently), and the KV "
            "memory of the padded slots is not charged beyond the K draft slots every request already holds."
            + (" FAST mode: five arms, one load, short runs — shape, not answers." if settings.fast else ""))


def _text(settings: Settings, p: Plan, rows, paired, contrib, padcost, order) -> tuple[str, str]:
    regs = list(dict.fromkeys(r["regime"] for r in rows))
    out = _setup(settings, p, rows, regs)
    heads, answer = _answer(regs, rows, paired, contrib, padcost)
    out += answer
    out.append("")
    for name in regs:
        for load in _loads(rows, name):
            out += _contrib_table(p, name, load, contrib)
            out += _arm_table(name, load, rows, paired, padcost, order)
    out.append(_limits(settings))
    return "; ".join(heads), "\n".join(out)


__all__ = ["NAME", "TITLE", "QUESTION", "plan", "measure", "analyse"]
