"""Exact, vectorised re-pricing of a traced run for any calibration of the builder's profile.

A calibrated profile prices step i as ``sum_k coef_k * X[i, k]`` (:mod:`dsparksim.cost.analytic.calibration`):
the verify families' tables at the step's M (floor lookup on the builder's grid), the attention term
(``kv_read`` KV tokens + the decoding rows' query-key pairs), the prefill query-key term and 1 (the fixed
overhead), with ``coef = (s_dense, s_moe, s_comm, s_floor, s_attention, s_prefill, fixed_overhead_s,
request_latency_s)``; each column is the price parts (:meth:`CostProfile.price`) of a profile that prices only that
coefficient, at 1 (:meth:`PriceBasis.unit_profile`). Step end times are then ``cumsum(X) @ coef``, so every request
time, and every mean over requests, is linear in ``coef``; the request latency (outside the step loop: no step
column) adds 1 x its coefficient to every TTFT, E2E and the duration, as the benchmark client's view does
(:func:`dsparksim.bench.client.client_run`). :class:`LinearRun` precomputes those maps once per trace and a metric
costs microseconds.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dsparksim.cost.price import StepShape
from dsparksim.cost.profile import CostProfile
from dsparksim.cost.analytic.calibration import FAMILIES, VERIFY_FAMILIES, Calibration, family_tables
from dsparksim.fit.trace import Trace
from dsparksim.cost.analytic.builder import build_forward_model, FIXED_OVERHEAD_S, M_GRID

__all__ = ["PARAMS", "PARAM_PARTS", "PriceBasis", "LinearRun", "coef_of"]

PARAMS = FAMILIES + ("fixed_overhead_s", "request_latency_s")
LATENCY = PARAMS.index("request_latency_s")
# The price parts (dsparksim.cost.price.StepPrice) each coefficient scales (request_latency_s: none, it is outside
# the step loop)
PARAM_PARTS = {**{f: ("verify",) for f in VERIFY_FAMILIES}, "attention": ("context", "query_key"),
               "prefill": ("prefill",), "fixed_overhead_s": ("overhead",), "request_latency_s": ()}


@dataclass(frozen=True)
class PriceBasis:
    """The builder's uncalibrated per-family prices of one deployment (what the calibration multiplies)."""

    M: np.ndarray                      # verify grid (floor lookup)
    tables: dict[str, np.ndarray]      # VERIFY_FAMILIES -> seconds over M
    kv_token_s: float                  # attention: seconds per KV token read
    query_kv_s: float                  # attention: seconds per decode query-key pair
    prefill_qk_s: float                # prefill: seconds per prompt query-key pair
    fixed_overhead_s: float            # the builder's fixed overhead

    @classmethod
    def build(cls, model: str | Path, gpu: str, tp: int = 1, ep: int = 1, dp: int = 1,
              dtype: str | None = None, kv_dtype: str | None = None) -> "PriceBasis":
        fm = build_forward_model(model, gpu, tp=tp, ep=ep, dp=dp, dtype=dtype, kv_dtype=kv_dtype)
        return cls(M=np.asarray(M_GRID), tables=family_tables(fm, M_GRID), kv_token_s=fm.seconds_per_kv_token(),
                   query_kv_s=fm.seconds_per_query_key(), prefill_qk_s=fm.seconds_per_query_key(),
                   fixed_overhead_s=FIXED_OVERHEAD_S)

    def zero_families(self) -> list[str]:
        """Families that price nothing for this deployment (e.g. ``moe`` of a dense model)."""
        z = [f for f in VERIFY_FAMILIES if not np.any(self.tables[f])]
        if self.kv_token_s == 0 and self.query_kv_s == 0:
            z.append("attention")
        if self.prefill_qk_s == 0:
            z.append("prefill")
        return z

    def unit_profile(self, param: str) -> CostProfile:
        """The profile that prices one coefficient of :data:`PARAMS` at 1 and every other at 0 (a unit
        calibration): its price parts :data:`PARAM_PARTS` are that coefficient's feature."""
        zero = np.zeros(len(self.M))
        kw: dict[str, Any] = {}
        if param in VERIFY_FAMILIES:
            kw["verify_time_s"] = np.asarray(self.tables[param], float)
        elif param == "attention":
            kw.update(seconds_per_kv_token=float(self.kv_token_s), seconds_per_query_kv=float(self.query_kv_s))
        elif param == "prefill":
            kw.update(prefill_s_per_query_key=float(self.prefill_qk_s), prefill_note="")
        elif param == "fixed_overhead_s":
            kw["fixed_overhead_s"] = 1.0
        else:
            raise ValueError(f"unknown coefficient {param!r} (expected one of {', '.join(PARAMS)})")
        base = dict(name=f"unit-{param}", metadata={}, verify_M=np.asarray(self.M), verify_time_s=zero,
                    kv_tokens=None, seconds_per_kv_token=None, fixed_overhead_s=0.0, batch_overhead=None,
                    drafters={}, source="<fit basis>")
        return CostProfile(**(base | kw))

    def features(self, steps: dict[str, np.ndarray]) -> np.ndarray:
        """X (n_steps, len(PARAMS)): step i's seconds per unit of each coefficient -- the price parts
        (:meth:`CostProfile.price`) of the coefficient's unit profile (:meth:`unit_profile`)."""
        M = np.asarray(steps["M"], np.int64)
        ci = np.searchsorted(self.M, M, side="right") - 1
        if len(M) and (ci.min() < 0 or M.max() > self.M[-1]):
            raise ValueError(f"trace has M outside the profile grid [{self.M[0]}, {self.M[-1]}]")
        shape = StepShape.from_log(steps, None, 1)
        X = np.zeros((len(M), len(PARAMS)))
        for k, param in enumerate(PARAMS):
            parts = PARAM_PARTS[param]
            if not parts:                    # request_latency_s: no step column
                continue
            price = self.unit_profile(param).price(shape)
            x = getattr(price, parts[0])
            for part in parts[1:]:
                x = x + getattr(price, part)
            X[:, k] = x
        return X


