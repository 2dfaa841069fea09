"""Scaled dot-product attention, ``softmax(q k^T / sqrt(d_k) + mask) v``, and its backward.

Symbols: ``...`` batch axes (any number, broadcast between q, k and v), Nq queries,
Nk keys, Dk query/key width, Dv value width; ``P`` the weights, ``S`` the scores.

Forward, numbered so the backward can walk it in reverse:

1. ``S = q k^T / sqrt(d_k)``                              (..., Nq, Nk)
2. masking: ``S[~mask] = -inf`` (boolean) or ``S + mask`` (float)
3. ``P = softmax(S)`` along the keys                      (..., Nq, Nk)
4. ``out = P v``                                          (..., Nq, Dv)

Backward, the same steps in reverse:

4. ``dv = P^T dout``, ``dP = dout v^T``
3. ``dS = P * (dP - D)`` with ``D_i = sum_j P_ij dP_ij = dout_i . out_i``
2. masking: ``S + M`` passes ``dS`` through unchanged (its Jacobian in ``S`` is the
   identity); a blocked key has ``P = 0``, hence ``dS = 0`` there
1. ``dq = dS k / sqrt(d_k)``, ``dk = dS^T q / sqrt(d_k)``

Scores too large for the dtype (``q`` and ``k`` near 1e19 in float32, 1e154 in float64)
raise ``FloatingPointError`` naming q, k, the dtype and its largest finite value, instead
of NaN and a NumPy ``RuntimeWarning`` (a check after the formulas,
:func:`attention_ref._pair_checks.check_scores_finite`). This is the reference; the same
pair for large inputs, with its speed tricks, is :mod:`attention_ref.fast.attention`.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .._checks import as_upstream, signals_land_here, unbroadcast
from .._pair_checks import check_attention_inputs, check_scale, check_scores_finite
from .masks import apply_mask
from .softmax import _softmax

__all__ = [
    "AttentionCache",
    "scaled_dot_product_attention_forward",
    "scaled_dot_product_attention_backward",
]


class AttentionCache(NamedTuple):
    """What the backward needs; ``weights`` are the attention probabilities."""

    q: np.ndarray  # (..., Nq, Dk)
    k: np.ndarray  # (..., Nk, Dk)
    v: np.ndarray  # (..., Nk, Dv)
    weights: np.ndarray  # (..., Nq, Nk), softmax output; 0 where masked. Batch axes: those of q,
    #                      k and the mask (axes only v carries are broadcast in weights @ v)
    out: np.ndarray  # (..., Nq, Dv), kept for D_i = rowsum(dout_i * out_i)
    scale: float  # 1 / sqrt(d_k) unless another scale was given


def _attention_forward(q, k, v, mask, names=("q", "k"), scale=None):
    """Steps 1-4 on checked inputs of one dtype; ``names`` label q and k in an overflow error.
    Step 1 scales q before the product: ``q k^T`` alone can exceed the dtype where S does not."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale  # a Python float: float32 stays float32
    # an overflow is named by the check below; a weight far below 1 times v may round to 0, as it should
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        scores = (q * scale) @ k.swapaxes(-1, -2)  # 1. S = q k^T / sqrt(d_k), (..., Nq, Nk)
        masked = apply_mask(scores, mask)  # 2. S + mask, (..., Nq, Nk)
        weights = _softmax(masked, axis=-1)  # 3. P = softmax(S), (..., Nq, Nk)
        out = weights @ v  # 4. out = P v, (..., Nq, Dv)
        check_scores_finite(scores, masked, mask, q, k, names)  # inside: see _pair_checks.py
    return out, AttentionCache(q, k, v, weights, out, scale)


