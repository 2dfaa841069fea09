"""Numerically stable softmax and its backward.

``softmax(x)_j = exp(x_j - m) / sum_l exp(x_l - m)`` with ``m = max_l x_l`` (the row
maximum): subtracting ``m`` changes nothing mathematically and keeps every ``exp``
at most 1, so nothing overflows. Entries of ``-inf`` get weight exactly 0; a row that
is entirely ``-inf`` (a query with no allowed key) gives all zeros, never NaN.

Forward: ``y = softmax(x)``. Backward: ``dx = y * (dy - sum_j dy_j y_j)``.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._checks import as_upstream, signals_land_here
from .._pair_checks import check_softmax_inputs

__all__ = ["SoftmaxCache", "softmax_forward", "softmax_backward"]


class SoftmaxCache(NamedTuple):
    """What ``softmax_backward`` needs: the output probabilities and the axis."""

    y: np.ndarray
    axis: int


def _softmax(x: np.ndarray, axis: int) -> np.ndarray:
    """The formula ``exp(x - m) / sum(exp(x - m))``, ``m`` the maximum along ``axis``."""
    m = x.max(axis=axis, keepdims=True, initial=-np.inf)  # row maximum (-inf for an empty row)
    m[m == -np.inf] = 0  # a row of only -inf: subtract 0, so exp gives 0, never nan
    with np.errstate(over="ignore", under="ignore"):  # x - m past the range is -inf, far below 0 tiny: exp gives 0
        e = np.exp(x - m)
        s = e.sum(axis=axis, keepdims=True)
        s[s == 0] = 1  # a row of only -inf: 0 / 1 = 0 instead of 0 / 0
        y = e / s
        signals_land_here()  # a Ctrl-C is raised inside the block (_pair_checks.py)
    return y


def _softmax_backward(dy: np.ndarray, y: np.ndarray, axis: int) -> np.ndarray:
    """The vector-Jacobian product ``dx_i = y_i (dy_i - sum_j dy_j y_j)``."""
    with np.errstate(under="ignore"):  # a weight far below 1 times dy rounds to 0, as it should
        dx = y * (dy - (dy * y).sum(axis=axis, keepdims=True))
        signals_land_here()  # a Ctrl-C is raised inside the block (_pair_checks.py)
    return dx


def softmax_forward(x, axis=-1):
    """Softmax along ``axis`` (arguments ``(x, axis=-1)``), stable for large inputs and ``-inf`` entries.

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
    x, axis = check_softmax_inputs(x, axis)
    y = _softmax(x, axis)
    return y.copy(), SoftmaxCache(y, axis)  # the caller's own copy: editing it cannot change the backward


def softmax_backward(dy, cache: SoftmaxCache):
    """Gradient of the softmax (arguments ``dy, cache``): ``dx``.

    The Jacobian is ``J_ij = dy_i/dx_j = y_i (delta_ij - y_j)`` (docs/notation.md), so the
    full (not only diagonal) vector-Jacobian product ``dx = J^T dy`` is

        ``dx_j = sum_i dy_i y_i (delta_ij - y_j) = y_j (dy_j - sum_i dy_i y_i)``.

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
