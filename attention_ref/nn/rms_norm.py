"""RMS normalisation (Llama's ``RMSNorm``), ``y = weight * x / sqrt(mean(x^2) + eps)``, and its backward.

Layer norm without the mean: each row is divided by its root mean square, then scaled by
a learned ``weight`` (no shift). Symbols: ``...`` batch axes, D the normalised width.

Forward, numbered so the backward can walk it in reverse:

1. ``ms = mean(x^2)`` over the last axis, ``rstd = 1 / sqrt(ms + eps)``
2. ``x_hat = x * rstd``
3. ``y = weight * x_hat``

:class:`QKNormRotary` is the multi-head path's hook that RMS-normalises each head's query and key
(Qwen3, Gemma 3) before a rotary hook.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._checks import as_upstream, signals_land_here
from ..variants.rope import RotaryHalf
from .layer_norm import check_norm_inputs

__all__ = ["RMSNormCache", "rms_norm_forward", "rms_norm_backward"]


class RMSNormCache(NamedTuple):
    """What ``rms_norm_backward`` needs: the normalised x, rstd and the weight."""

    x_hat: np.ndarray  # (..., D)
    rstd: np.ndarray  # (..., 1)
    weight: np.ndarray  # (D,)


def rms_norm_forward(x, weight, eps=1e-6):
    """RMS normalisation of each row of ``x`` over its last axis, arguments ``(x, weight, eps=1e-6)``
    (eps is added to the mean square inside the root: transformers' Llama default is 1e-6,
    CS336's 1e-5, torch's ``nn.RMSNorm`` the dtype's machine epsilon; pass the one you compare with).

    ``y = weight * x / sqrt(mean(x^2) + eps)`` (Llama's ``LlamaRMSNorm``, ``eps`` its
    ``rms_norm_eps``; transformers computes it in float32 whatever the model's dtype, here it
    is computed in ``x``'s dtype).

    Parameters
    ----------
    x : array (..., d)
    weight : array (d,), the gain (initialised to ones)
    eps : positive float added to the mean square

    Returns
    -------
    y : array (..., d)
    cache : RMSNormCache for :func:`rms_norm_backward`
    """
    x, weight, eps = check_norm_inputs(x, eps, weight=weight)
    return rms_norm_formula(x, weight, eps)


def rms_norm_formula(x, weight, eps):
    """:func:`rms_norm_forward` on checked inputs (the blocks and the decoding steps call it)."""
    # 1. mean square; a row whose squares overflow is computed from x / max|x| instead
    with np.errstate(over="ignore"):
        ms = (x * x).mean(axis=-1, keepdims=True)  # (..., 1)
        signals_land_here()  # a Ctrl-C is raised inside the block (_pair_checks.py)
    rows = ~np.isfinite(ms)  # (..., 1)
    if rows.any():
        s = np.where(rows, np.abs(x).max(axis=-1, keepdims=True), 1.0)  # (..., 1): 1 on ordinary rows
        xs = x / s  # (..., D), entries in [-1, 1] on the rescaled rows
        with np.errstate(over="ignore", under="ignore"):  # eps / s^2 is 0 on those rows, as it should be
            rstd = 1.0 / (s * np.sqrt((xs * xs).mean(axis=-1, keepdims=True) + eps / (s * s)))  # (..., 1)
            signals_land_here()  # a Ctrl-C is raised inside the block (_pair_checks.py)
    else:
        rstd = 1.0 / np.sqrt(ms + eps)  # (..., 1); eps is a Python float, float32 stays float32
    # 2. normalise, 3. scale
    x_hat = x * rstd  # (..., D)
    return x_hat * weight, RMSNormCache(x_hat, rstd, weight)


def rms_norm_backward(dy, cache: RMSNormCache):
    """Gradients of :func:`rms_norm_forward` (arguments ``dy, cache``): ``(dx, dweight)``.

    3. ``y = weight * x_hat`` gives ``dweight = sum over rows of dy * x_hat`` and
       ``g = dy * weight``, the gradient reaching ``x_hat``.
    2.-1. ``x_hat = x * rstd`` with ``rstd = (mean(x^2) + eps)^(-1/2)``, so
       ``d rstd / dx_j = -rstd^3 x_j / D`` and ``dx = rstd * (g - x_hat * mean(g * x_hat))``.

    Returns
    -------
    dx : array (..., d)
    dweight : array (d,)
    """
    return rms_norm_backward_formula(as_upstream(dy, cache.x_hat.shape, cache.x_hat.dtype, "dy"), cache)


def rms_norm_backward_formula(dy, cache: RMSNormCache):
    """Unchecked backward, for callers that have checked their own upstream gradient."""
    x_hat, rstd, weight = cache
    d = x_hat.shape[-1]
    dweight = (dy * x_hat).reshape(-1, d).sum(axis=0)  # (D,)
    g = dy * weight  # (..., D)
    dx = rstd * (g - x_hat * (g * x_hat).mean(axis=-1, keepdims=True))  # (..., D)
    return dx, dweight


# ---------------------------------------------------------------- the q/k-norm hook of the multi-head path


class QKNormRotary(NamedTuple):
    """Qwen3's step 2b: each head's query and key RMS-normalised over its Dh features (one weight
    (Dh,) for the queries, one for the keys, shared by the heads), then ``rotary`` (a
    :class:`RotaryHalf`).

    Forward: ``q_hat = RMSNorm_q(q)``, ``k_hat = RMSNorm_k(k)``, then ``R(p) q_hat``, ``R(p) k_hat``.
    Backward, in reverse: RoPE's ``R(p)^T``, then RMSNorm's backward on each, whose weight
    gradients ``dq_norm = sum over batch, heads, positions of dq_hat * x_hat`` are returned as
    the third value (the grouped-heads backward adds them to the attention's gradients)."""

    rotary: RotaryHalf | None  # None: no rotation (SmolLM3's NoPE layers)
    q_weight: np.ndarray  # (Dh,)
    k_weight: np.ndarray  # (Dh,)
    eps: float

    def forward(self, q, k):
        q, q_norm = rms_norm_formula(q, self.q_weight, self.eps)  # (..., H, Nq, Dh)
        k, k_norm = rms_norm_formula(k, self.k_weight, self.eps)  # (..., Hkv, Nk, Dh)
        rotary_cache = None
        if self.rotary is not None:
            q, k, rotary_cache = self.rotary.forward(q, k)
        return q, k, (q_norm, k_norm, rotary_cache)

    def backward(self, dq, dk, cache):
        q_norm, k_norm, rotary_cache = cache
        if self.rotary is not None:
            dq, dk = self.rotary.backward(dq, dk, rotary_cache)
        dq, dq_weight = rms_norm_backward_formula(dq, q_norm)  # (..., H, Nq, Dh), (Dh,)
        dk, dk_weight = rms_norm_backward_formula(dk, k_norm)  # (..., Hkv, Nk, Dh), (Dh,)
        return dq, dk, {"q_norm.weight": dq_weight, "k_norm.weight": dk_weight}
