"""The error function, vectorised: ``erf(x) = 2 / sqrt(pi) * integral_0^x exp(-t^2) dt``.

NumPy has no vectorised ``erf`` (only ``math.erf`` on one Python float), and the exact
GELU ``h Phi(h)``, ``Phi(h) = (1 + erf(h / sqrt(2))) / 2``, needs one. Two classical
expansions, each where it converges fast and nothing cancels:

* ``|x| < 1.5``: the Maclaurin series ``erf(x) = 2 / sqrt(pi) sum_n (-1)^n x^(2n+1) / (n! (2n + 1))``
  (Abramowitz and Stegun 7.1.5), 31 terms by Horner's rule from the smallest up; its
  terms alternate but never exceed 1.5, so little cancels;
* ``|x| >= 1.5``: ``erf(x) = sign(x) (1 - erfc(|x|))`` with Laplace's continued fraction
  ``erfc(x) = exp(-x^2) / sqrt(pi) / (x + (1/2) / (x + 1 / (x + (3/2) / (x + ...))))``,
  100 levels evaluated from the bottom up; ``erfc(x) <= 0.034`` there, so its rounding
  reaches ``erf`` reduced 30-fold.

In the fraction, ``exp(-x^2)`` is computed as ``exp(-z^2) exp(-(x - z)(x + z))`` with ``z``
= ``x`` rounded to 1/16, so that the rounding of ``x^2`` does not reach the exponent (W. J.
Cody's trick). An input of 32 bits or fewer (float32, float16) needs fewer terms: 18 of the
series (truncation below 2e-11) and 30 levels of the fraction (below 1e-10), both far below
half a float32 unit (3e-8 near 1), so the result rounded to float32 is the same within one unit
in the last place, at a third of the work (the exact GELU of a float32 model's decode step).
Measured against ``math.erf`` over the real line (``tests/nn/test_erf.py``):
at most 1e-15 relative error (about 5e-16 in practice) wherever the result is a normal
float; for ``|x| < 2e-308``, whose ``erf`` is subnormal and has fewer significant bits,
within one unit in the last place.
"""
from __future__ import annotations

import math

import numpy as np

from .._checks import signals_land_here

__all__ = ["erf", "ERF_SERIES_LIMIT"]

#: |x| below which the series is used; above it, the continued fraction for erfc
ERF_SERIES_LIMIT = 1.5
#: c_n = (-1)^n / (n! (2n + 1)); the term n = 30 is below 1e-21 for x^2 < 2.25
_MACLAURIN = tuple((-1) ** n / (math.factorial(n) * (2 * n + 1)) for n in range(31))
_FRACTION_LEVELS = 100  # enough for 1e-16 of erfc from x = 1.5 on (more change nothing)
#: (series terms, fraction levels) for inputs of 32 bits or fewer: errors 1.4e-11 and 7.9e-11
_SHORT = (18, 30)
_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)


def _exp_minus_square(u):
    """``exp(-u^2)`` without the rounding error of ``u^2`` in the exponent."""
    z = np.round(u * 16.0) / 16.0  # z^2 is exact
    with np.errstate(under="ignore"):  # a tail far out is 0, as it should be
        tail = np.exp(-z * z) * np.exp(-(u - z) * (u + z))
        signals_land_here()  # a Ctrl-C is raised inside the block (_pair_checks.py)
    return tail


def erf(x) -> np.ndarray:
    """``erf(x)`` elementwise, in ``x``'s floating dtype (float64 for integers)."""
    x = np.asarray(x)
    dtype = x.dtype if x.dtype.kind == "f" else np.dtype(np.float64)
    a = np.abs(x.astype(np.float64))  # the expansions in float64
    terms, levels = (len(_MACLAURIN), _FRACTION_LEVELS) if dtype.itemsize > 4 else _SHORT
    # |x| < 1.5: the Maclaurin series by Horner's rule, sum_n c_n u^(2n) from the last term
    u = np.minimum(a, ERF_SERIES_LIMIT)
    u2 = u * u
    total = np.zeros_like(u)
    for c in reversed(_MACLAURIN[:terms]):
        total = total * u2 + c
    small = _TWO_OVER_SQRT_PI * u * total
    # |x| >= 1.5: 1 - erfc(|x|), the continued fraction from its deepest level up
    v = np.clip(a, ERF_SERIES_LIMIT, 30.0)  # erfc(30) underflows to 0: erf is 1 beyond
    f = v.copy()
    for k in range(levels, 0, -1):
        f = v + (0.5 * k) / f
    large = 1.0 - _exp_minus_square(v) / (math.sqrt(math.pi) * f)
    out = np.copysign(np.where(a < ERF_SERIES_LIMIT, small, large), x)  # erf is odd; erf(-0) = -0
    return out.astype(dtype, copy=False)
