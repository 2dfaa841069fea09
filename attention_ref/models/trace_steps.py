"""The pieces a family's trace reads out of its block's caches (:func:`attention_ref.models.lm_trace`).

A block's forward keeps, for its backward, the inputs of its linear layers, the normalised rows of
its norms, the rotated queries and keys and the attention probabilities. The trace reads each
module's output from there: the input a later step kept (a norm's output is the input its linear
kept), or the same formula on what was kept (a linear's output is ``x W + b`` on its kept ``x``;
an activation is its function of the kept pre-activation). Nothing here decides what a family
computes: the family's file (its ``trace_block``) says which cache field is which of
transformers' modules.

Symbols: ``...`` batch axes, N positions, H query heads, Hkv key/value heads, Dh head width.
"""
from __future__ import annotations

import numpy as np

from .._checks import signals_land_here
from ..core.linear import LinearCache
from ..fast.dispatch import linear_formula
from ..variants.grouped_heads import GroupedMultiHeadCache, ungroup_heads

__all__ = ["linear_output", "norm_output", "attention_steps", "grouped_attention_steps", "heads_last",
           "ATTENTION_STEPS", "SEPARATOR"]

#: between a module's name and the name of a step inside it (``model.layers.0.self_attn:probs``)
SEPARATOR = ":"
#: the steps inside an attention module, in the order they are computed
ATTENTION_STEPS = ("q_rope", "k_rope", "scores", "probs")


def linear_output(cache: LinearCache, b=None):
    """A linear layer's output ``x W + b`` on the input its cache kept (the formula the forward ran)."""
    return linear_formula(cache.x, cache.W, b)  # (..., Dout)


def _per_head(x, grouped: bool):
    """(..., Hkv, G, N, D) -> (..., H, N, D) when grouped; as it is otherwise."""
    return ungroup_heads(x) if grouped else x


def attention_steps(q, k, weights, scale, grouped: bool, cap=None):
    """``q_rope`` (..., H, N, Dh), ``k_rope`` (..., Hkv, N, Dh), ``scores`` (..., H, N, N) and
    ``probs`` (..., H, N, N) from what an attention step kept: the queries and keys after RoPE as
    the attention saw them (grouped when ``grouped``: (..., Hkv, G, N, Dh) and (..., Hkv, 1, N, Dh)),
    the probabilities and the scale. The scores are ``(q scale) k^T`` as the forward computes
    them (then ``cap tanh(S / cap)`` with Gemma 2's ``cap``), ``-inf`` where a key is masked
    (probability 0). A list of ``(suffix, value)``."""
    probs = _per_head(weights, grouped)  # (..., H, N, N)
    with np.errstate(under="ignore"):
        scores = _per_head((q * scale) @ k.swapaxes(-1, -2), grouped)  # (..., H, N, N)
        if cap is not None:
            scores = cap * np.tanh(scores / cap)
        signals_land_here()  # a Ctrl-C is raised inside the block (_pair_checks.py)
    scores = np.where(probs == 0, -np.inf, scores).astype(probs.dtype)  # masked keys: -inf
    k_heads = k[..., 0, :, :] if grouped else k  # (..., Hkv, N, Dh)
    return list(zip(ATTENTION_STEPS, (_per_head(q, grouped), k_heads, scores, probs)))


def grouped_attention_steps(attn_cache):
    """:func:`attention_steps` of a multi-head cache (the plain layer's or the grouped one's)."""
    a = attn_cache.attention
    return attention_steps(a.q, a.k, a.weights, a.scale, isinstance(attn_cache, GroupedMultiHeadCache))


def heads_last(x):
    """(..., H, N, Dh) -> (..., N, H, Dh), the layout of transformers' q/k norms' input."""
    return np.swapaxes(x, -3, -2)



def norm_output(cache):
    """An RMSNorm's output ``x_hat * weight`` from its :class:`attention_ref.nn.rms_norm.RMSNormCache`
    (the product the forward computed; Gemma's cache holds ``1 + w`` as its weight)."""
    return cache.x_hat * cache.weight  # (..., D)
