"""Multi-head attention for large inputs: the reference's six steps
(:mod:`attention_ref.core.multi_head`, read the formulas there) composed from the fast
linear and attention pairs; same signatures, same :class:`MultiHeadCache`.
"""
from __future__ import annotations

from .._checks import as_upstream
from .._pair_checks import check_multi_head_inputs, check_scale
from ..core.heads import _merge, _split
from ..core.linear import LinearCache
from ..core.multi_head import _SCORE_NAMES, MultiHeadCache, _group_heads, _group_mask, _ungroup_heads
from .attention import _attention_backward, _attention_forward
from .linear import _linear_backward, _linear_finite

__all__ = ["multi_head_attention_forward", "multi_head_attention_backward"]


def _project(x, p, w_name, b_name, x_name):
    """Step 1 or 6: ``x W + b`` and its cache."""
    W, b = p[w_name], p.get(b_name)
    return _linear_finite(x, W, b, (x_name, w_name, b_name)), LinearCache(x, W, b is not None)


def _multi_head_attention_forward(query, key, value, p, mask, head_mask, h, hkv, param_keys, *,
                                  scale=None, rotary=None):
    """The reference's six steps on checked inputs, with the fast projections and attention."""
    Q, q_cache = _project(query, p, "W_q", "b_q", "query")  # 1. (..., Nq, H*Dk)
    K, k_cache = _project(key, p, "W_k", "b_k", "key")  # 1. (..., Nk, Hkv*Dk)
    V, v_cache = _project(value, p, "W_v", "b_v", "value")  # 1. (..., Nk, Hkv*Dv)
    q, k, rotated = _split(Q, h), _split(K, hkv), None  # 2. (..., H, Nq, Dk), (..., Hkv, Nk, Dk)
    if rotary is not None:  # 2b.
        q, k, rotary_cache = rotary.forward(q, k)
        rotated = (rotary, rotary_cache)
    q, k = _group_heads(q, hkv), k[..., None, :, :]  # (..., Hkv, G, Nq, Dk), (..., Hkv, 1, Nk, Dk)
    v = _split(V, hkv)[..., None, :, :]  # (..., Hkv, 1, Nk, Dv)
    o, attn_cache = _attention_forward(q, k, v, _group_mask(mask), _SCORE_NAMES, scale)  # 3. (..., Hkv, G, Nq, Dv)
    heads = _ungroup_heads(o)  # (..., H, Nq, Dv)
    masked = heads if head_mask is None else heads * head_mask[:, None, None]  # 4.
    out, o_cache = _project(_merge(masked), p, "W_o", "b_o", "concat")  # 5., 6. (..., Nq, Dout)
    return out, MultiHeadCache(q_cache, k_cache, v_cache, attn_cache, heads, head_mask,
                               o_cache, h, hkv, param_keys, rotated)


def _multi_head_attention_backward(dout, c: MultiHeadCache):
    """The reference's backward on a checked upstream gradient, with the fast pairs."""
    h, hkv, grads = c.num_heads, c.num_kv_heads, {}
    dconcat, grads["W_o"], grads["b_o"] = _linear_backward(dout, c.o_proj)  # 6. (..., Nq, H*Dv)
    dheads = _split(dconcat, h)  # 5. (..., H, Nq, Dv)
    if c.head_mask is not None:  # 4.
        grads["head_mask"] = (dheads * c.heads).sum(axis=(-2, -1)).reshape(-1, h).sum(axis=0)  # (H,)
        dheads = dheads * c.head_mask[:, None, None]
    dq, dk, dv = _attention_backward(_group_heads(dheads, hkv), c.attention)  # 3.
    dq, dk = _ungroup_heads(dq), dk[..., 0, :, :]  # (..., H, Nq, Dk), (..., Hkv, Nk, Dk)
    if c.rotary is not None:  # 2b.
        rotary, rotary_cache = c.rotary
        dq, dk = rotary.backward(dq, dk, rotary_cache)
    dquery, grads["W_q"], grads["b_q"] = _linear_backward(_merge(dq), c.q_proj)  # 2., 1.
    dkey, grads["W_k"], grads["b_k"] = _linear_backward(_merge(dk), c.k_proj)
    dvalue, grads["W_v"], grads["b_v"] = _linear_backward(_merge(dv[..., 0, :, :]), c.v_proj)
    ordered = {n: grads[n] for n in c.param_keys}
    if "head_mask" in grads:
        ordered["head_mask"] = grads["head_mask"]
    return dquery, dkey, dvalue, ordered


def multi_head_attention_forward(query, key, value, params, num_heads, mask=None, *,
                                 num_kv_heads=None, head_mask=None, scale=None):
    """:func:`attention_ref.core.multi_head_attention_forward`, fast: same arguments and cache."""
    scale, checked = check_scale(scale), check_multi_head_inputs(query, key, value, params, num_heads, mask,
                                                                 num_kv_heads, head_mask)
    return _multi_head_attention_forward(*checked, tuple(params), scale=scale)


def multi_head_attention_backward(dout, cache: MultiHeadCache):
    """:func:`attention_ref.core.multi_head_attention_backward`, fast."""
    out_shape = cache.heads.shape[:-3] + (cache.heads.shape[-2], cache.o_proj.W.shape[1])  # (..., Nq, Dout)
    return _multi_head_attention_backward(as_upstream(dout, out_shape, cache.o_proj.x.dtype), cache)
