"""The short causal depthwise convolution of Gated DeltaNet and Mamba (Qwen3-Next's ``conv1d``),
with its SiLU, its backward, and its decoding step that carries the window of past inputs.

Each channel c has its own K weights and sees only the present and the K - 1 inputs before it
(zeros before the sequence, or the window a previous call left):

    ``z_{t,c} = sum_{j=0}^{K-1} w_{c,j} x_{t-K+1+j, c} (+ b_c)``,   ``y = silu(z)``

transformers runs ``nn.Conv1d(groups=channels, padding=K - 1)`` on (B, C, T) and keeps the first T
outputs; here time is the second-to-last axis, channels the last. Its decoding cache keeps the last K
inputs (``conv_state``); the oldest of them never reaches an output, so the window here holds K - 1.

Symbols: ``...`` batch axes, T positions, C channels, K the kernel width.

Forward: 1. ``xp = [window, x]`` (..., K - 1 + T, C); 2. ``z_t = sum_j w[:, j] * xp_{t + j} + b``;
3. ``y = silu(z)`` (or ``y = z`` with ``activation=None``); the new window is ``xp[..., -(K - 1):, :]``.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._checks import as_real_array, as_upstream, common_dtype, require_ndim, signals_land_here
from .swiglu import _sigmoid

__all__ = ["CausalConv1dCache", "causal_conv1d_forward", "causal_conv1d_backward", "causal_conv1d_formula"]

ACTIVATIONS = ("silu", None)


class CausalConv1dCache(NamedTuple):
    """The padded input, the pre-activation, the weights and what the backward returns."""

    xp: np.ndarray  # (..., K - 1 + T, C)
    z: np.ndarray  # (..., T, C)
    weight: np.ndarray  # (C, K)
    has_bias: bool
    activation: str | None

    @property
    def window(self):
        """The last K - 1 inputs (..., K - 1, C): the next call's ``window``."""
        return self.xp[..., self.xp.shape[-2] - (self.weight.shape[1] - 1):, :]


def causal_conv1d_forward(x, weight, bias=None, window=None, activation="silu"):
    """Causal depthwise convolution of each channel of ``x`` over time. Arguments
    ``(x, weight, bias=None, window=None, activation="silu")``.

    Parameters
    ----------
    x : array (..., t, c)
    weight : array (c, k), transformers' ``conv1d.weight[:, 0, :]``
    bias : None or array (c,) (Qwen3-Next has none)
    window : None (zeros: the start of a sequence) or array (..., k - 1, c), the inputs before x
        (``cache.window`` of the previous call: decoding one token is a call with t = 1)
    activation : "silu" (Qwen3-Next's ``hidden_act``) or None

    Returns
    -------
    y : array (..., t, c)
    cache : CausalConv1dCache; ``cache.window`` is the next call's window
    """
    x = as_real_array(x, "x")
    weight = as_real_array(weight, "weight")
    require_ndim(x, "x", 2, "(..., t, c)")
    if weight.ndim != 2 or weight.shape[0] != x.shape[-1]:
        raise ValueError(f"weight must have shape ({x.shape[-1]}, k) (x's channels, the kernel width),"
                         f" got {weight.shape}")
    c, kw = weight.shape
    if kw < 1:
        raise ValueError(f"weight must have at least one tap, got shape {weight.shape}")
    if bias is not None:
        bias = as_real_array(bias, "bias")
        if bias.shape != (c,):
            raise ValueError(f"bias must have shape ({c},), got {bias.shape}")
    if window is not None:
        window = as_real_array(window, "window")
        if window.shape != x.shape[:-2] + (kw - 1, c):
            raise ValueError(f"window must have shape {x.shape[:-2] + (kw - 1, c)} (..., k - 1, c),"
                             f" got {window.shape}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    dtype = common_dtype(x, weight, bias, window)
    if window is None:
        window = np.zeros(x.shape[:-2] + (kw - 1, c), dtype)
    return causal_conv1d_formula(x.astype(dtype, copy=False), weight.astype(dtype, copy=False),
                                 None if bias is None else bias.astype(dtype, copy=False),
                                 window.astype(dtype, copy=False), activation)


def causal_conv1d_formula(x, weight, bias, window, activation="silu"):
    """:func:`causal_conv1d_forward` on checked inputs of one dtype."""
    kw, T = weight.shape[1], x.shape[-2]
    xp = np.concatenate([window, x], axis=-2)  # 1. (..., K - 1 + T, C)
    z = sum(weight[:, j] * xp[..., j:j + T, :] for j in range(kw))  # 2. (..., T, C)
    if bias is not None:
        z = z + bias
    y = z * _sigmoid(z) if activation == "silu" else z  # 3.
    return y, CausalConv1dCache(xp, z, weight, bias is not None, activation)


def causal_conv1d_backward(dy, cache: CausalConv1dCache):
    """Gradients of :func:`causal_conv1d_forward` (arguments ``dy, cache``):
    ``(dx, dweight, dbias, dwindow)`` (``dbias`` None without a bias).

    3. ``y = z sigmoid(z)``: ``dz = dy * s (1 + z (1 - s))`` with ``s = sigmoid(z)``
    2. ``z_t = sum_j w[:, j] xp_{t+j} + b``: ``dw[:, j] = sum_t dz_t xp_{t+j}``, ``db = sum_t dz_t``,
       and each ``dz_t`` reaches ``xp_{t+j}`` with weight ``w[:, j]``
    1. ``xp = [window, x]``: ``dwindow = dxp[..., :K-1, :]``, ``dx = dxp[..., K-1:, :]``

    Returns
    -------
    dx : (..., t, c); dweight : (c, k); dbias : (c,) or None; dwindow : (..., k - 1, c)
    """
    z, xp, weight = cache.z, cache.xp, cache.weight
    dy = as_upstream(dy, z.shape, z.dtype, "dy")
    kw, T, c = weight.shape[1], z.shape[-2], z.shape[-1]
    if cache.activation == "silu":
        with np.errstate(over="ignore"):
            s = _sigmoid(z)
            signals_land_here()  # a Ctrl-C is raised inside the block (_pair_checks.py)
        dz = dy * s * (1.0 + z * (1.0 - s))  # (..., T, C)
    else:
        dz = dy
    dxp = np.zeros_like(xp)  # (..., K - 1 + T, C)
    dweight = np.empty_like(weight)  # (C, K)
    for j in range(kw):
        dweight[:, j] = (dz * xp[..., j:j + T, :]).reshape(-1, c).sum(axis=0)
        dxp[..., j:j + T, :] += weight[:, j] * dz
    dbias = dz.reshape(-1, c).sum(axis=0) if cache.has_bias else None
    return dxp[..., kw - 1:, :], dweight, dbias, dxp[..., :kw - 1, :]
