"""Residual "Add & Norm" in both placements.

Document 004 ends its multi-head layer with a residual connection followed by layer
normalisation ("Add & Norm"), as the original Transformer does after every sub-layer:

* **post-norm** (the original Transformer, the documents): ``y = LN(x + Sublayer(x))``
* **pre-norm** (GPT-2 and most later models): ``y = x + Sublayer(LN(x))``; the residual
  path is never normalised, which keeps deep stacks trainable without warm-up (a stack of
  pre-norm blocks then needs one final ``LN`` after its last block).

The encoder and decoder blocks (:mod:`attention_ref.nn.encoder_block`,
:mod:`attention_ref.nn.decoder_block`) are sub-layers wrapped by :func:`residual_forward`.
Their parameters live in one flat dict keyed by dotted names (``"self_attn.W_q"``,
``"ln1.gamma"``, ``"ffn.W_1"``), so :func:`attention_ref.gradcheck` can perturb every
parameter of a block at once; :func:`attention_ref.nn.block_params.split_params` and
:func:`attention_ref.nn.block_params.join_grads` convert between that flat dict and one dict per
sub-layer (this module still exports them, their 0.3 path).

Symbols: ``...`` any leading (batch, position) axes, D model width, F hidden width.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from .._checks import as_real_array, as_upstream, unbroadcast
from ..core.linear import glorot_uniform  # re-exported for the block modules
from .block_params import OPTIONAL_PARAMS, check_block_params, check_flag, in_group, join_grads, split_params  # noqa: F401 (0.3's path)
from .layer_norm import LayerNormCache, layer_norm_backward_formula, layer_norm_backward, layer_norm_forward

__all__ = [
    "OPTIONAL_PARAMS",
    "AddNormCache",
    "ResidualCache",
    "add_norm_forward",
    "add_norm_backward",
    "residual_forward",
    "residual_backward",
    "split_params",
    "join_grads",
    "glorot_uniform",
    "in_group",
    "check_block_params",
    "check_flag",
]




class AddNormCache(NamedTuple):
    """Cache of :func:`add_norm_forward`: the layer norm's."""

    norm: LayerNormCache


def add_norm_forward(x, sublayer_out, gamma, beta, eps=1e-5):
    """The documents' "Add & Norm": ``y = LN(x + sublayer_out)``, arguments
    ``(x, sublayer_out, gamma, beta, eps=1e-5)``.

    Parameters
    ----------
    x : array (..., d), the sub-layer's input (the residual path)
    sublayer_out : array (..., d), the sub-layer's output
    gamma, beta : arrays (d,), the layer norm's gain and shift
    eps : the layer norm's epsilon

    Returns
    -------
    y : array (..., d)
    cache : AddNormCache for :func:`add_norm_backward`
    """
    x = as_real_array(x, "x")
    sublayer_out = as_real_array(sublayer_out, "sublayer_out")
    if x.shape != sublayer_out.shape:
        raise ValueError(f"x and sublayer_out must have the same shape for the residual sum,"
                         f" got x {x.shape} and sublayer_out {sublayer_out.shape}")
    y, norm_cache = layer_norm_forward(x + sublayer_out, gamma, beta, eps)  # (..., D)
    return y, AddNormCache(norm_cache)


def add_norm_backward(dy, cache: AddNormCache):
    """Gradients of ``y = LN(x + s)`` (arguments ``dy, cache``): ``(dx, dsublayer_out, dgamma, dbeta)``;
    both summands receive the layer norm's ``dx``.

    Returns ``(dx, dsublayer_out, dgamma, dbeta)``; ``dx`` and ``dsublayer_out`` are equal.
    """
    dsum, dgamma, dbeta = layer_norm_backward(dy, cache.norm)  # (..., D)
    return dsum, dsum.copy(), dgamma, dbeta


