"""Phi-3 (transformers' ``Phi3ForCausalLM``): Llama with its projections fused, and a sliding window.

The difference from :mod:`.llama`: the params keep transformers' two fused weights,
``self_attn.W_qkv`` (D, (H + 2 Hkv) Dh), columns ``[q | k | v]`` (``qkv_proj``), and
``mlp.W_gate_up`` (D, 2 F), columns ``[gate | up]`` (``gate_up_proj``). Step 2 starts with

0. ``(W_q, W_k, W_v) = split(W_qkv)`` (:mod:`attention_ref.nn.fused_qkv`, the ``"blocks"``
   layout), ``(W_gate, W_up) = split(W_gate_up)`` (two equal halves), once per run,

then runs Llama's six steps; the backward puts the pieces' gradients side by side. Mistral's
sliding window when ``sliding_window`` is set. Its 128k models' ``longrope`` (4.x: ``su``,
``yarn``) and a ``partial_rotary_factor`` other than 1 are refused by name.
"""
from __future__ import annotations

import numpy as np

from ...nn.fused_qkv import fused_qkv_split_backward, fused_qkv_split_formula
from ...nn.llama_block import init_llama_block_params, llama_block_backward
from ..config import refuse
from ..family import COMPUTED, DROPOUT, NEUTRAL, Features, Tensor
from ..trace_steps import SEPARATOR, grouped_attention_steps, linear_output
from .llama import FAMILY as LLAMA, llama_block, one_value, rope_spellings

__all__ = ["FAMILY", "phi3_block_as_llama", "phi3_block_shapes", "PHI3_PARAM_NAMES"]

MODEL_TYPE = "phi3"


def read(d):
    rope, _ = rope_spellings(d, MODEL_TYPE)  # 4.x's and 5.x's spellings; a conflict refused naming both
    pct = one_value(MODEL_TYPE, [("partial_rotary_factor", d.get("partial_rotary_factor")),  # 4.x: its own field
                                 ("rope_parameters.partial_rotary_factor", rope.get("partial_rotary_factor"))], 1.0)
    if pct != 1.0:
        refuse("partial_rotary_factor" if "partial_rotary_factor" in d else "the RoPE partial_rotary_factor", pct,
               MODEL_TYPE)
    rope_type = rope["rope_type"]
    if rope_type != "default":
        refuse("the RoPE scaling rope_type", rope_type, MODEL_TYPE)  # "longrope" (128k models), "su", "yarn"
    return LLAMA.read(d, MODEL_TYPE, eps=d.get("rms_norm_eps", 1e-5))  # Phi3Config's default


def _q(c):
    return c.num_heads * c.d_head


def _kv(c):
    return c.num_kv_heads * c.d_head


BLOCK = (
    Tensor(("input_norm.weight",), "input_layernorm.weight", "as is", lambda c: (c.d_model,), "ones"),
    Tensor(("self_attn.W_qkv",), "self_attn.qkv_proj.weight", "transpose",  # [q | k | v] kept fused
           lambda c: (c.d_model, _q(c) + 2 * _kv(c))),
    Tensor(("self_attn.W_o",), "self_attn.o_proj.weight", "transpose", lambda c: (_q(c), c.d_model)),
    Tensor(("post_attention_norm.weight",), "post_attention_layernorm.weight", "as is", lambda c: (c.d_model,),
           "ones"),
    Tensor(("mlp.W_gate_up",), "mlp.gate_up_proj.weight", "transpose",  # [gate | up] kept fused
           lambda c: (c.d_model, 2 * c.d_ff)),
    Tensor(("mlp.W_down",), "mlp.down_proj.weight", "transpose", lambda c: (c.d_ff, c.d_model)),
)
#: Phi-3's block names: Llama's with the q, k, v projections fused, and the MLP's gate and up
PHI3_PARAM_NAMES = tuple(t.ours[0] for t in BLOCK)


def phi3_block_shapes(config) -> dict:
    """Phi-3's block tensors' shapes, keyed like its params."""
    return {t.ours[0]: t.shape(config) for t in BLOCK}


def phi3_block_as_llama(p, config):
    """Step 2.0's splits: a Phi-3 block's params under Llama's block names (``W_q``, ``W_k``, ``W_v``
    from ``W_qkv``, ``W_gate``, ``W_up`` from ``W_gate_up``), and the QKV split's cache."""
    (W_q, W_k, W_v), qkv = fused_qkv_split_formula(p["self_attn.W_qkv"], config.num_heads, config.num_kv_heads,
                                                   config.features.fused_qkv)  # (D, H Dh), (D, Hkv Dh), (D, Hkv Dh)
    W_gate, W_up = np.split(p["mlp.W_gate_up"], 2, axis=-1)  # (D, F) each
    return {"input_norm.weight": p["input_norm.weight"], "self_attn.W_q": W_q, "self_attn.W_k": W_k,
            "self_attn.W_v": W_v, "self_attn.W_o": p["self_attn.W_o"],
            "post_attention_norm.weight": p["post_attention_norm.weight"], "mlp.W_gate": W_gate, "mlp.W_up": W_up,
            "mlp.W_down": p["mlp.W_down"]}, qkv


