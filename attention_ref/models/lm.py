"""The whole language model, written once over the family modules: :func:`lm_forward`,
:func:`lm_backward` and :func:`lm_loss` (transformers' ``labels=`` loss on top); the decoder
(:mod:`.generate`) runs the same steps with a key/value cache per layer (:func:`run_steps`).

Symbols: B batch (any leading axes), T positions, D width, V vocabulary, L layers.

Forward, numbered so the backward can walk it in reverse; each step is a hook of the config's
family (:class:`attention_ref.models.family.Family`), the transformers module it computes in
brackets:

1. ``x = embed(ids, positions)``          (B, T, D)  ``model.embed_tokens`` (GPT-2: ``wte`` + ``wpe``)
2. ``x = block_l(x)`` for l = 0 .. L-1    (B, T, D)  ``model.layers.<l>``, the family's numbered steps
3. ``h = final_norm(x)``                  (B, T, D)  ``model.norm``
4. ``z = h W_head``                       (B, T, V)  ``lm_head`` (the token table transposed when tied)
5. ``logits = cap(z)``                    (B, T, V)  Gemma 2's final soft cap; the identity elsewhere

Backward: the five steps in reverse; the head's gradient is added to the token table's when tied.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._checks import as_upstream
from ..core.linear import LinearCache
from ..fast.dispatch import linear_backward, linear_formula
from ..nn.cross_entropy import cross_entropy_backward, cross_entropy_forward, next_token_targets
from .config import LMConfig, family_of
from .params import block_params, check_lm_inputs, head_weight, param_names

__all__ = ["LMCache", "lm_forward", "lm_backward", "lm_loss", "run_steps", "prepared_blocks", "step_modules"]



def step_modules(config: LMConfig) -> dict:
    """Each step's transformers module name for ``config``'s family, read from its parameter
    table (a trace of every step's output can name it so): ``{"embed": "model.embed_tokens",
    "block": ["model.layers.0", ...], "final_norm": "model.norm", "head": "lm_head"}``."""
    family = family_of(config)
    module = lambda tensor: tensor.theirs.rsplit(".", 1)[0]  # noqa: E731  (the module holding the weight)
    return {"embed": module(family.top[0]), "block": [family.their_layer.format(i=i).rstrip(".")
                                                        for i in range(config.num_layers)],
            "final_norm": module(family.final[0]), "head": "lm_head"}


class LMCache(NamedTuple):
    """The caches of the five steps, and what the backward needs to name the gradients."""

    config: LMConfig
    embed: object  # step 1, the family's embedding cache
    blocks: list  # step 2, one block cache per layer
    norm: object  # step 3
    head: object  # step 4, LinearCache
    cap: object  # step 5, or None
    param_keys: tuple
    logits_shape: tuple
    dtype: np.dtype


def _check_config(config):
    if not isinstance(config, LMConfig):
        raise TypeError(f"config must be an LMConfig (attention_ref.LMConfig.from_dict(config.json)),"
                        f" got {type(config).__name__}")


def prepared_blocks(params: dict, config: LMConfig) -> list:
    """Each layer's params as its family's block takes them (fused weights split once)."""
    family = family_of(config)
    return [family.prepare(block_params(params, config, layer), config) for layer in range(config.num_layers)]


def run_steps(ids, positions, params, config: LMConfig, mask, *, blocks=None, layers=None, kv=None,
              last_only=False, record=None, head=None):
    """Steps 1-5 on checked inputs: ``ids`` (..., t) at ``positions`` ((t,) in a forward, (B, t)
    when decoding), ``mask`` None or (..., 1, T_seen); ``blocks`` and ``layers`` as
    :func:`prepared_blocks` and the family's ``layers`` give them (computed when None); ``head`` the LM
    head's weight (D, V) as :func:`attention_ref.models.params.head_weight` gives it, or a copy of it
    (the decoder's, laid out for its matrix-vector products); ``kv`` a
    :class:`KVCache` per layer when decoding (then the block caches are None). With
    ``last_only`` steps 3-5 see the last position only; ``record``, when given, is called with the
    residual stream after step 1 and after each block (:func:`attention_ref.models.lm_trace`).
    Returns ``(logits, caches)``."""
    family = family_of(config)
    blocks = prepared_blocks(params, config) if blocks is None else blocks
    layers = family.layers(config) if layers is None else layers
    # 1. embeddings
    x, embed = family.embed(ids, positions, params, config)  # (..., t, D)
    if record is not None:
        record(x)
    # 2. the blocks, each with its own cache (or its KVCache when decoding)
    caches = []
    for layer in range(config.num_layers):
        x, cache = family.block_forward(x, blocks[layer], config, layers[layer], mask, positions,
                                        None if kv is None else kv[layer])  # (..., t, D)
        caches.append(cache)
        if record is not None:
            record(x)
    x = x[..., -1:, :] if last_only else x  # (..., 1, D) with last_only
    # 3. the final norm
    h, norm = family.final_norm(x, params, config)  # (..., t, D)
    # 4. the LM head
    W_head = head_weight(params, config) if head is None else head  # (D, V)
    z = linear_formula(h, W_head, None)  # (..., t, V)
    # 5. the logits' cap (Gemma 2)
    logits, cap = (z, None) if family.logits is None else family.logits(z, config)
    return logits, (embed, caches, norm, LinearCache(h, W_head, False), cap)


def lm_forward(ids, params, config: LMConfig, attention_mask=None):
    """Logits (..., T, V) of the config's model for the token ``ids`` (..., T), positions 0 .. T-1,
    and the cache for :func:`lm_backward`.

    Parameters
    ----------
    ids : integer array (..., T), token ids in ``[0, vocab_size)``
    params : dict with the keys of :func:`attention_ref.models.param_names`
    config : LMConfig
    attention_mask : optional (..., T) of 0/1, 0 for padding: no query attends to a padding key
        (positions still count from 0, as transformers' forward without position_ids)
    """
    _check_config(config)
    ids, params, mask = check_lm_inputs(ids, params, config, attention_mask)  # mask: (..., 1, T) or None
    # everything is checked: the steps are the formulas
    logits, (embed, blocks, norm, head, cap) = run_steps(ids, np.arange(ids.shape[-1]), params, config, mask)
    keys = tuple(k for k in param_names(config) if params.get(k) is not None)
    return logits, LMCache(config, embed, blocks, norm, head, cap, keys, logits.shape, logits.dtype)


def lm_backward(dlogits, cache):
    """Gradients of :func:`lm_forward`: a dict with the keys and shapes of the params."""
    if not isinstance(cache, LMCache):
        raise TypeError(f"cache must be what lm_forward returned, got {type(cache).__name__}")
    config = cache.config
    family = family_of(config)
    dlogits = as_upstream(dlogits, cache.logits_shape, cache.dtype, "dlogits")
    g = {}
    # 5. logits = cap(z)
    dz = dlogits if family.logits_backward is None else family.logits_backward(dlogits, cache.cap)  # (..., T, V)
    # 4. z = h W_head
    dh, dW_head, _ = linear_backward(dz, cache.head)  # (..., T, D), (D, V)
    # 3. h = final_norm(x)
    dx, norm_grads = family.final_norm_backward(dh, cache.norm)  # (..., T, D)
    g.update(norm_grads)
    # 2. the blocks in reverse
    for layer in reversed(range(config.num_layers)):
        dx, block_grads = family.block_backward(dx, cache.blocks[layer])  # (..., T, D)
        g.update({f"{family.layer_prefix}.{layer}.{k}": v for k, v in block_grads.items()})
    # 1. x = embed(ids): the scatter-add of the lookups; tied, into the head's gradient of the
    # table (dW_head.T, (V, D)): the table's gradient is the sum of its two uses
    table_grad = np.ascontiguousarray(dW_head.T) if config.tie_word_embeddings else None  # (V, D), no copy when C
    g.update(family.embed_backward(dx, cache.embed, config, table_grad))
    if not config.tie_word_embeddings:
        g["lm_head.W"] = dW_head
    return {k: g[k] for k in cache.param_keys if k in g}


def lm_loss(ids, params, config: LMConfig, attention_mask=None):
    """Next-token loss and every gradient: ``(loss, grads, logits)``.

    The loss of transformers' ``model(ids, labels=ids)``, and with an ``attention_mask`` of
    ``model(ids, attention_mask=mask, labels=ids where mask else -100)``: the mean cross-entropy
    of the logits at position n against the token at n + 1, over the positions n whose next token
    is real (:func:`attention_ref.nn.cross_entropy.next_token_targets`). On a left-padded row the
    last pad position predicts the first real token, as in transformers; that query has no real
    key, and this package gives it zero attention weights (as transformers' sdpa path), where
    transformers' eager path (BLOOM, Gemma 2 eager) averages every key's value, future ones
    included: the two losses differ by that term alone (tests/interop/test_lm_loss_left_padding.py).
    ``grads`` is keyed like ``params``.
    """
    logits, cache = lm_forward(ids, params, config, attention_mask)  # (..., T, V)
    targets = next_token_targets(ids, attention_mask)  # (..., T): the next token, or ignored
    loss, loss_cache = cross_entropy_forward(logits, targets)  # ()
    dlogits = cross_entropy_backward(1.0, loss_cache)  # (..., T, V)
    del loss_cache  # the probabilities, (..., T, V): freed before the backward's largest arrays are made
    return float(loss), lm_backward(dlogits, cache), logits
