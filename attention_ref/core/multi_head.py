"""Multi-head attention, the weight-split parallel form, and its backward: the documents' layer.

``MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O``,
``head_i = Attention(query W_i^Q, key W_i^K, value W_i^V)``, where ``W_i^Q`` is the block
of columns ``i*d_k:(i+1)*d_k`` of ``W_q`` (and likewise for ``W_k``, ``W_v``).

Symbols: ``...`` batch axes, Nq/Nk query/key lengths, H heads, Dk/Dv head widths, Dout
output width.

Forward, numbered so the backward can walk it in reverse:

1. projections  ``Q = query W_q + b_q``, ``K = key W_k + b_k``, ``V = value W_v + b_v``
2. split heads  ``(..., N, H*Dk) -> (..., H, N, Dk)``
3. attention, every head at once: ``heads = softmax(q k^T / sqrt(d_k) + mask) v``, (..., H, Nq, Dv)
4. merge heads (the documents' ``Concat``)  ``(..., H, Nq, Dv) -> (..., Nq, H*Dv)``
5. output projection ``out = concat W_o + b_o``

What real models add (fewer key/value heads than query heads, a head mask, rotary
positions) is layered on these steps in :mod:`attention_ref.variants.grouped_heads`, whose
``multi_head_attention_forward`` is ``attention_ref.multi_head_attention_forward``.

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
    """Nested caches of the five forward steps, plus what ties them together."""

    q_proj: LinearCache  # step 1, query
    k_proj: LinearCache  # step 1, key
    v_proj: LinearCache  # step 1, value
    attention: AttentionCache  # step 3: q, k, v (..., H, N, D), weights (..., H, Nq, Nk)
    o_proj: LinearCache  # step 5
    num_heads: int
    param_keys: tuple  # the keys of params, so grads mirrors them

    @property
    def weights(self) -> np.ndarray:
        """Attention probabilities of every head, (..., H, Nq, Nk)."""
        return self.attention.weights

    @property
    def heads(self) -> np.ndarray:
        """The heads' outputs before the merge, (..., H, Nq, Dv)."""
        return self.attention.out


def _project(x, p, w_name, b_name, x_name):
    """Step 1 or 5: ``x W + b`` with its cache (inputs already validated; overflow raises)."""
    W, b = p[w_name], p.get(b_name)
    return _linear_finite(x, W, b, (x_name, w_name, b_name)), LinearCache(x, W, b is not None)


def _head_axis(mask):
    """A (..., Nq, Nk) mask with batch axes gets a head axis of size 1: one mask for every head."""
    return mask if mask is None or mask.ndim < 3 else mask[..., None, :, :]  # (..., 1, Nq, Nk)


def _multi_head_attention_forward(query, key, value, p, mask, h, param_keys, *, scale=None):
    """The five steps on the validated arguments :func:`check_multi_head_inputs` returns."""
    # 1. projections
    Q, q_cache = _project(query, p, "W_q", "b_q", "query")  # (..., Nq, H*Dk)
    K, k_cache = _project(key, p, "W_k", "b_k", "key")  # (..., Nk, H*Dk)
    V, v_cache = _project(value, p, "W_v", "b_v", "value")  # (..., Nk, H*Dv)
    # 2. split heads
    q, k, v = _split(Q, h), _split(K, h), _split(V, h)  # (..., H, Nq, Dk), (..., H, Nk, Dk), (..., H, Nk, Dv)
    # 3. attention, every head at once
    heads, attn_cache = _attention_forward(q, k, v, _head_axis(mask), _SCORE_NAMES, scale)  # (..., H, Nq, Dv)
    # 4. merge heads
    concat = _merge(heads)  # (..., Nq, H*Dv)
    # 5. output projection
    out, o_cache = _project(concat, p, "W_o", "b_o", "concat")  # (..., Nq, Dout)
    return out, MultiHeadCache(q_cache, k_cache, v_cache, attn_cache, o_cache, h, param_keys)


