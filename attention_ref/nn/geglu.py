"""The GeGLU feed-forward network of Gemma, ``(gelu(x W_gate) * (x W_up)) W_down``, and its backward.

Llama's SwiGLU (:mod:`attention_ref.nn.swiglu`) with GELU's tanh approximation in place of
SiLU as the gate (Gemma's ``hidden_activation = "gelu_pytorch_tanh"``):
``gelu(a) = 0.5 a (1 + tanh(s (a + c a^3)))``, ``s = sqrt(2 / pi)``, ``c = 0.044715``.
Row-vector convention (``W_gate = gate_proj.weight.T``); no biases.
Symbols: ``...`` batch axes, D model width, F hidden width.

Forward, numbered so the backward can walk it in reverse:

1. ``a = x W_gate``, ``u = x W_up``                    (..., F) each
2. ``m = gelu(a) * u``                                 (..., F)
3. ``y = m W_down``                                    (..., D)
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._checks import as_upstream
from ..core.linear import LinearCache
from ..fast.dispatch import linear_backward_formula, linear_formula
from .feed_forward import _gelu_from_tanh, _gelu_tanh, gelu_backward_formula
from .swiglu import check_swiglu_inputs

__all__ = ["GeGLUCache", "geglu_forward", "geglu_backward", "geglu_formula"]


class GeGLUCache(NamedTuple):
    """The three products' caches, the gate's pre-activation, its GELU and its tanh, and the up projection."""

    gate: LinearCache  # x W_gate
    up: LinearCache  # x W_up
    down: LinearCache  # m W_down
    a: np.ndarray  # (..., F), x W_gate
    gelu_a: np.ndarray  # (..., F), gelu(a)
    u: np.ndarray  # (..., F), x W_up
    t: np.ndarray | None = None  # (..., F), tanh(s (a + c a^3)) of the GELU (computed again when None)


def geglu_forward(x, W_gate, W_up, W_down):
    """GeGLU: ``(gelu_tanh(x W_gate) * (x W_up)) W_down`` (transformers' ``GemmaMLP``), arguments
    ``(x, W_gate, W_up, W_down)``, weights ``(d_in, d_out)``: ``gate_proj.weight.T``,
    ``up_proj.weight.T``, ``down_proj.weight.T``.

    Parameters
    ----------
    x : array (..., d)
    W_gate, W_up : arrays (d, f)
    W_down : array (f, d_out)

    Returns
    -------
    y : array (..., d_out)
    cache : GeGLUCache for :func:`geglu_backward`
    """
    x, W_gate, W_up, W_down = check_swiglu_inputs(x, W_gate, W_up, W_down, gate="gelu")
    return geglu_formula(x, W_gate, W_up, W_down)


def geglu_formula(x, W_gate, W_up, W_down):
    """:func:`geglu_forward` on checked inputs (the Gemma block calls it on weights checked once)."""
    # 1. the two projections
    a = linear_formula(x, W_gate, None, ("x", "W_gate", "b"))  # (..., F)
    u = linear_formula(x, W_up, None, ("x", "W_up", "b"))  # (..., F)
    # 2. gate
    t = _gelu_tanh(a)  # (..., F)
    gelu_a = _gelu_from_tanh(a, t)  # (..., F): 0.5 a (1 + t)
    m = gelu_a * u  # (..., F)
    # 3. down projection
    y = linear_formula(m, W_down, None, ("gelu(x W_gate) * (x W_up)", "W_down", "b"))  # (..., Dout)
    return y, GeGLUCache(LinearCache(x, W_gate, False), LinearCache(x, W_up, False), LinearCache(m, W_down, False),
                         a, gelu_a, u, t)


def geglu_backward(dy, cache: GeGLUCache):
    """Gradients of :func:`geglu_forward` (arguments ``dy, cache``), its steps in reverse:
    ``(dx, dW_gate, dW_up, dW_down)``.

    3. ``y = m W_down``      gives ``dm = dy W_down^T``, ``dW_down = m^T dy``
    2. ``m = gelu(a) * u``  gives ``du = dm * gelu(a)`` and ``da = dm * u * gelu'(a)``,
       ``gelu'(a) = 0.5 (1 + t) + 0.5 a (1 - t^2) s (1 + 3 c a^2)``, ``t = tanh(s (a + c a^3))``
    1. ``a = x W_gate``, ``u = x W_up`` give ``dx = da W_gate^T + du W_up^T`` and
       ``dW_gate = x^T da``, ``dW_up = x^T du``

    Returns
    -------
    dx : array (..., d)
    dW_gate, dW_up : arrays (d, f)
    dW_down : array (f, d_out)
    """
    m = cache.down.x
    dy = as_upstream(dy, m.shape[:-1] + (cache.down.W.shape[1],), m.dtype, "dy")
    return geglu_backward_formula(dy, cache)


def geglu_backward_formula(dy, cache: GeGLUCache):
    """Unchecked backward, for the blocks."""
    gate, up, down, a, gelu_a, u, t = cache
    # 3. y = m W_down
    dm, dW_down, _ = linear_backward_formula(dy, down)  # (..., F)
    # 2. m = gelu(a) * u
    du = dm * gelu_a  # (..., F)
    da = gelu_backward_formula(dm * u, a, t)  # (..., F): dm * u * gelu'(a), t computed again only if None
    # 1. a = x W_gate, u = x W_up
    dx_gate, dW_gate, _ = linear_backward_formula(da, gate)  # (..., D)
    dx_up, dW_up, _ = linear_backward_formula(du, up)  # (..., D)
    return dx_gate + dx_up, dW_gate, dW_up, dW_down
