"""Llama (transformers' ``LlamaForCausalLM``): the family the other RoPE families are written against.

Reader: ``config.json``'s ``hidden_size``, ``num_hidden_layers``, ``num_attention_heads``,
``num_key_value_heads``, ``intermediate_size``, ``rms_norm_eps``, ``rope_theta`` / ``rope_scaling``
(4.x) or ``rope_parameters`` (5.x), ``head_dim``, ``tie_word_embeddings`` (default False) and
``pad_token_id``; ``hidden_act`` other than ``silu``, ``attention_bias``, ``mlp_bias``,
``use_sliding_window`` and sliding ``layer_types`` are refused by name.

The whole model's steps (:mod:`attention_ref.models.lm` runs them):

1. ``x = embed_tokens[ids]``                            (B, T, D); positions enter through RoPE
2. ``x = Block_l(x)`` for each layer, the block of :mod:`attention_ref.nn.llama_block`:
   1. ``z = RMSNorm_1(x)``                               (transformers' ``input_layernorm``)
   2. ``a = Attn(z)``: q, k, v projections, RoPE at the positions (``config.rope_layout``;
      no rotation on a layer whose ``config.rope_layers`` entry is False), grouped heads,
      causal (within ``config.sliding_window`` when set), ``W_o``   (``self_attn``)
   3. ``h = x + a``
   4. ``u = RMSNorm_2(h)``                               (``post_attention_layernorm``)
   5. ``m = SwiGLU(u)``                                  (``mlp``)
   6. ``y = h + m``
3. ``h = RMSNorm_f(x)``                                 (``model.norm``)
4. ``logits = h W_head``                                (``lm_head``; ``embed_tokens^T`` when tied)

Decoding runs the same steps with each layer's :class:`attention_ref.variants.kv_cache.KVCache`.
"""
from __future__ import annotations

from typing import NamedTuple

from ...nn.embedding import embedding_backward, embedding_formula
from ...nn.llama_block import init_llama_block_params, llama_block_backward, llama_block_formula
from ...nn.rms_norm import rms_norm_backward, rms_norm_formula
from ...nn.rope_scaling import ROPE_TYPES
from ..config import LMConfig, family_of, refuse
from ..family import ConfigFields, Family, Features, Tensor, top_tensor

__all__ = ["FAMILY", "read_llama", "rope_settings", "token_id", "LLAMA_FIELDS", "LLAMA_TOP", "LLAMA_FINAL", "LLAMA_BLOCK",
           "LlamaLayer", "llama_layers", "llama_block", "embed_tokens", "embed_tokens_backward",
           "rms_final_norm", "rms_final_norm_backward", "identity_prepare", "LLAMA_ALLOWED", "init_llama_style"]

MODEL_TYPE = "llama"


def D(c):
    return (c.d_model,)


def token_id(d, name="pad_token_id"):
    """A token id field (a negative one counts from the end, as ``nn.Embedding``'s ``padding_idx``);
    None when absent or outside the vocabulary."""
    pad = d.get(name)
    if isinstance(pad, int) and not isinstance(pad, bool) and -d["vocab_size"] <= pad < 0:
        pad += d["vocab_size"]
    return pad if isinstance(pad, int) and not isinstance(pad, bool) and 0 <= pad < d["vocab_size"] else None


def rope_settings(d, family):
    """``(rope_theta, rope_scaling)`` from 4.x's ``rope_theta`` and ``rope_scaling`` or 5.x's
    ``rope_parameters``; a type this package does not compute, or a partial rotation, is refused."""
    rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        refuse("the RoPE scaling rope_type", rope_type, family)  # e.g. "dynamic", "yarn", "longrope"
    if rope.get("partial_rotary_factor", 1.0) != 1.0:
        refuse("the RoPE partial_rotary_factor", rope["partial_rotary_factor"], family)
    theta = d.get("rope_theta", rope.get("rope_theta", 10000.0))
    scaling = None
    if rope_type != "default":  # Llama 3.x: the type and its parameters (any other key is refused by name)
        scaling = {k: v for k, v in rope.items() if k not in ("type", "rope_theta", "partial_rotary_factor")}
        scaling["rope_type"] = rope_type
    return float(theta), scaling


