"""Scaled dot-product attention, ``softmax(q k^T / sqrt(d_k) + mask) v``, and its backward.

Symbols: ``...`` batch axes (any number, broadcast between q, k and v), Nq queries,
Nk keys, Dk query/key width, Dv value width.

Forward, numbered so the backward can walk it in reverse:

1. ``scores = q k^T / sqrt(d_k)``                        (..., Nq, Nk)
2. masking: ``scores[~mask] = -inf`` (boolean) or ``scores += mask`` (float)
3. ``weights = softmax(scores)`` along the keys          (..., Nq, Nk)
4. ``out = weights v``                                   (..., Nq, Dv)

Scores too large for the dtype (``q`` and ``k`` near 1e19 in float32, 1e154 in float64)
raise ``FloatingPointError`` naming q, k, the dtype and its largest finite value, instead
of NaN and a NumPy ``RuntimeWarning``. No pass over the (..., Nq, Nk) scores on ordinary
inputs: a bound from ``max|q|`` and ``max|k|`` rules overflow out (two reductions each),
and a float mask that overflows the scores shows in the softmax's row maxima, which it
computes anyway.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .._checks import (
    as_mask,
    as_real_array,
    as_upstream,
    broadcast_batch,
    cast,
    cast_mask,
    check_mask_shape,
    check_positive_real,
    common_dtype,
    overflow_error,
    require_ndim,
    scores_may_overflow,
    unbroadcast,
)
from .._batch_blocks import parallel_region, plan_blocks, run_blocks, take_block
from .._row_blocks import for_each_row_block, rows_per_block
from .softmax import _ScoresOverflow, _softmax

__all__ = [
    "AttentionCache",
    "scaled_dot_product_attention_forward",
    "scaled_dot_product_attention_backward",
]


#: Numbers in a block of query rows of the backward's dP and dS, ``(..., rows, Nk)``: 2**21
#: (8 MiB in float32); 2**21 and 2**22 measured best end to end among 2**18..2**23
#: (docs/performance.md): smaller blocks make the thin products slower.
QUERY_BLOCK_ELEMENTS = 1 << 21


class AttentionCache(NamedTuple):
    """What the backward needs; ``weights`` are the attention probabilities."""

    q: np.ndarray  # (..., Nq, Dk)
    k: np.ndarray  # (..., Nk, Dk)
    v: np.ndarray  # (..., Nk, Dv)
    weights: np.ndarray  # (..., Nq, Nk), softmax output; 0 where masked. Batch axes: those of q,
    #                      k and the mask (axes only v carries are broadcast in weights @ v)
    out: np.ndarray  # (..., Nq, Dv), kept for D_i = rowsum(dout_i * out_i)
    scale: float  # 1 / sqrt(d_k) unless another scale was given


def check_attention_inputs(q, k, v, mask, names=("q", "k", "v")):
    """Validate q, k, v and mask; return them cast to one dtype plus the scores' shape."""
    q_name, k_name, v_name = names
    q = as_real_array(q, q_name)
    k = as_real_array(k, k_name)
    v = as_real_array(v, v_name)
    require_ndim(q, q_name, 2, "(..., n_q, d_k)")
    require_ndim(k, k_name, 2, "(..., n_k, d_k)")
    require_ndim(v, v_name, 2, "(..., n_k, d_v)")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"{q_name} and {k_name} must share their last dimension d_k: {q_name} has shape"
            f" {q.shape}, {k_name} has shape {k.shape}"
        )
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(
            f"{k_name} and {v_name} must have the same length n_k (axis -2): {k_name} has"
            f" shape {k.shape}, {v_name} has shape {v.shape}"
        )
    if q.shape[-1] == 0:
        raise ValueError(f"d_k must be positive: {q_name} has shape {q.shape}")
    batch = broadcast_batch(
        [(q_name, q.shape[:-2]), (k_name, k.shape[:-2]), (v_name, v.shape[:-2])],
        what="batch dimensions (all but the last two axes)",
    )
    scores_shape = batch + (q.shape[-2], k.shape[-2])
    mask = as_mask(mask)
    check_mask_shape(mask, scores_shape)
    dtype = common_dtype(q, k, v)
    return cast(q, dtype), cast(k, dtype), cast(v, dtype), cast_mask(mask, dtype), scores_shape


