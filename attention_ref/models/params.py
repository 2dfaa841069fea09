"""A whole model's parameters: one flat dict, named like transformers' modules.

Each family's names are its parameter table's (:mod:`attention_ref.models.families`), e.g.
GPT-2: ``wte`` (V, D), ``wpe`` (P, D), ``h.<i>.<block name>`` (the names of
:func:`attention_ref.gpt2_block_forward`), ``ln_f.gamma``, ``ln_f.beta``, and ``lm_head.W``
(D, V) only when the head is not tied to ``wte``.
Llama: ``embed_tokens`` (V, D), ``layers.<i>.<block name>`` (:data:`attention_ref.LLAMA_PARAM_NAMES`,
Qwen2's ``self_attn.b_q``, ``.b_k``, ``.b_v``, Qwen3's ``self_attn.q_norm.weight``, ``.k_norm.weight``), ``norm.weight``, and ``lm_head.W`` (D, V) unless tied.

GPT-NeoX: ``embed_in`` (V, D), ``layers.<i>.<block name>`` (:data:`attention_ref.nn.gpt_neox_block.GPT_NEOX_PARAM_NAMES`:
the fused ``attention.W_qkv`` in transformers' per-head column order), ``final_layer_norm.gamma``,
``.beta``, and ``lm_head.W`` (D, V) unless tied (transformers' ``embed_out``).

Phi-3: Llama's names with the fused ``layers.<i>.self_attn.W_qkv`` (D, (H + 2 Hkv) Dh), columns
``[q | k | v]``, and ``layers.<i>.mlp.W_gate_up`` (D, 2 F), columns ``[gate | up]``, in place of
``W_q``, ``W_k``, ``W_v`` and ``W_gate``, ``W_up`` (:data:`PHI3_PARAM_NAMES`).

Gradients come back as a dict with the same keys and shapes, so an optimiser steps over both.
"""
from __future__ import annotations

import numpy as np

from .._checks import as_generator
from .._checks import as_real_array, cast, common_dtype
from .._token_checks import as_attention_mask, as_token_ids
from .config import LMConfig, family_of
from .family import block_tensors
from .families import FAMILY
from .families.gpt_neox import gpt_neox_block_shapes
from .families.phi3 import PHI3_PARAM_NAMES, phi3_block_shapes

__all__ = ["PHI3_PARAM_NAMES", "param_names", "tensor_shapes", "block_params", "init_lm_params", "check_lm_params",
           "check_lm_inputs", "head_weight", "add_head_gradient", "TOKEN_TABLE", "LAYER_PREFIX",
           "gpt_neox_block_shapes", "phi3_block_shapes", "optional_names"]

#: The token table's name and a layer's prefix in each family (from the family modules).
TOKEN_TABLE = {name: f.token_table for name, f in FAMILY.items()}
LAYER_PREFIX = {name: f.layer_prefix for name, f in FAMILY.items()}
_STD = {"normal": 0.02, "normal/2": 0.01}  # transformers' initializer_range; GPT-2's position table half of it


def _ours(tensors, config, layer=None):
    """``(our name, Tensor)`` of each of ``tensors`` that ``config``'s model has (in block ``layer``, when given)."""
    return [(n, t) for t in tensors if (t.when is None or t.when(config))
            and (layer is None or t.in_layer is None or t.in_layer(config, layer)) for n in t.ours]


def _block_names(family, config, layer):
    """Block ``layer``'s names (without its prefix), in the order of the params."""
    block = [n for n, _ in _ours(family.block, config, layer)]
    return block if family.block_order is None else sorted(block, key=family.block_order.index)


def param_names(config: LMConfig) -> tuple:
    """Every key of a model's params, in the order of the forward (the family's parameter table:
    the tables, each layer's block, then the final norm and the head)."""
    family = family_of(config)
    layers = [f"{family.layer_prefix}.{i}.{n}" for i in range(config.num_layers)
              for n in _block_names(family, config, i)]
    return tuple([n for n, _ in _ours(family.top, config)] + layers + [n for n, _ in _ours(family.final, config)])


def optional_names(config: LMConfig) -> set:
    """The block names a model's params may lack (GPT-2's biases)."""
    family = family_of(config)
    return {f"{family.layer_prefix}.{i}.{n}" for i in range(config.num_layers)
            for n, t in _ours(family.block, config, i) if t.optional}


def block_params(params: dict, config: LMConfig, layer: int) -> dict:
    """Layer ``layer``'s params under the block's own names (the prefix removed)."""
    prefix = f"{LAYER_PREFIX[config.family]}.{layer}."
    return {k[len(prefix):]: v for k, v in params.items() if k.startswith(prefix)}


def tensor_shapes(config: LMConfig) -> dict:
    """The shape of every tensor of the config's model, keyed like :func:`param_names` (from the
    family's parameter table)."""
    family = family_of(config)
    shapes = {n: t.shape(config) for n, t in _ours(family.top + family.final, config)}
    shapes.update({f"{family.layer_prefix}.{i}.{n}": t.shape(config) for i in range(config.num_layers)
                   for n, t in _ours(family.block, config, i)})
    return {n: shapes[n] for n in param_names(config)}


