"""What every study shares: the serving regimes, running one cell, window metrics, policy wrappers, paired intervals.

A *cell* is one simulated run (regime, policy, traffic, seed). Cells of one seed serve the same requests with the
same acceptance draws whatever the policy (dsparksim.sim.simulate._streams), so differences between policies at one
seed are paired; an interval over the per-seed differences is the paired 95% t-interval (dsparksim.results.stats).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from dsparksim.policies.base import Policy, StepContext
from dsparksim.results.stats import t_interval
from dsparksim.config import RunConfig
from dsparksim.cost.fitted import FitDefaults, fit_defaults, fitted_options
from dsparksim.policies import Ranking
from dsparksim.policies.confidence_global import global_budget


# ------------------------------------------------------------------------------------------------ regimes
@dataclass(frozen=True)
class Regime:
    """A serving regime a study runs in: a cost profile with the engine and traffic options that go with it.

    options:    run options (RunConfig.from_options keys) shared by every cell, the profile excepted.
    users:      (low, high) closed-loop user counts: the quiet load and the spike (study load-spikes), and the
                loads of the tail study are drawn from ``loads``.
    rate_rps:   mean open-loop arrival rate of the bursty (gamma) scenarios.
    loads:      closed-loop user counts of the tail study.
    why:        one line on where the numbers come from (printed in the report).
    """

    name: str
    profile: str
    options: tuple[tuple[str, Any], ...]
    users: tuple[int, int]
    rate_rps: float
    loads: tuple[int, ...]
    why: str = ""

    def run_options(self) -> dict[str, Any]:
        return dict(self.options) | {"profile": self.profile}

    def with_profile(self, profile: str) -> "Regime":
        return dataclasses.replace(self, profile=profile)

    def fit(self) -> FitDefaults:
        """What the regime's cells take from a ``profile fit`` profile's server (the settings its options leave
        unset, as ``dsparksim run`` takes them; none for another profile). The studies' traffic and policies set
        no server option, so this is every cell's (:func:`run_config`)."""
        return fit_defaults(self.profile, self.run_options())


# The production regime of sweeps/production.toml (issue 12): DeepSeek-V3 on 8 x H200 as one TP8 engine,
# decode-only behind a prefill pool, paged KV, chat-heavy traffic with Azure conversation lengths, K = 5.
PRODUCTION = Regime(
    name="production", profile="built-h200x8-deepseek-v3-tp8",
    options=(("disaggregated", True), ("kv_transfer_gbps", 400.0), ("prefill_replicas", 8), ("kv_policy", "paged"),
             ("block_size", 5), ("acceptance", "dspark"), ("domain", "mix:math=1,code=1,chat=6"),
             ("lengths", "azure-conv")),
    users=(64, 512), rate_rps=48.0, loads=(64, 256, 512),
    why="sweeps/production.toml: decode-only TP8 engine, 8 prefill instances, 400 Gbit/s KV link, paged KV "
        "(~500 chat requests fill its 666,630-token cache); 48 req/s x 211 mean output tokens is ~60% of the "
        "512-user closed-loop output throughput (17.1k tok/s, confidence-async:2, seed 0)")

# The dense contrast: Llama-2-7B on one H100 (113,534 KV tokens, ~85 chat requests), colocated prefill + decode.
# Its user counts keep the production regime's ratio (8x) and its relation to the KV cache (the high load
# overfills it).
DENSE = Regime(
    name="dense", profile="h100-llama2-7b-tp1",
    options=(("kv_policy", "paged"), ("block_size", 5), ("acceptance", "dspark"),
             ("domain", "mix:math=1,code=1,chat=6"), ("lengths", "azure-conv")),
    users=(16, 128), rate_rps=11.5, loads=(64,),
    why="colocated engine (chunked prefill), paged KV; 16 -> 128 users is the production spike's 8x ratio and "
        "overfills the KV cache as 512 does there; 11.5 req/s x 211 mean output tokens is ~60% of the "
        "128-user closed-loop output throughput (4.1k tok/s, confidence-async:2, seed 0)")

REGIMES = {r.name: r for r in (PRODUCTION, DENSE)}