def block(x, prepared, config, layer, mask, positions, kv):
    """Step 2 on the split weights: Llama's block (:func:`.llama.llama_block`)."""
    p, qkv = prepared
    y, cache = llama_block(x, p, config, layer, mask, positions, kv)
    return y, (None if cache is None else (cache, qkv))


def block_backward(dy, cache):
    """Llama's block backward, then the splits' backward: the pieces' gradients side by side."""
    block_cache, qkv = cache
    dx, g = llama_block_backward(dy, block_cache)
    return dx, {"input_norm.weight": g["input_norm.weight"],
                "self_attn.W_qkv": fused_qkv_split_backward((g["self_attn.W_q"], g["self_attn.W_k"],
                                                             g["self_attn.W_v"]), qkv),  # (D, (H + 2 Hkv) Dh)
                "self_attn.W_o": g["self_attn.W_o"], "post_attention_norm.weight": g["post_attention_norm.weight"],
                "mlp.W_gate_up": np.concatenate([g["mlp.W_gate"], g["mlp.W_up"]], axis=-1),  # (D, 2 F)
                "mlp.W_down": g["mlp.W_down"]}


def trace_block(cache, prepared, config):
    """The trace of one ``Phi3DecoderLayer`` (after ``model.layers.<i>.``), from Llama's block caches:
    the fused ``qkv_proj`` is ``[q | k | v]``, ``gate_up_proj`` is ``[gate | up]``."""
    attn, mlp = cache[0].attn, cache[0].mlp  # (Llama's block cache, the QKV split's)
    qkv = np.concatenate([linear_output(attn.q_proj), linear_output(attn.k_proj), linear_output(attn.v_proj)],
                         axis=-1)  # (..., T, (H + 2 Hkv) Dh)
    a = linear_output(attn.o_proj)  # (..., T, D)
    m = linear_output(mlp.down)  # (..., T, D)
    return ([("input_layernorm", attn.q_proj.x), ("self_attn.qkv_proj", qkv)]
            + [(f"self_attn{SEPARATOR}{step}", value) for step, value in grouped_attention_steps(attn)]
            + [("self_attn.o_proj", a), ("self_attn", a), ("post_attention_layernorm", mlp.gate.x),
               ("mlp.gate_up_proj", np.concatenate([mlp.a, mlp.u], axis=-1)), ("mlp.activation_fn", mlp.a * mlp.sig),
               ("mlp.down_proj", m), ("mlp", m)])


def init_block(config, seed, dtype):
    """Llama's random weights, fused as Phi-3 stores them."""
    b = init_llama_block_params(config.d_model, config.num_heads, config.d_ff, num_kv_heads=config.num_kv_heads,
                                seed=seed, dtype=dtype, d_head=config.d_head)
    return {"input_norm.weight": b["input_norm.weight"], "post_attention_norm.weight": b["post_attention_norm.weight"],
            "self_attn.W_o": b["self_attn.W_o"], "mlp.W_down": b["mlp.W_down"],
            "self_attn.W_qkv": np.concatenate([b[f"self_attn.W_{n}"] for n in "qkv"], axis=1),
            "mlp.W_gate_up": np.concatenate([b["mlp.W_gate"], b["mlp.W_up"]], axis=1)}


#: Phi3Config's keys: Llama's, its dropouts, its window (computed), its partial rotation (refused but at 1) and
#: original_max_position_embeddings (read only by longrope, which is refused)
KEYS = {**LLAMA.keys, "embd_pdrop": DROPOUT, "resid_pdrop": DROPOUT, "sliding_window": COMPUTED,
        "partial_rotary_factor": COMPUTED, "original_max_position_embeddings": NEUTRAL}

FAMILY = LLAMA._replace(
    model_type=MODEL_TYPE, read=read, keys=KEYS, features=Features(fused_projections=True, fused_qkv="blocks"),
    fields=LLAMA.fields._replace(flags=("tie_word_embeddings",), numbers=("rms_norm_eps", "rope_theta",
                                                                          "partial_rotary_factor")),
    allowed=LLAMA.allowed + ("sliding_window",), block=BLOCK,
    block_title="transformers Phi3DecoderLayer (layers.<i>.)",
    prepare=phi3_block_as_llama, block_forward=block, block_backward=block_backward, init_block=init_block,
    float32_steps=(("phi3", "Phi3"),), trace_block=trace_block)

FAMILY = FAMILY._replace(example={**LLAMA.example, "sliding_window": None})  # a small model
