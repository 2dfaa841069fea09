"""Phi-3 as a whole language model: Llama with its projections fused, token ids to logits and back.

Symbols: B batch (any leading axes), T positions, D width, V vocabulary, L layers, H query heads,
Hkv key/value heads, Dh head width, F the MLP's hidden width.

Phi-3 is Llama's block (RMSNorm, RoPE, grouped heads, SwiGLU, no biases; Mistral's sliding window
when ``sliding_window`` is set) with two fused weights, kept fused in the params as transformers
stores them: ``self_attn.W_qkv`` (D, (H + 2 Hkv) Dh), columns ``[q | k | v]`` (``qkv_proj``), and
``mlp.W_gate_up`` (D, 2 F), columns ``[gate | up]`` (``gate_up_proj``).

Forward, numbered so the backward can walk it in reverse:

1. ``x = embed_tokens[ids]``                             (B, T, D)
2. for each layer: ``(W_q, W_k, W_v) = split(W_qkv)`` (:mod:`attention_ref.nn.fused_qkv`, the
   ``"blocks"`` layout), ``(W_gate, W_up) = split(W_gate_up)`` (two equal halves), then
   ``x = LlamaBlock(x)`` with those weights               (B, T, D)
3. ``h = RMSNorm_f(x)``                                  (B, T, D)
4. ``logits = h W_head``                                 W_head = lm_head.W, or embed_tokens^T when tied

Backward: the four steps in reverse; each split is a permutation of columns, so its backward
puts the pieces' gradients back side by side: ``dW_qkv = [dW_q | dW_k | dW_v]``,
``dW_gate_up = [dW_gate | dW_up]``: the gradients are the fused parameters', the ones an
optimiser steps. The ``pad_token_id`` row of the table gets no gradient, as Llama's.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._checks import as_upstream
from ..core.linear import LinearCache
from ..fast.dispatch import linear_backward, linear_formula
from ..nn.embedding import embedding_backward, embedding_formula
from ..nn.fused_qkv import fused_qkv_split_backward, fused_qkv_split_formula
from ..nn.llama_block import llama_block_backward, llama_block_formula
from ..nn.rms_norm import rms_norm_backward, rms_norm_formula
from .config import LMConfig
from .params import add_head_gradient, block_params, check_lm_inputs, head_weight, param_names

__all__ = ["Phi3LMCache", "phi3_lm_forward", "phi3_lm_backward", "phi3_block_as_llama"]


class Phi3LMCache(NamedTuple):
    """The caches of the four steps (each layer's with its QKV split's), and the gradients' names."""

    config: LMConfig
    tok: object  # step 1, EmbeddingCache
    blocks: list  # step 2, one (LlamaBlockCache, FusedQKVCache) per layer
    norm: object  # step 3, RMSNormCache
    head: object  # step 4, LinearCache
    param_keys: tuple
    logits_shape: tuple
    dtype: np.dtype


def phi3_block_as_llama(p, config: LMConfig):
    """Step 2's splits: a Phi-3 block's params under Llama's block names (``W_q``, ``W_k``, ``W_v``
    from ``W_qkv``, ``W_gate``, ``W_up`` from ``W_gate_up``), and the QKV split's cache."""
    (W_q, W_k, W_v), qkv = fused_qkv_split_formula(p["self_attn.W_qkv"], config.num_heads, config.num_kv_heads,
                                                   "blocks")  # (D, H Dh), (D, Hkv Dh), (D, Hkv Dh)
    W_gate, W_up = np.split(p["mlp.W_gate_up"], 2, axis=-1)  # (D, F) each
    return {"input_norm.weight": p["input_norm.weight"], "self_attn.W_q": W_q, "self_attn.W_k": W_k,
            "self_attn.W_v": W_v, "self_attn.W_o": p["self_attn.W_o"],
            "post_attention_norm.weight": p["post_attention_norm.weight"], "mlp.W_gate": W_gate, "mlp.W_up": W_up,
            "mlp.W_down": p["mlp.W_down"]}, qkv


