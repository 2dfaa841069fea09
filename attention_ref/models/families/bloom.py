"""BLOOM (transformers' ``BloomForCausalLM``): ALiBi instead of positions, a layer norm on the
embeddings, GPT-NeoX's fused per-head QKV, BLOOM's tanh GELU, a sequential residual.

Reader: ``hidden_size`` (old files: ``n_embed``), ``n_layer``, ``n_head``, ``layer_norm_epsilon``,
``tie_word_embeddings`` (default True); the MLP is 4 D wide. ``apply_residual_connection_post_layernorm
= true`` (the residual taken after the norm) is refused by name, and so is ``slow_but_exact = true``
with ``pretraining_tp > 1``: transformers' slow path sums the dense layers' products in slices and
leaves out their biases (``self_attention.dense.bias``, ``mlp.dense_4h_to_h.bias``), other numbers
than the fast path's (``pretraining_tp`` alone changes nothing).

The whole model's steps (:mod:`attention_ref.models.lm` runs them):

1. ``x = LN_e(word_embeddings[ids])``      (``transformer.word_embeddings``, ``.word_embeddings_layernorm``)
2. ``x = Block_l(x)`` (``transformer.h.<i>``):
   1. ``z_1 = LN_1(x)``                    (``input_layernorm``)
   2. ``a = Attn(z_1)``                    (``self_attention``): q, k, v from the fused per-head
      ``query_key_value`` (:mod:`attention_ref.nn.fused_qkv`), scores ``(q / sqrt(Dh)) k^T`` plus
      ALiBi's ``m_h j`` on key ``j`` (:class:`attention_ref.variants.alibi.AlibiScores`, the scores
      hook), causal softmax, ``dense``
   3. ``h = x + a``
   4. ``z_2 = LN_2(h)``                    (``post_attention_layernorm``)
   5. ``m = gelu_bloom(z_2 W_1 + b_1) W_2 + b_2``  (``mlp``: BLOOM's constant 0.79788456)
   6. ``y = h + m``
3. ``h = LN_f(x)``                          (``transformer.ln_f``)
4. ``logits = h W_head``                    (``lm_head``: ``word_embeddings^T`` when tied)

ALiBi's key positions: transformers counts them over the attention mask (``(cumsum(mask) - 1)
mask``); this family uses the key's slot ``j`` in the sequence (or the KV cache). For a row with P
left pads the two differ by ``m_h P`` on every real key of the row (the pads are masked): a
constant per row, which the softmax removes (:mod:`attention_ref.variants.alibi`).

The block's backward is GPT-NeoX's sequential one (:func:`attention_ref.nn.gpt_neox_block.
gpt_neox_block_backward`): the same five caches, the scores hook's backward inside the attention's.
"""
from __future__ import annotations

import numpy as np

from ...fast.dispatch import linear_formula
from ...nn.embedding import embedding_backward, embedding_formula
from ...nn.feed_forward import feed_forward_formula
from typing import NamedTuple

from ...nn.feed_forward import FeedForwardCache
from ...nn.fused_qkv import FusedQKVCache
from ...nn.gpt_neox_block import (GPT_NEOX_PARAM_NAMES, gpt_neox_attention_params, gpt_neox_block_backward,
                                  init_gpt_neox_block_params)
from ...nn.layer_norm import LayerNormCache
from ...variants.grouped_heads import GroupedMultiHeadCache
from ...nn.layer_norm import layer_norm_backward, layer_norm_formula
from ...nn.multi_head_attention import causal_self_attention_formula
from ...variants.alibi import AlibiScores, alibi_slopes
from ..config import LMConfig, refuse
from ..family import BASE_KEYS, DROPOUT, NEUTRAL, ConfigFields, Family, Features, computed, top_tensor
from ..trace_steps import SEPARATOR, grouped_attention_steps, linear_output
from .gpt_neox import BLOCK as NEOX_BLOCK

__all__ = ["FAMILY", "BloomBlockCache", "bloom_block"]

