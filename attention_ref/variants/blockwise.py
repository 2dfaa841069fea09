"""Memory-efficient blockwise attention (the tiling of FlashAttention) and its backward.

Computes exactly ``softmax(q k^T / sqrt(d_k) + mask) v``, the same numbers as
:func:`attention_ref.scaled_dot_product_attention_forward`, without ever holding the
``Nq x Nk`` score matrix: queries and keys are cut into blocks of ``block_size`` rows and,
for each query block, a running ("online") softmax is carried over the key blocks.

Symbols: ``...`` batch axes, Nq/Nk query/key lengths, Dk/Dv widths, Bq/Bk block lengths
(at most ``block_size``), ``m`` running row maximum, ``l`` running row sum, ``acc`` the
unnormalised partial output, ``lse = m + log(l)`` the row log-sum-exp.

Forward, for one query block against key blocks ``b = 1, 2, ...`` (numbered for the backward):

1. ``s = q_blk k_b^T / sqrt(d_k)``, then the structural (causal / window) and caller's mask
2. ``m_new = max(m, rowmax(s))``; ``alpha = exp(m - m_new)`` rescales what was summed so far
3. ``p = exp(s - m_new)``; ``l = alpha l + rowsum(p)``; ``acc = alpha acc + p v_b``
4. after the last block: ``out = acc / l`` and ``lse = m + log(l)``

Memory beyond inputs and output: O(Bq * Bk) per batch element for one tile, plus the
(..., Nq) vectors ``m, l``. The backward recomputes ``p = exp((s - m) - log l)`` tile by tile.

Scores too large for the dtype raise ``FloatingPointError`` naming q, k, the dtype and its
largest finite value, as in :func:`attention_ref.scaled_dot_product_attention_forward`:
tiles are checked one by one only when a bound from ``max|q|`` and ``max|k|`` allows an
overflow, and a float mask that overflows shows in the tile's row maximum (step 2).

The Python loops below run over *blocks* only (Nq/Bq times Nk/Bk iterations); each
iteration is vectorised over the batch axes and within the block.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .._checks import (
    as_upstream,
    check_mask_dtype,
    check_mask_shape,
    check_positive_int,
    overflow_error,
    scores_may_overflow,
    signals_land_here,
    unbroadcast,
    warn_if_keep_mask,
)
from .._pair_checks import check_attention_inputs
from .local import check_window

__all__ = ["FlashAttentionCache", "flash_attention_forward", "flash_attention_backward", "visited_tiles"]


class FlashAttentionCache(NamedTuple):
    """Inputs, output and the softmax's row statistics: nothing of size Nq x Nk (except a caller's mask).

    The row log-sum-exp is kept as its two parts, ``lse = m + log(l)``: with extreme float
    masks (biases near 1e38) ``m + log(l)`` rounds to ``m`` and ``exp(s - lse)`` would be
    wrong, while ``exp((s - m) - log(l))`` stays exact.
    """

    q: np.ndarray  # (..., Nq, Dk)
    k: np.ndarray  # (..., Nk, Dk)
    v: np.ndarray  # (..., Nk, Dv)
    mask: np.ndarray | None  # the caller's mask itself (not a copy), read block by block
    out: np.ndarray  # (..., Nq, Dv)
    row_max: np.ndarray  # (..., Nq), m; 0 for a query with no allowed key
    log_row_sum: np.ndarray  # (..., Nq), log(l); +inf for a query with no allowed key
    scale: float  # 1 / sqrt(d_k)
    causal: bool
    window: int | None
    block_size: int

    @property
    def lse(self) -> np.ndarray:
        """Row log-sum-exp ``m + log(l)`` (..., Nq); +inf for a query with no allowed key."""
        with np.errstate(over="ignore"):
            lse = self.row_max + self.log_row_sum
            signals_land_here()  # a Ctrl-C is raised inside the block (_pair_checks.py)
        return lse


def _key_blocks(qs, qe, n_q, n_k, block, causal, window):
    """Start indices of the key blocks that query rows ``qs:qe`` may touch."""
    offset = n_k - n_q  # query i sits at position p_i = i + offset (see attention_ref.variants.local)
    lo, hi = 0, n_k
    if window is not None:
        lo, hi = max(lo, qs + offset - window), min(hi, qe - 1 + offset + window + 1)
    if causal:
        hi = min(hi, qe - 1 + offset + 1)  # blocks entirely in the future are skipped
    if lo >= hi:
        return range(0)
    return range((lo // block) * block, hi, block)


def visited_tiles(n_q, n_k, block_size=128, causal=False, window=None):
    """The (query block start, key block start) pairs the forward and backward visit, in order.

    These are exactly the tiles the loops below iterate over (same :func:`_key_blocks`):
    ``T^2`` for ``T = ceil(n / block_size)`` blocks, ``T (T + 1) / 2`` when causal with
    ``n_q = n_k``, about ``3 T`` for a window narrower than a block.
    """
    causal, window, block = _check_options(causal, window, block_size)
    return [(qs, ks) for qs in range(0, n_q, block)  # loop over query blocks
            for ks in _key_blocks(qs, min(qs + block, n_q), n_q, n_k, block, causal, window)]


def _structural_keep(qs, qe, ks, ke, n_q, n_k, causal, window):
    """(Bq, Bk) bool tile of the causal/window rule, or None when the whole tile is allowed."""
    offset = n_k - n_q
    first, last = qs + offset, qe - 1 + offset  # positions of the block's first/last query
    future = causal and ke - 1 > first  # the tile's last key comes after its first query
    outside = window is not None and (ks < last - window or ke - 1 > first + window)  # a pair too far apart
    if not (future or outside):
        return None
    position = np.arange(qs, qe)[:, None] + offset  # (Bq, 1)
    key = np.arange(ks, ke)[None, :]  # (1, Bk)
    keep = None  # at least one rule applies: the tile is not full
    if causal:
        keep = key <= position  # (Bq, Bk)
    if window is not None:
        near = np.abs(position - key) <= window  # (Bq, Bk)
        keep = near if keep is None else keep & near
    return keep


def _mask_tile(mask, qs, qe, ks, ke):
    """The caller's mask restricted to one tile (axes of size 1 stay broadcast)."""
    if mask.ndim == 0:
        return mask  # one value for every score
    cols = slice(ks, ke) if mask.shape[-1] != 1 else slice(None)
    if mask.ndim == 1:
        return mask[cols]  # (Bk,), one row shared by every query
    rows = slice(qs, qe) if mask.shape[-2] != 1 else slice(None)
    return mask[..., rows, cols]


