"""Multi-head attention for large inputs: the reference's five steps
(:mod:`attention_ref.core.multi_head`, read the formulas there) composed from the fast
linear and attention pairs; same signatures, same :class:`MultiHeadCache`.
"""
from __future__ import annotations

from .._checks import as_upstream
from .._pair_checks import check_multi_head_inputs, check_scale
from ..core.linear import LinearCache
from ..core.multi_head import MultiHeadCache
from .core_formulas import SCORE_NAMES, head_axis, merge_heads_formula, split_heads_formula
from .attention import _attention_backward, _attention_forward
from .linear import _linear_backward, _linear_finite

__all__ = ["multi_head_attention_forward_fast", "multi_head_attention_backward_fast"]


def _project(x, p, w_name, b_name, x_name):
    """Step 1 or 5: ``x W + b`` and its cache."""
    W, b = p[w_name], p.get(b_name)
    return _linear_finite(x, W, b, (x_name, w_name, b_name)), LinearCache(x, W, b is not None)


def _multi_head_attention_forward(query, key, value, p, mask, h, param_keys, *, scale=None):
    """The reference's five steps on checked inputs, with the fast projections and attention."""
    Q, q_cache = _project(query, p, "W_q", "b_q", "query")  # 1. (..., Nq, H*Dk)
    K, k_cache = _project(key, p, "W_k", "b_k", "key")  # 1. (..., Nk, H*Dk)
    V, v_cache = _project(value, p, "W_v", "b_v", "value")  # 1. (..., Nk, H*Dv)
    q, k, v = split_heads_formula(Q, h), split_heads_formula(K, h), split_heads_formula(V, h)  # 2. (..., H, N, D)
    heads, attn_cache = _attention_forward(q, k, v, head_axis(mask), SCORE_NAMES, scale)  # 3. (..., H, Nq, Dv)
    out, o_cache = _project(merge_heads_formula(heads), p, "W_o", "b_o", "concat")  # 4., 5. (..., Nq, Dout)
    return out, MultiHeadCache(q_cache, k_cache, v_cache, attn_cache, o_cache, h, param_keys)


def _multi_head_attention_backward(dout, c: MultiHeadCache):
    """The reference's backward on a checked upstream gradient, with the fast pairs."""
    grads = {}
    dconcat, grads["W_o"], grads["b_o"] = _linear_backward(dout, c.o_proj)  # 5. (..., Nq, H*Dv)
    dq, dk, dv = _attention_backward(split_heads_formula(dconcat, c.num_heads), c.attention)  # 4., 3.
    dquery, grads["W_q"], grads["b_q"] = _linear_backward(merge_heads_formula(dq), c.q_proj)  # 2., 1.
    dkey, grads["W_k"], grads["b_k"] = _linear_backward(merge_heads_formula(dk), c.k_proj)
    dvalue, grads["W_v"], grads["b_v"] = _linear_backward(merge_heads_formula(dv), c.v_proj)
    return dquery, dkey, dvalue, {n: grads[n] for n in c.param_keys}


def multi_head_attention_forward_fast(query, key, value, params, num_heads, mask=None, *, scale=None):
    """:func:`attention_ref.core.multi_head_attention_forward`, fast: same arguments and cache."""
    scale = check_scale(scale)
    checked = check_multi_head_inputs(query, key, value, params, num_heads, mask)
    return _multi_head_attention_forward(checked.query, checked.key, checked.value, checked.params, checked.mask,
                                         checked.num_heads, tuple(params), scale=scale)


def multi_head_attention_backward_fast(dout, cache: MultiHeadCache):
    """:func:`attention_ref.core.multi_head_attention_backward`, fast."""
    out_shape = cache.heads.shape[:-3] + (cache.heads.shape[-2], cache.o_proj.W.shape[1])  # (..., Nq, Dout)
    return _multi_head_attention_backward(as_upstream(dout, out_shape, cache.o_proj.x.dtype), cache)
