"""ALiBi, attention with linear biases (Press, Smith and Lewis 2022; BLOOM, MPT), and its backward.

No position enters the embeddings or the queries and keys: each head ``h`` adds to its scaled
scores a fixed penalty proportional to the distance between query and key,

    ``S'_hij = S_hij - m_h (i - j)``,    ``m_h`` the head's slope (a constant, never learned).

Slopes (the paper's rule, as BLOOM computes them): for H heads a power of two, the geometric
sequence ``m_h = 2^(-8 h / H)``, ``h = 1..H`` (8 heads: 1/2, 1/4, ..., 1/256). For other H,
with ``P`` the largest power of two below H, the P slopes of ``P`` heads, then the odd-numbered
slopes of ``2P`` heads, ``2^(-8 k / 2P)`` for ``k = 1, 3, 5, ...``, until H slopes (12 heads:
the 8 of 8 heads, then ``2^(-1/2), 2^(-3/2), 2^(-5/2), 2^(-7/2)``). Porting mistakes are
common here: taking the first H of ``2P`` heads' slopes, or rounding H to a power of two.

BLOOM's form (transformers' ``build_alibi_tensor``): the bias is ``m_h p_j`` on key ``j``
alone, with ``p_j`` the key's position counted over the attention mask's ones
(``p = (cumsum(mask) - 1) mask``, so a left-padded row's first real token is at 0). It
differs from the paper's ``m_h (p_j - p_i)`` by ``m_h p_i``, the same number for every key of
query ``i``'s row: softmax is unchanged by a constant added to a row, so the weights are the
same. Both forms are here: ``query_positions`` None gives BLOOM's, given gives the paper's.

Symbols: ``...`` batch axes, H heads, Nq queries, Nk keys.

Forward:

1. ``b_hij = m_h (p_j - q_i)`` (``q_i = 0``: BLOOM's)      (..., H, Nq, Nk) or (..., H, 1, Nk)
2. ``out = scores + b``                                     (..., H, Nq, Nk)

Backward: ``dscores = dout`` (the slopes and positions are constants: they get no gradient).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .._checks import as_real_array, as_upstream, broadcasts_into, check_positive_int, require_ndim

__all__ = ["AlibiCache", "AlibiScores", "alibi_slopes", "alibi_positions", "alibi_bias", "alibi_forward", "alibi_backward"]


class AlibiCache(NamedTuple):
    """The output's shape and dtype: the backward passes the gradient through."""

    shape: tuple  # (..., H, Nq, Nk)
    dtype: np.dtype


def alibi_slopes(num_heads) -> np.ndarray:
    """The H slopes ``m_h`` of ALiBi for ``num_heads`` heads, float64 (H,), any H >= 1.

    Powers of two: ``2^(-8 h / H)``, h = 1..H. Otherwise, with P the largest power of two below
    H: ``2^(-8 h / P)`` for h = 1..P, then ``2^(-8 k / (2P))`` for k = 1, 3, 5, ... (H - P of them).
    """
    h = check_positive_int(num_heads, "num_heads")
    p = 2 ** int(math.floor(math.log2(h)))  # the largest power of two <= H
    slopes = [2.0 ** (-8.0 * k / p) for k in range(1, p + 1)]
    slopes += [2.0 ** (-8.0 * k / (2 * p)) for k in range(1, 2 * (h - p), 2)]  # the odd ones of 2P heads
    return np.array(slopes, dtype=np.float64)


def alibi_positions(attention_mask) -> np.ndarray:
    """Each key's position counted over the mask's ones, as transformers' BLOOM counts it:
    ``(cumsum(mask) - 1) * mask`` along the last axis (a pad is at 0; a left-padded row's first
    real token at 0). ``attention_mask``: (..., N) of 0/1 (or booleans); returns float64 (..., N)."""
    mask = np.asarray(attention_mask)
    if mask.dtype.kind not in "biu" or mask.ndim < 1 or not np.isin(mask, (0, 1)).all():
        raise ValueError(f"attention_mask must be an array (..., N) of 0 and 1, got {mask.dtype} {mask.shape}")
    mask = mask.astype(np.int64)
    return ((np.cumsum(mask, axis=-1) - 1) * mask).astype(np.float64)


def _check_positions(positions, name: str, batch: tuple, n: int) -> np.ndarray:
    positions = as_real_array(positions, name)
    require_ndim(positions, name, 1, f"(..., {n})")
    if positions.shape[-1] != n or not broadcasts_into(positions.shape[:-1], batch):
        raise ValueError(f"{name} must have shape (..., {n}) with batch axes broadcasting to {batch}, got"
                         f" {positions.shape}")
    return positions


