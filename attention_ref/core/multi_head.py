"""Multi-head attention, the weight-split parallel form, and its backward.

``MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O``,
``head_i = Attention(query W_i^Q, key W_i^K, value W_i^V)``, where ``W_i^Q`` is the block
of columns ``i*d_k:(i+1)*d_k`` of ``W_q`` (and likewise for ``W_k``, ``W_v``).

Symbols: ``...`` batch axes, Nq/Nk query/key lengths, Dq/Dkin/Dvin input widths,
H query heads, Hkv key/value heads (H for ordinary attention, 1 for multi-query,
in between for grouped-query), G = H // Hkv query heads per key/value head,
Dk/Dv head widths, Dout output width.

Forward, numbered so the backward can walk it in reverse:

1. projections  ``Q = query W_q + b_q``, ``K = key W_k + b_k``, ``V = value W_v + b_v``
2. split heads  ``(..., N, H*Dk) -> (..., H, N, Dk)``
3. attention per head, all heads at once (key/value head ``j`` serves query heads
   ``j*G .. j*G+G-1``, i.e. query head ``i`` uses key/value head ``i // G``)
4. optional ``head_mask``: head ``i``'s output is multiplied by ``head_mask[i]``
5. merge heads (the documents' ``Concat``)  ``(..., H, Nq, Dv) -> (..., Nq, H*Dv)``
6. output projection ``out = concat W_o + b_o``

A projection or attention scores too large for the dtype raise ``FloatingPointError``
naming the inputs (``query W_q + b_q``, ...), the dtype and its largest finite value.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._checks import as_upstream
from .._pair_checks import PARAM_NAMES, check_multi_head_inputs, check_scale
from .attention import AttentionCache, _attention_backward, _attention_forward
from .heads import _merge, _split
from .linear import LinearCache, _linear_backward, _linear_finite

__all__ = [
    "PARAM_NAMES",
    "MultiHeadCache",
    "multi_head_attention_forward",
    "multi_head_attention_backward",
    "check_multi_head_inputs",
]

#: How an overflow error names the attention's q and k: the projected query and key.
_SCORE_NAMES = ("query W_q + b_q", "key W_k + b_k")


class MultiHeadCache(NamedTuple):
    """Nested caches of the six forward steps, plus what ties them together."""

    q_proj: LinearCache  # step 1, query
    k_proj: LinearCache  # step 1, key
    v_proj: LinearCache  # step 1, value
    attention: AttentionCache  # step 3: q (..., Hkv, G, Nq, Dk), k and v (..., Hkv, 1, Nk, D)
    heads: np.ndarray  # (..., H, Nq, Dv), head outputs before the head mask
    head_mask: np.ndarray | None  # (H,), step 4
    o_proj: LinearCache  # step 6
    num_heads: int
    num_kv_heads: int
    param_keys: tuple  # the keys of params, so grads mirrors them
    rotary: tuple | None = None  # (rotary, its cache) when positions rotate q and k (see below)

    @property
    def weights(self) -> np.ndarray:
        """Attention probabilities of every head, (..., H, Nq, Nk)."""
        return _ungroup_heads(self.attention.weights)  # (..., Hkv, G, Nq, Nk) -> (..., H, Nq, Nk)


def _project(x, p, w_name, b_name, x_name):
    """Step 1 or 6: ``x W + b`` with its cache (inputs already validated; overflow raises)."""
    W, b = p[w_name], p.get(b_name)
    return _linear_finite(x, W, b, (x_name, w_name, b_name)), LinearCache(x, W, b is not None)


def _group_heads(x, num_kv_heads):
    """Group query heads by the key/value head they share: (..., H, N, D) -> (..., Hkv, G, N, D)."""
    return x.reshape(x.shape[:-3] + (num_kv_heads, x.shape[-3] // num_kv_heads) + x.shape[-2:])


def _ungroup_heads(x):
    """The inverse of :func:`_group_heads`: (..., Hkv, G, N, D) -> (..., H, N, D)."""
    return x.reshape(x.shape[:-4] + (x.shape[-4] * x.shape[-3],) + x.shape[-2:])


def _group_mask(mask):
    """Give a (..., Nq, Nk) mask two axes of size 1 for (Hkv, G), so one mask serves all heads."""
    if mask is None or mask.ndim < 3:  # (Nq, Nk) or smaller: broadcasts over the head axes as it is
        return mask
    return mask.reshape(mask.shape[:-2] + (1, 1) + mask.shape[-2:])  # (..., 1, 1, Nq, Nk)


def _multi_head_attention_forward(query, key, value, p, mask, head_mask, h, hkv, param_keys, *,
                                  scale=None, rotary=None):
    """The six steps on the validated arguments :func:`check_multi_head_inputs` returns.

    ``rotary``, for layers with position embeddings inside attention (Llama's RoPE), has
    ``forward(q, k) -> (q, k, cache)`` on the split heads q (..., H, Nq, Dk) and k
    (..., Hkv, Nk, Dk), and ``backward(dq, dk, cache) -> (dq, dk)``; the core knows nothing
    else about it (it is built by the layer above, :mod:`attention_ref.nn.llama_block`)."""
    # 1. projections
    Q, q_cache = _project(query, p, "W_q", "b_q", "query")  # (..., Nq, H*Dk)
    K, k_cache = _project(key, p, "W_k", "b_k", "key")  # (..., Nk, Hkv*Dk)
    V, v_cache = _project(value, p, "W_v", "b_v", "value")  # (..., Nk, Hkv*Dv)
    # 2. split heads; query heads grouped by the key/value head they share
    q = _split(Q, h)  # (..., H, Nq, Dk)
    k = _split(K, hkv)  # (..., Hkv, Nk, Dk)
    rotated = None
    if rotary is not None:  # 2b. positions rotate the queries and keys of every head
        q, k, rotary_cache = rotary.forward(q, k)
        rotated = (rotary, rotary_cache)
    q = _group_heads(q, hkv)  # (..., Hkv, G, Nq, Dk)
    k = k[..., None, :, :]  # (..., Hkv, 1, Nk, Dk)
    v = _split(V, hkv)[..., None, :, :]  # (..., Hkv, 1, Nk, Dv)
    # 3. attention, broadcasting each key/value head over its G query heads
    o, attn_cache = _attention_forward(q, k, v, _group_mask(mask), _SCORE_NAMES, scale)  # (..., Hkv, G, Nq, Dv)
    heads = _ungroup_heads(o)  # (..., H, Nq, Dv)
    # 4. head mask
    masked = heads if head_mask is None else heads * head_mask[:, None, None]
    # 5. concat
    concat = _merge(masked)  # (..., Nq, H*Dv)
    # 6. output projection
    out, o_cache = _project(concat, p, "W_o", "b_o", "concat")  # (..., Nq, Dout)
    cache = MultiHeadCache(q_cache, k_cache, v_cache, attn_cache, heads, head_mask,
                           o_cache, h, hkv, param_keys, rotated)
    return out, cache


def _multi_head_attention_backward(dout, c: MultiHeadCache):
    """The forward's steps in reverse, on a checked upstream gradient."""
    h, hkv = c.num_heads, c.num_kv_heads
    grads = {}
    # 6. out = concat W_o + b_o
    dconcat, grads["W_o"], grads["b_o"] = _linear_backward(dout, c.o_proj)  # (..., Nq, H*Dv)
    # 5. concat = merge(masked): the backward of a merge is a split
    dmasked = _split(dconcat, h)  # (..., H, Nq, Dv)
    # 4. masked = heads * head_mask
    if c.head_mask is None:
        dheads = dmasked
    else:
        # d head_mask_i = sum over batch, positions and features of dmasked_i * heads_i
        dhm = (dmasked * c.heads).sum(axis=(-2, -1))  # (..., H)
        grads["head_mask"] = dhm.reshape(-1, h).sum(axis=0)  # (H,)
        dheads = dmasked * c.head_mask[:, None, None]
    # 3. attention per (key/value head, query head in its group)
    do = _group_heads(dheads, hkv)  # (..., Hkv, G, Nq, Dv)
    dq, dk, dv = _attention_backward(do, c.attention)
    # the broadcast of k, v over G has been summed away by the attention backward:
    # each key/value head collects the gradients of all the query heads sharing it
    dq, dk = _ungroup_heads(dq), dk[..., 0, :, :]  # (..., H, Nq, Dk), (..., Hkv, Nk, Dk)
    if c.rotary is not None:  # 2b. rotate back
        rotary, rotary_cache = c.rotary
        dq, dk = rotary.backward(dq, dk, rotary_cache)
    # 2. split heads: the backward of a split is a merge
    dQ = _merge(dq)  # (..., Nq, H*Dk)
    dK = _merge(dk)  # (..., Nk, Hkv*Dk)
    dV = _merge(dv[..., 0, :, :])  # (..., Nk, Hkv*Dv)
    # 1. projections
    dquery, grads["W_q"], grads["b_q"] = _linear_backward(dQ, c.q_proj)
    dkey, grads["W_k"], grads["b_k"] = _linear_backward(dK, c.k_proj)
    dvalue, grads["W_v"], grads["b_v"] = _linear_backward(dV, c.v_proj)
    ordered = {n: grads[n] for n in c.param_keys}
    if "head_mask" in grads:
        ordered["head_mask"] = grads["head_mask"]
    return dquery, dkey, dvalue, ordered


def multi_head_attention_forward(query, key, value, params, num_heads, mask=None, *,
                                 num_kv_heads=None, head_mask=None, scale=None):
    """Multi-head attention ``Concat(head_1, ..., head_h) W^O`` (weight-split parallel form).

    Parameters
    ----------
    query : array (..., n_q, d_model)
    key : array (..., n_k, d_key_in)
    value : array (..., n_k, d_value_in)
    params : dict with ``W_q (d_model, h*d_k)``, ``W_k (d_key_in, h_kv*d_k)``,
        ``W_v (d_value_in, h_kv*d_v)``, ``W_o (h*d_v, d_out)`` and optional biases
        ``b_q, b_k, b_v, b_o`` (absent or None for no bias). ``d_k`` and ``d_v`` are read
        from these shapes; head ``i`` uses columns ``i*d_k:(i+1)*d_k`` of ``W_q``.
    num_heads : int, h
    mask : None, bool (True = may attend) or float (added to the scaled scores) array
        broadcastable to (..., n_q, n_k); the same mask applies to every head
    num_kv_heads : int dividing ``num_heads`` (default ``num_heads``); 1 is multi-query
        attention, values in between grouped-query attention
    head_mask : array (h,) or None, a multiplier on each head's output before ``W^O``
    scale : the factor on each head's ``q k^T``; None (default) is ``1 / sqrt(d_k)``

    Returns
    -------
    out : array (..., n_q, d_out)
    cache : MultiHeadCache; ``cache.weights`` (..., h, n_q, n_k) are the probabilities (batch
        axes of query, key and the mask; those only value carries are not repeated)

    Raises
    ------
    FloatingPointError : when a projection or the scores overflow the dtype
    """
    scale, checked = check_scale(scale), check_multi_head_inputs(query, key, value, params, num_heads, mask,
                                                                 num_kv_heads, head_mask)
    return _multi_head_attention_forward(*checked, tuple(params), scale=scale)


def multi_head_attention_backward(dout, cache: MultiHeadCache):
    """Gradients of :func:`multi_head_attention_forward`, walking its steps in reverse.

    Parameters
    ----------
    dout : array (..., n_q, d_out), upstream gradient
    cache : MultiHeadCache from the forward

    Returns
    -------
    dquery, dkey, dvalue : arrays shaped like query, key and value (for self-attention,
        where one ``x`` was passed three times, ``dx = dquery + dkey + dvalue``)
    grads : dict with the same keys as ``params`` (None for a bias given as None), plus
        ``"head_mask"`` when a head mask was given
    """
    out_shape = cache.heads.shape[:-3] + (cache.heads.shape[-2], cache.o_proj.W.shape[1])  # (..., Nq, Dout)
    return _multi_head_attention_backward(as_upstream(dout, out_shape, cache.o_proj.x.dtype), cache)