def read_llama(d, family=MODEL_TYPE, **fields):
    """An LMConfig of a Llama-built family from its ``config.json`` (``fields`` given are set as
    they are: a family's own reading on top of Llama's)."""
    if d.get("hidden_act", "silu") != "silu":
        refuse("hidden_act", d["hidden_act"], family)
    for flag in ("attention_bias", "mlp_bias", "use_sliding_window"):  # Qwen2's sliding window: not here
        if d.get(flag):
            refuse(flag, True, family)
    layer_types = d.get("layer_types") or []
    if any(kind != "full_attention" for kind in layer_types):
        refuse("layer_types", sorted(set(layer_types)), family)  # e.g. "sliding_attention" layers
    theta, scaling = rope_settings(d, family)
    D_, H = d["hidden_size"], d["num_attention_heads"]
    head_dim = d.get("head_dim") or D_ // H
    if head_dim * H == D_:
        head_dim = None  # the usual width: not stored
    elif head_dim % 2:
        refuse("head_dim", head_dim, family)  # RoPE rotates pairs
    window = d.get("sliding_window") if "sliding_window" in family_of(family).allowed else None
    kwargs = dict(family=family, vocab_size=d["vocab_size"], d_model=D_, num_layers=d["num_hidden_layers"],
                  num_heads=H, num_kv_heads=d.get("num_key_value_heads") or H, d_ff=d["intermediate_size"],
                  max_positions=d.get("max_position_embeddings", 2048), eps=d.get("rms_norm_eps", 1e-6),
                  rope_theta=theta, rope_scaling=scaling, sliding_window=window, head_dim=head_dim,
                  tie_word_embeddings=d.get("tie_word_embeddings", False), pad_token_id=token_id(d))
    return LMConfig(**{**kwargs, **fields})


#: the config.json fields the loader checks before the reader sees them
LLAMA_FIELDS = ConfigFields(
    positive=("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size"),
    optional_positive=("num_key_value_heads", "head_dim", "max_position_embeddings", "sliding_window"),
    flags=("tie_word_embeddings", "attention_bias", "mlp_bias", "use_sliding_window"),
    numbers=("rms_norm_eps", "rope_theta"), strings=("hidden_act",))
#: the LMConfig fields a Llama-built family may set
LLAMA_ALLOWED = ("head_dim", "rope_scaling", "rope_layout")


def _q(c):
    return c.num_heads * c.d_head


def _kv(c):
    return c.num_kv_heads * c.d_head


#: the whole model's tensors: (ours, transformers', how, shape, init)
LLAMA_TOP = (top_tensor("embed_tokens", "model.embed_tokens.weight", "as is", lambda c: (c.vocab_size, c.d_model)),)
LLAMA_FINAL = (
    top_tensor("norm.weight", "model.norm.weight", "as is", D, "ones"),
    top_tensor("lm_head.W", "lm_head.weight", "transpose", lambda c: (c.d_model, c.vocab_size), optional=True,
               when=lambda c: not c.tie_word_embeddings),  # tied: absent
)
#: a block's tensors, in the order of the forward (ours, after ``layers.<i>.``; theirs after ``model.layers.<i>.``)
LLAMA_BLOCK = (
    Tensor(("input_norm.weight",), "input_layernorm.weight", "as is", D, "ones"),
    Tensor(("self_attn.W_q",), "self_attn.q_proj.weight", "transpose", lambda c: (c.d_model, _q(c))),
    Tensor(("self_attn.W_k",), "self_attn.k_proj.weight", "transpose", lambda c: (c.d_model, _kv(c))),
    Tensor(("self_attn.W_v",), "self_attn.v_proj.weight", "transpose", lambda c: (c.d_model, _kv(c))),
    Tensor(("self_attn.W_o",), "self_attn.o_proj.weight", "transpose", lambda c: (_q(c), c.d_model)),
    Tensor(("post_attention_norm.weight",), "post_attention_layernorm.weight", "as is", D, "ones"),
    Tensor(("mlp.W_gate",), "mlp.gate_proj.weight", "transpose", lambda c: (c.d_model, c.d_ff)),
    Tensor(("mlp.W_up",), "mlp.up_proj.weight", "transpose", lambda c: (c.d_model, c.d_ff)),
    Tensor(("mlp.W_down",), "mlp.down_proj.weight", "transpose", lambda c: (c.d_ff, c.d_model)),
)


