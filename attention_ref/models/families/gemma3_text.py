"""Gemma 3, text (transformers' ``Gemma3ForCausalLM``): sandwich (1 + w) RMSNorms, GeGLU, sqrt(D)
embeddings, sliding and global layers, q/k norms.

Reader: Llama's sizes, ``head_dim``, ``query_pre_attn_scalar`` (default 256), ``sliding_window``
(default 4096), ``layer_types`` (or every ``sliding_window_pattern``-th layer global, default 6),
``rope_parameters`` per layer type (5.x) or ``rope_theta``, ``rope_scaling`` and
``rope_local_base_freq`` (4.x); Gemma 2's soft caps, a ``hidden_activation`` other than the tanh
GELU, ``attention_bias`` and ``use_bidirectional_attention`` are refused by name.

The whole model's steps (:mod:`attention_ref.models.lm` runs them):

1. ``x = embed_tokens[ids] * sqrt(D)``  (the factor rounded to the weights' dtype, as transformers)
2. ``x = Block_l(x)``, the block of :mod:`attention_ref.nn.gemma_block` (``model.layers.<i>``):
   1. ``z = GRMS_in(x)``  2. ``a = Attn(z)``: q/k (1 + w) norms per head, RoPE (the sliding
   layers' base ``rope_local_theta``), scores by ``query_pre_attn_scalar ** -0.5``, causal
   (sliding layers: within the window)  3. ``h = x + GRMS_post_attn(a)``  4. ``u = GRMS_pre_ff(h)``
   5. ``m = GeGLU(u)``  6. ``y = h + GRMS_post_ff(m)``
3. ``h = GRMS_f(x)``  (``model.norm``, gain 1 + w)
4. ``logits = h W_head``
"""
from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from ...nn.gemma_block import gemma_block_backward, gemma_block_formula, init_gemma_block_params
from ...nn.gemma_rms_norm import gemma_rms_norm_formula
from ...nn.rms_norm import rms_norm_backward
from ...nn.rope_scaling import ROPE_TYPES
from ..config import LAYER_TYPES, LMConfig, refuse
from ..family import BASE_KEYS, COMPUTED, DROPOUT, NEUTRAL, Features, Tensor, computed
from ..trace_steps import SEPARATOR, attention_steps, grouped_attention_steps, linear_output, norm_output
from .llama import FAMILY as LLAMA, embed_tokens, embed_tokens_backward, one_value, rope_spellings, token_id

__all__ = ["FAMILY", "read_gemma", "gemma_rope", "embedding_normalizer", "check_gemma", "GEMMA_ALLOWED"]

MODEL_TYPE = "gemma3_text"


