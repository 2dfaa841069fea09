"""gpt-oss's expert: a SwiGLU with biases, a clamp, ``(up + 1)`` and interleaved gate/up columns.

One matrix ``W_gate_up`` (D, 2F) (transformers' ``experts.gate_up_proj[e]``) computes the gate
and the up projection together; their columns are interleaved: column ``2j`` is gate unit ``j``,
column ``2j + 1`` is up unit ``j`` (``gate = gu[..., ::2]``, ``up = gu[..., 1::2]``). With
``alpha`` (``swiglu_alpha``, 1.702) and ``limit`` (``swiglu_limit``, 7.0):

1. ``gu = x W_gate_up + b_gate_up``                     (..., 2F)
2. ``g = min(gu[..., ::2], limit)``, ``u = clip(gu[..., 1::2], -limit, limit)``   (..., F) each
3. ``glu = g * sigmoid(alpha g)``                       (..., F)
4. ``h = (u + 1) * glu``                                (..., F)
5. ``y = h W_down + b_down``                            (..., D)

``g sigmoid(1.702 g)`` is the sigmoid approximation of GELU; the clamp bounds both halves so no
activation explodes, and ``u + 1`` lets a unit pass ``glu`` through when its up projection is 0.
The clamp's gradient is 1 inside the closed interval (a value exactly at ``limit`` passes its
gradient, as ``torch.clamp``'s backward does) and 0 outside.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._checks import as_upstream, check_positive_real, common_dtype, signals_land_here
from .._pair_checks import check_linear_inputs
from ..core.linear import LinearCache
from ..fast.dispatch import linear_backward_formula, linear_formula

__all__ = ["GPT_OSS_SWIGLU_ALPHA", "GPT_OSS_SWIGLU_LIMIT", "ClampedSwiGLUCache", "clamped_swiglu_forward",
           "clamped_swiglu_backward"]

#: gpt-oss's defaults (transformers' GptOssConfig swiglu_alpha and swiglu_limit)
GPT_OSS_SWIGLU_ALPHA = 1.702
GPT_OSS_SWIGLU_LIMIT = 7.0


class ClampedSwiGLUCache(NamedTuple):
    """The two products' caches and what step 2-4 need to be walked back."""

    gate_up: LinearCache  # gu = x W_gate_up + b_gate_up
    down: LinearCache  # y = h W_down + b_down
    g: np.ndarray  # (..., F), the clamped gate
    u: np.ndarray  # (..., F), the clamped up projection
    sig: np.ndarray  # (..., F), sigmoid(alpha g)
    g_passes: np.ndarray  # (..., F) bool, gate <= limit (the clamp passes the gradient)
    u_passes: np.ndarray  # (..., F) bool, -limit <= up <= limit
    alpha: float