def alibi_bias(slopes, key_positions, query_positions=None) -> np.ndarray:
    """Step 1: ``b_hij = m_h (p_j - q_i)``, (..., H, Nq, Nk); ``query_positions`` None: ``m_h p_j``,
    (..., H, 1, Nk) (BLOOM's). ``slopes`` (H,), ``key_positions`` (..., Nk), ``query_positions``
    (..., Nq). In the dtype of the slopes and positions."""
    slopes = as_real_array(slopes, "slopes")
    if slopes.ndim != 1:
        raise ValueError(f"slopes must have shape (H,), got {slopes.shape}")
    key_positions = as_real_array(key_positions, "key_positions")
    require_ndim(key_positions, "key_positions", 1, "(..., Nk)")
    distance = key_positions[..., None, None, :]  # (..., 1, 1, Nk)
    if query_positions is not None:
        query_positions = as_real_array(query_positions, "query_positions")
        require_ndim(query_positions, "query_positions", 1, "(..., Nq)")
        try:
            distance = distance - query_positions[..., None, :, None]  # (..., 1, Nq, Nk): p_j - q_i
        except ValueError:
            raise ValueError(f"query_positions {query_positions.shape} and key_positions {key_positions.shape}"
                             " have batch axes that do not broadcast") from None
    return slopes[:, None, None] * distance  # (..., H, Nq or 1, Nk)


def alibi_forward(scores, slopes, key_positions, query_positions=None):
    """ALiBi on the scaled scores: ``out_hij = S_hij + m_h (p_j - q_i)`` (``q_i = 0`` when
    ``query_positions`` is None: BLOOM's form, the same softmax).

    Parameters
    ----------
    scores : array (..., H, Nq, Nk), the scaled scores (``-inf`` where masked)
    slopes : array (H,), :func:`alibi_slopes`
    key_positions : array (..., Nk), the keys' positions (:func:`alibi_positions` for a padded batch)
    query_positions : None or array (..., Nq), the queries' positions

    Returns
    -------
    out : array (..., H, Nq, Nk) in the scores' dtype (float32 stays float32)
    cache : AlibiCache for :func:`alibi_backward`
    """
    scores = as_real_array(scores, "scores", allow_neg_inf=True)
    require_ndim(scores, "scores", 3, "(..., H, Nq, Nk)")
    slopes = as_real_array(slopes, "slopes")
    h, n_q, n_k = scores.shape[-3:]
    if slopes.shape != (h,):
        raise ValueError(f"slopes must have shape (H,) = ({h},), one per head of scores {scores.shape}, got"
                         f" {slopes.shape}")
    batch = scores.shape[:-3]
    key_positions = _check_positions(key_positions, "key_positions", batch, n_k)
    if query_positions is not None:
        query_positions = _check_positions(query_positions, "query_positions", batch, n_q)
    bias = alibi_bias(slopes, key_positions, query_positions)  # 1. (..., H, Nq or 1, Nk)
    out = scores + bias.astype(scores.dtype, copy=False)  # 2. float32 scores stay float32
    return out, AlibiCache(out.shape, out.dtype)


def alibi_backward(dout, cache: AlibiCache):
    """Gradient of :func:`alibi_forward`: ``dscores = dout`` (the bias is a constant)."""
    return as_upstream(dout, cache.shape, cache.dtype, "dout").copy()


class AlibiScores(NamedTuple):
    """ALiBi as the grouped-heads path's ``scores`` hook (:mod:`attention_ref.variants.grouped_heads`;
    BLOOM's blocks): ``C = S + m_h j`` on the scaled scores (..., Hkv, G, Nq, Nk), key ``j`` at its
    slot in the sequence or the KV cache (BLOOM's form with the slot as the position: for a
    left-padded row it differs from transformers' mask-counted positions by a constant per row,
    which the softmax removes); backward ``dS = dC``."""

    slopes: np.ndarray  # (H,), alibi_slopes(H)

    def forward(self, S):
        hkv, g, n_k = S.shape[-4], S.shape[-3], S.shape[-1]
        bias = self.slopes.reshape(hkv, g, 1, 1) * np.arange(n_k)  # (Hkv, G, 1, Nk): head i = kv head i // G
        return S + bias.astype(S.dtype, copy=False), None

    def backward(self, dC, cache):
        return dC
