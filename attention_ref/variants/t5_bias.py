"""T5's relative position bias (Raffel et al. 2020, section 2.1), and its backward.

Each head adds to its scores one learned scalar per *bucket* of the relative distance
``r = j - i`` (key position minus query position): ``S'_hij = S_hij + T[bucket(j - i), h]``,
with ``T`` the table (num_buckets, H), transformers' ``relative_attention_bias.weight``. One
table serves every layer (T5 keeps it in the first layer and passes the bias on), so its
gradient sums over every query-key pair of a bucket, over the batch and over the layers.

The buckets (transformers' ``T5Attention._relative_position_bucket``), with B buckets:

* bidirectional (T5's encoder): half the buckets for keys after the query (``r > 0``, the
  bucket offset by B/2), half for the rest; ``n = |r|``. Causal (the decoder): ``n = max(-r, 0)``
  (a key after the query, masked anyway, falls in bucket 0), all B buckets for ``n``.
* with ``b`` the buckets left (B/2 or B) and ``e = b / 2``: distances ``n < e`` get a bucket
  each (``n``); larger ones share buckets logarithmically up to ``max_distance``:
  ``e + floor(log(n / e) / log(max_distance / e) * (b - e))``, capped at ``b - 1``.

transformers computes the logarithm in float32 (``relative_position.float()``); so does
:func:`t5_buckets`, so that a distance at a bucket's edge falls in the bucket it falls in there.

Symbols: ``...`` batch axes, H heads, Nq queries, Nk keys.

Forward: 1. ``bias_hij = T[bucket_ij, h]``  (H, Nq, Nk); 2. ``out = scores + bias``.

Backward: ``dscores = dout``; ``dT[k, h] = sum`` of ``dout_hij`` over the batch and every pair
``(i, j)`` with ``bucket_ij = k`` (a scatter-add). A model with L layers sharing ``T`` adds the L
layers' ``dT``.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .._checks import as_real_array, as_upstream, check_positive_int, common_dtype, require_ndim

__all__ = ["T5BiasCache", "t5_buckets", "t5_bias_forward", "t5_bias_backward"]


class T5BiasCache(NamedTuple):
    """The buckets and the table's shape: all the backward needs."""

    buckets: np.ndarray  # (Nq, Nk) ints
    table_shape: tuple  # (num_buckets, H)
    shape: tuple  # the output's, (..., H, Nq, Nk)
    dtype: np.dtype


def t5_buckets(n_q, n_k, *, bidirectional=True, num_buckets=32, max_distance=128, offset=0) -> np.ndarray:
    """The bucket of each (query, key) pair, ints (n_q, n_k), as transformers' T5 computes it.

    Query ``i`` sits at position ``offset + i`` (``offset`` the number of tokens decoded
    before, transformers' ``cache_position[0]``), key ``j`` at ``j``; ``r = j - (offset + i)``.
    ``bidirectional`` True: T5's encoder; False: its decoder. T5's defaults: 32 buckets,
    ``max_distance`` 128.
    """
    n_q, n_k = check_positive_int(n_q, "n_q"), check_positive_int(n_k, "n_k")
    num_buckets = check_positive_int(num_buckets, "num_buckets", 2)
    max_distance = check_positive_int(max_distance, "max_distance")
    offset = check_positive_int(offset, "offset", 0)
    if not isinstance(bidirectional, (bool, np.bool_)):
        raise TypeError(f"bidirectional must be True or False, got {bidirectional!r}")
    r = np.arange(n_k)[None, :] - (offset + np.arange(n_q))[:, None]  # (Nq, Nk), j - i
    buckets = np.zeros(r.shape, dtype=np.int64)
    b = num_buckets
    if bidirectional:
        b //= 2
        buckets += (r > 0) * b  # keys after the query: the upper half
        n = np.abs(r)
    else:
        n = np.maximum(-r, 0)  # keys after the query: distance 0
    exact = b // 2
    if exact < 1 or max_distance <= exact:
        raise ValueError(f"num_buckets {num_buckets} and max_distance {max_distance} leave no exact bucket or no"
                         " logarithmic range (need num_buckets >= 2 per direction and max_distance > its half)")
    # the logarithmic buckets in float32, as transformers: log(n / e) / log(max_distance / e) * (b - e)
    large = np.maximum(n, exact).astype(np.float32)  # small n is replaced (it takes the exact bucket below)
    scaled = np.log(large / np.float32(exact)) / np.float32(math.log(max_distance / exact)) * np.float32(b - exact)
    if_large = np.minimum(exact + scaled.astype(np.int64), b - 1)  # the cast truncates, as torch's .to(long)
    return buckets + np.where(n < exact, n, if_large)


def t5_bias_forward(scores, table, buckets):
    """T5's bias on the scores: ``out_hij = S_hij + T[bucket_ij, h]``.

    Parameters
    ----------
    scores : array (..., H, Nq, Nk) (T5 does not scale its scores; ``-inf`` where masked)
    table : array (num_buckets, H), one scalar per bucket and head (``relative_attention_bias.weight``)
    buckets : int array (Nq, Nk), :func:`t5_buckets`

    Returns
    -------
    out : array (..., H, Nq, Nk), in the promoted dtype of scores and table
    cache : T5BiasCache for :func:`t5_bias_backward`
    """
    scores = as_real_array(scores, "scores", allow_neg_inf=True)
    require_ndim(scores, "scores", 3, "(..., H, Nq, Nk)")
    table = as_real_array(table, "table")
    h, n_q, n_k = scores.shape[-3:]
    if table.ndim != 2 or table.shape[1] != h:
        raise ValueError(f"table must have shape (num_buckets, H) with H = {h} (the heads of scores"
                         f" {scores.shape}), got {table.shape}")
    buckets = np.asarray(buckets)
    if buckets.dtype.kind not in "iu" or buckets.shape != (n_q, n_k):
        raise ValueError(f"buckets must be an integer array (Nq, Nk) = ({n_q}, {n_k}), got {buckets.dtype}"
                         f" {buckets.shape}")
    if buckets.size and (buckets.min() < 0 or buckets.max() >= table.shape[0]):
        raise ValueError(f"buckets must lie in [0, {table.shape[0]}) (the table's rows), got"
                         f" [{buckets.min()}, {buckets.max()}]")
    dtype = common_dtype(scores, table)
    bias = np.moveaxis(table.astype(dtype, copy=False)[buckets], -1, 0)  # 1. (Nq, Nk, H) -> (H, Nq, Nk)
    out = scores.astype(dtype, copy=False) + bias  # 2.
    return out, T5BiasCache(buckets, table.shape, out.shape, out.dtype)


def t5_bias_backward(dout, cache: T5BiasCache):
    """Gradients of :func:`t5_bias_forward`: ``(dscores, dtable)``.

    2. ``dscores = dout``, ``dbias = dout`` summed over the batch axes (H, Nq, Nk);
    1. ``dT[k, h] = sum_{(i, j): bucket_ij = k} dbias_hij`` (``np.add.at``: many pairs share a bucket).
    """
    dout = as_upstream(dout, cache.shape, cache.dtype, "dout")
    dbias = dout.reshape((-1,) + dout.shape[-3:]).sum(axis=0)  # (H, Nq, Nk)
    dtable = np.zeros(cache.table_shape, dtype=cache.dtype)
    np.add.at(dtable, cache.buckets, np.moveaxis(dbias, 0, -1))  # (Nq, Nk, H) scattered to the buckets' rows
    return dout.copy(), dtable
