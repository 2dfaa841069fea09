"""Affine map ``y = x W + b`` (row vectors: ``Q = X W^Q``, as documents 000, 001 and 004 write it;
document 002's column form ``q_i = W_Q x_i`` is the same map with ``W^Q = W_Q^T``).

Symbols: ``...`` any leading (batch, position) axes, Din input width, Dout output width.

Forward: ``y = x W + b``. Backward: ``dx = dy W^T``, ``dW = x^T dy`` and ``db = sum dy``,
both sums over every leading axis (each row of ``x`` used ``W`` and ``b`` once).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .._checks import as_upstream, signals_land_here
from .._pair_checks import check_linear_inputs, check_result_finite

__all__ = ["LinearCache", "glorot_uniform", "linear_forward", "linear_backward"]


class LinearCache(NamedTuple):
    """What ``linear_backward`` needs: the input and the weight (the bias is not needed)."""

    x: np.ndarray  # (..., Din)
    W: np.ndarray  # (Din, Dout)
    has_bias: bool


def _linear_finite(x, W, b, names=("x", "W", "b")):
    """``y = x W + b`` on checked inputs; an overflow raises ``FloatingPointError`` naming them."""
    with np.errstate(over="ignore", invalid="ignore"):  # an overflow is named by the check below
        y = x @ W  # (..., Dout)
        if b is not None:
            y = y + b  # (..., Dout)
        check_result_finite(y, x, W, b, names)  # inside: see _pair_checks.py
    return y


def _linear_backward(dy, cache: LinearCache):
    """``dx = dy W^T``, ``dW = x^T dy``, ``db = sum dy`` on a checked upstream gradient."""
    x, W, has_bias = cache
    rows = math.prod(x.shape[:-1])  # every leading axis is a row
    x2, dy2 = x.reshape(rows, x.shape[-1]), dy.reshape(rows, dy.shape[-1])  # (rows, Din), (rows, Dout)
    with np.errstate(under="ignore"):  # a gradient far below 1 (past a tiny weight) may round to 0
        dx = dy @ W.T  # (..., Din)
        dW = x2.T @ dy2  # (Din, Dout)
        db = dy2.sum(axis=0) if has_bias else None  # (Dout,)
        signals_land_here()  # a Ctrl-C is raised inside the block (_pair_checks.py)
    return dx, dW, db


def linear_forward(x, W, b=None):
    """Affine map ``y = x W + b``, arguments ``(x, W, b)``; ``W`` is ``(d_in, d_out)``, the transpose
    of torch's ``Linear.weight`` (``(d_out, d_in)``): pass ``linear.weight.T``.

    Parameters
    ----------
    x : array (..., d_in)
    W : array (d_in, d_out)
    b : array (d_out,) or None

    Returns
    -------
    y : array (..., d_out)
    cache : LinearCache for :func:`linear_backward`

    Raises
    ------
    FloatingPointError : when ``x W + b`` overflows the dtype (names x, W, b and their sizes)
    """
    x, W, b = check_linear_inputs(x, W, b)
    return _linear_finite(x, W, b), LinearCache(x, W, b is not None)


def linear_backward(dy, cache: LinearCache):
    """Gradients of ``y = x W + b`` (arguments ``dy, cache``): ``(dx, dW, db)``, ``dW`` ``(d_in, d_out)``
    like ``W`` (torch's ``weight.grad`` is its transpose).

    ``dx = dy W^T``, ``dW = sum over rows of x^T dy``, ``db = sum over rows of dy``.

    Parameters
    ----------
    dy : array (..., d_out), upstream gradient
    cache : LinearCache from :func:`linear_forward`

    Returns
    -------
    dx : array (..., d_in)
    dW : array (d_in, d_out)
    db : array (d_out,), or None when the forward had no bias
    """
    x, W, _ = cache
    return _linear_backward(as_upstream(dy, x.shape[:-1] + (W.shape[1],), x.dtype, "dy"), cache)


def glorot_uniform(rng, fan_in: int, fan_out: int, dtype=np.float64) -> np.ndarray:
    """Xavier/Glorot uniform weights ``U(-a, a)``, ``a = sqrt(6 / (fan_in + fan_out))``,
    drawn from the ``numpy.random.Generator`` ``rng`` (the layers' seeded initialisation)."""
    a = float(np.sqrt(6.0 / (fan_in + fan_out)))
    return rng.uniform(-a, a, size=(fan_in, fan_out)).astype(dtype)  # (fan_in, fan_out)
