"""The error function, vectorised: ``erf(x) = 2 / sqrt(pi) * integral_0^x exp(-t^2) dt``.

NumPy has no vectorised ``erf`` (only ``math.erf`` on one Python float), and the exact
GELU ``h Phi(h)``, ``Phi(h) = (1 + erf(h / sqrt(2))) / 2``, needs one. As the C libraries do
(W. J. Cody's and Sun's fdlibm ``erf`` split the line into pieces, each with its own rational
approximation), ``|x|`` is split into three pieces, each with a polynomial in a variable ``u``
that runs over [-1, 1]:

* ``|x| < 1``: ``erf(x) = x + x p(u)`` with ``u = 2 x^2 - 1`` (``erf(x) / x`` is an even,
  entire function, so a polynomial in ``x^2`` of degree 12 reaches float64's precision); the
  correction ``x p`` is at most 0.16 of the result, so its rounding reaches ``erf`` reduced;
* ``1 <= |x| < 6``: ``erf(x) = 1 - exp(-x^2) g(u)``, ``g`` approximating the scaled
  complement ``erfcx(x) = exp(x^2) erfc(x)``, which falls slowly (from 0.43 to 0.09), with
  ``u`` the affine map of ``1 / x`` onto [-1, 1] (``erfcx`` is close to ``1 / (x sqrt(pi))``):
  degree 15 on [1, 2.5), degree 7 on [2.5, 6). ``erfc(x) <= 0.16`` there, so its rounding
  (that of ``exp`` and ``x^2`` included) reaches ``erf`` reduced;
* ``|x| >= 6``: ``erf(x) = 1`` in float64 (``erfc(5.93) < 2^-54``, half a unit of 1).

Each piece is evaluated only on the elements in it (Horner's rule, in place). The coefficients
are weighted least-squares fits in 50-digit arithmetic, rounded to float64
(``python benchmarks/fit_erf.py`` derives them again; ``--check`` compares). Float32 and
float16 inputs are computed in float64 and rounded once. Against ``math.erf``
(``tests/nn/test_erf.py``, which asserts 4): at most 1 unit in the last place on its dense
grids, random draws over every exponent, subnormals and tails, in float64 and in float32.
Evaluated in chunks of 2^16 numbers so that a chunk's arrays stay in the cache through the
20-odd passes of Horner's rule (on 2^20 numbers, 1.5-1.8 times faster than whole arrays, measured
under load).
"""
from __future__ import annotations

import numpy as np

__all__ = ["erf", "ERF_SERIES_LIMIT"]

#: |x| below which ``erf(x) = x + x p(u)`` (the even, entire part); above it, ``1 - exp(-x^2) g(u)``
ERF_SERIES_LIMIT = 1.0
#: |x| where the first polynomial of erfcx gives way to the second
_SPLIT = 2.5
#: |x| from which erf(x) is 1 in float64
_ONE = 6.0
#: 1 / x on [1/2.5, 1] and on [1/6, 1/2.5] mapped onto [-1, 1]: u = 1 / x * scale + shift
_MIDDLE_MAP = (2.0 / (1.0 - 1.0 / _SPLIT), -(1.0 + 1.0 / _SPLIT) / (1.0 - 1.0 / _SPLIT))
_TAIL_MAP = (2.0 / (1.0 / _SPLIT - 1.0 / _ONE), -(1.0 / _SPLIT + 1.0 / _ONE) / (1.0 / _SPLIT - 1.0 / _ONE))

#: elements per chunk: a few arrays of it fit in a core's cache (Horner's rule reads them 20 times)
_CHUNK = 1 << 16

