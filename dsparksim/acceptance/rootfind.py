"""Brent's root finder (Brent 1973, as in SciPy's ``optimize.brentq``) in plain Python.

Importing ``scipy.optimize`` costs a quarter to half a second and ~25 MiB at every start-up, for the one brentq
that calibrates the acceptance model. This is the same algorithm, step for step, in IEEE double arithmetic
(Python floats), so it returns bitwise the roots SciPy's returns (tests/test_rootfind.py compares them), with
SciPy's argument checks and errors.
"""
from __future__ import annotations

import math
from typing import Any, Callable

_EPS = 2.220446049250313e-16
_XTOL = 2e-12
_RTOL = 4 * _EPS


def _neg(x: float) -> bool:
    return math.copysign(1.0, x) < 0  # C signbit: also tells -0.0 from 0.0


def brentq(f: Callable[..., Any], a: float, b: float, args: tuple = (), xtol: float = _XTOL,
           rtol: float = _RTOL, maxiter: int = 100) -> float:
    """A root of ``f`` in [a, b] (f(a), f(b) of opposite signs), to within xtol + rtol*|x|.

    ValueError: bad tolerances, f(a) and f(b) of one sign, or f returning NaN; RuntimeError: no convergence
    within maxiter iterations (SciPy's behaviour with its default disp=True).
    """
    if not isinstance(args, tuple):
        args = (args,)
    maxiter = int(maxiter)
    if xtol <= 0:
        raise ValueError(f"xtol too small ({xtol:g} <= 0)")
    if rtol < _RTOL:
        raise ValueError(f"rtol too small ({rtol:g} < {_RTOL:g})")
    if maxiter < 0:
        raise ValueError("maxiter must be >= 0")

    def call(x: float) -> float:
        fx = float(f(x, *args))
        if math.isnan(fx):
            raise ValueError(f"The function value at x={x} is NaN; solver cannot continue.")
        return fx

    xpre, xcur = float(a), float(b)
    xblk = fblk = spre = scur = 0.0
    fpre, fcur = call(xpre), call(xcur)
    if fpre == 0:
        return xpre
    if fcur == 0:
        return xcur
    if _neg(fpre) == _neg(fcur):
        raise ValueError("f(a) and f(b) must have different signs")
    for _ in range(maxiter):
        if fpre != 0 and fcur != 0 and _neg(fpre) != _neg(fcur):
            xblk, fblk = xpre, fpre
            spre = scur = xcur - xpre
        if abs(fblk) < abs(fcur):  # keep the best estimate in xcur
            xpre, xcur, xblk = xcur, xblk, xcur
            fpre, fcur, fblk = fcur, fblk, fcur
        delta = (xtol + rtol * abs(xcur)) / 2
        sbis = (xblk - xcur) / 2
        if fcur == 0 or abs(sbis) < delta:
            return xcur
        if abs(spre) > delta and abs(fcur) < abs(fpre):
            if xpre == xblk:  # secant (linear interpolation)
                stry = -fcur * (xcur - xpre) / (fcur - fpre)
            else:  # inverse quadratic extrapolation
                dpre = (fpre - fcur) / (xpre - xcur)
                dblk = (fblk - fcur) / (xblk - xcur)
                stry = -fcur * (fblk * dblk - fpre * dpre) / (dblk * dpre * (fblk - fpre))
            lim = abs(spre) if abs(spre) < 3 * abs(sbis) - delta else 3 * abs(sbis) - delta
            if 2 * abs(stry) < lim:  # a good short step
                spre, scur = scur, stry
            else:
                spre = scur = sbis
        else:
            spre = scur = sbis
        xpre, fpre = xcur, fcur
        if abs(scur) > delta:
            xcur += scur
        else:
            xcur += delta if sbis > 0 else -delta
        fcur = call(xcur)
    raise RuntimeError(f"Failed to converge after {maxiter} iterations, value is {xcur}.")
