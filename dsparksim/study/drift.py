"""Study calibration-drift (issue 29, 2.2): STS fitted on one traffic mix, served on another.

The confidence head learned, and its sequential temperature scaling (STS) was fitted, on a chat-heavy mix A. The
served mix moves to code-heavy B, abruptly or gradually. A head that is blind to part of a domain's level
(dsparksim.acceptance.headshift, ``head_blind``) is then miscalibrated on code and math; the parametric head of the
simulator (blind = 0) sees every domain's level and is the control. Three arms serve the same requests with the
same acceptance draws (paired):

* ``stale``:   STS fitted on A throughout (what a deployment that never refits serves);
* ``correct``: STS fitted on the mix being served (per request: the mix at its arrival) -- the reference;
* ``recal``:   ``--recalibrate``, STS refitted online from past verification outcomes only.

Measured: ECE (survival, 15 bins, of the confidences the policy used) over time, and throughput and mean TPOT
after the change against ``correct``; the gain of ``recal`` over ``stale``.
"""
from __future__ import annotations

import dataclasses
from dataclasses import replace
import json
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from dsparksim.policies.base import Policy, StepContext
from dsparksim.study.common import (PolicyWrapper, Regime, Section, Settings, find_row, fit_probe, fmt_ci, interval,
                                    md_table, new_figure, paired_rows, run_config, save_figure, window_throughput)
from dsparksim.policies.recalibrate import Recalibrating

NAME = "calibration-drift"
TITLE = "Calibration drift: STS fitted on one mix, served on another"
QUESTION = ("When the traffic mix drifts from the chat-heavy mix the confidence head was calibrated on to a "
            "code-heavy one, how far does calibration (ECE) degrade, what does it cost in throughput and mean TPOT "
            "against a correctly calibrated run, and how much does online recalibration from past verification "
            "outcomes (`--recalibrate`) win back?")
POLICY = "confidence-async:2"
MIX_A = (1.0, 1.0, 6.0)      # math:code:chat -- the production regime's chat-heavy mix
MIX_B = (1.0, 6.0, 1.0)      # code-heavy
ARMS = ("stale", "correct", "recal")
ECE_BINS = 15
BIN_S = 2.5                  # ECE / throughput time bins


@dataclass(frozen=True)
class Scenario:
    """The served mix by request index: A before request i0, B from i1, linear in between (i0 == i1: abrupt);
    closed loop at the regime's middle load for ``end`` seconds (warm-up ``warmup_s``)."""

    name: str
    i0: int
    i1: int
    end: float
    warmup_s: float

    def frac(self, i: np.ndarray) -> np.ndarray:
        """Share of the way from A to B of requests i."""
        i = np.asarray(i, float)
        if self.i1 <= self.i0:
            return (i >= self.i0).astype(float)
        return np.clip((i - self.i0) / (self.i1 - self.i0), 0.0, 1.0)


@dataclass(frozen=True)
class Plan:
    scenarios: tuple[Scenario, ...]
    blinds: tuple[float, ...]
    contrast: tuple[Scenario, ...] = ()     # the contrast regime's scenarios (its own request rate)


# production at 256 users issues ~75 requests/s after its first 256 at t = 0: request 1500 comes at ~18 s; the dense
# contrast at 64 users ~18 requests/s: request 400 at ~20 s
FULL = Plan(scenarios=(Scenario("abrupt", 1500, 1500, 45.0, 5.0), Scenario("gradual", 900, 2700, 50.0, 5.0)),
            blinds=(0.0, 0.5, 1.0), contrast=(Scenario("abrupt", 400, 400, 45.0, 5.0),))
FAST = Plan(scenarios=(Scenario("abrupt", 650, 650, 14.0, 2.0),), blinds=(1.0,))


@dataclass(frozen=True)
class Cell:
    regime: Regime
    scenario: Scenario
    blind: float
    arm: str
    seed: int
    plan: Plan


