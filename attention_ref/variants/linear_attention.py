"""Linear attention ``phi(Q) (phi(K)^T V)`` with its normaliser (document 003), and its backward.

Replacing ``exp(q_i . k_j)`` by a product of positive features ``phi(q_i) . phi(k_j)``
lets the sum over keys be done once, before the queries arrive:

    ``out_i = phi(q_i)^T S / (phi(q_i)^T z)``,  ``S = sum_j phi(k_j) v_j^T``,  ``z = sum_j phi(k_j)``.

That costs O(n d_k d_v) time instead of O(n^2 d). It is a *different* attention, not an
approximation of softmax that converges to it: the weights ``phi(q_i).phi(k_j) / sum_l
phi(q_i).phi(k_l)`` are positive and sum to one, like softmax's, but are not softmax's.

Causal form: query ``i`` (at position ``p_i = i + Nk - Nq``, as in
:func:`attention_ref.causal_mask`) uses the prefix sums ``S_{p_i} = sum_{j <= p_i}
phi(k_j) v_j^T`` and ``z_{p_i}``, computed with one cumulative sum over positions (it
holds the (..., Nk, Dk, Dv) prefix sums: O(n d_k d_v) memory).

Symbols: ``...`` batch axes, Nq/Nk lengths, Dk/Dv widths, ``fq = phi(q)``, ``fk = phi(k)``.

Forward, numbered so the backward can walk it in reverse:

1. features ``fq = phi(q)`` (..., Nq, Dk), ``fk = phi(k)`` (..., Nk, Dk)
2. key summaries ``S`` (..., Dk, Dv) and ``z`` (..., Dk) (prefix sums when causal)
3. ``num = fq S`` (..., Nq, Dv), ``den = fq . z`` (..., Nq)
4. ``out = num / (den + DEN_EPS)``

``DEN_EPS`` floors the normaliser: ``phi > 0`` makes ``den > 0`` in exact arithmetic, but
in floating point ``phi(q) . phi(k)`` underflows to 0 for very negative inputs (about -50
in float32, -370 in float64 with ``elu + 1``), and with no keys at all the sum is 0; the
plain formula would then give 0 / 0 = NaN. Adding a small constant to the normaliser is
what linear-attention implementations usually do (Katharopoulos et al. 2020 use 1e-6);
it changes a normal-range output by a relative ``DEN_EPS / den`` (``den`` is typically of
order ``n_k``) and turns the degenerate cases into ``out = 0``.

The sums ``S``, ``z`` and the products with ``phi(q)`` grow like ``n |q| |k| |v|``; when
they overflow the dtype (q, k and v all near 1e13 in float32) the forward raises
``FloatingPointError`` naming q, k, v, the dtype and its largest finite value, found by
one pass over ``den`` (..., Nq) and ``out`` (..., Nq, Dv).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._checks import as_upstream, overflow_error, signals_land_here, unbroadcast
from .._pair_checks import check_attention_inputs

__all__ = ["DEN_EPS", "FEATURE_MAPS", "LinearAttentionCache", "linear_attention_forward", "linear_attention_backward"]

#: Floor added to the normaliser ``den = phi(q) . sum_j phi(k_j)`` (see the module docstring);
#: a Python float, so float32 stays float32.
DEN_EPS = 1e-6


def _elu_plus_one(x):
    """``elu(x) + 1``: ``x + 1`` for x > 0, ``exp(x)`` otherwise; always > 0."""
    return np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))


def _elu_plus_one_grad(x):
    """Derivative of ``elu(x) + 1``: 1 for x > 0, ``exp(x)`` otherwise."""
    return np.where(x > 0, 1.0, np.exp(np.minimum(x, 0.0))).astype(x.dtype, copy=False)


def _softplus(x):
    """``log(1 + exp(x))``, computed stably; always > 0."""
    return np.logaddexp(x, 0.0).astype(x.dtype, copy=False)


def _softplus_grad(x):
    """Derivative of softplus: the logistic sigmoid ``1 / (1 + exp(-x))``."""
    return (0.5 * (1.0 + np.tanh(0.5 * x))).astype(x.dtype, copy=False)


#: Positive feature maps ``phi`` and their derivatives; "elu" (``elu(x) + 1``) is the default.
FEATURE_MAPS = {"elu": (_elu_plus_one, _elu_plus_one_grad), "softplus": (_softplus, _softplus_grad)}


class LinearAttentionCache(NamedTuple):
    """What the backward needs: inputs, features, summaries and the normaliser."""

    q: np.ndarray  # (..., Nq, Dk)
    k: np.ndarray  # (..., Nk, Dk)
    v: np.ndarray  # (..., Nk, Dv)
    fq: np.ndarray  # (..., Nq, Dk), phi(q)
    fk: np.ndarray  # (..., Nk, Dk), phi(k)
    S: np.ndarray  # (..., Dk, Dv), or (..., Nq, Dk, Dv) prefix sums when causal
    z: np.ndarray  # (..., Dk), or (..., Nq, Dk) when causal
    den: np.ndarray  # (..., Nq), the floored normaliser phi(q) . z + DEN_EPS
    out: np.ndarray  # (..., Nq, Dv)
    causal: bool
    feature_map: str


def linear_attention_forward(q, k, v, causal=False, feature_map="elu"):
    """Linear attention ``out_i = phi(q_i)^T S / (phi(q_i)^T z + DEN_EPS)``, arguments
    ``(q, k, v, causal, feature_map)``.

    Parameters
    ----------
    q : array (..., n_q, d_k); k : array (..., n_k, d_k); v : array (..., n_k, d_v)
    causal : query ``i`` only sees keys ``j <= i + n_k - n_q`` (needs ``n_q <= n_k``)
    feature_map : name in :data:`FEATURE_MAPS`, a positive map ``phi`` applied entrywise:
        ``"elu"`` (default, ``elu(x) + 1``) or ``"softplus"``

    Returns
    -------
    out : array (..., n_q, d_v)
    cache : LinearAttentionCache

    Raises
    ------
    FloatingPointError : when the sums overflow the dtype

    Cost: O((n_q + n_k) d_k d_v) time; memory O(d_k d_v) per batch element for the
    summaries (O(n d_k d_v) when causal, for the prefix sums).
    """
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"causal must be True or False, got {causal!r}")
    if feature_map not in FEATURE_MAPS:
        raise ValueError(f"feature_map must be one of {sorted(FEATURE_MAPS)}, got {feature_map!r}")
    q, k, v, _, _ = check_attention_inputs(q, k, v, None)
    n_q, n_k = q.shape[-2], k.shape[-2]
    if causal and n_q > n_k:
        raise ValueError(f"causal linear attention needs n_q <= n_k (the queries are the last"
                         f" n_q positions): q has shape {q.shape}, k has shape {k.shape}")
    phi, _ = FEATURE_MAPS[feature_map]
    with np.errstate(over="ignore", invalid="ignore"):  # overflow is reported below, by name
        fq, fk, S, z, den, out = _linear_attention(q, k, v, phi, causal)
        signals_land_here()  # a Ctrl-C is raised inside the block (_pair_checks.py)
    if not (np.isfinite(den).all() and np.isfinite(out).all()):
        raise overflow_error("the linear-attention sums phi(k)^T v, phi(q) S and phi(q) . z",
                             q.dtype, [("q", q), ("k", k), ("v", v)])
    cache = LinearAttentionCache(q, k, v, fq, fk, S, z, den, out, bool(causal), feature_map)
    return out.copy(), cache  # the caller's own copy: editing it cannot change the backward


def _linear_attention(q, k, v, phi, causal):
    """Steps 1-4 on validated inputs: ``fq, fk, S, z, den, out``."""
    n_q, n_k = q.shape[-2], k.shape[-2]
    # 1. features
    fq, fk = phi(q), phi(k)  # (..., Nq, Dk), (..., Nk, Dk)
    # 2. key summaries
    if causal:
        S = np.cumsum(fk[..., :, :, None] * v[..., :, None, :], axis=-3)  # (..., Nk, Dk, Dv)
        z = np.cumsum(fk, axis=-2)  # (..., Nk, Dk)
        S, z = S[..., n_k - n_q:, :, :], z[..., n_k - n_q:, :]  # (..., Nq, Dk, Dv), (..., Nq, Dk)
        # 3. numerator and normaliser, one summary per query
        num = (fq[..., :, None, :] @ S)[..., 0, :]  # (..., Nq, Dv)
        den = (fq * z).sum(axis=-1)  # (..., Nq)
    else:
        S = fk.swapaxes(-1, -2) @ v  # (..., Dk, Dv)
        z = fk.sum(axis=-2)  # (..., Dk)
        # 3. numerator and normaliser
        num = fq @ S  # (..., Nq, Dv)
        den = (fq * z[..., None, :]).sum(axis=-1)  # (..., Nq)
    # 4. normalise: plain formula num / den, floored as num / (den + DEN_EPS) because den
    #    (> 0 in exact arithmetic) underflows to 0 for very negative q, k, or when n_k = 0
    den = den + DEN_EPS  # (..., Nq); stored floored, so the backward differentiates this
    out = num / den[..., None]  # (..., Nq, Dv)
    return fq, fk, S, z, den, out


def linear_attention_backward(dout, cache: LinearAttentionCache):
    """Gradients of :func:`linear_attention_forward` (arguments ``dout, cache``): ``(dq, dk, dv)``.

    4. ``out = num / den`` (``den`` already holds ``+ DEN_EPS``)  gives ``dnum = dout / den``, ``dden = -rowsum(dout * out) / den``
    3. ``num = fq S``, ``den = fq . z``  gives ``dfq = dnum S^T + dden z``,
       ``dS = fq^T dnum``, ``dz = fq^T dden``
    2. ``S = fk^T v``, ``z = sum_j fk_j``  gives ``dfk = v dS^T + dz``, ``dv = fk dS``; when
       causal the backward of a prefix sum is a suffix sum: ``dS_j <- sum_{i >= j} dS_i``
    1. ``f = phi(x)``  gives ``dx = df * phi'(x)``

    Parameters
    ----------
    dout : array (..., n_q, d_v)
    cache : LinearAttentionCache

    Returns
    -------
    dq, dk, dv : arrays shaped like q, k and v
    """
    q, k, v, fq, fk, S, z, den, out, causal, feature_map = cache
    dout = as_upstream(dout, out.shape, out.dtype)
    _, phi_grad = FEATURE_MAPS[feature_map]
    # 4. out = num / den
    dnum = dout / den[..., None]  # (..., Nq, Dv)
    dden = -(dout * out).sum(axis=-1) / den  # (..., Nq)
    if causal:
        n_q, n_k = q.shape[-2], k.shape[-2]
        # 3. per-query summaries
        dfq = (S @ dnum[..., :, :, None])[..., 0] + dden[..., None] * z  # (..., Nq, Dk)
        dS = fq[..., :, :, None] * dnum[..., :, None, :]  # (..., Nq, Dk, Dv)
        dz = dden[..., None] * fq  # (..., Nq, Dk)
        # 2. prefix sums: key j receives the gradients of every query at position >= j
        dS = np.flip(np.cumsum(np.flip(dS, axis=-3), axis=-3), axis=-3)  # (..., Nq, Dk, Dv)
        dz = np.flip(np.cumsum(np.flip(dz, axis=-2), axis=-2), axis=-2)  # (..., Nq, Dk)
        pad = n_k - n_q  # keys before the first query position see every query (none if n_q = 0)
        if pad:
            all_S = dS[..., :1, :, :] if n_q else np.zeros(dS.shape[:-3] + (1,) + dS.shape[-2:], dS.dtype)
            all_z = dz[..., :1, :] if n_q else np.zeros(dz.shape[:-2] + (1,) + dz.shape[-1:], dz.dtype)
            dS = np.concatenate([np.repeat(all_S, pad, axis=-3), dS], axis=-3)  # (..., Nk, Dk, Dv)
            dz = np.concatenate([np.repeat(all_z, pad, axis=-2), dz], axis=-2)  # (..., Nk, Dk)
        dfk = (dS @ v[..., :, :, None])[..., 0] + dz  # (..., Nk, Dk)
        dv = (fk[..., :, None, :] @ dS)[..., 0, :]  # (..., Nk, Dv)
    else:
        # 3. num = fq S, den = fq . z
        dfq = dnum @ S.swapaxes(-1, -2) + dden[..., None] * z[..., None, :]  # (..., Nq, Dk)
        dS = fq.swapaxes(-1, -2) @ dnum  # (..., Dk, Dv)
        dz = (dden[..., None] * fq).sum(axis=-2)  # (..., Dk)
        # 2. S = fk^T v, z = sum_j fk_j
        dfk = v @ dS.swapaxes(-1, -2) + dz[..., None, :]  # (..., Nk, Dk)
        dv = fk @ dS  # (..., Nk, Dv)
    # 1. features
    dq = dfq * phi_grad(q)
    dk = dfk * phi_grad(k)
    return unbroadcast(dq, q.shape), unbroadcast(dk, k.shape), unbroadcast(dv, v.shape)
