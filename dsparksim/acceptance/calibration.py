"""Numerical calibration of the parametric latent model to a conditional-acceptance curve.

Model (see :mod:`dsparksim.acceptance.parametric`): position k of a block is accepted with probability
``sigmoid(h(mu_k + s + eps_k))`` where ``s ~ N(0, sigma_shared^2)`` is shared by all positions of the block
(request + block effect), ``eps_k ~ N(0, sigma_tok^2)`` is independent per position and
``h(x) = offset + slope * x`` for x <= 0 and ``offset + jump + slope_easy * x`` for x > 0 (the easy/hard mixture:
a token whose difficulty score x is positive is easy and its logit is raised by ``jump``; (offset, slope, jump,
slope_easy) = (0, 1, 0, 1) is the plain logit-normal). Given ``s`` the positions are independent,
so with ``g(m) = E_eps[sigmoid(h(m + eps))]``

    P(A >= k) = E_s[ prod_{j<=k} g(mu_j + s) ].

``calibrate_mu`` solves, left to right, ``P(A>=k) / P(A>=k-1) = alpha_k`` for mu_k by Brent's method, with both
expectations done by Gauss-Hermite quadrature (deterministic, accurate to ~1e-9 for the sigmas used here).
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
from scipy.special import expit

from dsparksim.errors import ConfigError
from dsparksim.acceptance.rootfind import brentq  # SciPy's brentq bit for bit, without importing scipy.optimize at start-up

_N_SHARED = 96   # quadrature nodes over the shared shift (smooth integrand; 96 is far past convergence)
_N_TOK = 48      # nodes over the per-position term
_MU_BRACKET = 60.0
_N_REQ = 40      # step-weighted calibration: nodes over the request shift u ...
_N_BLOCK = 24    # ... and over the block shift z (product rule; tau(u) is smooth in u)
_STEP_ITERS = 60


@lru_cache(maxsize=8)
def gauss_hermite(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Nodes/weights for E[f(Z)], Z ~ N(0,1) (probabilists' Hermite, weights normalised to sum 1)."""
    x, w = np.polynomial.hermite_e.hermegauss(n)
    return x, w / w.sum()


