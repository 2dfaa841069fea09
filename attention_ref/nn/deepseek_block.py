"""DeepSeek-V3's decoder block (transformers' ``DeepseekV3DecoderLayer``): RMSNorm, multi-head latent
attention, RMSNorm, and a dense SwiGLU (the first ``first_k_dense_replace`` layers) or a mixture of
SwiGLU experts with grouped sigmoid routing plus shared experts; two residuals.

Forward, numbered so the backward walks it in reverse (transformers' module in brackets):

1. ``z = RMSNorm_1(x)``                          (``input_layernorm``)
2. ``a = MLA(z)``                                (``self_attn``, :func:`attention_ref.nn.mla_forward`)
3. ``h = x + a``
4. ``u = RMSNorm_2(h)``                          (``post_attention_layernorm``)
5. ``m = SwiGLU(u)`` on a dense layer, else ``m = MoE(u) + SwiGLU_shared(u)``   (``mlp``: ``experts`` routed
   by ``gate`` (:func:`attention_ref.nn.swiglu_moe_forward`), ``shared_experts``)
6. ``y = h + m``

Parameter names (after ``layers.<i>.``): ``input_norm.weight``, ``self_attn.<name>`` for each of
:func:`attention_ref.nn.mla_param_shapes`, ``post_attention_norm.weight``; a dense layer's
``mlp.W_gate``, ``mlp.W_up``, ``mlp.W_down``; a MoE layer's ``mlp.W_router`` (D, E),
``mlp.experts.W_gate`` (E, D, F), ``mlp.experts.W_up``, ``mlp.experts.W_down`` (E, F, D),
``mlp.shared.W_gate`` (D, S F), ``mlp.shared.W_up``, ``mlp.shared.W_down`` and the choice bias
``mlp.e_score_correction_bias`` (E,), a buffer that gets no gradient (its gradient is returned as zeros).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._checks import as_real_array
from .mla import (MLADecodeCache, MLAShape, check_mla_decode_inputs, check_mla_inputs, mla_backward,
                  mla_decode_absorbed_formula, mla_formula)
from .moe import swiglu_moe_backward, swiglu_moe_formula
from .moe_routing import Routing
from .rms_norm import rms_norm_backward, rms_norm_formula
from .swiglu import swiglu_backward, swiglu_formula

__all__ = ["DeepSeekLayer", "DeepSeekBlockCache", "deepseek_block_forward", "deepseek_block_backward",
           "deepseek_block_formula"]

_EXPERTS = ("mlp.experts.W_gate", "mlp.experts.W_up", "mlp.experts.W_down")
_SHARED = ("mlp.shared.W_gate", "mlp.shared.W_up", "mlp.shared.W_down")
_DENSE = ("mlp.W_gate", "mlp.W_up", "mlp.W_down")


class DeepSeekLayer(NamedTuple):
    """One layer's constants: its attention's shape, the norms' epsilon, and its routing (None: a dense layer)."""

    attn: MLAShape
    eps: float
    routing: Routing | None = None


class DeepSeekBlockCache(NamedTuple):
    norm_1: object  # step 1
    attn: object  # step 2, MLACache
    norm_2: object  # step 4
    mlp: object  # step 5: SwiGLUCache (dense) or (SwiGLUMoECache, SwiGLUCache of the shared experts)
    layer: DeepSeekLayer


def _check_mlp(x, p, layer):
    """The norms' and the MLP's parameters: present, real, and of shapes that fit ``x``'s width."""
    if not isinstance(layer, DeepSeekLayer):
        raise TypeError(f"layer must be an attention_ref.nn.DeepSeekLayer, got {type(layer).__name__}")
    D = np.shape(x)[-1]
    names = ("input_norm.weight", "post_attention_norm.weight") + (
        _DENSE if layer.routing is None else ("mlp.W_router", "mlp.e_score_correction_bias") + _EXPERTS + _SHARED)
    missing = [n for n in names if n not in p]
    if missing:
        raise ValueError(f"params lack {missing} ({'a dense' if layer.routing is None else 'a MoE'} layer)")
    a = {n: as_real_array(p[n], f"params[{n!r}]") for n in names}
    if layer.routing is None:
        F = a["mlp.W_gate"].shape[-1]
        want = {"mlp.W_gate": (D, F), "mlp.W_up": (D, F), "mlp.W_down": (F, D)}
    else:
        E, _, F = a["mlp.experts.W_gate"].shape if a["mlp.experts.W_gate"].ndim == 3 else (0, 0, 0)
        S = a["mlp.shared.W_gate"].shape[-1]
        want = {"mlp.W_router": (D, E), "mlp.e_score_correction_bias": (E,), "mlp.experts.W_gate": (E, D, F),
                "mlp.experts.W_up": (E, D, F), "mlp.experts.W_down": (E, F, D), "mlp.shared.W_gate": (D, S),
                "mlp.shared.W_up": (D, S), "mlp.shared.W_down": (S, D)}
    want.update({"input_norm.weight": (D,), "post_attention_norm.weight": (D,)})
    for n, shape in want.items():
        if a[n].shape != shape:
            raise ValueError(f"params[{n!r}] must have shape {shape} for x of width {D}, got {a[n].shape}")


