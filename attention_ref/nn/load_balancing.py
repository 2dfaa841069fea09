"""The auxiliary load-balancing loss of a mixture of experts (Switch Transformer, Fedus et al. 2021,
eqs. 4-6; transformers' ``load_balancing_loss_func``), and its backward.

A router left alone sends most tokens to a few experts. The loss ``E sum_e f_e P_e`` is ``k`` when
the load and the probabilities are uniform and grows as both concentrate on the same experts: ``f_e`` is the fraction of the (token, slot)
choices that went to expert ``e`` and ``P_e`` the router's mean probability for ``e``. ``f`` is
a count (no gradient); ``P`` is differentiable, so the gradient lowers the probability of the
experts that are over-used. transformers adds ``router_aux_loss_coef`` (gpt-oss: 0.001) times it to
the language-modelling loss when ``output_router_logits=True`` and labels are given.
Symbols: R rows (every layer's tokens, layer after layer), E experts, k chosen per token.

1. ``p_r = softmax(l_r)``                               (R, E)
2. ``sel_r`` = the ``k`` largest of ``p_r``                  (R, k)
3. with the token weights ``m_r`` (1, or the attention mask: padding 0) and ``M = sum_r m_r``,
   ``f_e = sum_r m_r #{j : sel_rj = e} / M``, ``P_e = sum_r m_r p_re / M``
4. ``loss = E sum_e f_e P_e``

Which logits transformers passes depends on the release: 5.x records the router's logits;
4.57.1 records its first output, the top-k softmax weights scattered into (T, E) (zeros
elsewhere), and takes the softmax of those. This pair computes the formula on what it is given,
so it agrees with both when given what each release records.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._checks import as_real_array, as_upstream, check_positive_int, signals_land_here

__all__ = ["LoadBalancingCache", "load_balancing_loss_forward", "load_balancing_loss_backward"]


class LoadBalancingCache(NamedTuple):
    """The probabilities, the load fractions and the row weights."""

    p: np.ndarray  # (R, E), softmax of the logits
    f: np.ndarray  # (E,), fraction of the choices per expert (fixed: no gradient)
    m: np.ndarray  # (R, 1), each row's weight divided by M


def load_balancing_loss_forward(router_logits, top_k, attention_mask=None):
    """``E sum_e f_e P_e`` over every row of ``router_logits``.

    Parameters
    ----------
    router_logits : array (R, E), or (L, T, E), or a sequence of L arrays (T, E) (one per layer,
        as transformers' ``outputs.router_logits``); T = B S tokens
    top_k : int, experts per token (``num_experts_per_tok``)
    attention_mask : None or an array (B, S) of 0 and 1 (padding 0), repeated for each layer

    Returns
    -------
    loss : 0-d array, in the logits' dtype
    cache : LoadBalancingCache for :func:`load_balancing_loss_backward`
    """
    if isinstance(router_logits, (list, tuple)):
        if not router_logits:
            raise ValueError("router_logits must hold at least one layer's logits, got an empty sequence")
        router_logits = np.concatenate([as_real_array(a, "router_logits") for a in router_logits], axis=0)
    logits = as_real_array(router_logits, "router_logits")
    if logits.ndim < 2:
        raise ValueError(f"router_logits must have shape (R, E), got {logits.shape}")
    logits = logits.reshape(-1, logits.shape[-1])  # (R, E)
    R, E = logits.shape
    top_k = check_positive_int(top_k, "top_k")
    if top_k > E:
        raise ValueError(f"top_k = {top_k} is more than the {E} experts of router_logits {logits.shape}")
    if attention_mask is None:
        m = np.ones((R, 1), logits.dtype)  # (R, 1)
    else:
        mask = as_real_array(np.asarray(attention_mask, dtype=float), "attention_mask").ravel()  # (T,)
        if mask.size == 0 or R % mask.size or not np.isin(mask, (0.0, 1.0)).all() or not mask.any():
            raise ValueError(f"attention_mask must hold 0 and 1 (at least one 1) for a whole number of layers of"
                             f" {R} rows, got shape {np.shape(attention_mask)}")
        m = np.tile(mask, R // mask.size)[:, None].astype(logits.dtype)  # (R, 1), layer after layer
    m = m / m.sum()  # (R, 1)
    # 1. probabilities
    with np.errstate(over="ignore", under="ignore"):  # a difference past the range is -inf: exp gives 0
        e = np.exp(logits - logits.max(axis=-1, keepdims=True))  # (R, E)
        signals_land_here()  # a Ctrl-C is raised inside the block (_pair_checks.py)
    p = e / e.sum(axis=-1, keepdims=True)  # (R, E)
    # 2. the k most probable experts (ties to the lower index)
    sel = np.argsort(-p, axis=-1, kind="stable")[:, :top_k]  # (R, k)
    # 3. the load fractions (counts) and the mean probabilities
    counts = np.zeros((R, E), logits.dtype)  # (R, E)
    np.put_along_axis(counts, sel, 1.0, axis=-1)
    f = (m * counts).sum(axis=0)  # (E,)
    P = (m * p).sum(axis=0)  # (E,)
    # 4. the loss
    return np.asarray(E * (f * P).sum(), logits.dtype), LoadBalancingCache(p, f, m)


def load_balancing_loss_backward(dloss, cache: LoadBalancingCache):
    """Gradient of :func:`load_balancing_loss_forward` with the counts ``f`` held fixed.

    4.-3. ``loss = E sum_e f_e P_e`` and ``P_e = sum_r m_r p_re`` give ``dp_re = dloss E m_r f_e``.
    2. the choice of experts is discrete: no gradient.
    1. softmax: ``dl_r = p_r * (dp_r - sum_e p_re dp_re)``.

    Returns
    -------
    dlogits : array (R, E) (rows in the forward's order: layer after layer)
    """
    p, f, m = cache
    dloss = as_upstream(dloss, (), p.dtype, "dloss")
    dp = dloss * p.shape[1] * m * f  # (R, E)
    return p * (dp - (p * dp).sum(axis=-1, keepdims=True))  # (R, E)