MODEL_TYPE = "bloom"
_ATTN_KEYS = ("W_q", "W_k", "W_v", "W_o", "b_q", "b_k", "b_v", "b_o")
#: ALiBi has no position table: the longest sequence generate accepts
_NO_TABLE = 1 << 30


def read(d):
    if d.get("apply_residual_connection_post_layernorm", False) is not False:
        refuse("apply_residual_connection_post_layernorm", d["apply_residual_connection_post_layernorm"],
               MODEL_TYPE)  # the residual after the norm: not computed here
    tp = d.get("pretraining_tp", 1)
    if d.get("slow_but_exact", False) is not False and (isinstance(tp, bool) or not isinstance(tp, int) or tp != 1):
        refuse("slow_but_exact with pretraining_tp", (d["slow_but_exact"], tp),
               MODEL_TYPE)  # the slow path drops the dense layers' biases: not computed here
    if "n_embed" in d and "hidden_size" in d and d["n_embed"] != d["hidden_size"]:
        raise ValueError(f"bloom: n_embed = {d['n_embed']} and hidden_size = {d['hidden_size']} disagree")
    D, H = d.get("n_embed", d.get("hidden_size", 64)), d.get("n_head", 8)
    return LMConfig(family=MODEL_TYPE, vocab_size=d.get("vocab_size", 250880), d_model=D,
                    num_layers=d.get("n_layer", 2), num_heads=H, num_kv_heads=H, d_ff=4 * D, max_positions=_NO_TABLE,
                    eps=d.get("layer_norm_epsilon", 1e-5), tie_word_embeddings=d.get("tie_word_embeddings", True))


def check(config):
    if config.num_kv_heads != config.num_heads or config.d_model % config.num_heads:
        raise ValueError(f"bloom: num_kv_heads = {config.num_kv_heads} must equal num_heads = {config.num_heads}"
                         f" and d_model = {config.d_model} be a multiple of it")
    if config.d_ff != 4 * config.d_model:
        raise ValueError(f"bloom: the MLP is 4 d_model = {4 * config.d_model} wide, got d_ff = {config.d_ff}")


def D(c):
    return (c.d_model,)


TOP = (
    top_tensor("word_embeddings", "transformer.word_embeddings.weight", "as is", lambda c: (c.vocab_size, c.d_model)),
    top_tensor("word_embeddings_layernorm.gamma", "transformer.word_embeddings_layernorm.weight", "as is", D, "ones"),
    top_tensor("word_embeddings_layernorm.beta", "transformer.word_embeddings_layernorm.bias", "as is", D, "zeros"),
)
FINAL = (
    top_tensor("ln_f.gamma", "transformer.ln_f.weight", "as is", D, "ones"),
    top_tensor("ln_f.beta", "transformer.ln_f.bias", "as is", D, "zeros"),
    top_tensor("lm_head.W", "lm_head.weight", "transpose", lambda c: (c.d_model, c.vocab_size), optional=True,
               when=lambda c: not c.tie_word_embeddings),  # tied (the default): absent
)
#: GPT-NeoX's block table (the same tensors, our names; its backward serves this block) under BLOOM's module
#: name ``self_attention`` for GPT-NeoX's ``attention``
BLOCK = tuple(t._replace(theirs="self_" + t.theirs) if t.theirs.startswith("attention.") else t for t in NEOX_BLOCK)
assert tuple(t.ours[0] for t in BLOCK) == GPT_NEOX_PARAM_NAMES


class BloomBlockCache(NamedTuple):
    """The six steps' caches: GPT-NeoX's sequential block's fields (its backward reads them), and
    ``h = x + a`` for the trace (BLOOM's attention module outputs it)."""

    norm1: LayerNormCache  # step 1
    qkv_split: FusedQKVCache  # step 2, W_qkv's split
    bias_split: FusedQKVCache  # step 2, b_qkv's
    attn: GroupedMultiHeadCache  # step 2
    norm2: LayerNormCache  # step 4
    mlp: FeedForwardCache  # step 5
    parallel: bool  # False: the sequential residual
    y_shape: tuple
    y_dtype: np.dtype
    hidden: np.ndarray  # (..., N, D), h = x + a

    @property
    def weights(self) -> np.ndarray:
        """Self-attention probabilities of every head, (..., H, N, N)."""
        return self.attn.weights


