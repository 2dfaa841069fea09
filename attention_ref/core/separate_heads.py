"""Strategy one of document 000 (section 三.2): heads as separate single-head computations.

Each head ``i`` is its own small attention layer with weights ``W_i^Q``, ``W_i^K``,
``W_i^V`` (column blocks of ``W_q``, ``W_k``, ``W_v``); the outputs are concatenated and
projected by ``W^O``. This is the documents' formula read literally, one head at a time,
with a Python loop over heads on purpose: it is the teaching form and the reference the
parallel form (:mod:`attention_ref.core.multi_head`) is checked against, not the fast path.

Symbols as in :mod:`attention_ref.core.multi_head`.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._checks import as_upstream
from .attention import _attention_backward, _attention_forward
from .linear import LinearCache, _linear_backward, _linear_finite
from .multi_head import _SCORE_NAMES, check_multi_head_inputs

__all__ = [
    "SeparateHeadsCache",
    "multi_head_attention_separate_heads_forward",
    "multi_head_attention_separate_heads_backward",
]


class SeparateHeadsCache(NamedTuple):
    """One (q, k, v) projection cache and one attention cache per head."""

    head_caches: tuple  # ((LinearCache q, LinearCache k, LinearCache v, AttentionCache), ...)
    o_proj: LinearCache
    param_keys: tuple

    @property
    def weights(self) -> np.ndarray:
        """Attention probabilities of every head, (..., H, Nq, Nk)."""
        return np.stack([c[3].weights for c in self.head_caches], axis=-3)


def _head_slice(p, name, i, width):
    """Columns ``i*width:(i+1)*width`` of weight or bias ``name`` (None when absent)."""
    a = p.get(name)
    return None if a is None else a[..., i * width:(i + 1) * width]


def multi_head_attention_separate_heads_forward(query, key, value, params, num_heads, mask=None):
    """Multi-head attention computed head by head, then ``Concat(head_1..head_h) W^O``.

    Same arguments, shapes and result as :func:`multi_head_attention_forward` (ordinary
    multi-head attention: one key/value head per query head).
    """
    query, key, value, p, mask, _, h, _ = check_multi_head_inputs(
        query, key, value, params, num_heads, mask)
    d_k = p["W_q"].shape[1] // h
    d_v = p["W_v"].shape[1] // h
    outs, caches = [], []
    for i in range(h):  # the teaching loop: one single-head attention per head
        W_q, b_q = _head_slice(p, "W_q", i, d_k), _head_slice(p, "b_q", i, d_k)
        W_k, b_k = _head_slice(p, "W_k", i, d_k), _head_slice(p, "b_k", i, d_k)
        W_v, b_v = _head_slice(p, "W_v", i, d_v), _head_slice(p, "b_v", i, d_v)
        q_i = _linear_finite(query, W_q, b_q, ("query", "W_q", "b_q"))  # Q_i = query W_i^Q, (..., Nq, Dk)
        k_i = _linear_finite(key, W_k, b_k, ("key", "W_k", "b_k"))  # K_i = key W_i^K, (..., Nk, Dk)
        v_i = _linear_finite(value, W_v, b_v, ("value", "W_v", "b_v"))  # V_i = value W_i^V, (..., Nk, Dv)
        head_i, attn = _attention_forward(q_i, k_i, v_i, mask, _SCORE_NAMES)  # (..., Nq, Dv)
        outs.append(head_i)
        caches.append((LinearCache(query, W_q, b_q is not None), LinearCache(key, W_k, b_k is not None),
                       LinearCache(value, W_v, b_v is not None), attn))
    concat = np.concatenate(outs, axis=-1)  # Concat(head_1..head_h), (..., Nq, H*Dv)
    out = _linear_finite(concat, p["W_o"], p.get("b_o"), ("concat", "W_o", "b_o"))  # (..., Nq, Dout)
    o_cache = LinearCache(concat, p["W_o"], p.get("b_o") is not None)
    return out, SeparateHeadsCache(tuple(caches), o_cache, tuple(params))


def multi_head_attention_separate_heads_backward(dout, cache: SeparateHeadsCache):
    """Backward of the head-by-head form; returns ``(dquery, dkey, dvalue, grads)`` like
    :func:`multi_head_attention_backward`. Each head's weight gradient fills its own
    column block of ``dW_q``, ``dW_k``, ``dW_v``; the input gradients add up over heads."""
    expected = cache.o_proj.x.shape[:-1] + (cache.o_proj.W.shape[1],)  # (..., Nq, Dout)
    dout = as_upstream(dout, expected, cache.o_proj.x.dtype)
    dconcat, dW_o, db_o = _linear_backward(dout, cache.o_proj)  # (..., Nq, H*Dv)
    h = len(cache.head_caches)
    d_v = dconcat.shape[-1] // h
    parts = {n: [] for n in ("W_q", "b_q", "W_k", "b_k", "W_v", "b_v")}
    dquery = dkey = dvalue = 0
    for i, (qc, kc, vc, attn) in enumerate(cache.head_caches):
        dhead = dconcat[..., i * d_v:(i + 1) * d_v]  # Concat's backward: slice, (..., Nq, Dv)
        dq_i, dk_i, dv_i = _attention_backward(dhead, attn)
        for name, d_in, lc in (("q", dq_i, qc), ("k", dk_i, kc), ("v", dv_i, vc)):
            dx, dW, db = _linear_backward(d_in, lc)
            parts["W_" + name].append(dW)
            parts["b_" + name].append(db)
            if name == "q":
                dquery = dquery + dx
            elif name == "k":
                dkey = dkey + dx
            else:
                dvalue = dvalue + dx
    grads = {"W_o": dW_o, "b_o": db_o}
    for name, blocks in parts.items():
        grads[name] = None if blocks[0] is None else np.concatenate(blocks, axis=-1)
    return dquery, dkey, dvalue, {n: grads[n] for n in cache.param_keys}
