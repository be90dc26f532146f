"""A compiled (numba) copy of :class:`~dsparksim.sim.predraw.PredrawnDraws`' refill for the default parametric
acceptance source: the same ring contents, bit for bit, with far fewer passes over memory.

Optional: this module imports numba, and :mod:`dsparksim.sim.predraw` imports it only when numba is installed (the
``fast`` extra) and the source gives a :class:`~dsparksim.acceptance.parametric.KeyedPlan`; otherwise the numpy
path runs. ``DSPARKSIM_KERNEL=0`` (:mod:`dsparksim.sim.jit`) forces the numpy path.

Bit for bit: every floating-point operation is the numpy path's (:meth:`.ParametricAcceptance.draw_by_position`,
:func:`.streams.normals_from_halves`, the survival product of ``PredrawnDraws._fill``), in the same order and
association, each rounded on its own (no ``fastmath``, so nothing is fused into an FMA or reassociated). The two
exponentials are left to numpy (``np.exp`` on whole arrays, between the compiled stages): numpy's SIMD exp and
libm's, which compiled code would call, differ in the last bit for a few values in a hundred on some CPUs. Hence
three compiled stages per refill: (1) hash the words, the normals, the difficulty score x, written as -x twice (one
kept, one numpy's exp overwrites in place); numpy exp; (2) the acceptance test, the accepted prefix, the confidence
logit y, written as -y over the exponentials; numpy exp in place; (3) the confidences, their survival, scattered
into the rings.
"""
from __future__ import annotations

import numba  # noqa: F401  (this module is the numba path: importing it needs numba)
import numpy as np

from dsparksim.sim import jit
from dsparksim.sim.jit import njit_cached
from dsparksim.sim.streams import (MIX_MULTIPLIERS, MIX_SHIFTS, STEP_MULTIPLIER, WORD_MULTIPLIER, KeyedRows,
                                   RequestStreams, mix64, normal_table, normals_from_halves)

_G2, _G3 = STEP_MULTIPLIER, WORD_MULTIPLIER
_C1, _C2 = MIX_MULTIPLIERS
_S30, _S27, _S31 = MIX_SHIFTS
_S32 = np.uint64(32)
_LOW16, _LOW32 = np.uint32(0xFFFF), np.uint64(0xFFFFFFFF)
_TWO32 = 2.0 ** 32


_jit = njit_cached


@_jit
def _mix(x):
    """:func:`.streams.mix64` of one uint64."""
    x = x ^ (x >> _S30)
    x = x * _C1
    x = x ^ (x >> _S27)
    x = x * _C2
    return x ^ (x >> _S31)


@_jit
def _normal(h, ab):
    """:func:`.streams.normals_from_halves` of one uint32 half (ab: the table's (a, b) rows): a + b * lo, two
    roundings (b * lo, then + a)."""
    i = h >> np.uint32(16)
    z = np.float64(h & _LOW16) * ab[i, 1]
    return z + ab[i, 0]


