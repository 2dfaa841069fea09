"""Qwen3-Next's linear-attention layer, Gated DeltaNet (transformers' ``Qwen3NextGatedDeltaNet``), as
numbered steps of pairs, its backward, and its decoding step carrying the convolution's window and
the recurrent state.

Symbols: ``...`` batch axes, T positions, D width, Hk key heads of width dk, Hv value heads of width
dv (``r = Hv / Hk`` value heads share a key head), C = 2 Hk dk + Hv dv the convolved channels, K the
kernel width.

Params (our names; transformers' after ``linear_attn.``): ``in_proj_qkvz.W`` (D, 2 Hk dk + 2 Hv dv),
``in_proj_ba.W`` (D, 2 Hv), ``conv1d.weight`` (C, K) (theirs (C, 1, K)), ``dt_bias`` (Hv,),
``A_log`` (Hv,), ``norm.weight`` (dv,), ``out_proj.W`` (Hv dv, D). Each W is theirs transposed.

Forward, numbered so the backward walks it in reverse:

1. ``P = x W_qkvz``, ``R = x W_ba``; each key head's group of columns holds its q (dk), k (dk), then
   its r value heads' v (r dv) and z (r dv); ``R``'s group its r b's then its r a's
   (transformers' ``fix_query_key_value_ordering``)
2. ``[q, k, v] = silu(causal_conv([q, k, v]))`` over the C channels (:mod:`.causal_conv1d`)
3. ``beta = sigmoid(b)``, ``g = -exp(A_log) * softplus(a + dt_bias)`` (torch's softplus: the identity above 20)
4. q and k repeated to the Hv value heads; ``o = gated_delta_rule(q, k, v, g, beta)`` with q, k
   L2-normalised (:mod:`attention_ref.variants.gated_delta_rule`)
5. ``n = RMSNorm(o) * silu(z)`` per value head (:mod:`.gated_rms_norm`)
6. ``y = n W_out``

Decoding runs the same steps on the new tokens with :class:`DeltaNetState` (the conv window and the
recurrent state a previous call left); transformers' padding mask (``apply_mask_to_padding_states``)
is not computed here: the layer takes no mask.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._checks import as_real_array, as_upstream, signals_land_here
from ..fast.dispatch import linear_backward_formula, linear_formula
from ..core.linear import LinearCache
from ..variants.gated_delta_rule import gated_delta_rule_backward, gated_delta_rule_formula
from .causal_conv1d import causal_conv1d_backward, causal_conv1d_formula
from .gated_rms_norm import gated_rms_norm_backward, gated_rms_norm_formula
from .swiglu import _sigmoid

__all__ = ["DeltaNetShape", "DeltaNetState", "GatedDeltaNetCache", "gated_delta_net_forward",
           "gated_delta_net_backward", "gated_delta_net_formula", "SOFTPLUS_THRESHOLD"]

#: torch's ``softplus`` returns its input unchanged above this (``threshold=20``); so does this layer
SOFTPLUS_THRESHOLD = 20.0


class DeltaNetShape(NamedTuple):
    """The layer's head counts and widths (Qwen3-Next's ``linear_num_key_heads``,
    ``linear_key_head_dim``, ``linear_num_value_heads``, ``linear_value_head_dim``) and its norm's eps."""

    key_heads: int
    key_dim: int
    value_heads: int
    value_dim: int
    eps: float = 1e-6


class DeltaNetState(NamedTuple):
    """What decoding carries from one call to the next: the last K - 1 convolved inputs and the state."""

    window: np.ndarray  # (..., K - 1, C)
    recurrent: np.ndarray  # (..., Hv, dk, dv)


