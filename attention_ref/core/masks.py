"""Attention masks: one convention for the whole library.

**Boolean masks: ``True`` means "this query may attend to this key".**
This is the convention of PyTorch's ``torch.nn.functional.scaled_dot_product_attention``.
It is the *opposite* of ``torch.nn.MultiheadAttention``'s ``attn_mask`` and
``key_padding_mask``, where ``True`` means "blocked". The code in document 004
(``masked_fill(mask == 0, -1e9)``) agrees with us: 1/True keeps, 0/False blocks. To bring
a ``torch.nn.MultiheadAttention``-style mask here, pass ``~mask``.

**Float masks are added to the scaled scores** ``q k^T / sqrt(d_k)`` before the softmax;
``-inf`` blocks a key exactly, ``0`` leaves it alone, other values bias it. So a boolean
mask cast to float is *not* the same mask: ``causal_mask(n).astype(float)`` adds 1 to the
allowed scores and blocks nothing, letting every query see the future. A float mask whose
entries are all 0 or 1 (with at least one 1) is almost always that mistake, so it raises
a ``UserWarning`` naming the fix, ``mask.astype(bool)``; the usual additive masks (0 and
``-inf``, or 0 and a large negative number, e.g. from :func:`mask_to_additive`) and an
all-zero mask stay silent.

A blocked key gets weight exactly 0 (we use ``-inf``, never a finite stand-in such as
``-1e9``). A query whose keys are all blocked gets zero weights, zero output and zero
gradient instead of NaN.

Every mask must broadcast to the scores' shape ``(..., n_q, n_k)``; in multi-head
attention the same mask applies to every head.
"""
from __future__ import annotations

import numpy as np

from .._checks import as_mask, check_nonnegative_int
from .._pair_checks import check_boolean_mask, check_padding_lengths

__all__ = ["causal_mask", "padding_mask", "mask_to_additive", "combine_with_causal"]


def causal_mask(n: int, n_k: int | None = None) -> np.ndarray:
    """Boolean mask letting query ``i`` attend to keys ``j <= i`` (no peeking ahead).

    Parameters
    ----------
    n : number of queries (and keys, unless ``n_k`` is given); 0 gives an empty mask
    n_k : number of keys (default ``n``). Queries and keys are aligned at the end: query
        ``i`` sits at position ``i + n_k - n`` and sees keys ``j <= i + n_k - n``. With
        ``n_k > n`` the queries are the last ``n`` tokens attending to a prefix; with
        ``n_k < n`` the first ``n - n_k`` queries see no key at all (zero output).

    Returns
    -------
    mask : bool array (n, n_k), lower triangular ((0, 0) for ``n = 0``)
    """
    n = check_nonnegative_int(n, "n")
    n_k = n if n_k is None else check_nonnegative_int(n_k, "n_k")
    return np.tri(n, n_k, k=n_k - n, dtype=bool)  # (Nq, Nk)


def padding_mask(lengths, n: int) -> np.ndarray:
    """Boolean mask that hides the padding keys of each sequence in a batch.

    Parameters
    ----------
    lengths : int array (B,) (or any shape ``batch``), the true length of each sequence
    n : padded length

    Returns
    -------
    mask : bool array (*batch, 1, n); ``mask[b, 0, j]`` is ``j < lengths[b]``. The middle
        axis of size 1 lets it broadcast against scores ``(*batch, n_q, n)``.
    """
    lengths, n = check_padding_lengths(lengths, n)
    positions = np.arange(n)  # (N,)
    return (positions < lengths[..., None])[..., None, :]  # (*batch, 1, N)


def mask_to_additive(mask: np.ndarray, dtype=np.float64) -> np.ndarray:
    """Turn a boolean mask into the equivalent float mask (0 where allowed, -inf where not)."""
    mask, dtype = check_boolean_mask(mask, dtype)  # dtype: a float, to hold -inf
    return np.where(mask, 0.0, -np.inf).astype(dtype)


def combine_with_causal(mask, n: int):
    """The causal rule (query i sees keys j <= i) and an optional extra mask (padding) together:
    a boolean mask is and-ed with it, a float (additive) one gets ``-inf`` above the diagonal."""
    causal = causal_mask(n)  # (N, N)
    mask = as_mask(mask)
    if mask is None:
        return causal
    if mask.dtype == bool:
        return causal & mask  # (..., N, N)
    return np.where(causal, mask, -np.inf).astype(mask.dtype, copy=False)  # (..., N, N)


def apply_mask(scores: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """Step 2 of attention on checked inputs: a blocked key's score becomes ``-inf`` (weight
    exactly 0 after the softmax); a float mask is added. A new array; ``scores`` is kept."""
    if mask is None:
        return scores
    if mask.dtype == bool:
        return np.where(mask, scores, -np.inf)  # (..., Nq, Nk)
    return scores + mask  # (..., Nq, Nk); the mask is already in the scores' dtype


def combine_masks(mask, causal):
    """An extra mask (checked: boolean, or float in the scores' dtype) and a boolean rule (causal,
    a sliding window): and-ed when ``mask`` is boolean, else ``mask`` where the rule allows and
    ``-inf`` where it blocks; the blocks and models combine padding, causal and window masks here."""
    if mask.dtype == bool:
        return mask & causal
    return np.where(causal, mask, -np.inf).astype(mask.dtype, copy=False)
