"""Bounded least squares of the calibration on measured runs, with identifiability, bootstrap and LOCO.

Objective: the residual of run r and metric m is ``log(simulated / measured)``; the metrics are the client's
mean TPOT (median where the run publishes no mean), mean TTFT (median likewise) and output tokens/s per GPU,
weighted equally. Parameters are the log of each family scale and of the fixed overhead (bounds in
:data:`BOUNDS`).

Identifiability rule (Brun, Reichert & Kuensch 2001, Water Resources Research 37(4), "Practical identifiability
analysis of large environmental simulation models"), judged on the Jacobian J of the residuals with respect to the
log parameters at the builder's values, then again at the fitted values (once):

* a family that prices nothing for this deployment (e.g. ``moe`` of a dense model) is unidentified (zero);
* sensitivity ``delta_j = ||J_j|| / sqrt(n)`` (rms change of the log metrics per unit change of log theta_j):
  below :data:`DELTA_MIN` the runs cannot see the parameter (flat);
* in decreasing order of sensitivity, a parameter joins the fitted set only if the collinearity index of the set,
  ``1 / sigma_min`` of its unit-normalised Jacobian columns, stays <= :data:`GAMMA_MAX`; otherwise another
  parameter can compensate its change to within 1/GAMMA_MAX and it is unidentified (collinear).

Unidentified parameters are held at the builder's value and reported as such, never fitted.

``request_latency_s`` (outside the step loop) is 0 in a built profile; a log parameter has no sensitivity at 0, so
it is judged, and its fit started, at :data:`LATENCY_START` (and held at 0 when unidentified).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
from scipy.optimize import least_squares

from dsparksim.fit.reprice import PARAMS, LinearRun, PriceBasis
from dsparksim.fit.runs import METRIC_CHOICES, FitRun

__all__ = ["FitProblem", "FitResult", "fit_problem", "judge", "bootstrap", "loco", "DELTA_MIN", "GAMMA_MAX",
           "BOUNDS"]

DELTA_MIN = 0.01     # rms change of log metrics per e-fold of the parameter: 1% (run-to-run noise is 0.2-1%)
GAMMA_MAX = 10.0     # collinearity index threshold (Brun et al. 2001 use 10-15)
BOUNDS = {"scale": (0.2, 5.0), "fixed_overhead_s": (1e-5, 0.02), "request_latency_s": (1e-4, 0.5)}
JAC_STEP = 1e-4      # central differences in log parameter
LATENCY_START = 0.02  # s: where request_latency_s is judged and its fit starts (HTTP + tokenization, order of)
_LAT = PARAMS.index("request_latency_s")


def param_bounds(name: str) -> tuple[float, float]:
    """(low, high) bounds of parameter ``name``: the fixed overhead's, the request latency's, or every family
    scale's."""
    return BOUNDS.get(name, BOUNDS["scale"])


def _judge_point(coef: np.ndarray) -> np.ndarray:
    """``coef`` with a zero request latency replaced by :data:`LATENCY_START` (see the module doc)."""
    c = coef.copy()
    if c[_LAT] <= 0:
        c[_LAT] = LATENCY_START
    return c


@dataclass
class FitProblem:
    """The runs (as linear maps) and their measured targets."""

    basis: PriceBasis
    runs: list[FitRun]
    lin: list[LinearRun]
    targets: list[tuple[int, str, float]] = field(default_factory=list)   # (run index, metric, measured)

    def __post_init__(self) -> None:
        if not self.targets:
            for i, r in enumerate(self.runs):
                for kind, names in METRIC_CHOICES.items():
                    for n in names:
                        if n in r.measured:
                            self.targets.append((i, n, r.measured[n]))
                            break

    @property
    def builder_coef(self) -> np.ndarray:
        return np.array([1.0] * (len(PARAMS) - 2) + [self.basis.fixed_overhead_s, 0.0])

    def subset(self, idx: Sequence[int]) -> "FitProblem":
        """The problem over runs ``idx`` (repeats allowed: bootstrap)."""
        idx = list(idx)
        return FitProblem(self.basis, [self.runs[i] for i in idx], [self.lin[i] for i in idx])

    def simulated(self, coef: np.ndarray) -> np.ndarray:
        return np.array([self.lin[i].metric(m, coef) for i, m, _ in self.targets])

    def residuals(self, coef: np.ndarray) -> np.ndarray:
        meas = np.array([v for _, _, v in self.targets])
        return np.log(self.simulated(coef) / meas)

    def jacobian(self, coef: np.ndarray, names: Sequence[str]) -> np.ndarray:
        """d residuals / d log(param) for ``names`` (central differences)."""
        J = np.empty((len(self.targets), len(names)))
        for j, n in enumerate(names):
            k = PARAMS.index(n)
            up, dn = coef.copy(), coef.copy()
            up[k] *= math.exp(JAC_STEP)
            dn[k] *= math.exp(-JAC_STEP)
            J[:, j] = (self.residuals(up) - self.residuals(dn)) / (2 * JAC_STEP)
        return J


@dataclass
class FitResult:
    coef: np.ndarray
    fitted: list[str]
    status: dict[str, dict[str, Any]]       # per parameter: status, reason, sensitivity
    residuals: np.ndarray
    passes: int = 1


