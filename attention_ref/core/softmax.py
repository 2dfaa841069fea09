"""Numerically stable softmax and its backward.

``softmax(x)_j = exp(x_j - m) / sum_l exp(x_l - m)`` with ``m = max_l x_l`` (the row
maximum): subtracting ``m`` changes nothing mathematically and keeps every ``exp``
at most 1, so nothing overflows. Entries of ``-inf`` get weight exactly 0; a row that
is entirely ``-inf`` (a query with no allowed key) gives all zeros, never NaN.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._checks import as_real_array, as_upstream
from .._row_blocks import for_each_row_block

__all__ = ["SoftmaxCache", "softmax_forward", "softmax_backward"]


class SoftmaxCache(NamedTuple):
    """What ``softmax_backward`` needs: the output probabilities and the axis."""

    y: np.ndarray
    axis: int


def _check_axis(axis, ndim: int) -> int:
    """Normalise ``axis`` for an array of ``ndim`` axes, or raise naming it."""
    if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"axis must be an integer, got {axis!r}")
    if not -ndim <= axis < ndim:
        raise ValueError(f"axis {axis} is out of range for an input with {ndim} axes")
    return int(axis) % ndim


def softmax_forward(x, axis=-1):
    """Softmax along ``axis``, stable for large inputs and ``-inf`` entries.

    Parameters
    ----------
    x : array of any shape (``-inf`` allowed; NaN and ``+inf`` are errors)
    axis : int, the axis that sums to one

    Returns
    -------
    y : array, same shape as ``x``; each slice along ``axis`` sums to 1, or is all 0
        when every entry of that slice is ``-inf``
    cache : SoftmaxCache for :func:`softmax_backward`
    """
    x = as_real_array(x, "x", allow_neg_inf=True)
    if x.ndim == 0:
        raise ValueError("x must have at least one axis, got a scalar")
    axis = _check_axis(axis, x.ndim)
    y = _softmax(x, axis)
    return y.copy(), SoftmaxCache(y, axis)  # the caller's own copy: editing it cannot change the backward


class _ScoresOverflow(FloatingPointError):
    """A row maximum of +inf or NaN: overflowed attention scores (``softmax_forward``
    rejects both in its input); the attention forwards re-raise it naming their inputs."""


def _softmax(x: np.ndarray, axis: int, out: np.ndarray | None = None) -> np.ndarray:
    """Unchecked stable softmax; ``out=x`` overwrites ``x`` (for arrays nobody else holds)."""
    if out is x and x.ndim >= 2 and axis % x.ndim == x.ndim - 1 and x.size and x.flags.c_contiguous:
        # the fast path: the same formula, in place, over cache-sized blocks of rows
        # (see _row_blocks.py); every row gets bit-for-bit the same numbers
        rows = x.reshape(-1, x.shape[-1])  # (rows, Nk), a view: x is C-contiguous

        def softmax_rows(start, stop):
            _softmax_plain(rows[start:stop], -1, out=rows[start:stop])

        for_each_row_block(softmax_rows, rows.shape[0], rows.shape[1])
        return x
    return _softmax_plain(x, axis, out)


def _softmax_plain(x: np.ndarray, axis: int, out: np.ndarray | None = None) -> np.ndarray:
    """The formula itself: ``exp(x - m) / sum(exp(x - m))`` with ``m`` the row maximum."""
    m = x.max(axis=axis, keepdims=True, initial=-np.inf)  # row maximum (-inf for an empty row)
    m[m == -np.inf] = 0  # all -inf row: subtract 0 so exp gives 0, never nan
    if not np.isfinite(m).all():  # the check costs (rows, 1): the row maxima, computed anyway
        raise _ScoresOverflow  # no message: the attention forwards re-raise it naming their inputs
    with np.errstate(over="ignore"):  # x - m below the dtype's range is -inf: exp gives 0
        y = np.subtract(x, m, out=out)
    np.exp(y, out=y)
    s = y.sum(axis=axis, keepdims=True)
    s[s == 0] = 1  # all -inf row: 0 / 1 = 0 instead of 0 / 0
    y /= s  # y = exp(x - m) / s
    return y


def softmax_backward(dy, cache: SoftmaxCache):
    """Gradient of the softmax.

    The Jacobian is ``dy_j/dx_i = y_j (delta_ij - y_i)``, so the full
    (not only diagonal) vector-Jacobian product is

        ``dx_i = y_i (dy_i - sum_j dy_j y_j)``.

    Zero rows (all ``-inf`` input) get zero gradient.

    Parameters
    ----------
    dy : array, same shape as the forward output
    cache : SoftmaxCache from :func:`softmax_forward`

    Returns
    -------
    dx : array, same shape as ``dy``
    """
    y, axis = cache
    return _softmax_backward(as_upstream(dy, y.shape, y.dtype, "dy"), y, axis)


def _softmax_backward(dy, y, axis):
    """Unchecked ``y * (dy - sum(dy * y))``."""
    return y * (dy - (dy * y).sum(axis=axis, keepdims=True))
