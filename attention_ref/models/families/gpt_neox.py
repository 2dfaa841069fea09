"""GPT-NeoX / Pythia (transformers' ``GPTNeoXForCausalLM``): partial RoPE, fused QKV, a parallel residual.

Reader: 4.x writes ``rotary_pct``, ``rotary_emb_base`` and ``rope_scaling``; 5.x writes
``rope_parameters`` (``rope_theta``, ``partial_rotary_factor``, ``rope_type``). A ``hidden_act``
other than the exact GELU, ``attention_bias = False`` and any RoPE scaling are refused by name.

The whole model's steps (:mod:`attention_ref.models.lm` runs them):

1. ``x = embed_in[ids]``                                (``gpt_neox.embed_in``)
2. ``x = Block_l(x)``, the block of :mod:`attention_ref.nn.gpt_neox_block` (``gpt_neox.layers.<i>``):
   with ``use_parallel_residual`` ``y = x + Attn(LN_1(x)) + MLP(LN_2(x))``, else sequential;
   RoPE (rotate-half) on the first ``int(Dh * rotary_pct)`` features of each head
3. ``h = LN_f(x)``                                      (``gpt_neox.final_layer_norm``)
4. ``logits = h W_head``                                (``embed_out``, 5.x's ``lm_head``)
"""
from __future__ import annotations

from ...fast.dispatch import linear_formula
from ...nn.gpt_neox_block import (GPT_NEOX_PARAM_NAMES, gpt_neox_attention_params, gpt_neox_block_backward,
                                  gpt_neox_block_formula, init_gpt_neox_block_params)
from ...nn.layer_norm import layer_norm_backward, layer_norm_formula
from ..config import LMConfig, refuse
from ..family import BASE_KEYS, DROPOUT, NEUTRAL, ConfigFields, Family, Features, Tensor, computed, top_tensor
from ..trace_steps import SEPARATOR, grouped_attention_steps, linear_output
from .llama import embed_tokens, embed_tokens_backward, one_value, rope_spellings

__all__ = ["FAMILY", "gpt_neox_block_shapes", "ACTIVATIONS"]

MODEL_TYPE = "gpt_neox"
#: GPT-NeoX's ``hidden_act`` values computed here: the exact (erf) GELU
ACTIVATIONS = ("gelu",)


def read(d):
    act = d.get("hidden_act", "gelu")
    if act not in ACTIVATIONS:
        refuse("hidden_act", act, MODEL_TYPE)  # e.g. "gelu_new", "gelu_fast", "relu": only the exact GELU here
    if d.get("attention_bias", True) is not True:
        refuse("attention_bias", d["attention_bias"], MODEL_TYPE)  # the fused QKV and dense have biases here
    # 4.x: rotary_emb_base (and rope_theta), rotary_pct (and partial_rotary_factor); 5.x: rope_parameters
    rope, theta = rope_spellings(d, MODEL_TYPE, theta_names=("rotary_emb_base", "rope_theta"))
    rope_type = rope["rope_type"]
    if rope_type != "default":
        refuse("the RoPE scaling rope_type", rope_type, MODEL_TYPE)  # e.g. "linear", "dynamic"
    extra = sorted(set(rope) - {"rope_type", "rope_theta", "partial_rotary_factor"})
    if extra:
        refuse("rope parameters", extra, MODEL_TYPE)
    pct = one_value(MODEL_TYPE, [(name, d.get(name)) for name in ("rotary_pct", "partial_rotary_factor")]
                    + [("rope_parameters.partial_rotary_factor", rope.get("partial_rotary_factor"))], 0.25)
    D, H = d["hidden_size"], d["num_attention_heads"]
    return LMConfig(family=MODEL_TYPE, vocab_size=d["vocab_size"], d_model=D, num_layers=d["num_hidden_layers"],
                    num_heads=H, num_kv_heads=H, d_ff=d["intermediate_size"],
                    max_positions=d.get("max_position_embeddings", 2048), eps=d.get("layer_norm_eps", 1e-5),
                    rope_theta=float(theta), tie_word_embeddings=d.get("tie_word_embeddings", False),
                    rotary_pct=float(pct), use_parallel_residual=d.get("use_parallel_residual", True))


