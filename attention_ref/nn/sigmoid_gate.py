"""The sigmoid output gate of gated attention (Qiu et al. 2025; Qwen3-Next's full-attention layers),
``y = x * sigmoid(gate)``, and its backward.

The attention output of each head is multiplied elementwise by ``sigmoid(gate)`` before the output
projection, where ``gate`` is a second projection of the layer's input (Qwen3-Next's ``q_proj``
gives each head its query and its gate side by side). The gate lets a head output nothing (it need
not park its weight on the first token, the "attention sink") and adds a non-linearity between the
value and output projections.

Forward: 1. ``s = sigmoid(gate)``; 2. ``y = x * s``.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._checks import as_real_array, as_upstream, common_dtype
from .swiglu import _sigmoid

__all__ = ["SigmoidGateCache", "sigmoid_gate_forward", "sigmoid_gate_backward"]


class SigmoidGateCache(NamedTuple):
    """The gated input and the gate's sigmoid."""

    x: np.ndarray  # (...)
    s: np.ndarray  # (...)


def sigmoid_gate_forward(x, gate):
    """``x * sigmoid(gate)`` elementwise. Arguments ``(x, gate)``, arrays of one shape.

    Returns
    -------
    y : array, x's shape
    cache : SigmoidGateCache for :func:`sigmoid_gate_backward`
    """
    x, gate = as_real_array(x, "x"), as_real_array(gate, "gate")
    if gate.shape != x.shape:
        raise ValueError(f"gate must have x's shape {x.shape}, got {gate.shape}")
    dtype = common_dtype(x, gate)
    x, s = x.astype(dtype, copy=False), _sigmoid(gate.astype(dtype, copy=False))  # 1.
    return x * s, SigmoidGateCache(x, s)  # 2.


def sigmoid_gate_backward(dy, cache: SigmoidGateCache):
    """Gradients of :func:`sigmoid_gate_forward` (arguments ``dy, cache``): ``(dx, dgate)``.

    2. ``dx = dy s``; 1. ``sigmoid' = s (1 - s)``, so ``dgate = dy x s (1 - s)``.
    """
    x, s = cache
    dy = as_upstream(dy, x.shape, x.dtype, "dy")
    return dy * s, dy * x * s * (1.0 - s)
