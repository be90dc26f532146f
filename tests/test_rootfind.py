"""dsparksim.acceptance.rootfind.brentq returns bitwise SciPy's brentq roots (it replaces it on the start-up path)."""
from __future__ import annotations

import math

import numpy as np
import pytest

scipy_optimize = pytest.importorskip("scipy.optimize")

from dsparksim.acceptance.calibration import smoothed_sigmoid, tau_of_curve  # noqa: E402
from dsparksim.acceptance.rootfind import brentq  # noqa: E402


def _families(rng):
    """(f, a, b) with a sign change: smooth, flat, steep, jagged, exactly-hit and the calibration's own gaps."""
    out = []
    for _ in range(150):
        c = rng.normal(size=4)
        r = rng.uniform(-3, 3)
        out.append((lambda x, c=c, r=r: (x - r) * (1 + c[0] ** 2 + (c[1] * x) ** 2), r - rng.uniform(0.1, 9),
                    r + rng.uniform(0.1, 9)))
        k = rng.uniform(0.01, 50)
        out.append((lambda x, k=k, r=r: math.tanh(k * (x - r)), -60.0, 60.0))
        out.append((lambda x, r=r: math.exp(x) - math.exp(r), r - 5, r + 1e-3))
        out.append((lambda x, r=r: (x - r) ** 3, -10.0, 10.0))
        s = rng.uniform(0.1, 2.0)
        a = rng.uniform(0.05, 0.97)
        xs = np.linspace(-3, 3, 96)
        w = np.exp(-xs ** 2 / 2)
        w /= w.sum()
        out.append((lambda m, s=s, a=a, w=w, xs=xs: float((w * smoothed_sigmoid(m + s * xs, 0.3)).sum() - a),
                    -60.0, 60.0))
        K = int(rng.integers(1, 16))
        tau = 1 + rng.uniform(0.05, 0.95) * K
        out.append((lambda v, K=K, tau=tau: tau_of_curve(np.full(K, v)) - tau, 0.0, 1.0))
    out.append((lambda x: x, -1.0, 1.0))           # exact hit at 0 within the loop
    out.append((lambda x: x - 2.0, 2.0, 5.0))      # root at a
    out.append((lambda x: x - 5.0, 2.0, 5.0))      # root at b
    return out


def test_brentq_equals_scipy_bitwise():
    rng = np.random.default_rng(11)
    for tol in ({}, {"xtol": 1e-12, "rtol": 1e-14, "maxiter": 200}, {"xtol": 1e-15, "rtol": 1e-15},
                {"xtol": 1e-3}):
        for f, a, b in _families(rng):
            try:
                want = scipy_optimize.brentq(f, a, b, **tol)
            except RuntimeError:  # no convergence within maxiter: the same error from both
                with pytest.raises(RuntimeError, match="converge"):
                    brentq(f, a, b, **tol)
                continue
            got = brentq(f, a, b, **tol)
            assert type(got) is float
            assert got == want or (math.isnan(got) and math.isnan(want)), (a, b, tol, got, want)
            assert math.copysign(1, got) == math.copysign(1, want)


def test_brentq_errors_match_scipy():
    for kw in ({"xtol": 0.0}, {"rtol": 1e-17}):
        with pytest.raises(ValueError):
            scipy_optimize.brentq(lambda x: x, -1, 1, **kw)
        with pytest.raises(ValueError):
            brentq(lambda x: x, -1, 1, **kw)
    with pytest.raises(ValueError, match="different signs"):
        brentq(lambda x: x * x + 1, -1.0, 1.0)
    with pytest.raises(ValueError, match="NaN"):
        brentq(lambda x: float("nan") if x > 0.3 else -1.0, -1.0, 1.0)
    with pytest.raises(RuntimeError, match="converge"):
        brentq(lambda x: math.tanh(x - 0.123456789), -1e6, 1e6, maxiter=3)
    with pytest.raises(RuntimeError):
        scipy_optimize.brentq(lambda x: math.tanh(x - 0.123456789), -1e6, 1e6, maxiter=3)
    assert brentq(lambda x, c: x - c, 0.0, 4.0, args=(1.5,)) == scipy_optimize.brentq(lambda x, c: x - c, 0.0, 4.0,
                                                                                     args=(1.5,))


def test_calibration_uses_the_plain_python_root_finder():
    import dsparksim.acceptance.calibration as cal
    assert cal.brentq is brentq
