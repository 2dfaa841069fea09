"""The arguments of the token-level pairs of ``nn`` and the whole models, checked before any
arithmetic: token ids (integers in the vocabulary, a bad one named with its position), the
embedding table, the cross-entropy's logits and targets, and transformers' ``attention_mask``
(0/1 of the ids' shape). The arguments of the core pairs are in :mod:`attention_ref._pair_checks`,
the generic rules (real arrays, the dtype policy) in :mod:`attention_ref._checks`.
"""
from __future__ import annotations

import numpy as np

from ._checks import as_real_array, require_ndim

__all__ = []  # private module


def as_token_ids(ids, name: str = "ids", vocab_size: int | None = None, *, allow=None) -> np.ndarray:
    """Integer token ids as an int64 array, each in ``[0, vocab_size)`` (or equal to ``allow``);
    a bad id is named with its position."""
    try:
        arr = np.asarray(ids)
    except Exception as exc:  # ragged lists and the like
        raise TypeError(f"{name} must be an array of integer token ids: {exc}") from None
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integer token ids, got dtype {arr.dtype} and shape {arr.shape}")
    arr = arr.astype(np.int64, copy=False)
    if vocab_size is not None and arr.size:
        bad = (arr < 0) | (arr >= vocab_size)
        if allow is not None:
            bad &= arr != allow
        if bad.any():
            where = tuple(int(i) for i in np.argwhere(bad)[0])
            extra = f" or {allow}" if allow is not None else ""
            raise ValueError(f"{name}{list(where)} = {arr[where]} is not a token id in [0, {vocab_size}){extra}"
                             f" ({int(bad.sum())} bad of {arr.size}; {name} has shape {arr.shape})")
    return arr


def check_embedding_inputs(ids, W, padding_idx):
    """``embedding_forward``'s inputs: a table (V, D), ids in range, an optional padding row."""
    W = as_real_array(W, "W")
    if W.ndim != 2:
        raise ValueError(f"W must be the embedding table (V, D), got shape {W.shape}")
    ids = as_token_ids(ids, "ids", W.shape[0])
    if padding_idx is not None:
        if isinstance(padding_idx, bool) or not isinstance(padding_idx, (int, np.integer)) \
                or not 0 <= padding_idx < W.shape[0]:
            raise ValueError(f"padding_idx must be None or a row of W in [0, {W.shape[0]}), got {padding_idx!r}")
        padding_idx = int(padding_idx)
    return ids, W, padding_idx


def check_cross_entropy_inputs(logits, targets, ignore_index):
    """``cross_entropy_forward``'s inputs: logits (..., V), targets (...) in range or ignored."""
    logits = as_real_array(logits, "logits")
    require_ndim(logits, "logits", 1, "(..., V)")
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, (int, np.integer)):
        raise TypeError(f"ignore_index must be an integer, got {ignore_index!r}")
    targets = as_token_ids(targets, "targets", logits.shape[-1], allow=int(ignore_index))
    if targets.shape != logits.shape[:-1]:
        raise ValueError(f"targets must have shape {logits.shape[:-1]} (the logits' {logits.shape} without the"
                         f" vocabulary axis), got {targets.shape}")
    return logits, targets, targets != ignore_index


def as_attention_mask(attention_mask, shape, name: str = "attention_mask"):
    """transformers' ``attention_mask``: 1 (or True) for a real token, 0 for padding, of ``shape``."""
    if attention_mask is None:
        return np.ones(shape, bool)
    mask = np.asarray(attention_mask)
    if mask.dtype.kind not in "biu" or (mask.dtype.kind != "b" and not np.isin(mask, (0, 1)).all()):
        raise ValueError(f"{name} must hold 0/1 or booleans (1: a real token, 0: padding), got dtype {mask.dtype}")
    if mask.shape != tuple(shape):
        raise ValueError(f"{name} must have the shape {tuple(shape)} of the ids, got {mask.shape}")
    return mask.astype(bool)


def check_next_token_inputs(ids, attention_mask):
    """``next_token_targets``'s inputs: ids (..., N), a 0/1 mask of the same shape."""
    ids = as_token_ids(ids, "ids")
    require_ndim(ids, "ids", 1, "(..., N)")
    return ids, as_attention_mask(attention_mask, ids.shape)