#: coefficients c_0 .. c_n of each polynomial sum c_j u^j (benchmarks/fit_erf.py)
_SMALL = (
    -0.03453126133013269,
    -0.1405360890227171,
    0.01985249668898371,
    -0.0022854855611440955,
    0.00021751715604153044,
    -1.7537169441237833e-05,
    1.2233827386914237e-06,
    -7.511569257541793e-08,
    4.115799871187545e-09,
    -2.0352316336879776e-10,
    9.168317079541756e-12,
    -3.80659122412214e-13,
    1.428986767876649e-14,
)
_MIDDLE = (
    0.3336736525414605,
    0.10715869844075553,
    -0.014574460697148711,
    0.0013084127776582784,
    7.272850926603734e-05,
    -7.392383169258182e-05,
    2.2542349072304504e-05,
    -4.651832845504525e-06,
    5.714376231792476e-07,
    4.6424560721658035e-08,
    -5.7428818021248357e-08,
    2.2795938689130562e-08,
    -6.545911122953584e-09,
    1.3105293031372607e-09,
    -5.708570305780484e-11,
    -3.7555967780358134e-11,
)
_TAIL = (
    0.1540874111528878,
    0.05915361910843969,
    -0.0023316661298370934,
    -0.00013618645717287166,
    3.5995524286261666e-05,
    -2.7081276610771095e-06,
    -1.4517232165089587e-07,
    4.4162551210247887e-08,
)

def _horner(coefficients, u):
    """``sum_j c_j u^j`` by Horner's rule, in place on one new array."""
    acc = coefficients[-1] * u + coefficients[-2]
    for c in reversed(coefficients[:-2]):
        acc *= u
        acc += c
    return acc


def _small(a):
    """``erf(a)`` for ``0 <= a < 1``: ``a + a p(2 a^2 - 1)``."""
    u = a * a
    u *= 2.0
    u -= 1.0
    p = _horner(_SMALL, u)
    p *= a
    p += a
    return p


def _large(a, coefficients, scale_shift):
    """``erf(a)`` for ``1 <= a < 6``: ``1 - exp(-a^2) g(u)``, ``u = scale / a + shift``."""
    scale, shift = scale_shift
    u = np.divide(scale, a)
    u += shift
    g = _horner(coefficients, u)
    e = a * a
    np.negative(e, out=e)
    np.exp(e, out=e)  # exp(-36) > 2e-16: never underflows here
    g *= e
    np.subtract(1.0, g, out=g)
    return g


def erf(x) -> np.ndarray:
    """``erf(x)`` elementwise, in ``x``'s floating dtype (float64 for integers and booleans)."""
    x = np.asarray(x)
    dtype = x.dtype if x.dtype.kind == "f" else np.dtype(np.float64)
    flat = x.astype(np.float64).reshape(-1)  # (n,) the pieces in float64, on a flat copy
    out = np.empty_like(flat)
    for start in range(0, flat.size, _CHUNK):  # a chunk's arrays stay in the cache through Horner's rule
        _erf_chunk(flat[start:start + _CHUNK], out[start:start + _CHUNK])
    return out.reshape(x.shape).astype(dtype, copy=False)[()]


def _erf_chunk(x, out):
    """``erf(x)`` of a flat float64 ``x`` into ``out``."""
    a = np.abs(x)
    np.minimum(a, 1.0, out=out)  # 1 for |x| >= 6 and inf, NaN stays NaN; the pieces overwrite the rest
    small = a < ERF_SERIES_LIMIT
    if small.all():  # the common case of an activation: no gather, no scatter
        out[...] = _small(a)
    else:  # each piece on its elements only, gathered and scattered by index (faster than by mask)
        at = np.flatnonzero(small)
        out.put(at, _small(a.take(at)))
        for low, high, coefficients, scale_shift in ((ERF_SERIES_LIMIT, _SPLIT, _MIDDLE, _MIDDLE_MAP),
                                                      (_SPLIT, _ONE, _TAIL, _TAIL_MAP)):
            at = np.flatnonzero((a >= low) & (a < high))
            out.put(at, _large(a.take(at), coefficients, scale_shift))
    np.copysign(out, x, out=out)  # erf is odd; erf(-0) = -0
