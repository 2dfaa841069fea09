"""A whole model's parameters: one flat dict, named like transformers' modules.

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
from ..nn.encoder_block import ENCODER_GROUPS
from ..nn.gpt2_block import init_gpt2_block_params
from ..nn.gpt_neox_block import GPT_NEOX_PARAM_NAMES, init_gpt_neox_block_params
from ..nn.gemma_block import GEMMA2_PARAM_NAMES, GEMMA_PARAM_NAMES, init_gemma_block_params
from ..nn.llama_block import LLAMA_PARAM_NAMES, QK_NORM_NAMES, QKV_BIAS_NAMES, init_llama_block_params
from .config import GEMMA, LLAMA_LIKE, LMConfig

__all__ = ["PHI3_PARAM_NAMES", "param_names", "tensor_shapes", "block_params", "init_lm_params", "check_lm_params", "check_lm_inputs", "head_weight",
           "add_head_gradient", "TOKEN_TABLE", "LAYER_PREFIX"]

#: The token table's name and a layer's prefix in each family.
TOKEN_TABLE = {"gpt2": "wte", **dict.fromkeys(LLAMA_LIKE, "embed_tokens"), "gpt_neox": "embed_in",
               "phi3": "embed_tokens", **dict.fromkeys(GEMMA, "embed_tokens")}
LAYER_PREFIX = {"gpt2": "h", **dict.fromkeys(LLAMA_LIKE, "layers"), "gpt_neox": "layers", "phi3": "layers",
                **dict.fromkeys(GEMMA, "layers")}
#: Phi-3's block: Llama's with the q, k, v projections fused, and the MLP's gate and up
PHI3_PARAM_NAMES = ("input_norm.weight", "self_attn.W_qkv", "self_attn.W_o", "post_attention_norm.weight",
                    "mlp.W_gate_up", "mlp.W_down")
_GPT2_BLOCK = tuple(f"{group}.{name}" for group, names in ENCODER_GROUPS.items() for name in names)


def _block_names(config: LMConfig):
    if config.family == "gpt2":
        return _GPT2_BLOCK
    if config.family == "gpt_neox":
        return GPT_NEOX_PARAM_NAMES
    if config.family == "phi3":
        return PHI3_PARAM_NAMES
    if config.family in GEMMA:
        return GEMMA_PARAM_NAMES if config.qk_norm else GEMMA2_PARAM_NAMES
    return LLAMA_PARAM_NAMES + (QKV_BIAS_NAMES if config.qkv_bias else ()) + (QK_NORM_NAMES if config.qk_norm else ())


def param_names(config: LMConfig) -> tuple:
    """Every key of a model's params, in the order of the forward."""
    names = ["wte", "wpe"] if config.family == "gpt2" else [TOKEN_TABLE[config.family]]
    prefix = LAYER_PREFIX[config.family]
    names += [f"{prefix}.{i}.{n}" for i in range(config.num_layers) for n in _block_names(config)]
    names += {"gpt2": ["ln_f.gamma", "ln_f.beta"], "gpt_neox": ["final_layer_norm.gamma", "final_layer_norm.beta"]
              }.get(config.family, ["norm.weight"])
    return tuple(names + ([] if config.tie_word_embeddings else ["lm_head.W"]))


def block_params(params: dict, config: LMConfig, layer: int) -> dict:
    """Layer ``layer``'s params under the block's own names (the prefix removed)."""
    prefix = f"{LAYER_PREFIX[config.family]}.{layer}."
    return {k[len(prefix):]: v for k, v in params.items() if k.startswith(prefix)}


def tensor_shapes(config: LMConfig) -> dict:
    """The shape of every tensor of the config's model, keyed like :func:`param_names`."""
    V, D, F, H, Hkv = config.vocab_size, config.d_model, config.d_ff, config.num_heads, config.num_kv_heads
    Dh = config.d_head
    Dq, Dkv = H * Dh, Hkv * Dh  # the query and key/value widths: num_heads and num_kv_heads heads of Dh
    if config.family == "gpt2":
        block = {"ln1.gamma": (D,), "ln1.beta": (D,), "ln2.gamma": (D,), "ln2.beta": (D,),
                 "ffn.W_1": (D, F), "ffn.b_1": (F,), "ffn.W_2": (F, D), "ffn.b_2": (D,)}
        block.update({f"self_attn.{w}": (D, D) for w in ("W_q", "W_k", "W_v", "W_o")})
        block.update({f"self_attn.{b}": (D,) for b in ("b_q", "b_k", "b_v", "b_o")})
        outer = {"wte": (V, D), "wpe": (config.max_positions, D), "ln_f.gamma": (D,), "ln_f.beta": (D,)}
    elif config.family == "gpt_neox":
        block = gpt_neox_block_shapes(D, F)
        outer = {"embed_in": (V, D), "final_layer_norm.gamma": (D,), "final_layer_norm.beta": (D,)}
    elif config.family == "phi3":
        block = phi3_block_shapes(config)
        outer = {"embed_tokens": (V, D), "norm.weight": (D,)}
    else:
        block = {"input_norm.weight": (D,), "self_attn.W_q": (D, Dq), "self_attn.W_k": (D, Dkv),
                 "self_attn.W_v": (D, Dkv), "self_attn.W_o": (Dq, D), "post_attention_norm.weight": (D,),
                 "mlp.W_gate": (D, F), "mlp.W_up": (D, F), "mlp.W_down": (F, D),
                 "self_attn.b_q": (Dq,), "self_attn.b_k": (Dkv,), "self_attn.b_v": (Dkv,),  # Qwen2's biases
                 "self_attn.q_norm.weight": (Dh,), "self_attn.k_norm.weight": (Dh,),  # Qwen3's norms
                 "pre_feedforward_norm.weight": (D,), "post_feedforward_norm.weight": (D,)}  # Gemma 3's
        outer = {"embed_tokens": (V, D), "norm.weight": (D,)}
    prefix = LAYER_PREFIX[config.family]
    shapes = {**outer, "lm_head.W": (D, V)}
    shapes.update({f"{prefix}.{i}.{n}": shape for i in range(config.num_layers) for n, shape in block.items()})
    return {n: shapes[n] for n in param_names(config)}