def _check_mask(mask, scores_shape):
    """The caller's mask itself (no copy): dtype and shape, and the 0/1 float mask warning.

    The core's ``as_mask`` would allocate (and ``cast_mask`` copy) arrays of the whole
    Nq x Nk size; here the values are checked one tile at a time by
    :func:`_float_mask_tile`. A float mask is read once whole, by a reduction that
    allocates nothing (its maximum), to spot a keep-mask cast to float.
    """
    if mask is None:
        return None
    arr = check_mask_dtype(np.asarray(mask))  # the caller's array when it already is one
    check_mask_shape(arr, scores_shape)
    if arr.dtype != bool:
        warn_if_keep_mask(arr, "mask", arr.max(initial=-np.inf))
    return arr


def _float_mask_tile(tile, dtype):
    """One tile of a float mask, validated (no NaN, no +inf) and cast to the scores' dtype."""
    if np.isnan(tile).any():
        raise ValueError(f"mask contains NaN (array of dtype {tile.dtype}; found in a tile)")
    if np.isposinf(tile).any():
        raise ValueError(f"mask contains infinity (array of dtype {tile.dtype}; found in a tile)")
    tile = tile.astype(dtype, copy=False)  # -1e300 in float32 becomes -inf, as meant (the caller ignores overflow)
    if np.isposinf(tile).any():
        raise ValueError(f"mask holds values too large for {np.dtype(dtype)}")
    return tile


