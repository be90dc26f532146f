"""Study early-exit (issue 29, 2.5): difficulty-aware early exit of drafting, against its threshold.

The drafter stops a request's block at the first position whose running survival falls below T (``--draft-exit T``,
:mod:`dsparksim.sim.early_exit`): hard requests draft fewer positions, which saves drafting time and caps what can
be verified. Measured per drafter (autoregressive EAGLE-3-style, where every position is a forward, and DSpark's
parallel + Markov drafter, where only the Markov head's share can be saved), per policy (fixed length, which then
verifies fewer tokens, and confidence-async:2, which trims low-survival tails anyway) and load: the share of
drafting time saved, drafting's share of the step time, and the throughput and mean TPOT against the same
drafter and policy without early exit on the same seed (same requests, same draws).

To separate the two effects of a stop, every threshold also runs as ``cap``: the same stop rule applied to what is
verified only (:class:`ExitCap`: the policy sees the undrafted positions at confidence 0 and verifies at most the
drafted ones) while drafting is paid for all K positions. ``exit`` / ``cap`` is then what the saved drafting time
buys; ``cap`` / no early exit what the verification cap alone does.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from dsparksim.policies.base import Policy, StepContext
from dsparksim.sim.early_exit import drafted_lengths, mask_undrafted
from dsparksim.study.common import (PolicyWrapper, Regime, Section, Settings, find_row, fit_probe, fmt_ci, md_table,
                                    new_figure, paired_rows, regime_setup, run_config, save_figure)
from dsparksim.cost.profile import load_profile

NAME = "early-exit"
TITLE = "Difficulty-aware early exit of drafting"
QUESTION = ("When the drafter stops a request's block as soon as its running survival falls below a threshold T, "
            "how much drafting time does it save, and what does it do to throughput and TPOT, against T?")
OFF = -1.0     # the threshold column's value of the runs without early exit
MODES = ("exit", "cap")


class ExitCap(PolicyWrapper):
    """The early-exit stop rule applied to verification only: the inner policy sees the positions past each
    request's stop at confidence 0 and verifies at most the drafted positions; drafting stays paid in full (the
    engine runs without --draft-exit). Lossless for the same reason as the stop: it reads only the drafter's
    outputs up to each stop."""

    def __init__(self, inner: Policy, threshold: float) -> None:
        super().__init__(inner)
        self.threshold = float(threshold)
        self.spec = f"{inner.spec}+cap{threshold:g}"

    def choose(self, ctx: StepContext) -> np.ndarray:

        D = drafted_lengths(ctx.survival, self.threshold) if ctx.K > 1 else np.full(ctx.n, ctx.K, np.int64)
        conf, surv = mask_undrafted(ctx.conf, ctx.survival, D)
        L = self.inner.choose(dataclasses.replace(ctx, conf=conf, survival=surv, drafted=D))
        return np.minimum(np.asarray(L, np.int64), D)


@dataclass(frozen=True)
class Plan:
    drafters: tuple[str, ...]
    policies: tuple[str, ...]
    thresholds: tuple[float, ...]
    loads: dict[str, tuple[int, ...]]
    duration_s: float
    warmup_s: float
    contrast: bool


FULL = Plan(drafters=("eagle3", "dspark"), policies=("fixed:5", "confidence-async:2"),
            thresholds=(0.1, 0.2, 0.3, 0.5, 0.7), loads={"production": (64, 256, 512), "dense": (64,)},
            duration_s=30.0, warmup_s=10.0, contrast=True)
FAST = Plan(drafters=("eagle3", "dspark"), policies=("fixed:5", "confidence-async:2"), thresholds=(0.3,),
            loads={"production": (256,)}, duration_s=5.0, warmup_s=1.5, contrast=False)


@dataclass(frozen=True)
class Cell:
    regime: Regime
    load: int
    drafter: str
    policy: str
    threshold: float     # OFF = no early exit
    mode: str            # "off", "exit" (--draft-exit) or "cap" (the stop on verification only, ExitCap)
    seed: int
    plan: Plan


def plan(settings: Settings) -> list[Cell]:
    p = FAST if settings.fast else FULL
    regs = settings.regimes if p.contrast else settings.regimes[:1]
    variants = [(OFF, "off")] + [(t, m) for t in p.thresholds for m in MODES]
    return [Cell(r, load, d, pol, t, m, seed, p) for r in regs for load in p.loads.get(r.name, r.loads[:1])
            for d in p.drafters for pol in p.policies for seed in settings.seeds for t, m in variants]


def variant(threshold: float, mode: str) -> str:
    return "off" if mode == "off" else f"{mode}:{threshold:g}"


def measure(cell: Cell) -> dict[str, Any]:
    """Simulate one cell; throughput, TPOT, verify length and the drafting time it paid and saved."""
    from dsparksim.sim.simulate import simulate  # lazy: pulls in scipy

    opts = {"concurrency": cell.load, "duration_s": cell.plan.duration_s, "warmup_s": cell.plan.warmup_s,
            "acceptance": cell.drafter}
    if cell.mode == "exit":
        opts["draft_exit"] = cell.threshold
    wrap = (lambda pol: ExitCap(pol, cell.threshold)) if cell.mode == "cap" else None
    cfg = run_config(cell.regime, cell.policy, cell.seed, opts)
    out = simulate(cfg, wrap_policy=wrap)
    s, st = out.summary, out.result.steps
    row = {"regime": cell.regime.name, "profile": cell.regime.profile, "load": cell.load, "drafter": cell.drafter,
           "policy": cell.policy, "threshold": cell.threshold, "mode": cell.mode,
           "variant": variant(cell.threshold, cell.mode), "seed": cell.seed}
    for k in ("output_throughput_tok_s", "tps_user_mean", "tpot_mean_s", "mean_verify_len", "tau",
              "num_requests_completed"):
        row[k] = s[k]
    n = np.asarray(st["n_decode"], np.int64)
    dt = np.asarray(st["dt"], float)
    if "draft_s" in st:
        paid, full = float(np.sum(st["draft_s"])), float(np.sum(st["draft_full_s"]))
        drafted = float(np.sum(st["drafted"]))
    else:   # without early exit every decoding step drafts all K positions of every decoding request

        prof = load_profile(cell.regime.profile)
        dec = n > 0
        full = paid = float(np.sum(prof.draft_time(s["drafter"], n[dec], s["block_size"]))) if dec.any() else 0.0
        drafted = float(n.sum() * s["block_size"])
    row["draft_s"], row["draft_full_s"] = paid, full
    row["draft_saved_share"] = 1.0 - paid / full if full > 0 else math.nan
    row["draft_share_of_time"] = paid / float(dt.sum()) if dt.sum() > 0 else math.nan
    row["drafted_per_request"] = drafted / float(n.sum()) if n.sum() else math.nan
    return row | fit_probe(cfg, s)


_KEYS = ("regime", "load", "drafter", "policy", "variant")
METRICS = (("output_throughput_tok_s", True), ("tpot_mean_s", True), ("tps_user_mean", True),
           ("draft_saved_share", False), ("draft_share_of_time", False), ("drafted_per_request", False),
           ("mean_verify_len", False), ("tau", False))


def analyse(settings: Settings, rows: list[dict[str, Any]]) -> Section:
    p = FAST if settings.fast else FULL
    rows = sorted(rows, key=lambda r: (r["regime"], r["load"], p.drafters.index(r["drafter"]),
                                       p.policies.index(r["policy"]), r["threshold"], r["mode"], r["seed"]))
    paired = []
    for m, rel in METRICS:
        paired += paired_rows(rows, _KEYS, m, {"variant": "off"}, rel, vary="variant")
    for r in paired:
        r["threshold"], r["mode"] = _split(r["variant"])
    # what the saved drafting buys: exit against cap at the same threshold (same stop rule, drafting paid in full)
    both = [r | {"variant": f"{r['threshold']:g}", "arm": r["mode"]} for r in rows if r["mode"] in MODES]
    vs_cap = []
    for m, rel in (("output_throughput_tok_s", True), ("tpot_mean_s", True)):
        vs_cap += [x | {"threshold": float(x["variant"]), "mode": "exit-vs-cap"}
                   for x in paired_rows(both, _KEYS + ("arm",), m, {"arm": "cap"}, rel, vary="arm")
                   if x["arm"] == "exit"]
    heads, md = _text(settings, p, rows, paired, vs_cap)
    md += f"\n\n![throughput change and drafting time saved against the threshold]({NAME}/early_exit.png)\n"
    return Section(markdown=md, tables={"runs": rows, "paired_vs_no_exit": paired, "exit_vs_cap": vs_cap},
                   headline=heads,
                   figures={"early_exit.png": lambda path: _figure(path, paired, p)})


def _split(v: str) -> tuple[float, str]:
    if v == "off":
        return OFF, "off"
    mode, t = v.split(":")
    return float(t), mode


def _series(paired, mode="exit", **kw):
    return sorted((r for r in paired if all(r[k] == v for k, v in kw.items()) and r["mode"] == mode),
                  key=lambda r: r["threshold"])


def _figure(path, paired, p: Plan) -> None:
    """Per regime and load: throughput change (top) and drafting time saved (bottom) against T, per drafter and
    policy, 95% intervals."""
    panels = list(dict.fromkeys((r["regime"], r["load"]) for r in paired))
    fig = new_figure((4.4 * len(panels), 6.4))
    axes = fig.subplots(2, len(panels), squeeze=False)
    for j, (reg, load) in enumerate(panels):
        for d in p.drafters:
            for pol in p.policies:
                t = _series(paired, regime=reg, load=load, drafter=d, policy=pol, metric="output_throughput_tok_s")
                s = _series(paired, regime=reg, load=load, drafter=d, policy=pol, metric="draft_saved_share")
                if not t:
                    continue
                x = [r["threshold"] for r in t]
                e = np.nan_to_num([[100 * (r["diff"] - r["diff_lo"]) for r in t],
                                   [100 * (r["diff_hi"] - r["diff"]) for r in t]])
                axes[0][j].errorbar(x, [100 * r["diff"] for r in t], yerr=e, marker="o", capsize=3,
                                    label=f"{d}, {pol}")
                e = np.nan_to_num([[100 * (r["value"] - r["value_lo"]) for r in s],
                                   [100 * (r["value_hi"] - r["value"]) for r in s]])
                axes[1][j].errorbar(x, [100 * r["value"] for r in s], yerr=e, marker="o", capsize=3,
                                    label=f"{d}, {pol}")
        axes[0][j].axhline(0.0, color="grey", lw=0.8)
        axes[0][j].set(xlabel="early-exit threshold T", ylabel="throughput vs no early exit (%)",
                       title=f"{reg}, {load} users")
        axes[1][j].set(xlabel="early-exit threshold T", ylabel="drafting time saved (%)")
        axes[0][j].legend(fontsize=6)
    save_figure(fig, path)


def _pct(r, key="diff") -> str:
    if r is None:
        return "n/a"
    return fmt_ci(r[key], r[f"{key}_lo"], r[f"{key}_hi"], 100, 1, "%", key == "diff")


def _setup(settings: Settings, p: Plan, rows, regs: list[str]) -> list[str]:
    """The question and the setup paragraph."""
    out = regime_setup(QUESTION, settings.regimes, rows, regs)
    out.append(f"- Drafters {', '.join(f'`{d}`' for d in p.drafters)} (acceptance and drafting cost of each; "
               "`eagle3` is autoregressive: position j is one forward over the requests still drafting it; `dspark` "
               "is parallel + Markov head: its backbone forward over all K positions is paid whole, only the Markov "
               f"head's share follows the positions drafted); policies {', '.join(f'`{x}`' for x in p.policies)}; "
               f"K = 5; thresholds T in {{{', '.join(f'{t:g}' for t in p.thresholds)}}} against no early exit. "
               "The positions a request did not draft are no candidates of any policy (in `exit` and `cap` alike); "
               "figures written before 2026-12-05 counted them as survival-0 candidates, which let "
               "`confidence-async:2`'s global search choose a larger batch, for a cheaper stair of the price, than the "
               "engine then ran.")
    out.append(f"- {p.duration_s:g} s runs with {p.warmup_s:g} s warm-up; seeds {', '.join(map(str, settings.seeds))}"
               "; changes paired per seed against the same drafter and policy without early exit; 95% t-intervals "
               "over seeds. Drafting time saved = 1 - drafting paid / drafting of all K positions, over the run's "
               "steps.\n")
    return out


def _loads(rows, name: str) -> list:
    """The regime's loads, ascending."""
    return sorted(dict.fromkeys(r["load"] for r in rows if r["regime"] == name))


