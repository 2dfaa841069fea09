"""Gemma's RMS normalisation ``y = (1 + w) * x / sqrt(mean(x^2) + eps)``, and its backward.

Llama's RMSNorm (:mod:`attention_ref.nn.rms_norm`) with the gain stored as an offset from 1:
Gemma, Gemma 2 and Gemma 3 keep ``w`` initialised to zeros and multiply by ``1 + w``
(``GemmaRMSNorm``). The same formula as :func:`attention_ref.nn.rms_norm.rms_norm_forward`
with ``weight = 1 + w``, and ``d(1 + w)/dw = 1``, so both directions are that pair's.
Symbols: ``...`` batch axes, D the normalised width.

Forward: 1. ``g = 1 + w``; 2. ``y = rms_norm(x, g)``.
"""
from __future__ import annotations

from .._checks import as_real_array
from .rms_norm import RMSNormCache, rms_norm_backward, rms_norm_formula, rms_norm_forward

__all__ = ["gemma_rms_norm_forward", "gemma_rms_norm_backward", "gemma_rms_norm_formula"]


def gemma_rms_norm_forward(x, weight, eps=1e-6):
    """Gemma's RMS normalisation of each row of ``x`` over its last axis, arguments
    ``(x, weight, eps=1e-6)``: the scale is ``1 + weight``.

    ``y = (1 + w) * x / sqrt(mean(x^2) + eps)`` (transformers' ``GemmaRMSNorm``, ``Gemma2RMSNorm``,
    ``Gemma3RMSNorm``; they compute it in float32 whatever the model's dtype, here it is computed in
    ``x``'s dtype).

    Parameters
    ----------
    x : array (..., d)
    weight : array (d,), the gain's offset ``w`` from 1 (initialised to zeros; transformers' ``weight``)
    eps : positive float added to the mean square (Gemma: ``rms_norm_eps = 1e-6``)

    Returns
    -------
    y : array (..., d)
    cache : RMSNormCache (its ``weight`` is ``1 + w``) for :func:`gemma_rms_norm_backward`
    """
    weight = as_real_array(weight, "weight")  # so that 1 + weight cannot fail; rms_norm checks its shape
    return rms_norm_forward(x, 1.0 + weight, eps)  # 1.0 is a Python float: float32 stays float32


def gemma_rms_norm_backward(dy, cache: RMSNormCache):
    """Gradients of :func:`gemma_rms_norm_forward` (arguments ``dy, cache``): ``(dx, dweight)``.

    2. the RMSNorm backward with ``g = 1 + w``: ``dx = rstd * (h - x_hat * mean(h * x_hat))``,
       ``h = dy * (1 + w)``, and ``dg = sum over rows of dy * x_hat``;
    1. ``g = 1 + w`` gives ``dw = dg``.

    Returns
    -------
    dx : array (..., d)
    dweight : array (d,), ``dw``
    """
    return rms_norm_backward(dy, cache)


def gemma_rms_norm_formula(x, weight, eps):
    """:func:`gemma_rms_norm_forward` on checked inputs (the whole Gemma model's final norm and
    the blocks' norms call it): ``rms_norm_formula(x, 1 + w, eps)``."""
    return rms_norm_formula(x, 1.0 + weight, eps)  # 1.0 is a Python float: float32 stays float32