def _scores(q_blk, k, mask, qs, qe, ks, ke, n_q, n_k, causal, window, q=None):
    """Step 1 for one tile: scaled scores with every mask applied; ``q_blk`` is pre-scaled.

    Given the unscaled ``q``, raise if the tile's product overflows (the forward passes it
    when :func:`scores_may_overflow`; the backward recomputes tiles the forward checked).
    """
    with np.errstate(over="ignore", invalid="ignore"):  # reported below, by name
        s = q_blk @ k[..., ks:ke, :].swapaxes(-1, -2)  # (..., Bq, Bk)
        signals_land_here()  # a Ctrl-C is raised inside the block (_pair_checks.py)
    if q is not None and not np.isfinite(s).all():
        raise overflow_error("the attention scores q k^T / sqrt(d_k)", s.dtype, [("q", q), ("k", k)])
    keep = _structural_keep(qs, qe, ks, ke, n_q, n_k, causal, window)
    if keep is not None:
        s = np.where(keep, s, -np.inf)  # blocked keys get weight exactly 0
    if mask is not None:
        tile = _mask_tile(mask, qs, qe, ks, ke)
        if tile.dtype == bool:
            s = np.where(tile, s, -np.inf)
        else:
            with np.errstate(over="ignore"):  # -1e300 cast to float32 is -inf (blocked, as meant); huge biases may sum to +-inf
                s = s + _float_mask_tile(tile, s.dtype)
                signals_land_here()  # a Ctrl-C is raised inside the block (_pair_checks.py)
    return s


def _check_options(causal, window, block_size):
    """Validate the keyword options."""
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"causal must be True or False, got {causal!r}")
    window = None if window is None else check_window(window)
    return bool(causal), window, check_positive_int(block_size, "block_size")


