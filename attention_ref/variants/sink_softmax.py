"""Softmax with a learned sink per head (gpt-oss's attention), and its backward.

Each head ``h`` has one learned logit ``sigma_h``, the "sink": an extra column of the score
matrix that every query row sees, which takes part in the softmax's denominator and is then
dropped. A row's weights on the real keys therefore sum to ``1 - p_sink <= 1``: attention can
put weight on nothing (Xiao et al. 2023 found that models invent such a sink out of the first
token; gpt-oss learns it as a parameter, OpenAI's gpt-oss model card, 2025). transformers'
``gpt_oss`` eager attention computes it by concatenating the sink column, subtracting the row
maximum including it, taking the softmax and dropping the last column; so does this module.

Symbols: ``...`` batch axes, H heads, Nq queries, Nk keys.

Forward, for each row ``s`` (..., h, i, :) of the scores (masked entries are ``-inf``):

1. ``z = [s, sigma_h]``                               (..., H, Nq, Nk + 1)
2. ``m = max_j z_j``                                   (..., H, Nq, 1), finite: the sink is
3. ``e = exp(z - m)``, ``p = e / sum_j e_j``
4. ``P = p[..., :Nk]``, ``p_sink = p[..., Nk]``        (..., H, Nq, Nk) and (..., H, Nq)

A fully masked row (every score ``-inf``) is defined: ``m = sigma_h``, ``p_sink = 1`` and
``P = 0``, so the query attends to nothing and its output ``P V`` is zero; its gradients are
zero too. (Plain softmax has no finite entry there; here the sink always is one.)
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .._checks import as_real_array, as_upstream, common_dtype, require_ndim, signals_land_here, unbroadcast
from ..core.attention import AttentionCache
from ..core.masks import apply_mask

__all__ = ["SinkSoftmaxCache", "sink_softmax_forward", "sink_softmax_backward", "sink_softmax_formula",
           "sink_softmax_backward_formula", "sink_attention_formula", "sink_attention_backward_formula"]


class SinkSoftmaxCache(NamedTuple):
    """The weights on the keys and on the sink: all the backward needs."""

    P: np.ndarray  # (..., H, Nq, Nk), the weights on the keys
    p_sink: np.ndarray  # (..., H, Nq, 1), the weight on the sink, 1 - sum_j P_j
    sinks_shape: tuple  # (H,)


def sink_softmax_forward(scores, sinks):
    """Softmax over each row of ``scores`` with the head's sink logit in the denominator.

    ``P_ij = exp(s_ij - m_i) / (exp(sigma_h - m_i) + sum_l exp(s_il - m_i))`` with
    ``m_i = max(sigma_h, max_l s_il)``.

    Parameters
    ----------
    scores : array (..., H, Nq, Nk), the scaled scores with the mask applied (``-inf`` where a
        key is masked; a row of only ``-inf`` is allowed)
    sinks : array (H,), one sink logit per head (transformers' ``self_attn.sinks``)

    Returns
    -------
    P : array (..., H, Nq, Nk), each row sums to ``1 - p_sink`` (in the promoted dtype of the
        inputs: float32 stays float32)
    cache : SinkSoftmaxCache for :func:`sink_softmax_backward`
    """
    scores = as_real_array(scores, "scores", allow_neg_inf=True)
    require_ndim(scores, "scores", 3, "(..., H, Nq, Nk)")
    sinks = as_real_array(sinks, "sinks")
    if sinks.shape != (scores.shape[-3],):
        raise ValueError(f"sinks must have shape (H,) = ({scores.shape[-3]},), one logit per head of scores"
                         f" {scores.shape}, got {sinks.shape}")
    dtype = common_dtype(scores, sinks)
    scores, sinks = scores.astype(dtype, copy=False), sinks.astype(dtype, copy=False)
    # 1. the sink column, the same logit for every query of head h
    P, p_sink = sink_softmax_formula(scores, sinks[:, None, None])
    return P.copy(), SinkSoftmaxCache(P, p_sink, sinks.shape)


def sink_softmax_formula(scores, sink):
    """Steps 2-4 of :func:`sink_softmax_forward` on checked inputs: ``(P, p_sink)``, with ``sink``
    the sink logits broadcastable to ``scores.shape[:-1] + (1,)`` (the grouped heads' layout
    (Hkv, G, 1, 1) as well as (H, 1, 1)); the multi-head layer's attention with sinks calls it."""
    sink = np.broadcast_to(sink, scores.shape[:-1] + (1,))  # (..., H, Nq, 1)
    # 2. the row maximum including the sink: finite, so no row is 0 / 0
    m = np.maximum(scores.max(axis=-1, keepdims=True, initial=-np.inf), sink)  # (..., H, Nq, 1)
    with np.errstate(over="ignore", under="ignore"):  # a difference past the range is -inf: exp gives 0, as it should
        # 3. exponentials and the denominator, sink included
        e = np.exp(scores - m)  # (..., H, Nq, Nk), 0 at masked keys
        e_sink = np.exp(sink - m)  # (..., H, Nq, 1)
        denominator = e.sum(axis=-1, keepdims=True) + e_sink  # (..., H, Nq, 1), at least 1
        # 4. the weights, the sink's column dropped
        P = e / denominator  # (..., H, Nq, Nk)
        p_sink = e_sink / denominator  # (..., H, Nq, 1)
        signals_land_here()  # a Ctrl-C is raised inside the block (_pair_checks.py)
    return P, p_sink


def sink_softmax_backward(dP, cache: SinkSoftmaxCache):
    """Gradients of :func:`sink_softmax_forward`, its steps in reverse.

    4.-1. ``P`` is the first ``Nk`` entries of ``p = softmax(z)``; the dropped sink entry gets no
    upstream gradient, so with ``dp = [dP, 0]`` softmax's vector-Jacobian product
    ``dz_j = p_j (dp_j - sum_l p_l dp_l)`` gives, with ``c = sum_l P_l dP_l`` per row,

    * ``dscores = P * (dP - c)``
    * ``dsink_row = p_sink * (0 - c) = -p_sink c``, and ``dsinks_h`` sums it over every batch
      entry and query of head ``h`` (the sink is one parameter shared by the rows).

    The max subtracted in step 2 changes no value, so it gets no gradient.

    Parameters
    ----------
    dP : array (..., H, Nq, Nk), shaped like the forward output
    cache : SinkSoftmaxCache

    Returns
    -------
    dscores : array (..., H, Nq, Nk)
    dsinks : array (H,)
    """
    P, p_sink, _ = cache
    dP = as_upstream(dP, P.shape, P.dtype, "dP")
    dscores, dsink_rows = sink_softmax_backward_formula(dP, P, p_sink)
    axes = tuple(range(P.ndim - 3)) + (P.ndim - 2, P.ndim - 1)  # every axis but H
    return dscores, dsink_rows.sum(axis=axes)  # (..., H, Nq, Nk) and (H,)


def sink_softmax_backward_formula(dP, P, p_sink):
    """Steps 4.-1. of :func:`sink_softmax_backward` on a checked ``dP``: ``(dscores, dsink_rows)``,
    ``dsink_rows`` (..., Nq, 1) each row's share of its head's sink gradient (the caller sums it
    over the rows of each head)."""
    with np.errstate(under="ignore"):  # a tiny weight times dP rounds to 0, as it should
        c = (P * dP).sum(axis=-1, keepdims=True)  # (..., H, Nq, 1)
        dscores = P * (dP - c)  # (..., H, Nq, Nk)
        dsink_rows = -p_sink * c  # (..., H, Nq, 1)
        signals_land_here()  # a Ctrl-C is raised inside the block (_pair_checks.py)
    return dscores, dsink_rows


def sink_attention_formula(q, k, v, mask, scale, sink):
    """Scaled dot-product attention whose softmax has a sink per head, on checked inputs (the
    multi-head layer's step 3 with ``sinks``: gpt-oss): ``(out, cache, p_sink)``.

    1. ``S = (q scale) k^T``; 2. the mask; 3. ``P = sink_softmax(S)`` (:func:`sink_softmax_formula`,
    ``sink`` broadcastable to (..., Nq, 1)); 4. ``out = P v``. ``scale`` None is ``1 / sqrt(Dk)``;
    ``cache`` an :class:`attention_ref.core.attention.AttentionCache`, ``p_sink`` (..., Nq, 1) the
    weight each row put on its sink."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale  # a Python float: float32 stays float32
    with np.errstate(under="ignore"):
        S = (q * scale) @ k.swapaxes(-1, -2)  # 1. (..., Nq, Nk)
        P, p_sink = sink_softmax_formula(apply_mask(S, mask), sink)  # 2.-3. (..., Nq, Nk), (..., Nq, 1)
        out = P @ v  # 4. (..., Nq, Dv)
        signals_land_here()  # a Ctrl-C is raised inside the block (_pair_checks.py)
    return out, AttentionCache(q, k, v, P, out, scale), p_sink


def sink_attention_backward_formula(dout, cache: AttentionCache, p_sink):
    """:func:`sink_attention_formula`'s steps in reverse: ``(dq, dk, dv, dsink_rows)``, the first
    three summed over the axes their input broadcast over, ``dsink_rows`` (..., Nq, 1) as
    :func:`sink_softmax_backward_formula` gives it (the caller sums each head's rows)."""
    q, k, v, P, out, scale = cache
    with np.errstate(under="ignore"):
        dv = P.swapaxes(-1, -2) @ dout  # 4. dv = P^T dout
        dP = dout @ v.swapaxes(-1, -2)  # 4. dP = dout v^T
        dS, dsink_rows = sink_softmax_backward_formula(dP, P, p_sink)  # 3. the sink softmax; 2. the mask passes
        dq = dS @ k * scale  # 1. S = (q scale) k^T
        dk = dS.swapaxes(-1, -2) @ q * scale
        signals_land_here()  # a Ctrl-C is raised inside the block (_pair_checks.py)
    return unbroadcast(dq, q.shape), unbroadcast(dk, k.shape), unbroadcast(dv, v.shape), dsink_rows
