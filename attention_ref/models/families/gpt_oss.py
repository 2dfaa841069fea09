"""gpt-oss (transformers' ``GptOssForCausalLM``): Llama's pre-norm block with three changes in the
attention (a learned sink per head, biases on every projection, sliding and full layers
alternating), YaRN RoPE, and a mixture of experts for the MLP.

Reader: ``hidden_size``, ``num_hidden_layers``, ``num_attention_heads``, ``num_key_value_heads``,
``head_dim`` (default 64, not ``hidden_size / heads``), ``intermediate_size`` (each expert's width),
``num_local_experts`` (128) and ``num_experts_per_tok`` (4), ``rms_norm_eps`` (1e-5),
``sliding_window`` (128), ``layer_types`` (default: even layers sliding, odd ones full),
``rope_theta`` / ``rope_scaling`` (4.x) or ``rope_parameters`` (5.x), default YaRN with factor 32 over
4096 positions, ``truncate`` False (:mod:`attention_ref.nn.yarn`), ``tie_word_embeddings`` (False)
and ``pad_token_id``. Refused by name: ``attention_bias`` False (4.57 keeps the biases whatever it
says, 5.x drops them), ``swiglu_alpha`` / ``swiglu_limit`` other than 1.702 / 7.0 (4.57's experts
use those constants, 5.x reads the fields), an explicit ``rope_scaling: null`` (4.57 then runs plain
RoPE, 5.x its YaRN default), a sliding layer without a window. ``router_aux_loss_coef`` and
``output_router_logits`` only concern the auxiliary loss, which :func:`attention_ref.lm_loss` leaves
out (it is transformers' language-modelling loss; the auxiliary term is
:func:`attention_ref.nn.load_balancing_loss_forward`, added only when asked).

The block, numbered so the backward walks it in reverse (transformers' module in brackets):

1. ``z = RMSNorm_1(x)``                                    (``input_layernorm``)
2. ``a = Attn(z)``: ``q = z W_q + b_q``, ``k``, ``v`` likewise; YaRN RoPE on q and k (the rotation
   times the attention factor); grouped heads, causal (within ``sliding_window`` on the sliding
   layers), each head's softmax with its sink logit in the denominator
   (:mod:`attention_ref.variants.sink_softmax`); ``W_o``, ``b_o``   (``self_attn``)
3. ``h = x + a``
4. ``u = RMSNorm_2(h)``                                    (``post_attention_layernorm``)
5. ``m = MoE(u)``: router logits ``u W_r + b_r``, the top k, a softmax over those k; each chosen
   expert's clamped SwiGLU with biases (gate and up interleaved); the weighted sum
   (:func:`attention_ref.nn.moe_forward`)            (``mlp``: ``mlp.router``, ``mlp.experts``)
6. ``y = h + m``

The whole model is Llama's (token table, final ``RMSNorm``, head). Decoding runs the same six steps
with each layer's :class:`attention_ref.variants.kv_cache.KVCache`; the backward holds each token's
chosen experts fixed, as autograd does.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ...nn.clamped_swiglu import GPT_OSS_SWIGLU_ALPHA, GPT_OSS_SWIGLU_LIMIT
from ...nn.moe import moe_backward, moe_formula
from ...nn.moe_routing import Routing
from ...nn.multi_head_attention import causal_self_attention_formula
from ...nn.rms_norm import rms_norm_backward, rms_norm_formula
from ...nn.rope_scaling import SCALED_ROPE_TYPES
from ...variants.grouped_heads import multi_head_attention_backward_formula
from ...variants.rope import RopeCache, rope_backward, rotate
from ..config import LMConfig, refuse
from ..family import COMPUTED, NEUTRAL, Features, Tensor, computed, neutral
from ..trace_steps import SEPARATOR, grouped_attention_steps, linear_output, norm_output
from .llama import FAMILY as LLAMA, LLAMA_KEYS, rope_spellings, token_id

__all__ = ["FAMILY", "GptOssLayer", "YarnRotary", "GptOssBlockCache", "gpt_oss_block", "gpt_oss_block_backward",
           "gpt_oss_trace_block", "GPT_OSS_YARN"]

MODEL_TYPE = "gpt_oss"

#: GptOssConfig's default RoPE (4.57's ``rope_scaling``, 5.24's ``rope_parameters``)
GPT_OSS_YARN = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                "original_max_position_embeddings": 4096}


def _rope(d):
    """``(rope_theta, rope_scaling)``: YaRN by default; any type of :data:`SCALED_ROPE_TYPES`."""
    if "rope_scaling" in d and d["rope_scaling"] is None and not d.get("rope_parameters"):
        refuse("rope_scaling", None, MODEL_TYPE)  # 4.57: plain RoPE; 5.x: its YaRN default
    rope, theta = rope_spellings(d, MODEL_TYPE, theta_default=150000.0)
    if d.get("rope_scaling") is None and d.get("rope_parameters") is None:
        rope = dict(GPT_OSS_YARN)  # no RoPE given: transformers' default (4.57 and 5.x), YaRN
    if rope["rope_type"] not in SCALED_ROPE_TYPES:
        refuse("the RoPE scaling rope_type", rope["rope_type"], MODEL_TYPE)
    if rope.get("partial_rotary_factor", 1.0) != 1.0:
        refuse("the RoPE partial_rotary_factor", rope["partial_rotary_factor"], MODEL_TYPE)
    scaling = None
    if rope["rope_type"] != "default":
        scaling = {k: v for k, v in rope.items() if k not in ("rope_theta", "partial_rotary_factor")}
    return float(theta), scaling


def read(d):
    """An LMConfig of gpt-oss from its ``config.json`` (the module docstring lists the fields)."""
    if d.get("attention_bias", True) is not True:
        refuse("attention_bias", d["attention_bias"], MODEL_TYPE)
    for name, value in (("swiglu_alpha", GPT_OSS_SWIGLU_ALPHA), ("swiglu_limit", GPT_OSS_SWIGLU_LIMIT)):
        if d.get(name, value) != value:
            refuse(name, d[name], MODEL_TYPE)  # 4.57's experts use the constant, 5.x the field: they differ
    layers = d["num_hidden_layers"]
    kinds = d.get("layer_types") or ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(layers)]
    theta, scaling = _rope(d)
    D, H = d["hidden_size"], d["num_attention_heads"]
    head_dim = d.get("head_dim", 64)  # GptOssConfig's default; null: hidden_size // heads, as transformers
    head_dim = D // H if head_dim is None else head_dim
    kv_heads = d.get("num_key_value_heads")
    return LMConfig(family=MODEL_TYPE, vocab_size=d["vocab_size"], d_model=D, num_layers=layers, num_heads=H,
                    num_kv_heads=H if kv_heads is None else kv_heads, d_ff=d["intermediate_size"],
                    max_positions=d.get("max_position_embeddings", 131072), eps=d.get("rms_norm_eps", 1e-5),
                    rope_theta=theta, rope_scaling=scaling,
                    sliding_window=d.get("sliding_window", 128) if "sliding_attention" in kinds else None,
                    head_dim=None if head_dim * H == D else head_dim,
                    tie_word_embeddings=d.get("tie_word_embeddings", False), pad_token_id=token_id(d),
                    layer_types=tuple(kinds), num_experts=d.get("num_local_experts", 128),
                    experts_per_token=d.get("num_experts_per_tok", 4))


def check(config):
    """A gpt-oss config has its experts, and a window when a layer slides."""
    if config.num_experts is None:
        raise ValueError(f"a {config.family} model needs num_experts and experts_per_token (its mixture of experts)")
    if config.layer_types is None:
        raise ValueError(f"a {config.family} model needs its layer_types (sliding or full attention per layer)")
    if "sliding_attention" in config.layer_types and config.sliding_window is None:
        raise ValueError(f"{config.family}: a sliding_attention layer needs a sliding_window")
    if config.d_head % 2:
        raise ValueError(f"{config.family}: head_dim = {config.d_head} must be even (RoPE rotates pairs)")


class GptOssLayer(NamedTuple):
    """A layer's constants, read once per run: RoPE's frequencies and attention factor, its window."""

    theta: np.ndarray  # (Dh/2,) float64
    factor: float  # YaRN's attention factor (1.0 for plain RoPE)
    window: int | None


def gpt_oss_layers(config):
    theta, factor = config.rope_frequencies(), config.rope_attention_factor()
    return [GptOssLayer(theta, factor, config.sliding_window if kind == "sliding_attention" else None)
            for kind in config.layer_types]


class YarnRotary(NamedTuple):
    """Step 2's RoPE as the multi-head layer's rotary hook: ``a R(p) x`` on q and k (rotate-half
    pairs), ``a`` YaRN's attention factor (transformers multiplies ``cos`` and ``sin`` by it, so the
    scores grow by ``a^2``). Backward: ``a R(p)^T`` (the rotation's cache holds the scaled cos and
    sin, and RoPE's backward is linear in them)."""

    positions: np.ndarray  # (N,), or (B, 1, t) when decoding
    theta: np.ndarray  # (Dh/2,)
    factor: float

    def _rotate(self, x):
        angles = np.asarray(self.positions, dtype=np.float64)[..., None] * self.theta  # (..., N, Dh/2)
        cos = (np.cos(angles) * self.factor).astype(x.dtype)
        sin = (np.sin(angles) * self.factor).astype(x.dtype)
        return rotate(x, cos, sin), RopeCache(cos, sin, x.shape)

    def forward(self, q, k):
        (q, q_cache), (k, k_cache) = self._rotate(q), self._rotate(k)  # (..., H, N, Dh), (..., Hkv, N, Dh)
        return q, k, (q_cache, k_cache)

    def backward(self, dq, dk, cache):
        q_cache, k_cache = cache
        return rope_backward(dq, q_cache), rope_backward(dk, k_cache)


class GptOssBlockCache(NamedTuple):
    norm1: object  # step 1
    attn: object  # step 2, GroupedMultiHeadCache
    norm2: object  # step 4
    moe: object  # step 5, MoECache
    m: np.ndarray  # step 5's output (..., N, D) (the trace's ``mlp``)


_ATTN = ("W_q", "W_k", "W_v", "W_o", "b_q", "b_k", "b_v", "b_o")
_MOE = ("W_router", "b_router", "W_gate_up", "b_gate_up", "W_down", "b_down")


def gpt_oss_block(x, p, config, layer: GptOssLayer, mask, positions, kv):
    """The six steps on ``x`` (..., N, D) at ``positions``; with ``kv`` a decoding step (the new
    tokens attend to the cached ones too; no cache is kept for a backward)."""
    attn = {name: p[f"self_attn.{name}"] for name in _ATTN}
    at = positions if kv is None else positions[..., None, :]  # (N,), or (B, 1, t) when decoding
    # 1. z = RMSNorm_1(x)
    z, norm1 = rms_norm_formula(x, p["input_norm.weight"], config.eps)  # (..., N, D)
    # 2. a = Attn(z): YaRN RoPE, grouped heads with sinks, causal (within the window on a sliding layer)
    a, attn_cache = causal_self_attention_formula(z, attn, config.num_heads, config.num_kv_heads, mask=mask, kv=kv,
                                                  window=layer.window, rotary=YarnRotary(at, layer.theta, layer.factor),
                                                  sinks=p["self_attn.sinks"], param_keys=_ATTN)  # (..., N, D)
    # 3. h = x + a
    hidden = x + a  # (..., N, D)
    # 4. u = RMSNorm_2(h)
    u, norm2 = rms_norm_formula(hidden, p["post_attention_norm.weight"], config.eps)  # (..., N, D)
    # 5. m = MoE(u): the top k of the router's logits, a softmax over them, the chosen experts' weighted sum
    W_router, b_router, *experts = (p[f"mlp.{name}"] for name in _MOE)
    m, moe = moe_formula(u, W_router, b_router, tuple(experts), Routing(config.experts_per_token),
                         constants=(GPT_OSS_SWIGLU_ALPHA, GPT_OSS_SWIGLU_LIMIT))  # (..., N, D)
    # 6. y = h + m
    y = hidden + m  # (..., N, D)
    return y, (None if kv is not None else GptOssBlockCache(norm1, attn_cache, norm2, moe, m))


def gpt_oss_block_backward(dy, cache: GptOssBlockCache):
    """The six steps in reverse: ``(dx, grads)`` keyed like the block's params (the chosen experts
    held fixed)."""
    g = {}
    # 6. y = h + m; 5. m = MoE(u)
    du, *moe_grads = moe_backward(dy, cache.moe)  # (..., N, D)
    g.update({f"mlp.{name}": grad for name, grad in zip(_MOE, moe_grads)})
    # 4. u = RMSNorm_2(h)
    dh_norm, g["post_attention_norm.weight"] = rms_norm_backward(du, cache.norm2)
    dh = dy + dh_norm  # (..., N, D)
    # 3. h = x + a; 2. a = Attn(z): z fed the query, the key and the value
    dquery, dkey, dvalue, attn_grads = multi_head_attention_backward_formula(dh, cache.attn)
    g.update({f"self_attn.{name}": grad for name, grad in attn_grads.items()})  # sinks included
    # 1. z = RMSNorm_1(x)
    dx_norm, g["input_norm.weight"] = rms_norm_backward(dquery + dkey + dvalue, cache.norm1)
    return dh + dx_norm, g


def gpt_oss_trace_block(cache, p, config):
    """The trace of one ``GptOssDecoderLayer`` (after ``model.layers.<i>.``), from its caches. The
    MoE's modules as transformers 5.x records them, on the tokens flattened: ``mlp.router`` its
    logits (B T, E) (4.57 records the top-k softmax weights scattered into (B T, E) instead), and
    ``mlp.experts`` the weighted sum (B T, D) (4.57: (B, T, D)); ``mlp`` is (B, T, D) in both."""
    attn, m = cache.attn, cache.m
    a = linear_output(attn.o_proj, p["self_attn.b_o"])  # (..., T, D)
    router = linear_output(cache.moe.router.linear, p["mlp.b_router"])  # (B T, E)
    return ([("input_layernorm", attn.q_proj.x),
             ("self_attn.q_proj", linear_output(attn.q_proj, p["self_attn.b_q"])),
             ("self_attn.k_proj", linear_output(attn.k_proj, p["self_attn.b_k"])),
             ("self_attn.v_proj", linear_output(attn.v_proj, p["self_attn.b_v"]))]
            + [(f"self_attn{SEPARATOR}{step}", value) for step, value in grouped_attention_steps(attn)]
            + [("self_attn.o_proj", a), ("self_attn", a), ("post_attention_layernorm", norm_output(cache.norm2)),
               ("mlp.router", router), ("mlp.experts", m.reshape(-1, m.shape[-1])), ("mlp", m)])


def D(c):
    return (c.d_model,)


def _q(c):
    return c.num_heads * c.d_head


def _kv(c):
    return c.num_kv_heads * c.d_head


#: a block's tensors, in the order of the forward (ours after ``layers.<i>.``, theirs after ``model.layers.<i>.``)
BLOCK = (
    Tensor(("input_norm.weight",), "input_layernorm.weight", "as is", D, "ones"),
    Tensor(("self_attn.W_q",), "self_attn.q_proj.weight", "transpose", lambda c: (c.d_model, _q(c))),
    Tensor(("self_attn.b_q",), "self_attn.q_proj.bias", "as is", lambda c: (_q(c),), "zeros"),
    Tensor(("self_attn.W_k",), "self_attn.k_proj.weight", "transpose", lambda c: (c.d_model, _kv(c))),
    Tensor(("self_attn.b_k",), "self_attn.k_proj.bias", "as is", lambda c: (_kv(c),), "zeros"),
    Tensor(("self_attn.W_v",), "self_attn.v_proj.weight", "transpose", lambda c: (c.d_model, _kv(c))),
    Tensor(("self_attn.b_v",), "self_attn.v_proj.bias", "as is", lambda c: (_kv(c),), "zeros"),
    Tensor(("self_attn.W_o",), "self_attn.o_proj.weight", "transpose", lambda c: (_q(c), c.d_model)),
    Tensor(("self_attn.b_o",), "self_attn.o_proj.bias", "as is", D, "zeros"),
    Tensor(("self_attn.sinks",), "self_attn.sinks", "as is", lambda c: (c.num_heads,)),
    Tensor(("post_attention_norm.weight",), "post_attention_layernorm.weight", "as is", D, "ones"),
    Tensor(("mlp.W_router",), "mlp.router.weight", "transpose", lambda c: (c.d_model, c.num_experts)),
    Tensor(("mlp.b_router",), "mlp.router.bias", "as is", lambda c: (c.num_experts,)),
    Tensor(("mlp.W_gate_up",), "mlp.experts.gate_up_proj", "as is", lambda c: (c.num_experts, c.d_model, 2 * c.d_ff)),
    Tensor(("mlp.b_gate_up",), "mlp.experts.gate_up_proj_bias", "as is", lambda c: (c.num_experts, 2 * c.d_ff),
           "zeros"),
    Tensor(("mlp.W_down",), "mlp.experts.down_proj", "as is", lambda c: (c.num_experts, c.d_ff, c.d_model)),
    Tensor(("mlp.b_down",), "mlp.experts.down_proj_bias", "as is", lambda c: (c.num_experts, c.d_model), "zeros"),
)

#: GptOssConfig's keys (``to_dict()`` on 4.57.1 and 5.24) and what each is here; a key of no row is refused
KEYS = {
    **{k: v for k, v in LLAMA_KEYS.items() if k not in ("attention_bias", "mlp_bias", "pretraining_tp")},
    **computed("num_local_experts", "num_experts_per_tok", "sliding_window", "layer_types"),
    # no step of 4.57's or 5.24's modeling_gpt_oss reads hidden_act (the experts' activation is fixed)
    **neutral("hidden_act", "router_aux_loss_coef", "output_router_logits"),  # the latter two: the auxiliary loss only
    "attention_bias": COMPUTED, "swiglu_alpha": COMPUTED, "swiglu_limit": COMPUTED,
    "rope_scaling": COMPUTED, "rope_parameters": COMPUTED, "rope_theta": COMPUTED,
}

FAMILY = LLAMA._replace(
    model_type=MODEL_TYPE, read=read, features=Features(qkv_bias=True, rope_attention_factor=True),
    fields=LLAMA.fields._replace(
        optional_positive=LLAMA.fields.optional_positive + ("num_local_experts", "num_experts_per_tok"),
        numbers=LLAMA.fields.numbers + ("swiglu_alpha", "swiglu_limit")),
    allowed=("head_dim", "rope_scaling", "layer_types", "sliding_window", "num_experts", "experts_per_token"),
    check=check, model_title="transformers GptOssForCausalLM (whole model; blocks: model.layers.<i>. as"
                             " GptOssDecoderLayer)",
    block_title="transformers GptOssDecoderLayer (layers.<i>.)", block=BLOCK, layers=gpt_oss_layers,
    # float32_steps: none for llama_in_float64 (its RoPE is half-width and scaled): gpt_oss_in_float64 patches it
    block_forward=gpt_oss_block, block_backward=gpt_oss_block_backward, init_block=None,
    float32_steps=(), keys=KEYS, trace_block=gpt_oss_trace_block)

#: a small gpt-oss (attention_ref.interop.write_random_model): every config.json field that changes the maths;
#: YaRN shrunk to the tiny model (head width 8, base 500: the ramp spans the pairs), windows shorter than a prompt
EXAMPLE = {"vocab_size": 64, "hidden_size": 16, "intermediate_size": 12, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "num_local_experts": 4,
           "num_experts_per_tok": 2, "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "sliding_window": 3,
           "layer_types": ["sliding_attention", "full_attention"], "rope_theta": 500.0,
           "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
                            "truncate": False, "original_max_position_embeddings": 64},
           "attention_bias": True, "swiglu_alpha": GPT_OSS_SWIGLU_ALPHA, "swiglu_limit": GPT_OSS_SWIGLU_LIMIT,
           "tie_word_embeddings": False}
FAMILY = FAMILY._replace(example=EXAMPLE)
