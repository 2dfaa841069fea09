"""Multi-head attention with what real models add to the plain layer: grouped-query heads
(fewer key/value heads than query heads), a head mask, and a hook for rotary positions.

The plain layer, the documents' one, is :mod:`attention_ref.core.multi_head`: H heads of
queries, keys and values, arrays ``(..., H, N, D)``. This module puts the three additions
around the same steps:

* **grouped-query heads** (``num_kv_heads`` = Hkv dividing H; 1 is multi-query attention):
  query head ``i`` uses key/value head ``i // G`` with G = H / Hkv. The query heads are
  grouped by the key/value head they share, ``(..., H, N, D) -> (..., Hkv, G, N, D)``, and
  each key/value head gets an axis of size 1 that broadcasts over its G query heads
  (``(..., Hkv, 1, N, D)``): nothing is copied, and the attention backward's sum over the
  broadcast axis is what adds up the G query heads' gradients for their shared key/value head;
* **a head mask** (``head_mask``, (H,)): head ``i``'s output times ``head_mask[i]`` before the
  concatenation; its gradient is ``sum(dheads_i * heads_i)``;
* **rotary positions** (``rotary``, used by :mod:`attention_ref.nn.llama_block`): an object
  with ``forward(q, k) -> (q, k, cache)`` on the split heads and ``backward(dq, dk, cache)``;
* **a hook on the scores** (``scores``, Gemma 2's soft cap :class:`attention_ref.nn.soft_cap.SoftCapScores`):
  an object with ``forward(S) -> (C, cache)`` on the scaled scores ``S = (q scale) k^T``, before
  the mask and the softmax, and ``backward(dC, cache) -> dS``, between the softmax's backward and
  the scale's. Step 3 then runs :func:`hooked_attention_formula` (the attention's formulas with
  the hook between steps 1 and 2, unfused: the fast path's row blocks have no place for it).
* **sinks** (``sinks``, (H,), gpt-oss): one learned logit per head in the softmax's denominator;
  step 3 then runs :func:`attention_ref.variants.sink_softmax.sink_attention_formula` (each query
  head's sink, grouped as the query heads), and the backward returns the sinks' gradient as
  ``grads["sinks"]``.

Forward, numbered so the backward can walk it in reverse (steps 1, 2, 5, 6 are the plain
layer's):

1. projections  ``Q = query W_q + b_q``, ``K = key W_k + b_k``, ``V = value W_v + b_v``
2. split heads  ``(..., N, H*Dk) -> (..., H, N, Dk)`` (keys and values: Hkv heads);
   2b. rotary positions on q and k, when given
3. attention, each key/value head broadcast over its group of G query heads (the scores
   through the ``scores`` hook, when given)
4. head mask
5. merge heads ``(..., H, Nq, Dv) -> (..., Nq, H*Dv)``
6. output projection ``out = concat W_o + b_o``

:func:`multi_head_attention_forward` here is the public function (``attention_ref.
multi_head_attention_forward``): without grouped heads, a head mask or rotary positions it
runs the plain layer (the reference, or its fast path for large inputs), with them the steps
above, whose projections and attention take the same size rule.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

import math

from .._checks import as_upstream, signals_land_here, unbroadcast
from .._pair_checks import MultiHeadInputs, check_multi_head_inputs, check_scale
from ..core.attention import AttentionCache
from ..core.linear import LinearCache
from ..core.masks import apply_mask
from ..core.multi_head import MultiHeadCache
from ..fast.core_formulas import SCORE_NAMES, merge_heads_formula, split_heads_formula
from ..fast.dispatch import (
    attention_backward_formula,
    attention_formula,
    linear_backward_formula,
    linear_formula,
    plain_multi_head_backward_formula,
    plain_multi_head_formula,
)
from ..fast.softmax import softmax_in_place
from .sink_softmax import sink_attention_backward_formula, sink_attention_formula

__all__ = ["GroupedMultiHeadCache", "multi_head_attention_forward", "multi_head_attention_backward",
           "hooked_attention_formula", "hooked_attention_backward_formula"]


class GroupedMultiHeadCache(NamedTuple):
    """Nested caches of the six steps, plus what ties them together."""

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
    rotary: tuple | None = None  # (rotary, its cache) when positions rotate q and k
    scores: tuple | None = None  # (the scores hook, its cache) when a hook changes the scores
    sinks: np.ndarray | None = None  # (..., Hkv, G, Nq, 1), the weight each row put on its head's sink

    @property
    def weights(self) -> np.ndarray:
        """Attention probabilities of every head, (..., H, Nq, Nk)."""
        return ungroup_heads(self.attention.weights)  # (..., Hkv, G, Nq, Nk) -> (..., H, Nq, Nk)


def group_heads(x, num_kv_heads):
    """Group query heads by the key/value head they share: (..., H, N, D) -> (..., Hkv, G, N, D)."""
    return x.reshape(x.shape[:-3] + (num_kv_heads, x.shape[-3] // num_kv_heads) + x.shape[-2:])


def ungroup_heads(x):
    """The inverse of :func:`group_heads`: (..., Hkv, G, N, D) -> (..., H, N, D)."""
    return x.reshape(x.shape[:-4] + (x.shape[-4] * x.shape[-3],) + x.shape[-2:])


def group_mask(mask):
    """Give a (..., Nq, Nk) mask two axes of size 1 for (Hkv, G), so one mask serves all heads."""
    if mask is None or mask.ndim < 3:  # (Nq, Nk) or smaller: broadcasts over the head axes as it is
        return mask
    return mask.reshape(mask.shape[:-2] + (1, 1) + mask.shape[-2:])  # (..., 1, 1, Nq, Nk)


def hooked_attention_formula(q, k, v, mask, scale, scores):
    """Attention with a hook on the scores, on checked inputs: ``(out, cache, hook_cache)``.

    1. ``S = (q scale) k^T``; 1b. ``C = scores.forward(S)``; 2. the mask; 3. ``P = softmax``;
    4. ``out = P v``. ``scale`` None is ``1 / sqrt(Dk)``; ``cache`` an :class:`AttentionCache`."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale  # a Python float: float32 stays float32
    with np.errstate(under="ignore"):
        S = (q * scale) @ k.swapaxes(-1, -2)  # 1. (..., Nq, Nk)
        C, hook_cache = scores.forward(S)  # 1b. the hook (Gemma 2: cap tanh(S / cap), every entry below cap)
        P = softmax_in_place(apply_mask(C, mask))  # 2.-3. over a fresh array
        out = P @ v  # 4. (..., Nq, Dv)
        signals_land_here()  # a Ctrl-C is raised inside the block (_pair_checks.py)
    return out, AttentionCache(q, k, v, P, out, scale), hook_cache


