"""Study long-context (issue 29, 2.3): how far is the 1-D marginal price from each token's true cost, and what does
a 2-D-aware confidence-async gain?

With the profile's long-context term (``attention.seconds_per_query_kv``) a verified draft token of request i costs
theta + qk_s * (c_i + k + 1) (c_i its context, k its 0-based position; theta the target's per-token batch term),
but the price the engine hands the policies charges every extra token at the batch's mean context (the paper's
1-D SPS(B)). Measured on Mooncake-like contexts (8k-128k prompts): the relative error of the 1-D marginal price
against the true one, per candidate and per verified token, and of the 1-D step-time prediction at the chosen M;
then ``confidence-async-2d:2`` (each candidate priced at its own context, ranked by value per cost) against
``confidence-async:2`` on the same requests and draws.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from dsparksim.policies.base import Policy, StepContext
from dsparksim.study.common import (PRODUCTION, PolicyWrapper, Regime, Section, Settings, find_row, fit_probe, fmt_ci,
                                    interval, md_table, new_figure, paired_rows, run_config, save_figure)
from dsparksim.policies import draft_budget, global_best, Ranking
from dsparksim.policies.confidence_async_2d import priced_candidates, ratio_2d
from dsparksim.policies.confidence_global import global_budget

NAME = "long-context"
TITLE = "Long context vs a 1-D SPS table"
QUESTION = ("With Mooncake-like contexts of 8k-128k tokens, how far is the 1-D (batch-mean-context) marginal price "
            "the policies use from each draft token's true marginal cost, and what does a 2-D-aware "
            "confidence-async (each candidate priced at its own request's context) gain?")
BASE = "confidence-async:2"
TWO_D = "confidence-async-2d:2"
LENGTHS = "mooncake-long"
PREFILL_REPLICAS = 256   # a Mooncake-like prefill pool large enough that the decode engine is the bottleneck

# The contrast: the InferenceX-fitted TensorRT-LLM profile of the same model family (issue 30), fp8 KV (about twice
# the cache: 1,415,019 tokens at the fit's memory fraction 0.8906), so about twice as many long requests decode at
# once. Its cells run on the server it was fitted under where the regime sets nothing (study.common.run_config).
FITTED = Regime(
    name="fitted-trtllm", profile="fitted-h200x8-deepseek-r1-trtllm-1.3.0rc14-ep8", options=PRODUCTION.options,
    users=(64, 512), rate_rps=48.0, loads=(32, 64),
    why="DeepSeek-R1 on 8 x H200, TensorRT-LLM 1.3.0rc14 TP8/EP8, fitted by `dsparksim profile fit` on published "
        "InferenceX runs (issue 30); fp8 KV, 1,415,019 tokens at the fit's memory fraction 0.8906; run with the "
        "production regime's engine options (decode-only, paged KV, K = 5) on the server it was fitted under "
        "(study.json: options_from_profile_fit)")


@dataclass(frozen=True)
class Plan:
    loads: dict[str, tuple[int, ...]]
    duration_s: float
    warmup_s: float
    control_users: int | None      # short-context control (Azure conversation lengths) at this load, production


FULL = Plan(loads={"production": (16, 32), "fitted-trtllm": (32, 64)}, duration_s=60.0, warmup_s=15.0,
            control_users=256)
FAST = Plan(loads={"production": (32,)}, duration_s=30.0, warmup_s=10.0, control_users=None)


@dataclass(frozen=True)
class Cell:
    regime: Regime
    lengths: str
    users: int
    policy: str
    seed: int
    plan: Plan


def regimes_of(settings: Settings) -> list[Regime]:
    """The primary (production) regime; in full mode the fitted TensorRT-LLM profile as the contrast (the dense 7B
    contrast of the other studies has a 4,096-token context limit and cannot serve these requests)."""
    prim = settings.regimes[0]
    return [prim] if settings.fast else [prim, FITTED]


def plan(settings: Settings) -> list[Cell]:
    p = FAST if settings.fast else FULL
    cells = []
    for r in regimes_of(settings):
        for u in p.loads.get(r.name, p.loads["production"]):
            cells += [Cell(r, LENGTHS, u, pol, s, p) for s in settings.seeds for pol in (BASE, TWO_D)]
    if p.control_users:
        r = settings.regimes[0]
        cells += [Cell(r, "azure-conv", p.control_users, pol, s, p) for s in settings.seeds for pol in (BASE, TWO_D)]
    return cells


# ------------------------------------------------------------------------------------------------ recorder
class PriceRecorder(PolicyWrapper):
    """Per step with a context term: the 1-D marginal price against each candidate's true marginal cost, and the
    1-D step-time prediction at the chosen M against the exact price."""

    def __init__(self, inner: Policy) -> None:
        super().__init__(inner)
        self.err_all: list[np.ndarray] = []        # (p1 - m) / m over every candidate
        self.err_verified: list[np.ndarray] = []   # the same over the verified (admitted) tokens
        self.att_share: list[np.ndarray] = []      # attention share of the true marginal of verified tokens
        self.step_err: list[float] = []            # (1-D step time - exact) / exact at the chosen M
        self.ctx_cv: list[float] = []              # coefficient of variation of the decoding contexts
        self.ctx_mean: list[float] = []            # mean context of the decoding requests
        self.step_gain: list[float] = []           # exact tokens/s of the 2-D global choice / the 1-D one - 1

    def choose(self, ctx: StepContext) -> np.ndarray:

        L = np.asarray(self.inner.choose(ctx), np.int64)
        if ctx.n == 0 or ctx.context is None or not ctx.qk_s > 0:
            return L
        n, K, sq = ctx.n, ctx.K, float(ctx.qk_s)
        c = np.asarray(ctx.context, float)
        _, _, _, base = priced_candidates(ctx)
        top = max(1, min(n * K, ctx.max_tokens - ctx.base_tokens))
        e = base(np.array([ctx.base_tokens, ctx.base_tokens + top]))
        theta = max(float(e[1] - e[0]) / top, 0.0)
        true = theta + sq * (c[:, None] + np.arange(1, K + 1)[None, :])       # (n, K)
        p1 = theta + sq * c.mean()
        err = (p1 - true) / true
        self.err_all.append(err.ravel())
        ver = np.arange(K)[None, :] < L[:, None]
        self.err_verified.append(err[ver])
        self.att_share.append((sq * (c[:, None] + np.arange(1, K + 1)[None, :]) / true)[ver])
        M = ctx.base_tokens + int(L.sum())
        exact = float(base(np.array([M]))[0]) + sq * float(((1 + L) * c + L * (L + 1) / 2).sum())
        self.step_err.append(float(ctx.step_time(np.array([M]))[0]) / exact - 1.0)
        self.ctx_cv.append(float(c.std() / c.mean()) if n > 1 else 0.0)
        self.ctx_mean.append(float(c.mean()))
        self.step_gain.append(_step_gain(ctx, base))
        return L


def _step_gain(ctx: StepContext, base) -> float:
    """On this step's own information: the exact expected tokens per second (engine price) of the 2-D global
    choice over that of the 1-D global choice (confidence-global's budget by survival rank), minus 1."""

    n, c, sq = ctx.n, np.asarray(ctx.context, float), float(ctx.qk_s)
    cum = np.concatenate([np.zeros((n, 1)), np.cumsum(ctx.survival, axis=1)], axis=1)

    def exact(L: np.ndarray) -> float:
        M = ctx.base_tokens + int(L.sum())
        T = float(base(np.array([M]))[0]) + sq * float(((1 + L) * c + L * (L + 1) / 2).sum())
        return (n + float(cum[np.arange(n), L].sum())) / T

    rk = Ranking(ctx.survival)
    l1 = rk.lengths(global_budget(ctx, rk.values()))
    order, vals, pairs, _ = priced_candidates(ctx)
    b2 = global_best(ratio_2d(ctx, vals, pairs, base, draft_budget(ctx)))
    l2 = np.bincount(order[:b2] % n, minlength=n)
    return exact(l2) / exact(l1) - 1.0


def _abs_stats(parts: list[np.ndarray]) -> tuple[float, float, float]:
    x = np.abs(np.concatenate(parts)) if parts else np.zeros(0)
    if not x.size:
        return math.nan, math.nan, math.nan
    return float(x.mean()), float(np.percentile(x, 50)), float(np.percentile(x, 90))


# ------------------------------------------------------------------------------------------------ one cell
def measure(cell: Cell) -> dict[str, Any]:
    """Simulate one cell; the summary's throughput and latency, and (1-D runs) the pricing errors."""
    from dsparksim.sim.simulate import simulate  # lazy: pulls in scipy

    p = cell.plan
    traffic = {"concurrency": cell.users, "duration_s": p.duration_s, "warmup_s": p.warmup_s,
               "lengths": cell.lengths, "prefill_replicas": PREFILL_REPLICAS}
    cfg = run_config(cell.regime, cell.policy, cell.seed, traffic)
    holder: list[PriceRecorder] = []

    def wrap(pol):
        holder.append(PriceRecorder(pol))
        return holder[0]

    out = simulate(cfg, wrap_policy=wrap)
    s = out.summary
    st = out.result.steps
    dec = np.asarray(st["n_decode"]) > 0
    row = {"regime": cell.regime.name, "profile": cell.regime.profile, "lengths": cell.lengths, "users": cell.users,
           "policy": cell.policy, "seed": cell.seed}
    for k in ("output_throughput_tok_s", "tpot_mean_s", "tpot_p99_s", "tps_user_median", "mean_verify_len",
              "num_requests_completed"):
        row[k] = s.get(k)
    row["mean_decoding"] = float(np.mean(np.asarray(st["n_decode"])[dec])) if dec.any() else math.nan
    rec = holder[0]
    row["price_steps"] = len(rec.step_err)
    row["price_err_all_mean"], row["price_err_all_p50"], row["price_err_all_p90"] = _abs_stats(rec.err_all)
    row["price_err_ver_mean"], row["price_err_ver_p50"], row["price_err_ver_p90"] = _abs_stats(rec.err_verified)
    row["attention_share_ver"] = (float(np.concatenate(rec.att_share).mean()) if rec.att_share and
                                  np.concatenate(rec.att_share).size else math.nan)
    se = np.asarray(rec.step_err)
    row["step_err_mean"] = float(se.mean()) if se.size else math.nan
    row["step_err_abs_p90"] = float(np.percentile(np.abs(se), 90)) if se.size else math.nan
    row["context_cv_mean"] = float(np.mean(rec.ctx_cv)) if rec.ctx_cv else math.nan
    row["decoding_context_mean"] = float(np.mean(rec.ctx_mean)) if rec.ctx_mean else math.nan
    row["step_gain_2d_mean"] = float(np.mean(rec.step_gain)) if rec.step_gain else math.nan
    row["step_gain_2d_neg_share"] = float(np.mean(np.asarray(rec.step_gain) < -1e-12)) if rec.step_gain else math.nan
    return row | fit_probe(cfg, s)


# ------------------------------------------------------------------------------------------------ analysis
_KEYS = ("regime", "lengths", "users", "policy")
METRICS = (("output_throughput_tok_s", True), ("tpot_mean_s", True), ("tpot_p99_s", True),
           ("tps_user_median", True), ("mean_verify_len", False), ("decoding_context_mean", True))
PRICE = ("price_err_all_mean", "price_err_all_p90", "price_err_ver_mean", "price_err_ver_p90",
         "attention_share_ver", "step_err_mean", "step_err_abs_p90", "context_cv_mean", "mean_decoding",
         "step_gain_2d_mean", "step_gain_2d_neg_share", "decoding_context_mean")


def analyse(settings: Settings, rows: list[dict[str, Any]]) -> Section:
    reg_order = {r.name: i for i, r in enumerate([*regimes_of(settings)])}
    rows = sorted(rows, key=lambda r: (reg_order.get(r["regime"], 99), r["lengths"] != LENGTHS, r["users"],
                                       r["policy"] != BASE, r["seed"]))
    paired = []
    for m, rel in METRICS:
        paired += paired_rows(rows, _KEYS, m, {"policy": BASE}, rel)
    price = []
    for m in PRICE:
        groups: dict[tuple, list[float]] = {}
        for r in rows:
            if r["policy"] == BASE and r.get(m) is not None and math.isfinite(r[m]):
                groups.setdefault((r["regime"], r["lengths"], r["users"]), []).append(r[m])
        for (reg, ln, u), vals in groups.items():
            mean, lo, hi = interval(vals)
            price.append({"regime": reg, "lengths": ln, "users": u, "metric": m, "mean": mean, "lo": lo, "hi": hi,
                          "n_seeds": len(vals)})
    heads, md = _text(settings, rows, paired, price)
    md += f"\n\n![1-D pricing error and the 2-D variant's paired change]({NAME}/longctx.png)\n"
    return Section(markdown=md, tables={"runs": rows, "paired_vs_1d": paired, "pricing_error": price},
                   headline=heads, figures={"longctx.png": lambda path: _figure(path, paired, price)})


def _figure(path, paired, price) -> None:
    """Left: the 1-D marginal price error (mean and P90 |error|, verified tokens) per regime and load. Right: the
    2-D variant's paired throughput and mean-TPOT change, 95% intervals."""
    groups = list(dict.fromkeys((r["regime"], r["lengths"], r["users"]) for r in price))
    labels = [f"{g[0]}\n{g[1]}, {g[2]} users" for g in groups]
    fig = new_figure((12, 4.2))
    ax, bx = fig.subplots(1, 2)
    x = np.arange(len(groups))
    for j, (m, lab) in enumerate((("price_err_ver_mean", "mean |error|, verified"),
                                  ("price_err_ver_p90", "P90 |error|, verified"),
                                  ("price_err_all_p90", "P90 |error|, all candidates"))):
        r = [find_row(price, regime=g[0], lengths=g[1], users=g[2], metric=m) for g in groups]
        y = np.array([100 * q["mean"] if q else np.nan for q in r])
        lo = np.array([100 * q["lo"] if q else np.nan for q in r])
        hi = np.array([100 * q["hi"] if q else np.nan for q in r])
        ax.errorbar(x + 0.15 * (j - 1), y, yerr=np.nan_to_num([y - lo, hi - y]), fmt="o", capsize=3, label=lab)
    ax.set_xticks(x, labels, fontsize=7)
    ax.set(ylabel="1-D price error vs true marginal (%)", title="1-D (mean-context) marginal price error")
    ax.legend(fontsize=7)
    for j, (m, sign, lab) in enumerate((("output_throughput_tok_s", 1, "throughput"),
                                        ("tpot_mean_s", 1, "mean TPOT"), ("tpot_p99_s", 1, "P99 TPOT"))):
        r = [find_row(paired, regime=g[0], lengths=g[1], users=g[2], policy=TWO_D, metric=m) for g in groups]
        y = np.array([100 * q["diff"] if q else np.nan for q in r])
        lo = np.array([100 * q["diff_lo"] if q else np.nan for q in r])
        hi = np.array([100 * q["diff_hi"] if q else np.nan for q in r])
        bx.errorbar(x + 0.15 * (j - 1), y, yerr=np.nan_to_num([y - lo, hi - y]), fmt="s", capsize=3, label=lab)
    bx.axhline(0, color="grey", lw=1)
    bx.set_xticks(x, labels, fontsize=7)
    bx.set(ylabel=f"{TWO_D} vs {BASE} (%)", title="2-D-aware variant, paired change")
    bx.legend(fontsize=7)
    save_figure(fig, path)


def _setup(settings: Settings, p: Plan, groups: list[tuple]) -> list[str]:
    """The question and the setup paragraph."""
    reg_of = {r.name: r for r in [*settings.regimes, FITTED]}
    out = [f"**Question.** {QUESTION}\n", "**Setup.**"]
    for name in dict.fromkeys(g[0] for g in groups):
        rg = reg_of[name]
        loads = sorted({g[2] for g in groups if g[0] == name and g[1] == LENGTHS})
        out.append(f"- Regime `{name}`: profile `{rg.profile}`; {rg.why}. Prefill pool of {PREFILL_REPLICAS} "
                   f"instances (Mooncake-like disaggregation, so the decode engine is the bottleneck). Closed loop "
                   f"at {', '.join(map(str, loads))} users.")
    out.append(f"- Lengths: `{LENGTHS}` (traces/mooncake_long_sample.csv: 2,000 Mooncake conversation requests with "
               "8k-128k prompt tokens, median ~16.5k; provenance in traces/README.md)"
               + (f"; control: `azure-conv` (short contexts) at {p.control_users} users on `production`"
                  if p.control_users else "") + ".")
    out.append(f"- {p.duration_s:g} s runs, {p.warmup_s:g} s warm-up; `{BASE}` (1-D price) vs `{TWO_D}` "
               "(dsparksim/policies/confidence_async_2d.py). Seeds "
               f"{', '.join(map(str, settings.seeds))}, paired (same requests, same draws); 95% t-intervals over "
               "seeds.\n")
    return out


def _answer_item(reg: str, ln: str, u, paired, price) -> str:
    """One (regime, lengths, users) group's answer text."""
    pr = {m: find_row(price, regime=reg, lengths=ln, users=u, metric=m) for m in PRICE}

    def f(m, scale=100, digits=1, unit="%"):
        q = pr[m]
        return fmt_ci(q["mean"], q["lo"], q["hi"], scale, digits, unit) if q else "n/a"

    def d(m):
        q = find_row(paired, regime=reg, lengths=ln, users=u, policy=TWO_D, metric=m)
        return fmt_ci(q["diff"], q["diff_lo"], q["diff_hi"], 100, 2, "%", True) if q else "n/a"
    text = (f"`{reg}`, `{ln}`, {u} users: the 1-D price is off by {f('price_err_ver_mean')} on average per "
            f"verified token (P90 {f('price_err_ver_p90')}; over all candidates P90 {f('price_err_all_p90')}), "
            f"attention being {f('attention_share_ver')} of a verified token's true marginal cost; the 1-D step "
            f"time at the chosen M is off by {f('step_err_mean', digits=2)} (P90 |.| "
            f"{f('step_err_abs_p90', digits=2)}); on the same steps the 2-D choice would serve "
            f"{f('step_gain_2d_mean', digits=2)} more expected tokens per second (worse on "
            f"{f('step_gain_2d_neg_share', digits=1)} of steps); run paired, `{TWO_D}` vs `{BASE}`: throughput "
            f"{d('output_throughput_tok_s')}, mean TPOT {d('tpot_mean_s')}, P99 TPOT {d('tpot_p99_s')}, mean "
            f"context of the decoding requests {d('decoding_context_mean')}")
    sg = pr["step_gain_2d_mean"]
    th = find_row(paired, regime=reg, lengths=ln, users=u, policy=TWO_D, metric="output_throughput_tok_s")
    if sg and th and sg["lo"] > 0 and th["diff_hi"] < 0:
        text += ("; the per-step gain does not carry over to the run: favouring short contexts leaves the long "
                 "ones decoding longer, so the batch the engine steps holds longer contexts")
    return text


def _answer(groups: list[tuple], paired, price) -> tuple[list[str], list[str]]:
    """The answer paragraph: (headlines, lines)."""
    heads, out = [], ["**Answer.**"]
    for g in groups:
        reg, ln, u = g
        text = _answer_item(reg, ln, u, paired, price)
        out.append(f"- {text}.")
        if u == max(g2[2] for g2 in groups if g2[:2] == (reg, ln)):      # the headline: each regime's top load
            heads.append(text)
    return heads, out


def _table(groups: list[tuple], paired, price) -> list[str]:
    """The paired changes of the 2-D variant, one row per group."""
    hdr = ["regime", "lengths", "users", "decoding / step", "context CV", "throughput", "mean TPOT", "P99 TPOT",
           "median user tok/s", "verify length (abs.)", "decoding context"]
    body = []
    for reg, ln, u in groups:
        q = find_row(price, regime=reg, lengths=ln, users=u, metric="mean_decoding")
        cv = find_row(price, regime=reg, lengths=ln, users=u, metric="context_cv_mean")
        line = [f"`{reg}`", f"`{ln}`", u, fmt_ci(q["mean"], q["lo"], q["hi"], 1, 1) if q else "n/a",
                fmt_ci(cv["mean"], cv["lo"], cv["hi"], 1, 2) if cv else "n/a"]
        for m, rel in METRICS:
            r = find_row(paired, regime=reg, lengths=ln, users=u, policy=TWO_D, metric=m)
            line.append(fmt_ci(r["diff"], r["diff_lo"], r["diff_hi"], 100 if rel else 1, 2, "%" if rel else "",
                               True) if r else "n/a")
        body.append(line)
    return [f"*Paired change of `{TWO_D}` against `{BASE}`, mean [95% CI] (% unless marked; positive throughput "
            "= gained, positive TPOT = slower).*\n", md_table(hdr, body) + "\n"]


_DEFINITIONS = (
    "**Definitions.** True marginal cost of draft position k+1 of request i: theta + qk_s (c_i + k + 1), "
    "theta the mean slope of the profile's batch term over the step's range, qk_s the profile's seconds "
    "per decode query-key pair; the 1-D price: theta + qk_s mean(c). Error = 1-D / true - 1 (absolute "
    "values averaged). Measured on the steps of the 1-D policy's own runs. Step error: the 1-D "
    "step_time(M) over the engine's exact price at the M chosen, minus 1. Per-step 2-D gain: on each "
    "step of the 1-D run, the expected tokens per second at the engine's exact price of the 2-D global "
    "choice over that of the 1-D global choice (both on the step's own information), minus 1. Decoding "
    "context: the mean context of the requests decoding at a step, averaged over steps.\n")

_LIMITS = (
    "**Limits.** Closed-loop users; one engine; the prefill pool is sized out of the way, so TTFT is not "
    "studied. theta is a mean slope: on a staircase a single token's batch cost is 0 or a riser. The "
    "2-D variant keeps the 1-D budget's LAG-2 staleness in tokens, so a budget carried across steps with "
    "different context mixes is only approximately right. Acceptance does not depend on context here "
    "(the model has no context term). Not studied: DP-attention deployments (per-rank attention in lockstep "
    "steps).")


def _text(settings: Settings, rows, paired, price) -> tuple[str, str]:
    groups = list(dict.fromkeys((r["regime"], r["lengths"], r["users"]) for r in rows))
    p = FAST if settings.fast else FULL
    out = _setup(settings, p, groups)
    heads, answer = _answer(groups, paired, price)
    out += answer
    out.append("")
    out += _table(groups, paired, price)
    out.append(_DEFINITIONS)
    out.append(_LIMITS + (" FAST mode: one load, short runs — shape, not answers." if settings.fast else ""))
    return "; ".join(heads), "\n".join(out)


__all__ = ["NAME", "TITLE", "QUESTION", "plan", "measure", "analyse"]
