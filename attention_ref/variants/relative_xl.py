"""Transformer-XL's relative attention scores within one segment (Dai et al. 2019, section 3.3),
and their backward. The memory of past segments is out of scope: keys are the segment's own.

The absolute score of a query and a key, written out with positions added to the embeddings,
has four terms; Transformer-XL keeps their shape and replaces each absolute position by the
relative distance ``i - j`` (a sinusoid ``R_{i-j}``, not learned, with its own projection
``W_R``) and the query's position terms by two learned vectors per head, ``u`` and ``v``:

    ``A_ij = q_i k_j  +  q_i W_R R_{i-j}  +  u k_j  +  v W_R R_{i-j}``
    ``     = (q_i + u) . k_j  +  (q_i + v) . r_{i-j}``,     ``r_d = W_R R_d`` (per head).

Query ``i`` attends keys ``j <= i`` (a causal language model): the output is ``-inf`` above
the diagonal. The layer then scales the scores by ``1 / sqrt(Dh)``, masks, and takes the softmax
(not part of this pair).

The relative shift: the position term is computed for every query against every distance,
``BD_raw[i, m] = (q_i + v) . r_{N-1-m}`` (the distances in decreasing order, as the paper's code
orders them), then each row ``i`` is moved left by ``N - 1 - i`` so that column ``j`` holds
distance ``i - j``: pad a zero column on the left (N, N + 1), read the same numbers as
(N + 1, N), drop the first row. One matrix product instead of one per distance.

Symbols: ``...`` batch axes, H heads, N positions, Dh the head width, D the width of ``R``.

Forward:

1. ``r = R W_R`` split into heads                                         (H, N, Dh), row d = distance d
2. ``AC = (q + u) k^T``  (the content term and the global content bias)  (..., H, N, N)
3. ``BD_raw = (q + v) r_desc^T``, ``r_desc`` the distances N-1..0          (..., H, N, N)
4. ``BD = shift(BD_raw)``: ``BD_ij = BD_raw[i, N-1-(i-j)]`` for ``j <= i`` (..., H, N, N)
5. ``A = AC + BD``, ``-inf`` where ``j > i``

Backward walks them back: 5. ``dAC = dBD = dA`` with the entries above the diagonal zeroed;
4. the shift moves each entry to one place, so its backward moves it back (the same pad and
reshape, transposed); 3.-2. two matrix products each (``du``, ``dv`` sum over the batch and the
queries); 1. ``dW_R = R^T dr``. ``R`` is a constant (sinusoids): it gets no gradient.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._checks import as_real_array, as_upstream, check_positive_int, common_dtype, require_ndim, \
    signals_land_here, unbroadcast

__all__ = ["RelativeXLCache", "relative_xl_positions", "relative_shift", "relative_shift_backward_formula",
           "relative_xl_scores_forward", "relative_xl_scores_backward"]


class RelativeXLCache(NamedTuple):
    qu: np.ndarray  # (..., H, N, Dh), q + u
    qv: np.ndarray  # (..., H, N, Dh), q + v
    k: np.ndarray  # (..., H, N, Dh)
    R: np.ndarray  # (N, D)
    r_desc: np.ndarray  # (H, N, Dh), the projected positions, distances N-1..0
    shapes: tuple  # the shapes of q, k, W_R, u, v


def relative_xl_positions(n, d_model) -> np.ndarray:
    """Transformer-XL's sinusoids ``R`` (n, d_model), row ``d`` the distance ``d``: ``[sin(d w),
    cos(d w)]`` with ``w_t = 10000^(-2t / d_model)``, the sines first (not interleaved)."""
    n, d_model = check_positive_int(n, "n"), check_positive_int(d_model, "d_model")
    if d_model % 2:
        raise ValueError(f"d_model must be even (a sine and a cosine per frequency), got {d_model}")
    angle = np.arange(n, dtype=np.float64)[:, None] * 10000.0 ** (-np.arange(0, d_model, 2) / d_model)
    return np.concatenate([np.sin(angle), np.cos(angle)], axis=-1)


def relative_shift(x):
    """Step 4 on (..., N, N): pad a zero column on the left, read as (..., N + 1, N), drop the first
    row. For ``j <= i`` the result's ``[i, j]`` is ``x[i, N - 1 - i + j]``; above the diagonal it
    holds the next row's numbers (masked afterwards)."""
    n = x.shape[-1]
    padded = np.concatenate([np.zeros(x.shape[:-1] + (1,), dtype=x.dtype), x], axis=-1)  # (..., N, N + 1)
    return padded.reshape(x.shape[:-2] + (n + 1, n))[..., 1:, :]  # (..., N, N)


def relative_shift_backward_formula(dy):
    """The transpose of :func:`relative_shift`: put a zero row on top, read as (..., N, N + 1),
    drop the pad column."""
    n = dy.shape[-1]
    padded = np.concatenate([np.zeros(dy.shape[:-2] + (1, n), dtype=dy.dtype), dy], axis=-2)  # (..., N + 1, N)
    return padded.reshape(dy.shape[:-2] + (n, n + 1))[..., 1:]  # (..., N, N)


