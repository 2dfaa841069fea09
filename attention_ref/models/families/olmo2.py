"""OLMo 2 (transformers' ``Olmo2ForCausalLM``): Llama's parts with the norms after each sub-layer,
and q/k RMSNorms over the whole projection.

Reader: Llama's (:func:`.llama.read_llama`), with OLMo 2's defaults ``rms_norm_eps = 1e-5`` and
an untied head.

The block, numbered so the backward walks it in reverse (transformers' module in brackets):

1. ``a = Attn(x)`` (``self_attn``): ``q = x W_q``, ``k = x W_k``, ``v = x W_v``;
   ``q = RMSNorm_q(q)`` over all H Dh features of a position (``q_norm``), ``k = RMSNorm_k(k)``
   over its Hkv Dh (``k_norm``); split into heads, RoPE, causal grouped attention, ``W_o``
   (the norms are the multi-head layer's rotary hook, :class:`ProjectionNormRotary`)
2. ``h = x + RMSNorm_a(a)``                (``post_attention_layernorm``)
3. ``m = SwiGLU(h)``                       (``mlp``)
4. ``y = h + RMSNorm_m(m)``                (``post_feedforward_layernorm``)

There is no norm before a sub-layer. Decoding runs the same four steps with the layer's
:class:`attention_ref.variants.kv_cache.KVCache` (step 1 then attends to the cached keys).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..._pair_checks import MultiHeadInputs
from ...core.masks import causal_mask
from ...fast.core_formulas import merge_heads_formula, split_heads_formula
from ...nn.llama_block import RotaryHalf
from ...nn.multi_head_attention import combine_masks, decode_attention
from ...nn.rms_norm import rms_norm_backward, rms_norm_formula
from ...nn.swiglu import swiglu_backward, swiglu_formula
from ...variants.grouped_heads import multi_head_attention_backward_formula, multi_head_attention_formula
from ..family import Features, Tensor
from ..trace_steps import SEPARATOR, grouped_attention_steps, linear_output, norm_output
from .llama import FAMILY as LLAMA, LLAMA_BLOCK

__all__ = ["FAMILY", "ProjectionNormRotary", "Olmo2BlockCache", "olmo2_block", "olmo2_block_backward",
           "olmo2_trace_block"]

MODEL_TYPE = "olmo2"


def read(d):
    return LLAMA.read(d, MODEL_TYPE, eps=d.get("rms_norm_eps", 1e-5))


class ProjectionNormRotary(NamedTuple):
    """Step 1's q/k norms then RoPE, as the multi-head layer's rotary hook: each position's query
    RMS-normalised over all its heads' features (weight (H Dh,)), its key over (Hkv Dh,), then
    ``rotary``. Backward: RoPE's, then each norm's (merge, norm backward, split); the weights'
    gradients come back as the third value."""

    rotary: RotaryHalf
    q_weight: np.ndarray  # (H Dh,)
    k_weight: np.ndarray  # (Hkv Dh,)
    eps: float

    def forward(self, q, k):
        h, hkv = q.shape[-3], k.shape[-3]
        q, q_norm = rms_norm_formula(merge_heads_formula(q), self.q_weight, self.eps)  # (..., N, H Dh)
        k, k_norm = rms_norm_formula(merge_heads_formula(k), self.k_weight, self.eps)  # (..., N, Hkv Dh)
        q, k, rotary = self.rotary.forward(split_heads_formula(q, h), split_heads_formula(k, hkv))
        return q, k, (q_norm, k_norm, rotary)

    def backward(self, dq, dk, cache):
        q_norm, k_norm, rotary = cache
        h, hkv = dq.shape[-3], dk.shape[-3]
        dq, dk = self.rotary.backward(dq, dk, rotary)
        dq, dq_weight = rms_norm_backward(merge_heads_formula(dq), q_norm)  # (..., N, H Dh), (H Dh,)
        dk, dk_weight = rms_norm_backward(merge_heads_formula(dk), k_norm)
        return (split_heads_formula(dq, h), split_heads_formula(dk, hkv),
                {"q_norm.weight": dq_weight, "k_norm.weight": dk_weight})


class Olmo2BlockCache(NamedTuple):
    attn: object  # step 1, GroupedMultiHeadCache
    norm_a: object  # step 2
    mlp: object  # step 3
    norm_m: object  # step 4


_ATTN = ("W_q", "W_k", "W_v", "W_o")


def olmo2_block(x, p, config, theta, mask, positions, kv):
    """The four steps on ``x`` (..., N, D) at ``positions``; with ``kv`` a decoding step (the
    new tokens attend to the cached ones too; no cache is kept for a backward)."""
    attn = {name: p[f"self_attn.{name}"] for name in _ATTN}
    at = positions if kv is None else positions[:, None, :]  # (N,), or (B, 1, t) when decoding
    hook = ProjectionNormRotary(RotaryHalf(at, at, float(config.rope_theta), theta),
                                p["self_attn.q_norm.weight"], p["self_attn.k_norm.weight"], config.eps)
    H, Hkv = config.num_heads, config.num_kv_heads
    # 1. a = Attn(x): q/k norms over the projections, RoPE, causal grouped heads
    if kv is None:
        n = x.shape[-2]
        causal = causal_mask(n) if mask is None else combine_masks(mask, causal_mask(n))  # (..., N, N)
        a, attn_cache = multi_head_attention_formula(MultiHeadInputs(x, x, x, attn, causal, None, H, Hkv), _ATTN,
                                                     rotary=hook)  # (..., N, D)
    else:
        a, attn_cache = decode_attention(x, attn, H, Hkv, kv, rotary=hook, name="x", mask=mask), None
    # 2. h = x + RMSNorm_a(a)
    a_hat, norm_a = rms_norm_formula(a, p["post_attention_norm.weight"], config.eps)
    hidden = x + a_hat  # (..., N, D)
    # 3. m = SwiGLU(h)
    m, mlp = swiglu_formula(hidden, p["mlp.W_gate"], p["mlp.W_up"], p["mlp.W_down"])  # (..., N, D)
    # 4. y = h + RMSNorm_m(m)
    m_hat, norm_m = rms_norm_formula(m, p["post_feedforward_norm.weight"], config.eps)
    y = hidden + m_hat  # (..., N, D)
    return y, (None if kv is not None else Olmo2BlockCache(attn_cache, norm_a, mlp, norm_m))


def olmo2_block_backward(dy, cache: Olmo2BlockCache):
    """The four steps in reverse: ``(dx, grads)`` keyed like the block's params."""
    g = {}
    # 4. y = h + RMSNorm_m(m): dy reaches h directly and through the norm
    dm, g["post_feedforward_norm.weight"] = rms_norm_backward(dy, cache.norm_m)
    # 3. m = SwiGLU(h)
    dh_mlp, g["mlp.W_gate"], g["mlp.W_up"], g["mlp.W_down"] = swiglu_backward(dm, cache.mlp)
    dh = dy + dh_mlp  # (..., N, D)
    # 2. h = x + RMSNorm_a(a)
    da, g["post_attention_norm.weight"] = rms_norm_backward(dh, cache.norm_a)
    # 1. a = Attn(x): x fed the query, the key and the value
    dquery, dkey, dvalue, attn_grads = multi_head_attention_backward_formula(da, cache.attn)
    g.update({f"self_attn.{name}": grad for name, grad in attn_grads.items()})
    return dh + dquery + dkey + dvalue, g