def _fused_gradients(g, qkv):
    """The splits' backward: Llama's block gradients ``g`` as the fused params' (columns side by side)."""
    return {"input_norm.weight": g["input_norm.weight"],
            "self_attn.W_qkv": fused_qkv_split_backward((g["self_attn.W_q"], g["self_attn.W_k"], g["self_attn.W_v"]),
                                                        qkv),  # (D, (H + 2 Hkv) Dh)
            "self_attn.W_o": g["self_attn.W_o"], "post_attention_norm.weight": g["post_attention_norm.weight"],
            "mlp.W_gate_up": np.concatenate([g["mlp.W_gate"], g["mlp.W_up"]], axis=-1),  # (D, 2 F)
            "mlp.W_down": g["mlp.W_down"]}


def phi3_lm_forward(ids, params, config: LMConfig, attention_mask=None):
    """Logits of a Phi-3 language model for the token ``ids`` (..., T).

    Parameters
    ----------
    ids : integer array (..., T), token ids in ``[0, vocab_size)``; positions 0 .. T-1
    params : dict with the keys of :func:`attention_ref.models.param_names` (Phi-3's, fused)
    config : LMConfig with ``family="phi3"``
    attention_mask : optional (..., T) of 0/1, 0 for padding: no query attends to a padding key

    Returns
    -------
    logits : array (..., T, V) in the params' dtype
    cache : Phi3LMCache for :func:`phi3_lm_backward`
    """
    ids, params, mask = check_lm_inputs(ids, params, config, attention_mask)  # mask: (..., 1, T) or None
    # everything is checked: the steps below are the formulas
    # 1. token embeddings (the pad row is read like any other; it gets no gradient)
    x, tok_cache = embedding_formula(ids, params["embed_tokens"], config.pad_token_id)  # (..., T, D)
    # 2. the splits, then Llama's block, causal with RoPE (and the sliding window when set)
    theta = config.rope_frequencies()  # (Dh/2,)
    blocks = []
    for layer in range(config.num_layers):
        p, qkv = phi3_block_as_llama(block_params(params, config, layer), config)
        x, block = llama_block_formula(x, p, config.num_heads, config.num_kv_heads, rope_base=config.rope_theta,
                                       eps=config.eps, mask=mask, scale=None, theta=theta,
                                       window=config.sliding_window)  # (..., T, D)
        blocks.append((block, qkv))
    # 3. the final RMSNorm
    h, norm = rms_norm_formula(x, params["norm.weight"], config.eps)  # (..., T, D)
    # 4. the LM head
    W_head = head_weight(params, config)  # (D, V)
    logits, head = linear_formula(h, W_head, None), LinearCache(h, W_head, False)  # (..., T, V)
    return logits, Phi3LMCache(config, tok_cache, blocks, norm, head, param_names(config), logits.shape,
                               logits.dtype)


def phi3_lm_backward(dlogits, cache: Phi3LMCache):
    """Gradients of :func:`phi3_lm_forward`: a dict keyed like the params (the fused weights' own)."""
    config = cache.config
    dlogits = as_upstream(dlogits, cache.logits_shape, cache.dtype, "dlogits")
    g = {}
    # 4. logits = h W_head
    dh, dW_head, _ = linear_backward(dlogits, cache.head)  # (..., T, D), (D, V)
    # 3. h = RMSNorm_f(x)
    dx, g["norm.weight"] = rms_norm_backward(dh, cache.norm)  # (..., T, D)
    # 2. the blocks in reverse, then each split's backward (the pieces' gradients side by side)
    for layer in reversed(range(config.num_layers)):
        block, qkv = cache.blocks[layer]
        dx, block_grads = llama_block_backward(dx, block)  # (..., T, D)
        g.update({f"layers.{layer}.{k}": v for k, v in _fused_gradients(block_grads, qkv).items()})
    # 1. x = embed_tokens[ids]: the scatter-add of the lookup
    g["embed_tokens"] = embedding_backward(dx, cache.tok)  # (V, D)
    add_head_gradient(g, dW_head, config)  # tied: the table's gradient is the sum of its two uses
    return {k: g[k] for k in cache.param_keys}