def deepseek_block_forward(x, p, layer: DeepSeekLayer, theta, positions, mask=None, kv: MLADecodeCache | None = None):
    """The six steps on ``x`` (..., N, D) at ``positions`` (N,), RoPE frequencies ``theta`` (dr/2,).

    Returns ``(y, cache)``; ``y`` (..., N, D). Every input is checked first: the attention's as
    :func:`attention_ref.nn.mla_forward` checks them, the norms' and the MLP's names and shapes here.

    Decoding: with ``kv`` (an :class:`attention_ref.nn.MLADecodeCache`, the layer's latents so far),
    ``x`` (B, n, D) are the new tokens at ``positions`` (n,) or (B, n), ``mask`` broadcastable to
    (B, 1, n, T + n); step 2 is :func:`attention_ref.nn.mla_decode_absorbed` (the absorbed form over
    the cached latents, which it extends), the other steps as they are; ``cache`` is None (no backward)."""
    _check_mlp(x, p, layer)
    if kv is not None and not isinstance(kv, MLADecodeCache):
        raise TypeError(f"kv must be an attention_ref.nn.MLADecodeCache (a layer's latents), got {type(kv).__name__}")
    x, attn_params, theta, positions = check_mla_inputs(x, _attention_params(p), layer.attn, theta, positions,
                                                        per_row=kv is not None)
    if kv is not None:
        check_mla_decode_inputs(x, layer.attn, kv.latent, mask)
    return _block(x, p, attn_params, layer, theta, positions, mask, kv)


def deepseek_block_formula(x, p, layer: DeepSeekLayer, theta, positions, mask=None, kv: MLADecodeCache | None = None):
    """:func:`deepseek_block_forward` on checked inputs (the DeepSeek-V3 family's step list calls it:
    ``lm_forward`` and ``LMDecoder`` check the model's params once, not at every block and step)."""
    return _block(x, p, _attention_params(p), layer, theta, positions, mask, kv)


def _attention_params(p):
    """The attention's params, without their ``self_attn.`` prefix."""
    return {k[len("self_attn."):]: v for k, v in p.items() if k.startswith("self_attn.")}


def _block(x, p, attn_params, layer, theta, positions, mask, kv):
    """The six steps."""
    # 1. z = RMSNorm_1(x)
    z, norm_1 = rms_norm_formula(np.asarray(x), p["input_norm.weight"], layer.eps)
    # 2. a = MLA(z) (decoding: in the absorbed form, over the cached latents and the new ones)
    if kv is None:
        a, attn = mla_formula(z, attn_params, theta, positions, layer.attn, mask)  # (..., N, D)
    else:
        a, kv.latent = mla_decode_absorbed_formula(z, attn_params, theta, positions, layer.attn, kv.latent, mask)
        attn = None
    # 3. h = x + a
    h = x + a
    # 4. u = RMSNorm_2(h)
    u, norm_2 = rms_norm_formula(h, p["post_attention_norm.weight"], layer.eps)
    # 5. m = SwiGLU(u), or the routed experts plus the shared ones
    if layer.routing is None:
        m, mlp = swiglu_formula(u, *(p[n] for n in _DENSE))
    else:
        routed, moe = swiglu_moe_formula(u, p["mlp.W_router"], *(p[n] for n in _EXPERTS), layer.routing,
                                         p["mlp.e_score_correction_bias"])
        shared, shared_cache = swiglu_formula(u, *(p[n] for n in _SHARED))
        m, mlp = routed + shared, (moe, shared_cache)
    # 6. y = h + m
    return h + m, (None if kv is not None else DeepSeekBlockCache(norm_1, attn, norm_2, mlp, layer))


def deepseek_block_backward(dy, cache: DeepSeekBlockCache):
    """The six steps in reverse: ``(dx, grads)`` keyed like the block's params (the choice of experts
    held fixed; the correction bias gets a zero gradient)."""
    g = {}
    # 6. y = h + m: dy reaches h directly and through the MLP
    # 5. the MLP
    if cache.layer.routing is None:
        du, *grads = swiglu_backward(dy, cache.mlp)
        g.update(zip(_DENSE, grads))
    else:
        moe, shared_cache = cache.mlp
        du, g["mlp.W_router"], *grads = swiglu_moe_backward(dy, moe)
        g.update(zip(_EXPERTS, grads))
        du_shared, *grads = swiglu_backward(dy, shared_cache)
        g.update(zip(_SHARED, grads))
        du = du + du_shared
        g["mlp.e_score_correction_bias"] = np.zeros(g["mlp.W_router"].shape[1], du.dtype)
    # 4. u = RMSNorm_2(h)
    dh_mlp, g["post_attention_norm.weight"] = rms_norm_backward(du, cache.norm_2)
    dh = dy + dh_mlp
    # 3. h = x + a; 2. a = MLA(z)
    dz, attn_grads = mla_backward(dh, cache.attn)
    g.update({f"self_attn.{k}": v for k, v in attn_grads.items()})
    # 1. z = RMSNorm_1(x)
    dx_norm, g["input_norm.weight"] = rms_norm_backward(dz, cache.norm_1)
    return dh + dx_norm, g