def embed(ids, positions, params, config):
    """Step 1: the token table's rows, then the embeddings' layer norm (no position enters here)."""
    e, lookup = embedding_formula(ids, params["word_embeddings"])  # (..., T, D)
    x, norm = layer_norm_formula(e, params["word_embeddings_layernorm.gamma"],
                                 params["word_embeddings_layernorm.beta"], config.eps)  # (..., T, D)
    return x, (lookup, norm, e)


def embed_backward(dx, cache, config, table_grad=None):
    """Step 1 back: the layer norm's backward, then the scatter-add of the lookup (into
    ``table_grad``, the tied head's, when given)."""
    lookup, norm, _ = cache
    de, dg, db = layer_norm_backward(dx, norm)  # (..., T, D)
    return {"word_embeddings": embedding_backward(de, lookup, table_grad), "word_embeddings_layernorm.gamma": dg,
            "word_embeddings_layernorm.beta": db}


def layers(config):
    """ALiBi's slopes (H,), the same in every layer."""
    return [alibi_slopes(config.num_heads)] * config.num_layers


def prepare(p, config):
    """The block's params, and the fused QKV split once per run."""
    return p, gpt_neox_attention_params(p, config.num_heads)


def bloom_block(x, prepared, config, slopes, mask, positions, kv):
    """Step 2, the block's six steps (with ``kv``, its decoding step: the cache returned is None)."""
    p, (attn_params, qkv_split, bias_split) = prepared
    # 1. z_1 = LN_1(x)
    z1, norm1 = layer_norm_formula(x, p["input_layernorm.gamma"], p["input_layernorm.beta"], config.eps)
    # 2. a = Attn(z_1): causal, ALiBi on the scaled scores
    a, attn = causal_self_attention_formula(z1, attn_params, config.num_heads, config.num_heads, mask=mask, kv=kv,
                                            scores=AlibiScores(slopes), param_keys=_ATTN_KEYS, name="z_1")
    # 3. h = x + a
    h = x + a  # (..., N, D)
    # 4. z_2 = LN_2(h)
    z2, norm2 = layer_norm_formula(h, p["post_attention_layernorm.gamma"], p["post_attention_layernorm.beta"],
                                   config.eps)
    # 5. m = MLP(z_2), BLOOM's GELU
    m, mlp = feed_forward_formula(z2, p["mlp.W_1"], p["mlp.b_1"], p["mlp.W_2"], p["mlp.b_2"], "gelu_bloom",
                                  ("W_1", "b_1", "W_2", "b_2"))
    # 6. y = h + m
    y = h + m  # (..., N, D)
    if kv is not None:
        return y, None
    return y, BloomBlockCache(norm1, qkv_split, bias_split, attn, norm2, mlp, False, y.shape, y.dtype, h)


def final_norm(x, params, config):
    return layer_norm_formula(x, params["ln_f.gamma"], params["ln_f.beta"], config.eps)  # (..., T, D)


def final_norm_backward(dh, cache):
    dx, dg, db = layer_norm_backward(dh, cache)
    return dx, {"ln_f.gamma": dg, "ln_f.beta": db}


def trace_embed(x, cache, params, config):
    """The trace's step 1: the lookup, then its layer norm."""
    return [("transformer.word_embeddings", cache[2]), ("transformer.word_embeddings_layernorm", x)]


