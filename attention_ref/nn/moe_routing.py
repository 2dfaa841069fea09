"""The router of a mixture of experts: a routing description (data) and the router's pair.

Every token's router logits ``l = x W_router + b_router`` (E experts) choose ``k`` experts and
give them weights. Models differ only in how, so the difference is data, :class:`Routing`:

* ``order="topk_softmax"`` (gpt-oss): the ``k`` largest logits, then a softmax over those ``k``
  (the weights sum to 1);
* ``order="softmax_topk"`` (Mixtral, Qwen3-MoE): a softmax over all ``E`` logits, then the ``k``
  largest probabilities, divided by their sum when ``normalise`` (Qwen3-MoE's
  ``norm_topk_prob``; Mixtral always);
* ``order="sigmoid_topk"`` (DeepSeek-V3, Kimi K2): each expert's score ``s = sigmoid(l)`` on its
  own (no competition between experts); the choice reads ``c = s + choice_bias`` (transformers'
  ``e_score_correction_bias``, a buffer the training adjusts to balance the load: it moves the
  choice, never the weights); the ``E`` experts fall into ``n_group`` groups, a group's score is
  the sum of its two largest ``c``, the ``topk_group`` best groups are kept and the ``k`` largest
  ``c`` among their experts chosen; the weights are the chosen ``s``, divided by their sum (plus
  1e-20, as transformers) when ``normalise``, times ``scaling`` (``routed_scaling_factor``).

The choice of experts is discrete: the backward
holds it fixed, as autograd does (the ``k`` indices carry no gradient). Ties between logits are
broken towards the lower expert index (``torch.topk`` leaves the order of ties unspecified).

Symbols: T tokens (the batch axes flattened), D model width, E experts, k chosen per token.

Forward: 1. ``l = x W_router + b_router`` (T, E); 2. the indices ``idx`` (T, k) of the chosen
experts, largest first; 3. their weights ``w`` (T, k).

transformers 4.57's DeepSeek-V3 router sets the experts of the groups not kept to a choice score
of 0 (5.x: minus infinity, as here): the two agree whenever every kept expert's ``c`` is positive
(its ``s`` is in (0, 1); a correction bias below ``-s`` is needed to tell them apart).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._checks import as_real_array, as_upstream, check_positive_int, check_positive_real, signals_land_here
from .._pair_checks import check_linear_inputs
from ..core.linear import LinearCache
from ..fast.dispatch import linear_backward_formula, linear_formula

__all__ = ["ROUTING_ORDERS", "Routing", "RouterCache", "router_forward", "router_backward"]

#: when the softmax is taken: over the k chosen logits (gpt-oss) or over all E before choosing
ROUTING_ORDERS = ("topk_softmax", "softmax_topk", "sigmoid_topk")
#: what transformers adds to the sum of the chosen sigmoid scores before dividing by it (DeepSeek-V3)
SIGMOID_NORM_EPS = 1e-20


class Routing(NamedTuple):
    """How a router turns logits into ``k`` experts and their weights (see the module docstring)."""

    top_k: int  # experts per token (transformers' num_experts_per_tok)
    order: str = "topk_softmax"  # one of ROUTING_ORDERS
    normalise: bool = False  # softmax_topk, sigmoid_topk: divide the k weights by their sum
    n_group: int = 1  # sigmoid_topk: the experts' groups (transformers' n_group)
    topk_group: int = 1  # sigmoid_topk: the groups kept per token (topk_group)
    scaling: float = 1.0  # sigmoid_topk: the weights' factor (routed_scaling_factor)


class RouterCache(NamedTuple):
    """The router's product, the chosen indices and the probabilities the weights came from."""

    linear: LinearCache  # l = x W_router + b_router
    idx: np.ndarray  # (T, k) int, the chosen experts, largest logit first
    p: np.ndarray  # (T, k) topk_softmax: the weights; (T, E) softmax_topk: the softmax of all logits;
    #                (T, E) sigmoid_topk: the sigmoid scores
    routing: Routing


