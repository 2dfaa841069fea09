"""The affine map ``y = x W + b`` for large inputs: each product as ONE tall BLAS product.

``x @ W`` with a 3-D ``x`` makes NumPy call BLAS once per leading index on short matrices;
folding the leading axes into the rows (a view when ``x`` is C-contiguous) gives one
``(rows, Din) @ (Din, Dout)`` product, which BLAS runs faster. Same formulas as
:mod:`attention_ref.core.linear`, same signatures, same cache.
"""
from __future__ import annotations

import math

import numpy as np

from .._checks import as_upstream, signals_land_here
from .._pair_checks import check_linear_inputs, check_result_finite
from ..core.linear import LinearCache

__all__ = ["linear_forward_fast", "linear_backward_fast"]


def _matmul_rows(x, W):
    """``x @ W`` for ``x`` of shape (..., Din), as one (rows, Din) @ (Din, Dout) product."""
    if x.ndim > 2 and x.size and x.flags.c_contiguous:
        y = x.reshape(-1, x.shape[-1]) @ W  # (rows, Dout)
        return y.reshape(x.shape[:-1] + (W.shape[1],))  # (..., Dout)
    return x @ W  # (..., Dout)


def _linear_finite(x, W, b, names=("x", "W", "b")):
    """``y = x W + b`` on checked inputs; an overflow raises ``FloatingPointError`` naming them."""
    with np.errstate(over="ignore", invalid="ignore"):  # an overflow is named by the check below
        y = _matmul_rows(x, W)  # (..., Dout)
        if b is not None:
            y += b  # y is fresh: adding in place saves one (..., Dout) array
        check_result_finite(y, x, W, b, names)  # inside: see _pair_checks.py
    return y


def _linear_backward(dy, cache: LinearCache):
    """``dx = dy W^T``, ``dW = x^T dy``, ``db = sum dy``, with the tall products."""
    x, W, has_bias = cache
    rows = math.prod(x.shape[:-1])
    x2, dy2 = x.reshape(rows, x.shape[-1]), dy.reshape(rows, dy.shape[-1])  # (rows, Din), (rows, Dout)
    with np.errstate(under="ignore"):  # a gradient far below 1 (past a tiny weight) may round to 0
        dx = _matmul_rows(dy, W.T)  # (..., Din)
        if W.flags.f_contiguous and not W.flags.c_contiguous:  # a transposed view (a tied head's table.T)
            dW = (dy2.T @ x2).T  # (Din, Dout) in W's own layout: its transpose adds to the table fast
        else:
            dW = x2.T @ dy2  # (Din, Dout)
        db = dy2.sum(axis=0) if has_bias else None  # (Dout,)
        signals_land_here()  # a Ctrl-C is raised inside the block (_pair_checks.py)
    return dx, dW, db


def linear_forward_fast(x, W, b=None):
    """:func:`attention_ref.core.linear_forward` with one tall product; the same cache."""
    x, W, b = check_linear_inputs(x, W, b)
    return _linear_finite(x, W, b), LinearCache(x, W, b is not None)


def linear_backward_fast(dy, cache: LinearCache):
    """:func:`attention_ref.core.linear_backward` with one tall product; ``dW`` is laid out as ``W``
    (a transposed view ``W``, such as ``linear.weight.T``, gets a transposed view: ``dW.T`` is
    C-contiguous, as ``linear.weight`` is)."""
    x, W, _ = cache
    return _linear_backward(as_upstream(dy, x.shape[:-1] + (W.shape[1],), x.dtype, "dy"), cache)
