"""GPT-2 (transformers' ``GPT2LMHeadModel``): learned positions, LayerNorms, biases, a tanh-GELU MLP.

Reader: ``n_embd``, ``n_layer``, ``n_head``, ``n_positions``, ``n_inner`` (default 4 D),
``layer_norm_epsilon``, ``tie_word_embeddings`` (default True), ``scale_attn_weights`` and
``scale_attn_by_inverse_layer_idx``; an ``activation_function`` other than the tanh GELU and
``add_cross_attention`` are refused by name.

The whole model's steps (:mod:`attention_ref.models.lm` runs them), as llm.c's ``gpt2_forward``:

1. ``x = wte[ids] + wpe[positions]``                    (B, T, D)  (``transformer.wte``, ``.wpe``)
2. ``x = Block_l(x)``, the block of :mod:`attention_ref.nn.gpt2_block` (``transformer.h.<i>``):
   1. ``z = LN_1(x)``  2. ``a = Attn(z)`` (causal, biases, scores times ``head_scale``)
   3. ``h = x + a``  4. ``u = LN_2(h)``  5. ``m = MLP(u)``  6. ``y = h + m``
3. ``h = LN_f(x)``                                      (``transformer.ln_f``)
4. ``logits = h W_head``                                (``lm_head``: ``wte^T`` when tied)

Backward: the steps in reverse; each table gets the scatter-add of its lookups.
"""
from __future__ import annotations

import numpy as np

from ...nn.embedding import embedding_backward, embedding_formula
from ...nn.encoder_block import ENCODER_GROUPS
from ...nn.gpt2_block import gpt2_block_backward, gpt2_block_formula, init_gpt2_block_params
from ...nn.layer_norm import layer_norm_backward, layer_norm_formula
from ...nn.residual import split_params
from ..config import LMConfig, refuse
from ..family import BASE_KEYS, DROPOUT, NEUTRAL, ConfigFields, Family, Features, Tensor, computed, neutral, top_tensor
from ..trace_steps import SEPARATOR, grouped_attention_steps, linear_output

__all__ = ["FAMILY"]

MODEL_TYPE = "gpt2"


def read(d):
    act = d.get("activation_function", "gelu_new")
    if act not in ("gelu_new", "gelu_pytorch_tanh"):
        refuse("activation_function", act, MODEL_TYPE)  # the blocks use the tanh GELU
    if d.get("add_cross_attention"):
        refuse("add_cross_attention", True, MODEL_TYPE)
    D, H = d["n_embd"], d["n_head"]
    return LMConfig(family=MODEL_TYPE, vocab_size=d["vocab_size"], d_model=D, num_layers=d["n_layer"], num_heads=H,
                    num_kv_heads=H, d_ff=d.get("n_inner") or 4 * D, max_positions=d["n_positions"],
                    eps=d.get("layer_norm_epsilon", 1e-5), tie_word_embeddings=d.get("tie_word_embeddings", True),
                    scale_attn_weights=d.get("scale_attn_weights", True),
                    scale_attn_by_inverse_layer_idx=d.get("scale_attn_by_inverse_layer_idx", False))


def check(config):
    if config.num_kv_heads != config.num_heads:
        raise ValueError("GPT-2 has as many key/value heads as query heads:"
                         f" num_kv_heads = {config.num_kv_heads}, num_heads = {config.num_heads}")


def D(c):
    return (c.d_model,)


def DD(c):
    return (c.d_model, c.d_model)


