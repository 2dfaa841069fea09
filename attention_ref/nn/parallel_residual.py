"""GPT-NeoX's parallel residual, ``y = x + attn(LN_1(x)) + mlp(LN_2(x))``, and its backward.

A pre-norm block (:func:`attention_ref.nn.residual.residual_forward`) runs its two sub-layers one
after the other: ``h = x + attn(LN_1(x))``, ``y = h + mlp(LN_2(h))``. GPT-NeoX / Pythia
(``use_parallel_residual = True``), GPT-J and Phi-2 feed both sub-layers the same ``x`` and add
both outputs to it, so the two can run at once. The sub-layers are any forward/backward pairs
(GPT-NeoX's block, :mod:`attention_ref.nn.gpt_neox_block`, calls :func:`parallel_residual_formula`
with its attention and MLP, in a forward and in a decoding step). Symbols: ``...`` any leading (batch, position) axes, D model width.

Forward, numbered so the backward can walk it in reverse:

1. ``z_1 = LN_1(x)``, ``z_2 = LN_2(x)``   (layer norms with gain and shift; GPT-NeoX's have biases)
2. ``s_1 = attn(z_1)``, ``s_2 = mlp(z_2)``
3. ``y = x + s_1 + s_2``
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from .._checks import as_upstream
from .layer_norm import LayerNormCache, layer_norm_backward_formula, check_norm_inputs, layer_norm_formula

__all__ = ["ParallelResidualCache", "parallel_residual_forward", "parallel_residual_backward",
           "parallel_residual_formula", "parallel_residual_backward_formula"]


class ParallelResidualCache(NamedTuple):
    """The two layer norms' and the two sub-layers' caches, and the output's shape and dtype."""

    norm_1: LayerNormCache
    norm_2: LayerNormCache
    sublayer_1: Any  # whatever attn's forward returned as its cache
    sublayer_2: Any  # whatever mlp's forward returned as its cache
    shape: tuple  # (..., D)
    dtype: np.dtype


def _check_width(name, x, s):
    """Both sub-layers' outputs are added to x: they must have its shape."""
    if np.shape(s) != x.shape:
        raise ValueError(f"{name}'s output of shape {np.shape(s)} must have the shape {x.shape} of its input x"
                         " for the residual sum")


def parallel_residual_forward(x, attn: Callable, mlp: Callable, gamma_1, beta_1, gamma_2, beta_2, eps=1e-5):
    """``y = x + attn(LN_1(x)) + mlp(LN_2(x))``, arguments
    ``(x, attn, mlp, gamma_1, beta_1, gamma_2, beta_2, eps=1e-5)``.

    Parameters
    ----------
    x : array (..., d)
    attn, mlp : callables ``z -> (out, cache)`` with ``out`` shaped like ``z`` (the attention and
        feed-forward sub-layers, their parameters bound)
    gamma_1, beta_1, gamma_2, beta_2 : arrays (d,), the two layer norms (GPT-NeoX's
        ``input_layernorm`` and ``post_attention_layernorm``)
    eps : the layer norms' epsilon (GPT-NeoX's ``layer_norm_eps``)

    Returns
    -------
    y : array (..., d)
    cache : ParallelResidualCache for :func:`parallel_residual_backward`
    """
    # the four norm parameters named as they are here (layer_norm_forward would call both "gamma")
    x, gamma_1, beta_1, gamma_2, beta_2, eps = check_norm_inputs(x, eps, gamma_1=gamma_1, beta_1=beta_1,
                                                                 gamma_2=gamma_2, beta_2=beta_2)
    return parallel_residual_formula(x, _width_checked("attn", x, attn), _width_checked("mlp", x, mlp),
                                     gamma_1, beta_1, gamma_2, beta_2, eps)


def _width_checked(name, x, sublayer):
    """``sublayer`` whose output is checked to have x's shape before the residual sum."""
    def run(z):
        s, cache = sublayer(z)
        _check_width(name, x, s)
        return s, cache
    return run


def parallel_residual_formula(x, attn: Callable, mlp: Callable, gamma_1, beta_1, gamma_2, beta_2, eps):
    """:func:`parallel_residual_forward` on checked inputs (the sub-layers trusted to return x's
    shape; GPT-NeoX's block calls it)."""
    # 1. the two norms of the same x
    z_1, norm_1 = layer_norm_formula(x, gamma_1, beta_1, eps)  # (..., D)
    z_2, norm_2 = layer_norm_formula(x, gamma_2, beta_2, eps)  # (..., D)
    # 2. the two sub-layers
    s_1, cache_1 = attn(z_1)  # (..., D)
    s_2, cache_2 = mlp(z_2)  # (..., D)
    # 3. both added to the residual stream
    y = x + s_1 + s_2  # (..., D)
    return y, ParallelResidualCache(norm_1, norm_2, cache_1, cache_2, y.shape, y.dtype)


def parallel_residual_backward(dy, cache: ParallelResidualCache, attn_backward: Callable, mlp_backward: Callable):
    """Gradients of :func:`parallel_residual_forward`, its steps in reverse, arguments
    ``(dy, cache, attn_backward, mlp_backward)``.

    3. ``y = x + s_1 + s_2``: ``dy`` reaches ``x``, ``s_1`` and ``s_2`` unchanged.
    2. ``s_1 = attn(z_1)``, ``s_2 = mlp(z_2)``: ``attn_backward(dy, cache) -> (dz_1, extra_1)``,
       ``mlp_backward(dy, cache) -> (dz_2, extra_2)`` (``extra``: their parameter gradients).
    1. ``z_i = LN_i(x)``: the layer norm backward of each, ``dx = dy + LN_1'(dz_1) + LN_2'(dz_2)``
       (three paths from ``x`` to ``y``, their gradients summed).

    Returns
    -------
    dx : array (..., d)
    extra_1, extra_2 : what ``attn_backward`` and ``mlp_backward`` returned besides ``dz``
    dgamma_1, dbeta_1, dgamma_2, dbeta_2 : arrays (d,)
    """
    return parallel_residual_backward_formula(as_upstream(dy, cache.shape, cache.dtype, "dy"), cache, attn_backward,
                                              mlp_backward)


def parallel_residual_backward_formula(dy, cache: ParallelResidualCache, attn_backward: Callable,
                                       mlp_backward: Callable):
    """:func:`parallel_residual_backward` on a checked ``dy``."""
    # 2. the sub-layers
    dz_1, extra_1 = attn_backward(dy, cache.sublayer_1)  # (..., D)
    dz_2, extra_2 = mlp_backward(dy, cache.sublayer_2)  # (..., D)
    # 1. the norms, 3. the residual path
    dx_1, dgamma_1, dbeta_1 = layer_norm_backward_formula(dz_1, cache.norm_1)  # (..., D)
    dx_2, dgamma_2, dbeta_2 = layer_norm_backward_formula(dz_2, cache.norm_2)  # (..., D)
    return dy + dx_1 + dx_2, extra_1, extra_2, dgamma_1, dbeta_1, dgamma_2, dbeta_2