def _answer_item(p: Plan, name: str, load, d: str, pol: str, paired, vs_cap) -> tuple[str, str | None] | None:
    """One drafter and policy's answer text and, for the production policy, its headline; None when not run."""
    t = _series(paired, regime=name, load=load, drafter=d, policy=pol,
                metric="output_throughput_tok_s")
    if not t:
        return None
    best = max(t, key=lambda r: r["diff"] if math.isfinite(r["diff"]) else -math.inf)
    at = {"regime": name, "load": load, "drafter": d, "policy": pol, "threshold": best["threshold"]}
    sv = find_row(paired, **at, mode="exit", metric="draft_saved_share")
    cap = find_row(paired, **at, mode="cap", metric="output_throughput_tok_s")
    vc = find_row(vs_cap, **at, metric="output_throughput_tok_s")
    sh = find_row(paired, regime=name, load=load, drafter=d, policy=pol, threshold=OFF,
                 metric="draft_share_of_time")
    sig = best["diff_lo"] > 0
    loss = [r for r in t if r["diff_hi"] < -0.01]
    txt = (f"`{d}` + `{pol}` (drafting {_pct(sh, 'value')} of step time): best T = "
           f"{best['threshold']:g}, throughput {_pct(best)}"
           f"{'' if sig else ' (no significant gain)'}, drafting time saved {_pct(sv, 'value')}; "
           f"of the change, the saved drafting buys {_pct(vc)} (against the same stop on "
           f"verification only) and the verification cap alone {_pct(cap)}")
    if loss:
        txt += f"; costs more than 1% from T = {loss[0]['threshold']:g}"
    short = None
    if pol == p.policies[-1]:   # the headline: the production policy, per drafter
        short = (f"`{d}` best T = {best['threshold']:g}: drafting saved {_pct(sv, 'value')}, "
                 f"throughput {_pct(best)} (the saved drafting alone {_pct(vc)})")
    return txt, short


