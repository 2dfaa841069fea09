"""Qwen3-MoE's decoder block (transformers' ``Qwen3MoeDecoderLayer``): Qwen3's block (Llama's, with an
RMSNorm over each head's q and k before RoPE) whose MLP is a mixture of SwiGLU experts, softmax-routed
with a normalised top-k, on the layers not in ``mlp_only_layers`` whose index ``i`` has
``(i + 1) % decoder_sparse_step == 0``; the other layers keep a dense SwiGLU.

Forward, numbered so the backward walks it in reverse (transformers' module in brackets):

1. ``z = RMSNorm_1(x)``                          (``input_layernorm``)
2. ``a = Attn(z)``: q, k, v projections, each head's q and k RMS-normalised, RoPE (rotate-half) at the
   positions, causal grouped heads, ``W_o``     (``self_attn``; decoding: with the layer's KV cache)
3. ``h = x + a``
4. ``u = RMSNorm_2(h)``                          (``post_attention_layernorm``)
5. ``m = MoE(u)`` (:func:`attention_ref.nn.swiglu_moe_forward`) or ``m = SwiGLU(u)`` on a dense layer   (``mlp``)
6. ``y = h + m``

Parameter names: Llama's and Qwen3's (:data:`attention_ref.nn.llama_block.LLAMA_PARAM_NAMES`,
``self_attn.q_norm.weight``, ``self_attn.k_norm.weight``), with a MoE layer's ``mlp.W_router`` (D, E),
``mlp.experts.W_gate``, ``mlp.experts.W_up`` (E, D, F) and ``mlp.experts.W_down`` (E, F, D) in place of
``mlp.W_gate``, ``mlp.W_up``, ``mlp.W_down``.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._checks import as_real_array
from ..variants.grouped_heads import multi_head_attention_backward_formula
from .llama_block import QKNormRotary, RotaryHalf
from .moe import swiglu_moe_backward, swiglu_moe_formula
from .moe_routing import Routing
from .multi_head_attention import causal_self_attention_formula
from .rms_norm import rms_norm_backward, rms_norm_formula
from .swiglu import swiglu_backward, swiglu_formula

__all__ = ["Qwen3MoeLayer", "Qwen3MoeBlockCache", "qwen3_moe_block_forward", "qwen3_moe_block_formula",
           "qwen3_moe_block_backward"]

_ATTN = ("W_q", "W_k", "W_v", "W_o")
_EXPERTS = ("mlp.experts.W_gate", "mlp.experts.W_up", "mlp.experts.W_down")
_DENSE = ("mlp.W_gate", "mlp.W_up", "mlp.W_down")


class Qwen3MoeLayer(NamedTuple):
    """One layer's constants: heads, the norms' epsilon, RoPE's frequencies (Dh/2,) and the routing (None: dense)."""

    num_heads: int
    num_kv_heads: int
    eps: float
    theta: np.ndarray
    routing: Routing | None = None


class Qwen3MoeBlockCache(NamedTuple):
    norm_1: object  # step 1
    attn: object  # step 2, GroupedMultiHeadCache
    norm_2: object  # step 4
    mlp: object  # step 5: MoECache or SwiGLUCache
    routed: bool
    m: np.ndarray | None = None  # step 5's output (..., N, D) (the trace's ``mlp``)