def trace_block(cache, prepared, config):
    """The trace of one ``BloomBlock`` (after ``transformer.h.<i>.``). BLOOM's attention and MLP
    modules add the residual themselves: ``self_attention`` is ``h = x + a``, ``mlp`` is ``y``;
    the scores step includes ALiBi's term."""
    p, attn, mlp = prepared[0], cache.attn, cache.mlp
    z1 = attn.q_proj.x  # (..., T, D), LN_1's output
    qkv = linear_formula(z1, p["attention.W_qkv"], p["attention.b_qkv"])  # (..., T, 3 D), per-head layout
    a = linear_output(attn.o_proj, p["attention.b_dense"])  # (..., T, D)
    h = cache.hidden  # (..., T, D), x + a
    m = linear_output(mlp.fc2, p["mlp.b_2"])  # (..., T, D)
    slopes = alibi_slopes(config.num_heads)
    steps = []
    for step, value in grouped_attention_steps(attn):
        if step == "scores":  # the hook's ALiBi term, m_h j, on the unmasked entries
            bias = (slopes[:, None, None] * np.arange(value.shape[-1])).astype(value.dtype)  # (H, 1, N)
            value = np.where(np.isfinite(value), value + bias, value)
        steps.append((f"self_attention{SEPARATOR}{step}", value))
    return ([("input_layernorm", z1), ("self_attention.query_key_value", qkv)] + steps
            + [("self_attention.dense", a), ("self_attention", h), ("post_attention_layernorm", mlp.fc1.x),
               ("mlp.dense_h_to_4h", mlp.h), ("mlp.gelu_impl", mlp.fc2.x), ("mlp.dense_4h_to_h", m),
               ("mlp", h + m), (f"{SEPARATOR}probs", attn.weights)])  # BloomBlock returns the probabilities too


def init_block(config, seed, dtype):
    return init_gpt_neox_block_params(config.d_model, config.num_heads, config.d_ff, seed=seed, dtype=dtype)


#: BloomConfig's keys (4.57.1 and 5.24; and the Megatron keys of the Hub's BLOOM files): COMPUTED by
#: :func:`read`, NEUTRAL, DROPOUT, or the neutral values
KEYS = {
    **BASE_KEYS,
    **computed("hidden_size", "n_embed", "n_layer", "n_head", "layer_norm_epsilon",
               "apply_residual_connection_post_layernorm"),
    "pad_token_id": NEUTRAL,  # word_embeddings has no padding_idx
    "attention_dropout": DROPOUT, "hidden_dropout": DROPOUT,
    # Megatron's tensor-parallel degree: read only by the slow path, which read() refuses
    **computed("pretraining_tp", "slow_but_exact"),
    # the Hub's BLOOM files carry Megatron's training switches and its sequence length: read by no step here
    **dict.fromkeys(("seq_length", "unk_token_id", "masked_softmax_fusion", "bias_dropout_fusion",
                     "skip_bias_add", "skip_bias_add_qkv", "attention_softmax_in_fp32", "n_inner",
                     "offset_alibi"), NEUTRAL),
}

_POSITIVE = ("vocab_size", "n_layer", "n_head")
FAMILY = Family(
    model_type=MODEL_TYPE, read=read, features=Features(rotary=False, fused_qkv="per_head"),
    fields=ConfigFields(positive=_POSITIVE, optional_positive=("hidden_size", "n_embed"),
                        flags=("tie_word_embeddings", "apply_residual_connection_post_layernorm"),
                        numbers=("layer_norm_epsilon",), width_heads=None),
    allowed=(), check=check, token_table="word_embeddings", layer_prefix="h", base="transformer.",
    their_layer="transformer.h.{i}.",
    model_title="transformers BloomForCausalLM (whole model; blocks: transformer.h.<i>. as BloomBlock)",
    block_title="transformers BloomBlock (h.<i>.)", top=TOP, block=BLOCK, final=FINAL, embed=embed,
    embed_backward=embed_backward, layers=layers, prepare=prepare, block_forward=bloom_block,
    block_backward=gpt_neox_block_backward, final_norm=final_norm, final_norm_backward=final_norm_backward,
    init_block=init_block, keys=KEYS, buffers=(), trace_embed=trace_embed, trace_block=trace_block)

#: a small BLOOM (attention_ref.interop.write_random_model): every config.json field that changes the maths
FAMILY = FAMILY._replace(example={"vocab_size": 64, "hidden_size": 16, "n_layer": 2, "n_head": 4,
                                  "layer_norm_epsilon": 1e-5, "apply_residual_connection_post_layernorm": False,
                                  "tie_word_embeddings": True})