def _attention_backward(dout, cache: AttentionCache):
    """The forward's steps in reverse, on a checked upstream gradient."""
    q, k, v, P, out, scale = cache
    with np.errstate(under="ignore"):  # products with a weight far below 1 may round to 0, as they should
        dv = P.swapaxes(-1, -2) @ dout  # 4. out = P v: dv = P^T dout, (..., Nk, Dv)
        dP = dout @ v.swapaxes(-1, -2)  # 4.             dP = dout v^T, (..., Nq, Nk)
        # 3. P = softmax(S): the softmax backward dS = P * (dP - D), with its row sum
        #    D_i = sum_j P_ij dP_ij = sum_j P_ij (dout_i . v_j) = dout_i . out_i (Nq*Dv work, not Nq*Nk)
        D = (dout * out).sum(axis=-1, keepdims=True)  # (..., Nq, 1)
        dS = P * (dP - D)  # (..., Nq, Nk)
        # 2. masking: dS passes through S + mask unchanged (blocked keys have P = 0, so dS = 0)
        dq = dS @ k * scale  # 1. S = q k^T / sqrt(d_k): dq = dS k / sqrt(d_k), (..., Nq, Dk)
        dk = dS.swapaxes(-1, -2) @ q * scale  # 1.        dk = dS^T q / sqrt(d_k), (..., Nk, Dk)
        signals_land_here()  # a Ctrl-C is raised inside the block (_pair_checks.py)
    return unbroadcast(dq, q.shape), unbroadcast(dk, k.shape), unbroadcast(dv, v.shape)


def scaled_dot_product_attention_forward(q, k, v, mask=None, *, scale=None):
    """Scaled dot-product attention ``softmax(q k^T / sqrt(d_k) + mask) v``, arguments
    ``(q, k, v, mask)``; a boolean mask is True where a query may attend (as torch's
    ``scaled_dot_product_attention``), any number of leading axes (B, H, ...) broadcast.

    Parameters
    ----------
    q : array (..., n_q, d_k), queries
    k : array (..., n_k, d_k), keys
    v : array (..., n_k, d_v), values
    mask : None, bool array (True = may attend) or float array (added to the scaled
        scores), broadcastable to (..., n_q, n_k); see :mod:`attention_ref.core.masks`
    scale : the factor on ``q k^T``; None (default) is ``1 / sqrt(d_k)`` (GPT-2's
        ``scale_attn_weights=False`` is ``scale=1.0``)

    Returns
    -------
    out : array (..., n_q, d_v); zero for a query with no allowed key
    cache : AttentionCache; ``cache.weights`` (..., n_q, n_k) are the probabilities, with
        the batch axes of q, k and the mask (not those that only v carries: the
        probabilities do not depend on v, so they are not repeated for them)

    Raises
    ------
    FloatingPointError : when the scores (plus a float mask) overflow the dtype
    """
    scale, (q, k, v, mask, _) = check_scale(scale), check_attention_inputs(q, k, v, mask)
    out, cache = _attention_forward(q, k, v, mask, scale=scale)
    return out.copy(), cache  # the caller's own copy: editing it cannot change the backward


def scaled_dot_product_attention_backward(dout, cache: AttentionCache):
    """Gradients of scaled dot-product attention (arguments ``dout, cache``): ``(dq, dk, dv)``.

    Walking the forward in reverse, with ``P = weights`` and ``S = scores``:

    4. ``out = P v``          gives ``dv = P^T dout`` and ``dP = dout v^T``
    3. ``P = softmax(S)``     gives ``dS = P * (dP - D)`` with ``D_i = sum_j P_ij dP_ij``
    2. masking                ``S + M`` passes ``dS`` through (identity Jacobian in ``S``)
    1. ``S = q k^T / sqrt(d_k)`` gives ``dq = dS k / sqrt(d_k)``, ``dk = dS^T q / sqrt(d_k)``

    Parameters
    ----------
    dout : array (..., n_q, d_v), upstream gradient
    cache : AttentionCache from the forward

    Returns
    -------
    dq : array, shape of q
    dk : array, shape of k
    dv : array, shape of v
    """
    return _attention_backward(as_upstream(dout, cache.out.shape, cache.out.dtype), cache)
