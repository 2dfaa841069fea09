"""The gated delta rule (Gated DeltaNet, Yang, Kautz and Hatamizadeh 2024; Qwen3-Next's linear
attention layers) in its recurrent form, and its backward through time.

Linear attention keeps one matrix per head, the state ``S`` (Dk, Dv), in place of the keys and
values seen so far: a query reads it as ``o = S^T q``. Plain linear attention only adds to the state
(``S_t = S_{t-1} + k_t v_t^T``), so old associations pile up and are never removed. The delta rule
(Widrow-Hoff's, Schlag et al. 2021) first reads what the state already stores under ``k_t``,
``m_t = S^T k_t``, and writes only the correction ``beta_t (v_t - m_t)``: with a unit key and
``beta_t = 1`` the state then maps ``k_t`` exactly to ``v_t``. The gate ``exp(g_t)`` in (0, 1]
shrinks the whole state first, so the layer can forget quickly when the context changes (Mamba 2's
decay). In the (Dk, Dv) layout transformers uses, with ``a_t = exp(g_t)``:

    ``S_t = a_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T``,   ``o_t = S_t^T q_t``

(the brief's ``S_t = a_t S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T`` is the transpose).
As transformers' ``torch_recurrent_gated_delta_rule`` computes it (4.57.1 and 5.x), q and k are
first divided by their L2 norms, ``x / sqrt(sum x^2 + 1e-6)`` (``use_qk_l2norm_in_kernel=True``,
as Qwen3-Next calls it), and q is scaled by ``1 / sqrt(Dk)``.

Cost: each step is O(Dk Dv) whatever t is, so n tokens cost O(n Dk Dv) time and the decoding
state O(Dk Dv) memory, against softmax attention's O(n^2 D) and an O(n D) cache.

Symbols: ``...`` batch axes (batch, heads), T positions, Dk/Dv key/value widths.

Forward, numbered so the backward can walk it in reverse (each step for t = 1 .. T):

0. ``q_hat = scale * q / |q|``, ``k_hat = k / |k|`` (each with the 1e-6 inside the root)
1. ``A_t = a_t S_{t-1}``, ``a_t = exp(g_t)``          decay
2. ``m_t = A_t^T k_t``                                what the state recalls for k_t
3. ``u_t = v_t - m_t``, ``d_t = beta_t u_t``          the correction
4. ``S_t = A_t + k_t d_t^T``                          write
5. ``o_t = S_t^T q_t``                                read
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._checks import as_real_array, as_upstream, common_dtype, overflow_error, require_ndim, signals_land_here

__all__ = ["L2NORM_EPS", "GatedDeltaRuleCache", "gated_delta_rule_forward", "gated_delta_rule_backward",
           "gated_delta_rule_formula"]

#: The constant inside the root of the L2 normalisation of q and k (transformers' ``l2norm``).
L2NORM_EPS = 1e-6


class GatedDeltaRuleCache(NamedTuple):
    """What the backward needs; ``states[..., t, :, :]`` is ``S_t`` (``states[..., 0]`` the initial
    state, ``states[..., -1]`` the final one, which decoding carries)."""

    q: np.ndarray  # (..., T, Dk), normalised (not scaled)
    k: np.ndarray  # (..., T, Dk), k_hat
    q_rnorm: np.ndarray | None  # (..., T, 1), 1 / sqrt(|q|^2 + eps), None without normalisation
    k_rnorm: np.ndarray | None  # (..., T, 1)
    scale: float
    a: np.ndarray  # (..., T), exp(g)
    beta: np.ndarray  # (..., T)
    u: np.ndarray  # (..., T, Dv), v - m
    d: np.ndarray  # (..., T, Dv), beta * u
    states: np.ndarray  # (..., T + 1, Dk, Dv)
    shapes: tuple  # the shapes of q, k, v, g, beta, initial_state, for the gradients

    @property
    def final_state(self):
        """``S_T`` (..., Dk, Dv): the state the next token starts from."""
        return self.states[..., -1, :, :]


def gated_delta_rule_forward(q, k, v, g, beta, initial_state=None, scale=None, qk_l2norm=True):
    """The gated delta rule over a sequence, from ``initial_state`` (zeros when None). Arguments
    ``(q, k, v, g, beta, initial_state=None, scale=None, qk_l2norm=True)``.

    Parameters
    ----------
    q, k : arrays (..., t, dk), queries and keys per head (transformers' (B, T, H, D) is
        ``x.transpose(0, 2, 1, 3)`` here; repeat grouped key heads before the call)
    v : array (..., t, dv)
    g : array (..., t), the log of the decay, every entry <= 0 (Qwen3-Next:
        ``-exp(A_log) * softplus(a + dt_bias)``)
    beta : array (..., t), the writing strength (Qwen3-Next: ``sigmoid(b)``)
    initial_state : None or array (..., dk, dv)
    scale : the query's scale, ``1 / sqrt(dk)`` when None (transformers' only choice)
    qk_l2norm : divide q and k by their L2 norms first (True: ``use_qk_l2norm_in_kernel=True``)

    Returns
    -------
    out : array (..., t, dv), in the inputs' common dtype
    cache : GatedDeltaRuleCache; ``cache.final_state`` (..., dk, dv) is the state after the last token
    """
    names = ("q", "k", "v", "g", "beta", "initial_state")
    q, k, v, g, beta = (as_real_array(x, name) for x, name in zip((q, k, v, g, beta), names))
    require_ndim(q, "q", 2, "(..., t, dk)")
    require_ndim(k, "k", 2, "(..., t, dk)")
    require_ndim(v, "v", 2, "(..., t, dv)")
    require_ndim(g, "g", 1, "(..., t)")
    require_ndim(beta, "beta", 1, "(..., t)")
    if q.shape != k.shape:
        raise ValueError(f"q and k must have the same shape (..., t, dk), got {q.shape} and {k.shape}")
    if v.shape[:-1] != q.shape[:-1]:
        raise ValueError(f"v must have shape {q.shape[:-1] + ('dv',)} (q's batch axes and t), got {v.shape}")
    for x, name in ((g, "g"), (beta, "beta")):
        if x.shape != q.shape[:-1]:
            raise ValueError(f"{name} must have shape {q.shape[:-1]} (q's batch axes and t), got {x.shape}")
    if (g > 0).any():
        raise ValueError(f"g is the log of a decay and must be <= 0, got a largest entry {float(g.max()):.6g}")
    dk, dv = q.shape[-1], v.shape[-1]
    if initial_state is not None:
        initial_state = as_real_array(initial_state, "initial_state")
        if initial_state.shape != q.shape[:-2] + (dk, dv):
            raise ValueError(f"initial_state must have shape {q.shape[:-2] + (dk, dv)} (..., dk, dv),"
                             f" got {initial_state.shape}")
    if scale is None:
        scale = 1.0 / np.sqrt(dk)
    elif isinstance(scale, bool) or not (isinstance(scale, (int, float, np.floating)) and np.isfinite(scale)
                                         and scale > 0):
        raise ValueError(f"scale must be a positive finite number, got {scale!r}")
    dtype = common_dtype(q, k, v, g, beta, initial_state)
    q, k, v, g, beta = (x.astype(dtype, copy=False) for x in (q, k, v, g, beta))
    if initial_state is None:
        initial_state = np.zeros(q.shape[:-2] + (dk, dv), dtype)
    out, cache = gated_delta_rule_formula(q, k, v, g, beta, initial_state.astype(dtype, copy=False),
                                          float(scale), bool(qk_l2norm))
    if not (np.isfinite(out).all() and np.isfinite(cache.states[..., -1, :, :]).all()):
        raise overflow_error("the gated delta rule's state", dtype, [("q", q), ("k", k), ("v", v)])
    return out, cache


def _l2_normalise(x):
    """``x / sqrt(sum x^2 + eps)`` over the last axis, and the reciprocal root (..., 1)."""
    r = 1.0 / np.sqrt((x * x).sum(axis=-1, keepdims=True) + L2NORM_EPS)
    return x * r, r


def gated_delta_rule_formula(q, k, v, g, beta, initial_state, scale, qk_l2norm=True):
    """:func:`gated_delta_rule_forward` on checked inputs of one dtype (the blocks and decoding call it;
    a decoding step is this with t = 1 and the previous ``final_state``)."""
    shapes = (q.shape, k.shape, v.shape, g.shape, beta.shape, initial_state.shape)
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):  # an overflowing state is reported by the
        # caller; a decay exp(g) far below 1 underflows to 0 (the state forgotten), as it should
        # 0. normalise q and k, scale q
        q_rnorm = k_rnorm = None
        if qk_l2norm:
            q, q_rnorm = _l2_normalise(q)
            k, k_rnorm = _l2_normalise(k)
        qs = q * scale  # (..., T, Dk); scale is a Python float: float32 stays float32
        a = np.exp(g)  # (..., T)
        T = q.shape[-2]
        states = np.empty(q.shape[:-2] + (T + 1,) + initial_state.shape[-2:], q.dtype)  # (..., T+1, Dk, Dv)
        states[..., 0, :, :] = initial_state
        u, d, out = np.empty_like(v), np.empty_like(v), np.empty_like(v)  # (..., T, Dv)
        for t in range(T):
            A = a[..., t, None, None] * states[..., t, :, :]  # 1. (..., Dk, Dv)
            m = np.einsum("...kv,...k->...v", A, k[..., t, :])  # 2. (..., Dv)
            u[..., t, :] = v[..., t, :] - m  # 3.
            d[..., t, :] = beta[..., t, None] * u[..., t, :]
            states[..., t + 1, :, :] = A + k[..., t, :, None] * d[..., t, None, :]  # 4. (..., Dk, Dv)
            out[..., t, :] = np.einsum("...kv,...k->...v", states[..., t + 1, :, :], qs[..., t, :])  # 5.
        signals_land_here()  # a Ctrl-C is raised inside the block (_pair_checks.py)
    return out, GatedDeltaRuleCache(q, k, q_rnorm, k_rnorm, scale, a, beta, u, d, states, shapes)


def gated_delta_rule_backward(dout, cache: GatedDeltaRuleCache, dfinal_state=None):
    """Gradients of :func:`gated_delta_rule_forward` (arguments ``dout, cache, dfinal_state=None``):
    ``(dq, dk, dv, dg, dbeta, dinitial_state)``. ``dfinal_state`` (..., dk, dv) is the gradient reaching
    the final state from later tokens (None: the loss does not read it).

    Backward through time: ``dS`` is the gradient of the loss with respect to ``S_t`` through
    everything after step t; it starts at ``dfinal_state`` and walks t = T .. 1:

    5. ``o_t = S_t^T q_t``: ``dS += q_t do_t^T``, ``dq_t = S_t do_t``
    4. ``S_t = A_t + k_t d_t^T``: ``dA = dS``, ``dk_t = dS d_t``, ``dd_t = dS^T k_t``
    3. ``d_t = beta_t (v_t - m_t)``: ``dv_t = beta_t dd_t``, ``dbeta_t = dd_t . u_t``, ``dm_t = -dv_t``
    2. ``m_t = A_t^T k_t``: ``dA += k_t dm_t^T``, ``dk_t += A_t dm_t``
    1. ``A_t = a_t S_{t-1}``: ``dg_t = a_t sum(dA * S_{t-1})``, and ``dS = a_t dA`` for step t - 1
    0. ``q_hat = scale q r``, ``r = (|q|^2 + eps)^(-1/2)``: ``dq = scale r (dq_hat' - q_n (q_n . dq_hat'))``
       with ``q_n = q r`` (the same for k without the scale); after step 1 of t = 1, ``dS`` is
       ``dinitial_state``.

    Returns
    -------
    dq, dk : arrays (..., t, dk); dv : (..., t, dv); dg, dbeta : (..., t); dinitial_state : (..., dk, dv)
    """
    q_shape, _, v_shape, _, _, state_shape = cache.shapes
    dtype = cache.states.dtype
    dout = as_upstream(dout, v_shape, dtype, "dout")
    dS = (np.zeros(state_shape, dtype) if dfinal_state is None
          else as_upstream(dfinal_state, state_shape, dtype, "dfinal_state").copy())
    q, k, a, beta, u, d, states = cache.q, cache.k, cache.a, cache.beta, cache.u, cache.d, cache.states
    dq, dk = np.empty_like(q), np.empty_like(k)  # (..., T, Dk)
    dv = np.empty(v_shape, dtype)  # (..., T, Dv)
    dg, dbeta = np.empty_like(a), np.empty_like(a)  # (..., T)
    for t in reversed(range(q.shape[-2])):
        # 5. read
        dS = dS + cache.scale * q[..., t, :, None] * dout[..., t, None, :]  # (..., Dk, Dv)
        dq[..., t, :] = np.einsum("...kv,...v->...k", states[..., t + 1, :, :], dout[..., t, :])
        # 4. write
        dk_t = np.einsum("...kv,...v->...k", dS, d[..., t, :])  # (..., Dk)
        dd = np.einsum("...kv,...k->...v", dS, k[..., t, :])  # (..., Dv)
        # 3. the correction
        dv[..., t, :] = beta[..., t, None] * dd
        dbeta[..., t] = (dd * u[..., t, :]).sum(axis=-1)
        dm = -dv[..., t, :]  # (..., Dv)
        # 2. the recall, 1. the decay
        S_prev = states[..., t, :, :]
        A = a[..., t, None, None] * S_prev  # (..., Dk, Dv)
        dA = dS + k[..., t, :, None] * dm[..., None, :]
        dk[..., t, :] = dk_t + np.einsum("...kv,...v->...k", A, dm)
        dg[..., t] = a[..., t] * (dA * S_prev).sum(axis=(-2, -1))
        dS = a[..., t, None, None] * dA
    # 0. the scale and the normalisations
    dq = dq * cache.scale
    if cache.q_rnorm is not None:
        dq = _l2_normalise_backward(dq, q, cache.q_rnorm)
        dk = _l2_normalise_backward(dk, k, cache.k_rnorm)
    return dq, dk, dv, dg, dbeta, dS


def _l2_normalise_backward(dy, y, r):
    """Gradient of ``y = x r``, ``r = (|x|^2 + eps)^(-1/2)``, given y and r: ``d r / d x = -r^3 x``, so
    ``dx = r dy - r^3 x (x . dy) = r (dy - y (y . dy))``."""
    return r * (dy - y * (y * dy).sum(axis=-1, keepdims=True))
