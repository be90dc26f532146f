"""Keyed random streams: the draws of request i's j-th step are a pure function of (seed, i, j).

A policy comparison is only paired when every policy sees the same confidences and the same true accepted
prefix for the same request at the same step, whatever else runs beside it (other policies pick other verify
lengths, so requests finish at other times and a shared sequential generator would drift apart after the first
step). Per-request ``numpy.random.Generator`` objects would be paired but cost a Python call per request per step;
instead every word is a counter-based hash (SplitMix64's finaliser, vectorised over the batch):

    key_i   = mix(key + (i + 1) * G1)                         per request
    base_ij = mix(key_i + (j + 1) * G2)                       per request and step (j = -1: request start)
    word_w  = mix(base_ij + (w + 1) * G3)                     w-th 64-bit word of that step

:class:`KeyedRows` exposes the subset of the ``numpy.random.Generator`` API the acceptance sources use
(``random``, ``standard_normal``), with the first axis one row per request: the models need no change and stay
usable with an ordinary Generator. Each 64-bit word gives two 32-bit halves: a uniform takes one (resolution
2**-32, ample for Bernoulli acceptance), a normal one too (inverse CDF from a table, tails to 4.6 sigma: ample for
logit noise).
"""
from __future__ import annotations

import numpy as np

__all__ = ["RequestStreams", "KeyedRows", "mix64", "normals_from_halves", "uniforms_from_halves", "normal_table"]

_G1 = np.uint64(0x9E3779B97F4A7C15)
_G2 = np.uint64(0xD1B54A32D192ED03)
_G3 = np.uint64(0xABC98388FB8FAC03)
_C1 = np.uint64(0xBF58476D1CE4E5B9)
_C2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = (np.uint64(s) for s in (30, 27, 31))
_U32 = 2.0 ** -32
# the hash's numbers, for a compiled copy of it (dsparksim.sim.fill_jit): step and word multipliers, the finaliser's
# two multipliers and three shifts
STEP_MULTIPLIER, WORD_MULTIPLIER, MIX_MULTIPLIERS, MIX_SHIFTS = _G2, _G3, (_C1, _C2), (_S30, _S27, _S31)


def mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser on a uint64 array (a bijection with full avalanche); returns a new array."""
    x = x ^ (x >> _S30)
    x *= _C1
    x ^= x >> _S27
    x *= _C2
    x ^= x >> _S31
    return x


class RequestStreams:
    """The keyed streams of one run (one seed, one named purpose)."""

    def __init__(self, seed: int | np.random.SeedSequence, purpose: int = 0) -> None:
        ss = seed if isinstance(seed, np.random.SeedSequence) else np.random.SeedSequence(int(seed))
        self.key = np.uint64(np.random.SeedSequence([*np.atleast_1d(ss.entropy).tolist(), *ss.spawn_key,
                                                     0x5EED, int(purpose)]).generate_state(1, np.uint64)[0])

    def request_keys(self, ids: np.ndarray) -> np.ndarray:
        """Per-request keys (uint64, 1-d) for workload rows ``ids``."""
        ids = np.atleast_1d(np.asarray(ids, dtype=np.int64))
        if ids.size and ids.min() < 0:
            raise ValueError(f"request ids must be >= 0, got {ids.min()}")
        # uint64 array arithmetic wraps modulo 2**64 silently (the hash relies on it; only scalar ops warn)
        return mix64((ids.astype(np.uint64) + np.uint64(1)) * _G1 + self.key)

    def rows(self, keys: np.ndarray, steps: np.ndarray | int, prefetch: int = 8) -> "KeyedRows":
        """The draws of step ``steps`` (per row, or one for all; -1 = the request's start) of requests ``keys``;
        ``prefetch``: words per row hashed at once (the number a step uses makes it one hash)."""
        st = np.asarray(steps, dtype=np.int64).reshape(-1) + 1     # 1-d: array arithmetic, never a scalar's
        if st.size and st.min() < 0:
            raise ValueError(f"steps must be >= -1, got {st.min() - 1}")
        return KeyedRows(mix64(st.astype(np.uint64) * _G2 + np.asarray(keys, np.uint64)), prefetch)


class KeyedRows:
    """Generator-like draws for n rows; row r's values depend only on its base key and the call sequence.

    Words are hashed in blocks (``prefetch`` words per row at a time, one vectorised hash per block) and consumed as
    32-bit halves: a uniform or a normal takes one half."""

    def __init__(self, base: np.ndarray, prefetch: int = 8) -> None:
        self._base = base
        self.n = int(base.size)
        self._prefetch = max(1, int(prefetch))
        self._words_done = 0
        self._half = np.zeros((self.n, 0), np.uint32)   # (n, 2 * words) unconsumed 32-bit halves
        self._pos = 0

    def halves(self, count: int) -> np.ndarray:
        """The next ``count`` 32-bit halves of every row, (n, count) uint32 (the raw words behind random() and
        standard_normal(): a source may consume them in one call and convert them with the functions below)."""
        if self._pos + count > self._half.shape[1]:
            need = (self._pos + count - self._half.shape[1] + 1) // 2
            width = max(need, self._prefetch)
            w = np.arange(self._words_done + 1, self._words_done + 1 + width, dtype=np.uint64)
            self._words_done += width
            words = mix64(self._base[:, None] + w[None, :] * _G3)                # (n, width)
            rest = self._half[:, self._pos:]
            self._half = np.concatenate([rest, words.view(np.uint32)], axis=1) if rest.size else words.view(np.uint32)
            self._pos = 0
        out = self._half[:, self._pos: self._pos + count]
        self._pos += count
        return out

    def halves_by_position(self, count: int) -> np.ndarray:
        """``halves(count).T`` as a C-contiguous (count, n) array: the same values, one row per half (vectorised
        math over them then runs along rows of n, not n rows of a few). Rows with nothing drawn yet hash their
        words in that layout directly."""
        if self._words_done or self._half.shape[1]:
            return np.ascontiguousarray(self.halves(count).T)
        width = max((count + 1) // 2, self._prefetch)     # the words halves(count) would hash
        w = np.arange(1, width + 1, dtype=np.uint64)
        self._words_done = width
        words = mix64(w[:, None] * _G3 + self._base[None, :]).view(np.uint32)   # (width, 2n): lo, hi per row
        planes = np.empty((2 * width, self.n), np.uint32)
        planes[0::2] = words[:, 0::2]
        planes[1::2] = words[:, 1::2]
        if 2 * width > count:                                # left for later calls, as halves() leaves them
            self._half, self._pos = np.ascontiguousarray(planes[count:].T), 0
        return planes[:count]

    def _shape(self, size) -> tuple[tuple[int, ...], int]:
        if isinstance(size, (int, np.integer)):
            shape, width = (int(size),), 1
        else:
            shape = tuple(int(s) for s in size)
            width = 1
            for s in shape[1:]:
                width *= s
        if not shape or shape[0] != self.n:
            raise ValueError(f"keyed draws need one row per request: size {size} for {self.n} rows")
        return shape, width

    def random(self, size) -> np.ndarray:
        """Uniforms in [0, 1) (resolution 2**-32)."""
        shape, width = self._shape(size)
        return uniforms_from_halves(self.halves(width)).reshape(shape)

    def standard_normal(self, size) -> np.ndarray:
        """Standard normals, one per 32-bit half, by the inverse CDF (see :func:`normal_table`)."""
        shape, width = self._shape(size)
        return normals_from_halves(self.halves(width)).reshape(shape)


def uniforms_from_halves(h: np.ndarray) -> np.ndarray:
    """32-bit halves -> uniforms in [0, 1)."""
    return h * _U32


def normals_from_halves(h: np.ndarray) -> np.ndarray:
    """32-bit halves -> standard normals (inverse CDF, :func:`normal_table`)."""
    ab = _normal_pairs()
    g = ab.take(np.right_shift(h, 16, dtype=np.intp))   # (a, b) of the high 16 bits' bin: one gather, not two
    z = np.bitwise_and(h, 0xFFFF).astype(np.float64)   # the low 16 bits (exact in float64)
    z *= g.imag                                          # b * lo: the same product as b times the uint32
    z += g.real                                          # + a
    return z


_TABLE: tuple[np.ndarray, np.ndarray] | None = None
_PAIRS: np.ndarray | None = None


def _normal_pairs() -> np.ndarray:
    """:func:`normal_table`'s (a, b) as one complex128 array (a + b j): a bin's two numbers in one 16-byte entry."""
    global _PAIRS
    if _PAIRS is None:
        a, b = normal_table()
        pairs = np.empty(a.size, np.complex128)
        pairs.real, pairs.imag = a, b
        _PAIRS = pairs
    return _PAIRS


def normal_table() -> tuple[np.ndarray, np.ndarray]:
    """Inverse normal CDF on 2**16 equal-probability bins, linear inside each: z = a[hi] + b[hi] * lo for a 32-bit
    uniform split into its high and low 16 bits. Exact at every inner bin edge; inside a bin the linear error is
    below 1.3e-3 for 99.99% of draws and at most 0.013 (in the bins next to the outermost ones). The
    two outermost bins (probability 2**-16 each) cannot hold the unbounded tail: each is linear between the inner
    edge (4.17 sigma) and the point that gives the bin the tail's true conditional mean (about 4.61 sigma), so the
    mean, variance and kurtosis stay right. Cheaper than Box-Muller's log/sqrt/cos on these small arrays."""
    global _TABLE
    if _TABLE is None:
        from scipy.special import ndtr, ndtri  # lazy: scipy
        q = 2.0 ** -16
        z = ndtri(np.arange(2 ** 16 + 1, dtype=np.float64) * q)
        inner = -z[1]                                                  # 4.17
        tail_mean = np.exp(-0.5 * inner * inner) / np.sqrt(2 * np.pi) / ndtr(-inner)
        z[0], z[-1] = -(2 * tail_mean - inner), 2 * tail_mean - inner
        _TABLE = (z[:-1].copy(), np.diff(z) * q)
    return _TABLE
