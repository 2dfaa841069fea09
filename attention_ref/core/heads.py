"""Splitting the projected features into heads and merging them back.

Symbols: ``...`` batch axes, N sequence length, H heads, Dh width of one head.

``split_heads`` and ``merge_heads`` only move numbers around: each is a permutation of
the entries, and each is the other's inverse *and* transpose. So the backward of a split
is a merge, and the backward of a merge is a split.

Head ``i`` owns the columns ``i*Dh:(i+1)*Dh`` of the projected features, which are the
columns ``i*Dh:(i+1)*Dh`` of ``W_q``, ``W_k`` and ``W_v`` (the documents' ``W_i^Q`` etc.).
"""
from __future__ import annotations

import numpy as np

from .._pair_checks import check_merge_heads_input, check_split_heads_inputs

__all__ = ["split_heads", "merge_heads", "split_heads_backward", "merge_heads_backward"]


def split_heads(x, num_heads: int) -> np.ndarray:
    """Split the last axis into heads: (..., N, H*Dh) -> (..., H, N, Dh).

    Parameters
    ----------
    x : array (..., n, num_heads * d_head)
    num_heads : int

    Returns
    -------
    heads : array (..., num_heads, n, d_head), a view of ``x`` where possible;
        ``heads[..., i, :, :] == x[..., i*d_head:(i+1)*d_head]``
    """
    x, num_heads = check_split_heads_inputs(x, num_heads)
    return _split(x, num_heads)


def _split(x, num_heads):
    """Unchecked split."""
    *batch, n, width = x.shape
    x = x.reshape(*batch, n, num_heads, width // num_heads)  # (..., N, H, Dh)
    return np.moveaxis(x, -2, -3)  # (..., H, N, Dh)


def merge_heads(x) -> np.ndarray:
    """Concatenate the heads: (..., H, N, Dh) -> (..., N, H*Dh); the documents' ``Concat``.

    Parameters
    ----------
    x : array (..., num_heads, n, d_head)

    Returns
    -------
    merged : array (..., n, num_heads * d_head); the inverse and transpose of
        :func:`split_heads`
    """
    return _merge(check_merge_heads_input(x))


def _merge(x):
    """Unchecked merge."""
    *batch, num_heads, n, d_head = x.shape
    x = np.moveaxis(x, -3, -2)  # (..., N, H, Dh)
    return x.reshape(*batch, n, num_heads * d_head)  # (..., N, H*Dh)


def split_heads_backward(dheads) -> np.ndarray:
    """Backward of :func:`split_heads`: the split is a permutation, so its transpose is
    its inverse, :func:`merge_heads`. (..., H, N, Dh) -> (..., N, H*Dh).

    ``dheads`` is checked like every upstream gradient (real, finite); with no cache, its
    shape is checked against the layout only."""
    return _merge(check_merge_heads_input(dheads, "dheads", gradient=True))


def merge_heads_backward(dmerged, num_heads: int) -> np.ndarray:
    """Backward of :func:`merge_heads`: its transpose is :func:`split_heads`.
    (..., N, H*Dh) -> (..., H, N, Dh).

    ``dmerged`` is checked like every upstream gradient (real, finite); with no cache, its
    shape is checked against the layout and ``num_heads`` only."""
    dmerged, num_heads = check_split_heads_inputs(dmerged, num_heads, "dmerged", gradient=True)
    return _split(dmerged, num_heads)