@lru_cache(maxsize=8)
def gauss_legendre(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Gauss-Legendre nodes/weights on [-1, 1] (numpy's leggauss, computed once per n: an eigenvalue problem whose
    LAPACK call also wakes the BLAS threads, which then spin on the other cores)."""
    t, w = np.polynomial.legendre.leggauss(n)
    t.setflags(write=False)
    w.setflags(write=False)
    return t, w


_G_STEP = 0.004   # grid spacing of the g table (linear interpolation error <= h^2/8 * max|g''| < 2e-7)
_N_SPLIT = 64     # Gauss-Legendre nodes on each side of the jump (integrand analytic on each piece)
_SPLIT_EDGE = 12.0  # integration range [-12, 12] in units of sigma_tok (the normal tail beyond is < 1e-32)


Shape = tuple  # (offset, slope, jump, slope_easy) of the link h; PLAIN = (0, 1, 0, 1): the plain logit-normal
PLAIN: Shape = (0.0, 1.0, 0.0, 1.0)


def link(x: np.ndarray, shape: Shape = PLAIN) -> np.ndarray:
    """Acceptance logit of a token with difficulty score x: offset + slope * x for a hard token (x <= 0),
    offset + jump + slope_easy * x for an easy one (x > 0)."""
    if tuple(shape) == PLAIN:
        return x
    offset, slope, jump, slope_easy = shape
    return np.where(x > 0, offset + jump + slope_easy * x, offset + slope * x)


def _g_exact(m: np.ndarray, sigma_tok: float, shape: Shape) -> np.ndarray:
    """g(m) = E[sigmoid(h(m + sigma_tok Z))] by quadrature: Gauss-Hermite for the plain link (as before), else
    Gauss-Legendre on each side of the step at Z = -m / sigma_tok, where the integrand is smooth."""
    m = np.asarray(m, dtype=float)
    if tuple(shape) == PLAIN:
        x, w = gauss_hermite(_N_TOK)
        return (expit(m[..., None] + sigma_tok * x) * w).sum(axis=-1)
    cut = np.clip(-m / sigma_tok, -_SPLIT_EDGE, _SPLIT_EDGE)
    out = np.zeros(m.shape)
    offset, slope, jump, slope_easy = shape
    for edge, add, sl in ((-_SPLIT_EDGE, offset, slope), (_SPLIT_EDGE, offset + jump, slope_easy)):
        # the piece between the step and this edge; where the step lies beyond the range (|m| >= 12 sigma_tok)
        # it is empty: every term is 0 * ... = 0 and adds exactly nothing, so it is not computed
        live = cut != edge
        if not live.any():
            continue
        c, ml = cut[live][:, None], m[live][:, None]
        # where the step lies beyond the other edge the piece is the whole range, the same nodes for every m: its
        # nodes, density and weights are computed once (the same numbers, broadcast)
        whole = c[:, 0] == -edge
        vals = np.empty(c.shape[0])
        for rows, same in ((whole, True), (~whole, False)):
            if rows.any():
                vals[rows] = _g_piece(c[rows][:1] if same else c[rows], ml[rows], edge, add, sl, sigma_tok)
        out[live] = out[live] + vals
    return out[()] if out.ndim == 0 else out      # a scalar for a scalar m, as the sum of the pieces gave


def _g_piece(c: np.ndarray, ml: np.ndarray, edge: float, add: float, sl: float, sigma_tok: float) -> np.ndarray:
    """One side's integral for offsets ``ml`` (n, 1), between the step ``c`` (n, 1, or (1, 1) for all) and ``edge``
    (Gauss-Legendre on that interval)."""
    t, w = gauss_legendre(_N_SPLIT)
    lo, hi = (edge, c) if edge < 0 else (c, edge)
    half = 0.5 * (hi - lo)
    z = lo + half * (t + 1.0)
    pdf = np.exp(-0.5 * z * z) / np.sqrt(2.0 * np.pi)
    return (half * w * pdf * expit(add + sl * (ml + sigma_tok * z))).sum(axis=-1)


@lru_cache(maxsize=16)
def _g_table(sigma_tok: float, shape: Shape = PLAIN) -> tuple[np.ndarray, np.ndarray]:
    """g on a fine grid over [-_MU_BRACKET - 12 sigma, +...] (an easy/hard link: finer within 12 sigma of the step,
    plus coarser wings out to its wider mu bracket, spacing _G_STEP / slope, where g varies on the scale 1 / slope):
    quadrature once, interpolation afterwards."""
    top = _MU_BRACKET + 12.0 * sigma_tok + 20.0
    m = np.arange(-top, top + _G_STEP / 2, _G_STEP)
    if tuple(shape) != PLAIN:
        # the step at x = 0 makes g bend on the scale sigma_tok near m = 0: a finer grid there (h = sigma / 200)
        near = 12.0 * sigma_tok
        fine = np.linspace(-near, near, 4801)
        m = np.concatenate([m[m < -near], fine, m[m > near]])
        flat = min(1.0, shape[1], shape[3])
        outer = _bracket(shape) + 12.0 * sigma_tok + 20.0 / flat
        if outer > top:
            wing = np.arange(top + _G_STEP / flat, outer + _G_STEP / flat, _G_STEP / flat)
            m = np.concatenate([-wing[::-1], m, wing])
    g = np.empty_like(m)
    for i in range(0, m.size, 4096):
        g[i:i + 4096] = _g_exact(m[i:i + 4096], sigma_tok, shape)
    return m, g


def _shape(shape) -> Shape:
    return tuple(float(v) for v in shape)


def smoothed_sigmoid(m: np.ndarray, sigma_tok: float, exact: bool = False, shape: Shape = PLAIN) -> np.ndarray:
    """g(m) = E[sigmoid(h(m + sigma_tok * Z))], elementwise (sigmoid(h(m)) when sigma_tok == 0): quadrature,
    tabulated once per (sigma_tok, shape) and interpolated (error < 2e-7 away from the step) unless ``exact``."""
    m = np.asarray(m, dtype=float)
    if sigma_tok == 0.0:
        return expit(link(m, shape))
    if exact:
        return _g_exact(m, sigma_tok, shape)
    grid, g = _g_table(float(sigma_tok), _shape(shape))
    out = np.interp(m, grid, g)
    if m.ndim and m.size and grid[0] <= m.min() and m.max() <= grid[-1]:
        return out                      # all inside the table (the calibration's every call): nothing to patch
    far = np.isfinite(m) & ((m < grid[0]) | (m > grid[-1]))
    if far.any():                       # beyond the table (a shallow link needs large |mu|): exact quadrature
        out = np.array(out, dtype=float)
        out[far] = _g_exact(m[far], sigma_tok, _shape(shape))
    return np.where(m == np.inf, 1.0, np.where(m == -np.inf, 0.0, np.where(np.isnan(m), np.nan, out)))


def check_curve(alpha, source: str, K: int | None = None) -> np.ndarray:
    """Validate a conditional-acceptance curve (values in [0,1], no NaN; optional exact length K)."""
    a = np.asarray(alpha, dtype=float).ravel()
    if a.size == 0:
        raise ConfigError(source, "alpha", "empty conditional-acceptance curve")
    if K is not None and a.size < K:
        raise ConfigError(source, "alpha", f"curve has {a.size} positions, block size K={K} needs {K}")
    bad = np.flatnonzero(~np.isfinite(a) | (a < 0) | (a > 1))
    if bad.size:
        i = int(bad[0])
        raise ConfigError(source, f"alpha[{i + 1}]", f"conditional acceptance must be in [0, 1], got {a[i]!r}")
    zero = np.flatnonzero(a[:-1] == 0.0)
    if zero.size:
        i = int(zero[0])
        raise ConfigError(source, f"alpha[{i + 1}]", "conditional acceptance 0 before the last position makes "
                          "every later position unreachable (undefined); shorten the curve / block size")
    return a


def _bracket(shape: Shape) -> float:
    """Half-width of the search interval for mu: the logit range +-_MU_BRACKET through the link's shallowest slope."""
    if tuple(shape) == PLAIN:
        return _MU_BRACKET
    offset, slope, jump, slope_easy = shape
    return (_MU_BRACKET + abs(offset) + jump) / min(1.0, slope, slope_easy)


def _solve_mu(alpha: tuple[float, ...], s: np.ndarray, w0: np.ndarray, sigma_tok: float,
              guess: np.ndarray | None = None, exact: bool = False, shape: Shape = PLAIN) -> tuple[float, ...]:
    """mu_1..mu_K with sum_n w0[n] prod_{j<=k} g(mu_j + s[n]) / (same for k-1) = alpha_k, left to right (``s``
    one row of shifts for every position, or one row per position)."""
    w = w0.copy()                       # w(s) * P(positions 1..k-1 accepted | s)
    mus: list[float] = []
    bracket = _bracket(shape)
    rows = s if s.ndim == 2 else None
    order = s_up = None
    for a in alpha:
        if rows is not None or order is None:
            if rows is not None:
                s = rows[len(mus)]
            # g is elementwise: evaluated at the shifts in ascending order (the table lookups then walk the table
            # forward) and put back in place, the same numbers
            order = np.argsort(s, kind="stable")
            s_up = s[order]
        if a >= 1.0:
            mus.append(np.inf)          # never rejected; weight unchanged
            continue
        if a <= 0.0:
            mus.append(-np.inf)         # only allowed at the last position (check_curve)
            continue
        total = w.sum()

        def g_at(m: float, order=order, s_up=s_up) -> np.ndarray:
            out = np.empty(s_up.size)
            out[order] = smoothed_sigmoid(m + s_up, sigma_tok, exact, shape)
            return out

        def gap(m: float) -> float:
            return float((w * g_at(m)).sum() / total - a)

        lo, hi = -bracket, bracket
        if guess is not None and np.isfinite(guess[len(mus)]):
            # warm start (fixed-point iterations move mu little): a narrow bracket when it holds the root
            g0 = float(guess[len(mus)])
            if gap(g0 - 0.05) < 0 < gap(g0 + 0.05):
                lo, hi = g0 - 0.05, g0 + 0.05
        m = brentq(gap, lo, hi, xtol=1e-12, rtol=1e-14, maxiter=200)
        mus.append(m)
        w = w * g_at(m)
        if w.sum() < 1e-300:            # numerically nobody survives: later positions cannot be calibrated
            raise ConfigError("calibration", "alpha", "survival underflows; curve too close to 0")
    return tuple(mus)


@lru_cache(maxsize=256)
def _calibrate_cached(alpha: tuple[float, ...], sigma_shared: float, sigma_tok: float,
                      shape: Shape = PLAIN) -> tuple[float, ...]:
    xs, ws = gauss_hermite(_N_SHARED)
    return _solve_mu(alpha, sigma_shared * xs, ws.copy(), sigma_tok, exact=True, shape=shape)


LOAD_RAMP = 7   # positions over which the request shift's loading moves from req_load (position 1) to 1


def request_loading(req_load: float, K: int) -> np.ndarray:
    """Loading lambda_k of the request shift u at positions 1..K: linear from ``req_load`` at position 1 to 1 at
    position 7, flat after (1 everywhere when req_load = 1: the shift moves every position alike)."""
    frac = np.minimum(np.arange(K), LOAD_RAMP - 1) / (LOAD_RAMP - 1)
    return req_load + (1.0 - req_load) * frac


def _load_key(load) -> tuple | None:
    """``load`` as a hashable tuple, or None when it is absent or 1 at every position (the one-shift model)."""
    if load is None:
        return None
    t = tuple(float(v) for v in np.asarray(load, dtype=float).ravel())
    return None if all(v == 1.0 for v in t) else t


def _req_block_nodes(sigma_req: float, sigma_block: float,
                     load: tuple | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int]:
    """Product quadrature over (request shift u, block shift z): s = lambda u + z flattened (one row per position
    when the loading ``load`` varies, else one row for all), weights (n_u, n_z)."""
    xu, wu = gauss_hermite(_N_REQ) if sigma_req > 0 else (np.zeros(1), np.ones(1))
    xz, wz = gauss_hermite(_N_BLOCK) if sigma_block > 0 else (np.zeros(1), np.ones(1))
    if load is None:
        s = (sigma_req * xu[:, None] + sigma_block * xz[None, :]).ravel()
    else:
        lam = np.asarray(load, dtype=float)[:, None, None]
        s = (lam * sigma_req * xu[None, :, None] + sigma_block * xz[None, None, :]).reshape(lam.shape[0], -1)
    return s, wu, wz, xu.size, xz.size


def request_tau(mu, sigma_req: float, sigma_block: float, sigma_tok: float = 0.0,
                shape: Shape = PLAIN, load=None) -> tuple[np.ndarray, np.ndarray]:
    """Per-request mean tokens per step with all K verified, tau(u) = 1 + sum_k E_z[prod_{j<=k} g(mu_j+l_j u+z)],
    at the request-shift quadrature nodes; returns (tau(u) (n_u,), node weights (n_u,))."""
    s, wu, wz, nu, nz = _req_block_nodes(sigma_req, sigma_block, _load_key(load))
    mu = np.asarray(mu, dtype=float)
    x = mu[:, None] + (s if s.ndim == 2 else s[None, :])
    surv = np.cumprod(smoothed_sigmoid(x, sigma_tok, shape=shape), axis=0)  # (K, nu*nz)
    return 1.0 + (surv.reshape(mu.size, nu, nz) * wz).sum(axis=(0, 2)), wu


@lru_cache(maxsize=256)
def _calibrate_steps_cached(alpha: tuple[float, ...], sigma_req: float, sigma_block: float,
                            sigma_tok: float, shape: Shape = PLAIN, load: tuple | None = None) -> tuple[float, ...]:
    s, wu, wz, nu, nz = _req_block_nodes(sigma_req, sigma_block, load)
    step_w = np.ones(nu)
    mus = np.zeros(len(alpha))
    for it in range(_STEP_ITERS):
        new = np.array(_solve_mu(alpha, s, ((wu * step_w)[:, None] * wz[None, :]).ravel(), sigma_tok,
                                 mus if it else None, shape=shape))
        fin = np.isfinite(new)
        done = np.max(np.abs(new[fin] - mus[fin]), initial=0.0) < 1e-12
        mus = new
        if done:
            break
        tau_u, _ = request_tau(mus, sigma_req, sigma_block, sigma_tok, shape, load)
        step_w = 1.0 / tau_u      # a request that emits tau(u) tokens per step takes 1/tau(u) steps per token
    else:
        raise ConfigError("calibration", "alpha", f"step-weighted calibration did not converge in {_STEP_ITERS} "
                          "iterations")
    return tuple(float(m) for m in mus)


def calibrate_mu_steps(alpha, sigma_req: float, sigma_block: float, sigma_tok: float = 0.0,
                       source: str = "curve", shape: Shape = PLAIN, load=None) -> np.ndarray:
    """Offsets mu_1..mu_K making the STEP-weighted conditional acceptance equal ``alpha`` exactly.

    Step-weighted = pooled over every verification step of long outputs, as DeepSpec's evaluator pools
    acceptance lengths over all proposals: a request with shift u contributes in proportion to the steps it
    takes per output token, 1/tau(u) (blocks within a request are i.i.d. given u, so the block shift z is
    not reweighted). Solved as a fixed point: calibrate under the current step weights, recompute tau(u),
    repeat until mu moves by < 1e-12. Then tau = sum tokens / sum steps = 1 + sum_k prod_{j<=k} alpha_j.
    ``load``: the request shift's loading per position (:func:`request_loading`; None = 1 everywhere).
    """
    a = check_curve(alpha, source)
    key = _load_key(load)
    if key is not None and len(key) != a.size:
        raise ConfigError(source, "req_load", f"loading has {len(key)} positions, the curve {a.size}")
    return np.array(_calibrate_steps_cached(tuple(float(x) for x in a), float(sigma_req), float(sigma_block),
                                            float(sigma_tok), _shape(shape), key))


def model_survival_steps(mu, sigma_req: float, sigma_block: float, sigma_tok: float = 0.0,
                         shape: Shape = PLAIN, load=None) -> np.ndarray:
    """Step-weighted P(A >= k), k = 1..K, implied by offsets mu (quadrature; see :func:`calibrate_mu_steps`)."""
    s, wu, wz, nu, nz = _req_block_nodes(sigma_req, sigma_block, _load_key(load))
    mu = np.asarray(mu, dtype=float)
    x = mu[:, None] + (s if s.ndim == 2 else s[None, :])
    surv = np.cumprod(smoothed_sigmoid(x, sigma_tok, shape=shape), axis=0).reshape(mu.size, nu, nz)
    per_u = (surv * wz).sum(axis=2)                                   # (K, nu)
    step_w = wu / (1.0 + per_u.sum(axis=0))
    return (per_u * step_w).sum(axis=1) / step_w.sum()


def model_conditional_steps(mu, sigma_req: float, sigma_block: float, sigma_tok: float = 0.0,
                            shape: Shape = PLAIN, load=None) -> np.ndarray:
    """Step-weighted P(A >= k) / P(A >= k-1) implied by mu (what :func:`calibrate_mu_steps` targets)."""
    surv = model_survival_steps(mu, sigma_req, sigma_block, sigma_tok, shape, load)
    prev = np.concatenate(([1.0], surv[:-1]))
    with np.errstate(invalid="ignore", divide="ignore"):
        return surv / prev


def calibrate_mu(alpha, sigma_shared: float, sigma_tok: float = 0.0, source: str = "curve",
                 shape: Shape = PLAIN) -> np.ndarray:
    """Latent logit offsets mu_1..mu_K making the model's conditional acceptance equal ``alpha`` exactly."""
    a = check_curve(alpha, source)
    return np.array(_calibrate_cached(tuple(float(x) for x in a), float(sigma_shared), float(sigma_tok),
                                      _shape(shape)))


def model_survival(mu, sigma_shared: float, sigma_tok: float = 0.0, shape: Shape = PLAIN) -> np.ndarray:
    """P(A >= k) for k = 1..K implied by offsets mu (quadrature)."""
    xs, ws = gauss_hermite(_N_SHARED)
    s = sigma_shared * xs
    g = smoothed_sigmoid(np.asarray(mu, dtype=float)[:, None] + s[None, :], sigma_tok, shape=shape)  # (K, nodes)
    return (np.cumprod(g, axis=0) * ws).sum(axis=1)


def model_conditional(mu, sigma_shared: float, sigma_tok: float = 0.0, shape: Shape = PLAIN) -> np.ndarray:
    """P(A >= k) / P(A >= k-1) implied by mu (what calibration targets)."""
    surv = model_survival(mu, sigma_shared, sigma_tok, shape)
    prev = np.concatenate(([1.0], surv[:-1]))
    with np.errstate(invalid="ignore", divide="ignore"):
        return surv / prev


def tau_of_curve(alpha) -> float:
    """Mean tokens per step with all K verified: 1 + sum_k prod_{j<=k} alpha_j."""
    return float(1.0 + np.cumprod(np.asarray(alpha, dtype=float)).sum())


def flat_alpha_for_tau(tau: float, K: int, source: str = "tau") -> float:
    """The flat conditional acceptance a with 1 + sum_{k=1..K} a^k = tau (needs 1 < tau < K + 1)."""
    if not np.isfinite(tau) or not (1.0 < tau < K + 1.0):
        raise ConfigError(source, "tau", f"tau must satisfy 1 < tau < K+1 = {K + 1} for block size K={K} "
                          f"(tau counts the bonus token), got {tau!r}")
    return float(brentq(lambda a: tau_of_curve(np.full(K, a)) - tau, 0.0, 1.0, xtol=1e-15, rtol=1e-15))
