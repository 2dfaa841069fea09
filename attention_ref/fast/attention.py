"""Scaled dot-product attention for large inputs: the reference's formulas
(:mod:`attention_ref.core.attention`) with the speed tricks, same signatures and same cache.

What each trick buys is measured in ``docs/performance.md`` ("The tricks"):

* overflow ruled out by a bound from ``max|q|`` and ``max|k|`` (two reductions) instead of
  a pass over the scores; the mask written into the fresh scores; the softmax in place over
  cache-sized row blocks (:mod:`attention_ref.fast.softmax`);
* the backward's ``dP``, ``dS`` and their products over blocks of query rows in one reused
  buffer (``QUERY_BLOCK_ELEMENTS``), so no second ``(..., Nq, Nk)`` array is allocated; ``dS``
  in place.

``tests/fast/`` checks every function here against the reference.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from .._checks import as_upstream, overflow_error, scores_may_overflow, signals_land_here, unbroadcast
from .._pair_checks import check_attention_inputs, check_scale
from ..core.attention import AttentionCache
from .row_blocks import for_each_row_block, rows_per_block
from .softmax import ScoresOverflow, softmax_backward_in_place, softmax_in_place

__all__ = ["QUERY_BLOCK_ELEMENTS", "scaled_dot_product_attention_forward_fast", "scaled_dot_product_attention_backward_fast"]

#: Numbers in a block of query rows of the backward's dP and dS, ``(..., rows, Nk)``: 2**21
#: (8 MiB in float32); 2**21 and 2**22 measured best end to end among 2**18..2**23
#: (docs/performance.md): smaller blocks make the thin products slower.
QUERY_BLOCK_ELEMENTS = 1 << 21


def _underflow_is_harmless(steps):
    """Run ``steps`` with NumPy's underflow ignored: a product with a weight far below 1 (the exp
    of a score far below its row's maximum) rounds to 0, as it should, under any ``np.seterr``."""
    @functools.wraps(steps)
    def run(*args, **kwargs):
        with np.errstate(under="ignore"):
            result = steps(*args, **kwargs)
            signals_land_here()  # a Ctrl-C is raised inside the block (_pair_checks.py)
        return result
    return run


@_underflow_is_harmless
def _attention_forward(q, k, v, mask, names=("q", "k"), scale=None):
    """The reference's steps 1-4 on checked inputs, fast; ``names`` label q and k in errors."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale  # a Python float keeps float32 float32
    # 1. scores = (q / sqrt(d_k)) k^T, as in the reference
    with np.errstate(over="ignore", invalid="ignore"):  # an overflow is named below
        scores = (q * scale) @ k.swapaxes(-1, -2)  # (..., Nq, Nk)
        signals_land_here()  # a Ctrl-C is raised inside the block (_pair_checks.py)
    if scores_may_overflow(q, k, scale) and not np.isfinite(scores).all():  # a pass only near the limit
        raise overflow_error("the attention scores q k^T / sqrt(d_k)", q.dtype, zip(names, (q, k)))
    # 2. masking, written into the fresh scores
    if mask is not None:
        full = np.broadcast_shapes(scores.shape, mask.shape)
        if full != scores.shape:  # the mask carries batch axes of v only: widen the scores
            scores = np.broadcast_to(scores, full).copy()  # (..., Nq, Nk)
        if mask.dtype == bool:
            np.copyto(scores, -np.inf, where=~mask)  # blocked keys get weight exactly 0
        else:
            with np.errstate(over="ignore"):  # a +inf sum shows in the softmax's row maxima
                scores += mask
                signals_land_here()  # a Ctrl-C is raised inside the block (_pair_checks.py)
    # 3. weights = softmax(scores), in place over row blocks
    try:
        weights = softmax_in_place(scores)  # (..., Nq, Nk)
    except ScoresOverflow:  # finite scores (step 1), so a huge positive float mask did it
        what = f"the scores q k^T / sqrt(d_k) + mask (largest mask value {mask.max():.3g})"
        raise overflow_error(what, q.dtype, zip(names, (q, k))) from None
    # 4. out = weights v
    out = weights @ v  # (..., Nq, Dv)
    return out, AttentionCache(q, k, v, weights, out, scale)


@_underflow_is_harmless
def _attention_backward(dout, cache: AttentionCache):
    """The reference's backward, with dP and dS over blocks of query rows in one buffer."""
    q, k, v, weights, out, scale = cache
    batch, (n_q, n_k) = dout.shape[:-2], weights.shape[-2:]  # dout carries every batch axis
    dv = weights.swapaxes(-1, -2) @ dout  # 4. dv = P^T dout, (..., Nk, Dv)
    D = (dout * out).sum(axis=-1, keepdims=True)  # 3. D_i = dout_i . out_i, (..., Nq, 1)
    dq = np.empty(batch + (n_q, q.shape[-1]), weights.dtype)  # (..., Nq, Dk), filled by the blocks
    dk = np.empty(batch + (n_k, k.shape[-1]), weights.dtype)  # (..., Nk, Dk), summed over the blocks
    n_cols = math.prod(batch) * n_k  # numbers in one query row of all batch items and heads
    buffer = np.empty(batch + (min(n_q, rows_per_block(n_q, n_cols, QUERY_BLOCK_ELEMENTS)), n_k),
                      weights.dtype)  # (..., rows, Nk), reused by every block

    def query_rows(start, stop):
        r = slice(start, stop)
        dP = np.matmul(dout[..., r, :], v.swapaxes(-1, -2), out=buffer[..., :stop - start, :])  # 4. dout v^T
        dS = softmax_backward_in_place(dP, weights[..., r, :], D[..., r, :])  # 3. P * (dP - D)
        np.matmul(dS, k, out=dq[..., r, :])  # 1. dq = dS k (the scale follows, once)
        if start == 0:  # 1. dk = dS^T q, summed over the blocks: the first writes dk (no zeroed array)
            np.matmul(dS.swapaxes(-1, -2), q[..., r, :], out=dk)
        else:
            dk[...] += dS.swapaxes(-1, -2) @ q[..., r, :]

    for_each_row_block(query_rows, n_q, n_cols, QUERY_BLOCK_ELEMENTS)
    dq *= scale  # dq = dS k / sqrt(d_k)
    dk *= scale  # dk = dS^T q / sqrt(d_k)
    return unbroadcast(dq, q.shape), unbroadcast(dk, k.shape), unbroadcast(dv, v.shape)


def scaled_dot_product_attention_forward_fast(q, k, v, mask=None, *, scale=None):
    """:func:`attention_ref.core.scaled_dot_product_attention_forward`, fast: same arguments,
    result within rounding, same cache."""
    scale, (q, k, v, mask, _) = check_scale(scale), check_attention_inputs(q, k, v, mask)
    out, cache = _attention_forward(q, k, v, mask, scale=scale)
    return out.copy(), cache


def scaled_dot_product_attention_backward_fast(dout, cache: AttentionCache):
    """:func:`attention_ref.core.scaled_dot_product_attention_backward`, fast (query-row blocks)."""
    return _attention_backward(as_upstream(dout, cache.out.shape, cache.out.dtype), cache)