# ------------------------------------------------------------------------------------------------ one cell
def run_config(regime: Regime, policy: str, seed: int, traffic: dict[str, Any],
               user_steps: tuple[tuple[float, int], ...] | None = None):
    """The RunConfig of one cell: the regime's options, the policy and seed, the traffic options (+ user_steps), and
    on a ``profile fit`` profile the fitted server's settings none of them sets, as ``dsparksim run`` takes them
    (:func:`dsparksim.cost.fitted.fitted_options`; :meth:`Regime.fit` records them)."""

    opts = regime.run_options() | {"policy": policy, "seed": int(seed)} | traffic
    cfg = RunConfig.from_options(fitted_options(opts, regime.profile), source=f"study regime {regime.name!r}")
    if user_steps is not None:
        cfg = cfg.replace(traffic=dataclasses.replace(cfg.traffic, user_steps=user_steps))
    return cfg


# A measured row's key holding its cell's config and mean running requests (the summary's ``mean_running``), for
# the fit-range caution of a study on a fitted profile (:func:`dsparksim.study.run.study_fit_cautions`); run_study
# takes it off every row before the study's analyse, so no table sees it.
FIT_PROBE = "fit_probe"


def fit_probe(cfg: RunConfig, summary: dict[str, Any]) -> dict[str, Any]:
    """The :data:`FIT_PROBE` entry of a cell's row: its config and the summary's mean running requests."""
    return {FIT_PROBE: (cfg, {"mean_running": summary.get("mean_running")})}


# ------------------------------------------------------------------------------------------- policy wrappers
class PolicyWrapper(Policy):
    """A policy around another: same spec, drafter, K and oracle needs; choose/observe/reset delegate."""

    def __init__(self, inner: Policy) -> None:
        self.inner = inner
        self.spec = inner.spec
        self.name = inner.name
        self.needs_oracle = inner.needs_oracle
        self.drafter = inner.drafter
        self.block_size = inner.block_size
        self.drafts = inner.drafts
        self.reads_confidence = inner.reads_confidence

    def reset(self, K: int, rng: np.random.Generator) -> None:
        self.inner.reset(K, rng)

    def observe(self, request_ids, verify_len, accepted) -> None:
        self.inner.observe(request_ids, verify_len, accepted)

    def choose(self, ctx: StepContext) -> np.ndarray:
        return self.inner.choose(ctx)


class BudgetRecorder(PolicyWrapper):
    """Records, per decoding step, the draft tokens the policy verified (``used``) and the *fresh* capacity: the
    budget b_t a global search on this step's own information would choose (confidence-global's; what
    confidence-async:LAG uses LAG steps later). ``used - fresh`` > 0 is over-verification, < 0 under-verification."""

    def __init__(self, inner: Policy) -> None:
        super().__init__(inner)
        self.used: list[int] = []
        self.fresh: list[int] = []

    def choose(self, ctx: StepContext) -> np.ndarray:

        L = self.inner.choose(ctx)
        self.used.append(int(np.asarray(L).sum()))
        self.fresh.append(global_budget(ctx, Ranking(ctx.survival, ctx.drafted).values()))
        return L


class MinVerify(PolicyWrapper):
    """The tail knob: every decoding request verifies at least ``floor`` draft tokens (min(floor, K)) on top of the
    inner policy's choice. The floor is fixed before any token is drawn, so the policy stays lossless. A step where
    the floor would overflow the token budget keeps the inner choice (counted in ``overflow_steps``)."""

    def __init__(self, inner: Policy, floor: int) -> None:
        super().__init__(inner)
        if isinstance(floor, bool) or not isinstance(floor, int) or floor < 0:
            raise ValueError(f"minimum verify length must be an integer >= 0, got {floor!r}")
        self.floor = floor
        self.spec = f"{inner.spec}+min{floor}"
        self.overflow_steps = 0

    def choose(self, ctx: StepContext) -> np.ndarray:
        L = np.asarray(self.inner.choose(ctx), dtype=np.int64)
        F = np.maximum(L, min(self.floor, ctx.K))
        if ctx.base_tokens + int(F.sum()) > ctx.max_tokens:
            self.overflow_steps += 1
            return L
        return F