def _check(x, p, layer):
    if not isinstance(layer, Qwen3MoeLayer):
        raise TypeError(f"layer must be an attention_ref.nn.Qwen3MoeLayer, got {type(layer).__name__}")
    mlp = _DENSE if layer.routing is None else ("mlp.W_router",) + _EXPERTS
    names = ("input_norm.weight", "post_attention_norm.weight", "self_attn.q_norm.weight", "self_attn.k_norm.weight",
             *(f"self_attn.{n}" for n in _ATTN), *mlp)
    missing = [n for n in names if n not in p]
    if missing:
        raise ValueError(f"params lack {missing} ({'a dense' if layer.routing is None else 'a MoE'} layer)")
    x = as_real_array(x, "x")
    D = x.shape[-1]
    a = {n: as_real_array(p[n], f"params[{n!r}]") for n in names}
    H, Hkv = layer.num_heads, layer.num_kv_heads
    Dh = a["self_attn.q_norm.weight"].shape[0]
    want = {"input_norm.weight": (D,), "post_attention_norm.weight": (D,), "self_attn.k_norm.weight": (Dh,),
            "self_attn.W_q": (D, H * Dh), "self_attn.W_k": (D, Hkv * Dh), "self_attn.W_v": (D, Hkv * Dh),
            "self_attn.W_o": (H * Dh, D)}
    if layer.routing is None:
        F = a["mlp.W_gate"].shape[-1]
        want.update({"mlp.W_gate": (D, F), "mlp.W_up": (D, F), "mlp.W_down": (F, D)})
    else:
        E, _, F = a["mlp.experts.W_gate"].shape if a["mlp.experts.W_gate"].ndim == 3 else (0, 0, 0)
        want.update({"mlp.W_router": (D, E), "mlp.experts.W_gate": (E, D, F), "mlp.experts.W_up": (E, D, F),
                     "mlp.experts.W_down": (E, F, D)})
    for n, shape in want.items():
        if a[n].shape != shape:
            raise ValueError(f"params[{n!r}] must have shape {shape} for x of width {D}, got {a[n].shape}")
    if np.shape(layer.theta) != (Dh // 2,):
        raise ValueError(f"layer.theta must have shape ({Dh // 2},) (head_dim / 2), got {np.shape(layer.theta)}")
    return x, a


def qwen3_moe_block_forward(x, p, layer: Qwen3MoeLayer, positions=None, mask=None, kv=None):
    """The six steps on ``x`` (..., N, D) at ``positions`` (default ``0..N-1``, or after the cached
    tokens); with ``kv`` a :class:`attention_ref.variants.kv_cache.KVCache` a decoding step (no cache
    is kept for a backward). ``mask``: None or a boolean mask as the Llama block takes it."""
    x, p = _check(x, p, layer)
    return qwen3_moe_block_formula(x, p, layer, positions, mask, kv)


def qwen3_moe_block_formula(x, p, layer: Qwen3MoeLayer, positions=None, mask=None, kv=None):
    """:func:`qwen3_moe_block_forward` on inputs already checked (the family's model checks once, at its edge)."""
    if positions is None:
        positions = np.arange(x.shape[-2]) if kv is None else np.arange(kv.length, kv.length + x.shape[-2])
    at = positions if kv is None else positions[..., None, :]
    hook = QKNormRotary(RotaryHalf(at, at, 1.0, np.asarray(layer.theta, np.float64)), p["self_attn.q_norm.weight"],
                        p["self_attn.k_norm.weight"], layer.eps)
    # 1. z = RMSNorm_1(x)
    z, norm_1 = rms_norm_formula(x, p["input_norm.weight"], layer.eps)
    # 2. a = Attn(z): per-head q/k norms, RoPE, causal grouped heads (decoding: the cached keys too)
    a, attn = causal_self_attention_formula(z, {n: p[f"self_attn.{n}"] for n in _ATTN}, layer.num_heads,
                                            layer.num_kv_heads, mask=mask, kv=kv, rotary=hook)  # (..., N, D)
    # 3. h = x + a
    h = x + a
    # 4. u = RMSNorm_2(h)
    u, norm_2 = rms_norm_formula(h, p["post_attention_norm.weight"], layer.eps)
    # 5. m = MoE(u), or SwiGLU(u) on a dense layer
    if layer.routing is None:
        m, mlp = swiglu_formula(u, *(p[n] for n in _DENSE))
    else:
        m, mlp = swiglu_moe_formula(u, p["mlp.W_router"], *(p[n] for n in _EXPERTS), layer.routing)
    # 6. y = h + m
    y = h + m
    return y, (None if kv is not None else Qwen3MoeBlockCache(norm_1, attn, norm_2, mlp, layer.routing is not None, m))


def qwen3_moe_block_backward(dy, cache: Qwen3MoeBlockCache):
    """The six steps in reverse: ``(dx, grads)`` keyed like the block's params (the choice held fixed)."""
    g = {}
    # 6. y = h + m; 5. the MLP
    if cache.routed:
        du, g["mlp.W_router"], *grads = swiglu_moe_backward(dy, cache.mlp)
        g.update(zip(_EXPERTS, grads))
    else:
        du, *grads = swiglu_backward(dy, cache.mlp)
        g.update(zip(_DENSE, grads))
    # 4. u = RMSNorm_2(h)
    dh_mlp, g["post_attention_norm.weight"] = rms_norm_backward(du, cache.norm_2)
    dh = dy + dh_mlp
    # 3. h = x + a; 2. a = Attn(z): z fed the query, the key and the value
    dquery, dkey, dvalue, attn_grads = multi_head_attention_backward_formula(dh, cache.attn)
    g.update({f"self_attn.{name}": grad for name, grad in attn_grads.items()})
    # 1. z = RMSNorm_1(x)
    dx_norm, g["input_norm.weight"] = rms_norm_backward(dquery + dkey + dvalue, cache.norm_1)
    return dh + dx_norm, g
