"""The SwiGLU feed-forward network of Llama, ``(silu(x W_gate) * (x W_up)) W_down``, and its backward.

Row-vector convention as everywhere in this package (``nn.Linear`` stores the transposes:
``W_gate = gate_proj.weight.T``). ``silu(a) = a * sigmoid(a)``; no biases.
Symbols: ``...`` batch axes, D model width, F hidden width.

Forward, numbered so the backward can walk it in reverse:

1. ``a = x W_gate``, ``u = x W_up``                    (..., F) each
2. ``m = silu(a) * u``                                 (..., F)
3. ``y = m W_down``                                    (..., D)
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._checks import as_real_array, as_upstream
from .._pair_checks import check_linear_inputs
from ..core.linear import LinearCache
from ..fast.dispatch import linear_backward_formula, linear_formula

__all__ = ["SwiGLUCache", "swiglu_forward", "swiglu_backward", "silu"]


class SwiGLUCache(NamedTuple):
    """The three products' caches and the gate's pre-activation and sigmoid."""

    gate: LinearCache  # x W_gate
    up: LinearCache  # x W_up
    down: LinearCache  # m W_down
    a: np.ndarray  # (..., F), x W_gate
    sig: np.ndarray  # (..., F), sigmoid(a)
    u: np.ndarray  # (..., F), x W_up


def _sigmoid(a):
    """``1 / (1 + exp(-a))`` as ``(1 + tanh(a / 2)) / 2``: no overflow for any ``a``."""
    return 0.5 * (1.0 + np.tanh(0.5 * a))


def silu(x):
    """SiLU (also called swish), ``x * sigmoid(x)`` elementwise: ``torch.nn.functional.silu``.

    Parameters
    ----------
    x : array of any shape (real; float32 stays float32, integers are computed in float64)

    Returns
    -------
    y : array shaped like ``x`` (the sigmoid as ``(1 + tanh(x/2)) / 2``: no overflow for any ``x``)
    """
    x = as_real_array(x, "x", bool_hint="")
    return x * _sigmoid(x)


def swiglu_forward(x, W_gate, W_up, W_down):
    """SwiGLU ``(silu(x W_gate) * (x W_up)) W_down``, arguments ``(x, W_gate, W_up, W_down)``,
    weights ``(d_in, d_out)``: a course's ``w1, w3, w2`` transposed, in that order
    (transformers' ``gate_proj``, ``up_proj``, ``down_proj``; ``W_gate = w1.weight.T``).

    Parameters
    ----------
    x : array (..., d)
    W_gate, W_up : arrays (d, f)
    W_down : array (f, d_out)

    Returns
    -------
    y : array (..., d_out)
    cache : SwiGLUCache for :func:`swiglu_backward`
    """
    return swiglu_formula(*check_swiglu_inputs(x, W_gate, W_up, W_down))


def check_swiglu_inputs(x, W_gate, W_up, W_down, gate="silu"):
    """``x`` (..., d), ``W_gate`` and ``W_up`` (d, f), ``W_down`` (f, d_out): real, finite, of
    matching shapes; returns them checked. Any gated feed-forward's (``gate`` names its activation
    in the messages: GeGLU's is ``gelu``)."""
    x, W_gate, _ = check_linear_inputs(x, W_gate, None, ("x", "W_gate", "b"))
    x, W_up, _ = check_linear_inputs(x, W_up, None, ("x", "W_up", "b"))
    if W_gate.shape != W_up.shape:
        raise ValueError(f"W_gate and W_up must have the same shape (d, f), got {W_gate.shape} and {W_up.shape}")
    m_shape = np.broadcast_to(np.zeros((), x.dtype), x.shape[:-1] + W_gate.shape[1:])  # (..., F), no memory
    W_down = check_linear_inputs(m_shape, W_down, None, (f"{gate}(x W_gate) * (x W_up)", "W_down", "b"))[1]
    return x, W_gate, W_up, W_down


def swiglu_formula(x, W_gate, W_up, W_down):
    """:func:`swiglu_forward` on checked inputs (the blocks and the decoding steps call it)."""
    # 1. the two projections
    a = linear_formula(x, W_gate, None, ("x", "W_gate", "b"))  # (..., F)
    u = linear_formula(x, W_up, None, ("x", "W_up", "b"))  # (..., F)
    # 2. gate
    sig = _sigmoid(a)  # (..., F)
    m = a * sig * u  # (..., F)
    # 3. down projection
    y = linear_formula(m, W_down, None, ("silu(x W_gate) * (x W_up)", "W_down", "b"))  # (..., Dout)
    return y, SwiGLUCache(LinearCache(x, W_gate, False), LinearCache(x, W_up, False), LinearCache(m, W_down, False),
                          a, sig, u)


def swiglu_backward(dy, cache: SwiGLUCache):
    """Gradients of :func:`swiglu_forward` (``dy, cache``), its steps in reverse; returns
    ``(dx, dW_gate, dW_up, dW_down)``, weight gradients ``(d_in, d_out)`` like the weights.

    3. ``y = m W_down``      gives ``dm = dy W_down^T``, ``dW_down = m^T dy``
    2. ``m = silu(a) * u``  gives ``du = dm * silu(a)`` and
       ``da = dm * u * silu'(a)``, ``silu'(a) = sig (1 + a (1 - sig))``
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
    return swiglu_backward_formula(dy, cache)


def swiglu_backward_formula(dy, cache: SwiGLUCache):
    """Unchecked backward, for the blocks."""
    gate, up, down, a, sig, u = cache
    # 3. y = m W_down
    dm, dW_down, _ = linear_backward_formula(dy, down)  # (..., F)
    # 2. m = silu(a) * u
    du = dm * (a * sig)  # (..., F)
    da = dm * u * (sig * (1.0 + a * (1.0 - sig)))  # (..., F)
    # 1. a = x W_gate, u = x W_up
    dx_gate, dW_gate, _ = linear_backward_formula(da, gate)  # (..., D)
    dx_up, dW_up, _ = linear_backward_formula(du, up)  # (..., D)
    return dx_gate + dx_up, dW_gate, dW_up, dW_down