def _multi_head_attention_backward(dout, c: MultiHeadCache):
    """The forward's steps in reverse, on a checked upstream gradient."""
    grads = {}
    # 5. out = concat W_o + b_o
    dconcat, grads["W_o"], grads["b_o"] = _linear_backward(dout, c.o_proj)  # (..., Nq, H*Dv)
    # 4. concat = merge(heads): the backward of a merge is a split
    dheads = _split(dconcat, c.num_heads)  # (..., H, Nq, Dv)
    # 3. attention
    dq, dk, dv = _attention_backward(dheads, c.attention)  # (..., H, Nq, Dk), (..., H, Nk, Dk), (..., H, Nk, Dv)
    # 2. split heads: the backward of a split is a merge
    dQ, dK, dV = _merge(dq), _merge(dk), _merge(dv)  # (..., Nq, H*Dk), (..., Nk, H*Dk), (..., Nk, H*Dv)
    # 1. projections
    dquery, grads["W_q"], grads["b_q"] = _linear_backward(dQ, c.q_proj)
    dkey, grads["W_k"], grads["b_k"] = _linear_backward(dK, c.k_proj)
    dvalue, grads["W_v"], grads["b_v"] = _linear_backward(dV, c.v_proj)
    return dquery, dkey, dvalue, {n: grads[n] for n in c.param_keys}


def multi_head_attention_forward(query, key, value, params, num_heads, mask=None, *, scale=None):
    """Multi-head attention ``Concat(head_1, ..., head_h) W^O`` (weight-split parallel form),
    arguments ``(query, key, value, params, num_heads, mask)``; the weights in ``params`` are
    ``(d_in, d_out)``, the transposes of torch's ``Linear.weight`` (no RoPE: see
    :func:`attention_ref.rope_multi_head_attention_forward`).

    Parameters
    ----------
    query : array (..., n_q, d_model)
    key : array (..., n_k, d_key_in)
    value : array (..., n_k, d_value_in)
    params : dict with ``W_q (d_model, h*d_k)``, ``W_k (d_key_in, h*d_k)``,
        ``W_v (d_value_in, h*d_v)``, ``W_o (h*d_v, d_out)`` and optional biases
        ``b_q, b_k, b_v, b_o`` (absent or None for no bias). ``d_k`` and ``d_v`` are read
        from these shapes; head ``i`` uses columns ``i*d_k:(i+1)*d_k`` of ``W_q``.
    num_heads : int, h
    mask : None, bool (True = may attend) or float (added to the scaled scores) array
        broadcastable to (..., n_q, n_k); the same mask applies to every head
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
    scale, (query, key, value, p, mask, _, h, _) = check_scale(scale), check_multi_head_inputs(
        query, key, value, params, num_heads, mask)
    return _multi_head_attention_forward(query, key, value, p, mask, h, tuple(params), scale=scale)


def multi_head_attention_backward(dout, cache: MultiHeadCache):
    """Gradients of :func:`multi_head_attention_forward` (arguments ``dout, cache``), walking its
    steps in reverse: ``(dquery, dkey, dvalue, grads)``, weight gradients ``(d_in, d_out)``.

    Parameters
    ----------
    dout : array (..., n_q, d_out), upstream gradient
    cache : MultiHeadCache from the forward

    Returns
    -------
    dquery, dkey, dvalue : arrays shaped like query, key and value (for self-attention,
        where one ``x`` was passed three times, ``dx = dquery + dkey + dvalue``)
    grads : dict with the same keys as ``params`` (None for a bias given as None)
    """
    out_shape = cache.heads.shape[:-3] + (cache.heads.shape[-2], cache.o_proj.W.shape[1])  # (..., Nq, Dout)
    return _multi_head_attention_backward(as_upstream(dout, out_shape, cache.o_proj.x.dtype), cache)