def check(config):
    """As many key/value heads as heads, D a multiple of H, an even rotated width from 2 to d_head."""
    if config.num_kv_heads != config.num_heads or config.d_model % config.num_heads:
        raise ValueError(f"gpt_neox: num_kv_heads = {config.num_kv_heads} must equal num_heads = {config.num_heads}"
                         f" and d_model = {config.d_model} be a multiple of it")
    pct = config.rotary_pct
    if isinstance(pct, bool) or not isinstance(pct, (int, float)) or not 0 < pct <= 1:
        raise ValueError(f"gpt_neox: rotary_pct must be a number in (0, 1], got {pct!r}")
    r = config.rotary_dim
    if r < 2 or r % 2:
        raise ValueError(f"gpt_neox: rotary_pct = {pct} rotates int({config.d_head} * {pct}) = {r} features of"
                         " each head; an even number of at least 2 is needed (RoPE rotates pairs)")
    if not isinstance(config.use_parallel_residual, bool):
        raise ValueError(f"use_parallel_residual must be True or False, got {config.use_parallel_residual!r}")


def D(c):
    return (c.d_model,)


TOP = (
    top_tensor("embed_in", "gpt_neox.embed_in.weight", "as is", lambda c: (c.vocab_size, c.d_model)),
)
FINAL = (
    top_tensor("final_layer_norm.gamma", "gpt_neox.final_layer_norm.weight", "as is", D, "ones"),
    top_tensor("final_layer_norm.beta", "gpt_neox.final_layer_norm.bias", "as is", D, "zeros"),
    # the file's name in 4.x and 5.x (5.x's named_parameters() call it lm_head.weight)
    top_tensor("lm_head.W", "embed_out.weight", "transpose", lambda c: (c.d_model, c.vocab_size), optional=True,
               when=lambda c: not c.tie_word_embeddings),  # tied: absent
)
BLOCK = (
    Tensor(("input_layernorm.gamma",), "input_layernorm.weight", "as is", D, "ones"),
    Tensor(("input_layernorm.beta",), "input_layernorm.bias", "as is", D, "zeros"),
    Tensor(("attention.W_qkv",), "attention.query_key_value.weight", "transpose",  # per-head order kept
           lambda c: (c.d_model, 3 * c.d_model)),
    Tensor(("attention.b_qkv",), "attention.query_key_value.bias", "as is", lambda c: (3 * c.d_model,), "zeros"),
    Tensor(("attention.W_dense",), "attention.dense.weight", "transpose", lambda c: (c.d_model, c.d_model)),
    Tensor(("attention.b_dense",), "attention.dense.bias", "as is", D, "zeros"),
    Tensor(("post_attention_layernorm.gamma",), "post_attention_layernorm.weight", "as is", D, "ones"),
    Tensor(("post_attention_layernorm.beta",), "post_attention_layernorm.bias", "as is", D, "zeros"),
    Tensor(("mlp.W_1",), "mlp.dense_h_to_4h.weight", "transpose", lambda c: (c.d_model, c.d_ff)),
    Tensor(("mlp.b_1",), "mlp.dense_h_to_4h.bias", "as is", lambda c: (c.d_ff,), "zeros"),
    Tensor(("mlp.W_2",), "mlp.dense_4h_to_h.weight", "transpose", lambda c: (c.d_ff, c.d_model)),
    Tensor(("mlp.b_2",), "mlp.dense_4h_to_h.bias", "as is", D, "zeros"),
)
assert tuple(t.ours[0] for t in BLOCK) == GPT_NEOX_PARAM_NAMES


def gpt_neox_block_shapes(D_, F) -> dict:
    """GPT-NeoX's block tensors' shapes (width D, MLP width F), keyed like its params."""
    from types import SimpleNamespace
    c = SimpleNamespace(d_model=D_, d_ff=F)
    return {t.ours[0]: t.shape(c) for t in BLOCK}


def layers(config):
    """The rotated features' frequencies (r/2,), the same in every layer."""
    return [config.rope_frequencies()] * config.num_layers


def prepare(p, config):
    """The block's params, and the fused QKV split once per run (the forward and each decoding step read it)."""
    return p, gpt_neox_attention_params(p, config.num_heads)


def block(x, prepared, config, theta, mask, positions, kv):
    """Step 2: :func:`attention_ref.nn.gpt_neox_block.gpt_neox_block_formula` (with ``kv``, its decoding step)."""
    p, split = prepared
    return gpt_neox_block_formula(x, p, config.num_heads, eps=config.eps, mask=mask, theta=theta,
                                  parallel=config.use_parallel_residual, kv=kv, positions=positions,
                                  split=split)  # (..., T, D)