def gpt_neox_block_shapes(D, F) -> dict:
    """GPT-NeoX's block tensors' shapes (width D, MLP width F), keyed like its params."""
    norms = {f"{n}.{g}": (D,) for n in ("input_layernorm", "post_attention_layernorm") for g in ("gamma", "beta")}
    return {**norms, "attention.W_qkv": (D, 3 * D), "attention.b_qkv": (3 * D,), "attention.W_dense": (D, D),
            "attention.b_dense": (D,), "mlp.W_1": (D, F), "mlp.b_1": (F,), "mlp.W_2": (F, D), "mlp.b_2": (D,)}


def phi3_block_shapes(config) -> dict:
    """Phi-3's block tensors' shapes, keyed like its params."""
    D, F, Dq, Dkv = config.d_model, config.d_ff, config.num_heads * config.d_head, config.num_kv_heads * config.d_head
    return {"input_norm.weight": (D,), "self_attn.W_qkv": (D, Dq + 2 * Dkv), "self_attn.W_o": (Dq, D),
            "post_attention_norm.weight": (D,), "mlp.W_gate_up": (D, 2 * F), "mlp.W_down": (F, D)}


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
    optional = {n for n in names if n.rsplit(".", 1)[-1].startswith("b_")} if config.family == "gpt2" else set()
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
    1 and biases at 0 as the blocks' own initialisers."""
    rng = as_generator(seed)
    V, D = config.vocab_size, config.d_model
    params = {}
    if config.family == "gpt2":
        params["wte"] = (0.02 * rng.standard_normal((V, D))).astype(dtype)
        params["wpe"] = (0.01 * rng.standard_normal((config.max_positions, D))).astype(dtype)
    else:
        params[TOKEN_TABLE[config.family]] = (0.02 * rng.standard_normal((V, D))).astype(dtype)
    for i in range(config.num_layers):
        seed_i = int(rng.integers(2**31))
        if config.family == "gpt2":
            block = init_gpt2_block_params(D, config.num_heads, config.d_ff, seed=seed_i, dtype=dtype)
        elif config.family == "gpt_neox":
            block = init_gpt_neox_block_params(D, config.num_heads, config.d_ff, seed=seed_i, dtype=dtype)
        elif config.family in GEMMA:
            block = init_gemma_block_params(D, config.num_heads, config.d_ff, num_kv_heads=config.num_kv_heads,
                                            d_head=config.d_head, seed=seed_i, dtype=dtype, qk_norm=config.qk_norm)
        else:
            block = init_llama_block_params(D, config.num_heads, config.d_ff, num_kv_heads=config.num_kv_heads,
                                            seed=seed_i, dtype=dtype, qkv_bias=config.qkv_bias,
                                            qk_norm=config.qk_norm, d_head=config.d_head)
        if config.family == "phi3":  # Llama's weights, fused as Phi-3 stores them
            block = {"input_norm.weight": block["input_norm.weight"], "post_attention_norm.weight":
                     block["post_attention_norm.weight"], "self_attn.W_o": block["self_attn.W_o"],
                     "mlp.W_down": block["mlp.W_down"],
                     "self_attn.W_qkv": np.concatenate([block[f"self_attn.W_{n}"] for n in "qkv"], axis=1),
                     "mlp.W_gate_up": np.concatenate([block["mlp.W_gate"], block["mlp.W_up"]], axis=1)}
        params.update({f"{LAYER_PREFIX[config.family]}.{i}.{k}": v for k, v in block.items()})
    if config.family == "gpt2":
        params["ln_f.gamma"], params["ln_f.beta"] = np.ones(D, dtype), np.zeros(D, dtype)
    elif config.family == "gpt_neox":
        params["final_layer_norm.gamma"], params["final_layer_norm.beta"] = np.ones(D, dtype), np.zeros(D, dtype)
    elif config.family in GEMMA:
        params["norm.weight"] = np.zeros(D, dtype)  # Gemma's (1 + w) norm: w = 0 is the identity gain
    else:
        params["norm.weight"] = np.ones(D, dtype)
    if not config.tie_word_embeddings:
        params["lm_head.W"] = (0.02 * rng.standard_normal((D, V))).astype(dtype)
    return {name: params[name] for name in param_names(config) if name in params}
