"""The gated RMSNorm on Gated DeltaNet's output (Qwen3-Next's ``Qwen3NextRMSNormGated``),
``y = weight * x / sqrt(mean(x^2) + eps) * silu(z)``, and its backward.

The delta rule's read-out is normalised per head (RMSNorm over the value width, gain initialised to
ones, not Qwen3-Next's ``1 + weight`` of its other norms), then multiplied by ``silu(z)``, a gate
projected from the layer's input: the norm comes first, the gate after ("norm before gate").

Symbols: ``...`` batch axes, D the normalised width.

Forward: 1. ``h = weight * x / sqrt(mean(x^2) + eps)`` (:func:`attention_ref.nn.rms_norm_forward`);
2. ``y = h * silu(z)``.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._checks import as_real_array, as_upstream, signals_land_here
from .layer_norm import check_norm_inputs
from .rms_norm import RMSNormCache, rms_norm_backward_formula, rms_norm_formula
from .swiglu import _sigmoid

__all__ = ["GatedRMSNormCache", "gated_rms_norm_forward", "gated_rms_norm_backward", "gated_rms_norm_formula"]


class GatedRMSNormCache(NamedTuple):
    """The norm's cache, its output, the gate and its sigmoid."""

    norm: RMSNormCache
    h: np.ndarray  # (..., D)
    z: np.ndarray  # (..., D)
    s: np.ndarray  # (..., D), sigmoid(z)


def gated_rms_norm_forward(x, z, weight, eps=1e-6):
    """RMSNorm of ``x`` over its last axis, then times ``silu(z)``. Arguments ``(x, z, weight, eps=1e-6)``.

    Parameters
    ----------
    x : array (..., d), the value read from the state
    z : array (..., d), the gate (Qwen3-Next's ``z`` from ``in_proj_qkvz``)
    weight : array (d,), the gain (initialised to ones)
    eps : positive float inside the root (Qwen3-Next's ``rms_norm_eps``)

    Returns
    -------
    y : array (..., d)
    cache : GatedRMSNormCache for :func:`gated_rms_norm_backward`
    """
    x, weight, eps = check_norm_inputs(x, eps, weight=weight)
    z = as_real_array(z, "z")
    if z.shape != x.shape:
        raise ValueError(f"z must have x's shape {x.shape}, got {z.shape}")
    return gated_rms_norm_formula(x, z.astype(x.dtype, copy=False), weight, eps)


def gated_rms_norm_formula(x, z, weight, eps):
    """:func:`gated_rms_norm_forward` on checked inputs."""
    h, norm = rms_norm_formula(x, weight, eps)  # 1. (..., D)
    s = _sigmoid(z)  # (..., D)
    return h * (z * s), GatedRMSNormCache(norm, h, z, s)  # 2.


def gated_rms_norm_backward(dy, cache: GatedRMSNormCache):
    """Gradients of :func:`gated_rms_norm_forward` (arguments ``dy, cache``): ``(dx, dz, dweight)``.

    2. ``y = h silu(z)``: ``dh = dy silu(z)``, ``dz = dy h s (1 + z (1 - s))``
    1. the RMSNorm's backward of ``dh`` gives ``dx`` and ``dweight``

    Returns
    -------
    dx, dz : arrays (..., d); dweight : (d,)
    """
    h, z, s = cache.h, cache.z, cache.s
    dy = as_upstream(dy, h.shape, h.dtype, "dy")
    with np.errstate(over="ignore"):
        dz = dy * h * s * (1.0 + z * (1.0 - s))  # (..., D)
        signals_land_here()  # a Ctrl-C is raised inside the block (_pair_checks.py)
    dx, dweight = rms_norm_backward_formula(dy * (z * s), cache.norm)
    return dx, dz, dweight