def recorded_steps(steps: dict[str, np.ndarray], rec: BudgetRecorder) -> dict[str, np.ndarray]:
    """The decoding steps of a single-engine run with the recorder's used/fresh budgets aligned to them.

    The policy is asked once per step that decodes; a step planned but cut by the run's end is asked and never
    logged, so the recorder may hold one more entry than the log. ``used`` must equal the log's verify_tokens."""
    dec = np.asarray(steps["n_decode"]) > 0
    n = int(dec.sum())
    if len(rec.used) not in (n, n + 1):
        raise RuntimeError(f"recorder holds {len(rec.used)} decisions for {n} decoding steps")
    used = np.asarray(rec.used[:n], np.int64)
    if not np.array_equal(used, np.asarray(steps["verify_tokens"])[dec]):
        raise RuntimeError("recorded verify budgets disagree with the step log")
    return {"t": np.asarray(steps["t_start"])[dec] + np.asarray(steps["dt"])[dec],
            "used": used, "fresh": np.asarray(rec.fresh[:n], np.int64)}


# --------------------------------------------------------------------------------------------- window metrics
def window_throughput(steps: dict[str, np.ndarray], a: float, b: float) -> float:
    """Output tokens per second in [a, b): each step's tokens counted pro rata to its overlap with the window."""
    t0 = np.asarray(steps["t_start"], float)
    dt = np.asarray(steps["dt"], float)
    over = np.clip(np.minimum(t0 + dt, b) - np.maximum(t0, a), 0.0, None)
    frac = np.where(dt > 0, over / np.where(dt > 0, dt, 1.0), 0.0)
    return float((np.asarray(steps["emitted"], float) * frac).sum() / (b - a))


def throughput_series(steps: dict[str, np.ndarray], end: float, bin_s: float) -> tuple[np.ndarray, np.ndarray]:
    """(bin starts, tokens/s per bin) over [0, end) in bins of ``bin_s`` seconds (pro rata, as above)."""
    edges = np.arange(0.0, end + 1e-12, bin_s)
    return edges[:-1], np.array([window_throughput(steps, a, a + bin_s) for a in edges[:-1]])


def recovery_time(starts: np.ndarray, thr: np.ndarray, change_s: float, settle: tuple[float, float],
                  window_s: float, band: float) -> float:
    """Seconds after ``change_s`` until the trailing ``window_s`` mean throughput first lies within ``band``
    (relative) of the settled level (the mean throughput over ``settle`` = [a, b)); NaN if it never does."""
    bin_s = float(starts[1] - starts[0])
    w = max(1, int(round(window_s / bin_s)))
    kernel = np.ones(w) / w
    roll = np.convolve(thr, kernel, mode="full")[:len(thr)]      # roll[i]: mean of bins i-w+1..i
    ends = starts + bin_s
    sel = (starts >= settle[0]) & (ends <= settle[1])
    level = float(thr[sel].mean()) if sel.any() else math.nan
    if not level > 0:
        return math.nan
    ok = (ends >= change_s + window_s) & (np.abs(roll - level) <= band * level)
    # the first trailing window lying wholly after the change that is within the band
    idx = np.flatnonzero(ok & (ends > change_s))
    return float(ends[idx[0]] - change_s) if len(idx) else math.nan


def p99(x: np.ndarray) -> float:
    x = np.asarray(x, float)
    x = x[np.isfinite(x)]
    return float(np.percentile(x, 99)) if x.size else math.nan