@_jit
def _halves(keys, first, count, nh):
    """The (nh, n) uint32 halves ``KeyedRows.halves_by_position(nh)`` gives for every drawn step: row r's steps
    first[r] .. first[r] + count[r] - 1, one column each, rows in order."""
    n = 0
    for r in range(keys.size):
        n += count[r]
    base = np.empty(n, np.uint64)
    i = 0
    for r in range(keys.size):
        for j in range(count[r]):
            base[i] = _mix(np.uint64(first[r] + j + 1) * _G2 + keys[r])    # RequestStreams.rows
            i += 1
    h = np.empty((nh, n), np.uint32)
    for w in range((nh + 1) // 2):                                           # word w + 1: its low half, then high
        m = np.uint64(w + 1) * _G3
        lo = h[2 * w]
        if 2 * w + 1 < nh:
            hi = h[2 * w + 1]
            for i in range(n):
                word = _mix(m + base[i])
                lo[i] = np.uint32(word & _LOW32)
                hi[i] = np.uint32(word >> _S32)
        else:
            for i in range(n):
                lo[i] = np.uint32(_mix(m + base[i]) & _LOW32)
    return h


@_jit
def _score(h, count, crow, u, mu, ab, sigma_block, sigma_tok, plain, slope, offset, slope_easy, easy_offset):
    """Stage 1: -x (K, n), x the difficulty score after the link, twice: one to keep, one for numpy's exp."""
    K, n = mu.shape[1], h.shape[1]
    negx, out = np.empty((K, n)), np.empty((K, n))
    t, c = np.empty(n), np.empty(n, np.int64)
    i = 0
    for r in range(crow.size):
        for _ in range(count[r]):
            t[i], c[i] = u[r], crow[r]
            i += 1
    h0 = h[0]
    for i in range(n):
        t[i] = t[i] + sigma_block * _normal(h0[i], ab)                     # x += u + sigma_block * z[0]
    for k in range(K):
        hk, nk, ok = h[1 + k], negx[k], out[k]
        for i in range(n):
            nk[i] = _normal(hk[i], ab)
        for i in range(n):
            v = mu[c[i], k] + t[i]
            v = v + nk[i] * sigma_tok                                         # e = z[1:]; e *= sigma_tok; x += e
            if not plain:                                                     # _link_into
                easy = v * slope_easy + easy_offset
                hard = v * slope + offset
                v = easy if v > 0 else hard
            nk[i] = -v
            ok[i] = -v
    return negx, out


@_jit
def _logit(h, negx, ex, noise, scale, ab):
    """Stage 2 (ex = exp(-x)): the accepted prefix (n,), and -y into ``ex``, y the confidence logit."""
    K, n = negx.shape
    accepted = np.zeros(n, np.int64)
    run = np.ones(n, np.bool_)
    for k in range(K):
        hu, hn, xk, ek = h[1 + K + k], h[1 + 2 * K + k], negx[k], ex[k]
        nz, sc = noise[k], scale[k]
        for i in range(n):
            # u < sigmoid(x) as h < 2**32 / (1 + exp(-x)); the leading successes: the running AND, counted
            run[i] = run[i] & (np.float64(hu[i]) < _TWO32 / (1.0 + ek[i]))
            accepted[i] += run[i]
        for i in range(n):
            ek[i] = _normal(hn[i], ab)
        for i in range(n):
            y = ek[i] * nz                                                    # y *= noise
            y = y - xk[i]                                                     # y += x (y - (-x): the same sum)
            ek[i] = -(y * sc)                                                 # y *= scale, negated for the exp
    return accepted


@_jit
def _scatter(ex, accepted, e, first, count, R, wrap, Kr, cs, acc):
    """Stage 3 (ex = exp(-y)): confidences 1 / (1 + ex) and their running product (survival) of the first Kr
    positions into ring rows ``cs`` / ``acc`` (ring e[r]'s row of step s: e[r] * R + s % R)."""
    i = 0
    for r in range(e.size):
        for j in range(count[r]):
            s = first[r] + j
            at = e[r] * R + ((s & wrap) if wrap else s % R)
            surv = 1.0
            for k in range(Kr):
                c = 1.0 / (1.0 + ex[k, i])
                surv = c if k == 0 else surv * c
                cs[at, k] = c
                cs[at, Kr + k] = surv
            acc[at] = accepted[i]
            i += 1


class CompiledFill:
    """The refill of one :class:`~.acceptance.parametric.KeyedPlan` (compiled on first use; numba caches the
    machine code on disk)."""

    def __init__(self, plan) -> None:
        self.plan = plan
        self.nh = 1 + 3 * plan.mu.shape[1]        # halves per step: block shift, K token shifts, K uniforms, K noises
        self.ab = np.ascontiguousarray(np.stack(normal_table(), axis=1))     # (2**16, 2): a bin's a, b side by side

    def fill(self, keys: np.ndarray, first: np.ndarray, count: np.ndarray, crow: np.ndarray, u: np.ndarray,
             e: np.ndarray, R: int, wrap: int, cs: np.ndarray, acc: np.ndarray) -> None:
        """Draw steps first[r] .. first[r] + count[r] - 1 of the requests with keys ``keys`` (state crow, u) into
        rings ``e`` of ``cs`` (rows of K confidences then K survivals) and ``acc``, as ``PredrawnDraws._fill``."""
        p, i64 = self.plan, np.int64
        first, count = first.astype(i64, copy=False), count.astype(i64, copy=False)
        h = _halves(keys.astype(np.uint64, copy=False), first, count, self.nh)
        negx, ex = _score(h, count, crow.astype(i64, copy=False), u.astype(np.float64, copy=False), p.mu, self.ab,
                          p.sigma_block, p.sigma_tok, p.plain, p.slope, p.offset, p.slope_easy, p.easy_offset)
        with np.errstate(over="ignore"):     # exp(-x) -> inf -> a probability of 0, exactly as the numpy path
            np.exp(ex, out=ex)               # in place, as the numpy path
            accepted = _logit(h, negx, ex, p.noise, p.scale, self.ab)
            np.exp(ex, out=ex)
        _scatter(ex, accepted, e.astype(i64, copy=False), first, count, int(R), int(wrap), cs.shape[1] // 2, cs, acc)


def _mirrored(acceptance, fill) -> dict:
    """The Python code this module copies, by name, looked up now (a patched method counts); ``fill``:
    PredrawnDraws._fill (its caller's, passed in: predraw imports this module)."""
    cls = type(acceptance)
    return {"draw_by_position": cls.draw_by_position, "keyed_plan": cls.keyed_plan,
            "request_state": cls.request_state, "mix64": mix64, "normals_from_halves": normals_from_halves,
            "normal_table": normal_table, "KeyedRows.halves_by_position": KeyedRows.halves_by_position,
            "KeyedRows.halves": KeyedRows.halves, "RequestStreams.rows": RequestStreams.rows,
            "PredrawnDraws._fill": fill}


# jit.fingerprint of each, when the compiled copy was last checked against it (tests/test_fill_jit.py): code that
# differs (edited, or patched at run time) runs on numpy. After a change, make this module follow it and update.
MIRRORED = {
    "draw_by_position": "eaf6a63af018039f",
    "keyed_plan": "ee498b6645eac299",
    "request_state": "3e660e0dc7de1997",
    "mix64": "a79d4a2690196044",
    "normals_from_halves": "9dca90ecfcc16e30",
    "normal_table": "ceb4c78785a2ae3f",
    "KeyedRows.halves_by_position": "83702f9dcbb56731",
    "KeyedRows.halves": "26680efa301e8580",
    "RequestStreams.rows": "6e072dfb67185c73",
    "PredrawnDraws._fill": "c5b096890d856a5a",
}


def mirror_changes(acceptance, fill) -> list[str]:
    """The copied code that differs from what this module was checked against (empty: none); ``fill``:
    PredrawnDraws._fill."""
    return jit.changed(_mirrored(acceptance, fill), MIRRORED)


def fingerprints(acceptance, fill) -> dict[str, str]:
    """jit.fingerprint of each copied function as it is now (MIRRORED's entries)."""
    return {name: jit.fingerprint(obj) for name, obj in _mirrored(acceptance, fill).items()}
