"""Gemma 2 and Gemma 3 (text) as whole language models: token ids to logits, and every gradient back.

Symbols: B batch (any leading axes), T positions, D width, V vocabulary, L layers.

Forward, numbered so the backward can walk it in reverse:

1. ``e = embed_tokens[ids]``                             (B, T, D)
2. ``x = e * sqrt(D)``                                   the normaliser rounded to the params' dtype
                                                         (float32: as transformers; float64: exact,
                                                         where transformers keeps a float32-rounded
                                                         buffer, see :mod:`attention_ref.interop.float64`)
3. ``x = Block_l(x)`` for l = 0 .. L-1                   :mod:`attention_ref.nn.gemma_block`; sliding
                                                         layers: window W, RoPE base
                                                         ``rope_local_base_freq``; global layers: every
                                                         earlier key, ``rope_theta`` (and its scaling)
4. ``h = GRMS_f(x)``                                     ``(1 + w) * x / rms(x)``
5. ``z = h W_head``                                      W_head = embed_tokens^T (tied, Gemma's default)
                                                         or lm_head.W
6. ``logits = cap tanh(z / cap)``                        Gemma 2's ``final_logit_softcapping`` (when set)

Gemma 2's blocks soft-cap their attention scores (``attn_logit_softcapping``) and have no q/k
norms; one RoPE base serves both kinds of layer.

Backward: the steps in reverse; step 6's is ``dz = dlogits (1 - t^2)``, ``t = tanh(z / cap)``;
step 2's gradient is ``de = dx * sqrt(D)``; the token table's gradient is the scatter-add of
the lookup (the ``pad_token_id`` row gets none), plus the head's ``(h^T dz)^T`` when tied.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .._checks import as_upstream
from ..core.linear import LinearCache
from ..fast.dispatch import linear_backward, linear_formula
from ..nn.embedding import embedding_backward, embedding_formula
from ..nn.gemma_block import gemma_block_backward, gemma_block_formula
from ..nn.rms_norm import rms_norm_backward, rms_norm_formula
from .config import LMConfig
from .params import add_head_gradient, block_params, check_lm_inputs, head_weight, param_names

__all__ = ["GemmaLMCache", "gemma_lm_forward", "gemma_lm_backward", "embedding_normalizer", "final_soft_cap"]


class GemmaLMCache(NamedTuple):
    """The caches of the five steps, and what the backward needs to name the gradients."""

    config: LMConfig
    tok: object  # step 1, EmbeddingCache
    normalizer: np.ndarray  # step 2, sqrt(D) in the params' dtype
    blocks: list  # step 3, one GemmaBlockCache per layer
    norm: object  # step 4, RMSNormCache (gain 1 + w)
    head: object  # step 5, LinearCache
    t: np.ndarray | None  # step 6, tanh(z / cap), or None without a final cap
    param_keys: tuple
    logits_shape: tuple
    dtype: np.dtype


def embedding_normalizer(config: LMConfig, dtype) -> np.ndarray:
    """Step 2's factor ``sqrt(D)`` as a scalar of ``dtype`` (rounded to it, as transformers casts
    its normaliser to the hidden states' dtype)."""
    return np.asarray(math.sqrt(config.d_model), dtype=dtype)


def gemma_lm_forward(ids, params, config: LMConfig, attention_mask=None):
    """Logits of a Gemma 2 or Gemma 3 text model for the token ``ids`` (..., T).

    Parameters
    ----------
    ids : integer array (..., T), token ids in ``[0, vocab_size)``; positions 0 .. T-1
    params : dict with the keys of :func:`attention_ref.models.param_names` (Gemma 3's)
    config : LMConfig with ``family`` ``"gemma2"`` or ``"gemma3_text"``
    attention_mask : optional (..., T) of 0/1, 0 for padding: no query attends to a padding key

    Returns
    -------
    logits : array (..., T, V) in the params' dtype
    cache : GemmaLMCache for :func:`gemma_lm_backward`
    """
    ids, params, mask = check_lm_inputs(ids, params, config, attention_mask)  # mask: (..., 1, T) or None
    # everything is checked: the steps below are the formulas
    # 1. token embeddings (the pad row is read like any other; it gets no gradient)
    e, tok_cache = embedding_formula(ids, params["embed_tokens"], config.pad_token_id)  # (..., T, D)
    # 2. times sqrt(D)
    normalizer = embedding_normalizer(config, e.dtype)
    x = e * normalizer  # (..., T, D)
    # 3. the blocks: sliding or global, each with its RoPE frequencies
    blocks = []
    for layer, ((theta, window), scale) in enumerate(zip(config.gemma_layers(), config.head_scale)):
        x, block = gemma_block_formula(x, block_params(params, config, layer), config.num_heads, config.num_kv_heads,
                                       eps=config.eps, mask=mask, scale=scale, theta=theta, window=window,
                                       cap=config.attn_softcap)
        blocks.append(block)
    # 4. the final (1 + w) RMSNorm
    h, norm = rms_norm_formula(x, 1.0 + params["norm.weight"], config.eps)  # (..., T, D)
    # 5. the LM head
    W_head = head_weight(params, config)  # (D, V)
    logits, head = linear_formula(h, W_head, None), LinearCache(h, W_head, False)  # (..., T, V)
    # 6. Gemma 2's final soft cap
    logits, t = final_soft_cap(logits, config)
    return logits, GemmaLMCache(config, tok_cache, normalizer, blocks, norm, head, t, param_names(config),
                                logits.shape, logits.dtype)


def final_soft_cap(z, config: LMConfig):
    """Step 6: ``(cap * t, t)`` with ``t = tanh(z / cap)`` for Gemma 2's ``final_softcap``, else
    ``(z, None)``."""
    if config.final_softcap is None:
        return z, None
    cap = float(config.final_softcap)  # a Python float: float32 stays float32
    t = np.tanh(z / cap)  # (..., V); tanh saturates, never overflows
    return cap * t, t


def gemma_lm_backward(dlogits, cache: GemmaLMCache):
    """Gradients of :func:`gemma_lm_forward`: a dict keyed like the params."""
    config = cache.config
    dlogits = as_upstream(dlogits, cache.logits_shape, cache.dtype, "dlogits")
    g = {}
    # 6. logits = cap tanh(z / cap): dz = dlogits (1 - t^2)
    dz = dlogits if cache.t is None else dlogits * (1.0 - cache.t * cache.t)  # (..., T, V)
    # 5. z = h W_head
    dh, dW_head, _ = linear_backward(dz, cache.head)  # (..., T, D), (D, V)
    # 4. h = GRMS_f(x): dw is the gain's gradient
    dx, g["norm.weight"] = rms_norm_backward(dh, cache.norm)  # (..., T, D)
    # 3. the blocks in reverse
    for layer in reversed(range(config.num_layers)):
        dx, block_grads = gemma_block_backward(dx, cache.blocks[layer])  # (..., T, D)
        g.update({f"layers.{layer}.{k}": v for k, v in block_grads.items()})
    # 2. x = e * sqrt(D)
    de = dx * cache.normalizer  # (..., T, D)
    # 1. e = embed_tokens[ids]: the scatter-add of the lookup
    g["embed_tokens"] = embedding_backward(de, cache.tok)  # (V, D)
    add_head_gradient(g, dW_head, config)  # tied: the table's gradient is the sum of its two uses
    return {k: g[k] for k in cache.param_keys}