class GatedDeltaNetCache(NamedTuple):
    """The caches of the six steps."""

    qkvz: LinearCache  # 1.
    ba: LinearCache
    conv: object  # 2. CausalConv1dCache
    a_plus: np.ndarray  # 3. (..., T, Hv), a + dt_bias
    A: np.ndarray  # (Hv,), exp(A_log)
    softplus: np.ndarray  # (..., T, Hv)
    beta: np.ndarray  # (..., T, Hv)
    rule: object  # 4. GatedDeltaRuleCache
    norm: object  # 5. GatedRMSNormCache
    out: LinearCache  # 6.
    shape: DeltaNetShape

    @property
    def state(self):
        """The :class:`DeltaNetState` after the last token (the next call's ``state``)."""
        return DeltaNetState(self.conv.window, self.rule.final_state)


def _softplus(x):
    """torch's ``softplus``: ``log(1 + exp(x))``, and ``x`` itself above the threshold."""
    with np.errstate(over="ignore", under="ignore"):  # exp of a large x is unused (the threshold picks x);
        # a very negative x underflows to log1p(0) = 0, as torch gives
        out = np.where(x > SOFTPLUS_THRESHOLD, x, np.log1p(np.exp(np.minimum(x, SOFTPLUS_THRESHOLD))))
        signals_land_here()  # a Ctrl-C is raised inside the block (_pair_checks.py)
    return out


def gated_delta_net_forward(x, params, shape: DeltaNetShape, state: DeltaNetState | None = None):
    """Gated DeltaNet on ``x`` (..., t, d). Arguments ``(x, params, shape, state=None)``.

    Parameters
    ----------
    x : array (..., t, d)
    params : dict with the module docstring's keys and shapes
    shape : DeltaNetShape
    state : None (the start of a sequence) or the ``cache.state`` of the previous call (decoding)

    Returns
    -------
    y : array (..., t, d)
    cache : GatedDeltaNetCache; ``cache.state`` is the next call's ``state``
    """
    x = as_real_array(x, "x")
    if x.ndim < 2:
        raise ValueError(f"x must have shape (..., t, d), got shape {x.shape}")
    hk, dk, hv, dv, _ = shape
    if hv % hk:
        raise ValueError(f"shape: value_heads ({hv}) must be a multiple of key_heads ({hk})")
    d, c = x.shape[-1], 2 * hk * dk + hv * dv
    expected = {"in_proj_qkvz.W": (d, 2 * hk * dk + 2 * hv * dv), "in_proj_ba.W": (d, 2 * hv),
                "dt_bias": (hv,), "A_log": (hv,), "norm.weight": (dv,), "out_proj.W": (hv * dv, d)}
    p = {}
    for name, want in expected.items():
        if name not in params:
            raise ValueError(f"params has no {name!r}")
        p[name] = as_real_array(params[name], f"params[{name!r}]").astype(x.dtype, copy=False)
        if p[name].shape != want:
            raise ValueError(f"params[{name!r}] must have shape {want}, got {p[name].shape}")
    conv = as_real_array(params.get("conv1d.weight"), "params['conv1d.weight']").astype(x.dtype, copy=False)
    if conv.ndim != 2 or conv.shape[0] != c or conv.shape[1] < 1:
        raise ValueError(f"params['conv1d.weight'] must have shape ({c}, k), got {conv.shape}")
    p["conv1d.weight"] = conv
    if state is not None:
        window = as_real_array(state.window, "state.window").astype(x.dtype, copy=False)
        recurrent = as_real_array(state.recurrent, "state.recurrent").astype(x.dtype, copy=False)
        if window.shape != x.shape[:-2] + (conv.shape[1] - 1, c):
            raise ValueError(f"state.window must have shape {x.shape[:-2] + (conv.shape[1] - 1, c)}, got {window.shape}")
        if recurrent.shape != x.shape[:-2] + (hv, dk, dv):
            raise ValueError(f"state.recurrent must have shape {x.shape[:-2] + (hv, dk, dv)}, got {recurrent.shape}")
        state = DeltaNetState(window, recurrent)
    return gated_delta_net_formula(x, p, shape, state)