def gemma_rope(d, family):
    """``(rope_theta, scaling of the global layers, rope_local_base_freq)`` from transformers 5.x's
    ``rope_parameters`` per layer type or 4.x's ``rope_theta``, ``rope_scaling`` and
    ``rope_local_base_freq``; a type this package does not compute is refused by name."""
    per_type = d.get("rope_parameters") or {}
    if not isinstance(per_type, Mapping):
        raise ValueError(f"{family}: rope_parameters must be an object or null, got {per_type!r}")
    full_new, local = per_type, {}  # 4.x: rope_scaling applies to the global layers, the local ones are plain
    if "full_attention" in per_type or "sliding_attention" in per_type:  # 5.x: one dict per kind of layer
        full_new, local = per_type.get("full_attention") or {}, per_type.get("sliding_attention") or {}
    for name, part in (("the global layers' RoPE parameters", full_new), ("the sliding layers' RoPE parameters", local)):
        if not isinstance(part, Mapping):
            raise ValueError(f"{family}: {name} must be an object, got {part!r}")
    # each base given twice (4.x's top-level field, 5.x's rope_parameters) with two values: refused naming both
    full, theta = rope_spellings(d, family, new=full_new, theta_default=1_000_000.0)
    local_theta = one_value(family, [("rope_local_base_freq", d.get("rope_local_base_freq")),
                                     ("rope_parameters.sliding_attention.rope_theta", local.get("rope_theta"))],
                            10_000.0)
    local_type = local.get("rope_type", local.get("type", "default"))
    if local_type != "default":
        refuse("the sliding layers' RoPE rope_type", local_type, family)
    full_type = full.get("rope_type", full.get("type", "default"))
    if full_type not in ROPE_TYPES:
        refuse("the RoPE scaling rope_type", full_type, family)  # e.g. "dynamic", "yarn"
    for part in (full, local):
        if part.get("partial_rotary_factor", 1.0) != 1.0:
            refuse("the RoPE partial_rotary_factor", part["partial_rotary_factor"], family)
    scaling = None
    if full_type != "default":
        scaling = {k: v for k, v in full.items() if k not in ("type", "rope_theta", "partial_rotary_factor")}
    for name, value in (("rope_theta", theta), ("rope_local_base_freq", local_theta)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
            raise ValueError(f"{family}: {name} must be a positive number, got {value!r}")
    return float(theta), scaling, float(local_theta)


def read_gemma(d, family=MODEL_TYPE, **fields):
    """A Gemma config (``fields`` given are set as they are: Gemma 2's reading on top)."""
    act = d.get("hidden_activation") or "gelu_pytorch_tanh"  # transformers reads no hidden_act for Gemma 2/3
    if act != "gelu_pytorch_tanh":
        refuse("hidden_activation", act, family)  # GeGLU's tanh GELU only
    for flag in ("attention_bias", "use_bidirectional_attention"):
        if d.get(flag):
            refuse(flag, True, family)
    for cap in ("attn_logit_softcapping", "final_logit_softcapping"):  # Gemma 2's soft caps: not Gemma 3's
        if d.get(cap) is not None:
            refuse(cap, d[cap], family)
    layers = d["num_hidden_layers"]
    kinds = d.get("layer_types")
    if kinds is None:  # as transformers builds them: every pattern-th layer global
        pattern = d.get("sliding_window_pattern", d.get("_sliding_window_pattern", 6))
        if isinstance(pattern, bool) or not isinstance(pattern, int) or pattern < 1:
            raise ValueError(f"{family}: sliding_window_pattern must be a positive integer, got {pattern!r}")
        kinds = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)]
    unknown = sorted({str(kind) for kind in kinds} - set(LAYER_TYPES))
    if unknown:
        refuse("layer_types", unknown, family)
    theta, scaling, local_theta = gemma_rope(d, family)
    D, H = d["hidden_size"], d["num_attention_heads"]
    head_dim = d.get("head_dim") or D // H
    if head_dim * H == D:
        head_dim = None
    elif head_dim % 2:
        refuse("head_dim", head_dim, family)  # RoPE rotates pairs
    kwargs = dict(family=family, vocab_size=d["vocab_size"], d_model=D, num_layers=layers, num_heads=H,
                  num_kv_heads=d.get("num_key_value_heads") or H, d_ff=d["intermediate_size"],
                  max_positions=d.get("max_position_embeddings", 131072), eps=d.get("rms_norm_eps", 1e-6),
                  rope_theta=theta, rope_scaling=scaling, sliding_window=d.get("sliding_window", 4096),
                  head_dim=head_dim, tie_word_embeddings=d.get("tie_word_embeddings", True),
                  pad_token_id=token_id(d), layer_types=tuple(kinds), rope_local_theta=local_theta,
                  query_pre_attn_scalar=d.get("query_pre_attn_scalar", 256))
    return LMConfig(**{**kwargs, **fields})


def check_gemma(config):
    """Gemma's own fields all present: the window, the kinds of layer, the scores' scalar, the local base."""
    if config.sliding_window is None:
        raise ValueError(f"a {config.family} model needs its sliding_window")
    for name in ("layer_types", "rope_local_theta", "query_pre_attn_scalar"):
        if getattr(config, name) is None:
            raise ValueError(f"{name} must be a positive number, got None" if name != "layer_types" else
                             f"layer_types must list one of {LAYER_TYPES} for each of the {config.num_layers}"
                             " layers, got None")