# ---- the whole model's hooks (step numbers of the module docstring) ----

def embed_tokens(ids, positions, params, config):
    """Step 1: the token table's rows (the pad row is read like any other; it gets no gradient)."""
    return embedding_formula(ids, params[family_of(config).token_table], config.pad_token_id)  # (..., T, D)


def embed_tokens_backward(dx, cache, config):
    """Step 1 back: the scatter-add of the lookup."""
    return {family_of(config).token_table: embedding_backward(dx, cache)}  # (V, D)


class LlamaLayer(NamedTuple):
    """A layer's constants, read once per run: RoPE's frequencies, its window, whether it rotates."""

    theta: object  # (Dh/2,) float64
    window: int | None
    rotate: bool


def llama_layers(config):
    """Each layer's :class:`LlamaLayer`: the window on every layer (Mistral, Phi-3) or on the
    ``"sliding_attention"`` ones of ``layer_types``; RoPE unless ``rope_layers`` says not."""
    theta, kinds, rope = config.rope_frequencies(), config.layer_types, config.rope_layers
    return [LlamaLayer(theta, config.sliding_window if kinds is None or kinds[i] == "sliding_attention" else None,
                       rope is None or rope[i]) for i in range(config.num_layers)]


def identity_prepare(p, config):
    """A layer's params as the block takes them: as they are."""
    return p


def llama_block(x, p, config, layer: LlamaLayer, mask, positions, kv):
    """Step 2, one block: :func:`attention_ref.nn.llama_block.llama_block_formula` over the
    sequence, or with ``kv`` its decoding step at ``positions`` (B, t) (the same six steps, one
    step list)."""
    return llama_block_formula(x, p, config.num_heads, config.num_kv_heads, rope_base=config.rope_theta, eps=config.eps,
                               mask=mask, scale=None, theta=layer.theta, window=layer.window, rotate=layer.rotate,
                               layout=config.rope_layout, kv=kv, positions=positions)  # (..., T, D)


def init_llama_style(config, seed, dtype):
    """A block's random weights (:func:`attention_ref.nn.llama_block.init_llama_block_params`, with
    the family's q/k/v biases and q/k norms)."""
    return init_llama_block_params(config.d_model, config.num_heads, config.d_ff, num_kv_heads=config.num_kv_heads,
                                   seed=seed, dtype=dtype, qkv_bias=config.features.qkv_bias,
                                   qk_norm=config.features.qk_norm == "head", d_head=config.d_head)


def rms_final_norm(x, params, config):
    """Step 3: ``RMSNorm_f(x)`` (``model.norm``)."""
    return rms_norm_formula(x, params["norm.weight"], config.eps)  # (..., T, D)


def rms_final_norm_backward(dh, cache):
    dx, dw = rms_norm_backward(dh, cache)
    return dx, {"norm.weight": dw}


FAMILY = Family(
    model_type=MODEL_TYPE, read=read_llama, features=Features(), fields=LLAMA_FIELDS, allowed=LLAMA_ALLOWED,
    check=None, token_table="embed_tokens", layer_prefix="layers", base="model.", their_layer="model.layers.{i}.",
    model_title="transformers LlamaForCausalLM (whole model; blocks: model.layers.<i>. as LlamaDecoderLayer)",
    block_title="transformers LlamaDecoderLayer (layers.<i>.)", top=LLAMA_TOP, block=LLAMA_BLOCK, final=LLAMA_FINAL,
    embed=embed_tokens, embed_backward=embed_tokens_backward, layers=llama_layers, prepare=identity_prepare,
    block_forward=llama_block, block_backward=llama_block_backward, final_norm=rms_final_norm,
    final_norm_backward=rms_final_norm_backward, init_block=init_llama_style, float32_steps=(("llama", "Llama"),))
