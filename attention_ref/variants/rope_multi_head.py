"""Multi-head attention with rotary positions (RoPE) on every head's queries and keys, the layer
of RoFormer, Llama and GPT-NeoX (and of a course's "multi-head self-attention with RoPE"), as one
public pair: :func:`rope_multi_head_attention_forward` and its backward.

The steps are those of :mod:`attention_ref.variants.grouped_heads` (grouped-query heads
included) with its step 2b filled in: after the heads are split, each head's query at position
``p`` is rotated by ``R(p)`` and each key at position ``p'`` by ``R(p')`` (:mod:`attention_ref.
variants.rope`), so a score ``(R(p) q) . (R(p') k) = q . R(p' - p) k`` depends on the positions
only through their offset. The rotation pairs features in one of two layouts, named on every
call (neither is a safe default: Llama and GPT-NeoX checkpoints use ``"half"``, RoFormer, GPT-J
and courses written from the RoFormer paper ``"interleaved"``):

* ``layout="half"``: features ``i`` and ``i + Dk/2`` of a head form a pair (transformers'
  ``rotate_half``);
* ``layout="interleaved"``: features ``2i`` and ``2i + 1`` form a pair.

Both turn pair ``i`` by ``p * theta^(-2i / Dk)``. Weights are ``(d_in, d_out)``, row vectors as
everywhere in the package (torch's ``Linear.weight`` is ``(d_out, d_in)``: pass its transpose);
head ``h`` reads columns ``h*Dk:(h+1)*Dk`` of ``W_q``.

Symbols: ``...`` batch axes, N positions, D model width, H heads (Hkv key/value heads), Dk head width.

Forward (the backward walks it in reverse; step 2b's backward is ``R(p)^T``):

1. projections  ``Q = query W_q + b_q``, ``K = key W_k + b_k``, ``V = value W_v + b_v``
2. split heads  ``(..., N, H*Dk) -> (..., H, N, Dk)``; 2b. ``q <- R(p) q``, ``k <- R(p') k``
3. attention, each key/value head broadcast over its group of query heads
5. merge heads, 6. output projection ``out = concat W_o + b_o``
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._checks import as_real_array, broadcasts_into, check_positive_real
from .._pair_checks import check_multi_head_inputs, check_scale
from .grouped_heads import GroupedMultiHeadCache, multi_head_attention_backward, multi_head_attention_formula
from .rope import ROPE_LAYOUTS, rope_backward, rope_forward

__all__ = ["RotaryPositions", "rope_multi_head_attention_forward", "rope_multi_head_attention_backward"]


class RotaryPositions(NamedTuple):
    """Step 2b: RoPE on the split heads, queries at ``q_positions``, keys at ``k_positions``
    (each ``(N,)`` or ``(..., 1, N)``: the head axis broadcasts), as the grouped-heads steps call it."""

    q_positions: np.ndarray  # (Nq,) or (..., 1, Nq)
    k_positions: np.ndarray  # (Nk,) or (..., 1, Nk)
    theta: float
    layout: str

    def forward(self, q, k):
        q, q_cache = rope_forward(q, self.q_positions, self.theta, layout=self.layout)  # (..., H, Nq, Dk)
        k, k_cache = rope_forward(k, self.k_positions, self.theta, layout=self.layout)  # (..., Hkv, Nk, Dk)
        return q, k, (q_cache, k_cache)

    def backward(self, dq, dk, cache):
        q_cache, k_cache = cache
        return rope_backward(dq, q_cache), rope_backward(dk, k_cache)


def _token_positions(positions, x, name, x_name):
    """``positions`` of the tokens of ``x`` (..., N, d): (N,), or the axes of ``x.shape[:-1]``
    (size-1 axes broadcast) given a head axis, ``(..., 1, N)``; anything else is refused."""
    positions = as_real_array(positions, name)
    if positions.shape == (x.shape[-2],):
        return positions  # (N,)
    if positions.ndim == x.ndim - 1 and broadcasts_into(positions.shape, x.shape[:-1]):
        return positions[..., None, :]  # (..., 1, N): every head of a token at its position
    raise ValueError(f"{name} of shape {positions.shape} must be ({x.shape[-2]},) or have the {x.ndim - 1} axes of"
                     f" {x_name}'s leading shape {x.shape[:-1]} (size-1 axes broadcast)")


def _rotary(checked, positions, key_positions, theta, layout):
    """The checked :class:`RotaryPositions` of a forward call."""
    if layout not in ROPE_LAYOUTS:
        raise ValueError(f"layout must be 'half' (pairs i, i + d_k/2: Llama, GPT-NeoX) or 'interleaved'"
                         f" (pairs 2i, 2i + 1: RoFormer, GPT-J), got {layout!r}")
    theta = check_positive_real(theta, "theta")
    d_k = checked.params["W_q"].shape[1] // checked.num_heads
    if d_k % 2:
        raise ValueError(f"the head width d_k = W_q's columns / num_heads = {d_k} must be even (RoPE turns feature"
                         f" pairs)")
    query, key = checked.query, checked.key
    n_q, n_k = query.shape[-2], key.shape[-2]
    if key_positions is None and n_k != n_q:
        raise ValueError(f"key_positions must be given when key's length n_k = {n_k} differs from query's"
                         f" n_q = {n_q} (which position is each key at?)")
    if positions is None:
        positions = np.arange(n_q)
    q_positions = _token_positions(positions, query, "positions", "query")
    k_positions = q_positions if key_positions is None else _token_positions(key_positions, key, "key_positions",
                                                                             "key")
    if key_positions is None and not broadcasts_into(q_positions.shape[:-2], key.shape[:-2]):
        raise ValueError(f"positions of shape {np.shape(positions)} also place the keys, but key has the batch shape"
                         f" {key.shape[:-2]}: give key_positions")
    return RotaryPositions(q_positions, k_positions, theta, layout)


def rope_multi_head_attention_forward(query, key, value, params, num_heads, mask=None, *, layout, positions=None,
                                      key_positions=None, theta=10000.0, num_kv_heads=None, scale=None):
    """Multi-head attention (``query, key, value, params, num_heads, mask``, in that order) with
    rotary positions; weights ``(d_in, d_out)`` (torch's ``Linear.weight.T``).

    ``Concat(head_1, ..., head_h) W^O`` with ``head_i = Attention(R(p) Q_i, R(p') K_i, V_i)``: the
    queries and keys of every head turned by RoPE after the projections and before the scores.
    For self-attention pass one ``x`` three times (``dx = dquery + dkey + dvalue`` in the backward).

    Parameters
    ----------
    query : array (..., n_q, d_model)
    key : array (..., n_k, d_key_in)
    value : array (..., n_k, d_value_in)
    params : dict with ``W_q (d_model, h*d_k)``, ``W_k (d_key_in, h_kv*d_k)``, ``W_v (d_value_in,
        h_kv*d_v)``, ``W_o (h*d_v, d_out)`` and optional biases ``b_q, b_k, b_v, b_o``; ``d_k`` even
    num_heads : int, h
    mask : None, bool (True = may attend) or float (added to the scaled scores), broadcastable to
        (..., n_q, n_k); the same mask for every head
    layout : ``"half"`` (pairs ``(i, i + d_k/2)``, Llama, GPT-NeoX) or ``"interleaved"`` (pairs
        ``(2i, 2i + 1)``, RoFormer, GPT-J); keyword-only and required
    positions : None (``0, 1, ..., n_q - 1``), or the queries' positions: ``(n_q,)`` for every
        batch row alike, or with the axes of ``query.shape[:-1]`` such as ``(batch, n_q)`` for a
        ``(batch, n_q, d_model)`` query (size-1 axes broadcast; every head of a token shares its
        position). Any other shape is refused: ``(batch, n_q)`` against a query with two batch
        axes would otherwise line up with the wrong axis. Real numbers are allowed.
    key_positions : None (the keys at ``positions``, when ``n_k = n_q``) or the keys' positions,
        shaped by the same rule against ``key`` (needed when ``n_k != n_q``, as in decoding)
    theta : float > 0, RoPE's base (transformers' ``rope_theta``; pair ``i`` turns at
        ``theta^(-2i/d_k)`` radians per position)
    num_kv_heads : int dividing ``num_heads`` (default ``num_heads``): grouped-query heads
    scale : the factor on each head's ``q k^T``; None (default) is ``1 / sqrt(d_k)``

    Returns
    -------
    out : array (..., n_q, d_out)
    cache : GroupedMultiHeadCache for :func:`rope_multi_head_attention_backward`
        (``cache.weights`` (..., h, n_q, n_k) are the probabilities)

    Raises
    ------
    FloatingPointError : when a projection or the scores overflow the dtype
    """
    scale, checked = check_scale(scale), check_multi_head_inputs(query, key, value, params, num_heads, mask,
                                                                 num_kv_heads)
    rotary = _rotary(checked, positions, key_positions, theta, layout)
    return multi_head_attention_formula(checked, tuple(params), scale=scale, rotary=rotary)


def rope_multi_head_attention_backward(dout, cache):
    """Gradients of :func:`rope_multi_head_attention_forward` (``dout, cache`` in that order):
    its steps in reverse, RoPE's ``R(p)^T`` between the attention and the projections.

    Parameters
    ----------
    dout : array (..., n_q, d_out), upstream gradient
    cache : GroupedMultiHeadCache from the forward

    Returns
    -------
    dquery, dkey, dvalue : arrays shaped like query, key and value (for self-attention
        ``dx = dquery + dkey + dvalue``)
    grads : dict with the keys of ``params`` (None for a bias given as None); weight gradients
        ``(d_in, d_out)`` like the weights. Positions get no gradient.
    """
    if not (isinstance(cache, GroupedMultiHeadCache) and cache.rotary is not None
            and isinstance(cache.rotary[0], RotaryPositions)):
        raise TypeError(f"cache must be what rope_multi_head_attention_forward returned, got {type(cache).__name__}")
    return multi_head_attention_backward(dout, cache)
