"""Qwen3-Next's full-attention layer, gated attention (transformers' ``Qwen3NextAttention``; Qiu et al.
2025), as numbered steps of pairs, its backward, and its decoding step with the keys and values cached.

Symbols: ``...`` batch axes, T new positions, P cached positions, D width, H query heads, Hkv key/value
heads, Dh head width, r the rotated features (``int(Dh * partial_rotary_factor)``).

Params (our names; transformers' after ``self_attn.``): ``W_q`` (D, 2 H Dh) (``q_proj.weight.T``: each
head's Dh query columns, then its Dh gate columns), ``W_k``, ``W_v`` (D, Hkv Dh), ``W_o`` (H Dh, D),
``q_norm.weight``, ``k_norm.weight`` (Dh,) (offsets from 1, as Gemma's: the scale is ``1 + w``).

Forward, numbered so the backward walks it in reverse:

1. ``[q, gate] = x W_q`` split per head; ``k = x W_k``, ``v = x W_v``
2. ``q = RMSNorm(q) (1 + w_q)``, ``k = RMSNorm(k) (1 + w_k)`` per head (:mod:`.gemma_rms_norm`)
3. partial RoPE on q and k at their positions (:mod:`.partial_rotary`, rotate-half over the first r)
4. keys and values repeated to the H query heads; causal attention ``softmax(q k^T / sqrt(Dh)) v``
   (:mod:`attention_ref.core.attention`), the new tokens seeing the cached ones too
5. heads merged; ``o = o * sigmoid(gate)`` (:mod:`.sigmoid_gate`)
6. ``y = o W_o``
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._checks import as_real_array, as_upstream
from ..core.attention import AttentionCache
from ..core.linear import LinearCache
from ..fast.core_formulas import merge_heads_formula, split_heads_formula
from ..fast.dispatch import attention_backward_formula, attention_formula, linear_backward_formula, linear_formula
from .gemma_rms_norm import gemma_rms_norm_formula
from .partial_rotary import partial_rotary_backward_formula, partial_rotary_formula
from .rms_norm import rms_norm_backward_formula
from .rope_scaling import rope_frequencies
from .sigmoid_gate import SigmoidGateCache
from .swiglu import _sigmoid

__all__ = ["GatedAttentionShape", "GatedAttentionCache", "gated_attention_forward", "gated_attention_backward",
           "gated_attention_formula"]


class GatedAttentionShape(NamedTuple):
    """Heads, widths and constants: Qwen3-Next's ``num_attention_heads``, ``num_key_value_heads``,
    ``head_dim``, the rotated width ``int(head_dim * partial_rotary_factor)``, ``rope_theta`` and
    ``rms_norm_eps``."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    rotary_dim: int
    rope_theta: float = 10000.0
    eps: float = 1e-6


class GatedAttentionCache(NamedTuple):
    """The caches of the six steps, and the keys and values (rotated) that decoding carries."""

    q_proj: LinearCache  # 1.
    k_proj: LinearCache
    v_proj: LinearCache
    q_norm: object  # 2. RMSNormCache
    k_norm: object
    q_rope: object  # 3. PartialRotaryCache
    k_rope: object
    attention: AttentionCache  # 4.
    gate: SigmoidGateCache  # 5.
    o_proj: LinearCache  # 6.
    shape: GatedAttentionShape
    past: int  # P, the cached positions before these
    kv: tuple  # (k, v) (..., Hkv, P + T, Dh): the next call's ``past``


_PARAMS = ("W_q", "W_k", "W_v", "W_o", "q_norm.weight", "k_norm.weight")