def check_scale(scale):
    """``None`` (the default ``1/sqrt(d_k)``) or a positive finite real number, as a float."""
    return None if scale is None else check_positive_real(scale, "scale", "a positive real number or None")


def scaled_dot_product_attention_forward(q, k, v, mask=None, *, scale=None):
    """Scaled dot-product attention ``softmax(q k^T / sqrt(d_k) + mask) v``.

    Parameters
    ----------
    q : array (..., n_q, d_k), queries
    k : array (..., n_k, d_k), keys
    v : array (..., n_k, d_v), values
    mask : None, bool array (True = may attend) or float array (added to the scaled
        scores), broadcastable to (..., n_q, n_k); see :mod:`attention_ref.core.masks`
    scale : the factor on ``q k^T``; None (default) is ``1 / sqrt(d_k)`` (GPT-2's
        ``scale_attn_weights=False`` is ``scale=1.0``)

    Returns
    -------
    out : array (..., n_q, d_v); zero for a query with no allowed key
    cache : AttentionCache; ``cache.weights`` (..., n_q, n_k) are the probabilities, with
        the batch axes of q, k and the mask (not those that only v carries: the
        probabilities do not depend on v, so they are not repeated for them)

    Raises
    ------
    FloatingPointError : when the scores (plus a float mask) overflow the dtype
    """
    scale = check_scale(scale)
    q, k, v, mask, _ = check_attention_inputs(q, k, v, mask)
    out, cache = _attention_forward(q, k, v, mask, scale=scale)
    return out.copy(), cache  # the caller's own copy: editing it cannot change the backward


