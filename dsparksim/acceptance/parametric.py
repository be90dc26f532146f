"""Parametric, paper-calibrated acceptance model (the default acceptance source).

Latent model, per request i, block b, position k (1..K)::

    u_i    ~ N(0, sigma_req^2)      persistent per request (easy vs hard prompts), drawn at start()
    z_ib   ~ N(0, sigma_block^2)    per block (easy vs hard stretches of one response)
    e_ibk  ~ N(0, sigma_tok^2)      per position (token-level difficulty the confidence head can see)
    x_ibk  = mu_k + u_i + z_ib + e_ibk,      p_ibk = sigmoid(x_ibk)

Outcome: given p, positions are accepted independently with probability p_ibk; the ground truth A is the number
of leading successes (0..K). ``mu_k`` is calibrated numerically (Gauss-Hermite quadrature, left to right, see
:mod:`.calibration`) so that the model's conditional acceptance P(A>=k)/P(A>=k-1) equals the target curve
alpha_k to ~1e-9; hence mean tau with all K verified is exactly 1 + sum_k prod_{j<=k} alpha_j.

Confidence (what the scheduler sees): the latent probability through a calibration-error model,
``logit(c_ibk) = (x_ibk + n_ibk) / T`` with ``n_ibk ~ N(0, noise_sd^2)``.

Defaults and why (all in logit units):

* sigma_req = sigma_block = 0.8 — the shared (all-positions) heterogeneity. The paper's Table 1 spreads tau by
  ~1.2 tokens between benchmarks of one domain (gsm8k 6.11 vs aime25 4.89), i.e. difficulty is strongly
  prompt-dependent; we split the shared variance equally between request and block because the paper gives no
  within-response figure. With these values the per-request tau spread is clearly non-homogeneous (tested).
* sigma_tok = 1.4 and noise_sd = 0.43, T = 1 — chosen with :func:`fit_confidence_params` (dspark, K=7, three
  domains pooled, seed 0, 150k blocks; fitted 1.396 / 0.426, rounded) so that the confidences reproduce the paper's confidence-head quality:
  mean AUC over positions 0.85 (paper: 0.82/0.81/0.86/0.91 at positions 1/3/5/7) and survival ECE 0.01 (paper,
  after sequential temperature scaling). Without a per-position term no (sigma, noise) pair gives ECE <= 0.02
  with every position's AUC inside 0.81-0.91: the shared shift alone makes position 1 the most predictable and
  the AUC fall along the block.

Known gaps versus the paper: (1) our AUC is roughly flat in k, the paper's rises from 0.82 to 0.91; (2) the
paper's static-threshold sweep (dspark, t = 0.5/0.7/0.9) keeps more accepted tokens per verified token than this
model does when the threshold is applied to survival (e.g. math t=0.5: paper 1.00x accepted at 1.27x tau
verified, model 0.90x at 1.05x); applied to the conditional confidence it is close (0.96x at 1.22x). Heterogeneity
cannot be identified from the published means alone, so treat sigma_* as a documented assumption.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import ConfigError
from .base import DOMAINS, AcceptanceModel, Block
from .calibration import calibrate_mu, check_curve, model_conditional, tau_of_curve
from .confidence import confidence_metrics
from .reference import K_MAX, MTP1_DEFAULT_SOURCE, confidence_head_quality, mtp1_alpha, paper_curve
from ..streams import KeyedRows, normals_from_halves, uniforms_from_halves

POOLED = "all"   # curve key meaning "every domain uses this curve"


def _sigmoid(x: np.ndarray) -> np.ndarray:
    # plain numpy is ~2x faster than scipy's expit on small arrays (hot path); exp overflow -> inf -> 0 is exact
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


@dataclass(frozen=True)
class ParametricParams:
    """Heterogeneity (sigma_*) and calibration-error (noise_sd, temperature) parameters, logit units."""

    sigma_req: float = 0.8
    sigma_block: float = 0.8
    sigma_tok: float = 1.4
    noise_sd: float = 0.43
    temperature: float = 1.0

    def __post_init__(self) -> None:
        for f in fields(self):
            _check_param(f.name, getattr(self, f.name), "acceptance params")

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
        return replace(base, **upd)


def _check_param(name: str, v, source: str) -> None:
    if not isinstance(v, (int, float)) or not np.isfinite(v) or v < 0:
        raise ConfigError(source, name, f"must be a finite number >= 0, got {v!r}")
    if name == "temperature" and v <= 0:
        raise ConfigError(source, name, f"must be > 0, got {v!r}")


class ParametricAcceptance(AcceptanceModel):
    """Latent logit-normal acceptance model calibrated to per-domain conditional curves.

    curves: {domain: alpha_1..alpha_K'} with K' >= K (first K used), or {"all": alpha} for one pooled curve.
    """

    def __init__(self, curves: Mapping[str, Sequence[float]], K: int, *, drafter: str = "custom",
                 params: ParametricParams | None = None, source: str = "custom curve",
                 notes: Sequence[str] = (), domain_default: str = "chat",
                 extra_metadata: Mapping[str, Any] | None = None):
        if not isinstance(K, (int, np.integer)) or not 1 <= K <= K_MAX:
            raise ConfigError(source, "K", f"block size must be an integer in 1..{K_MAX}, got {K!r}")
        if not curves:
            raise ConfigError(source, "curves", "no conditional-acceptance curve given")
        bad = [d for d in curves if d != POOLED and d not in DOMAINS]
        if bad or (POOLED in curves and len(curves) > 1):
            raise ConfigError(source, "curves",
                              f"keys must be domains {DOMAINS} or only {POOLED!r}, got {list(curves)}")
        self.drafter = drafter
        self.K = int(K)
        self.params = params or ParametricParams()
        self.source = source
        self.domain_default = domain_default
        self.pooled = POOLED in curves
        self._rows = list(curves)
        self._row_of = {d: i for i, d in enumerate(self._rows)}
        self.curves = {d: check_curve(curves[d], f"{source} [{d}]", self.K)[: self.K] for d in self._rows}
        p = self.params
        self._mu = np.vstack([calibrate_mu(self.curves[d], p.sigma_shared, p.sigma_tok, source) for d in self._rows])
        self._u = np.zeros(0)
        self._row = np.zeros(0, dtype=np.int16)
        # 64-bit words (two draws each) one draw() takes from keyed streams: block shift + K token shifts + K
        # uniforms + K noises
        self.words_per_step = (3 * self.K + 2) // 2
        self.metadata = {
            "source": source, "kind": "parametric", "drafter": drafter, "K": self.K,
            "model": "x = mu_k + u_req + z_block + e_tok; accept ~ Bernoulli(sigmoid(x)) per position, "
                     "A = leading successes; logit(conf) = (x + noise)/T",
            "params": asdict(p),
            "params_rationale": "defaults justified in dsparksim/acceptance/parametric.py (Table 1 spread between "
                                "benchmarks; confidence quality fitted to the paper's AUC ~0.85 / ECE ~1%)",
            "curves": {d: [round(float(a), 6) for a in c] for d, c in self.curves.items()},
            "mu": {d: [float(m) if np.isfinite(m) else str(m) for m in self._mu[i]]
                   for i, d in enumerate(self._rows)},
            "tau_all_verified": {d: tau_of_curve(c) for d, c in self.curves.items()},
            "domain_default": domain_default,
            "assumptions": list(notes),
        }
        if self.pooled:
            self.metadata["assumptions"].append("one pooled curve: every domain gets the same acceptance")
        self._extra = dict(extra_metadata or {})
        self.metadata.update(self._extra)

    # ---- construction from the paper -------------------------------------------------------------------
    @classmethod
    def from_paper(cls, drafter: str, K: int, params: ParametricParams | None = None, *,
                   domain_default: str = "chat", source: str | None = None,
                   mtp1_source: str = MTP1_DEFAULT_SOURCE) -> "ParametricAcceptance":
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
                   domain_default=domain_default, extra_metadata=meta)

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
        rows = self.domain_rows(domains)
        if rows.size != slots.size:
            raise ValueError(f"start(): {slots.size} slots but {rows.size} domains")
        self._ensure_capacity(int(slots.max()))
        self._row[slots] = rows
        self._u[slots] = self.params.sigma_req * rng.standard_normal(slots.size)

    def latent(self, slots: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Draw the latent logits x (n, K) for one block of each slot."""
        p = self.params
        n = slots.size
        shift = self._u[slots] + p.sigma_block * rng.standard_normal(n)
        x = self._mu[self._row[slots]] + shift[:, None]
        if p.sigma_tok:
            x += p.sigma_tok * rng.standard_normal((n, self.K))
        return x

    def draw(self, slots: np.ndarray, rng: np.random.Generator) -> Block:
        slots = np.asarray(slots, dtype=np.int64)
        if slots.size and (slots.max() >= self._row.size or (self._row[slots] < 0).any()):
            raise ValueError("draw() on a slot that was never start()ed")
        p = self.params
        if isinstance(rng, KeyedRows) and p.sigma_tok and p.noise_sd:
            return self._draw_keyed(slots, rng)
        x = self.latent(slots, rng)
        ok = rng.random(x.shape) < _sigmoid(x)
        # leading successes: index of the first rejection, K if none
        accepted = np.where(ok.all(axis=1), self.K, ok.argmin(axis=1)).astype(np.int64)
        y = x + p.noise_sd * rng.standard_normal(x.shape) if p.noise_sd else x
        conf = _sigmoid(y / p.temperature) if p.temperature != 1.0 else _sigmoid(y)
        return Block(conf=conf, accepted=accepted)

    def _draw_keyed(self, slots: np.ndarray, rng: KeyedRows) -> Block:
        """draw() on keyed streams in one pass: the same halves, in the same order, as the generic path (block
        shift, K token shifts, K uniforms, K noises), hence the same values, with a third of the numpy calls."""
        p, K = self.params, self.K
        h = rng.halves(1 + 3 * K)                          # (n, 1 + 3K) uint32
        z = normals_from_halves(h)
        x = self._mu[self._row[slots]]
        x += (self._u[slots] + p.sigma_block * z[:, 0])[:, None]
        x += p.sigma_tok * z[:, 1:1 + K]
        ok = uniforms_from_halves(h[:, 1 + K:1 + 2 * K]) < _sigmoid(x)
        accepted = np.where(ok.all(axis=1), K, ok.argmin(axis=1)).astype(np.int64)
        y = x + p.noise_sd * z[:, 1 + 2 * K:]
        conf = _sigmoid(y / p.temperature) if p.temperature != 1.0 else _sigmoid(y)
        return Block(conf=conf, accepted=accepted)

    # ---- analysis helpers ------------------------------------------------------------------------------
    def mu(self, domain: str) -> np.ndarray:
        return self._mu[self.domain_rows([domain])[0]].copy()

    def conditional_curve(self, domain: str) -> np.ndarray:
        """Model-implied P(A>=k)/P(A>=k-1) by quadrature (equals the target curve after calibration)."""
        return model_conditional(self.mu(domain), self.params.sigma_shared, self.params.sigma_tok)

    def expected_tau(self, domain: str) -> float:
        """Exact mean tokens per step with all K verified (1 + sum of survival)."""
        return tau_of_curve(self.curves[self._rows[self.domain_rows([domain])[0]]])

    def with_params(self, params: ParametricParams) -> "ParametricAcceptance":
        """Same curves, different heterogeneity / confidence parameters."""
        return ParametricAcceptance(self.curves, self.K, drafter=self.drafter, params=params, source=self.source,
                                    notes=[n for n in self.metadata["assumptions"]
                                           if not n.startswith("one pooled curve")],
                                    domain_default=self.domain_default, extra_metadata=self._extra)


# ---- fitting the confidence model to target AUC / ECE ------------------------------------------------------
def _crn_quality(curves: Mapping[str, np.ndarray], K: int, params: ParametricParams, normals: dict) -> dict:
    """ECE / AUC pooled over domains with common random numbers (deterministic in params)."""
    confs, accs = [], []
    for i, d in enumerate(curves):
        zs, zt, u, ze = normals[d]
        mu = calibrate_mu(np.asarray(curves[d])[:K], params.sigma_shared, params.sigma_tok)
        x = mu[None, :] + params.sigma_shared * zs[:, None] + params.sigma_tok * zt
        ok = u < _sigmoid(x)
        accs.append(np.where(ok.all(axis=1), K, ok.argmin(axis=1)))
        confs.append(_sigmoid((x + params.noise_sd * ze) / params.temperature))
    return confidence_metrics(np.vstack(confs), np.concatenate(accs))


def _bisect(f, lo: float, hi: float, target: float, increasing: bool, iters: int) -> float:
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        if (f(mid) < target) == increasing:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def fit_confidence_params(curves: Mapping[str, Sequence[float]], K: int, *, target_auc: float | None = None,
                          target_ece: float | None = None, base: ParametricParams | None = None,
                          fit_sigma_tok: bool = True, n_blocks: int = 150_000, seed: int = 0,
                          iters: int = 14) -> tuple[ParametricParams, dict]:
    """Pick noise_sd (T = 1) — and, if ``fit_sigma_tok``, sigma_tok — to hit a target mean AUC / survival ECE.

    * only ``target_auc``: bisection on noise_sd (AUC falls as noise grows) with sigma_tok fixed;
    * only ``target_ece``: bisection on noise_sd (ECE grows with noise);
    * both and ``fit_sigma_tok``: noise_sd from the ECE target (inner), sigma_tok from the AUC target (outer).

    Blocks are pooled over the given domains (equal shares), one block per fresh request, with common random
    numbers (``seed``) so the objective is deterministic. Defaults to the paper's confidence-head targets when
    both targets are None. Returns (params, achieved metrics). Raises ConfigError when a target is unreachable.
    """
    base = replace(base or ParametricParams(), temperature=1.0)
    if target_auc is None and target_ece is None:
        q = confidence_head_quality()
        target_auc = float(np.mean(list(q["auc_by_position"].values())))
        target_ece = float(q["ece_after_sequential_temperature_scaling"])
    rng = np.random.default_rng(seed)
    m = max(1, n_blocks // len(curves))
    normals = {d: (rng.standard_normal(m), rng.standard_normal((m, K)), rng.random((m, K)),
                   rng.standard_normal((m, K))) for d in curves}
    cur = {d: np.asarray(c, dtype=float) for d, c in curves.items()}

    def quality(p: ParametricParams) -> dict:
        return _crn_quality(cur, K, p, normals)

    def noise_for_ece(p: ParametricParams) -> ParametricParams:
        if quality(replace(p, noise_sd=0.0))["ece"] > target_ece:
            raise ConfigError("fit_confidence_params", "target_ece",
                              f"{target_ece} is below the noise-free ECE (sampling floor); raise n_blocks")
        nz = _bisect(lambda v: quality(replace(p, noise_sd=v))["ece"], 0.0, 4.0, target_ece, True, iters)
        return replace(p, noise_sd=nz)

    def noise_for_auc(p: ParametricParams) -> ParametricParams:
        top = quality(replace(p, noise_sd=0.0))["mean_auc"]
        if top < target_auc:
            raise ConfigError("fit_confidence_params", "target_auc", f"{target_auc} unreachable: noise-free AUC "
                              f"is {top:.3f}; increase sigma_tok / sigma_req / sigma_block")
        nz = _bisect(lambda v: quality(replace(p, noise_sd=v))["mean_auc"], 0.0, 6.0, target_auc, False, iters)
        return replace(p, noise_sd=nz)

    if target_ece is not None and target_auc is not None and fit_sigma_tok:
        st = _bisect(lambda v: quality(noise_for_ece(replace(base, sigma_tok=v)))["mean_auc"],
                     0.0, 4.0, target_auc, True, iters)
        params = noise_for_ece(replace(base, sigma_tok=st))
    elif target_auc is not None:
        params = noise_for_auc(base)
    else:
        params = noise_for_ece(base)
    achieved = quality(params)
    achieved.update(target_auc=target_auc, target_ece=target_ece, n_blocks=m * len(curves), seed=seed)
    return params, achieved
