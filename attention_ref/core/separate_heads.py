"""Strategy one of document 000 (section 3.2): heads as separate single-head computations.

Each head ``i`` is its own small attention layer with weights ``W_i^Q``, ``W_i^K``,
``W_i^V`` (column blocks of ``W_q``, ``W_k``, ``W_v``); the outputs are concatenated and
projected by ``W^O``. This is the documents' formula read literally, one head at a time,
with a Python loop over heads on purpose: it is the teaching form, and an independent check
of the parallel form (:mod:`attention_ref.core.multi_head`). It shares no attention code
with it: the scores and products are ``einsum`` over named axes, and the softmax step is
the softmax pair itself (:mod:`attention_ref.core.softmax`), whose backward sums
``P * dP`` where the attention backward uses ``dout . out``. Only the projections (the
linear pair) and the input checks are common.

Symbols as in :mod:`attention_ref.core.multi_head`.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .._checks import as_upstream, signals_land_here, unbroadcast
from .._pair_checks import check_multi_head_inputs, check_scores_finite
from .linear import LinearCache, _linear_backward, _linear_finite
from .masks import apply_mask
from .multi_head import _SCORE_NAMES
from .softmax import SoftmaxCache, softmax_backward, softmax_forward

__all__ = [
    "SeparateHeadsCache",
    "multi_head_attention_separate_heads_forward",
    "multi_head_attention_separate_heads_backward",
]


class HeadCache(NamedTuple):
    """One head's caches: its three projections, their outputs and its softmax."""

    q_proj: LinearCache
    k_proj: LinearCache
    v_proj: LinearCache
    Q: np.ndarray  # (..., Nq, Dk)
    K: np.ndarray  # (..., Nk, Dk)
    V: np.ndarray  # (..., Nk, Dv)
    softmax: SoftmaxCache  # its y are the head's weights, (..., Nq, Nk)


class SeparateHeadsCache(NamedTuple):
    """One :class:`HeadCache` per head, and the output projection's cache."""

    head_caches: tuple
    o_proj: LinearCache
    param_keys: tuple

    @property
    def weights(self) -> np.ndarray:
        """Attention probabilities of every head, (..., H, Nq, Nk)."""
        return np.stack([c.softmax.y for c in self.head_caches], axis=-3)


def _head_slice(p, name, i, width):
    """Columns ``i*width:(i+1)*width`` of weight or bias ``name`` (None when absent)."""
    a = p.get(name)
    return None if a is None else a[..., i * width:(i + 1) * width]


def multi_head_attention_separate_heads_forward(query, key, value, params, num_heads, mask=None):
    """Multi-head attention computed head by head, then ``Concat(head_1..head_h) W^O``; arguments
    ``(query, key, value, params, num_heads, mask)`` and weights ``(d_in, d_out)`` as
    :func:`multi_head_attention_forward`.

    Same arguments, shapes and result as :func:`multi_head_attention_forward` (ordinary
    multi-head attention: one key/value head per query head).
    """
    query, key, value, p, mask, _, h, _ = check_multi_head_inputs(query, key, value, params, num_heads, mask)
    d_k, d_v = p["W_q"].shape[1] // h, p["W_v"].shape[1] // h
    heads, caches = [], []
    for i in range(h):  # the teaching loop: one single-head attention per head
        W_q, b_q = _head_slice(p, "W_q", i, d_k), _head_slice(p, "b_q", i, d_k)
        W_k, b_k = _head_slice(p, "W_k", i, d_k), _head_slice(p, "b_k", i, d_k)
        W_v, b_v = _head_slice(p, "W_v", i, d_v), _head_slice(p, "b_v", i, d_v)
        Q = _linear_finite(query, W_q, b_q, ("query", "W_q", "b_q"))  # Q_i = query W_i^Q, (..., Nq, Dk)
        K = _linear_finite(key, W_k, b_k, ("key", "W_k", "b_k"))  # K_i = key W_i^K, (..., Nk, Dk)
        V = _linear_finite(value, W_v, b_v, ("value", "W_v", "b_v"))  # V_i = value W_i^V, (..., Nk, Dv)
        with np.errstate(over="ignore", invalid="ignore"):  # an overflow is named just below
            S = np.einsum("...qd,...kd->...qk", Q, K) / math.sqrt(d_k)  # S_i = Q_i K_i^T / sqrt(d_k)
            masked = apply_mask(S, mask)  # (..., Nq, Nk)
            signals_land_here()  # a Ctrl-C is raised inside the block (_pair_checks.py)
        check_scores_finite(S, masked, mask, Q, K, _SCORE_NAMES)
        P, softmax_cache = softmax_forward(masked, axis=-1)  # P_i = softmax(S_i), (..., Nq, Nk)
        heads.append(np.einsum("...qk,...kd->...qd", P, V))  # head_i = P_i V_i, (..., Nq, Dv)
        caches.append(HeadCache(LinearCache(query, W_q, b_q is not None), LinearCache(key, W_k, b_k is not None),
                                LinearCache(value, W_v, b_v is not None), Q, K, V, softmax_cache))
    concat = np.concatenate(heads, axis=-1)  # Concat(head_1..head_h), (..., Nq, H*Dv)
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
    d_v = dconcat.shape[-1] // len(cache.head_caches)
    parts = {n: [] for n in ("W_q", "b_q", "W_k", "b_k", "W_v", "b_v")}
    dinputs = {"q": 0, "k": 0, "v": 0}  # dquery, dkey, dvalue: the sums over heads
    for i, c in enumerate(cache.head_caches):
        dhead = dconcat[..., i * d_v:(i + 1) * d_v]  # Concat's backward: a slice, (..., Nq, Dv)
        P = c.softmax.y  # (..., Nq, Nk)
        dV = np.einsum("...qk,...qd->...kd", P, dhead)  # head_i = P V: dV = P^T dhead
        dP = unbroadcast(np.einsum("...qd,...kd->...qk", dhead, c.V), P.shape)  # dP = dhead V^T (summed
        #    over batch axes only the values carry: P does not depend on them)
        dS = softmax_backward(dP, c.softmax)  # dS = P * (dP - rowsum(P * dP))
        with np.errstate(under="ignore"):  # products with a weight far below 1 may round to 0
            dQ = np.einsum("...qk,...kd->...qd", dS, c.K) / math.sqrt(c.K.shape[-1])  # dQ = dS K / sqrt(d_k)
            dK = np.einsum("...qk,...qd->...kd", dS, c.Q) / math.sqrt(c.K.shape[-1])  # dK = dS^T Q / sqrt(d_k)
            signals_land_here()  # a Ctrl-C is raised inside the block (_pair_checks.py)
        for name, d_proj, proj in (("q", dQ, c.q_proj), ("k", dK, c.k_proj), ("v", dV, c.v_proj)):
            shape = proj.x.shape[:-1] + (proj.W.shape[1],)  # the projection's own batch axes
            dx, dW, db = _linear_backward(unbroadcast(d_proj, shape), proj)
            parts["W_" + name].append(dW)
            parts["b_" + name].append(db)
            dinputs[name] = dinputs[name] + dx
    grads = {"W_o": dW_o, "b_o": db_o}
    for name, blocks in parts.items():
        grads[name] = None if blocks[0] is None else np.concatenate(blocks, axis=-1)
    return dinputs["q"], dinputs["k"], dinputs["v"], {n: grads[n] for n in cache.param_keys}