def gated_attention_forward(x, params, shape: GatedAttentionShape, positions=None, past=None):
    """Gated attention on ``x`` (..., t, d). Arguments ``(x, params, shape, positions=None, past=None)``.

    Parameters
    ----------
    x : array (..., t, d)
    params : dict with the module docstring's keys
    shape : GatedAttentionShape
    positions : None (``P .. P + t - 1``) or int array (t,), the new tokens' positions
    past : None or ``cache.kv`` of the previous call, ``(k, v)`` each (..., hkv, p, dh)

    Returns
    -------
    y : array (..., t, d)
    cache : GatedAttentionCache; ``cache.kv`` is the next call's ``past``
    """
    x = as_real_array(x, "x")
    if x.ndim < 2:
        raise ValueError(f"x must have shape (..., t, d), got shape {x.shape}")
    h, hkv, dh, r = shape[:4]
    if h % hkv:
        raise ValueError(f"shape: num_kv_heads ({hkv}) must divide num_heads ({h})")
    if r % 2 or not 0 < r <= dh:
        raise ValueError(f"shape: rotary_dim must be even and in (0, head_dim = {dh}], got {r}")
    d = x.shape[-1]
    want = {"W_q": (d, 2 * h * dh), "W_k": (d, hkv * dh), "W_v": (d, hkv * dh), "W_o": (h * dh, d),
            "q_norm.weight": (dh,), "k_norm.weight": (dh,)}
    p = {}
    for name in _PARAMS:
        if name not in params:
            raise ValueError(f"params has no {name!r}")
        p[name] = as_real_array(params[name], f"params[{name!r}]").astype(x.dtype, copy=False)
        if p[name].shape != want[name]:
            raise ValueError(f"params[{name!r}] must have shape {want[name]}, got {p[name].shape}")
    if past is not None:
        past = tuple(as_real_array(a, f"past[{i}]").astype(x.dtype, copy=False) for i, a in enumerate(past))
        if len(past) != 2 or past[0].shape != past[1].shape or past[0].shape[:-3] != x.shape[:-2] or \
                past[0].shape[-3:-2] + past[0].shape[-1:] != (hkv, dh):
            raise ValueError(f"past must be (k, v), each of shape {x.shape[:-2] + (hkv, 'p', dh)}")
    start = 0 if past is None else past[0].shape[-2]
    if positions is None:
        positions = np.arange(start, start + x.shape[-2])
    positions = np.asarray(positions)
    if positions.shape != (x.shape[-2],) or positions.dtype.kind not in "iu":
        raise ValueError(f"positions must be integers of shape ({x.shape[-2]},), got {positions.shape}")
    return gated_attention_formula(x, p, shape, positions, past)