def clamped_swiglu_forward(x, W_gate_up, b_gate_up, W_down, b_down, alpha=GPT_OSS_SWIGLU_ALPHA,
                           limit=GPT_OSS_SWIGLU_LIMIT):
    """One gpt-oss expert on the tokens ``x`` (the module docstring's five steps).

    Parameters
    ----------
    x : array (..., D)
    W_gate_up : array (D, 2F), gate and up columns interleaved; b_gate_up : array (2F,)
    W_down : array (F, D_out); b_down : array (D_out,)
    alpha, limit : positive floats

    Returns
    -------
    y : array (..., D_out)
    cache : ClampedSwiGLUCache for :func:`clamped_swiglu_backward`
    """
    x, W_gate_up, b_gate_up = check_linear_inputs(x, W_gate_up, b_gate_up, ("x", "W_gate_up", "b_gate_up"))
    if W_gate_up.shape[1] % 2:
        raise ValueError(f"W_gate_up must have an even number of columns (gate and up interleaved), got"
                         f" shape {W_gate_up.shape}")
    h_shape = np.broadcast_to(np.zeros((), x.dtype), x.shape[:-1] + (W_gate_up.shape[1] // 2,))
    _, W_down, b_down = check_linear_inputs(h_shape, W_down, b_down, ("(u + 1) * glu", "W_down", "b_down"))
    alpha, limit = check_positive_real(alpha, "alpha"), check_positive_real(limit, "limit")
    dtype = common_dtype(x, W_down)  # float32 stays float32; any float64 input makes it all float64
    return clamped_swiglu_formula(*(a.astype(dtype, copy=False) for a in (x, W_gate_up, b_gate_up, W_down, b_down)),
                                  alpha, limit)


def clamped_swiglu_formula(x, W_gate_up, b_gate_up, W_down, b_down, alpha, limit):
    """:func:`clamped_swiglu_forward` on checked inputs (the mixture of experts calls it)."""
    # 1. gate and up together
    gu = linear_formula(x, W_gate_up, b_gate_up, ("x", "W_gate_up", "b_gate_up"))  # (..., 2F)
    # 2. de-interleave and clamp
    gate, up = gu[..., ::2], gu[..., 1::2]  # (..., F) each
    g, u = np.minimum(gate, limit), np.clip(up, -limit, limit)  # (..., F) each
    # 3. the gate's activation: g * sigmoid(alpha g), sigmoid as (1 + tanh(z / 2)) / 2 (never overflows)
    sig = 0.5 * (1.0 + np.tanh(0.5 * alpha * g))  # (..., F)
    glu = g * sig  # (..., F)
    # 4. gated by (u + 1)
    with np.errstate(under="ignore"):  # a tiny glu times (u + 1) rounds to 0, as it should
        h = (u + 1.0) * glu  # (..., F)
        signals_land_here()  # a Ctrl-C is raised inside the block (_pair_checks.py)
    # 5. down projection
    y = linear_formula(h, W_down, b_down, ("(u + 1) * glu", "W_down", "b_down"))  # (..., D)
    return y, ClampedSwiGLUCache(LinearCache(x, W_gate_up, True), LinearCache(h, W_down, True), g, u, sig,
                                 gate <= limit, (up >= -limit) & (up <= limit), alpha)


def clamped_swiglu_backward(dy, cache: ClampedSwiGLUCache):
    """Gradients of :func:`clamped_swiglu_forward`, its steps in reverse.

    5. ``y = h W_down + b_down``   gives ``dh = dy W_down^T``, ``dW_down = h^T dy``, ``db_down = sum dy``
    4. ``h = (u + 1) glu``          gives ``du = dh glu``, ``dglu = dh (u + 1)``
    3. ``glu = g sigmoid(alpha g)`` gives ``dg = dglu (s + alpha g s (1 - s))``, ``s = sigmoid(alpha g)``
    2. the clamps pass the gradient inside ``[.., limit]`` and ``[-limit, limit]`` (ends included),
       0 outside; ``dgu[..., ::2] = dgate``, ``dgu[..., 1::2] = dup`` (re-interleaved)
    1. ``gu = x W_gate_up + b_gate_up`` gives ``dx = dgu W_gate_up^T``, ``dW_gate_up = x^T dgu``,
       ``db_gate_up = sum dgu``

    Returns
    -------
    dx : array (..., D)
    dW_gate_up : array (D, 2F); db_gate_up : array (2F,)
    dW_down : array (F, D_out); db_down : array (D_out,)
    """
    h = cache.down.x
    dy = as_upstream(dy, h.shape[:-1] + (cache.down.W.shape[1],), h.dtype, "dy")
    return clamped_swiglu_backward_formula(dy, cache)


def clamped_swiglu_backward_formula(dy, cache: ClampedSwiGLUCache):
    """Unchecked backward, for the mixture of experts."""
    gate_up, down, g, u, sig, g_passes, u_passes, alpha = cache
    # 5. y = h W_down + b_down
    dh, dW_down, db_down = linear_backward_formula(dy, down)  # (..., F)
    with np.errstate(under="ignore"):  # products of small factors round to 0, as they should
        # 4. h = (u + 1) * glu
        du = dh * (g * sig)  # (..., F)
        dglu = dh * (u + 1.0)  # (..., F)
        # 3. glu = g * sigmoid(alpha g)
        dg = dglu * (sig + alpha * (g * sig) * (1.0 - sig))  # (..., F); g * sig first: alpha g may overflow
        signals_land_here()  # a Ctrl-C is raised inside the block (_pair_checks.py)
    # 2. the clamps, then the columns interleaved back
    dgu = np.empty(dh.shape[:-1] + (2 * dh.shape[-1],), dh.dtype)  # (..., 2F)
    dgu[..., ::2] = np.where(g_passes, dg, 0.0)
    dgu[..., 1::2] = np.where(u_passes, du, 0.0)
    # 1. gu = x W_gate_up + b_gate_up
    dx, dW_gate_up, db_gate_up = linear_backward_formula(dgu, gate_up)  # (..., D)
    return dx, dW_gate_up, db_gate_up, dW_down, db_down
