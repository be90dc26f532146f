"""Paired reference cells: the profile's own cells re-timed beside every real step.

The drift windows (:mod:`.drift`) re-time one small reference cell every quarter second; on this shared VM the
speed changes faster than that and not in proportion across step shapes (a 32-request step slowed 1.37x while
the 4-request reference slowed 1.5x). Here, right after every decode step of a real run, one step of the
*profile cell of the nearest shape* is timed (same drafter, the measured n_req nearest the step's decoding
requests, the measured context nearest its mean context, the uniform verify length nearest its mean), on the
same clock, a few milliseconds later. That cell's median time when the profile was measured is stored in the
profile (``metadata.cells``), so

    factor(step) = t(cell, now) / base(cell)                     (> 1: the machine is slower now)

brings the step to the speed at which the profile describes that very shape. Two baselines (``baseline=``):

* ``"fit"`` (default): the profile's own price of the cell's shape (its fitted terms, as the simulator prices a
  step). A 5-step cell median on this VM scatters far more than the fit over ~500 cells does (2026-12-02: cell
  medians vs the fit |err| median 8.6%, one 16-request cell 40% off, and a longer context timed *faster* than a
  shorter one), and that scatter would pass one to one into every step paired with that cell. What is then under
  test is everything *relative* to the profile at the nearest measured shape: that a real step costs what an
  isolated profiling step of that shape costs at the same moment, the model's interpolation from that shape to the
  step's exact one (heterogeneous verify lengths and contexts, prefill chunks, floor lookups between breakpoints),
  and the simulated engine's timeline; not the profile's absolute level at its own cells (reported apart).
* ``"cell"``: the cell's raw median when the profile was measured (``metadata.cells``).

Measured here (2026-12-01, alternating 1,100 real steps with their matched cells): real steps and cells of the
same shape timed back to back agree within 1% (step 0.99-1.01x; the host loop is 8-11% dearer in the real run,
0.1 ms).

A single step's time scatters by a few percent (on 2026-12-02: real over its paired cell 0.8-1.45 step by step),
so a step's factor is the median over its neighbouring paired steps (``span`` each side), among steps of its own
kind. A prefill-only step is paired with the profile's nearest prefill-only cell (``metadata.prefill_cells``:
chunk length, chunk count, cached prefix); a step with decoding requests and chunks with both its decode part's
cell and its chunks' prefill-only cell, its factor the two cells' factors blended, the prefill one weighted by the
share of the step's price beyond its decode part. On
this VM a slow spell slowed ~1k-context decode cells 20-44% while prefill-only steps ran at the profile's speed,
so one decode cell's factor over-corrected every step with chunks. Without prefill cells (profiles measured before
2026-12-02) a step with chunks is paired by its decode part and a prefill-only step takes the nearest paired
step's factor; so does a step of a drafter without cells.

Live mode (``live=``, a :class:`~.measure.LiveDrafters`): a profile measured on live steps (``measure --live``)
stores cells of the trained drafter's step (propose, rejection sampling, drafter state update; every block
rejected at position 1 so the context grows one token per step), and the paired cell is that very step
(:class:`~.live.LiveExecutor` with ``force_reject``), as the profile timed it. A live run's acceptance is sampled,
so its verify lengths scatter more than in trace replay; the cell is still matched on the step's mean L.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from dsparksim.cost.price import StepShape, chunk_query_keys, decode_query_keys
from dsparksim.cost.profile import CostProfile
from dsparksim.errors import ConfigError

BASELINES = ("fit", "cell")


class PairedCells:
    """The profile cells a real run is paired with (see module doc): ``tables[drafter]`` holds the stored cell
    medians; :meth:`time` steps a (cached) profiling engine of the matched cell once and returns its seconds."""

    def __init__(self, target, proxy, ex, cells: dict[str, Any], warmup: int, reps: int, profile=None,
                 baseline: str = "fit", live=None, prefill_cells: dict[str, Any] | None = None,
                 spread: tuple[float, ...] | None = None) -> None:
        if baseline not in BASELINES:
            raise ConfigError("validate", "pair_baseline", f"expected one of {BASELINES}, got {baseline!r}")
        if baseline == "fit" and profile is None:
            raise ConfigError("validate", "pair_baseline", "'fit' needs the profile that prices the cells")
        self.target, self.proxy, self.ex = target, proxy, ex
        self.warmup, self.reps = warmup, reps
        self.spread = None if spread is None else tuple(float(x) for x in spread)   # the cells' context spread
        self.profile, self.baseline_kind = profile, baseline
        self.live = live                         # LiveDrafters: cells are live steps (measure --live)
        self.tables: dict[str, dict[str, Any]] = {}
        for drafter, c in cells.items():
            rows = np.asarray(c["rows"], float).reshape(-1, 5)
            if len(rows) == 0:
                continue
            K = int(c["K"])
            self.tables[drafter] = {"K": K, "rows": rows, "n": np.unique(rows[:, 0]).astype(int),
                                    "price": None if profile is None else cell_prices(profile, rows, K, drafter)}
        # prefill-only cells (metadata.prefill_cells): rows [chunk, k, prefix, median s, KV read] per drafter
        self.prefill: dict[str, dict[str, Any]] = {}
        for drafter, c in (prefill_cells or {}).items():
            rows = np.asarray(c["rows"], float).reshape(-1, 5)
            if len(rows):
                self.prefill[drafter] = {"rows": rows, "price": None if profile is None else
                                         prefill_cell_prices(profile, rows, drafter)}
        self._engines: dict[tuple, list] = {}

    @classmethod
    def from_profile(cls, prof: dict[str, Any], target, proxy, ex, baseline: str = "fit",
                     live=None) -> "PairedCells | None":
        """From a measured profile dict (``metadata.cells``, written by `dsparksim measure`); None without them.
        ``live``: the trained drafters (:class:`~.measure.LiveDrafters`) when the profile was measured on live
        steps (its ``metadata.drafting`` is ``live:...``); a proxy-measured profile's cells need ``live=None``."""
        from dsparksim.cost.profile import profile_from_dict
        meta = prof.get("metadata", {})
        cells, grid = meta.get("cells"), meta.get("grid") or {}
        if not cells:
            return None
        live_cells = str(meta.get("drafting", "proxy")).startswith("live:")
        if live_cells != (live is not None):
            raise ConfigError("validate", "metadata.drafting", f"the profile's cells were measured on "
                              f"{'live' if live_cells else 'drafter-proxy'} steps ({meta.get('drafting', 'proxy')!r})"
                              f" but the pairing was asked for {'live' if live is not None else 'proxy'} steps")
        missing = sorted(set(cells) - set(live.drafters)) if live is not None else []
        if missing:
            raise ConfigError("validate", "metadata.cells", f"the profile has live cells of {missing} but the "
                              f"loaded drafters are {sorted(live.drafters)}")
        return cls(target, proxy, ex, cells, int(grid.get("warmup", 2)), int(grid.get("reps", 5)),
                   profile=profile_from_dict(prof), baseline=baseline, live=live,
                   prefill_cells=meta.get("prefill_cells"), spread=grid.get("context_spread"))

    def match(self, drafter: str, n: int, L: float, ctx: float) -> tuple | None:
        """(drafter, n, ctx, L) of the stored cell nearest a decode step of ``n`` requests with mean verify length
        ``L`` and mean context ``ctx``, or None when the profile has no cells for this drafter."""
        tab = self.tables.get(drafter)
        if tab is None or n < 1:
            return None
        rows = tab["rows"]
        nn = int(tab["n"][np.argmin(np.abs(tab["n"] - n))])
        Li = int(np.clip(np.rint(L), 0, tab["K"]))
        sel = rows[(rows[:, 0] == nn) & (rows[:, 2] == Li)]
        if len(sel) == 0:
            return None
        r = sel[np.argmin(np.abs(sel[:, 4] - ctx))]
        return drafter, nn, int(r[1]), Li

    def _index(self, key: tuple) -> int:
        drafter, n, c, L = key
        rows = self.tables[drafter]["rows"]
        return int(np.flatnonzero((rows[:, 0] == n) & (rows[:, 1] == c) & (rows[:, 2] == L))[0])

    def cell_median(self, key: tuple) -> float:
        """The cell's median step time when the profile was measured."""
        return float(self.tables[key[0]]["rows"][self._index(key), 3])

    def fit_price(self, key: tuple) -> float:
        """The profile's price of the cell's shape (n requests at verify length L, the cell's mean context), term by
        term as :func:`~.residuals.model_terms` prices a logged step."""
        return float(self.tables[key[0]]["price"][self._index(key)])

    def baseline(self, key: tuple) -> float:
        """The cell's reference time: the profile's price of its shape (``baseline="fit"``) or its raw median."""
        return self.fit_price(key) if self.baseline_kind == "fit" else self.cell_median(key)

    def time(self, key: tuple) -> float | None:
        """One step of the matched cell's profiling engine at verify length L (seconds on the executor's clock);
        None for the untimed warm-up steps of a freshly built engine. An engine lives as long as a profile cell
        did ((warmup + reps) rounds of every L), so its contexts stay in the range the profile timed."""
        from dsparksim.runner.timing import RejectAll, UniformL, PLACEHOLDER_PROFILE, cell_executor, profiling_engine
        from dsparksim.runner.grid import slot_tokens
        from dsparksim.cost.profile import profile_from_dict
        drafter, n, c, L = key
        K = self.tables[drafter]["K"]
        nL = K + 1
        ek = (drafter, n, c)
        e = self._engines.get(ek)
        if e is None:
            T = slot_tokens(c, K, self.warmup, self.reps, nL, self.spread)
            # live: the live step exactly as measure --live timed it
            exe = cell_executor(self.target, self.proxy, self.ex, T, n, drafter, self.live)
            pol = UniformL()
            pol.reset(K, np.random.default_rng(0))
            st = profiling_engine(exe, n=n, ctx=c, out_len=nL * (self.warmup + self.reps) + 6, T=T, K=K,
                                  drafter=drafter, policy=pol, acceptance=RejectAll(K, drafter),
                                  profile=profile_from_dict(PLACEHOLDER_PROFILE), max_batched_tokens=n * (K + 1) + n * c,
                                  prefill_chunk_tokens=n * c, live=self.live is not None,
                                  rng=np.random.default_rng(0), spread=self.spread)
            e = self._engines[ek] = [st, pol, 0.0, 0]
        st, pol = e[0], e[1]
        pol.L = L
        step = st.step(e[2])
        if step is None:                       # cannot happen within the engine's lifetime; rebuild next time
            del self._engines[ek]
            return None
        _, (out,), e[2] = step
        e[3] += 1
        if e[3] >= nL * (self.warmup + self.reps):
            del self._engines[ek]
        if e[3] <= 2:                          # a fresh engine's first steps pay one-off allocation costs
            return None
        return float(out.duration_s)

    def prefill_weight(self, key: tuple, step_price: float, base_d: float, base_p: float) -> float:
        """The prefill cell's weight in a mixed step's factor: 1 - (the profile's price of the step's decode part,
        the cell shape ``key``) / (its price of the whole step), in [0, 1]; without a profile, the two references'
        shares."""
        if self.profile is None or not step_price > 0:
            return base_p / (base_d + base_p)
        return float(np.clip(1.0 - self.fit_price(key) / step_price, 0.0, 1.0))

    # ---------------------------------------------------------------- prefill-only steps
    def match_prefill(self, drafter: str, tokens: int, chunks: int, qk: float) -> tuple | None:
        """("prefill", drafter, chunk, k, prefix) of the stored prefill-only cell nearest a prefill-only step of
        ``chunks`` chunks, ``tokens`` prompt tokens and ``qk`` query-key pairs (nearest chunk length, chunk count
        and cached prefix, the prefix estimated from the query-key pairs); None without prefill cells."""
        tab = self.prefill.get(drafter)
        if tab is None or chunks < 1 or tokens < 1:
            return None
        rows = tab["rows"]
        c = tokens / chunks
        pre = max(0.0, qk / tokens - (c + 1) / 2)          # qk = sum c_i s_i + c_i (c_i + 1) / 2
        d = (np.abs(np.log(rows[:, 0] / c)) + np.abs(rows[:, 1] - chunks)
             + np.abs(np.log((rows[:, 2] + 32) / (pre + 32))))
        r = rows[int(np.argmin(d))]
        return "prefill", drafter, int(r[0]), int(r[1]), int(r[2])

    def _prefill_index(self, key: tuple) -> int:
        _, drafter, c, k, pre = key
        rows = self.prefill[drafter]["rows"]
        return int(np.flatnonzero((rows[:, 0] == c) & (rows[:, 1] == k) & (rows[:, 2] == pre))[0])

    def prefill_baseline(self, key: tuple) -> float:
        """A prefill-only cell's reference time: the profile's price of its shape (``"fit"``) or its raw median."""
        tab, i = self.prefill[key[1]], self._prefill_index(key)
        return float(tab["price"][i] if self.baseline_kind == "fit" else tab["rows"][i, 3])

    def time_prefill(self, key: tuple) -> float | None:
        """One prefill-only step of the matched cell (k chunks of c prompt tokens after ``prefix`` cached ones, as
        ``measure`` timed it) on the executor's clock; None for the first steps of a freshly built executor. The
        executor is kept: every call re-runs the same chunks over the same positions."""
        from dsparksim.runner.timing import cell_executor
        _, drafter, c, k, pre = key
        e = self._engines.get(key)
        none = np.zeros(0, np.int64)
        if e is None:
            T = pre + c + 8
            exe = cell_executor(self.target, self.proxy, self.ex, T, k, drafter, self.live)
            for r in range(k):
                exe.start_request(r, r, pre + c, "chat")
            if pre:
                exe.run_step(none, none, none, none, 1, [(r, r, 0, pre) for r in range(k)])
            e = self._engines[key] = [exe, 0]
        exe = e[0]
        t0 = exe.clock()
        exe.run_step(none, none, none, none, 1, [(r, r, pre, c) for r in range(k)])
        dt = exe.clock() - t0
        e[1] += 1
        return None if e[1] <= 2 else float(dt)