def final_norm(x, params, config):
    return layer_norm_formula(x, params["final_layer_norm.gamma"], params["final_layer_norm.beta"], config.eps)


def final_norm_backward(dh, cache):
    dx, dg, db = layer_norm_backward(dh, cache)
    return dx, {"final_layer_norm.gamma": dg, "final_layer_norm.beta": db}


def trace_block(cache, prepared, config):
    """The trace of one ``GPTNeoXLayer`` (after ``gpt_neox.layers.<i>.``), from its caches:
    ``query_key_value`` is the fused projection (its per-head layout, as transformers stores it)."""
    p, attn, mlp = prepared[0], cache.attn, cache.mlp
    z1 = attn.q_proj.x  # (..., T, D), input_layernorm's output
    a = linear_output(attn.o_proj, p["attention.b_dense"])  # (..., T, D)
    m = linear_output(mlp.fc2, p["mlp.b_2"])  # (..., T, D)
    qkv = linear_formula(z1, p["attention.W_qkv"], p["attention.b_qkv"])  # (..., T, 3 D), per-head layout
    return ([("input_layernorm", z1), ("attention.query_key_value", qkv)]
            + [(f"attention{SEPARATOR}{step}", value) for step, value in grouped_attention_steps(attn)]
            + [("attention.dense", a), ("attention", a), ("post_attention_layernorm", mlp.fc1.x),
               ("mlp.dense_h_to_4h", mlp.h), ("mlp.act", mlp.fc2.x), ("mlp.dense_4h_to_h", m), ("mlp", m)])


def init_block(config, seed, dtype):
    return init_gpt_neox_block_params(config.d_model, config.num_heads, config.d_ff, seed=seed, dtype=dtype)


#: GPTNeoXConfig's keys (4.57.1 and 5.24): COMPUTED by :func:`read`, NEUTRAL, DROPOUT, or the neutral values
KEYS = {
    **BASE_KEYS,
    **computed("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "hidden_act",
               "layer_norm_eps", "max_position_embeddings", "use_parallel_residual", "attention_bias", "rotary_pct",
               "partial_rotary_factor", "rotary_emb_base", "rope_theta", "rope_scaling", "rope_parameters"),
    "pad_token_id": NEUTRAL,  # embed_in has no padding_idx
    "attention_dropout": DROPOUT, "hidden_dropout": DROPOUT,
    "classifier_dropout": NEUTRAL,  # the classification heads' only
}

_POSITIVE = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
FAMILY = Family(
    model_type=MODEL_TYPE, read=read, features=Features(parallel_residual=True, fused_qkv="per_head"),
    fields=ConfigFields(positive=_POSITIVE, optional_positive=("max_position_embeddings",),
                        flags=("tie_word_embeddings", "attention_bias", "use_parallel_residual"),
                        numbers=("layer_norm_eps", "rotary_emb_base", "rope_theta", "rotary_pct",
                                 "partial_rotary_factor"), strings=("hidden_act",),
                        width_heads=("hidden_size", "num_attention_heads")),
    allowed=("rotary_pct", "use_parallel_residual"), check=check, token_table="embed_in", layer_prefix="layers",
    base="gpt_neox.", their_layer="gpt_neox.layers.{i}.",
    model_title="transformers GPTNeoXForCausalLM (whole model; blocks: gpt_neox.layers.<i>. as GPTNeoXLayer)",
    block_title="transformers GPTNeoXLayer (layers.<i>.)", top=TOP, block=BLOCK, final=FINAL, embed=embed_tokens,
    embed_backward=embed_tokens_backward, layers=layers, prepare=prepare, block_forward=block,
    block_backward=gpt_neox_block_backward, final_norm=final_norm, final_norm_backward=final_norm_backward,
    init_block=init_block, float32_steps=(("gpt_neox", "GPTNeoX"),), keys=KEYS,
    buffers=("attention.bias", "attention.masked_bias", "rotary_emb.inv_freq"),
    trace_block=trace_block, names_4x=(("lm_head", "embed_out"),))

#: a small GPT-NeoX (attention_ref.interop.write_random_model): every config.json field that changes the maths
FAMILY = FAMILY._replace(example={"vocab_size": 64, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2,
                                  "num_attention_heads": 4, "max_position_embeddings": 64, "layer_norm_eps": 1e-5,
                                  "rotary_pct": 0.5, "rotary_emb_base": 10000, "hidden_act": "gelu",
                                  "use_parallel_residual": True, "tie_word_embeddings": False})