def olmo2_trace_block(cache, p, config):
    """The trace of one ``Olmo2DecoderLayer`` (after ``model.layers.<i>.``), from its caches: each
    q/k norm right after its projection, over the whole projection (..., T, H Dh); no norm before
    a sub-layer."""
    attn, mlp = cache.attn, cache.mlp
    q_norm, k_norm, _ = attn.rotary[1]
    a = linear_output(attn.o_proj)  # (..., T, D)
    m = linear_output(mlp.down)  # (..., T, D)
    return ([("self_attn.q_proj", linear_output(attn.q_proj)), ("self_attn.q_norm", norm_output(q_norm)),
             ("self_attn.k_proj", linear_output(attn.k_proj)), ("self_attn.k_norm", norm_output(k_norm)),
             ("self_attn.v_proj", linear_output(attn.v_proj))]
            + [(f"self_attn{SEPARATOR}{step}", value) for step, value in grouped_attention_steps(attn)]
            + [("self_attn.o_proj", a), ("self_attn", a), ("post_attention_layernorm", norm_output(cache.norm_a)),
               ("mlp.gate_proj", mlp.a), ("mlp.act_fn", mlp.a * mlp.sig), ("mlp.up_proj", mlp.u),
               ("mlp.down_proj", m), ("mlp", m), ("post_feedforward_layernorm", norm_output(cache.norm_m))])


def _q(c):
    return (c.num_heads * c.d_head,)


def _kv(c):
    return (c.num_kv_heads * c.d_head,)


#: Llama's projections and MLP, q/k norms over the projections, the two norms after the sub-layers
BLOCK = (*LLAMA_BLOCK[1:5],
         Tensor(("self_attn.q_norm.weight",), "self_attn.q_norm.weight", "as is", _q, "ones"),
         Tensor(("self_attn.k_norm.weight",), "self_attn.k_norm.weight", "as is", _kv, "ones"),
         LLAMA_BLOCK[5], *LLAMA_BLOCK[6:],
         Tensor(("post_feedforward_norm.weight",), "post_feedforward_layernorm.weight", "as is",
                lambda c: (c.d_model,), "ones"))

FAMILY = LLAMA._replace(
    model_type=MODEL_TYPE, read=read, features=Features(qk_norm="projection", norm_placement="post"),
    allowed=("head_dim", "rope_scaling"), block=BLOCK, block_title="transformers Olmo2DecoderLayer (layers.<i>.)",
    layers=lambda config: [config.rope_frequencies()] * config.num_layers, block_forward=olmo2_block,
    block_backward=olmo2_block_backward, init_block=None, float32_steps=(("olmo2", "Olmo2"),),
    trace_block=olmo2_trace_block)

FAMILY = FAMILY._replace(example=dict(LLAMA.example))  # a small model