def _mixed_factor(r: tuple) -> float:
    """A mixed pair's factor (a ``RunPairs.mx_log`` row): the decode and prefill cells' factors blended by the
    prefill weight."""
    w = r[12]
    return (1.0 - w) * r[5] / r[6] + w * r[10] / r[11]


def prefill_cell_prices(profile: CostProfile, rows: np.ndarray, drafter: str) -> np.ndarray:
    """(len(rows),) the profile's price of each stored prefill-only cell (k chunks of c tokens after ``prefix``
    cached ones, its KV read): the parts of :meth:`CostProfile.price` but the step overhead (no host loop: the cell
    times the executor's step) -- its ``prefill.only`` price, else the verify term at the chunks' M and KV read
    plus the prefill terms beside no decoding request."""
    c, k, pre = (rows[:, i].astype(np.int64) for i in range(3))
    shape = StepShape(M=c * k, kv_read=rows[:, 4], prefill_tokens=c * k,
                      prefill_qk=k * chunk_query_keys(c, pre), prefill_chunks=k, n_decode=np.zeros_like(c),
                      decode_qk=np.zeros_like(c), drafter=drafter, K=1)
    p = profile.price(shape)
    return np.asarray((p.verify + p.context) + ((p.prefill + p.prefill_chunk) + p.prefill_drafter), float)


