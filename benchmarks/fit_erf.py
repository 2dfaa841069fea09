"""Derive the polynomial coefficients of ``attention_ref/nn/erf.py`` (needs mpmath, which torch's
sympy brings; the package itself does not need it).

Three pieces of ``|x|``, each a polynomial in a variable ``u`` that runs over [-1, 1]:

* ``[0, 1)``: ``erf(x) = x + x p(u)``, ``u = 2 x^2 - 1``, ``p`` fitted to ``erf(x) / x - 1``
  (weight ``x``: the error of ``x p`` is what reaches ``erf``);
* ``[1, 2.5)`` and ``[2.5, 6)``: ``erf(x) = 1 - exp(-x^2) g(u)``, ``u`` the affine map of ``1 / x``
  onto [-1, 1], ``g`` fitted to ``erfcx(x) = exp(x^2) erfc(x)`` (weight ``exp(-x^2)``: the error of
  ``exp(-x^2) g`` is what reaches ``erf``); beyond 6, ``erf(x)`` rounds to 1 (erfc(5.93) < 2^-54).

Each fit is a weighted least-squares fit at Chebyshev points of u, solved in 50-digit
arithmetic, then rounded to float64 (near-minimax: the errors measured in float64 against
``math.erf`` are at most about one unit in the last place, ``tests/nn/test_erf.py``).

Run ``python benchmarks/fit_erf.py`` to print the coefficients (in about a second);
``--check`` compares them with the ones in ``attention_ref/nn/erf.py`` (exit status 1 if they differ).
"""
from __future__ import annotations

import sys
from pathlib import Path

#: (name, degree) of each piece; the degrees are the smallest that keep the float64 error at
#: about one unit in the last place (one less gives 2 to 34 units)
PIECES = (("_SMALL", 12), ("_MIDDLE", 15), ("_TAIL", 7))
MIDDLE, TAIL = (1.0, 2.5), (2.5, 6.0)


def _fit(mp, f, weight, x_of_u, degree):
    """Coefficients c_0..c_degree of sum c_j u^j minimising sum (weight (p - f))^2 at Chebyshev points."""
    m = 6 * degree
    us = [mp.cos(mp.pi * (k + mp.mpf(1) / 2) / m) for k in range(m)]
    A, y = mp.matrix(m, degree + 1), mp.matrix(m, 1)
    for i, u in enumerate(us):
        x = x_of_u(u)
        w = weight(x)
        for j in range(degree + 1):
            A[i, j] = w * u ** j
        y[i] = w * f(x)
    c = mp.lu_solve(A.T * A, A.T * y)
    return tuple(float(c[j]) for j in range(degree + 1))


def coefficients():
    """{piece name: coefficients} as attention_ref/nn/erf.py holds them."""
    import mpmath as mp

    mp.mp.dps = 50

    def erf_over_x_minus_1(t):  # of t = x^2
        return mp.erf(mp.sqrt(t)) / mp.sqrt(t) - 1 if t > 0 else 2 / mp.sqrt(mp.pi) - 1

    def erfcx(x):
        return mp.exp(x * x) * mp.erfc(x)

    out = {"_SMALL": _fit(mp, erf_over_x_minus_1, lambda t: mp.sqrt(t) + mp.mpf(10) ** -30,
                          lambda u: (u + 1) / 2, PIECES[0][1])}
    for (name, degree), (a, b) in zip(PIECES[1:], (MIDDLE, TAIL)):
        s_mid, s_half = (1 / mp.mpf(a) + 1 / mp.mpf(b)) / 2, (1 / mp.mpf(a) - 1 / mp.mpf(b)) / 2
        out[name] = _fit(mp, erfcx, lambda x: mp.exp(-x * x), lambda u: 1 / (s_mid + s_half * u), degree)
    return out


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    fitted = coefficients()
    if "--check" in argv:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from attention_ref.nn import erf as module

        differ = [name for name, c in fitted.items() if getattr(module, name) != c]
        print("the same coefficients" if not differ else f"coefficients differ: {differ}")
        return 1 if differ else 0
    for name, c in fitted.items():
        print(f"{name} = (")
        for v in c:
            print(f"    {v!r},")
        print(")")
    return 0


if __name__ == "__main__":
    sys.exit(main())
