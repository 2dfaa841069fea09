"""The softmax and its backward in place, over cache-sized row blocks: the fast path's
elementwise ``(..., Nq, Nk)`` work.

The formulas are those of :mod:`attention_ref.core.softmax`; what changes is where they
write (into the fresh scores, or the fresh ``dP``, which nobody else holds: no second
``(..., Nq, Nk)`` array) and in what order (all passes over one block of rows while it is
in the cache, :mod:`attention_ref.fast.row_blocks`). Each row goes through the same NumPy
calls whichever block it lands in, so the blocks change no number.
"""
from __future__ import annotations

import numpy as np

from .._checks import signals_land_here

from .row_blocks import for_each_row_block

__all__ = ["ScoresOverflow", "softmax_in_place", "softmax_backward_in_place"]


class ScoresOverflow(FloatingPointError):
    """A row maximum of +inf or NaN: overflowed attention scores; the attention forward
    re-raises it naming its inputs."""


def _softmax_rows(x: np.ndarray) -> None:
    """``exp(x - m) / sum(exp(x - m))`` along the last axis, written over ``x``."""
    m = x.max(axis=-1, keepdims=True, initial=-np.inf)  # row maximum (-inf for an empty row)
    m[m == -np.inf] = 0  # all -inf row: subtract 0 so exp gives 0, never nan
    if not np.isfinite(m).all():  # the check costs (rows, 1): the row maxima, computed anyway
        raise ScoresOverflow
    with np.errstate(over="ignore", under="ignore"):  # x - m past the range is -inf, far below 0 tiny: exp gives 0
        np.subtract(x, m, out=x)
        signals_land_here()  # a Ctrl-C is raised inside the block (_pair_checks.py)
        np.exp(x, out=x)
        s = x.sum(axis=-1, keepdims=True)
        s[s == 0] = 1  # all -inf row: 0 / 1 = 0 instead of 0 / 0
        x /= s
        signals_land_here()  # a Ctrl-C is raised inside the block (_pair_checks.py)


def softmax_in_place(x: np.ndarray) -> np.ndarray:
    """Softmax along the last axis of ``x`` (an array nobody else holds), written over it.

    Raises :class:`ScoresOverflow` for a row whose maximum is +inf or NaN."""
    if x.ndim >= 2 and x.size and x.flags.c_contiguous:
        rows = x.reshape(-1, x.shape[-1])  # (rows, Nk), a view: x is C-contiguous
        for_each_row_block(lambda start, stop: _softmax_rows(rows[start:stop]), rows.shape[0], rows.shape[1])
    else:
        _softmax_rows(x)
    return x


def softmax_backward_in_place(dP: np.ndarray, P: np.ndarray, D: np.ndarray) -> np.ndarray:
    """``dS = P * (dP - D)`` written over ``dP`` (a fresh array nobody else holds)."""
    with np.errstate(under="ignore"):  # a weight far below 1 times dP may round to 0, as it should
        dS = _softmax_backward_in_place(dP, P, D)
        signals_land_here()  # a Ctrl-C is raised inside the block (_pair_checks.py)
    return dS


def _softmax_backward_in_place(dP, P, D):
    """softmax_backward_in_place, its floating-point settings set."""
    if dP.shape != P.shape or not dP.size or not (dP.flags.c_contiguous and P.flags.c_contiguous):
        dP -= D  # broadcast or strided layouts: in one piece
        dP *= P
        return dP
    n_k = dP.shape[-1]
    dP_rows = dP.reshape(-1, n_k)  # (rows, Nk), views of the contiguous arrays
    P_rows = P.reshape(-1, n_k)  # (rows, Nk)
    D_rows = np.broadcast_to(D, dP.shape[:-1] + (1,)).reshape(-1, 1)  # (rows, 1)

    def rows(start, stop):
        dS = dP_rows[start:stop]
        dS -= D_rows[start:stop]  # dP - D
        dS *= P_rows[start:stop]  # P * (dP - D)

    for_each_row_block(rows, dP_rows.shape[0], n_k)
    return dP