def cell_prices(profile: CostProfile, rows: np.ndarray, K: int, drafter: str) -> np.ndarray:
    """(len(rows),) the profile's price of each stored cell's shape: n requests at verify length L reading the
    cell's mean context each (the query-key count as the engine logs it for decoding rows)."""
    n, L, ctx = rows[:, 0].astype(np.int64), rows[:, 2].astype(np.int64), rows[:, 4]
    zero = np.zeros(len(n), np.int64)
    shape = StepShape(M=n * (L + 1), n_decode=n, kv_read=np.rint(n * ctx).astype(np.int64), prefill_tokens=zero,
                      prefill_qk=zero, prefill_chunks=zero, decode_qk=n * decode_query_keys(L, ctx),
                      drafter=drafter, K=K)
    return np.asarray(profile.price(shape).parts_sum(), float)


class RunPairs:
    """One real run's paired timings: :meth:`after_step` (the real engine's hook, off the measured clock) times
    the matched cell after every step with decoding requests; :meth:`factors` gives every step its smoothed factor."""

    def __init__(self, cells: PairedCells, drafter: str, span: int = 4) -> None:
        if span < 0:
            raise ConfigError("validate", "pair_span", f"must be >= 0, got {span}")
        self.cells, self.drafter, self.span = cells, drafter, span
        self.log: list[tuple] = []               # (step, drafter, n, ctx, L, cell time now, baseline) per pair
        self.pf_log: list[tuple] = []            # (step, drafter, chunk, k, prefix, cell time now, baseline)
        self.pf_steps: list[int] = []            # every prefill-only step with a matched cell (timed or warm-up)
        # mixed steps (decoding requests + chunks): (step, drafter, n, ctx, L, decode cell now, its baseline,
        # chunk, k, prefix, prefill cell now, its baseline, the prefill cell's weight)
        self.mx_log: list[tuple] = []
        self.mx_steps: list[int] = []

    def after_step(self, i: int, plan) -> None:
        n, pf = plan.n_decode, plan.prefill
        pkey = None
        if pf:
            pkey = self.cells.match_prefill(self.drafter, plan.n_prefill, len(pf), plan.prefill_qk)
        if n == 0:
            # a prefill-only step is paired with the nearest prefill-only cell: on this VM a slow spell slowed
            # ~1k-context decode steps 20-44% while the prefill-only steps between them ran at the profile's
            # speed (2026-12-02, c1k runs: raw / priced 0.85-1.05 beside decode factors up to 1.43), so a
            # decode cell's factor over-corrects them; without prefill cells it takes a neighbour's factor
            if pkey is None:
                return
            self.pf_steps.append(int(i))
            t = self.cells.time_prefill(pkey)
            if t is not None:
                self.pf_log.append((int(i), *pkey[1:], t, self.cells.prefill_baseline(pkey)))
            return
        # the decode part: its requests' own context (kv_read also counts the chunks' prefixes and tokens)
        ctx = max(1.0, (plan.kv_read - sum(int(c[2]) + int(c[3]) for c in pf)) / n)
        key = self.cells.match(self.drafter, n, float(np.mean(plan.verify)), ctx)
        if key is None:
            return
        if pkey is not None:
            self.mx_steps.append(int(i))
        t = self.cells.time(key)
        if t is None:
            return
        self.log.append((int(i), *key, t, self.cells.baseline(key)))
        if pkey is not None:
            # a mixed step: also its prefill part's cell. The step's factor blends the two cells' factors, the
            # prefill one weighted by the share of the step's price beyond its decode part (the decode cell's
            # factor alone over-corrected mixed steps at ~1k contexts, where they were 96% of an 8-user run's
            # time: raw / priced 0.92 beside a factor of 0.75; weighting the prefill cell by its whole step time
            # over-weighted short chunks: mixed-step |error| over four validations 6.6% decode factor, 4.7% summed
            # times, 3.6% this blend)
            tp = self.cells.time_prefill(pkey)
            if tp is not None:
                bd, bp = self.cells.baseline(key), self.cells.prefill_baseline(pkey)
                w = self.cells.prefill_weight(key, float(plan.predicted_s), bd, bp)
                self.mx_log.append((int(i), *key, t, bd, *pkey[2:], tp, bp, w))

    @property
    def idx(self) -> list[int]:
        """The paired steps' indices."""
        return [r[0] for r in self.log]

    @property
    def f(self) -> list[float]:
        """Each paired step's raw factor: the cell's time now over its baseline."""
        return [r[5] / r[6] for r in self.log]

    @property
    def median_over_fit(self) -> list[float]:
        """The other baseline's view, per pair: the cell's raw median over the fit's price (empty without a
        profile)."""
        if self.cells.profile is None:
            return []
        return [self.cells.cell_median(r[1:5]) / self.cells.fit_price(r[1:5]) for r in self.log]

    def table(self):
        """The run's pairs as a DataFrame (``paired.csv``): step, cell (drafter, n_req, ctx, L), its time now, its
        baseline and the raw factor."""
        import pandas as pd
        df = pd.DataFrame(self.log, columns=["step", "drafter", "n_req", "ctx", "L", "cell_s", "baseline_s"])
        df["factor"] = df["cell_s"] / df["baseline_s"]
        return df

    def prefill_table(self):
        """The run's prefill-only pairs as a DataFrame (``paired_prefill.csv``): step, cell (drafter, chunk, k,
        prefix), its time now, its baseline and the raw factor."""
        import pandas as pd
        df = pd.DataFrame(self.pf_log, columns=["step", "drafter", "chunk", "k", "prefix", "cell_s", "baseline_s"])
        df["factor"] = df["cell_s"] / df["baseline_s"]
        return df

    def mixed_table(self):
        """The run's mixed-step pairs as a DataFrame (``paired_mixed.csv``): step, decode cell (drafter, n_req, ctx,
        L) and prefill cell (chunk, k, prefix), each one's time now and baseline, and the step's factor."""
        import pandas as pd
        df = pd.DataFrame(self.mx_log, columns=["step", "drafter", "n_req", "ctx", "L", "cell_s", "baseline_s",
                                                "chunk", "k", "prefix", "prefill_s", "prefill_baseline_s",
                                                "w_prefill"])
        df["factor"] = [_mixed_factor(r) for r in self.mx_log]
        return df

    def factors(self, n_steps: int) -> np.ndarray | None:
        """(n_steps,) factor per step: the median over each paired step and its ``span`` paired neighbours each
        side; unpaired steps take the nearest paired step's. Prefill-only steps take the same from the
        prefill-only pairs, and mixed steps from the mixed pairs, when there are any. None when no decode step was
        paired."""
        f = smooth_factors(np.asarray(self.idx, int), np.asarray(self.f, float), n_steps, self.span)
        if f is None:
            return f
        for log, steps, fac in ((self.pf_log, self.pf_steps, lambda r: r[5] / r[6]),
                                (self.mx_log, self.mx_steps, _mixed_factor)):
            if log:
                fs = smooth_factors(np.array([r[0] for r in log], int), np.array([fac(r) for r in log]), n_steps,
                                    self.span)
                st = np.array(steps, int)
                f[st] = fs[st]
        return f