def embedding_normalizer(config, dtype) -> np.ndarray:
    """Step 1's factor ``sqrt(D)`` as a scalar of ``dtype`` (rounded to it, as transformers casts
    its normaliser to the hidden states' dtype)."""
    return np.asarray(math.sqrt(config.d_model), dtype=dtype)


def embed(ids, positions, params, config):
    """Step 1: the token table's rows times sqrt(D)."""
    e, cache = embed_tokens(ids, positions, params, config)  # (..., T, D)
    normalizer = embedding_normalizer(config, e.dtype)
    return e * normalizer, (cache, normalizer)


def embed_backward(dx, cache, config, table_grad=None):
    tok, normalizer = cache
    return embed_tokens_backward(dx * normalizer, tok, config, table_grad)  # de = dx * sqrt(D)


def layers(config):
    """Each layer's ``((theta, window), scale)``: RoPE's frequencies and window by its kind."""
    return list(zip(config.gemma_layers(), config.head_scale))


def block(x, p, config, layer, mask, positions, kv):
    """Step 2: :func:`attention_ref.nn.gemma_block.gemma_block_formula` (with ``kv``, its decoding step)."""
    (theta, window), scale = layer
    return gemma_block_formula(x, p, config.num_heads, config.num_kv_heads, eps=config.eps, mask=mask, scale=scale,
                               theta=theta, window=window, cap=config.attn_softcap, kv=kv, positions=positions)


def final_norm(x, params, config):
    """Step 3: the (1 + w) RMSNorm (:func:`attention_ref.nn.gemma_rms_norm.gemma_rms_norm_formula`)."""
    return gemma_rms_norm_formula(x, params["norm.weight"], config.eps)


def final_norm_backward(dh, cache):
    dx, dw = rms_norm_backward(dh, cache)  # the gain 1 + w: dw is the gain's gradient
    return dx, {"norm.weight": dw}


def trace_block(cache, p, config):
    """The trace of one ``Gemma3DecoderLayer`` / ``Gemma2DecoderLayer`` (after ``model.layers.<i>.``),
    from its caches: the q/k norms run after the three projections, on (..., H, T, Dh); Gemma 2's
    scores are the capped ones."""
    attn, mlp = cache.attn, cache.mlp
    out = [("input_layernorm", attn.q_proj.x)] + [(f"self_attn.{c}_proj", linear_output(getattr(attn, f"{c}_proj")))
                                                  for c in "qkv"]
    rotary_cache, a = attn.rotary[1], attn.attention
    if attn.scores is not None:  # Gemma 2: the scores hook soft-capped the scores
        steps = attention_steps(a.q, a.k, a.weights, a.scale, True, config.attn_softcap)
    else:
        steps = grouped_attention_steps(attn)
    if "self_attn.q_norm.weight" in p:  # Gemma 3: per head, before RoPE
        out += [("self_attn.q_norm", norm_output(rotary_cache[0])), ("self_attn.k_norm", norm_output(rotary_cache[1]))]
    out += [(f"self_attn{SEPARATOR}{step}", value) for step, value in steps]
    a = linear_output(attn.o_proj)  # (..., T, D)
    m = linear_output(mlp.down)  # (..., T, D)
    return out + [("self_attn.o_proj", a), ("self_attn", a),
                  ("post_attention_layernorm", norm_output(cache.norm_post_attn)), ("pre_feedforward_layernorm", mlp.gate.x), ("mlp.gate_proj", mlp.a), ("mlp.act_fn", mlp.gelu_a),
                  ("mlp.up_proj", mlp.u), ("mlp.down_proj", m), ("mlp", m),
                  ("post_feedforward_layernorm", norm_output(cache.norm_post_ff))]


def init_block(config, seed, dtype):
    return init_gemma_block_params(config.d_model, config.num_heads, config.d_ff, num_kv_heads=config.num_kv_heads,
                                   d_head=config.d_head, seed=seed, dtype=dtype,
                                   qk_norm=config.features.qk_norm == "head")