def flash_attention_forward(q, k, v, mask=None, causal=False, block_size=128, *, window=None):
    """Blockwise scaled dot-product attention with an online softmax, arguments
    ``(q, k, v, mask, causal, block_size)`` (a boolean mask is True where a query may attend).

    Same result as ``scaled_dot_product_attention_forward(q, k, v, mask')`` where ``mask'``
    is ``mask`` combined (logical and) with :func:`attention_ref.causal_mask` when
    ``causal`` and with :func:`attention_ref.local_window_mask` when ``window`` is given.

    Parameters
    ----------
    q : array (..., n_q, d_k); k : array (..., n_k, d_k); v : array (..., n_k, d_v)
    mask : None, bool (True = may attend) or float (added to the scaled scores) array
        broadcastable to (..., n_q, n_k); read one tile at a time and never copied whole:
        its dtype and shape are checked up front, its values tile by tile, so a NaN or
        +inf raises ``ValueError`` when its tile is reached (before anything is returned;
        tiles that ``causal`` / ``window`` skip are never used). A float mask of only 0s
        and 1s warns, as everywhere (:mod:`attention_ref.core.masks`): that takes one
        reduction over it, its maximum, which allocates nothing
    causal : query ``i`` attends only keys ``j <= i + n_k - n_q``; key blocks entirely in
        the future are never visited
    block_size : rows per query block and per key block
    window : None or int >= 0; query ``i`` attends only keys with ``|i + n_k - n_q - j| <=
        window``, and only key blocks touching that band are visited, so the cost is
        O(n_q * window * d) instead of O(n_q * n_k * d)

    Returns
    -------
    out : array (..., n_q, d_v); zero for a query with no allowed key
    cache : FlashAttentionCache (inputs, the caller's mask, output and the (..., n_q) row
        maximum and log row sum)

    Raises
    ------
    FloatingPointError : when the scores (plus a float mask) overflow the dtype
    """
    causal, window, block = _check_options(causal, window, block_size)
    q, k, v, _, scores_shape = check_attention_inputs(q, k, v, None)
    mask = _check_mask(mask, scores_shape)  # values are checked tile by tile in _scores
    batch, (n_q, n_k), d_v = scores_shape[:-2], scores_shape[-2:], v.shape[-1]
    dtype = q.dtype
    scale = 1.0 / math.sqrt(q.shape[-1])  # Python float: float32 stays float32
    out = np.zeros(batch + (n_q, d_v), dtype)  # (..., Nq, Dv)
    row_max = np.zeros(batch + (n_q,), dtype)  # (..., Nq)
    log_row_sum = np.full(batch + (n_q,), np.inf, dtype)  # (..., Nq)
    q_to_check = q if scores_may_overflow(q, k, scale) else None  # check tiles only near the limit
    for qs in range(0, n_q, block):  # loop over query blocks
        qe = min(qs + block, n_q)
        q_blk = q[..., qs:qe, :] * scale  # (..., Bq, Dk)
        m = np.full(batch + (qe - qs,), -np.inf, dtype)  # (..., Bq)
        l = np.zeros(batch + (qe - qs,), dtype)  # (..., Bq)
        acc = np.zeros(batch + (qe - qs, d_v), dtype)  # (..., Bq, Dv)
        for ks in _key_blocks(qs, qe, n_q, n_k, block, causal, window):  # loop over key blocks
            ke = min(ks + block, n_k)
            # 1. scores of this tile, masked
            s = _scores(q_blk, k, mask, qs, qe, ks, ke, n_q, n_k, causal, window, q_to_check)  # (..., Bq, Bk)
            # 2. new running maximum; a row with no allowed key so far keeps m = -inf and
            #    uses 0 as its reference so that exp never sees -inf - (-inf)
            tile_max = s.max(axis=-1)  # (..., Bq)
            if (tile_max == np.inf).any():  # finite scores (step 1), so a huge positive float mask did it
                raise overflow_error("the scores q k^T / sqrt(d_k) + mask", dtype, [("q", q), ("k", k)])
            m_new = np.maximum(m, tile_max)  # (..., Bq)
            m_ref = np.where(np.isfinite(m_new), m_new, 0.0).astype(dtype, copy=False)
            # with extreme finite float masks (e.g. -3e38 against +3e38) the differences
            # below overflow to -inf, whose exp is the exact weight 0: not an error; nor is
            # a weight far below the maximum that underflows to 0
            with np.errstate(over="ignore", under="ignore"):
                alpha = np.exp(m - m_ref)  # (..., Bq), 0 while nothing was summed
                # 3. probabilities of this tile relative to m_new; rescale and accumulate
                p = np.exp(s - m_ref[..., None])  # (..., Bq, Bk)
                signals_land_here()  # a Ctrl-C is raised inside the block (_pair_checks.py)
                l = alpha * l + p.sum(axis=-1)
                acc = alpha[..., None] * acc + p @ v[..., ks:ke, :]  # (..., Bq, Dv)
                signals_land_here()  # a Ctrl-C is raised inside the block (_pair_checks.py)
            m = m_new
        # 4. normalise; a row with l = 0 (no allowed key) keeps out = 0, m = 0, log(l) = +inf
        seen = l > 0
        np.divide(acc, l[..., None], out=out[..., qs:qe, :], where=seen[..., None])
        np.copyto(row_max[..., qs:qe], m, where=seen)
        np.log(l, out=log_row_sum[..., qs:qe], where=seen)
    cache = FlashAttentionCache(q, k, v, mask, out, row_max, log_row_sum, scale, causal, window, block)
    return out.copy(), cache  # the caller's own copy: editing it cannot change the backward