def smooth_factors(idx: np.ndarray, f: np.ndarray, n_steps: int, span: int) -> np.ndarray | None:
    """Per-step factors from factors measured at steps ``idx`` (increasing): a running median over 2*span + 1
    measured steps, carried to every step from the nearest measured one (ties: the earlier)."""
    if len(idx) == 0:
        return None
    if np.any(np.diff(idx) <= 0) or idx[0] < 0 or idx[-1] >= n_steps:
        raise ValueError(f"paired step indices must increase within 0..{n_steps - 1}, got {idx.tolist()[:10]}...")
    if not np.all(f > 0):
        raise ValueError(f"paired factors must be positive, got min {f.min()}")
    m = len(f)
    sm = np.array([np.median(f[max(0, j - span):j + span + 1]) for j in range(m)])
    steps = np.arange(n_steps)
    pos = np.clip(np.searchsorted(idx, steps), 0, m - 1)
    prev = np.clip(pos - 1, 0, m - 1)
    nearest = np.where(np.abs(idx[prev] - steps) <= np.abs(idx[pos] - steps), prev, pos)
    return sm[nearest]


def fit_vs_cells(cells: PairedCells) -> dict[str, dict[str, float]]:
    """The profile's fit at its own cells: per drafter, the fit's price of each stored cell over the cell's raw
    median, minus 1 (median, median |.|, 95th percentile |.|): how far the profile's level is from its raw
    measurements (noise of 5-step medians on a drifting machine, plus what the fit's form cannot follow)."""
    out = {}
    for drafter, tab in cells.tables.items():
        e = tab["price"] / tab["rows"][:, 3] - 1.0
        out[drafter] = {"cells": int(len(e)), "median_err": float(np.median(e)),
                        "median_abs_err": float(np.median(np.abs(e))),
                        "p95_abs_err": float(np.quantile(np.abs(e), 0.95))}
    return out