def D(c):
    return (c.d_model,)


_NORM = dict(how="as is", shape=D, init="zeros")  # Gemma's (1 + w) norms store w, initialised at 0
BLOCK = (
    LLAMA.block[0]._replace(init="zeros"),  # input_layernorm
    *LLAMA.block[1:5],  # q, k, v, o projections
    Tensor(("self_attn.q_norm.weight",), "self_attn.q_norm.weight", "as is", lambda c: (c.d_head,), "zeros"),
    Tensor(("self_attn.k_norm.weight",), "self_attn.k_norm.weight", "as is", lambda c: (c.d_head,), "zeros"),
    LLAMA.block[5]._replace(init="zeros"),  # post_attention_layernorm
    Tensor(("pre_feedforward_norm.weight",), "pre_feedforward_layernorm.weight", **_NORM),
    Tensor(("post_feedforward_norm.weight",), "post_feedforward_layernorm.weight", **_NORM),
    *LLAMA.block[6:],  # gate, up, down
)
FINAL = (LLAMA.final[0]._replace(init="zeros"), LLAMA.final[1])  # the (1 + w) norm's w at 0
#: Gemma3TextConfig's keys (4.57.1 and 5.24): COMPUTED by :func:`read_gemma`, NEUTRAL, DROPOUT, or the neutral
#: values (Gemma 2's soft caps: null only)
KEYS = {
    **BASE_KEYS,
    **computed("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
               "head_dim", "hidden_activation", "rms_norm_eps", "max_position_embeddings", "rope_theta",
               "rope_scaling", "rope_parameters", "rope_local_base_freq", "layer_types", "sliding_window",
               "sliding_window_pattern", "_sliding_window_pattern", "query_pre_attn_scalar"),
    "hidden_act": NEUTRAL,  # Gemma 1's name: transformers' Gemma 2 and 3 read hidden_activation only
    "attention_dropout": DROPOUT,
    "attention_bias": (False,), "use_bidirectional_attention": (False, None),
    "attn_logit_softcapping": (None,), "final_logit_softcapping": (None,),
}
#: the LMConfig fields a Gemma may set
GEMMA_ALLOWED = ("head_dim", "rope_scaling", "sliding_window", "layer_types", "rope_local_theta",
                 "query_pre_attn_scalar")

FAMILY = LLAMA._replace(
    model_type=MODEL_TYPE, read=read_gemma, features=Features(qk_norm="head", norm_placement="sandwich"),
    fields=LLAMA.fields._replace(
        optional_positive=("num_key_value_heads", "head_dim", "max_position_embeddings", "sliding_window",
                           "sliding_window_pattern"),
        flags=("tie_word_embeddings", "attention_bias"),  # use_bidirectional_attention: null in Gemma 2
        numbers=("rms_norm_eps", "rope_theta", "rope_local_base_freq", "query_pre_attn_scalar"),
        strings=("hidden_activation",)),
    allowed=GEMMA_ALLOWED, check=check_gemma, block=BLOCK, final=FINAL,
    block_title="transformers Gemma3DecoderLayer (layers.<i>.)", embed=embed, embed_backward=embed_backward,
    layers=layers, block_forward=block, block_backward=gemma_block_backward, final_norm=final_norm,
    final_norm_backward=final_norm_backward, init_block=init_block, float32_steps=(), keys=KEYS,
    buffers=("rotary_emb.inv_freq", "rotary_emb_local.inv_freq"),
    trace_block=trace_block)

#: a small Gemma 3 (attention_ref.interop.write_random_model)
FAMILY = FAMILY._replace(example={**{**{k: v for k, v in LLAMA.example.items() if k != "hidden_act"}, "head_dim": 4, "query_pre_attn_scalar": 4,
           "sliding_window": 4096, "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True,
           "layer_types": ["sliding_attention", "full_attention"]}, "rope_theta": 1_000_000.0,
    "rope_local_base_freq": 10000.0, "attn_logit_softcapping": None, "final_logit_softcapping": None})