def _attention_forward(q, k, v, mask, names=("q", "k"), scale=None):
    """Unchecked forward on validated, same-dtype inputs; ``names`` label q and k in errors."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale  # a Python float keeps float32 float32
    shape = np.broadcast_shapes(q.shape[:-2] + (q.shape[-2], k.shape[-2]), k.shape[:-2] + (1, 1),
                                (1, 1) if mask is None else mask.shape)  # the probabilities' (..., Nq, Nk)
    batch = cuttable_batch(shape, v)
    try:
        with parallel_region(math.prod(shape), batch):
            plan = plan_blocks(batch)
            if plan is None:
                out, weights = _attend(q, k, v, mask, scale)
            else:  # the same steps on blocks of the batch axes, on parallel threads (_batch_blocks.py)
                out, weights = _attend_in_blocks(q, k, v, mask, scale, shape, *plan)
    except _ScoresOverflow as e:
        if e.args:  # step 1: q k^T itself
            raise overflow_error("the attention scores q k^T / sqrt(d_k)", q.dtype, zip(names, (q, k))) from None
        # finite scores (step 1), so a huge positive float mask did it
        what = f"the scores q k^T / sqrt(d_k) + mask (largest mask value {mask.max():.3g})"
        raise overflow_error(what, q.dtype, zip(names, (q, k))) from None
    return out, AttentionCache(q, k, v, weights, out, scale)


def _attend(q, k, v, mask, scale, weights=None, out=None):
    """Steps 1-4; writes the probabilities into ``weights`` and the result into ``out`` when
    given (blocks of preallocated arrays). Overflow raises ``_ScoresOverflow``."""
    # 1. scores = q k^T / sqrt(d_k), computed as (q / sqrt(d_k)) k^T: the scale touches
    #    n_q * d_k numbers instead of n_q * n_k. Overflow is reported by name, by the caller.
    with np.errstate(over="ignore", invalid="ignore"):
        scores = np.matmul(q * scale, k.swapaxes(-1, -2), out=weights)  # (..., Nq, Nk)
    if scores_may_overflow(q, k, scale) and not np.isfinite(scores).all():  # a pass only near the limit
        raise _ScoresOverflow("scores")
    # 2. masking
    if mask is not None:
        full = np.broadcast_shapes(scores.shape, mask.shape)
        if full != scores.shape:  # the mask carries batch axes of v only: widen the scores
            scores = np.broadcast_to(scores, full).copy()  # (..., Nq, Nk)
        if mask.dtype == bool:
            np.copyto(scores, -np.inf, where=~mask)  # blocked keys get weight exactly 0
        else:
            with np.errstate(over="ignore"):  # a +inf sum shows in the softmax's row maxima
                scores += mask  # already in the scores' dtype (see cast_mask)
    # 3. weights = softmax(scores), in place: nobody else holds `scores`
    weights = _softmax(scores, axis=-1, out=scores)  # (..., Nq, Nk); +inf rows raise _ScoresOverflow
    # 4. out = weights v
    out = np.matmul(weights, v, out=out)  # (..., Nq, Dv)
    return out, weights


def cuttable_batch(shape, v):
    """The batch axes of the probabilities ``shape`` (..., Nq, Nk) that blocks may cut: all of
    them when v adds none (every block is then a slice of whole arrays), else none."""
    batch = shape[:-2]
    return batch if np.broadcast_shapes(batch, v.shape[:-2]) == batch else ()


def _attend_in_blocks(q, k, v, mask, scale, shape, axis, blocks):
    """:func:`_attend` on each block of batch axis ``axis``, into whole preallocated arrays."""
    weights = np.empty(shape, q.dtype)  # (..., Nq, Nk)
    out = np.empty(shape[:-1] + (v.shape[-1],), q.dtype)  # (..., Nq, Dv)
    overflows = []

    def one(block):
        q_b, k_b, v_b, mask_b, w_b, out_b = (take_block(x, axis, block) for x in (q, k, v, mask, weights, out))
        try:
            _attend(q_b, k_b, v_b, mask_b, scale, weights=w_b, out=out_b)
        except _ScoresOverflow as e:
            overflows.append(e)

    run_blocks(one, blocks)
    if overflows:  # q k^T's own overflow (args) before the mask's, as in one piece
        raise max(overflows, key=lambda e: bool(e.args))
    return out, weights


def scaled_dot_product_attention_backward(dout, cache: AttentionCache):
    """Gradients of scaled dot-product attention with respect to q, k and v.

    Walking the forward in reverse, with ``P = weights`` and ``S = scores``:

    4. ``out = P v``          gives ``dv = P^T dout`` and ``dP = dout v^T``
    3. ``P = softmax(S)``     gives ``dS = P * (dP - D)`` with ``D_i = sum_j P_ij dP_ij``
    2. masking                masked entries have ``P = 0`` hence ``dS = 0``: nothing to do
    1. ``S = q k^T / sqrt(d_k)`` gives ``dq = dS k / sqrt(d_k)``, ``dk = dS^T q / sqrt(d_k)``

    Parameters
    ----------
    dout : array (..., n_q, d_v), upstream gradient
    cache : AttentionCache from the forward

    Returns
    -------
    dq : array, shape of q
    dk : array, shape of k
    dv : array, shape of v
    """
    return _attention_backward(as_upstream(dout, cache.out.shape, cache.out.dtype), cache)


def _attention_backward(dout, cache: AttentionCache):
    """Unchecked backward."""
    q, k, v, weights, out, scale = cache
    batch = weights.shape[:-2]
    cuttable = cuttable_batch(weights.shape, v)
    with parallel_region(weights.size, cuttable):
        plan = plan_blocks(cuttable)
        if plan is None:
            dq, dk, dv = _attend_backward(dout, q, k, v, weights, out, scale)
        else:  # the same steps on blocks of the batch axes, on parallel threads (_batch_blocks.py)
            axis, blocks = plan
            # dq (..., Nq, Dk), dk (..., Nk, Dk), dv (..., Nk, Dv) over every batch axis, filled by the blocks
            grads = [np.empty(batch + x.shape[-2:], weights.dtype) for x in (q, k, v)]

            def one(block):
                arrays = (dout, q, k, v, weights, out, *grads)
                *inputs, dq_b, dk_b, dv_b = (take_block(x, axis, block) for x in arrays)
                _attend_backward(*inputs, scale, into=(dq_b, dk_b, dv_b))

            run_blocks(one, blocks)
            dq, dk, dv = grads
    return unbroadcast(dq, q.shape), unbroadcast(dk, k.shape), unbroadcast(dv, v.shape)


def _attend_backward(dout, q, k, v, weights, out, scale, into=(None, None, None)):
    """The backward's formulas; gradients over the broadcast batch axes (those of ``dout``),
    written into the arrays of ``into`` when given (blocks of preallocated arrays)."""
    dq, dk, dv = into
    batch, (n_q, n_k) = dout.shape[:-2], weights.shape[-2:]  # dout carries every batch axis
    # 4. out = P v: dv = P^T dout
    dv = np.matmul(weights.swapaxes(-1, -2), dout, out=dv)  # (..., Nk, Dv)
    # 3. softmax: D_i = sum_j P_ij dP_ij = sum_j P_ij (dout_i . v_j) = dout_i . out_i,
    #    an n_q * d_v reduction instead of an n_q * n_k one.
    D = (dout * out).sum(axis=-1, keepdims=True)  # (..., Nq, 1)
    # dP (4.), dS (3.) and their products (1.) over blocks of query rows (one block when
    # small): each block's dP and dS live in one reused buffer, instead of a fresh
    # (..., Nq, Nk) array; dk sums the blocks' dS^T q.
    dq = np.empty(batch + (n_q, q.shape[-1]), weights.dtype) if dq is None else dq  # (..., Nq, Dk)
    dk = np.empty(batch + (n_k, k.shape[-1]), weights.dtype) if dk is None else dk  # (..., Nk, Dk)
    n_cols = math.prod(batch) * n_k  # numbers in one query row of all batch items and heads
    rows = min(n_q, rows_per_block(n_q, n_cols, QUERY_BLOCK_ELEMENTS))
    buffer = np.empty(batch + (rows, n_k), weights.dtype)  # (..., rows, Nk)

    def query_rows(start, stop):
        r = slice(start, stop)
        dP = np.matmul(dout[..., r, :], v.swapaxes(-1, -2), out=buffer[..., :stop - start, :])  # dP = dout v^T
        dS = _softmax_rows_backward(dP, weights[..., r, :], D[..., r, :])  # dS = P * (dP - D), in place
        # 1. S = (q / sqrt(d_k)) k^T (the scale follows, once)
        np.matmul(dS, k, out=dq[..., r, :])  # dq = dS k, (..., rows, Dk)
        if start == 0:  # dk = dS^T q, summed over the blocks; (..., Nk, Dk)
            np.matmul(dS.swapaxes(-1, -2), q[..., r, :], out=dk)
        else:
            dk[...] += dS.swapaxes(-1, -2) @ q[..., r, :]

    for_each_row_block(query_rows, n_q, n_cols, QUERY_BLOCK_ELEMENTS)
    dq *= scale  # dq = dS k / sqrt(d_k)
    dk *= scale  # dk = dS^T q / sqrt(d_k)
    return dq, dk, dv


def _softmax_rows_backward(dweights, weights, D):
    """``dS = P * (dP - D)`` written over ``dP`` (a fresh array nobody else holds)."""
    if (dweights.shape != weights.shape or not dweights.size
            or not (dweights.flags.c_contiguous and weights.flags.c_contiguous)):
        dweights -= D  # plain form for broadcast or strided layouts
        dweights *= weights
        return dweights
    # fast path: the same two in-place operations over cache-sized row blocks
    # (see _row_blocks.py); rows are independent, so the numbers are identical
    n_k = dweights.shape[-1]
    dP = dweights.reshape(-1, n_k)  # (rows, Nk), views of the contiguous arrays
    P = weights.reshape(-1, n_k)  # (rows, Nk)
    D = np.broadcast_to(D, dweights.shape[:-1] + (1,)).reshape(-1, 1)  # (rows, 1)

    def rows(start, stop):
        dS = dP[start:stop]
        dS -= D[start:stop]  # dP - D
        dS *= P[start:stop]  # P * (dP - D)

    for_each_row_block(rows, dP.shape[0], n_k)
    return dweights