def gated_delta_net_formula(x, p, shape: DeltaNetShape, state: DeltaNetState | None = None):
    """:func:`gated_delta_net_forward` on checked inputs (the family's block calls it)."""
    hk, dk, hv, dv, eps = shape
    r, batch, T = hv // hk, x.shape[:-2], x.shape[-2]
    # 1. the two input projections, split per key head's group
    P = linear_formula(x, p["in_proj_qkvz.W"], None).reshape(batch + (T, hk, 2 * dk + 2 * r * dv))
    R = linear_formula(x, p["in_proj_ba.W"], None).reshape(batch + (T, hk, 2 * r))
    q, k = P[..., :dk], P[..., dk:2 * dk]  # (..., T, Hk, dk)
    v = P[..., 2 * dk:2 * dk + r * dv].reshape(batch + (T, hv, dv))
    z = P[..., 2 * dk + r * dv:].reshape(batch + (T, hv, dv))
    b, a = R[..., :r].reshape(batch + (T, hv)), R[..., r:].reshape(batch + (T, hv))
    # 2. the short causal convolution over [q, k, v] (C channels), then SiLU
    mixed = np.concatenate([q.reshape(batch + (T, hk * dk)), k.reshape(batch + (T, hk * dk)),
                            v.reshape(batch + (T, hv * dv))], axis=-1)  # (..., T, C)
    kw = p["conv1d.weight"].shape[1]
    window = np.zeros(batch + (kw - 1, mixed.shape[-1]), x.dtype) if state is None else state.window
    mixed, conv = causal_conv1d_formula(mixed, p["conv1d.weight"], None, window, "silu")
    q = mixed[..., :hk * dk].reshape(batch + (T, hk, dk))
    k = mixed[..., hk * dk:2 * hk * dk].reshape(batch + (T, hk, dk))
    v = mixed[..., 2 * hk * dk:].reshape(batch + (T, hv, dv))
    # 3. the writing strength and the decay
    beta = _sigmoid(b)  # (..., T, Hv)
    a_plus, A = a + p["dt_bias"], np.exp(p["A_log"])
    softplus = _softplus(a_plus)
    g = -A * softplus  # (..., T, Hv), <= 0
    # 4. the gated delta rule per value head (q, k repeated r times), heads before time
    heads_first = lambda t: np.moveaxis(t, -1 if t.ndim == len(batch) + 2 else -2, len(batch))  # noqa: E731
    q, k = np.repeat(q, r, axis=-2), np.repeat(k, r, axis=-2)  # (..., T, Hv, dk)
    s0 = np.zeros(batch + (hv, dk, dv), x.dtype) if state is None else state.recurrent
    o, rule = gated_delta_rule_formula(heads_first(q), heads_first(k), heads_first(v), heads_first(g),
                                       heads_first(beta), s0, 1.0 / np.sqrt(dk), True)  # (..., Hv, T, dv)
    # 5. the gated RMSNorm per value head
    n, norm = gated_rms_norm_formula(np.moveaxis(o, len(batch), -2), z, p["norm.weight"], eps)  # (..., T, Hv, dv)
    # 6. the output projection
    n = n.reshape(batch + (T, hv * dv))
    y = linear_formula(n, p["out_proj.W"], None)  # (..., T, D)
    return y, GatedDeltaNetCache(LinearCache(x, p["in_proj_qkvz.W"], False), LinearCache(x, p["in_proj_ba.W"], False),
                                 conv, a_plus, A, softplus, beta, rule, norm, LinearCache(n, p["out_proj.W"], False),
                                 shape)