def gated_attention_formula(x, p, shape: GatedAttentionShape, positions, past=None, mask=None):
    """:func:`gated_attention_forward` on checked inputs (the family's block calls it): ``positions`` (t,) or
    broadcastable to (..., 1, t) (each row's own, when decoding a left-padded batch), ``mask`` None or a boolean key
    mask broadcastable to (..., 1, P + t) (False: a padding key no query sees), taken with the causal mask."""
    h, hkv, dh, r, base, eps = shape
    T = x.shape[-2]
    # 1. projections; each head's query and gate side by side in W_q
    q_proj = linear_formula(x, p["W_q"], None)  # (..., T, 2 H Dh)
    q_gate = q_proj.reshape(x.shape[:-1] + (h, 2 * dh))
    q, gate = q_gate[..., :dh], q_gate[..., dh:].reshape(x.shape[:-1] + (h * dh,))  # (..., T, H, Dh), (..., T, H Dh)
    k = linear_formula(x, p["W_k"], None).reshape(x.shape[:-1] + (hkv, dh))
    v = split_heads_formula(linear_formula(x, p["W_v"], None), hkv)  # (..., Hkv, T, Dh)
    # 2. per-head (1 + w) RMSNorms
    q, q_norm = gemma_rms_norm_formula(q, p["q_norm.weight"], eps)
    k, k_norm = gemma_rms_norm_formula(k, p["k_norm.weight"], eps)
    # 3. partial RoPE, heads before time
    theta = rope_frequencies(r, base)  # (r/2,)
    q, q_rope = partial_rotary_formula(np.swapaxes(q, -2, -3), theta, positions)  # (..., H, T, Dh)
    k, k_rope = partial_rotary_formula(np.swapaxes(k, -2, -3), theta, positions)  # (..., Hkv, T, Dh)
    # 4. causal attention over the cached and the new keys, each key/value head serving H / Hkv query heads
    P = 0
    if past is not None:
        P = past[0].shape[-2]
        k, v = np.concatenate([past[0], k], axis=-2), np.concatenate([past[1], v], axis=-2)  # (..., Hkv, P + T, Dh)
    causal = np.arange(P + T)[None, :] <= (P + np.arange(T))[:, None]  # (T, P + T): True may attend
    mask = causal if mask is None else mask[..., None, :, :] & causal  # (..., 1, T, P + T) with a key mask
    o, attention = attention_formula(q, np.repeat(k, h // hkv, axis=-3), np.repeat(v, h // hkv, axis=-3), mask,
                                     scale=dh ** -0.5)  # (..., H, T, Dh)
    # 5. merge the heads, gate
    o = merge_heads_formula(o)  # (..., T, H Dh)
    s = _sigmoid(gate)
    gated = o * s
    # 6. output projection
    y = linear_formula(gated, p["W_o"], None)  # (..., T, D)
    return y, GatedAttentionCache(LinearCache(x, p["W_q"], False), LinearCache(x, p["W_k"], False),
                                  LinearCache(x, p["W_v"], False), q_norm, k_norm, q_rope, k_rope, attention,
                                  SigmoidGateCache(o, s), LinearCache(gated, p["W_o"], False), shape, P, (k, v))


def gated_attention_backward(dy, cache: GatedAttentionCache):
    """Gradients of :func:`gated_attention_forward` over the new tokens (arguments ``dy, cache``): ``(dx, grads)``,
    grads keyed like the params (the cached keys and values get none: a backward runs on a whole sequence).

    6. ``do = dy W_o^T``, ``dW_o``; 5. ``dgate = do o s (1 - s)``, ``do = do s``; 4. attention's backward,
    the repeated heads' gradients summed back to their key/value head; 3. RoPE's backward (its transpose);
    2. the norms' backward (``dw`` of ``1 + w``); 1. the three projections' backward, the query and gate columns
    interleaved back per head, ``dx`` the sum of the three.
    """
    x = cache.q_proj.x
    h, hkv, dh = cache.shape[:3]
    dy = as_upstream(dy, x.shape, x.dtype, "dy")
    g = {}
    # 6. output projection
    dgated, g["W_o"], _ = linear_backward_formula(dy, cache.o_proj)
    # 5. the gate
    o, s = cache.gate
    do, dgate = dgated * s, dgated * o * s * (1.0 - s)  # (..., T, H Dh)
    # 4. attention; the repeated key/value heads' gradients summed per group
    dq, dk, dv = attention_backward_formula(split_heads_formula(do, h), cache.attention)
    group = lambda t: t.reshape(t.shape[:-3] + (hkv, h // hkv) + t.shape[-2:]).sum(axis=-3)  # noqa: E731
    dk, dv = group(dk)[..., cache.past:, :], group(dv)[..., cache.past:, :]  # (..., Hkv, T, Dh): new tokens only
    # 3. RoPE back, time before heads
    dq = np.swapaxes(partial_rotary_backward_formula(dq, cache.q_rope), -2, -3)  # (..., T, H, Dh)
    dk = np.swapaxes(partial_rotary_backward_formula(dk, cache.k_rope), -2, -3)  # (..., T, Hkv, Dh)
    # 2. the norms
    dq, g["q_norm.weight"] = rms_norm_backward_formula(dq, cache.q_norm)
    dk, g["k_norm.weight"] = rms_norm_backward_formula(dk, cache.k_norm)
    # 1. projections
    dq_gate = np.concatenate([dq, dgate.reshape(dq.shape)], axis=-1).reshape(x.shape[:-1] + (2 * h * dh,))
    dx_q, g["W_q"], _ = linear_backward_formula(dq_gate, cache.q_proj)
    dx_k, g["W_k"], _ = linear_backward_formula(dk.reshape(x.shape[:-1] + (hkv * dh,)), cache.k_proj)
    dx_v, g["W_v"], _ = linear_backward_formula(merge_heads_formula(dv), cache.v_proj)
    return dx_q + dx_k + dx_v, g
