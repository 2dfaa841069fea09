"""Token embedding: row ``ids[..., n]`` of a table ``W`` (V, D), and its backward, a scatter-add.

Symbols: ``...`` batch axes, N positions, V the vocabulary (rows of the table), D the width.

Forward: ``out[..., n, :] = W[ids[..., n], :]``, a lookup. It is the product of a one-hot
row ``e_id`` (V,) with ``W``, so its backward is ``dW = sum over positions of e_id^T dout``:
each position adds its upstream row to the row of ``W`` it read. Rows read twice get both
contributions; rows never read get 0. A ``padding_idx`` row (transformers' ``pad_token_id``
of Llama's ``embed_tokens``) gets nothing from its lookups (a tied LM head's part of its gradient
stays: ``into``).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._checks import as_real_array, as_upstream
from .._token_checks import check_embedding_inputs

__all__ = ["EmbeddingCache", "embedding_forward", "embedding_backward"]


class EmbeddingCache(NamedTuple):
    """What ``embedding_backward`` needs: the ids, the table's shape and dtype, the padding row."""

    ids: np.ndarray  # (..., N) integers
    table_shape: tuple  # (V, D)
    dtype: np.dtype
    padding_idx: int | None


def embedding_forward(ids, W, padding_idx=None):
    """Look up the rows of ``W`` named by ``ids``, arguments ``(ids, W)``; ``W`` is ``(V, D)``, the
    same layout as torch's ``Embedding.weight`` (no transpose, unlike a linear layer's weight).

    Parameters
    ----------
    ids : integer array (..., N), each in ``[0, V)``
    W : array (V, D), one row per token
    padding_idx : optional row that receives no gradient (its lookups still read it)

    Returns
    -------
    out : array (..., N, D), ``W[ids]`` (a new array)
    cache : EmbeddingCache for :func:`embedding_backward`
    """
    return embedding_formula(*check_embedding_inputs(ids, W, padding_idx))


def embedding_formula(ids, W, padding_idx=None):
    """:func:`embedding_forward` on checked inputs (whole models call it on ids and a table
    they checked once)."""
    out = W[ids]  # (..., N, D): row ids[..., n] of W
    return out, EmbeddingCache(ids, W.shape, W.dtype, padding_idx)


def embedding_backward(dout, cache: EmbeddingCache, into=None):
    """Gradient of :func:`embedding_forward` (arguments ``dout, cache``) with respect to ``W``: ``dW`` (V, D).

    ``dW[v] = sum of dout[..., n, :] over the positions with ids[..., n] = v``, a scatter-add
    (``np.add.at``: a token read at several positions gets the sum); the padding row's lookups
    add nothing. ``into``, when given, is the table's gradient from its other uses (a tied LM
    head's, (V, D), an array nobody else holds): the lookups are added into it and it is
    returned, so the table's gradient needs no second (V, D) array.
    """
    dout = as_upstream(dout, cache.ids.shape + cache.table_shape[-1:], cache.dtype, "dout")
    dW = np.zeros(cache.table_shape, cache.dtype) if into is None else _check_into(into, cache)  # (V, D)
    ids, rows = cache.ids.reshape(-1), dout.reshape(-1, cache.table_shape[-1])  # (B*N,), (B*N, D)
    if cache.padding_idx is not None:
        read = ids != cache.padding_idx  # the padding row's lookups add nothing
        if not read.all():
            ids, rows = ids[read], rows[read]
    np.add.at(dW, ids, rows)  # (V, D) += (B*N, D) by row
    return dW


def _check_into(into, cache: EmbeddingCache) -> np.ndarray:
    """``into`` of :func:`embedding_backward`: a writeable ndarray of the table's shape and dtype,
    finite (``TypeError`` or ``ValueError`` naming it otherwise)."""
    if not isinstance(into, np.ndarray):
        raise TypeError(f"into must be a NumPy array of shape {cache.table_shape} and dtype {cache.dtype},"
                        f" got {type(into).__name__}")
    if into.shape != tuple(cache.table_shape) or into.dtype != cache.dtype:
        raise ValueError(f"into must have the table's shape {tuple(cache.table_shape)} and dtype {cache.dtype},"
                         f" got shape {into.shape} and dtype {into.dtype}")
    if not into.flags.writeable:
        raise ValueError("into must be writeable: the lookups are added into it")
    as_real_array(into, "into")  # finite
    return into