def gated_delta_net_backward(dy, cache: GatedDeltaNetCache):
    """Gradients of :func:`gated_delta_net_forward` (arguments ``dy, cache``): ``(dx, grads)``, grads keyed
    like the params. The six steps in reverse:

    6. ``dn = dy W_out^T``, ``dW_out = n^T dy``
    5. the gated norm's backward: ``do``, ``dz``, ``dnorm.weight``
    4. the delta rule's backward through time: ``dq, dk`` (summed over the r value heads of each key
       head), ``dv``, ``dg``, ``dbeta``
    3. ``db = dbeta beta (1 - beta)``; ``g = -A softplus(a + dt_bias)``: ``dA_log = -sum(dg softplus) A``,
       ``da = -dg A sigmoid(a + dt_bias)`` (``sigmoid`` is 1 above the threshold), ``ddt_bias = sum da``
    2. the convolution's backward (its window gets no gradient: a new sequence starts from zeros)
    1. ``dP``, ``dR`` assembled in the group layout, then the two projections' backward
    """
    x = cache.qkvz.x
    hk, dk, hv, dv, _ = cache.shape
    r, batch, T = hv // hk, x.shape[:-2], x.shape[-2]
    dy = as_upstream(dy, x.shape, x.dtype, "dy")
    g = {}
    # 6. output projection
    dn, g["out_proj.W"], _ = linear_backward_formula(dy, cache.out)
    # 5. gated RMSNorm
    do, dz, g["norm.weight"] = gated_rms_norm_backward(dn.reshape(batch + (T, hv, dv)), cache.norm)
    # 4. the delta rule, heads back after time
    nb = len(batch)
    dq, dk_, dv_, dg, dbeta, _ = gated_delta_rule_backward(np.moveaxis(do, -2, nb), cache.rule)
    dq, dk_, dv_ = (np.moveaxis(t, nb, -2) for t in (dq, dk_, dv_))  # (..., T, Hv, d)
    dg, dbeta = np.moveaxis(dg, nb, -1), np.moveaxis(dbeta, nb, -1)  # (..., T, Hv)
    dq = dq.reshape(batch + (T, hk, r, dk)).sum(axis=-2)  # (..., T, Hk, dk): the r copies' gradients summed
    dk_ = dk_.reshape(batch + (T, hk, r, dk)).sum(axis=-2)
    # 3. beta = sigmoid(b), g = -A softplus(a + dt_bias)
    db = dbeta * cache.beta * (1.0 - cache.beta)
    d_softplus = np.where(cache.a_plus > SOFTPLUS_THRESHOLD, 1.0, _sigmoid(cache.a_plus))
    da = -dg * cache.A * d_softplus  # (..., T, Hv)
    g["dt_bias"] = da.reshape(-1, hv).sum(axis=0)
    g["A_log"] = -(dg * cache.softplus).reshape(-1, hv).sum(axis=0) * cache.A
    # 2. the convolution
    dmixed = np.concatenate([dq.reshape(batch + (T, hk * dk)), dk_.reshape(batch + (T, hk * dk)),
                             dv_.reshape(batch + (T, hv * dv))], axis=-1)
    dmixed, g["conv1d.weight"], _, _ = causal_conv1d_backward(dmixed, cache.conv)
    dq = dmixed[..., :hk * dk].reshape(batch + (T, hk, dk))
    dk_ = dmixed[..., hk * dk:2 * hk * dk].reshape(batch + (T, hk, dk))
    dv_ = dmixed[..., 2 * hk * dk:].reshape(batch + (T, hk, r * dv))
    # 1. the projections, in the group layout
    dP = np.concatenate([dq, dk_, dv_, dz.reshape(batch + (T, hk, r * dv))], axis=-1).reshape(batch + (T, -1))
    dR = np.concatenate([db.reshape(batch + (T, hk, r)), da.reshape(batch + (T, hk, r))], axis=-1)
    dx1, g["in_proj_qkvz.W"], _ = linear_backward_formula(dP, cache.qkvz)
    dx2, g["in_proj_ba.W"], _ = linear_backward_formula(dR.reshape(batch + (T, -1)), cache.ba)
    return dx1 + dx2, g