def check_routing(routing, num_experts):
    """A :class:`Routing` whose ``top_k`` is at most ``num_experts``; returns it."""
    if not isinstance(routing, Routing):
        raise TypeError(f"routing must be an attention_ref.nn.Routing, got {type(routing).__name__}")
    check_positive_int(routing.top_k, "routing.top_k")
    if routing.top_k > num_experts:
        raise ValueError(f"routing.top_k = {routing.top_k} is more than the {num_experts} experts")
    if routing.order not in ROUTING_ORDERS:
        raise ValueError(f"routing.order must be one of {ROUTING_ORDERS}, got {routing.order!r}")
    if routing.normalise and routing.order == "topk_softmax":
        raise ValueError("routing.normalise applies to order='softmax_topk' or 'sigmoid_topk' only (the k weights"
                         " of 'topk_softmax' already sum to 1)")
    if routing.order != "sigmoid_topk":
        if (routing.n_group, routing.topk_group, routing.scaling) != (1, 1, 1.0):
            raise ValueError("routing.n_group, routing.topk_group and routing.scaling apply to"
                             " order='sigmoid_topk' only")
        return routing
    groups = check_positive_int(routing.n_group, "routing.n_group")
    if num_experts % groups or num_experts // groups < 2:
        raise ValueError(f"routing.n_group = {groups} must divide the {num_experts} experts into groups of at"
                         " least 2 (a group's score is its two largest)")
    kept = check_positive_int(routing.topk_group, "routing.topk_group")
    if kept > groups or routing.top_k > kept * (num_experts // groups):
        raise ValueError(f"routing.topk_group = {kept} must be at most routing.n_group = {groups} and keep at"
                         f" least routing.top_k = {routing.top_k} experts")
    check_positive_real(routing.scaling, "routing.scaling")
    return routing


def _softmax_rows(a):
    """Row softmax with the row maximum subtracted (rows of finite logits)."""
    with np.errstate(over="ignore", under="ignore"):  # a difference past the range is -inf: exp gives 0
        e = np.exp(a - a.max(axis=-1, keepdims=True))
        signals_land_here()  # a Ctrl-C is raised inside the block (_pair_checks.py)
    return e / e.sum(axis=-1, keepdims=True)


def _softmax_rows_backward(dp, p):
    """``da = p * (dp - sum_j p_j dp_j)``, row by row."""
    return p * (dp - (p * dp).sum(axis=-1, keepdims=True))


def _top_k(a, k):
    """Indices of the k largest entries of each row, largest first, ties to the lower index."""
    return np.argsort(-a, axis=-1, kind="stable")[:, :k]  # (T, k)


def _sigmoid(a):
    """``1 / (1 + exp(-a))``, written with tanh so no exponential overflows."""
    return 0.5 * (1.0 + np.tanh(0.5 * a))


def _group_choice(c, routing):
    """``sigmoid_topk``'s step 2: the ``k`` largest choice scores ``c`` (T, E) among the experts of
    each token's ``topk_group`` best groups (a group's score: the sum of its two largest)."""
    T, E = c.shape
    grouped = c.reshape(T, routing.n_group, E // routing.n_group)  # (T, G, E/G)
    top2 = -np.sort(-grouped, axis=-1)[..., :2]  # (T, G, 2)
    kept = _top_k(top2.sum(axis=-1), routing.topk_group)  # (T, topk_group)
    keep = np.zeros((T, routing.n_group), bool)
    np.put_along_axis(keep, kept, True, axis=-1)
    masked = np.where(np.repeat(keep, E // routing.n_group, axis=-1), c, -np.inf)  # (T, E)
    return _top_k(masked, routing.top_k)  # (T, k)


def router_forward(x, W_router, b_router, routing: Routing, choice_bias=None):
    """The chosen experts and their weights for each token.

    Parameters
    ----------
    x : array (T, D), the tokens (flatten any batch axes first)
    W_router : array (D, E) (transformers' ``router.weight.T``)
    b_router : array (E,) (``router.bias``)
    routing : Routing
    choice_bias : None or array (E,), ``sigmoid_topk``'s correction bias (transformers'
        ``e_score_correction_bias``): added to the scores for the choice only (no gradient)

    Returns
    -------
    w : array (T, k), the weights of the chosen experts
    idx : int array (T, k), the chosen experts, largest logit first
    logits : array (T, E), the router logits ``x W_router + b_router``
    cache : RouterCache for :func:`router_backward`
    """
    x, W_router, b_router = check_linear_inputs(x, W_router, b_router, ("x", "W_router", "b_router"))
    if x.ndim != 2:
        raise ValueError(f"x must have shape (T, D), got {x.shape}")
    check_routing(routing, W_router.shape[1])
    choice_bias = check_choice_bias(choice_bias, routing, W_router.shape[1], x.dtype)
    return router_formula(x, W_router, b_router, routing, choice_bias)


def check_choice_bias(choice_bias, routing, num_experts, dtype):
    """None, or a real finite (E,) array in ``dtype`` when the routing is ``sigmoid_topk``."""
    if choice_bias is None:
        return None
    if routing.order != "sigmoid_topk":
        raise ValueError("choice_bias applies to routing.order='sigmoid_topk' only")
    choice_bias = as_real_array(choice_bias, "choice_bias")
    if choice_bias.shape != (num_experts,):
        raise ValueError(f"choice_bias must have shape ({num_experts},), got {choice_bias.shape}")
    return choice_bias.astype(dtype, copy=False)


def router_formula(x, W_router, b_router, routing, choice_bias=None):
    """:func:`router_forward` on checked inputs (the mixture of experts calls it)."""
    # 1. the logits
    logits = linear_formula(x, W_router, b_router, ("x", "W_router", "b_router"))  # (T, E)
    if routing.order == "topk_softmax":
        # 2. the k largest logits; 3. a softmax over those k
        idx = _top_k(logits, routing.top_k)  # (T, k)
        p = w = _softmax_rows(np.take_along_axis(logits, idx, axis=-1))  # (T, k)
    elif routing.order == "sigmoid_topk":
        # 2. each expert's score, the choice among the best groups on score + bias; 3. the chosen scores
        p = _sigmoid(logits)  # (T, E)
        idx = _group_choice(p if choice_bias is None else p + choice_bias, routing)  # (T, k)
        w = np.take_along_axis(p, idx, axis=-1)  # (T, k)
        if routing.normalise:
            w = w / (w.sum(axis=-1, keepdims=True) + SIGMOID_NORM_EPS)  # (T, k)
        w = w * routing.scaling
    else:
        # 2. a softmax over all E, its k largest; 3. optionally renormalised to sum to 1
        p = _softmax_rows(logits)  # (T, E)
        idx = _top_k(p, routing.top_k)  # (T, k)
        w = np.take_along_axis(p, idx, axis=-1)  # (T, k)
        if routing.normalise:
            w = w / w.sum(axis=-1, keepdims=True)  # (T, k)
    return w, idx, logits, RouterCache(LinearCache(x, W_router, True), idx, p, routing)


def router_backward(dw, cache: RouterCache):
    """Gradients of :func:`router_forward` with the chosen experts held fixed.

    3.-2. ``topk_softmax``: ``w = softmax(l[idx])`` gives ``dl[idx] = w * (dw - sum_j w_j dw_j)``
    and 0 at the experts not chosen. ``softmax_topk``: ``normalise`` (``w = q / sum q``, ``q =
    p[idx]``) gives ``dq = (dw - sum_j w_j dw_j) / sum q``; then ``dp`` is ``dq`` at ``idx`` and 0
    elsewhere, and ``dl = p * (dp - sum_e p_e dp_e)`` reaches every logit. ``sigmoid_topk``
    (``w = a q / (sum q + 1e-20)`` with ``a`` the scaling, or ``w = a q``): ``dq = a (dw - sum_j
    dw_j w_j / a) / (sum q + 1e-20)`` (or ``a dw``); ``ds`` is ``dq`` at ``idx`` and 0 elsewhere,
    ``dl = ds s (1 - s)``: only the chosen experts' logits get a gradient (the bias none).
    1. ``l = x W_router + b_router`` gives ``dx = dl W_router^T``, ``dW_router = x^T dl``,
    ``db_router = sum_t dl``.

    Parameters
    ----------
    dw : array (T, k), the gradient of the weights (the logits output gets none here)
    cache : RouterCache

    Returns
    -------
    dx : array (T, D)
    dW_router : array (D, E)
    db_router : array (E,)
    """
    linear, idx, p, routing = cache
    dw = as_upstream(dw, idx.shape, linear.x.dtype, "dw")
    dlogits = np.zeros(idx.shape[:1] + linear.W.shape[1:], linear.x.dtype)  # (T, E)
    if routing.order == "topk_softmax":
        np.put_along_axis(dlogits, idx, _softmax_rows_backward(dw, p), axis=-1)  # (T, E), 0 where not chosen
    elif routing.order == "sigmoid_topk":
        q = np.take_along_axis(p, idx, axis=-1)  # (T, k)
        dq = routing.scaling * dw  # (T, k)
        if routing.normalise:
            s = q.sum(axis=-1, keepdims=True) + SIGMOID_NORM_EPS  # (T, 1)
            dq = (dq - (dq * q).sum(axis=-1, keepdims=True) / s) / s
        np.put_along_axis(dlogits, idx, dq * q * (1.0 - q), axis=-1)  # (T, E), 0 where not chosen
    else:
        q = np.take_along_axis(p, idx, axis=-1)  # (T, k)
        if routing.normalise:
            s = q.sum(axis=-1, keepdims=True)  # (T, 1)
            dw = (dw - (q / s * dw).sum(axis=-1, keepdims=True)) / s  # (T, k), dq
        dp = np.zeros_like(dlogits)  # (T, E)
        np.put_along_axis(dp, idx, dw, axis=-1)
        dlogits = _softmax_rows_backward(dp, p)  # (T, E)
    return linear_backward_formula(dlogits, linear)  # dx (T, D), dW_router (D, E), db_router (E,)
