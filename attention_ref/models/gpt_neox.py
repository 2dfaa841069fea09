"""GPT-NeoX (Pythia) as a whole language model: token ids to logits, and every gradient back.

Symbols: B batch (any leading axes), T positions, D width, V vocabulary, L layers.

Forward, numbered so the backward can walk it in reverse:

1. ``x = embed_in[ids]``                                 (B, T, D); positions enter through RoPE
2. ``x = Block_l(x)`` for l = 0 .. L-1                   causal, partial RoPE at 0 .. T-1 on the first
                                                         ``rotary_dim`` features of each head,
                                                         parallel (or sequential) residual
3. ``h = LayerNorm_f(x)``                                (B, T, D), with bias
4. ``logits = h W_head``                                 W_head = lm_head.W (transformers' ``embed_out``),
                                                         or embed_in^T when tied

Backward: the four steps in reverse; the token table's gradient is the scatter-add of the
lookup (GPT-NeoX has no padding row), plus the head's ``dlogits^T h`` when tied.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._checks import as_upstream
from ..core.linear import LinearCache
from ..fast.dispatch import linear_backward, linear_formula
from ..nn.embedding import embedding_backward, embedding_formula
from ..nn.gpt_neox_block import gpt_neox_block_backward, gpt_neox_block_formula
from ..nn.layer_norm import layer_norm_backward, layer_norm_formula
from .config import LMConfig
from .params import add_head_gradient, block_params, check_lm_inputs, head_weight, param_names

__all__ = ["GPTNeoXLMCache", "gpt_neox_lm_forward", "gpt_neox_lm_backward"]


class GPTNeoXLMCache(NamedTuple):
    """The caches of the four steps, and what the backward needs to name the gradients."""

    config: LMConfig
    tok: object  # step 1, EmbeddingCache
    blocks: list  # step 2, one GPTNeoXBlockCache per layer
    norm: object  # step 3, LayerNormCache
    head: object  # step 4, LinearCache
    param_keys: tuple
    logits_shape: tuple
    dtype: np.dtype


def gpt_neox_lm_forward(ids, params, config: LMConfig, attention_mask=None):
    """Logits of a GPT-NeoX language model for the token ``ids`` (..., T).

    Parameters
    ----------
    ids : integer array (..., T), token ids in ``[0, vocab_size)``; positions 0 .. T-1
    params : dict with the keys of :func:`attention_ref.models.param_names` (GPT-NeoX's)
    config : LMConfig with ``family="gpt_neox"``
    attention_mask : optional (..., T) of 0/1, 0 for padding: no query attends to a padding key

    Returns
    -------
    logits : array (..., T, V) in the params' dtype
    cache : GPTNeoXLMCache for :func:`gpt_neox_lm_backward`
    """
    ids, params, mask = check_lm_inputs(ids, params, config, attention_mask)  # mask: (..., 1, T) or None
    # everything is checked: the steps below are the formulas
    # 1. token embeddings
    x, tok_cache = embedding_formula(ids, params["embed_in"])  # (..., T, D)
    # 2. the blocks, causal with partial RoPE, each with its own cache
    theta = config.rope_frequencies()  # (r/2,): the rotated features' frequencies
    blocks = []
    for layer in range(config.num_layers):
        x, block = gpt_neox_block_formula(x, block_params(params, config, layer), config.num_heads, eps=config.eps,
                                          mask=mask, theta=theta,
                                          parallel=config.use_parallel_residual)  # (..., T, D)
        blocks.append(block)
    # 3. the final layer norm
    h, norm = layer_norm_formula(x, params["final_layer_norm.gamma"], params["final_layer_norm.beta"],
                                 config.eps)  # (..., T, D)
    # 4. the LM head
    W_head = head_weight(params, config)  # (D, V)
    logits, head = linear_formula(h, W_head, None), LinearCache(h, W_head, False)  # (..., T, V)
    return logits, GPTNeoXLMCache(config, tok_cache, blocks, norm, head, param_names(config), logits.shape,
                                  logits.dtype)


def gpt_neox_lm_backward(dlogits, cache: GPTNeoXLMCache):
    """Gradients of :func:`gpt_neox_lm_forward`: a dict keyed like the params."""
    config = cache.config
    dlogits = as_upstream(dlogits, cache.logits_shape, cache.dtype, "dlogits")
    g = {}
    # 4. logits = h W_head
    dh, dW_head, _ = linear_backward(dlogits, cache.head)  # (..., T, D), (D, V)
    # 3. h = LayerNorm_f(x)
    dx, g["final_layer_norm.gamma"], g["final_layer_norm.beta"] = layer_norm_backward(dh, cache.norm)
    # 2. the blocks in reverse
    for layer in reversed(range(config.num_layers)):
        dx, block_grads = gpt_neox_block_backward(dx, cache.blocks[layer])  # (..., T, D)
        g.update({f"layers.{layer}.{k}": v for k, v in block_grads.items()})
    # 1. x = embed_in[ids]: the scatter-add of the lookup
    g["embed_in"] = embedding_backward(dx, cache.tok)  # (V, D)
    add_head_gradient(g, dW_head, config)  # tied: the table's gradient is the sum of its two uses
    return {k: g[k] for k in cache.param_keys}