def hooked_attention_backward_formula(dout, cache: AttentionCache, scores, hook_cache):
    """:func:`hooked_attention_formula`'s steps in reverse: ``(dq, dk, dv)``, each summed over
    the axes its input broadcast over."""
    q, k, v, P, out, scale = cache
    with np.errstate(under="ignore"):
        dv = P.swapaxes(-1, -2) @ dout  # 4. dv = P^T dout
        dP = dout @ v.swapaxes(-1, -2)  # 4. dP = dout v^T
        dC = P * (dP - (dout * out).sum(axis=-1, keepdims=True))  # 3. softmax; 2. the mask passes dC through
        dS = scores.backward(dC, hook_cache)  # 1b. the hook's backward (Gemma 2: dC (1 - t^2))
        dq = dS @ k * scale  # 1. S = (q scale) k^T
        dk = dS.swapaxes(-1, -2) @ q * scale
        signals_land_here()  # a Ctrl-C is raised inside the block (_pair_checks.py)
    return unbroadcast(dq, q.shape), unbroadcast(dk, k.shape), unbroadcast(dv, v.shape)


def _project(x, p, w_name, b_name, x_name):
    """Step 1 or 6: ``x W + b`` with its cache (the public linear pair's size rule)."""
    W, b = p[w_name], p.get(b_name)
    return linear_formula(x, W, b, (x_name, w_name, b_name)), LinearCache(x, W, b is not None)