TOP = (
    top_tensor("wte", "transformer.wte.weight", "as is", lambda c: (c.vocab_size, c.d_model)),
    top_tensor("wpe", "transformer.wpe.weight", "as is", lambda c: (c.max_positions, c.d_model), "normal/2"),
)
FINAL = (
    top_tensor("ln_f.gamma", "transformer.ln_f.weight", "as is", D, "ones"),
    top_tensor("ln_f.beta", "transformer.ln_f.bias", "as is", D, "zeros"),
    top_tensor("lm_head.W", "lm_head.weight", "transpose", lambda c: (c.d_model, c.vocab_size), optional=True,
               when=lambda c: not c.tie_word_embeddings),  # tied (the default): absent
)
#: GPT-2's Conv1D stores (in, out): no transpose; c_attn holds Q, K and V side by side
BLOCK = (
    Tensor(("ln1.gamma",), "ln_1.weight", "as is", D, "ones"),
    Tensor(("ln1.beta",), "ln_1.bias", "as is", D, "zeros"),
    Tensor(("self_attn.W_q", "self_attn.W_k", "self_attn.W_v"), "attn.c_attn.weight", "split columns", DD),
    Tensor(("self_attn.b_q", "self_attn.b_k", "self_attn.b_v"), "attn.c_attn.bias", "split", D, "zeros",
           optional=True),
    Tensor(("self_attn.W_o",), "attn.c_proj.weight", "as is", DD),
    Tensor(("self_attn.b_o",), "attn.c_proj.bias", "as is", D, "zeros", optional=True),
    Tensor(("ln2.gamma",), "ln_2.weight", "as is", D, "ones"),
    Tensor(("ln2.beta",), "ln_2.bias", "as is", D, "zeros"),
    Tensor(("ffn.W_1",), "mlp.c_fc.weight", "as is", lambda c: (c.d_model, c.d_ff)),
    Tensor(("ffn.b_1",), "mlp.c_fc.bias", "as is", lambda c: (c.d_ff,), "zeros", optional=True),
    Tensor(("ffn.W_2",), "mlp.c_proj.weight", "as is", lambda c: (c.d_ff, c.d_model)),
    Tensor(("ffn.b_2",), "mlp.c_proj.bias", "as is", D, "zeros", optional=True),
)


def embed(ids, positions, params, config):
    """Step 1: ``wte[ids] + wpe[positions]``."""
    last = int(np.max(positions))
    if last >= config.max_positions:
        raise ValueError(f"position {last} is past the position table: more than GPT-2's max_positions ="
                         f" {config.max_positions}")
    tok, tok_cache = embedding_formula(ids, params["wte"])  # (..., T, D)
    pos, pos_cache = embedding_formula(positions, params["wpe"])  # (T, D) or (B, t, D)
    return tok + pos, (tok_cache, pos_cache)


def embed_backward(dx, cache, config, table_grad=None):
    """Step 1 back: each table gets the scatter-add of its lookups (the positions' over the batch;
    the tokens' into ``table_grad``, the tied head's, when given)."""
    tok_cache, pos_cache = cache
    return {"wte": embedding_backward(dx, tok_cache, table_grad),  # (V, D)
            "wpe": embedding_backward(dx.reshape((-1,) + dx.shape[-2:]).sum(axis=0), pos_cache)}  # (P, D)


def layers(config):
    """Each layer's scores factor (``scale_attn_by_inverse_layer_idx``: ``1/(layer + 1)`` too)."""
    return list(config.head_scale)


def prepare(p, config):
    """A block's params grouped as its formula takes them (``ln1``, ``self_attn``, ``ln2``, ``ffn``)."""
    return split_params(p, ENCODER_GROUPS), tuple(p)


def block(x, prepared, config, scale, mask, positions, kv):
    """Step 2: :func:`attention_ref.nn.gpt2_block.gpt2_block_formula` (with ``kv``, its decoding step)."""
    p, keys = prepared
    return gpt2_block_formula(x, p, config.num_heads, eps=config.eps, mask=mask, scale=scale, param_keys=keys, kv=kv)


def final_norm(x, params, config):
    return layer_norm_formula(x, params["ln_f.gamma"], params["ln_f.beta"], config.eps)  # (..., T, D)


def final_norm_backward(dh, cache):
    dx, dg, db = layer_norm_backward(dh, cache)
    return dx, {"ln_f.gamma": dg, "ln_f.beta": db}


def trace_embed(x, cache, params, config):
    """The trace's step 1: each table's lookup (``wpe``'s (T, D) broadcasts over the batch, as
    transformers' (1, T, D))."""
    tok_cache, pos_cache = cache
    return [("transformer.wte", params["wte"][tok_cache.ids]), ("transformer.wpe", params["wpe"][pos_cache.ids])]


