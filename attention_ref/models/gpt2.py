"""GPT-2 as a whole language model: token ids to logits, and every gradient back.

Symbols: B batch (any leading axes), T positions, D width, V vocabulary, L layers.

Forward, numbered so the backward can walk it in reverse:

1. ``x = wte[ids] + wpe[0 .. T-1]``                     token and position embeddings (B, T, D)
2. ``x = Block_l(x)`` for l = 0 .. L-1                   causal; padding keys hidden by attention_mask
3. ``h = LayerNorm_f(x)``                                (B, T, D)
4. ``logits = h wte^T``                                  the head tied to the token table (B, T, V)

Backward: ``dh = dlogits wte``, ``dwte = dlogits^T h`` (the head's use), LayerNorm_f's
backward, the blocks in reverse, then the embeddings: ``dwte`` gets the scatter-add of the
lookup as well (the tied table's gradient is the sum of both uses), ``dwpe`` that of the
positions.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._checks import as_upstream
from ..core.linear import LinearCache
from ..fast.dispatch import linear_backward, linear_formula
from ..nn.embedding import embedding_backward, embedding_formula
from ..nn.encoder_block import ENCODER_GROUPS
from ..nn.gpt2_block import gpt2_block_backward, gpt2_block_formula
from ..nn.layer_norm import layer_norm_backward, layer_norm_formula
from ..nn.residual import split_params
from .config import LMConfig
from .params import add_head_gradient, block_params, check_lm_inputs, head_weight, param_names

__all__ = ["GPT2LMCache", "gpt2_lm_forward", "gpt2_lm_backward"]


class GPT2LMCache(NamedTuple):
    """The caches of the four steps, and what the backward needs to name the gradients."""

    config: LMConfig
    tok: object  # step 1, EmbeddingCache
    pos: object  # step 1
    blocks: list  # step 2, one GPT2BlockCache per layer
    ln_f: object  # step 3, LayerNormCache
    head: object  # step 4, LinearCache
    param_keys: tuple
    logits_shape: tuple
    dtype: np.dtype


def gpt2_lm_forward(ids, params, config: LMConfig, attention_mask=None):
    """Logits of a GPT-2 language model for the token ``ids`` (..., T).

    Parameters
    ----------
    ids : integer array (..., T), token ids in ``[0, vocab_size)``; positions 0 .. T-1
    params : dict with the keys of :func:`attention_ref.models.param_names` (GPT-2's)
    config : LMConfig with ``family="gpt2"``
    attention_mask : optional (..., T) of 0/1, 0 for padding: no query attends to a padding
        key (positions still count from 0, as transformers' forward without position_ids)

    Returns
    -------
    logits : array (..., T, V) in the params' dtype
    cache : GPT2LMCache for :func:`gpt2_lm_backward`
    """
    ids, params, mask = check_lm_inputs(ids, params, config, attention_mask)  # mask: (..., 1, T) or None
    T = ids.shape[-1]
    if T > config.max_positions:
        raise ValueError(f"ids has {T} positions, more than GPT-2's max_positions = {config.max_positions}")
    # everything is checked: the steps below are the formulas
    # 1. token and position embeddings
    tok, tok_cache = embedding_formula(ids, params["wte"])  # (..., T, D)
    pos, pos_cache = embedding_formula(np.arange(T), params["wpe"])  # (T, D)
    x = tok + pos  # (..., T, D)
    # 2. the blocks, causal, each with its own cache
    blocks = []
    for layer, scale in enumerate(config.head_scale):
        block = block_params(params, config, layer)
        x, cache = gpt2_block_formula(x, split_params(block, ENCODER_GROUPS), config.num_heads, eps=config.eps,
                                      mask=mask, scale=scale, param_keys=tuple(block))  # (..., T, D)
        blocks.append(cache)
    # 3. the final layer norm
    h, ln_f = layer_norm_formula(x, params["ln_f.gamma"], params["ln_f.beta"], config.eps)  # (..., T, D)
    # 4. the LM head: tied to the token table unless the config says otherwise
    W_head = head_weight(params, config)  # (D, V)
    logits, head = linear_formula(h, W_head, None), LinearCache(h, W_head, False)  # (..., T, V)
    keys = tuple(k for k in param_names(config) if params.get(k) is not None)
    return logits, GPT2LMCache(config, tok_cache, pos_cache, blocks, ln_f, head, keys,
                               logits.shape, logits.dtype)


def gpt2_lm_backward(dlogits, cache: GPT2LMCache):
    """Gradients of :func:`gpt2_lm_forward`: a dict keyed like the params."""
    config = cache.config
    dlogits = as_upstream(dlogits, cache.logits_shape, cache.dtype, "dlogits")
    g = {}
    # 4. logits = h W_head
    dh, dW_head, _ = linear_backward(dlogits, cache.head)  # (..., T, D), (D, V)
    # 3. h = LayerNorm_f(x)
    dx, g["ln_f.gamma"], g["ln_f.beta"] = layer_norm_backward(dh, cache.ln_f)  # (..., T, D)
    # 2. the blocks in reverse
    for layer in reversed(range(config.num_layers)):
        dx, block_grads = gpt2_block_backward(dx, cache.blocks[layer])  # (..., T, D)
        g.update({f"h.{layer}.{k}": v for k, v in block_grads.items()})
    # 1. x = wte[ids] + wpe[positions]: each table gets the scatter-add of its lookups
    g["wte"] = embedding_backward(dx, cache.tok)  # (V, D)
    g["wpe"] = embedding_backward(dx.reshape((-1,) + dx.shape[-2:]).sum(axis=0), cache.pos)  # (P, D)
    add_head_gradient(g, dW_head, config)  # tied: wte's gradient is the sum of its two uses
    return {k: g[k] for k in cache.param_keys if k in g}