def _grouped_forward(query, key, value, p, mask, head_mask, h, hkv, param_keys, *, scale=None, rotary=None,
                     scores=None, sinks=None):
    """The six steps on the validated arguments :func:`check_multi_head_inputs` returns."""
    # 1. projections
    Q, q_cache = _project(query, p, "W_q", "b_q", "query")  # (..., Nq, H*Dk)
    K, k_cache = _project(key, p, "W_k", "b_k", "key")  # (..., Nk, Hkv*Dk)
    V, v_cache = _project(value, p, "W_v", "b_v", "value")  # (..., Nk, Hkv*Dv)
    # 2. split heads
    q, k, rotated = split_heads_formula(Q, h), split_heads_formula(K, hkv), None  # (..., H, Nq, Dk), (..., Hkv, Nk, Dk)
    if rotary is not None:  # 2b. positions rotate the queries and keys of every head
        q, k, rotary_cache = rotary.forward(q, k)
        rotated = (rotary, rotary_cache)
    # 3. attention: query heads grouped by the key/value head they share, which broadcasts over them
    q = group_heads(q, hkv)  # (..., Hkv, G, Nq, Dk)
    k = k[..., None, :, :]  # (..., Hkv, 1, Nk, Dk)
    v = split_heads_formula(V, hkv)[..., None, :, :]  # (..., Hkv, 1, Nk, Dv)
    hooked = p_sink = None
    if sinks is not None:  # gpt-oss: each query head's sink in its softmax's denominator
        o, attn_cache, p_sink = sink_attention_formula(q, k, v, group_mask(mask), scale,
                                                       sinks.reshape(hkv, h // hkv, 1, 1))  # (..., Hkv, G, Nq, Dv)
    elif scores is None:
        o, attn_cache = attention_formula(q, k, v, group_mask(mask), SCORE_NAMES, scale)  # (..., Hkv, G, Nq, Dv)
    else:  # the scores through the hook
        o, attn_cache, hook_cache = hooked_attention_formula(q, k, v, group_mask(mask), scale, scores)
        hooked = (scores, hook_cache)
    heads = ungroup_heads(o)  # (..., H, Nq, Dv)
    # 4. head mask
    masked = heads if head_mask is None else heads * head_mask[:, None, None]
    # 5. merge, 6. output projection
    out, o_cache = _project(merge_heads_formula(masked), p, "W_o", "b_o", "concat")  # (..., Nq, Dout)
    return out, GroupedMultiHeadCache(q_cache, k_cache, v_cache, attn_cache, heads, head_mask, o_cache, h, hkv,
                                      param_keys, rotated, hooked, p_sink)


def _grouped_backward(dout, c: GroupedMultiHeadCache):
    """The forward's steps in reverse, on a checked upstream gradient."""
    h, hkv = c.num_heads, c.num_kv_heads
    grads = {}
    # 6. out = concat W_o + b_o; 5. the backward of a merge is a split
    dconcat, grads["W_o"], grads["b_o"] = linear_backward_formula(dout, c.o_proj)  # (..., Nq, H*Dv)
    dheads = split_heads_formula(dconcat, h)  # (..., H, Nq, Dv)
    # 4. masked = heads * head_mask: d head_mask_i sums dmasked_i * heads_i over batch, positions, features
    if c.head_mask is not None:
        grads["head_mask"] = (dheads * c.heads).sum(axis=(-2, -1)).reshape(-1, h).sum(axis=0)  # (H,)
        dheads = dheads * c.head_mask[:, None, None]
    # 3. attention: the sum over the broadcast axis adds the G query heads' gradients per key/value head
    if c.sinks is not None:  # the sinks' gradient: each head's rows summed
        dq, dk, dv, dsink_rows = sink_attention_backward_formula(group_heads(dheads, hkv), c.attention, c.sinks)
        grads["sinks"] = ungroup_heads(dsink_rows).reshape(-1, h, dsink_rows.shape[-2]).sum(axis=(0, 2))  # (H,)
    elif c.scores is None:
        dq, dk, dv = attention_backward_formula(group_heads(dheads, hkv), c.attention)
    else:  # the hook's backward between the softmax's and the scale's
        dq, dk, dv = hooked_attention_backward_formula(group_heads(dheads, hkv), c.attention, *c.scores)
    dq, dk, dv = ungroup_heads(dq), dk[..., 0, :, :], dv[..., 0, :, :]  # (..., H, Nq, Dk), (..., Hkv, Nk, D)
    rotary_grads = {}
    if c.rotary is not None:  # 2b. rotate back (a hook with weights, as Qwen3's q/k norms, returns their gradients)
        rotary, rotary_cache = c.rotary
        dq, dk, *rest = rotary.backward(dq, dk, rotary_cache)
        rotary_grads = rest[0] if rest else {}
    # 2. the backward of a split is a merge; 1. projections
    dquery, grads["W_q"], grads["b_q"] = linear_backward_formula(merge_heads_formula(dq), c.q_proj)
    dkey, grads["W_k"], grads["b_k"] = linear_backward_formula(merge_heads_formula(dk), c.k_proj)
    dvalue, grads["W_v"], grads["b_v"] = linear_backward_formula(merge_heads_formula(dv), c.v_proj)
    ordered = {n: grads[n] for n in c.param_keys}
    for extra in ("head_mask", "sinks"):
        if extra in grads:
            ordered[extra] = grads[extra]
    ordered.update(rotary_grads)
    return dquery, dkey, dvalue, ordered


def multi_head_attention_formula(inputs: MultiHeadInputs, param_keys, *, scale=None, rotary=None, scores=None,
                                 sinks=None):
    """:func:`multi_head_attention_forward` on checked inputs (a :class:`MultiHeadInputs`, as
    ``check_multi_head_inputs`` returns it; the blocks of ``nn`` call it): the plain layer when
    nothing is added, else the grouped steps (``rotary`` a hook on q and k, ``scores`` a hook on
    the scaled scores, ``sinks`` (H,) a sink logit per head, gpt-oss's; not with ``scores``)."""
    query, key, value, p, mask, head_mask, h, hkv = inputs
    if hkv == h and head_mask is None and rotary is None and scores is None and sinks is None:
        return plain_multi_head_formula(query, key, value, p, mask, h, param_keys, scale=scale)
    return _grouped_forward(query, key, value, p, mask, head_mask, h, hkv, param_keys, scale=scale, rotary=rotary,
                            scores=scores, sinks=sinks)


def multi_head_attention_backward_formula(dout, cache):
    """:func:`multi_head_attention_backward` on a checked upstream gradient, for either cache."""
    if isinstance(cache, GroupedMultiHeadCache):
        return _grouped_backward(dout, cache)
    return plain_multi_head_backward_formula(dout, cache)



def multi_head_attention_forward(query, key, value, params, num_heads, mask=None, *,
                                 num_kv_heads=None, head_mask=None, scale=None):
    """Multi-head attention ``Concat(head_1, ..., head_h) W^O``, arguments ``(query, key, value,
    params, num_heads, mask)``, weights ``(d_in, d_out)`` (torch's ``Linear.weight.T``; no RoPE:
    see :func:`attention_ref.rope_multi_head_attention_forward`); with
    grouped-query heads and a head mask when asked: the plain layer
    (:func:`attention_ref.core.multi_head_attention_forward`, on the fast path for large inputs)
    when neither is given. Its projections and attention run the fast path (attention_ref.fast)
    from FAST_MIN_ELEMENTS numbers in their largest array, the reference (attention_ref.core)
    below, or always with reference_only().

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
    cache : MultiHeadCache (the plain layer) or GroupedMultiHeadCache; ``cache.weights``
        (..., h, n_q, n_k) are the probabilities (batch axes of query, key and the mask)

    Raises
    ------
    FloatingPointError : when a projection or the scores overflow the dtype
    """
    scale, checked = check_scale(scale), check_multi_head_inputs(query, key, value, params, num_heads, mask,
                                                                 num_kv_heads, head_mask)
    return multi_head_attention_formula(checked, tuple(params), scale=scale)


def multi_head_attention_backward(dout, cache):
    """Gradients of :func:`multi_head_attention_forward` (arguments ``dout, cache``), walking its
    steps in reverse: ``(dquery, dkey, dvalue, grads)``, weight gradients ``(d_in, d_out)``.

    On the same path as the forward: fast from FAST_MIN_ELEMENTS numbers, or always the
    reference with reference_only().

    Parameters
    ----------
    dout : array (..., n_q, d_out), upstream gradient
    cache : the forward's cache (MultiHeadCache or GroupedMultiHeadCache)

    Returns
    -------
    dquery, dkey, dvalue : arrays shaped like query, key and value (for self-attention,
        where one ``x`` was passed three times, ``dx = dquery + dkey + dvalue``)
    grads : dict with the same keys as ``params`` (None for a bias given as None), plus
        ``"head_mask"`` when a head mask was given
    """
    if not isinstance(cache, (GroupedMultiHeadCache, MultiHeadCache)):
        raise TypeError(f"cache must be what multi_head_attention_forward returned, got {type(cache).__name__}")
    out_shape = cache.heads.shape[:-3] + (cache.heads.shape[-2], cache.o_proj.W.shape[1])  # (..., Nq, Dout)
    return multi_head_attention_backward_formula(as_upstream(dout, out_shape, cache.o_proj.x.dtype), cache)