def trace_block(cache, prepared, config):
    """The trace of one ``GPT2Block`` (after ``transformer.h.<i>.``), from its caches: ``c_attn``
    is q, k and v side by side, as its fused Conv1D computes them."""
    (p, _), attn, mlp = prepared, cache.attn, cache.mlp
    b, ffn = p["self_attn"], p["ffn"]
    qkv = np.concatenate([linear_output(attn.q_proj, b.get("b_q")), linear_output(attn.k_proj, b.get("b_k")),
                          linear_output(attn.v_proj, b.get("b_v"))], axis=-1)  # (..., T, 3 D)
    a = linear_output(attn.o_proj, b.get("b_o"))  # (..., T, D)
    m = linear_output(mlp.fc2, ffn.get("b_2"))  # (..., T, D)
    return ([("ln_1", attn.q_proj.x), ("attn.c_attn", qkv)]
            + [(f"attn{SEPARATOR}{step}", value) for step, value in grouped_attention_steps(attn)]
            + [("attn.c_proj", a), ("attn", a), ("ln_2", mlp.fc1.x), ("mlp.c_fc", mlp.h), ("mlp.act", mlp.fc2.x),
               ("mlp.c_proj", m), ("mlp", m)])


def init_block(config, seed, dtype):
    return init_gpt2_block_params(config.d_model, config.num_heads, config.d_ff, seed=seed, dtype=dtype)


#: GPT2Config's keys (4.57.1 and 5.24): COMPUTED by :func:`read`, NEUTRAL, DROPOUT, or the neutral values
KEYS = {
    **BASE_KEYS,
    **computed("n_embd", "n_layer", "n_head", "n_positions", "n_inner", "layer_norm_epsilon", "activation_function",
               "scale_attn_weights", "scale_attn_by_inverse_layer_idx"),
    "pad_token_id": NEUTRAL,  # wte has no padding_idx
    "attn_pdrop": DROPOUT, "embd_pdrop": DROPOUT, "resid_pdrop": DROPOUT,
    # the double-heads model's summary head, and old files' n_ctx / output_past: read by no step of the LM
    **neutral("summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels",
              "summary_first_dropout", "n_ctx", "output_past"),
    "reorder_and_upcast_attn": (False,),  # the scores in float32 (another rounding than float64's): refused
}

FAMILY = Family(
    model_type=MODEL_TYPE, read=read, features=Features(rotary=False, fused_qkv="blocks"),
    fields=ConfigFields(positive=("vocab_size", "n_embd", "n_layer", "n_head", "n_positions"),
                        optional_positive=("n_inner",),
                        flags=("tie_word_embeddings", "scale_attn_weights", "scale_attn_by_inverse_layer_idx",
                               "add_cross_attention"),
                        numbers=("layer_norm_epsilon",), strings=("activation_function",),
                        width_heads=("n_embd", "n_head")),
    allowed=("scale_attn_weights", "scale_attn_by_inverse_layer_idx"), check=check, token_table="wte",
    layer_prefix="h", base="transformer.", their_layer="transformer.h.{i}.",
    model_title="transformers GPT2LMHeadModel (whole model; blocks: transformer.h.<i>. as GPT2Block)",
    block_title="transformers GPT2Block (h.<i>.)", top=TOP, block=BLOCK, final=FINAL, embed=embed, embed_backward=embed_backward,
    layers=layers, prepare=prepare, block_forward=block, block_backward=gpt2_block_backward, final_norm=final_norm,
    final_norm_backward=final_norm_backward, init_block=init_block,
    keys=KEYS, buffers=("attn.bias", "attn.masked_bias"),
    trace_embed=trace_embed, trace_block=trace_block,
    block_order=tuple(f"{group}.{name}" for group, names in ENCODER_GROUPS.items() for name in names))

#: a small GPT-2 (attention_ref.interop.write_random_model): every config.json field that changes the maths
FAMILY = FAMILY._replace(example={"vocab_size": 64, "n_embd": 16, "n_layer": 2, "n_head": 4, "n_inner": 32,
                                  "n_positions": 64, "layer_norm_epsilon": 1e-5, "activation_function": "gelu_new",
                                  "tie_word_embeddings": True})