class ResidualCache(NamedTuple):
    """Cache of :func:`residual_forward`: the sub-layer's and the layer norm's caches."""

    sublayer: Any  # whatever the sub-layer's forward returned as its cache
    norm: LayerNormCache
    norm_first: bool
    x_shape: tuple  # the input's shape (the output's may be larger: cross-attention can
    # broadcast a shared target sequence against a batch of memories)
    y_shape: tuple  # the output's shape, which dy must have
    y_dtype: np.dtype  # the output's dtype; dy is cast to it


def residual_forward(x, sublayer: Callable, gamma, beta, *, norm_first=False, eps=1e-5):
    """A sub-layer wrapped in its residual connection and layer norm, arguments
    ``(x, sublayer, gamma, beta, *, norm_first=False, eps=1e-5)``.

    ``norm_first=False`` (post-norm): ``y = LN(x + sublayer(x))``;
    ``norm_first=True`` (pre-norm): ``y = x + sublayer(LN(x))``.

    Parameters
    ----------
    x : array (..., d)
    sublayer : callable ``z -> (out, cache)`` with ``out`` shaped like ``z``
    gamma, beta : arrays (d,)
    norm_first : the placement of the layer norm
    eps : the layer norm's epsilon

    Returns
    -------
    y : array (..., d)
    cache : ResidualCache for :func:`residual_backward`
    """
    x = as_real_array(x, "x")
    if norm_first:
        z, norm_cache = layer_norm_forward(x, gamma, beta, eps)  # (..., D)
        s, sub_cache = sublayer(z)  # (..., D)
        _check_sublayer_width(x, s)
        y = x + s
    else:
        s, sub_cache = sublayer(x)  # (..., D)
        _check_sublayer_width(x, s)
        y, norm_cache = layer_norm_forward(x + s, gamma, beta, eps)  # (..., D)
    return y, ResidualCache(sub_cache, norm_cache, norm_first, x.shape, y.shape, y.dtype)


def _check_sublayer_width(x, s):
    """The residual sum ``x + s`` needs the sub-layer's output as wide as its input."""
    if np.shape(s)[-1:] != x.shape[-1:]:
        raise ValueError(f"the sub-layer's output of shape {np.shape(s)} must have the width"
                         f" {x.shape[-1]} of its input x of shape {x.shape} for the residual sum")


def residual_backward(dy, cache: ResidualCache, sublayer_backward: Callable):
    """Gradients of :func:`residual_forward`, arguments ``(dy, cache, sublayer_backward)``.

    ``sublayer_backward(ds, sublayer_cache)`` must return ``(dz, extra)``: the gradient
    with respect to the sub-layer's input and anything else (its parameter gradients).
    The residual path adds ``dy`` (pre-norm) or the layer norm's input gradient (post-norm)
    to ``dz``.

    Returns
    -------
    dx : array (..., d)
    extra : what ``sublayer_backward`` returned besides ``dz``
    dgamma, dbeta : arrays (d,)
    """
    dy = as_upstream(dy, cache.y_shape, cache.y_dtype, "dy")  # a float64 dy keeps float32 float32
    return residual_backward_formula(dy, cache, sublayer_backward)


def residual_backward_formula(dy, cache: ResidualCache, sublayer_backward: Callable):
    """Unchecked backward, for the blocks (they check their own upstream gradient)."""
    if cache.norm_first:
        # y = x + s, s = sublayer(z), z = LN(x)
        dz, extra = sublayer_backward(dy, cache.sublayer)  # (..., D)
        dx_norm, dgamma, dbeta = layer_norm_backward_formula(dz, cache.norm)  # (..., D)
        dx = unbroadcast(dy, cache.x_shape) + dx_norm  # (..., D)
    else:
        # y = LN(x + s), s = sublayer(x)
        dsum, dgamma, dbeta = layer_norm_backward_formula(dy, cache.norm)  # (..., D)
        dz, extra = sublayer_backward(dsum, cache.sublayer)  # (..., D)
        dx = unbroadcast(dsum, cache.x_shape) + dz  # (..., D)
    return dx, extra, dgamma, dbeta