def coef_of(cal: Calibration, basis: PriceBasis) -> np.ndarray:
    """The coefficient vector of a calibration (its fixed overhead, else the builder's; its request latency, else
    0)."""
    fixed = basis.fixed_overhead_s if cal.fixed_overhead_s is None else float(cal.fixed_overhead_s)
    return np.array([cal.scale(f) for f in FAMILIES] + [fixed, float(cal.request_latency_s or 0.0)])


class LinearRun:
    """One traced run reduced to linear maps from ``coef`` to its client metrics."""

    def __init__(self, trace: Trace, basis: PriceBasis | None):
        # basis None: the trace's own step durations (coef = [1]): the client metrics of a DES run as simulated,
        # e.g. a speculative run, whose shapes depend on prices and so cannot be re-priced
        X = basis.features(trace.steps) if basis is not None else np.asarray(trace.steps["dt"], float)[:, None]
        C = np.vstack([np.zeros((1, X.shape[1])), np.cumsum(X, axis=0)])   # C[i + 1] @ coef = end of step i
        a, f, e = trace.arrival_step + 1, trace.first_token_step + 1, trace.finish_step + 1
        self.trace = trace
        self.gpus = int(trace.spec.gpus)
        self.out_tokens = float(trace.output_len.sum())
        self.end = C                                           # step end times (row i+1), for exactness checks
        self.arrive = C[a]
        lat = np.zeros(X.shape[1])
        if basis is not None:                                  # the request latency: +1 x its coefficient
            lat[LATENCY] = 1.0
        # basis None: the run's own request latency (the profile's, as simulated) is a constant
        self.k = 0.0 if basis is not None else float(getattr(trace, "request_latency_s", 0.0))
        self.ttft = C[f] - C[a] + lat
        self.e2e = C[e] - C[a] + lat
        multi = trace.output_len > 1                           # the client's TPOT needs two tokens
        self.tpot = (C[e][multi] - C[f][multi]) / (trace.output_len[multi] - 1)[:, None]
        self.duration = C[-1] - C[trace.start_step + 1] + lat       # from the end of the warm-up
        self.mean = {"ttft": self.ttft.mean(axis=0), "tpot": self.tpot.mean(axis=0), "e2el": self.e2e.mean(axis=0)}

    def metric(self, name: str, coef: np.ndarray) -> float:
        """One client metric: ``mean_tpot_ms``, ``median_ttft_ms``, ``p99_e2el_ms``, ``output_throughput_per_gpu``..."""
        if name == "output_throughput_per_gpu":
            return self.out_tokens / (float(self.duration @ coef) + self.k) / self.gpus
        if name == "duration_s":
            return float(self.duration @ coef) + self.k
        stat, m, _ = name.split("_")
        k = 0.0 if m == "tpot" else self.k
        if stat == "mean":
            return (float(self.mean[m] @ coef) + k) * 1e3
        v = getattr(self, {"ttft": "ttft", "tpot": "tpot", "e2el": "e2e"}[m]) @ coef + k
        return float(np.median(v) if stat == "median" else np.percentile(v, 99)) * 1e3

    def metrics(self, coef: np.ndarray) -> dict[str, float]:
        names = [f"{s}_{m}_ms" for m in ("tpot", "ttft", "e2el") for s in ("mean", "median", "p99")]
        return {**{n: self.metric(n, coef) for n in names},
                "output_throughput_per_gpu": self.metric("output_throughput_per_gpu", coef),
                "duration_s": self.metric("duration_s", coef)}