def users_of(regime: Regime) -> int:
    """The closed-loop load: the regime's middle tail-study load (production 256), else its low spike load x 4."""
    return regime.loads[len(regime.loads) // 2] if len(regime.loads) > 1 else 4 * regime.users[0]


def plan(settings: Settings) -> list[Cell]:
    p = FAST if settings.fast else FULL
    regimes = settings.regimes[:1] if settings.fast else settings.regimes
    cells = []
    for i, r in enumerate(regimes):
        scen = p.scenarios if i == 0 else p.contrast                # the contrast regime: the abrupt change only
        blinds = p.blinds if i == 0 else p.blinds[-1:]
        cells += [Cell(r, s, b, arm, seed, p) for s in scen for b in blinds for seed in settings.seeds
                  for arm in ARMS]
    return cells


# ------------------------------------------------------------------------------------------------ workload
def mix_at(frac: float) -> tuple[float, float, float]:
    a, b = np.array(MIX_A) / sum(MIX_A), np.array(MIX_B) / sum(MIX_B)
    return tuple(float(x) for x in (1 - frac) * a + frac * b)


def _mix_text(w) -> str:
    return ":".join(f"{x:.6g}" for x in w)


def _domain_spec(w) -> str:
    return "mix:" + ",".join(f"{d}={x:g}" for d, x in zip(("math", "code", "chat"), w))


def acceptance_spec(blind: float, sts_frac: float = 0.0) -> str:
    """The dspark head: blind to ``blind`` of the domain level relative to mix A; STS fitted at A->B share."""
    return f"dspark?head_blind={blind:g}&head_mix={_mix_text(MIX_A)}&sts_mix={_mix_text(mix_at(sts_frac))}"


@lru_cache(maxsize=64)
def sts_temperatures(blind: float, frac: float, K: int) -> tuple[float, ...]:
    from dsparksim.acceptance import load_acceptance  # lazy: pulls in scipy

    return tuple(float(x) for x in load_acceptance(acceptance_spec(blind, frac), K).sts_temperatures)


# ------------------------------------------------------------------------------------------------ wrappers
class CalibrationRecorder(PolicyWrapper):
    """Per decoding step: 15-bin histograms of the survivals the policy sees against the realised survival (for
    ECE over time), read from the ground truth the engine hands an oracle (used for measurement only, stripped
    before the inner policy sees the context)."""

    def __init__(self, inner: Policy) -> None:
        super().__init__(inner)
        self.needs_oracle = True
        self.count: list[np.ndarray] = []
        self.pred: list[np.ndarray] = []
        self.real: list[np.ndarray] = []

    def choose(self, ctx: StepContext) -> np.ndarray:

        if ctx.n:
            s = ctx.survival.ravel()
            A = np.asarray(ctx.true_accepted)
            y = (A[:, None] >= np.arange(1, ctx.K + 1)[None, :]).ravel().astype(float)
            b = np.minimum((s * ECE_BINS).astype(np.int64), ECE_BINS - 1)
            self.count.append(np.bincount(b, minlength=ECE_BINS))
            self.pred.append(np.bincount(b, weights=s, minlength=ECE_BINS))
            self.real.append(np.bincount(b, weights=y, minlength=ECE_BINS))
        return self.inner.choose(replace(ctx, true_accepted=None) if self.inner.needs_oracle is False else ctx)


class FixedRescale(PolicyWrapper):
    """The reference calibration: request i's logits times factor[i, k] = T_stale,k / T_{mix at i's arrival},k,
    i.e. STS fitted on the mix being served."""

    def __init__(self, inner: Policy, factor: np.ndarray) -> None:
        super().__init__(inner)
        self.factor = factor

    def choose(self, ctx: StepContext) -> np.ndarray:

        if not ctx.n:
            return self.inner.choose(ctx)
        c = np.clip(ctx.conf, 1e-12, 1 - 1e-12)
        z = (np.log(c) - np.log1p(-c)) * self.factor[np.asarray(ctx.request_ids)][:, :ctx.K]
        conf = 1.0 / (1.0 + np.exp(-z))
        return self.inner.choose(replace(ctx, conf=conf, survival=np.cumprod(conf, axis=1)))


def ece_of(count: np.ndarray, pred: np.ndarray, real: np.ndarray) -> float:
    n = count.sum()
    return float(np.abs(pred - real).sum() / n) if n else math.nan


# ------------------------------------------------------------------------------------------------ one cell
def measure(cell: Cell) -> dict[str, Any]:
    """Simulate one cell; ECE and throughput per time bin, and the window metrics (runs in a worker process)."""

    from dsparksim.sim.simulate import simulate  # lazy: pulls in scipy

    sc, K = cell.scenario, 5
    users = users_of(cell.regime)
    traffic = {"concurrency": users, "duration_s": sc.end, "warmup_s": sc.warmup_s, "domain": _domain_spec(MIX_A),
               "acceptance": acceptance_spec(cell.blind, 0.0)}
    cfg = run_config(cell.regime, POLICY, cell.seed, traffic)
    cfg = cfg.replace(traffic=dataclasses.replace(cfg.traffic, domain_drift=(_domain_spec(MIX_B), sc.i0, sc.i1)))
    holder: dict[str, Any] = {}

    def wrap(p):
        rec = holder["rec"] = CalibrationRecorder(p)
        if cell.arm == "recal":
            holder["recal"] = Recalibrating(rec)
            return holder["recal"]
        if cell.arm == "correct":
            t_a = np.array(sts_temperatures(cell.blind, 0.0, K))
            grid = np.round(np.linspace(0, 1, 11), 1)
            tg = np.array([sts_temperatures(cell.blind, float(f), K) for f in grid])
            n_max = 200_000                                   # request indices far beyond any run here
            idx = np.rint(sc.frac(np.arange(n_max)) * 10).astype(int)     # the request's mix, to the nearest 10%
            return FixedRescale(rec, t_a[None, :] / tg[idx])
        return rec

    out = simulate(cfg, wrap_policy=wrap)
    st = out.result.steps
    rec = holder["rec"]
    dec = np.asarray(st["n_decode"]) > 0
    n = int(dec.sum())
    if len(rec.count) not in (n, n + 1):
        raise RuntimeError(f"recorder holds {len(rec.count)} steps for {n} decoding steps")
    t_end = (np.asarray(st["t_start"]) + np.asarray(st["dt"]))[dec]
    cnt, pred, real = (np.array(x[:n]) for x in (rec.count, rec.pred, rec.real))
    req = out.requests()
    idx = np.arange(len(req))
    arr = req["arrival_s"].to_numpy()
    if len(req) <= sc.i1:
        raise RuntimeError(f"only {len(req)} requests issued; the drift ends at request {sc.i1}: lengthen the run")
    t0, t1 = float(arr[sc.i0]), float(arr[sc.i1])           # when the change started / ended (issue times)
    dom = np.asarray(out.result.domain, dtype=object) if hasattr(out.result, "domain") else None
    row: dict[str, Any] = {"regime": cell.regime.name, "profile": cell.regime.profile, "scenario": sc.name,
                           "blind": cell.blind, "arm": cell.arm, "seed": cell.seed, "policy": POLICY,
                           "users": users, "requests": int(len(req)), "t_change_start_s": t0, "t_change_end_s": t1}
    if dom is not None and len(dom) == len(req):
        row["code_share_before"] = float(np.mean(dom[:sc.i0] == "code"))
        row["code_share_after"] = float(np.mean(dom[sc.i1:] == "code"))
    windows = {"before": (sc.warmup_s, t0), "after": (t1, sc.end)}
    if sc.i1 > sc.i0:
        windows["during"] = (t0, t1)
    done = req["completed"].to_numpy()
    tpot = req["tpot_s"].to_numpy()
    for wn, (a, b) in windows.items():
        if not b > a + BIN_S:
            raise RuntimeError(f"window {wn!r} [{a:.2f}, {b:.2f}) s is too short: move the change (requests "
                               f"{sc.i0}..{sc.i1}) or the run's end")
        sel = (t_end > a) & (t_end <= b)
        row[f"ece_{wn}"] = ece_of(cnt[sel].sum(0), pred[sel].sum(0), real[sel].sum(0))
        row[f"throughput_{wn}_tok_s"] = window_throughput(st, a, b)
        ir = {"before": (idx >= 0) & (idx < sc.i0), "during": (idx >= sc.i0) & (idx < sc.i1),
              "after": idx >= sc.i1}[wn] & done & (arr >= sc.warmup_s)
        row[f"tpot_mean_{wn}_s"] = float(np.nanmean(tpot[ir])) if ir.any() else math.nan
        row[f"verify_len_{wn}"] = _verify_len(st, a, b)
    edges = np.arange(0.0, sc.end + 1e-9, BIN_S)
    series_e, series_t = [], []
    for a in edges[:-1]:
        sel = (t_end > a) & (t_end <= a + BIN_S)
        series_e.append(round(ece_of(cnt[sel].sum(0), pred[sel].sum(0), real[sel].sum(0)), 5))
        series_t.append(round(window_throughput(st, a, a + BIN_S), 1))
    row["ece_series"], row["throughput_series"] = json.dumps(series_e), json.dumps(series_t)
    if "recal" in holder:
        h = holder["recal"].history
        row["recal_refits"] = len(h)
        row["recal_final_temps"] = json.dumps([round(float(x), 4) for x in (h[-1] if h else np.ones(K))])
    return row | fit_probe(cfg, out.summary)


def _verify_len(st, a: float, b: float) -> float:
    t0 = np.asarray(st["t_start"])
    sel = (t0 >= a) & (t0 < b) & (np.asarray(st["n_decode"]) > 0)
    nd = np.asarray(st["n_decode"])[sel].sum()
    return float(np.asarray(st["verify_tokens"])[sel].sum() / nd) if nd else math.nan


# ------------------------------------------------------------------------------------------------ analysis
_KEYS = ("regime", "scenario", "blind", "arm")
METRICS = ("throughput_after_tok_s", "tpot_mean_after_s", "throughput_during_tok_s", "tpot_mean_during_s",
           "throughput_before_tok_s", "tpot_mean_before_s")


def analyse(settings: Settings, rows: list[dict[str, Any]]) -> Section:
    p = FAST if settings.fast else FULL
    order = {a: i for i, a in enumerate(ARMS)}
    reg_order = {r.name: i for i, r in enumerate(settings.regimes)}
    rows = sorted(rows, key=lambda r: (reg_order.get(r["regime"], 99), r["scenario"], r["blind"], order[r["arm"]],
                                       r["seed"]))
    paired = []
    for m in METRICS:
        if any(m in r and r[m] is not None and not (isinstance(r[m], float) and math.isnan(r[m])) for r in rows):
            paired += paired_rows([r for r in rows if m in r], _KEYS, m, {"arm": "correct"}, True, vary="arm")
            paired += [x | {"base_arm": "stale"} for x in
                       paired_rows([r for r in rows if m in r and r["arm"] in ("stale", "recal")], _KEYS, m,
                                   {"arm": "stale"}, True, vary="arm") if x["arm"] == "recal"]
    for x in paired:
        x.setdefault("base_arm", "correct")
    ece = []
    for key in ("ece_before", "ece_during", "ece_after"):
        groups: dict[tuple, list[float]] = {}
        for r in rows:
            if key in r and isinstance(r[key], float) and math.isfinite(r[key]):
                groups.setdefault(tuple(r[k] for k in _KEYS), []).append(r[key])
        for g, vals in groups.items():
            m, lo, hi = interval(vals)
            ece.append(dict(zip(_KEYS, g)) | {"window": key[4:], "mean": m, "lo": lo, "hi": hi, "n_seeds": len(vals)})
    series = []
    for r in rows:
        for i, (e, thr) in enumerate(zip(json.loads(r["ece_series"]), json.loads(r["throughput_series"]))):
            series.append({k: r[k] for k in _KEYS} | {"seed": r["seed"], "t_start_s": i * BIN_S, "ece": e,
                                                       "throughput_tok_s": thr})
    runs = [{k: v for k, v in r.items() if k not in ("ece_series", "throughput_series")} for r in rows]
    heads, md = _text(settings, p, rows, paired, ece)
    md += f"\n\n![ECE and throughput over time per arm]({NAME}/drift.png)\n"
    return Section(markdown=md, tables={"runs": runs, "paired": paired, "ece": ece, "series": series},
                   headline=heads, figures={"drift.png": lambda path: _figure(path, series)})


def _figure(path, series) -> None:
    """Per (regime, scenario) at the largest blindness: ECE over time (top) and throughput (bottom) per arm, mean
    over seeds."""
    panels = sorted({(r["regime"], r["scenario"]) for r in series})
    fig = new_figure((5.0 * len(panels), 6.4))
    axes = fig.subplots(2, len(panels), squeeze=False)
    for j, (reg, sc) in enumerate(panels):
        blind = max(r["blind"] for r in series if r["regime"] == reg and r["scenario"] == sc)
        for arm in ARMS:
            pts = [r for r in series if r["regime"] == reg and r["scenario"] == sc and r["blind"] == blind
                   and r["arm"] == arm]
            ts = sorted({r["t_start_s"] for r in pts})
            e = [np.nanmean([r["ece"] for r in pts if r["t_start_s"] == t]) for t in ts]
            thr = [np.nanmean([r["throughput_tok_s"] for r in pts if r["t_start_s"] == t]) for t in ts]
            x = np.array(ts) + BIN_S / 2
            axes[0, j].plot(x, 100 * np.array(e), marker=".", label=arm)
            axes[1, j].plot(x, thr, marker=".", label=arm)
        axes[0, j].set(ylabel="ECE (%)", title=f"{reg}, {sc}, head_blind={blind:g}")
        axes[1, j].set(xlabel="time (s)", ylabel="output tok/s")
        axes[0, j].legend(fontsize=7)
    save_figure(fig, path)


def _pct(r, signed=True) -> str:
    return fmt_ci(r["diff"], r["diff_lo"], r["diff_hi"], 100, 2, "%", signed) if r else "n/a"


def _setup(settings: Settings, p: Plan, rows, regimes: list[str]) -> list[str]:
    """The question and the setup paragraph."""
    reg_of = {r.name: r for r in settings.regimes}
    out = [f"**Question.** {QUESTION}\n", "**Setup.**"]
    for name in regimes:
        rg = reg_of[name]
        rr = [r for r in rows if r["regime"] == name]
        t0 = interval(r["t_change_start_s"] for r in rr if r["scenario"] == p.scenarios[0].name)
        out.append(f"- Regime `{name}`: profile `{rg.profile}`; {rg.why}. Closed loop at {rr[0]['users']} users, "
                   "lengths resampled from the shipped Azure conversation sample; the first change "
                   f"({p.scenarios[0].name}) came at {fmt_ci(*t0, digits=1, unit=' s')} (issue time of its first "
                   "request, over runs).")
    for s in p.scenarios + tuple(x for x in p.contrast if len(regimes) > 1):
        who = "" if s in p.scenarios else f" ({regimes[-1]}: its own request rate)"
        mix_a = ':'.join(f'{x:g}' for x in MIX_A)
        out.append(f"- Scenario `{s.name}`{who}: the mix (math:code:chat) is A = {mix_a} for "
                   f"requests before #{s.i0}, B = {':'.join(f'{x:g}' for x in MIX_B)} from #{s.i1}"
                   + (", linear in the request index in between" if s.i1 > s.i0 else " (abrupt)")
                   + f"; run {s.end:g} s, warm-up {s.warmup_s:g} s (TrafficConfig.domain_drift: each request's "
                   "domain drawn from its own mix).")
    out.append(f"- Head: `dspark` (K = 5) whose raw logit carries a per-domain bias -blind x (logit alpha_d,k - "
               "logit alpha_A,k) (dsparksim/acceptance/headshift.py): blind = 0 is the simulator's own head (it sees "
               "each domain's level; the control), 1 = it predicts every domain at mix A's per-position level. "
               f"blind in {{{', '.join(f'{b:g}' for b in p.blinds)}}}; its size for a real head is not published.")
    out.append(f"- Policy `{POLICY}`. Arms (paired: same requests, same draws): `stale` = STS fitted on A "
               "throughout; `correct` = STS fitted on the mix served (per request, the mix at its arrival, to the "
               "nearest 10%, the temperatures of STS refitted on that mix); `recal` = `--recalibrate` (per-position "
               "temperatures refitted every 25 steps on the last 20,000 verified positions, from past outcomes "
               f"only). Seeds {', '.join(map(str, settings.seeds))}; 95% t-intervals over seeds of the per-seed differences.\n")
    return out


def _answer_item(paired, ece, name: str, s, b) -> str | None:
    """One answer line's text for (regime, scenario, blindness); None when the cell was not run."""
    st = find_row(paired, regime=name, scenario=s.name, blind=b, arm="stale",
                 metric="throughput_after_tok_s", base_arm="correct")
    if st is None:
        return None
    tp = find_row(paired, regime=name, scenario=s.name, blind=b, arm="stale", metric="tpot_mean_after_s",
                 base_arm="correct")
    rt = find_row(paired, regime=name, scenario=s.name, blind=b, arm="recal",
                 metric="throughput_after_tok_s", base_arm="correct")
    rtp = find_row(paired, regime=name, scenario=s.name, blind=b, arm="recal", metric="tpot_mean_after_s",
                  base_arm="correct")
    gain = find_row(paired, regime=name, scenario=s.name, blind=b, arm="recal",
                   metric="throughput_after_tok_s", base_arm="stale")
    e = {arm: find_row(ece, regime=name, scenario=s.name, blind=b, arm=arm, window="after") for arm in ARMS}
    eb = find_row(ece, regime=name, scenario=s.name, blind=b, arm="stale", window="before")
    fe = {a: fmt_ci(x["mean"], x["lo"], x["hi"], 100, 2, "%") if x else "n/a" for a, x in e.items()}
    return (f"`{name}`, {s.name}, blind {b:g}: ECE after the change {fe['stale']} stale "
            f"(before: {fmt_ci(eb['mean'], eb['lo'], eb['hi'], 100, 2, '%') if eb else 'n/a'}), "
            f"{fe['correct']} correct, {fe['recal']} recalibrated; stale vs correct: throughput "
            f"{_pct(st)}, mean TPOT {_pct(tp)}; recalibrated vs correct: throughput {_pct(rt)}, mean "
            f"TPOT {_pct(rtp)}; recalibration gain over stale: throughput {_pct(gain)}")


def _answer(p: Plan, regimes: list[str], paired, ece) -> tuple[list[str], list[str]]:
    """The answer paragraph: (headlines, lines)."""
    heads, out = [], ["**Answer.**"]
    for name in regimes:
        for s in p.scenarios:
            for b in p.blinds:
                text = _answer_item(paired, ece, name, s, b)
                if text is None:
                    continue
                out.append(f"- {text}.")
                if b == max(p.blinds) or (b == 0.0 and s.name == "abrupt"):
                    heads.append(text)
    return heads, out


def _after_table(p: Plan, name: str, paired, ece) -> list[str]:
    """Paired changes after the mix change, per scenario, blindness and arm."""
    out = [f"*`{name}`: paired changes after the mix change (window from t1 to the end), in % "
           "(throughput: negative = lost; TPOT: positive = slower); mean [95% CI].*\n"]
    hdr = ["scenario", "blind", "arm", "vs", "throughput", "mean TPOT", "ECE after (abs. %)"]
    body = []
    for s in p.scenarios:
        for b in p.blinds:
            for arm, base in (("stale", "correct"), ("recal", "correct"), ("recal", "stale")):
                t = find_row(paired, regime=name, scenario=s.name, blind=b, arm=arm,
                            metric="throughput_after_tok_s", base_arm=base)
                if t is None:
                    continue
                q = find_row(paired, regime=name, scenario=s.name, blind=b, arm=arm, metric="tpot_mean_after_s",
                            base_arm=base)
                e = find_row(ece, regime=name, scenario=s.name, blind=b, arm=arm, window="after")
                body.append([s.name, f"{b:g}", f"`{arm}`", f"`{base}`", _pct(t), _pct(q),
                             fmt_ci(e["mean"], e["lo"], e["hi"], 100, 2) if e else "n/a"])
    out.append(md_table(hdr, body) + "\n")
    return out


def _during_table(p: Plan, name: str, rows, paired, ece) -> list[str]:
    """Paired changes during a gradual drift (empty when no gradual scenario ran in this regime)."""
    grad = [s for s in p.scenarios if s.i1 > s.i0]
    if not (grad and any(r["regime"] == name and r["scenario"] == grad[0].name for r in rows)):
        return []
    s = grad[0]
    out = [f"*`{name}`, {s.name}: during the drift (requests #{s.i0}-#{s.i1}), paired against `correct`, "
           "in %.*\n"]
    body = []
    for b in p.blinds:
        for arm in ("stale", "recal"):
            t = find_row(paired, regime=name, scenario=s.name, blind=b, arm=arm,
                        metric="throughput_during_tok_s", base_arm="correct")
            q = find_row(paired, regime=name, scenario=s.name, blind=b, arm=arm, metric="tpot_mean_during_s",
                        base_arm="correct")
            e = find_row(ece, regime=name, scenario=s.name, blind=b, arm=arm, window="during")
            if t:
                body.append([f"{b:g}", f"`{arm}`", _pct(t), _pct(q),
                             fmt_ci(e["mean"], e["lo"], e["hi"], 100, 2) if e else "n/a"])
    out.append(md_table(["blind", "arm", "throughput", "mean TPOT", "ECE during (abs. %)"], body) + "\n")
    return out


_DEFINITIONS = (
    "**Definitions.** Windows: before = warm-up to the issue of request i0, during = i0 to i1, after = "
    "i1 to the end (ECE and throughput by step end time; mean TPOT over the requests of each index range "
    "that completed). ECE: survival against realised survival (1[A >= k]) over every draft position of "
    "every decoding step in the window (including positions not verified; the truth comes from the "
    "simulator), 15 equal-width bins, of the confidences the policy used (after the arm's rescaling). "
    "Throughput: output tokens per second in the window (steps pro rata).\n")

_LIMITS = (
    "**Limits.** The head's domain blindness is a model with a free parameter (no published "
    "measurement of a head's bias under a mix change); blind = 0 shows that the simulator's own head "
    "does not drift at all. STS and the online refit are temperatures only (no per-domain bias term: "
    "even `correct` is not perfectly calibrated on a mix of domains); the online fit sees only verified "
    "positions (censored by the policy's own verify lengths). Closed loop at one load; one engine; the "
    "drift is indexed by request, so its timing varies a little between arms and seeds.")


def _text(settings: Settings, p: Plan, rows, paired, ece) -> tuple[str, str]:
    regimes = list(dict.fromkeys(r["regime"] for r in rows))
    out = _setup(settings, p, rows, regimes)
    heads, answer = _answer(p, regimes, paired, ece)
    out += answer
    out.append("")
    for name in regimes:
        out += _after_table(p, name, paired, ece)
        out += _during_table(p, name, rows, paired, ece)
    out.append(_DEFINITIONS)
    out.append(_LIMITS + (" FAST mode: one scenario, one blindness, short runs — shape, not answers." if settings.fast
                          else ""))
    return "; ".join(heads), "\n".join(out)


__all__ = ["NAME", "TITLE", "QUESTION", "plan", "measure", "analyse"]
