"""The gated shared expert of Qwen3-Next's mixture of experts (transformers' ``shared_expert`` and
``shared_expert_gate``), ``y = sigmoid(x w_gate) * SwiGLU(x)``, and its backward.

Besides the k routed experts (:mod:`attention_ref.nn.moe`), every token passes through one shared
SwiGLU expert, scaled by a sigmoid gate of its own (one logit per token): the layer's output is
``moe(x) + sigmoid(x w_gate) * SwiGLU(x)``.

Symbols: ``...`` batch axes, D width, F the shared expert's width.

Forward: 1. ``m = SwiGLU(x)`` (:mod:`.swiglu`); 2. ``s = sigmoid(x w_gate)`` (..., 1); 3. ``y = s m``.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._checks import as_upstream
from .._pair_checks import check_linear_inputs
from ..core.linear import LinearCache
from ..fast.dispatch import linear_backward_formula, linear_formula
from .swiglu import SwiGLUCache, _sigmoid, swiglu_backward_formula, swiglu_formula

__all__ = ["SharedExpertCache", "gated_shared_expert_forward", "gated_shared_expert_backward",
           "gated_shared_expert_formula"]


class SharedExpertCache(NamedTuple):
    """The SwiGLU's cache, its output, the gate's product and sigmoid."""

    mlp: SwiGLUCache
    m: np.ndarray  # (..., D)
    gate: LinearCache  # x w_gate
    s: np.ndarray  # (..., 1)


def gated_shared_expert_forward(x, W_gate, W_up, W_down, w_gate):
    """``sigmoid(x w_gate) * SwiGLU(x)``. Arguments ``(x, W_gate, W_up, W_down, w_gate)``.

    Parameters
    ----------
    x : array (..., d)
    W_gate, W_up : arrays (d, f) (``shared_expert.gate_proj.weight.T``, ``up_proj``); W_down : (f, d)
    w_gate : array (d, 1) (``shared_expert_gate.weight.T``)

    Returns
    -------
    y : array (..., d)
    cache : SharedExpertCache
    """
    x, W_gate, _ = check_linear_inputs(x, W_gate, None, ("x", "W_gate", "b"))
    _, W_up, _ = check_linear_inputs(x, W_up, None, ("x", "W_up", "b"))
    d = x.shape[-1]
    if W_up.shape != W_gate.shape:
        raise ValueError(f"W_up must have W_gate's shape {W_gate.shape}, got {W_up.shape}")
    _, W_down, _ = check_linear_inputs(np.zeros((1, W_gate.shape[1]), x.dtype), W_down, None, ("m", "W_down", "b"))
    if W_down.shape != (W_gate.shape[1], d):
        raise ValueError(f"W_down must have shape {(W_gate.shape[1], d)}, got {W_down.shape}")
    _, w_gate, _ = check_linear_inputs(x, w_gate, None, ("x", "w_gate", "b"))
    if w_gate.shape != (d, 1):
        raise ValueError(f"w_gate must have shape ({d}, 1), got {w_gate.shape}")
    dtype = np.result_type(x, W_gate, W_up, W_down, w_gate)
    return gated_shared_expert_formula(*(a.astype(dtype, copy=False) for a in (x, W_gate, W_up, W_down, w_gate)))


def gated_shared_expert_formula(x, W_gate, W_up, W_down, w_gate):
    """:func:`gated_shared_expert_forward` on checked inputs."""
    m, mlp = swiglu_formula(x, W_gate, W_up, W_down)  # 1. (..., D)
    s = _sigmoid(linear_formula(x, w_gate, None))  # 2. (..., 1)
    return s * m, SharedExpertCache(mlp, m, LinearCache(x, w_gate, False), s)  # 3.


def gated_shared_expert_backward(dy, cache: SharedExpertCache):
    """Gradients (arguments ``dy, cache``): ``(dx, dW_gate, dW_up, dW_down, dw_gate)``.

    3. ``dm = s dy``, ``ds = sum over D of dy m``; 2. ``dl = ds s (1 - s)``, ``dx += dl w_gate^T``,
    ``dw_gate = x^T dl``; 1. the SwiGLU's backward of ``dm``.
    """
    m, s = cache.m, cache.s
    dy = as_upstream(dy, m.shape, m.dtype, "dy")
    dlogit = (dy * m).sum(axis=-1, keepdims=True) * s * (1.0 - s)  # (..., 1)
    dx_gate, dw_gate, _ = linear_backward_formula(dlogit, cache.gate)
    dx, dW_gate, dW_up, dW_down = swiglu_backward_formula(dy * s, cache.mlp)
    return dx + dx_gate, dW_gate, dW_up, dW_down, dw_gate