def relative_xl_scores_forward(q, k, R, W_R, u, v):
    """Transformer-XL's unscaled scores ``A_ij = (q_i + u) . k_j + (q_i + v) . (W_R R_{i-j})``.

    Parameters
    ----------
    q, k : arrays (..., H, N, Dh), the segment's queries and keys, split into heads
    R : array (N, D), the sinusoid of each distance 0..N-1 (:func:`relative_xl_positions`)
    W_R : array (D, H Dh), the position projection (transformers' ``r_net``, transposed)
    u, v : arrays (H, Dh), the global content and position biases (``r_w_bias``, ``r_r_bias``)

    Returns
    -------
    A : array (..., H, N, N), ``-inf`` above the diagonal (keys after the query)
    cache : RelativeXLCache for :func:`relative_xl_scores_backward`
    """
    q, k = as_real_array(q, "q"), as_real_array(k, "k")
    require_ndim(q, "q", 3, "(..., H, N, Dh)")
    if k.shape != q.shape:
        raise ValueError(f"k must have the shape of q {q.shape} (one segment), got {k.shape}")
    h, n, dh = q.shape[-3:]
    R, W_R, u, v = (as_real_array(a, name) for a, name in ((R, "R"), (W_R, "W_R"), (u, "u"), (v, "v")))
    if R.ndim != 2 or R.shape[0] != n:
        raise ValueError(f"R must have shape (N, D) with N = {n} distances, got {R.shape}")
    if W_R.shape != (R.shape[1], h * dh):
        raise ValueError(f"W_R must have shape (D, H Dh) = ({R.shape[1]}, {h * dh}), got {W_R.shape}")
    for a, name in ((u, "u"), (v, "v")):
        if a.shape != (h, dh):
            raise ValueError(f"{name} must have shape (H, Dh) = ({h}, {dh}), got {a.shape}")
    dtype = common_dtype(q, k, R, W_R, u, v)
    q, k, R, W_R, u, v = (a.astype(dtype, copy=False) for a in (q, k, R, W_R, u, v))
    with np.errstate(under="ignore"):  # tiny products round to 0, as they should
        r = (R @ W_R).reshape(n, h, dh).swapaxes(0, 1)  # 1. (H, N, Dh), row d = distance d
        r_desc = r[:, ::-1]  # (H, N, Dh), distances N-1..0
        qu, qv = q + u[:, None, :], q + v[:, None, :]  # (..., H, N, Dh)
        AC = qu @ k.swapaxes(-1, -2)  # 2. (..., H, N, N)
        BD = relative_shift(qv @ r_desc.swapaxes(-1, -2))  # 3.-4. (..., H, N, N), column j: distance i - j
        signals_land_here()  # a Ctrl-C is raised inside the block (_pair_checks.py)
    A = np.where(np.tri(n, dtype=bool), AC + BD, -np.inf)  # 5.
    return A, RelativeXLCache(qu, qv, k, R, r_desc, (q.shape, k.shape, W_R.shape, u.shape, v.shape))


def relative_xl_scores_backward(dA, cache: RelativeXLCache):
    """Gradients of :func:`relative_xl_scores_forward`: ``(dq, dk, dW_R, du, dv)``, the steps in
    reverse (the entries above the diagonal are constants: their upstream gradient is dropped)."""
    qu, qv, k, R, r_desc, (q_shape, k_shape, w_shape, u_shape, v_shape) = cache
    n = qu.shape[-2]
    dA = as_upstream(dA, qu.shape[:-1] + (n,), qu.dtype, "dA")
    with np.errstate(under="ignore"):
        dS = np.where(np.tri(n, dtype=bool), dA, 0.0)  # 5. dAC = dBD = dA below the diagonal
        dBD_raw = relative_shift_backward_formula(dS)  # 4. each entry back to where the shift took it from
        dqv = dBD_raw @ r_desc  # 3. (..., H, N, Dh)
        dr_desc = (dBD_raw.swapaxes(-1, -2) @ qv).reshape((-1,) + r_desc.shape).sum(axis=0)  # (H, N, Dh)
        dqu = dS @ k  # 2. (..., H, N, Dh)
        dk = dS.swapaxes(-1, -2) @ qu
        dr = dr_desc[:, ::-1].swapaxes(0, 1).reshape(n, -1)  # 1. (N, H Dh), row d = distance d
        dW_R = R.T @ dr  # (D, H Dh)
        signals_land_here()  # a Ctrl-C is raised inside the block (_pair_checks.py)
    du = dqu.reshape((-1,) + dqu.shape[-3:]).sum(axis=(0, 2))  # (H, Dh): over the batch and the queries
    dv = dqv.reshape((-1,) + dqv.shape[-3:]).sum(axis=(0, 2))
    return unbroadcast(dqu + dqv, q_shape), unbroadcast(dk, k_shape), dW_R, du, dv
