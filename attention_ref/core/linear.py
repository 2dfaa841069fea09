"""Affine map ``y = x W + b`` (row-vector convention of the documents: ``Q = X W^Q``).

Symbols: ``...`` any leading (batch, position) axes, Din input width, Dout output width.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .._batch_blocks import matmul
from .._checks import as_real_array, as_upstream, cast, common_dtype, overflow_error, require_ndim

__all__ = ["LinearCache", "glorot_uniform", "linear_forward", "linear_backward"]


class LinearCache(NamedTuple):
    """What ``linear_backward`` needs: the input and the weight (the bias is not needed)."""

    x: np.ndarray  # (..., Din)
    W: np.ndarray  # (Din, Dout)
    has_bias: bool


def _check_linear(x, W, b, names=("x", "W", "b")):
    """Validate and cast ``x, W, b`` to their common dtype; one line per rule."""
    x_name, W_name, b_name = names
    x = as_real_array(x, x_name)
    W = as_real_array(W, W_name)
    b = None if b is None else as_real_array(b, b_name)
    require_ndim(x, x_name, 1, "(..., d_in)")
    if W.ndim != 2:
        raise ValueError(f"{W_name} must have shape (d_in, d_out), got shape {W.shape}")
    if x.shape[-1] != W.shape[0]:
        raise ValueError(
            f"{x_name} of shape {x.shape} has last dimension {x.shape[-1]}, but {W_name} of"
            f" shape {W.shape} expects d_in = {W.shape[0]}"
        )
    if b is not None and b.shape != (W.shape[1],):
        raise ValueError(
            f"{b_name} must have shape ({W.shape[1]},) to match {W_name} of shape {W.shape},"
            f" got shape {b.shape}"
        )
    dtype = common_dtype(x, W, b)
    return cast(x, dtype), cast(W, dtype), cast(b, dtype)


def linear_forward(x, W, b=None):
    """Affine map ``y = x W + b``.

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
    x, W, b = _check_linear(x, W, b)
    return _linear_finite(x, W, b), LinearCache(x, W, b is not None)


def _matmul_rows(x, W):
    """``x @ W`` for ``x`` of shape (..., Din), as ONE (rows, Din) @ (Din, Dout) product.

    ``x @ W`` with a 3-D ``x`` makes NumPy call BLAS once per leading index on short
    matrices; folding the leading axes into the rows (a view when ``x`` is C-contiguous)
    gives one tall product, which BLAS runs faster. Same numbers, same shape.
    """
    if x.ndim > 2 and x.size and x.flags.c_contiguous:
        y = matmul(x.reshape(-1, x.shape[-1]), W)  # (rows, Dout); y = x W
        return y.reshape(x.shape[:-1] + (W.shape[1],))  # (..., Dout)
    if x.ndim == 2:
        return matmul(x, W)  # (rows, Dout); y = x W
    return x @ W  # (..., Dout)


def _linear(x, W, b):
    """The unchecked affine map (callers have validated and cast)."""
    y = _matmul_rows(x, W)  # (..., Dout)
    if b is not None:
        y += b  # y is fresh: adding in place saves one (..., Dout) array
    return y


def _linear_finite(x, W, b, names=("x", "W", "b")):
    """:func:`_linear` that raises ``FloatingPointError`` naming its inputs when ``y`` overflows.

    The check is one pass over ``y`` (..., Dout), small next to the product's Din * Dout
    operations per row."""
    with np.errstate(over="ignore", invalid="ignore"):  # reported below, by name
        y = _linear(x, W, b)  # (..., Dout)
    if not np.isfinite(y).all():
        x_name, W_name, b_name = names
        inputs = [(x_name, x), (W_name, W)] + ([] if b is None else [(b_name, b)])
        what = f"{x_name} {W_name}" + ("" if b is None else f" + {b_name}")
        raise overflow_error(what, y.dtype, inputs)
    return y


def linear_backward(dy, cache: LinearCache):
    """Gradients of ``y = x W + b``.

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


def _linear_backward(dy, cache: LinearCache):
    """Unchecked backward, for callers that have checked their own upstream gradient."""
    x, W, has_bias = cache
    dx = _matmul_rows(dy, W.T)  # dx = dy W^T, (..., Din)
    rows = math.prod(x.shape[:-1])  # explicit: reshape(-1, 0) cannot infer rows when Din = 0
    x2 = x.reshape(rows, x.shape[-1])  # (rows, Din)
    dy2 = dy.reshape(rows, dy.shape[-1])  # (rows, Dout)
    dW = matmul(x2.T, dy2)  # (Din, Dout); dW = x^T dy
    db = dy2.sum(axis=0) if has_bias else None  # (Dout,)
    return dx, dW, db


def glorot_uniform(rng, fan_in: int, fan_out: int, dtype=np.float64) -> np.ndarray:
    """Xavier/Glorot uniform weights ``U(-a, a)``, ``a = sqrt(6 / (fan_in + fan_out))``,
    drawn from the ``numpy.random.Generator`` ``rng`` (the layers' seeded initialisation)."""
    a = float(np.sqrt(6.0 / (fan_in + fan_out)))
    return rng.uniform(-a, a, size=(fan_in, fan_out)).astype(dtype)  # (fan_in, fan_out)