def judge(prob: FitProblem, coef: np.ndarray) -> tuple[list[str], dict[str, dict[str, Any]]]:
    """(identified parameters, status per parameter) at ``coef`` by the module's rule."""
    zero = set(prob.basis.zero_families())
    cand = [p for p in PARAMS if p not in zero]
    J = prob.jacobian(coef, cand)
    n = max(J.shape[0], 1)
    delta = {p: float(np.linalg.norm(J[:, j]) / math.sqrt(n)) for j, p in enumerate(cand)}
    status: dict[str, dict[str, Any]] = {p: {"status": "unidentified", "reason": "zero: this family prices nothing "
                                             "for this deployment", "sensitivity": 0.0} for p in PARAMS if p in zero}
    chosen: list[int] = []
    for j in sorted(range(len(cand)), key=lambda j: -delta[cand[j]]):
        p = cand[j]
        st = {"sensitivity": round(delta[p], 6)}
        if delta[p] < DELTA_MIN:
            status[p] = {**st, "status": "unidentified",
                         "reason": f"flat: sensitivity {delta[p]:.2g} < {DELTA_MIN} (the runs barely see it)"}
            continue
        trial = chosen + [j]
        Jn = J[:, trial] / np.linalg.norm(J[:, trial], axis=0)
        sv = np.linalg.svd(Jn, compute_uv=False)
        gamma = float(1.0 / sv[-1]) if sv[-1] > 0 else math.inf
        if gamma <= GAMMA_MAX:
            chosen = trial
            status[p] = {**st, "status": "fitted", "collinearity_index": round(gamma, 3)}
        else:
            # name the chosen parameters that compensate it: the largest weights of the smallest singular vector
            _, _, vt = np.linalg.svd(Jn)
            w = np.abs(vt[-1])
            partners = [cand[trial[i]] for i in np.argsort(-w) if trial[i] != j and w[i] > 0.2]
            status[p] = {**st, "status": "unidentified", "collinearity_index": round(gamma, 3),
                         "reason": f"collinear: with {', '.join(partners) or 'the fitted set'} the collinearity "
                                   f"index is {gamma:.3g} > {GAMMA_MAX:g}"}
    return [p for p in PARAMS if status[p]["status"] == "fitted"], status


def _solve(prob: FitProblem, names: Sequence[str], start: np.ndarray, hold: np.ndarray) -> np.ndarray:
    """Least squares over log(names), the other coefficients at ``hold``."""
    coef = hold.copy()
    if not names:
        return coef
    ks = [PARAMS.index(n) for n in names]
    lo = np.log([param_bounds(n)[0] for n in names])
    hi = np.log([param_bounds(n)[1] for n in names])
    x0 = np.clip(np.log(start[ks]), lo + 1e-9, hi - 1e-9)

    def f(x: np.ndarray) -> np.ndarray:
        c = coef.copy()
        c[ks] = np.exp(x)
        return prob.residuals(c)
    sol = least_squares(f, x0, bounds=(lo, hi), method="trf", x_scale=1.0, xtol=1e-10, ftol=1e-10, gtol=1e-10)
    coef[ks] = np.exp(sol.x)
    return coef


def fit_problem(prob: FitProblem) -> FitResult:
    """Judge identifiability at the builder's values, fit the identified set, judge again at the fit: a parameter
    is fitted only if identified at both (else it is held at the builder's value, reported as unstable)."""
    base = prob.builder_coef
    start = _judge_point(base)
    names1, status1 = judge(prob, start)
    coef = _solve(prob, names1, start, base)
    names2, status = judge(prob, _judge_point(coef))
    passes = 1
    if names2 != names1:
        passes = 2
        names = [p for p in PARAMS if p in names1 and p in names2]
        for p in PARAMS:
            if p not in names and (p in names1 or p in names2):
                status[p] = {**status[p], "status": "unidentified",
                             "reason": "unstable: identified at only one of the builder's and the fitted values"}
        coef = _solve(prob, names, start, base)
    else:
        names = names1
    for p in PARAMS:
        if p not in names:
            coef[PARAMS.index(p)] = base[PARAMS.index(p)]
    return FitResult(coef=coef, fitted=names, status=status, residuals=prob.residuals(coef), passes=passes)


def bootstrap(prob: FitProblem, res: FitResult, n: int, seed: int,
              progress: Callable[[int], None] | None = None) -> np.ndarray:
    """(n, len(PARAMS)) coefficients refitted on runs resampled with replacement (the fitted set kept)."""
    rng = np.random.default_rng(seed)
    out = np.empty((n, len(PARAMS)))
    for b in range(n):
        idx = rng.integers(0, len(prob.runs), size=len(prob.runs))
        sub = prob.subset(idx)
        keep = {m for _, m, _ in prob.targets}
        sub.targets = [t for t in sub.targets if t[1] in keep]
        out[b] = _solve(sub, res.fitted, res.coef, res.coef)
        if progress:
            progress(1)
    return out


def loco(prob: FitProblem, progress: Callable[[int], None] | None = None,
         report: Sequence[tuple[int, str, float]] | None = None) -> list[dict[str, Any]]:
    """Leave one concurrency out: the whole fit (identifiability included) on the other concurrencies, then the
    held-out runs' relative errors (simulated / measured - 1) per metric (of ``report``, default the fitted
    targets)."""
    conc = sorted({r.concurrency for r in prob.runs})
    rows: list[dict[str, Any]] = []
    if len(conc) < 2:
        return rows
    for c in conc:
        train = [i for i, r in enumerate(prob.runs) if r.concurrency != c]
        test = [i for i, r in enumerate(prob.runs) if r.concurrency == c]
        sub = prob.subset(train)
        keep = {m for _, m, _ in prob.targets}
        sub.targets = [t for t in sub.targets if t[1] in keep]
        res = fit_problem(sub)
        for i in test:
            for j, m, v in (prob.targets if report is None else report):
                if j == i:
                    rows.append({"run_id": prob.runs[i].run_id, "concurrency": c, "metric": m,
                                 "measured": v, "predicted": prob.lin[i].metric(m, res.coef),
                                 "fitted": ",".join(res.fitted)})
        if progress:
            progress(1)
    for r in rows:
        r["rel_error"] = r["predicted"] / r["measured"] - 1.0
    return rows