def _answer(p: Plan, regs: list[str], rows, paired, vs_cap) -> tuple[list[str], list[str]]:
    """The answer paragraph: (headlines, lines)."""
    heads, out = [], ["**Answer.**"]
    for name in regs:
        for load in _loads(rows, name):
            parts, short = [], []
            for d in p.drafters:
                for pol in p.policies:
                    item = _answer_item(p, name, load, d, pol, paired, vs_cap)
                    if item is None:
                        continue
                    parts.append(item[0])
                    if item[1] is not None:
                        short.append(item[1])
            if parts:
                heads.append(f"`{name}` at {load} users under `{p.policies[-1]}`: " + "; ".join(short))
                out.append(f"- `{name}` at {load} users:")
                out += [f"  - {x}." for x in parts]
    return heads, out


def _table(p: Plan, name: str, load, paired, vs_cap) -> list[str]:
    """Per drafter, policy and threshold: the changes against no early exit."""
    out = [f"*`{name}`, {load} users: per drafter and policy against T — throughput change with early "
           "exit; the same stop on verification only (`cap`, drafting paid in full); exit against cap; "
           "mean TPOT change; drafting time saved; positions drafted per request-step; mean verify "
           "length (mean [95% CI]; changes paired against no early exit).*\n"]
    body = []
    for d in p.drafters:
        for pol in p.policies:
            for th in (OFF,) + p.thresholds:
                mode = "off" if th == OFF else "exit"

                def g(metric, mode=mode, th=th):
                    return find_row(paired, regime=name, load=load, drafter=d, policy=pol, threshold=th,
                                   mode=mode, metric=metric)
                t, tp, sv, dp, vl = (g("output_throughput_tok_s"), g("tpot_mean_s"),
                                     g("draft_saved_share"), g("drafted_per_request"), g("mean_verify_len"))
                if t is None:
                    continue
                cap = g("output_throughput_tok_s", "cap")
                vc = find_row(vs_cap, regime=name, load=load, drafter=d, policy=pol, threshold=th,
                             metric="output_throughput_tok_s")
                body.append([f"`{d}`", f"`{pol}`", "off" if th == OFF else f"{th:g}",
                             fmt_ci(t["value"], t["value_lo"], t["value_hi"], 1, 0) if th == OFF
                             else _pct(t), "" if th == OFF else _pct(cap), "" if th == OFF else _pct(vc),
                             "" if th == OFF else _pct(tp), _pct(sv, "value"),
                             fmt_ci(dp["value"], dp["value_lo"], dp["value_hi"], 1, 2),
                             fmt_ci(vl["value"], vl["value_lo"], vl["value_hi"], 1, 2)])
    out.append(md_table(["drafter", "policy", "T", "throughput (tok/s when off)", "cap only",
                         "exit vs cap", "mean TPOT", "drafting saved", "drafted / req-step", "verify len"],
                        body) + "\n")
    return out


_LIMITS = (
    "**Limits.** The stop rule reads the confidence head's survival, whose calibration is the simulator's "
    "(STS on the parametric model); a drafter without a confidence head cannot stop this way. Drafting "
    "costs are the profile's drafter entries: how much a stop saves depends on them (for `dspark` at most "
    "its Markov head's 0.8%). KV slots for all K draft positions stay reserved; the stop saves compute, "
    "not memory. The real runner does not implement `--draft-exit` (refused there).")


def _text(settings: Settings, p: Plan, rows, paired, vs_cap) -> tuple[str, str]:
    regs = list(dict.fromkeys(r["regime"] for r in rows))
    out = _setup(settings, p, rows, regs)
    heads, answer = _answer(p, regs, rows, paired, vs_cap)
    out += answer
    out.append("")
    for name in regs:
        for load in _loads(rows, name):
            out += _table(p, name, load, paired, vs_cap)
    out.append(_LIMITS + (" FAST mode: one threshold, one load, short runs — shape, not answers." if settings.fast
                          else ""))
    return "; ".join(heads), "\n".join(out)


__all__ = ["NAME", "TITLE", "QUESTION", "plan", "measure", "analyse"]
