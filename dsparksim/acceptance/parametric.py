"""Parametric, paper-calibrated acceptance model (the default acceptance source).

Latent model, per request i, block b, position k (1..K)::

    u_i    ~ N(0, sigma_req^2)      persistent per request (easy vs hard prompts), drawn at start()
    z_ib   ~ N(0, sigma_block^2)    per block (easy vs hard stretches of one response)
    e_ibk  ~ N(0, sigma_tok^2)      per position
    x_ibk  = mu_k + lambda_k u_i + z_ib + e_ibk             difficulty score
    l_ibk  = offset + slope * x            if x <= 0        hard token
           = offset + jump + slope_easy * x  if x > 0       easy token
    p_ibk  = sigmoid(l_ibk)

lambda_k, the request shift's loading, moves linearly from req_load at position 1 to 1 at position 7 (flat after;
req_load = 1: one shift for every position). (issue 29: an easy/hard mixture whose easy share is position- and domain-dependent through mu_k and persistent
along a block through u + z; (offset, slope, jump, slope_easy) = (0, 1, 0, 1) is the single logit-normal used
before.) Outcome: given p, positions are accepted independently with probability p_ibk; the ground truth A is the
number of leading successes (0..K). ``mu_k`` is calibrated numerically (quadrature, left to right, see
:mod:`.calibration`) so that the model's conditional acceptance equals the target curve alpha_k in the
STEP-weighted measure: pooled over every verification step of long outputs, as DeepSpec's evaluator pools
acceptance lengths over all proposals (a request with shift u takes 1/tau(u) steps per token). Hence a long-output
fixed:K run has tau = 1 + sum_k prod_{j<=k} alpha_j. (``calibration="requests"``: one block per fresh request
reproduces the curve instead, the scheme before issue 11.)

Confidence (what the scheduler sees): the raw head reports ``logit(c_raw) = raw_gain * (l_ibk + n_ibk [+ m_ib])``
with ``n_ibk ~ N(0, noise_k^2)``, noise_k moving linearly from noise_sd (position 1) to noise_sd_end (position 7
on), and an optional block-level ``m_ib ~ N(0, noise_block^2)`` (0 by default: STS cannot calibrate it away).
By default (``confidence="sts"``) the simulator applies sequential temperature scaling itself: per-position
temperatures T_1..T_K fitted left to right on a fixed-seed sample of this model's raw confidences
(:func:`.confidence.fit_sts_nll`), so ``logit(c) = raw_gain * (l + n) / T_k``. ``confidence="raw"`` keeps the raw
head (over-confident; mean per-position ECE ~5.5%, the paper reports 3-8%). Acceptance draws are identical.

Defaults are data: dsparksim/data/acceptance_fit.json, written by scripts/fit_acceptance.py, which fits
sigma_req = sigma_block, sigma_tok, the link (offset, slope, jump, slope_easy), noise_sd and noise_sd_end
(Nelder-Mead, common random numbers, step-weighted) to the paper's Fig. 5 static-threshold ratios (t = 0.9 of math
and chat as issue 29's criteria) and Fig. 6 survival AUC by position together, then raw_gain to the raw ECE; see
:mod:`.fit`. The JSON carries the residual table. Known gaps: Fig. 6's AUC at position 3 (~0.06 high) and Fig. 5's
t = 0.5 / 0.7 ratios (a calibrated head cannot keep most verified slots there). Heterogeneity cannot be identified
from the published means alone: sigma_req = sigma_block and req_load = 1 are assumptions (fitting either, the
fit's --fit-share / --fit-load, runs to a weak request effect; docs/policies.md has the figures).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace
from functools import lru_cache
from importlib import resources
from typing import Any, Mapping, Sequence

import numpy as np

from dsparksim.errors import ConfigError
from dsparksim.acceptance.base import DOMAINS, AcceptanceModel, Block
from dsparksim.acceptance.calibration import (PLAIN, calibrate_mu, calibrate_mu_steps, check_curve, link,
                                              model_conditional, model_conditional_steps, request_loading,
                                              tau_of_curve)
from dsparksim.acceptance.confidence import fit_sts_nll
from dsparksim.acceptance.headshift import HeadShift
from dsparksim.acceptance.reference import K_MAX, MTP1_DEFAULT_SOURCE, mtp1_alpha, paper_curve
from dsparksim.sim.streams import KeyedRows, normals_from_halves

POOLED = "all"   # curve key meaning "every domain uses this curve"
NOISE_RAMP = 7   # positions over which the confidence noise moves from noise_sd to noise_sd_end (Fig. 6: 1..7)
CONFIDENCE_MODES = ("sts", "raw")
FIT_DATA = "acceptance_fit.json"
STS_BLOCKS = 8_000    # blocks per curve the simulator fits its STS temperatures on (fixed seed)
STS_SEED = 20_261_201


@lru_cache(maxsize=1)
def load_fit() -> dict:
    """The fitted parameters shipped in dsparksim/data/acceptance_fit.json (written by scripts/fit_acceptance.py)."""
    return json.loads(resources.files("dsparksim.data").joinpath(FIT_DATA).read_text(encoding="utf-8"))


def _fitted(name: str):
    return load_fit()["params"][name]


def sigmoid(x: np.ndarray) -> np.ndarray:
    """The logistic function 1 / (1 + exp(-x)), elementwise."""
    # plain numpy is ~2x faster than scipy's expit on small arrays (hot path); exp overflow -> inf -> 0 is exact
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


def _sigmoid_into(x: np.ndarray, out: np.ndarray) -> np.ndarray:
    """sigmoid(x) written into ``out`` (C-contiguous, may be x): the same operations, no temporaries."""
    with np.errstate(over="ignore"):
        np.negative(x, out=out)
        np.exp(out, out=out)
        np.add(1.0, out, out=out)
        return np.divide(1.0, out, out=out)


def _scaled_sigmoid_into(x: np.ndarray, out: np.ndarray, scale: float) -> np.ndarray:
    """scale / (1 + exp(-x)) written into ``out`` (:func:`_sigmoid_into`'s operations, ``scale`` as the
    numerator)."""
    with np.errstate(over="ignore"):
        np.negative(x, out=out)
        np.exp(out, out=out)
        np.add(1.0, out, out=out)
        return np.divide(scale, out, out=out)


def _link_into(x: np.ndarray, shape, spare: np.ndarray) -> np.ndarray:
    """:func:`.calibration.link` of ``x`` written into ``x``: the same numbers; ``spare``: an array of x's shape it
    may overwrite."""
    if tuple(shape) == PLAIN:
        return x
    offset, slope, jump, slope_easy = shape
    easy = np.multiply(x, slope_easy, out=spare)
    easy += offset + jump                    # offset + jump + slope_easy * x
    is_easy = x > 0
    x *= slope
    x += offset                              # offset + slope * x
    np.putmask(x, is_easy, easy)             # np.where(is_easy, easy, x), in place (faster than copyto's where=)
    return x


@dataclass(frozen=True)
class ParametricParams:
    """Heterogeneity (sigma_*), confidence-noise and calibration parameters, logit units.

    req_load: loading of the request shift u at position 1 (linear to 1 at position 7, flat after): < 1 means a
        request's difficulty shows less in the first positions of its blocks, which the text at hand dominates.
    noise_sd / noise_sd_end: confidence noise at position 1 / from position 7 on (linear in between; None = flat).
    noise_block: sd of a confidence-noise term shared by the positions of a block (the head misjudging a whole
        stretch of text; unlike the per-position noise it does not average out along the survival product).
    raw_gain: the raw (uncalibrated) head's logit is raw_gain * (x + noise): > 1 is over-confident.
    jump, slope, offset, slope_easy: the link from difficulty score x to acceptance logit: offset + slope * x for a
        hard token (x <= 0), offset + jump + slope_easy * x for an easy one (x > 0); (offset, slope, jump,
        slope_easy) = (0, 1, 0, 1) is the plain logit-normal model.
    temperature: an extra user-set divisor applied to the final logit (1 = none).
    Defaults: the fitted values in dsparksim/data/acceptance_fit.json (scripts/fit_acceptance.py).
    """

    sigma_req: float = field(default_factory=lambda: _fitted("sigma_req"))
    sigma_block: float = field(default_factory=lambda: _fitted("sigma_block"))
    req_load: float = field(default_factory=lambda: load_fit()["params"].get("req_load", 1.0))
    sigma_tok: float = field(default_factory=lambda: _fitted("sigma_tok"))
    noise_sd: float = field(default_factory=lambda: _fitted("noise_sd"))
    noise_sd_end: float | None = field(default_factory=lambda: _fitted("noise_sd_end"))
    raw_gain: float = field(default_factory=lambda: _fitted("raw_gain"))
    jump: float = field(default_factory=lambda: _fitted("jump"))
    slope: float = field(default_factory=lambda: _fitted("slope"))
    offset: float = field(default_factory=lambda: _fitted("offset"))
    slope_easy: float = field(default_factory=lambda: _fitted("slope_easy"))
    noise_block: float = field(default_factory=lambda: _fitted("noise_block"))
    temperature: float = 1.0

    def __post_init__(self) -> None:
        for f in fields(self):
            if f.name == "noise_sd_end" and self.noise_sd_end is None:
                continue
            _check_param(f.name, getattr(self, f.name), "acceptance params")
        _check_jump(self.jump, self.sigma_tok, "acceptance params")

    def noise_by_position(self, K: int) -> np.ndarray:
        """Confidence-noise sd at positions 1..K (linear from noise_sd at 1 to noise_sd_end at 7, flat after)."""
        end = self.noise_sd if self.noise_sd_end is None else self.noise_sd_end
        frac = np.minimum(np.arange(K), NOISE_RAMP - 1) / (NOISE_RAMP - 1)
        return self.noise_sd + (end - self.noise_sd) * frac

    def request_loading(self, K: int) -> np.ndarray:
        """Loading of the request shift at positions 1..K (:func:`.calibration.request_loading`)."""
        return request_loading(self.req_load, K)

    @property
    def shape(self) -> tuple[float, float, float, float]:
        """(offset, slope, jump, slope_easy) of the link (:func:`.calibration.link`)."""
        return (float(self.offset), float(self.slope), float(self.jump), float(self.slope_easy))

    @property
    def sigma_shared(self) -> float:
        """Standard deviation of the shift common to all positions of a block (request + block)."""
        return float(np.hypot(self.sigma_req, self.sigma_block))

    @classmethod
    def from_strings(cls, values: Mapping[str, str], source: str, base: "ParametricParams | None" = None):
        """Override fields from ``name=value`` strings (spec query parameters); unknown names are errors."""
        base = base or cls()
        names = {f.name for f in fields(cls)}
        upd = {}
        for k, v in values.items():
            if k not in names:
                raise ConfigError(source, k, f"unknown parameter; expected one of {sorted(names)}")
            try:
                upd[k] = float(v)
            except ValueError:
                raise ConfigError(source, k, f"expected a number, got {v!r}") from None
        for k, v in upd.items():
            _check_param(k, v, source)
        _check_jump(upd.get("jump", base.jump), upd.get("sigma_tok", base.sigma_tok), source)
        return replace(base, **upd)


def _check_param(name: str, v, source: str) -> None:
    if name == "offset":                  # the hard tokens' logit: any finite number
        if not isinstance(v, (int, float)) or not np.isfinite(v):
            raise ConfigError(source, name, f"must be a finite number, got {v!r}")
        return
    if not isinstance(v, (int, float)) or not np.isfinite(v) or v < 0:
        raise ConfigError(source, name, f"must be a finite number >= 0, got {v!r}")
    if name in ("temperature", "slope", "slope_easy") and v <= 0:
        raise ConfigError(source, name, f"must be > 0, got {v!r}")


MIN_SIGMA_TOK_JUMP = 0.05   # the easy/hard split needs token-level spread: with sigma_tok -> 0 the acceptance
                            # probability jumps with mu and a target between the two levels cannot be met exactly


def _check_jump(jump: float, sigma_tok: float, source: str) -> None:
    if jump > 0 and sigma_tok < MIN_SIGMA_TOK_JUMP:
        raise ConfigError(source, "sigma_tok", f"must be >= {MIN_SIGMA_TOK_JUMP} when jump > 0 (easy/hard mixture), "
                          f"got {sigma_tok!r}; set jump=0 for the plain logit-normal model")


@dataclass(frozen=True, eq=False)
class KeyedPlan:
    """:meth:`ParametricAcceptance.keyed_plan`: what the keyed draws of the default branch compute with. mu: (curves,
    K) offsets; plain: the link is the identity, else hard x -> offset + slope * x, easy (x > 0) -> easy_offset +
    slope_easy * x with easy_offset = offset + jump (the one sum draw_by_position adds); noise, scale: (K,) per
    position."""

    mu: np.ndarray
    sigma_block: float
    sigma_tok: float
    plain: bool
    slope: float
    offset: float
    slope_easy: float
    easy_offset: float
    noise: np.ndarray
    scale: np.ndarray


_STS_CACHE: dict = {}


class ParametricAcceptance(AcceptanceModel):
    """Latent logit-normal acceptance model calibrated to per-domain conditional curves.

    curves: {domain: alpha_1..alpha_K'} with K' >= K (first K used), or {"all": alpha} for one pooled curve.
    """

    keyed_rows_pure = True   # draw(): elementwise in each row's keyed halves, u and mu of its request; no state

    def __init__(self, curves: Mapping[str, Sequence[float]], K: int, *, drafter: str = "custom",
                 params: ParametricParams | None = None, source: str = "custom curve",
                 notes: Sequence[str] = (), domain_default: str = "chat",
                 extra_metadata: Mapping[str, Any] | None = None, confidence: str = "sts",
                 calibration: str = "steps", shift: "HeadShift | None" = None):
        if calibration not in ("steps", "requests"):
            raise ConfigError(source, "calibration", f"expected 'steps' or 'requests', got {calibration!r}")
        if confidence not in CONFIDENCE_MODES:
            raise ConfigError(source, "confidence", f"expected one of {CONFIDENCE_MODES}, got {confidence!r}")
        if not isinstance(K, (int, np.integer)) or not 1 <= K <= K_MAX:
            raise ConfigError(source, "K", f"block size must be an integer in 1..{K_MAX}, got {K!r}")
        if not curves:
            raise ConfigError(source, "curves", "no conditional-acceptance curve given")
        bad = [d for d in curves if d != POOLED and d not in DOMAINS]
        if bad or (POOLED in curves and len(curves) > 1):
            raise ConfigError(source, "curves",
                              f"keys must be domains {DOMAINS} or only {POOLED!r}, got {list(curves)}")
        self.drafter, self.K, self.params = drafter, int(K), params or ParametricParams()
        self.source, self.domain_default, self.pooled = source, domain_default, POOLED in curves
        self._rows = list(curves)
        self._row_of = {d: i for i, d in enumerate(self._rows)}
        self.curves = {d: check_curve(curves[d], f"{source} [{d}]", self.K)[: self.K] for d in self._rows}
        p = self.params
        # step-weighted calibration: long outputs pooled over all steps reproduce the curve (see calibration.py);
        # "requests" = one block per fresh request reproduces it (the scheme before issue 11, kept for the legacy
        # engine fingerprints)
        self.calibration = calibration
        self._load = p.request_loading(self.K)
        self._load_one = bool((self._load == 1.0).all())     # one shift for all positions: the draws as before
        self._mu = self._calibrate(source)
        self.confidence = confidence
        self._noise = p.noise_by_position(self.K)
        # the head's domain shift (study calibration-drift): a per-domain logit bias of the raw head, and the mix
        # the STS temperatures are fitted on (None = the defaults: no bias, every curve weighted equally)
        self.shift = shift if shift is not None and not shift.is_default else None
        self._bias = (self.shift.bias(self.curves, self._rows, self.K, source) if self.shift is not None
                      else None)
        # final logit = (x + noise) * scale_k: raw_gain for the raw head, raw_gain / T_k after the simulator's own
        # sequential temperature scaling (fitted on a fixed-seed sample of this model's raw confidences)
        self.sts_temperatures = self._fit_sts() if confidence == "sts" else None
        scale = np.full(self.K, p.raw_gain)
        if self.sts_temperatures is not None:
            scale = scale / self.sts_temperatures
        self._scale = scale / p.temperature
        self._u = np.zeros(0)
        self._row = np.zeros(0, dtype=np.int16)
        # 64-bit words (two draws each) one draw() takes from keyed streams: block shift + K token shifts + K
        # uniforms + K noises
        self.words_per_step = (3 * self.K + 2 + (1 if p.noise_block else 0)) // 2
        self.metadata = {
            "source": source, "kind": "parametric", "drafter": drafter, "K": self.K,
            "model": "x = mu_k + lambda_k u_req + z_block + e_tok; accept ~ Bernoulli(sigmoid(x)) per position, "
                     "A = leading successes; logit(conf) = (x + noise_k) * raw_gain (raw) / T_k (sts: sequential "
                     "temperature scaling fitted by the simulator) / temperature",
            "params": asdict(p),
            "confidence": confidence,
            "sts_temperatures": None if self.sts_temperatures is None else [float(t) for t in self.sts_temperatures],
            "params_rationale": "defaults fitted by scripts/fit_acceptance.py to the paper's Fig. 5 threshold "
                                "sweep and Fig. 6 AUC by position (dsparksim/data/acceptance_fit.json)",
            "calibration": calibration,
            "curves": {d: [round(float(a), 6) for a in c] for d, c in self.curves.items()},
            "mu": {d: [float(m) if np.isfinite(m) else str(m) for m in self._mu[i]]
                   for i, d in enumerate(self._rows)},
            "tau_all_verified": {d: tau_of_curve(c) for d, c in self.curves.items()},
            "domain_default": domain_default,
            "assumptions": list(notes),
        }
        if self.shift is not None:
            self.metadata["head_shift"] = self.shift.describe() | {
                "bias_by_domain": {d: [round(float(b), 6) for b in self._bias[i]] for i, d in enumerate(self._rows)}}
        if self.pooled:
            self.metadata["assumptions"].append("one pooled curve: every domain gets the same acceptance")
        self._extra = dict(extra_metadata or {})
        self.metadata.update(self._extra)

    def _calibrate(self, source: str) -> np.ndarray:
        """Offsets mu (one row per curve) in the calibration scheme of ``self.calibration``."""
        p = self.params
        if self.calibration == "steps":
            return np.vstack([calibrate_mu_steps(self.curves[d], p.sigma_req, p.sigma_block, p.sigma_tok, source,
                                                 shape=p.shape, load=self._load) for d in self._rows])
        if not self._load_one:
            raise ConfigError(source, "req_load", f"calibration='requests' needs req_load=1, got {p.req_load!r}")
        return np.vstack([calibrate_mu(self.curves[d], p.sigma_shared, p.sigma_tok, source, shape=p.shape)
                          for d in self._rows])

    # ---- construction from the paper -------------------------------------------------------------------
    @classmethod
    def from_paper(cls, drafter: str, K: int, params: ParametricParams | None = None, *,
                   domain_default: str = "chat", source: str | None = None,
                   confidence: str = "sts", calibration: str = "steps",
                   mtp1_source: str = MTP1_DEFAULT_SOURCE, shift: "HeadShift | None" = None) -> "ParametricAcceptance":
        """The paper-calibrated model for dspark / dflash / eagle3 (K <= 15) or mtp1 (K = 1; ``mtp1_source``
        v3 or v4 names its acceptance, see :func:`.reference.mtp1_alpha`)."""
        src = source or drafter
        if drafter == "mtp1":
            a, notes = paper_curve("mtp1", "chat", K, mtp1_source)
            curves = {POOLED: a}
        else:
            curves, notes = {}, []
            for d in DOMAINS:
                curves[d], n = paper_curve(drafter, d, K)
                notes += n
        meta = {"provenance": (mtp1_alpha(mtp1_source)[1] if drafter == "mtp1" else
                               "DSpark paper (arXiv 2607.05147) Fig. 2 per-position conditional acceptance, "
                               "Qwen3-4B target, temperature 1")
                + " (dsparksim/data/dspark_acceptance.json)"}
        return cls(curves, K, drafter=drafter, params=params, source=src, notes=notes,
                   domain_default=domain_default, extra_metadata=meta, confidence=confidence,
                   calibration=calibration, shift=shift)

    # ---- AcceptanceModel interface ---------------------------------------------------------------------
    def _ensure_capacity(self, top: int) -> None:
        if top < self._u.size:
            return
        cap = max(64, self._u.size)
        while cap <= top:
            cap *= 2
        u = np.zeros(cap)
        r = np.full(cap, -1, dtype=np.int16)
        u[: self._u.size] = self._u
        r[: self._row.size] = self._row
        self._u, self._row = u, r

    def domain_rows(self, domains) -> np.ndarray:
        """Curve row per request domain (empty/None -> domain_default; pooled curves accept any domain)."""
        doms = np.asarray(domains, dtype=object)
        if self.pooled:
            return np.zeros(doms.size, dtype=np.int16)
        out = np.empty(doms.size, dtype=np.int16)
        for d in set(doms.tolist()):
            key = self.domain_default if d is None or d == "" else str(d)
            if key not in self._row_of:
                raise ConfigError(self.source, "domain", f"no acceptance curve for domain {key!r}; this model has "
                                  f"{self._rows}")
            out[doms == d] = self._row_of[key]
        return out

    def start(self, slots: np.ndarray, domains: np.ndarray, rng: np.random.Generator) -> None:
        slots = np.asarray(slots, dtype=np.int64)
        if slots.size == 0:
            return
        rows, u = self.request_state(domains, rng)
        if rows.size != slots.size:
            raise ValueError(f"start(): {slots.size} slots but {rows.size} domains")
        self._ensure_capacity(int(slots.max()))
        self._row[slots] = rows
        self._u[slots] = u

    def request_state(self, domains, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """(curve row, persistent shift u) of new requests: what start() stores in their slots."""
        rows = self.domain_rows(domains)
        return rows, self.params.sigma_req * rng.standard_normal(rows.size)

    def latent(self, slots: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Draw the acceptance logits h(x) (n, K) for one block of each slot (x the difficulty score)."""
        return self._latent(self._row[slots], self._u[slots], rng)

    def _latent(self, rows: np.ndarray, u: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        p = self.params
        n = rows.size
        if self._load_one:
            x = self._mu[rows] + (u + p.sigma_block * rng.standard_normal(n))[:, None]
        else:
            x = self._mu[rows] + u[:, None] * self._load + (p.sigma_block * rng.standard_normal(n))[:, None]
        if p.sigma_tok:
            x += p.sigma_tok * rng.standard_normal((n, self.K))
        return link(x, p.shape)

    def draw(self, slots: np.ndarray, rng: np.random.Generator) -> Block:
        slots = np.asarray(slots, dtype=np.int64)
        if slots.size and (slots.max() >= self._row.size or (self._row[slots] < 0).any()):
            raise ValueError("draw() on a slot that was never start()ed")
        return self.draw_state(self._row[slots], self._u[slots], rng)

    def draw_state(self, rows: np.ndarray, u: np.ndarray, rng: np.random.Generator) -> Block:
        """draw() for requests given by their state (curve row, shift u; see :meth:`request_state`), not slots."""
        p = self.params
        if isinstance(rng, KeyedRows) and p.sigma_tok and (p.noise_sd or p.noise_sd_end):
            return self._draw_keyed(rows, u, rng)
        x = self._latent(rows, u, rng)
        ok = rng.random(x.shape) < sigmoid(x)
        # leading successes: index of the first rejection, K if none
        accepted = np.where(ok.all(axis=1), self.K, ok.argmin(axis=1)).astype(np.int64)
        y = x + self._noise * rng.standard_normal(x.shape) if p.noise_sd or p.noise_sd_end else x
        if p.noise_block:
            y = y + p.noise_block * rng.standard_normal(x.shape[0])[:, None]
        if self._bias is not None:
            y = y + self._bias[rows]
        return Block(conf=sigmoid(y * self._scale), accepted=accepted)

    def _draw_keyed(self, rows: np.ndarray, u: np.ndarray, rng: KeyedRows) -> Block:
        """draw() on keyed streams in one pass (:meth:`draw_by_position`, laid out as draw() returns it)."""
        conf, accepted = self.draw_by_position(rows, u, rng)
        return Block(conf=np.ascontiguousarray(conf.T), accepted=accepted)

    def draw_by_position(self, rows: np.ndarray, u: np.ndarray, rng: KeyedRows
                         ) -> tuple[np.ndarray, np.ndarray] | None:
        """draw_state() on keyed streams, its confidences laid out by position: (conf (K, n), accepted (n,)); None
        where that path does not apply (no token or confidence noise: use draw_state).

        The same halves, in the same order, as the generic path (block shift, K token shifts, K uniforms, K noises,
        then the block noise when noise_block > 0), hence the same values, with a third of the numpy calls (the K
        uniform halves are not turned into normals); every array is (positions, n), so each operation runs along
        rows of n (on (n, K) arrays numpy pays a loop per row of K)."""
        p, K = self.params, self.K
        if not (p.sigma_tok and (p.noise_sd or p.noise_sd_end)):
            return None
        h = rng.halves_by_position(1 + 3 * K + (1 if p.noise_block else 0))      # (1 + 3K [+ 1], n) uint32
        z = normals_from_halves(h[:1 + K])
        x = self._mu.T.take(rows, axis=1)                                       # (K, n)
        if self._load_one:
            x += u + p.sigma_block * z[0]
        else:
            x += u * self._load[:, None]                                        # the request shift's loading
            x += p.sigma_block * z[0]
        e = z[1:]
        e *= p.sigma_tok
        x += e
        x = _link_into(x, p.shape, e)
        # u < sigmoid(x) for the uniform u = h 2**-32, compared as h < 2**32 / (1 + exp(-x)): the same outcome
        # (scaling by a power of two is exact, and where 1 / (1 + exp(-x)) is subnormal both read h == 0), without
        # turning the K uniform halves into floats
        ok = h[1 + K:1 + 2 * K] < _scaled_sigmoid_into(x, np.empty_like(x), 2.0 ** 32)
        # leading successes: the running AND of the positions, counted
        run = ok[0].copy()
        accepted = run.astype(np.int64)
        for k in range(1, K):
            run &= ok[k]
            accepted += run
        y = normals_from_halves(h[1 + 2 * K:1 + 3 * K])
        y *= self._noise[:, None]
        y += x
        if p.noise_block:
            y += p.noise_block * normals_from_halves(h[1 + 3 * K:])
        if self._bias is not None:
            y += self._bias[rows].T
        y *= self._scale[:, None]
        return _sigmoid_into(y, y), accepted

    def keyed_plan(self) -> "KeyedPlan | None":
        """The numbers :meth:`draw_by_position` computes with, for a compiled copy of it (dsparksim.sim.fill_jit);
        None where the source takes a branch that copy does not cover (it covers the default source: one request
        shift for every position, no block noise, no head-shift bias, the keyed path in use)."""
        p = self.params
        if (type(self).draw_by_position is not ParametricAcceptance.draw_by_position or not self._load_one
                or p.noise_block or self._bias is not None or not (p.sigma_tok and (p.noise_sd or p.noise_sd_end))):
            return None
        offset, slope, jump, slope_easy = p.shape
        return KeyedPlan(mu=np.array(self._mu, np.float64), sigma_block=float(p.sigma_block),
                         sigma_tok=float(p.sigma_tok), plain=tuple(p.shape) == PLAIN, slope=slope, offset=offset,
                         slope_easy=slope_easy, easy_offset=offset + jump,
                         noise=np.array(self._noise, np.float64), scale=np.array(self._scale, np.float64))

    # ---- analysis helpers ------------------------------------------------------------------------------
    def mu(self, domain: str) -> np.ndarray:
        return self._mu[self.domain_rows([domain])[0]].copy()

    def conditional_curve(self, domain: str) -> np.ndarray:
        """Model-implied step-weighted P(A>=k)/P(A>=k-1) by quadrature (equals the target curve)."""
        p = self.params
        if self.calibration == "requests":
            return model_conditional(self.mu(domain), p.sigma_shared, p.sigma_tok, p.shape)
        return model_conditional_steps(self.mu(domain), p.sigma_req, p.sigma_block, p.sigma_tok, p.shape, self._load)

    def expected_tau(self, domain: str) -> float:
        """Exact mean tokens per step with all K verified (1 + sum of survival)."""
        return tau_of_curve(self.curves[self._rows[self.domain_rows([domain])[0]]])

    def with_params(self, params: ParametricParams) -> "ParametricAcceptance":
        """Same curves, different heterogeneity / confidence parameters."""
        return ParametricAcceptance(self.curves, self.K, drafter=self.drafter, params=params, source=self.source,
                                    notes=[n for n in self.metadata["assumptions"]
                                           if not n.startswith("one pooled curve")],
                                    domain_default=self.domain_default, extra_metadata=self._extra,
                                    confidence=self.confidence, calibration=self.calibration, shift=self.shift)

    def with_confidence(self, confidence: str) -> "ParametricAcceptance":
        """Same model (same draws, same acceptance truth), raw or STS-calibrated confidences."""
        return ParametricAcceptance(self.curves, self.K, drafter=self.drafter, params=self.params, source=self.source,
                                    notes=[n for n in self.metadata["assumptions"]
                                           if not n.startswith("one pooled curve")],
                                    domain_default=self.domain_default, extra_metadata=self._extra,
                                    confidence=confidence, calibration=self.calibration, shift=self.shift)

    def _fit_sts(self) -> np.ndarray:
        """STS temperatures T_1..T_K of this model's raw confidences (cached: deterministic in curves/params)."""
        key = (tuple(tuple(np.round(self.curves[d], 12)) for d in self._rows), self.K, self.params, self.calibration,
               self.shift)
        if key not in _STS_CACHE:
            p, K = self.params, self.K
            rng = np.random.default_rng(STS_SEED)
            conf, acc = [], []
            # one block of each of STS_BLOCKS fresh requests per curve (a shift's sts_mix: the same total, split
            # in proportion to the mix's weights)
            counts = ([STS_BLOCKS] * len(self._rows) if self.shift is None else
                      self.shift.sts_counts(self._rows, STS_BLOCKS))
            for i in range(len(self._rows)):
                n = counts[i]
                if n == 0:
                    continue
                if self._load_one:
                    x = self._mu[i] + (p.sigma_req * rng.standard_normal(n) + p.sigma_block * rng.standard_normal(n))[:, None]
                else:
                    u = p.sigma_req * rng.standard_normal(n)
                    x = self._mu[i] + u[:, None] * self._load + (p.sigma_block * rng.standard_normal(n))[:, None]
                x = link(x + p.sigma_tok * rng.standard_normal((n, K)), p.shape)
                ok = rng.random((n, K)) < sigmoid(x)
                acc.append(np.where(ok.all(axis=1), K, ok.argmin(axis=1)))
                y = x + self._noise * rng.standard_normal((n, K))
                if p.noise_block:
                    y += p.noise_block * rng.standard_normal(n)[:, None]
                if self._bias is not None:
                    y += self._bias[i]
                conf.append(sigmoid(y * p.raw_gain))
            _STS_CACHE[key] = fit_sts_nll(np.vstack(conf), np.concatenate(acc))
        return _STS_CACHE[key].copy()