def check_lm_params(params, config: LMConfig) -> dict:
    """``params`` has the model's keys (the biases of GPT-2's blocks may be absent), every tensor
    real and finite of the config's shape; anything else is named. Returns the params checked,
    in their common dtype (no copy of a tensor already in it): the forward and every decoding
    step then compute on them without checking again."""
    if not isinstance(config, LMConfig):
        raise TypeError(f"config must be an LMConfig (attention_ref.LMConfig.from_dict(config.json)),"
                        f" got {type(config).__name__}")
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict of arrays, got {type(params).__name__}")
    names = param_names(config)
    optional = optional_names(config)
    missing = [n for n in names if params.get(n) is None and n not in optional]
    unknown = sorted(set(params) - set(names))
    if missing or unknown:
        raise ValueError(f"params do not match the {config.family} config ({config.num_layers} layers,"
                         f" tie_word_embeddings={config.tie_word_embeddings}): missing {missing[:6]}"
                         f"{'...' if len(missing) > 6 else ''}, unknown {unknown[:6]}{'...' if len(unknown) > 6 else ''}")
    sizes = (f"vocab_size = {config.vocab_size}, d_model = {config.d_model}, d_ff = {config.d_ff}, num_heads ="
             f" {config.num_heads}, num_kv_heads = {config.num_kv_heads}, max_positions = {config.max_positions}")
    checked = {}
    for name, shape in tensor_shapes(config).items():
        if params.get(name) is None:
            continue
        if np.shape(params[name]) != shape:
            raise ValueError(f"params['{name}'] must have shape {shape} ({sizes}), got {np.shape(params[name])}")
        checked[name] = as_real_array(params[name], f"params['{name}']")
    dtype = common_dtype(*checked.values())
    return {name: cast(a, dtype) for name, a in checked.items()}


def check_lm_inputs(ids, params, config: LMConfig, attention_mask=None):
    """A whole model's inputs: the params against the config, the ids in the vocabulary, and
    transformers' ``attention_mask`` as a key mask (..., 1, T) for the blocks (None when there
    is no padding). Returns ``(ids, params, mask)``, the params checked (:func:`check_lm_params`)."""
    params = check_lm_params(params, config)
    ids = as_token_ids(ids, "ids", config.vocab_size)
    if ids.ndim < 1:
        raise ValueError(f"ids must have shape (..., T), got a scalar {ids!r}")
    keep = as_attention_mask(attention_mask, ids.shape)  # (..., T)
    return ids, params, (None if keep.all() else keep[..., None, :])  # (..., 1, T): a query sees real keys only


def head_weight(params: dict, config: LMConfig):
    """The LM head's weight (D, V): the token table transposed when tied, else ``lm_head.W``."""
    return params[TOKEN_TABLE[config.family]].T if config.tie_word_embeddings else params["lm_head.W"]


def add_head_gradient(grads: dict, dW_head, config: LMConfig) -> None:
    """The head's gradient (D, V) into ``grads``: added to the token table's (transposed) when
    tied, so the table's gradient is the sum of its two uses; else as ``lm_head.W``'s."""
    table = TOKEN_TABLE[config.family]
    if config.tie_word_embeddings:
        grads[table] = grads[table] + dW_head.T
    else:
        grads["lm_head.W"] = dW_head


def init_lm_params(config: LMConfig, *, seed=None, dtype=np.float64) -> dict:
    """Random weights of the config's shapes: normal with std 0.02 (transformers'
    ``initializer_range``; GPT-2's position table 0.01, as GPT-2's own initialisation), norms at
    1 (Gemma's (1 + w) at w = 0) and biases at 0, as the family's parameter table says (a
    family's own block initialiser when it has one)."""
    family = family_of(config)
    rng = as_generator(seed)
    params = {}

    def draw(t, generator):
        shape = t.shape(config)
        if t.init in _STD:
            return (_STD[t.init] * generator.standard_normal(shape)).astype(dtype)
        return (np.ones if t.init == "ones" else np.zeros)(shape, dtype)

    params.update({n: draw(t, rng) for n, t in _ours(family.top, config)})  # the tables first
    for i in range(config.num_layers):
        seed_i = int(rng.integers(2**31))
        if family.init_block is not None:
            block = family.init_block(config, seed_i, dtype)
        else:
            block_rng = np.random.default_rng(seed_i)
            block = {n: draw(t, block_rng) for n, t in _ours(family.block, config, i)}
        params.update({f"{family.layer_prefix}.{i}.{k}": v for k, v in block.items()})
    params.update({n: draw(t, rng) for n, t in _ours(family.final, config)})  # the final norm, the head
    return {name: params[name] for name in param_names(config) if name in params}
