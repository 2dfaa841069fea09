"""Llama (transformers' ``LlamaForCausalLM``): the family the other RoPE families are written against.

Reader: ``config.json``'s ``hidden_size``, ``num_hidden_layers``, ``num_attention_heads``,
``num_key_value_heads``, ``intermediate_size``, ``rms_norm_eps``, ``rope_theta`` / ``rope_scaling``
(4.x) or ``rope_parameters`` (5.x), ``head_dim``, ``tie_word_embeddings`` (default False) and
``pad_token_id``; ``hidden_act`` other than ``silu``, ``attention_bias``, ``mlp_bias``,
``use_sliding_window`` and sliding ``layer_types`` are refused by name. Every key of ``config.json``
is in :data:`LLAMA_KEYS` (computed, neutral, or refused at a non-neutral value; a key in no row is
refused by name); a RoPE field given in both spellings with two values is refused naming both
(:func:`rope_spellings`); a ``pad_token_id`` outside the vocabulary is refused (:func:`token_id`).

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

from collections.abc import Mapping
from typing import NamedTuple

from ...nn.embedding import embedding_backward, embedding_formula
from ...nn.llama_block import init_llama_block_params, llama_block_backward, llama_block_formula
from ...nn.rms_norm import rms_norm_backward, rms_norm_formula
from ...nn.rope_scaling import ROPE_TYPES
from ..config import LMConfig, family_of, refuse
from ..family import (BASE_KEYS, COMPUTED, DROPOUT, NEUTRAL, ConfigFields, Family, Features, Tensor, computed,
                      top_tensor)
from ..trace_steps import SEPARATOR, grouped_attention_steps, heads_last, linear_output, norm_output

__all__ = ["FAMILY", "read_llama", "rope_settings", "token_id", "LLAMA_FIELDS", "LLAMA_TOP", "LLAMA_FINAL", "LLAMA_BLOCK",
           "LLAMA_KEYS", "rope_spellings", "rope_conflict", "one_value",
           "LlamaLayer", "llama_layers", "llama_block", "embed_tokens", "embed_tokens_backward",
           "rms_final_norm", "rms_final_norm_backward", "identity_prepare", "LLAMA_ALLOWED", "init_llama_style",
           "trace_llama_block", "trace_llama_attention"]

MODEL_TYPE = "llama"


def D(c):
    return (c.d_model,)


def token_id(d, name="pad_token_id"):
    """A token id field of the embedding (``nn.Embedding``'s ``padding_idx``: a negative one counts
    from the end); None when absent; outside ``[-V, V)`` refused by name, as transformers refuses to
    build the model ("Padding_idx must be within num_embeddings")."""
    pad, V = d.get(name), d["vocab_size"]
    if pad is None:
        return None
    if isinstance(pad, bool) or not isinstance(pad, int) or not -V <= pad < V:
        raise ValueError(f"{d.get('model_type')}: {name} = {pad!r} is not a token id of the vocabulary (vocab_size ="
                         f" {V}); transformers refuses to build this model")
    return pad + V if pad < 0 else pad


def rope_conflict(family, first, second):
    """Refuse two ``(field, value)`` s of config.json that say different things about RoPE."""
    raise ValueError(f"{family}: config.json gives {first[0]} = {first[1]!r} and {second[0]} = {second[1]!r};"
                     " transformers 4.57 reads the top-level fields (rope_theta, rope_scaling), 5.x rope_parameters"
                     " (rope_scaling overriding it): neither is guessed; keep one of them")


def one_value(family, candidates, default):
    """The one value the ``(field, value)`` candidates give (None: not given), or ``default``; two
    different values are refused naming both fields."""
    given = [(name, value) for name, value in candidates if value is not None]
    for other in given[1:]:
        if other[1] != given[0][1]:
            rope_conflict(family, given[0], other)
    return given[0][1] if given else default


def _rope_dict(part, name, family):
    """A RoPE dict with its type under ``rope_type`` (4.x's ``type`` too)."""
    if part is not None and not isinstance(part, Mapping):
        raise ValueError(f"{family}: {name} must be an object or null, got {part!r}")
    part = dict(part or {})
    kind = part.pop("type", None)
    part["rope_type"] = part.get("rope_type", kind or "default")
    return part


def rope_spellings(d, family, new=None, theta_names=("rope_theta",), theta_default=10000.0):
    """``(rope, theta)``: the RoPE dict (``rope_type`` and its parameters) and base from 4.x's
    top-level ``rope_scaling`` and ``theta_names`` and 5.x's ``rope_parameters`` (or ``new``, a
    part of it); a field given twice with two values is refused naming both."""
    new = _rope_dict(d.get("rope_parameters") if new is None else new, "rope_parameters", family)
    old = _rope_dict(d.get("rope_scaling"), "rope_scaling", family)
    if d.get("rope_scaling") and (d.get("rope_parameters") or {}) != {}:
        a, b = ({k: v for k, v in part.items() if k != "rope_theta"} for part in (old, new))
        if a != b:
            rope_conflict(family, ("rope_scaling", d["rope_scaling"]), ("rope_parameters", d["rope_parameters"]))
    theta = one_value(family, [(n, d.get(n)) for n in theta_names] + [
        ("rope_parameters.rope_theta", new.get("rope_theta")), ("rope_scaling.rope_theta", old.get("rope_theta"))],
        theta_default)
    return (old if d.get("rope_scaling") else new), theta


def rope_settings(d, family):
    """``(rope_theta, rope_scaling)`` from 4.x's ``rope_theta`` and ``rope_scaling`` or 5.x's
    ``rope_parameters`` (a conflict refused naming both); a type this package does not compute,
    or a partial rotation, is refused."""
    rope, theta = rope_spellings(d, family)
    rope_type = rope["rope_type"]
    if rope_type not in ROPE_TYPES:
        refuse("the RoPE scaling rope_type", rope_type, family)  # e.g. "dynamic", "yarn", "longrope"
    if rope.get("partial_rotary_factor", 1.0) != 1.0:
        refuse("the RoPE partial_rotary_factor", rope["partial_rotary_factor"], family)
    scaling = None
    if rope_type != "default":  # Llama 3.x: the type and its parameters (any other key is refused by name)
        scaling = {k: v for k, v in rope.items() if k not in ("rope_theta", "partial_rotary_factor")}
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
    head_dim = d.get("head_dim")
    head_dim = D_ // H if head_dim is None else head_dim
    if head_dim * H == D_:
        head_dim = None  # the usual width: not stored
    elif head_dim % 2:
        refuse("head_dim", head_dim, family)  # RoPE rotates pairs
    window = d.get("sliding_window") if "sliding_window" in family_of(family).allowed else None
    kv_heads = d.get("num_key_value_heads")
    kwargs = dict(family=family, vocab_size=d["vocab_size"], d_model=D_, num_layers=d["num_hidden_layers"],
                  num_heads=H, num_kv_heads=H if kv_heads is None else kv_heads, d_ff=d["intermediate_size"],
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
#: the keys of transformers' LlamaConfig (``LlamaConfig().to_dict()`` on 4.57.1 and 5.24) and what each is
#: here: COMPUTED by :func:`read_llama`, NEUTRAL (any value), DROPOUT, or its neutral values (another
#: value refused by name); a key of no row is refused (Granite's ``embedding_multiplier``,
#: ``attention_multiplier``, ``residual_multiplier``, ``logits_scaling``; SmolLM3's ``no_rope_layers``)
LLAMA_KEYS = {
    **BASE_KEYS,
    **computed("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
               "intermediate_size", "head_dim", "hidden_act", "rms_norm_eps", "max_position_embeddings",
               "rope_theta", "rope_scaling", "rope_parameters"),
    "layer_types": COMPUTED,  # not LlamaConfig's: all "full_attention" (any other kind refused by the reader)
    "attention_dropout": DROPOUT,
    "pretraining_tp": NEUTRAL,  # no step of 4.57's or 5.24's modeling_llama reads it
    "attention_bias": (False,), "mlp_bias": (False,),
    "sliding_window": NEUTRAL,  # not LlamaConfig's; 4.57's and 5.24's modeling_llama read no window: nor here
}
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


def embed_tokens_backward(dx, cache, config, table_grad=None):
    """Step 1 back: the scatter-add of the lookup (into ``table_grad``, the tied head's, when given)."""
    return {family_of(config).token_table: embedding_backward(dx, cache, table_grad)}  # (V, D)


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


def trace_llama_block(cache, p, config):
    """The trace of one block (:func:`attention_ref.models.lm_trace`): each of transformers'
    ``LlamaDecoderLayer`` modules (and Qwen2's, Qwen3's, Mistral's, SmolLM3's) by its name after
    ``model.layers.<i>.``, in the order its forward hooks fire, from the block's caches."""
    mlp = cache.mlp
    out = trace_llama_attention(cache, p)
    out += [("post_attention_layernorm", mlp.gate.x),
            ("mlp.gate_proj", mlp.a), ("mlp.act_fn", mlp.a * mlp.sig), ("mlp.up_proj", mlp.u)]
    m = linear_output(mlp.down)  # (..., T, D)
    return out + [("mlp.down_proj", m), ("mlp", m)]


def trace_llama_attention(cache, p):
    """:func:`trace_llama_block`'s first modules, ``input_layernorm`` to ``self_attn`` (a block whose MLP
    differs, Qwen3-MoE's experts, traces its own)."""
    attn = cache.attn
    q_proj = linear_output(attn.q_proj, p.get("self_attn.b_q"))  # (..., T, H Dh)
    k_proj = linear_output(attn.k_proj, p.get("self_attn.b_k"))  # (..., T, Hkv Dh)
    v_proj = linear_output(attn.v_proj, p.get("self_attn.b_v"))
    out = [("input_layernorm", attn.q_proj.x), ("self_attn.q_proj", q_proj)]
    qk_norms = attn.rotary[1][:2] if "self_attn.q_norm.weight" in p else None  # Qwen3: per head, before RoPE
    if qk_norms is not None:
        out.append(("self_attn.q_norm", heads_last(norm_output(qk_norms[0]))))  # (..., T, H, Dh)
    out.append(("self_attn.k_proj", k_proj))
    if qk_norms is not None:
        out.append(("self_attn.k_norm", heads_last(norm_output(qk_norms[1]))))  # (..., T, Hkv, Dh)
    out.append(("self_attn.v_proj", v_proj))
    out += [(f"self_attn{SEPARATOR}{step}", value) for step, value in grouped_attention_steps(attn)]
    a = linear_output(attn.o_proj)  # (..., T, D)
    return out + [("self_attn.o_proj", a), ("self_attn", a)]


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
    final_norm_backward=rms_final_norm_backward, init_block=init_llama_style, float32_steps=(("llama", "Llama"),),
    keys=LLAMA_KEYS, buffers=("rotary_emb.inv_freq",),
    trace_block=trace_llama_block)

#: a small Llama (attention_ref.interop.write_random_model): every config.json field that changes the maths
EXAMPLE = {"vocab_size": 64, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64, "rms_norm_eps": 1e-6,
           "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": False}
FAMILY = FAMILY._replace(example=EXAMPLE)