def flash_attention_backward(dout, cache: FlashAttentionCache):
    """Gradients of :func:`flash_attention_forward` (arguments ``dout, cache``): ``(dq, dk, dv)``,
    recomputing the probabilities tile by tile.

    With ``P = exp((S - m) - log(l))`` (that is ``exp(S - lse)``) recomputed per tile and
    ``D_i = rowsum(dout_i * out_i)`` (which equals ``sum_j P_ij dP_ij``, so no Nq x Nk
    reduction is needed):

    3. ``acc += P v``           gives ``dv += P^T dout`` and ``dP = dout v^T``
    2.-3. softmax               gives ``dS = P * (dP - D)``
    1. ``S = q k^T / sqrt(d_k)`` gives ``dq += dS k / sqrt(d_k)``, ``dk += dS^T q / sqrt(d_k)``

    Parameters
    ----------
    dout : array (..., n_q, d_v), upstream gradient
    cache : FlashAttentionCache from the forward

    Returns
    -------
    dq, dk, dv : arrays shaped like q, k and v
    """
    q, k, v, mask, out, row_max, log_row_sum, scale, causal, window, block = cache
    dout = as_upstream(dout, out.shape, out.dtype)
    batch, n_q, n_k = out.shape[:-2], q.shape[-2], k.shape[-2]
    D = (dout * out).sum(axis=-1)  # (..., Nq)
    dq = np.zeros(batch + q.shape[-2:], out.dtype)  # (..., Nq, Dk)
    dk = np.zeros(batch + k.shape[-2:], out.dtype)  # (..., Nk, Dk)
    dv = np.zeros(batch + v.shape[-2:], out.dtype)  # (..., Nk, Dv)
    for qs in range(0, n_q, block):  # loop over query blocks
        qe = min(qs + block, n_q)
        q_blk = q[..., qs:qe, :] * scale  # (..., Bq, Dk)
        dout_blk = dout[..., qs:qe, :]  # (..., Bq, Dv)
        D_blk = D[..., qs:qe, None]  # (..., Bq, 1)
        m_blk = row_max[..., qs:qe, None]  # (..., Bq, 1)
        log_l_blk = log_row_sum[..., qs:qe, None]  # (..., Bq, 1)
        dq_blk = np.zeros(batch + (qe - qs, q.shape[-1]), out.dtype)  # (..., Bq, Dk)
        for ks in _key_blocks(qs, qe, n_q, n_k, block, causal, window):  # loop over key blocks
            ke = min(ks + block, n_k)
            # 1.-3. recompute this tile's probabilities from the saved log-sum-exp
            s = _scores(q_blk, k, mask, qs, qe, ks, ke, n_q, n_k, causal, window)  # (..., Bq, Bk)
            # s - m may overflow to -inf: weight 0, as in the forward; products with a weight far
            # below 1 may underflow to 0, as they should
            with np.errstate(over="ignore", under="ignore"):
                p = np.exp((s - m_blk) - log_l_blk)  # (..., Bq, Bk); 0 for blocked keys and empty rows
                signals_land_here()  # a Ctrl-C is raised inside the block (_pair_checks.py)
                # 3. acc += P v
                dv[..., ks:ke, :] += p.swapaxes(-1, -2) @ dout_blk  # (..., Bk, Dv)
                dp = dout_blk @ v[..., ks:ke, :].swapaxes(-1, -2)  # (..., Bq, Bk)
                # 2. softmax: dS = P * (dP - D)
                ds = p * (dp - D_blk)  # (..., Bq, Bk)
                # 1. S = (q / sqrt(d_k)) k^T
                dq_blk += ds @ k[..., ks:ke, :]  # (..., Bq, Dk)
                dk[..., ks:ke, :] += ds.swapaxes(-1, -2) @ q_blk  # (..., Bk, Dk), q_blk holds the scale
                signals_land_here()  # a Ctrl-C is raised inside the block (_pair_checks.py)
        with np.errstate(under="ignore"):
            dq[..., qs:qe, :] = dq_blk * scale
            signals_land_here()  # a Ctrl-C is raised inside the block (_pair_checks.py)
    return unbroadcast(dq, q.shape), unbroadcast(dk, k.shape), unbroadcast(dv, v.shape)
