"""What a model family is, as data: :class:`Family`, its parameter table (:class:`Tensor`) and
its features (:class:`Features`).

One module of :mod:`attention_ref.models.families` holds one family: the config reader (the
``config.json`` fields it reads, with that family's own defaults), one parameter table (our
name, transformers' name, the shape as a function of the config, the initialisation), the
block as numbered steps of pairs from ``core/``, ``variants/`` and ``nn/``, and the hooks of the
whole model (embedding, final norm, logits). Everything that lists families (``FAMILIES``, the
shapes, transformers' names, the loader's checks, ``docs/model_mappings.md``) is derived from
those modules by the registry :mod:`attention_ref.models.families`; the whole model's steps are
written once, in :mod:`attention_ref.models.lm`, over these hooks. Blocks and models read a
family's :class:`Features`, never its name.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

__all__ = ["Tensor", "Features", "Family", "ConfigFields", "top_tensor", "block_tensors", "NEUTRAL", "COMPUTED",
           "DROPOUT", "neutral", "computed", "BASE_KEYS", "check_keys", "EXPERTS_5X"]


class Tensor(NamedTuple):
    """One row of a family's parameter table.

    ``ours``: our name(s), a block's without the layer prefix (three names when transformers
    fuses them, as GPT-2's ``c_attn``); ``theirs``: transformers' name (a block's after the layer
    prefix ``model.layers.<i>.``; with ``{e}`` for the expert index when each expert is stored
    apart, ``how`` then ``"stack experts, transpose"``); ``how``: how theirs becomes ours (a key of
    :data:`attention_ref.interop.mappings.HOW`); ``shape``: ``config -> shape`` of each of ours;
    ``init``: ``"normal"`` (std 0.02, transformers' ``initializer_range``), ``"ones"`` or
    ``"zeros"``; ``optional``: may be absent from a checkpoint (GPT-2's biases; a tied head);
    ``when``: ``config -> bool``, whether this config's model has the tensor (None: always);
    ``in_layer``: ``(config, i) -> bool``, whether block ``i`` has it (a block row only; None: every
    block), for families whose layers differ in their tensors (a dense MLP on some layers, a mixture
    of experts on the others)."""

    ours: tuple
    theirs: str
    how: str
    shape: Callable
    init: str = "normal"
    optional: bool = False
    when: Callable | None = None
    in_layer: Callable | None = None


class Features(NamedTuple):
    """What a family's blocks compute, as data the family sets (blocks and models read these).

    qkv_bias : biases on the q, k, v projections (Qwen2)
    qk_norm : None, ``"head"`` (an RMSNorm (Dh,) over each head's q and k: Qwen3, Gemma 3) or
        ``"projection"`` (over the whole projection, H Dh and Hkv Dh wide: OLMo 2)
    norm_placement : ``"pre"`` (a norm before each sub-layer), ``"post"`` (after it, before the
        residual: OLMo 2) or ``"sandwich"`` (both: Gemma)
    fused_projections : q, k, v and the MLP's gate and up stored fused (Phi-3)
    parallel_residual : the config may set ``use_parallel_residual`` (GPT-NeoX)
    rotary : positions enter through RoPE (GPT-2: a learned position table instead)
    rope_attention_factor : the config's RoPE may be YaRN, whose attention factor multiplies
        ``cos`` and ``sin`` (:meth:`attention_ref.models.LMConfig.rope_attention_factor`; gpt-oss)
    fused_qkv : how transformers' checkpoint stores a fused q/k/v projection: None (q, k, v apart),
        ``"per_head"`` (``[q_0 k_0 v_0 q_1 ...]``: GPT-NeoX, BLOOM) or ``"blocks"`` (``[q | k | v]``:
        Phi-3, GPT-2's ``c_attn``), the layouts of :mod:`attention_ref.nn.fused_qkv` (the family's
        split and :mod:`attention_ref.compare` both read it)
    """

    qkv_bias: bool = False
    qk_norm: str | None = None
    norm_placement: str = "pre"
    fused_projections: bool = False
    parallel_residual: bool = False
    rotary: bool = True
    rope_attention_factor: bool = False
    fused_qkv: str | None = None


class ConfigFields(NamedTuple):
    """The ``config.json`` fields a family's reader reads, by kind, for the loader's checks
    (:func:`attention_ref.interop.model_folder.read_config`): each is checked for its type and
    range before the reader sees it."""

    positive: tuple  # required positive integers
    optional_positive: tuple = ()  # positive integers or null
    flags: tuple = ()  # JSON booleans
    numbers: tuple = ()  # positive finite numbers
    strings: tuple = ()
    width_heads: tuple | None = None  # (width, heads) when the width must be a multiple of the heads


class Family(NamedTuple):
    """One model family (a transformers ``model_type``): its reader, parameter table and steps.

    The steps (hooks) the whole model (:mod:`attention_ref.models.lm`) calls, in order:

    1. ``embed(ids, positions, params, config) -> (x, cache)``; ``embed_backward(dx, cache, config,
       table_grad=None) -> grads``: the token table (and GPT-2's positions, Gemma's sqrt(D)), the
       lookups' scatter-add into ``table_grad`` (a tied head's gradient of the table) when given
    2. ``layers(config) -> list``: each layer's constants (RoPE frequencies, window, scale), read
       once; ``prepare(p, config) -> q``: a layer's params as its block takes them (fused weights
       split once); ``block(x, q, config, layer, mask, positions, kv) -> (y, cache)``: the block's
       numbered steps, with ``kv`` a :class:`attention_ref.variants.kv_cache.KVCache` when
       decoding (then ``cache`` is None); ``block_backward(dy, cache) -> (dx, grads)``
    3. ``final_norm(x, params, config) -> (h, cache)``; ``final_norm_backward(dh, cache) -> (dx, grads)``
    4. the LM head (the same for every family), then ``logits(z, config) -> (logits, cache)`` and
       ``logits_backward(dlogits, cache) -> dz`` (Gemma 2's cap; None: the identity)

    The trace (:func:`attention_ref.models.lm_trace`) reads the same steps' outputs by transformers'
    module names: ``trace_block(cache, p, config) -> [(name, output)]`` names a block cache's fields
    (names after the layer's prefix, in transformers' hook order), ``trace_embed`` step 1's when it
    has more than one module (GPT-2's ``wte`` and ``wpe``), ``names_4x`` the names transformers 4.57
    spells otherwise.
    """

    model_type: str
    read: Callable  # config.json (a dict) -> LMConfig
    features: Features
    fields: ConfigFields
    allowed: tuple  # the LMConfig fields this family may set away from their defaults
    check: Callable | None  # LMConfig -> None: the family's own rules, errors by name
    token_table: str  # our name of the token table
    layer_prefix: str  # our prefix of layer i: "<layer_prefix>.<i>."
    base: str  # transformers' base model prefix in the LM ("model.")
    their_layer: str  # transformers' prefix of layer i ("model.layers.{i}.")
    model_title: str  # the whole model's mapping table (docs/model_mappings.md)
    block_title: str  # the block's mapping table
    top: tuple  # Tensor rows of the whole model before the blocks (the tables; names whole)
    block: tuple  # Tensor rows of a block
    final: tuple  # Tensor rows of the whole model after the blocks (the final norm, the head)
    embed: Callable
    embed_backward: Callable
    layers: Callable
    prepare: Callable
    block_forward: Callable
    block_backward: Callable
    final_norm: Callable
    final_norm_backward: Callable
    logits: Callable | None = None
    logits_backward: Callable | None = None
    init_block: Callable | None = None  # (config, seed, dtype) -> a block's params; None: from the table
    float32_steps: tuple = ()  # transformers' (module, class prefix) whose RMSNorm/RoPE run in float32
    block_order: tuple | None = None  # our block names in the order of the params, when not the table's
    new_cache: Callable | None = None  # (config, i) -> layer i's empty decoding cache; None: KVCache()
    keys: dict | None = None  # config.json key -> NEUTRAL, COMPUTED, DROPOUT or its neutral values (check_keys)
    buffers: tuple = ()  # checkpoint names' endings transformers computes from the config and never reads
    # the trace (issue 38, :func:`attention_ref.models.lm_trace`): transformers' module names of this family
    trace_embed: Callable | None = None  # (x, cache, params, config) -> [(name, output)]; None: x as top[0]'s module
    trace_block: Callable | None = None  # (cache, p, config) -> [(name after their_layer, output)], hook order
    names_4x: tuple = ()  # (5.x name, 4.57's name) of the modules transformers 4.x names otherwise
    # (5.x state-dict name, the file's per-expert names it holds) of the experts transformers 5.x keeps fused in
    # ``model.state_dict()`` (files keep one tensor per expert): :data:`EXPERTS_5X`; () for a family with none
    experts_5x: tuple = ()
    # a small model of this family (attention_ref.interop.write_random_model): config.json's fields, every one that
    # changes the maths written out (no default assumed); model_type and the token ids are added there
    example: dict | None = None


#: transformers 5.x's fused experts (its ``conversion_mapping.py``, the ``qwen2_moe`` entry that Qwen2-MoE,
#: Qwen3-MoE, Qwen3-Next, DeepSeek-V3 and others share): ``model.state_dict()`` holds ``mlp.experts.gate_up_proj``
#: (E, 2F, D), each expert's gate rows then its up rows, and ``mlp.experts.down_proj`` (E, D, F); ``save_pretrained``
#: splits them back into the per-expert ``nn.Linear`` names of 4.x, which are the files' names (the table's)
EXPERTS_5X = (("mlp.experts.gate_up_proj", ("mlp.experts.{e}.gate_proj.weight", "mlp.experts.{e}.up_proj.weight")),
              ("mlp.experts.down_proj", ("mlp.experts.{e}.down_proj.weight",)))


def top_tensor(ours, theirs, how, shape, init="normal", optional=False, when=None) -> Tensor:
    """A row of a whole model's table (our one name)."""
    return Tensor((ours,), theirs, how, shape, init, optional, when)


def block_tensors(family: Family, config, layer: int | None = None) -> tuple:
    """The rows of ``family``'s block table that ``config``'s model has (in block ``layer``, when given:
    a row's ``in_layer`` says which blocks have it)."""
    return tuple(t for t in family.block if (t.when is None or t.when(config))
                 and (layer is None or t.in_layer is None or t.in_layer(config, layer)))


# ---- the config.json keys a family knows (issue 41): computed, neutral, or refused by name ----

#: any value leaves the forward's numbers as they are (a token id, a name, a generation setting)
NEUTRAL = "neutral"
#: read by the family's reader (which computes it, or refuses a value it does not compute)
COMPUTED = "computed"
#: a dropout probability: transformers' ``from_pretrained`` model is in eval mode, where dropout is
#: the identity; any probability in [0, 1] leaves the forward as it is (this package trains without it)
DROPOUT = "dropout"


def neutral(*names) -> dict:
    return dict.fromkeys(names, NEUTRAL)


def computed(*names) -> dict:
    return dict.fromkeys(names, COMPUTED)


#: the keys of transformers' ``PretrainedConfig`` (``PretrainedConfig().to_dict()`` on 4.57.1; 5.24 keeps
#: a subset) and a few that older files hold, for every family; a tuple lists the neutral values
#: (another value is refused by name)
BASE_KEYS = {
    **computed("model_type", "vocab_size", "tie_word_embeddings", "pad_token_id"),
    # names, token ids, dtypes and flags of the wrapper: nothing the forward computes
    **neutral("_name_or_path", "architectures", "auto_map", "transformers_version", "dtype", "torch_dtype",
              "use_bfloat16", "bos_token_id", "eos_token_id", "sep_token_id", "decoder_start_token_id",
              "id2label", "label2id", "problem_type", "finetuning_task", "tokenizer_class", "prefix",
              "task_specific_params", "output_attentions", "output_hidden_states", "return_dict", "torchscript",
              "use_cache", "initializer_range", "chunk_size_feed_forward", "is_decoder", "tie_encoder_decoder",
              "tf_legacy_loss", "gradient_checkpointing", "cache_implementation", "_attn_implementation_autoset",
              "attn_implementation"),
    # generation settings written by 4.x (generate's own arguments here; not the forward)
    **neutral("max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups",
              "diversity_penalty", "temperature", "top_k", "top_p", "typical_p", "repetition_penalty",
              "length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids",
              "num_return_sequences", "output_scores", "return_dict_in_generate", "forced_bos_token_id",
              "forced_eos_token_id", "remove_invalid_values", "exponential_decay_length_penalty",
              "suppress_tokens", "begin_suppress_tokens"),
    # refused at any other value: an encoder, cross-attention, pruned heads, quantised weights
    "is_encoder_decoder": (False,), "add_cross_attention": (False,), "cross_attention_hidden_size": (None,),
    "pruned_heads": ({},), "quantization_config": (None,),
}


def _same(value, allowed) -> bool:
    """``value`` is one of ``allowed`` (a JSON true is not the number 1)."""
    return any(value == a and isinstance(value, bool) == isinstance(a, bool) for a in allowed)


def check_keys(d: dict, family) -> None:
    """Every key of ``d`` (a ``config.json``) is one ``family`` knows: computed by its reader,
    neutral, or at a neutral value; anything else is refused with one line naming the key."""
    table = family.keys
    if table is None:
        return
    name = family.model_type
    for key, value in d.items():
        rule = table.get(key)
        if rule is None:
            raise ValueError(f"{name}: config.json key {key!r} = {value!r} is not a field of transformers' {name}"
                             " config this package computes or knows to leave the numbers unchanged (a config"
                             " of another family under this model_type?); the model cannot be run here")
        if rule == DROPOUT:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
                raise ValueError(f"{name}: {key} must be a dropout probability in [0, 1], got {value!r}")
        elif isinstance(rule, tuple) and not _same(value, rule):
            raise ValueError(f"{name}: {key} = {value!r} is not supported by attention_ref (it changes the maths"
                             f" this package implements; only {' or '.join(repr(v) for v in rule)} does not);"
                             " the model cannot be run here")
