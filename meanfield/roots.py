"""Root finding in Python: one Brent's method for every scalar root of the package.

The solver kernels have their own compiled root finders (``meanfield._kernels``:
Brent on a bracket, Newton on (K, sigma_w, sigma_b)); everything solved in
Python (critical points, tangent fixed points, the DKS/TAT conditions of
:mod:`meanfield.shaping`) uses :func:`brentq` here.
"""
import math

__all__ = ["brentq"]


def brentq(f, a, b, xtol=2e-12, rtol=8.881784197001252e-16, maxiter=100):
    """A root of ``f`` in [a, b] (f(a) f(b) <= 0) by Brent's method (Brent 1973, ch. 4).

    scipy.optimize.brentq's algorithm (its C routine ``brentq.c``, transcribed step for step, so
    that the iterates are scipy's to the bit), without importing scipy.optimize (~1 s). The root
    is returned to |dx| <= (xtol + rtol |x|) / 2, as scipy's. ValueError when f(a) and f(b) have
    the same sign or f is NaN; RuntimeError when ``maxiter`` iterations do not converge (scipy's
    ``disp=True``)."""
    xpre, xcur = float(a), float(b)
    fpre, fcur = float(f(xpre)), float(f(xcur))
    if math.isnan(fpre) or math.isnan(fcur):
        raise ValueError("f is NaN at a bracket end")
    if fpre * fcur > 0:
        raise ValueError("f(a) and f(b) must have different signs")
    if fpre == 0:
        return xpre
    if fcur == 0:
        return xcur
    xblk = fblk = spre = scur = 0.0
    for _ in range(maxiter):
        if fpre != 0 and fcur != 0 and (math.copysign(1.0, fpre) != math.copysign(1.0, fcur)):
            xblk, fblk = xpre, fpre
            spre = scur = xcur - xpre
        if abs(fblk) < abs(fcur):
            xpre, xcur, xblk = xcur, xblk, xcur
            fpre, fcur, fblk = fcur, fblk, fcur
        delta = (xtol + rtol * abs(xcur)) / 2
        sbis = (xblk - xcur) / 2
        if fcur == 0 or abs(sbis) < delta:
            return xcur
        if abs(spre) > delta and abs(fcur) < abs(fpre):
            if xpre == xblk:  # interpolate
                stry = -fcur * (xcur - xpre) / (fcur - fpre)
            else:  # extrapolate
                dpre = (fpre - fcur) / (xpre - xcur)
                dblk = (fblk - fcur) / (xblk - xcur)
                stry = -fcur * (fblk * dblk - fpre * dpre) / (dblk * dpre * (fblk - fpre))
            if 2 * abs(stry) < min(abs(spre), 3 * abs(sbis) - delta):
                spre, scur = scur, stry  # good short step
            else:
                spre, scur = sbis, sbis  # bisect
        else:
            spre, scur = sbis, sbis
        xpre, fpre = xcur, fcur
        if abs(scur) > delta:
            xcur += scur
        else:
            xcur += delta if sbis > 0 else -delta
        fcur = float(f(xcur))
        if math.isnan(fcur):
            raise ValueError("f is NaN inside the bracket")
    raise RuntimeError(f"brentq: failed to converge after {maxiter} iterations, value is {xcur!r}")
