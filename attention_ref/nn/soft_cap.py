"""Soft-capping ``y = cap * tanh(x / cap)`` (Gemma 2's attention scores and final logits), and its backward.

A smooth clip: ``y ~ x`` for ``|x| << cap`` and ``|y| < cap`` always, so no score or logit
can grow without bound. Gemma 2 caps its attention scores at ``attn_logit_softcapping = 50``
(after the scale, before the mask and the softmax) and its final logits at
``final_logit_softcapping = 30``. Symbols: ``...`` any axes.

Forward: 1. ``t = tanh(x / cap)``; 2. ``y = cap * t``.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._checks import as_real_array, as_upstream, check_positive_real, signals_land_here

__all__ = ["SoftCapCache", "SoftCapScores", "soft_cap_forward", "soft_cap_backward", "soft_cap_formula",
           "soft_cap_backward_formula"]


class SoftCapCache(NamedTuple):
    """``t = tanh(x / cap)``, all the backward needs."""

    t: np.ndarray  # (...), shaped like x


def soft_cap_forward(x, cap):
    """``y = cap * tanh(x / cap)``, elementwise, arguments ``(x, cap)``.

    Parameters
    ----------
    x : array (...)
    cap : positive float (Gemma 2: 50.0 for the scores, 30.0 for the logits)

    Returns
    -------
    y : array shaped like ``x``, in ``x``'s dtype, every entry in ``(-cap, cap)``
    cache : SoftCapCache for :func:`soft_cap_backward`
    """
    return soft_cap_formula(as_real_array(x, "x"), check_positive_real(cap, "cap"))


def soft_cap_backward(dy, cache: SoftCapCache):
    """Gradient of :func:`soft_cap_forward` (arguments ``dy, cache``): ``dx``.

    2.-1. ``dy/dx = cap * (1 - t^2) / cap = 1 - t^2``, so ``dx = dy * (1 - t^2)``.

    Parameters
    ----------
    dy : array shaped like the forward output
    cache : SoftCapCache

    Returns
    -------
    dx : array shaped like ``x``
    """
    return soft_cap_backward_formula(as_upstream(dy, cache.t.shape, cache.t.dtype, "dy"), cache)


def soft_cap_formula(x, cap):
    """:func:`soft_cap_forward` on a checked ``x`` and a positive ``cap`` (Gemma 2's whole model
    caps its logits with it; ``cap`` a Python float keeps float32 float32)."""
    cap = float(cap)
    # 1. t = tanh(x / cap) (tanh saturates to +-1, never overflows), in one fresh array; 2. y = cap * t
    with np.errstate(over="ignore", under="ignore"):  # x / cap past the dtype's range: tanh is +-1 there anyway
        t = np.divide(x, cap, out=np.empty_like(x))  # (...), fresh even for a 0-d x
        np.tanh(t, out=t)  # (...)
        signals_land_here()  # a Ctrl-C is raised inside the block (_pair_checks.py)
    return cap * t, SoftCapCache(t)


def soft_cap_backward_formula(dy, cache: SoftCapCache):
    """:func:`soft_cap_backward` on a checked ``dy``: ``dy * (1 - t^2)``."""
    t = cache.t
    g = np.multiply(t, t, out=np.empty_like(t))  # t^2, fresh even for a 0-d t
    np.subtract(1.0, g, out=g)  # 1 - t^2
    return np.multiply(dy, g, out=g if np.result_type(dy, g) == g.dtype else None)  # dy (1 - t^2)


class SoftCapScores(NamedTuple):
    """Gemma 2's cap on the attention scores as the grouped-heads path's ``scores`` hook
    (:mod:`attention_ref.variants.grouped_heads`): ``C = cap tanh(S / cap)`` on the scaled scores
    before the mask and the softmax; backward ``dS = dC (1 - t^2)``."""

    cap: float  # attn_logit_softcapping

    def forward(self, S):
        return soft_cap_formula(S, self.cap)

    def backward(self, dC, cache: SoftCapCache):
        return soft_cap_backward_formula(dC, cache)