# --------------------------------------------------------------------------------------------- paired statistics
def paired_rows(rows: Sequence[dict[str, Any]], keys: Sequence[str], metric: str, baseline: dict[str, Any],
                relative: bool, vary: str = "policy") -> list[dict[str, Any]]:
    """Per group of ``keys`` (``vary`` excluded), the paired difference of ``metric`` against the baseline cell
    (same group, same seed, ``vary`` = baseline[vary]): ``x/x_base - 1`` when ``relative`` else ``x - x_base``;
    mean and 95% t-interval over seeds. A seed whose value or baseline is missing makes that interval NaN."""
    group_keys = [k for k in keys if k != vary]
    base_of: dict[tuple, float] = {}
    for r in rows:
        if r[vary] == baseline[vary]:
            base_of[tuple(r[k] for k in group_keys) + (r["seed"],)] = r.get(metric)
    out: dict[tuple, dict[str, Any]] = {}
    for r in rows:
        g = tuple(r[k] for k in keys)
        b = base_of.get(tuple(r[k] for k in group_keys) + (r["seed"],))
        x = r.get(metric)
        if x is None or b is None or not (math.isfinite(x) and math.isfinite(b)) or (relative and b == 0):
            d = math.nan
        else:
            d = x / b - 1.0 if relative else x - b
        e = out.setdefault(g, {k: r[k] for k in keys} | {"metric": metric, "diffs": [], "values": []})
        e["diffs"].append(d)
        e["values"].append(x if x is not None else math.nan)
    res = []
    for e in out.values():
        iv, v = t_interval(e.pop("diffs")), t_interval(e.pop("values"))
        res.append(e | {"value": v.mean, "value_lo": v.lo, "value_hi": v.hi, "diff": iv.mean, "diff_lo": iv.lo,
                        "diff_hi": iv.hi, "n_seeds": iv.n, "relative": relative})
    return res


def interval(values: Iterable[float]) -> tuple[float, float, float]:
    iv = t_interval(list(values))
    return iv.mean, iv.lo, iv.hi


# ------------------------------------------------------------------------------------------------ text
def fmt_ci(mean: float, lo: float, hi: float, scale: float = 1.0, digits: int = 1, unit: str = "",
           signed: bool = False) -> str:
    """'12.3 [11.0, 13.6]' (NaN-safe)."""
    if mean is None or not math.isfinite(mean):
        return "n/a"
    f = f"{{:{'+' if signed else ''}.{digits}f}}"
    s = f.format(mean * scale) + unit
    if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)):
        return s
    return f"{s} [{f.format(lo * scale)}, {f.format(hi * scale)}]"


def md_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def find_row(table: Iterable[dict[str, Any]], **kw: Any) -> dict[str, Any] | None:
    """The first row of ``table`` whose fields equal ``kw`` (None: no such row)."""
    for r in table:
        if all(r.get(k) == v for k, v in kw.items()):
            return r
    return None


def regime_setup(question: str, regimes: Iterable[Regime], rows: Sequence[dict[str, Any]],
                 names: Iterable[str]) -> list[str]:
    """The question and the setup paragraph's first lines: per regime of ``names``, its profile, why, and the
    closed-loop loads its ``rows`` ran at."""
    reg_of = {r.name: r for r in regimes}
    out = [f"**Question.** {question}\n", "**Setup.**"]
    for name in names:
        rg = reg_of[name]
        loads = sorted(dict.fromkeys(r["load"] for r in rows if r["regime"] == name))
        out.append(f"- Regime `{name}`: profile `{rg.profile}`; {rg.why}. Closed loop at "
                   f"{', '.join(map(str, loads))} users.")
    return out


# ------------------------------------------------------------------------------------------------ figures
def new_figure(figsize: tuple[float, float]) -> Any:
    """A matplotlib Figure (no pyplot state) of ``figsize`` inches, to be written by :func:`save_figure`."""
    from matplotlib.figure import Figure  # lazy: matplotlib
    return Figure(figsize=figsize)


def save_figure(fig: Any, path: Any) -> None:
    """Lay ``fig`` out and write it to ``path`` at the studies' resolution."""
    fig.tight_layout()
    fig.savefig(path, dpi=110)


@dataclass(frozen=True)
class Settings:
    """How a study runs: fast (CI-sized) or full, its regimes (primary first) and seeds."""

    mode: str
    regimes: tuple[Regime, ...]
    seeds: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.mode not in ("fast", "full"):
            raise ValueError(f"mode must be 'fast' or 'full', got {self.mode!r}")

    @property
    def fast(self) -> bool:
        return self.mode == "fast"


@dataclass
class Section:
    """A study's result: its report section (markdown), its tables (name -> list of row dicts) and the headline."""

    markdown: str
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    headline: str = ""
    figures: dict[str, Callable[[Any], None]] = field(default_factory=dict)   # name.png -> draw(path)
