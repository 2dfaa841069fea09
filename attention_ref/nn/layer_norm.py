"""Layer normalisation over the last axis, and its backward.

``LayerNorm(x) = gamma * (x - mu) / sqrt(var + eps) + beta``, with ``mu`` and ``var``
the mean and the (biased, divide-by-D) variance of each row ``x[..., :]``. Document
004 applies it after the residual connection around the multi-head layer ("Add &
Norm"); :mod:`attention_ref.nn.residual` does both placements.

Symbols: ``...`` any leading (batch, position) axes, D the normalised width.

Forward, numbered so the backward can walk it in reverse:

1. ``mu = mean(x)``, ``var = mean((x - mu)^2)``, ``rstd = 1 / sqrt(var + eps)``
2. ``x_hat = (x - mu) * rstd``
3. ``y = gamma * x_hat + beta``
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .._checks import as_real_array, as_upstream, cast, check_positive_real, common_dtype, require_ndim, signals_land_here

__all__ = ["LayerNormCache", "layer_norm_forward", "layer_norm_backward"]


class LayerNormCache(NamedTuple):
    """What ``layer_norm_backward`` needs: the normalised x, rstd and gamma.

    (llm.c's layernorm keeps ``(x, w, mean, rstd)`` and recomputes ``x_hat`` from them in
    the backward; keeping ``x_hat`` instead saves that recomputation.)
    """

    x_hat: np.ndarray  # (..., D)
    rstd: np.ndarray  # (..., 1)
    gamma: np.ndarray  # (D,)


def check_norm_inputs(x, eps, **params):
    """Validate and cast ``x`` and the per-feature parameters ``params`` (each of shape
    ``(d,)``, in the order given); check ``eps`` is a positive real number. Returns
    ``(x, *params, eps)``; layer norm's and RMSNorm's shared input contract."""
    x = as_real_array(x, "x")
    params = {name: as_real_array(a, name) for name, a in params.items()}
    require_ndim(x, "x", 1, "(..., d)")
    d = x.shape[-1]
    if d == 0:
        raise ValueError(f"x must have a non-empty last axis to normalise over, got shape {x.shape}")
    for name, a in params.items():
        if a.shape != (d,):
            raise ValueError(f"{name} must have shape ({d},) to match x of shape {x.shape},"
                             f" got shape {a.shape}")
    eps = check_positive_real(eps, "eps")
    dtype = common_dtype(x, *params.values())
    return (cast(x, dtype), *(cast(a, dtype) for a in params.values()), eps)


def layer_norm_forward(x, gamma, beta, eps=1e-5):
    """Layer normalisation of each row of ``x`` over its last axis, arguments
    ``(x, gamma, beta, eps=1e-5)`` (torch's ``LayerNorm`` weight, bias and default eps).

    ``y = gamma * (x - mu) / sqrt(var + eps) + beta``, ``mu`` and ``var`` the mean and
    the biased variance (divide by D, as PyTorch's ``LayerNorm``) of the row.

    Parameters
    ----------
    x : array (..., d)
    gamma : array (d,), the gain (initialised to ones in a layer)
    beta : array (d,), the shift (initialised to zeros)
    eps : positive float added to the variance (1e-5, PyTorch's default)

    Returns
    -------
    y : array (..., d)
    cache : LayerNormCache for :func:`layer_norm_backward`
    """
    x, gamma, beta, eps = check_norm_inputs(x, eps, gamma=gamma, beta=beta)
    return layer_norm_formula(x, gamma, beta, eps)


def layer_norm_formula(x, gamma, beta, eps):
    """:func:`layer_norm_forward` on checked inputs (the blocks and the decoding steps call it)."""
    # 1. row statistics
    with np.errstate(over="ignore", invalid="ignore"):  # rows too large are redone below
        mu = x.mean(axis=-1, keepdims=True)  # (..., 1)
        xc = x - mu  # (..., D)
        var = (xc * xc).mean(axis=-1, keepdims=True)  # (..., 1)
        rstd = 1.0 / np.sqrt(var + eps)  # (..., 1); eps is a Python float, float32 stays float32
        # 2. normalise
        x_hat = xc * rstd  # (..., D)
        signals_land_here()  # a Ctrl-C is raised inside the block (_pair_checks.py)
    too_large = ~np.isfinite(var)  # (..., 1): sum or (x - mu)^2 overflowed, x_hat did not have to
    if too_large.any():
        x_hat, rstd = _normalise_scaled(x, eps, too_large, x_hat, rstd)
    # 3. gain and shift
    y = x_hat * gamma + beta  # (..., D)
    return y, LayerNormCache(x_hat, rstd, gamma)


def _normalise_scaled(x, eps, rows, x_hat, rstd):
    """``x_hat`` and ``rstd`` of the ``rows`` whose statistics overflow, from ``x / s`` with
    ``s = max |x|`` of the row: ``x_hat = (xs - mean xs) / sqrt(var(xs) + eps / s^2)`` and
    ``rstd = 1 / (s sqrt(var(xs) + eps / s^2))``, the same numbers without the huge squares."""
    s = np.abs(x).max(axis=-1, keepdims=True)  # (..., 1), > 0 on those rows
    with np.errstate(all="ignore"):  # the other rows are computed and then not used
        xs = x / s  # (..., D), entries in [-1, 1]
        xcs = xs - xs.mean(axis=-1, keepdims=True)  # (..., D)
        spread = (xcs * xcs).mean(axis=-1, keepdims=True) + eps / (s * s)  # (..., 1)
        flat = spread == 0  # a constant row: x_hat = 0 and rstd = 1 / sqrt(eps), as unscaled
        x_hat_s = np.where(flat, 0, xcs / np.sqrt(spread))  # (..., D)
        rstd_s = np.where(flat, 1.0 / math.sqrt(eps), 1.0 / (s * np.sqrt(spread)))  # (..., 1)
        signals_land_here()  # a Ctrl-C is raised inside the block (_pair_checks.py)
    # Python floats (0, 1 / math.sqrt(eps)) take the arrays' dtype: float32 stays float32
    return np.where(rows, x_hat_s, x_hat), np.where(rows, rstd_s, rstd)


def layer_norm_backward(dy, cache: LayerNormCache):
    """Gradients of :func:`layer_norm_forward` (arguments ``dy, cache``): ``(dx, dgamma, dbeta)``.

    With ``g = dy * gamma`` (the gradient reaching ``x_hat``) and means over the last axis:

    ``dx = rstd * (g - mean(g) - x_hat * mean(g * x_hat))``,
    ``dgamma = sum over rows of dy * x_hat``, ``dbeta = sum over rows of dy``.

    The two subtracted terms are the paths through ``mu`` and through ``var``: shifting
    a row or scaling it about its mean leaves ``x_hat`` unchanged, so ``dx`` has zero row
    mean and is orthogonal to ``x_hat``.

    Parameters
    ----------
    dy : array (..., d), upstream gradient
    cache : LayerNormCache from the forward

    Returns
    -------
    dx : array (..., d)
    dgamma, dbeta : arrays (d,)
    """
    return layer_norm_backward_formula(as_upstream(dy, cache.x_hat.shape, cache.x_hat.dtype, "dy"), cache)


def layer_norm_backward_formula(dy, cache: LayerNormCache):
    """Unchecked backward, for callers that have checked their own upstream gradient."""
    x_hat, rstd, gamma = cache
    d = x_hat.shape[-1]
    # 3. y = gamma * x_hat + beta
    dy2 = dy.reshape(-1, d)  # (rows, D)
    dgamma = (dy2 * x_hat.reshape(-1, d)).sum(axis=0)  # (D,)
    dbeta = dy2.sum(axis=0)  # (D,)
    g = dy * gamma  # (..., D), the gradient reaching x_hat
    # 2. and 1. x_hat = (x - mu) * rstd, through mu and var as well as directly
    g_mean = g.mean(axis=-1, keepdims=True)  # (..., 1)
    gx_mean = (g * x_hat).mean(axis=-1, keepdims=True)  # (..., 1)
    dx = rstd * (g - g_mean - x_hat * gx_mean)  # (..., D)
    return dx, dgamma, dbeta
