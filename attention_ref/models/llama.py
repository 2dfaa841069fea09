"""Llama as a whole language model: token ids to logits, and every gradient back.

Symbols: B batch (any leading axes), T positions, D width, V vocabulary, L layers.

Forward, numbered so the backward can walk it in reverse:

1. ``x = embed_tokens[ids]``                             (B, T, D); positions enter through RoPE
2. ``x = Block_l(x)`` for l = 0 .. L-1                   causal, RoPE at 0 .. T-1 (frequencies
                                                         scaled by ``config.rope_scaling``), grouped heads
3. ``h = RMSNorm_f(x)``                                  (B, T, D)
4. ``logits = h W_head``                                 W_head = lm_head.W, or embed_tokens^T when tied

Backward: the four steps in reverse; the token table's gradient is the scatter-add of the
lookup (the ``pad_token_id`` row gets none, as transformers' ``padding_idx``), plus the
head's ``dlogits^T h`` when tied.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._checks import as_upstream
from ..core.linear import LinearCache
from ..fast.dispatch import linear_backward, linear_formula
from ..nn.embedding import embedding_backward, embedding_formula
from ..nn.llama_block import llama_block_backward, llama_block_formula
from ..nn.rms_norm import rms_norm_backward, rms_norm_formula
from .config import LMConfig
from .params import add_head_gradient, block_params, check_lm_inputs, head_weight, param_names

__all__ = ["LlamaLMCache", "llama_lm_forward", "llama_lm_backward"]


class LlamaLMCache(NamedTuple):
    """The caches of the four steps, and what the backward needs to name the gradients."""

    config: LMConfig
    tok: object  # step 1, EmbeddingCache
    blocks: list  # step 2, one LlamaBlockCache per layer
    norm: object  # step 3, RMSNormCache
    head: object  # step 4, LinearCache
    param_keys: tuple
    logits_shape: tuple
    dtype: np.dtype


def llama_lm_forward(ids, params, config: LMConfig, attention_mask=None):
    """Logits of a Llama language model for the token ``ids`` (..., T).

    Parameters
    ----------
    ids : integer array (..., T), token ids in ``[0, vocab_size)``; positions 0 .. T-1
    params : dict with the keys of :func:`attention_ref.models.param_names` (Llama's)
    config : LMConfig with ``family`` one of :data:`attention_ref.models.config.LLAMA_LIKE`
    attention_mask : optional (..., T) of 0/1, 0 for padding: no query attends to a padding key

    Returns
    -------
    logits : array (..., T, V) in the params' dtype
    cache : LlamaLMCache for :func:`llama_lm_backward`
    """
    ids, params, mask = check_lm_inputs(ids, params, config, attention_mask)  # mask: (..., 1, T) or None
    # everything is checked: the steps below are the formulas
    # 1. token embeddings (the pad row is read like any other; it gets no gradient)
    x, tok_cache = embedding_formula(ids, params["embed_tokens"], config.pad_token_id)  # (..., T, D)
    # 2. the blocks, causal with RoPE, each with its own cache
    theta = config.rope_frequencies()  # (Dh/2,): RoPE's frequencies, Llama 3.x's scaled ones
    blocks = []
    for layer in range(config.num_layers):
        x, block = llama_block_formula(x, block_params(params, config, layer), config.num_heads, config.num_kv_heads,
                                       rope_base=config.rope_theta, eps=config.eps, mask=mask,
                                       scale=None, theta=theta, window=config.sliding_window)  # (..., T, D)
        blocks.append(block)
    # 3. the final RMSNorm
    h, norm = rms_norm_formula(x, params["norm.weight"], config.eps)  # (..., T, D)
    # 4. the LM head
    W_head = head_weight(params, config)  # (D, V)
    logits, head = linear_formula(h, W_head, None), LinearCache(h, W_head, False)  # (..., T, V)
    return logits, LlamaLMCache(config, tok_cache, blocks, norm, head, param_names(config), logits.shape,
                                logits.dtype)


def llama_lm_backward(dlogits, cache: LlamaLMCache):
    """Gradients of :func:`llama_lm_forward`: a dict keyed like the params."""
    config = cache.config
    dlogits = as_upstream(dlogits, cache.logits_shape, cache.dtype, "dlogits")
    g = {}
    # 4. logits = h W_head
    dh, dW_head, _ = linear_backward(dlogits, cache.head)  # (..., T, D), (D, V)
    # 3. h = RMSNorm_f(x)
    dx, g["norm.weight"] = rms_norm_backward(dh, cache.norm)  # (..., T, D)
    # 2. the blocks in reverse
    for layer in reversed(range(config.num_layers)):
        dx, block_grads = llama_block_backward(dx, cache.blocks[layer])  # (..., T, D)
        g.update({f"layers.{layer}.{k}": v for k, v in block_grads.items()})
    # 1. x = embed_tokens[ids]: the scatter-add of the lookup
    g["embed_tokens"] = embedding_backward(dx, cache.tok)  # (V, D)
    add_head_gradient(g, dW_head, config)  # tied: the table's gradient is the sum of its two uses
    return {k: g[k] for k in cache.param_keys}
