"""A mixture of experts as gpt-oss computes it (transformers' ``GptOssMLP``), and its backward.

A router (:mod:`attention_ref.nn.moe_routing`) sends each token to ``k`` of ``E`` experts with
weights; each expert is, as data (``expert=``), gpt-oss's clamped SwiGLU with biases
(:mod:`attention_ref.nn.clamped_swiglu`, gate and up columns interleaved) or a plain SwiGLU
(``"swiglu"``: Qwen3-Next's and Qwen3-MoE's ``silu(x W_gate + b_gate) * (x W_up + b_up)``, then
``W_down``, with the gate's F columns then the up's F columns in ``W_gate_up``; pass zero biases for
a model that has none);
the token's output is the weighted sum of its experts' outputs (Shazeer et al. 2017's sparsely
gated mixture of experts; each token pays for ``k`` experts, not ``E``).
Symbols: ``...`` batch axes, T tokens (flattened), D model width, E experts, F expert width, k.

1. ``w, idx = router(x)``                                      (T, k) each
2. ``y_e = expert_e(x_t)`` for the tokens ``t`` that chose ``e``   (T_e, D)
3. ``y_t = sum_j w_tj y_{idx_tj}(x_t)``                        (T, D)

The backward holds the choice ``idx`` fixed (autograd's rule: a discrete choice has no
gradient), so a token's gradient reaches only its ``k`` experts and, through ``w``, the router.

Qwen3-MoE and DeepSeek-V3 run the same three steps with plain SwiGLU experts without biases and a
router without a bias (:func:`swiglu_moe_forward`, :func:`swiglu_moe_backward`); their routings are
:class:`Routing` s too (``"softmax_topk"``, ``"sigmoid_topk"``).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._checks import as_real_array, as_upstream, check_positive_real, common_dtype, require_ndim
from ..core.linear import LinearCache
from ..fast.dispatch import linear_backward_formula, linear_formula
from .clamped_swiglu import (
    GPT_OSS_SWIGLU_ALPHA,
    GPT_OSS_SWIGLU_LIMIT,
    clamped_swiglu_backward_formula,
    clamped_swiglu_formula,
)
from .moe_routing import Routing, check_choice_bias, check_routing, router_backward, router_formula
from .swiglu import _sigmoid, swiglu_backward_formula, swiglu_formula

__all__ = ["MoECache", "moe_forward", "moe_backward", "EXPERT_KINDS", "SwiGLUMoECache", "swiglu_moe_forward",
           "swiglu_moe_backward"]

#: what each expert computes (``moe_forward``'s ``expert=``): gpt-oss's clamped SwiGLU (the default) or a plain SwiGLU
EXPERT_KINDS = ("clamped_swiglu", "swiglu")


class MoECache(NamedTuple):
    """The router's cache and, for each expert used, its tokens, their slots, its cache and output."""

    router: object  # RouterCache
    w: np.ndarray  # (T, k), the routing weights
    experts: tuple  # ((e, tokens (T_e,), slots (T_e,), ClampedSwiGLUCache, y_e (T_e, D)), ...)
    x_shape: tuple  # (..., D)
    num_experts: int
    expert_shapes: tuple  # shapes of W_gate_up, b_gate_up, W_down, b_down (E, ...)
    expert: str = "clamped_swiglu"  # one of EXPERT_KINDS


class _SwiGLUExpertCache(NamedTuple):
    """A plain SwiGLU expert's products and its gate's pre-activation and sigmoid."""

    gate_up: LinearCache  # x W_gate_up + b_gate_up, (T_e, 2F)
    down: LinearCache  # m W_down + b_down
    a: np.ndarray  # (T_e, F), the gate's pre-activation
    sig: np.ndarray  # (T_e, F), sigmoid(a)
    u: np.ndarray  # (T_e, F), the up projection


def _swiglu_expert_formula(x, W_gate_up, b_gate_up, W_down, b_down):
    """A plain SwiGLU expert with biases: 1. ``[a, u] = x W_gate_up + b_gate_up`` (gate's F columns, then up's);
    2. ``m = silu(a) u``; 3. ``y = m W_down + b_down``."""
    f = W_gate_up.shape[-1] // 2
    au = linear_formula(x, W_gate_up, b_gate_up)  # (T_e, 2F)
    a, u = au[..., :f], au[..., f:]
    sig = _sigmoid(a)
    m = a * sig * u  # (T_e, F)
    y = linear_formula(m, W_down, b_down)  # (T_e, D)
    return y, _SwiGLUExpertCache(LinearCache(x, W_gate_up, True), LinearCache(m, W_down, True), a, sig, u)


def _swiglu_expert_backward(dy, cache: _SwiGLUExpertCache):
    """3. ``dm = dy W_down^T``; 2. ``du = dm silu(a)``, ``da = dm u sig (1 + a (1 - sig))``; 1. the projection's
    backward with ``[da, du]``: ``(dx, dW_gate_up, db_gate_up, dW_down, db_down)``."""
    dm, dW_down, db_down = linear_backward_formula(dy, cache.down)
    a, sig, u = cache.a, cache.sig, cache.u
    dau = np.concatenate([dm * u * (sig * (1.0 + a * (1.0 - sig))), dm * (a * sig)], axis=-1)  # (T_e, 2F)
    dx, dW_gate_up, db_gate_up = linear_backward_formula(dau, cache.gate_up)
    return dx, dW_gate_up, db_gate_up, dW_down, db_down


#: each expert kind's (formula, backward): the formula takes one expert's weights (``W[e]`` of each of the
#: mixture's (E, ...) arrays, in their order) then the kind's constants; the backward returns ``dx`` then one
#: gradient per weight, in the same order. ``"swiglu_split"`` (:func:`swiglu_moe_forward`'s) is the plain SwiGLU
#: with its gate and up weights apart and no biases (:func:`attention_ref.nn.swiglu_formula`)
_EXPERTS = {"clamped_swiglu": (clamped_swiglu_formula, clamped_swiglu_backward_formula),
            "swiglu": (_swiglu_expert_formula, _swiglu_expert_backward),
            "swiglu_split": (swiglu_formula, swiglu_backward_formula)}


def _check_moe_inputs(x, W_router, b_router, W_gate_up, b_gate_up, W_down, b_down, routing, alpha, limit):
    """Real, finite arrays of matching shapes, in their common dtype, and a Routing."""
    names = ("x", "W_router", "b_router", "W_gate_up", "b_gate_up", "W_down", "b_down")
    arrays = [as_real_array(a, n) for a, n in zip((x, W_router, b_router, W_gate_up, b_gate_up, W_down, b_down),
                                                  names)]
    x, W_router, b_router, W_gate_up, b_gate_up, W_down, b_down = arrays
    require_ndim(x, "x", 1, "(..., D)")
    D = x.shape[-1]
    if W_gate_up.ndim != 3 or W_gate_up.shape[1] != D or W_gate_up.shape[2] % 2:
        raise ValueError(f"W_gate_up must have shape (E, D, 2F) with D = {D} (x's last axis), got {W_gate_up.shape}")
    E, _, F2 = W_gate_up.shape
    expected = {"W_router": (D, E), "b_router": (E,), "b_gate_up": (E, F2), "W_down": (E, F2 // 2, D),
                "b_down": (E, D)}
    for name, a in zip(names[1:], arrays[1:]):
        if name in expected and a.shape != expected[name]:
            raise ValueError(f"{name} must have shape {expected[name]} for {E} experts of width {F2 // 2} and"
                             f" D = {D}, got {a.shape}")
    check_routing(routing, E)
    alpha, limit = check_positive_real(alpha, "alpha"), check_positive_real(limit, "limit")
    dtype = common_dtype(*arrays)
    return [a.astype(dtype, copy=False) for a in arrays] + [routing, alpha, limit]


def moe_forward(x, W_router, b_router, W_gate_up, b_gate_up, W_down, b_down, routing: Routing,
                alpha=GPT_OSS_SWIGLU_ALPHA, limit=GPT_OSS_SWIGLU_LIMIT, expert="clamped_swiglu"):
    """gpt-oss's mixture of experts on the tokens ``x``.

    Parameters
    ----------
    x : array (..., D)
    W_router : array (D, E) (``router.weight.T``); b_router : array (E,) (``router.bias``)
    W_gate_up : array (E, D, 2F) (``experts.gate_up_proj``, gate and up columns interleaved);
        b_gate_up : array (E, 2F) (``experts.gate_up_proj_bias``)
    W_down : array (E, F, D) (``experts.down_proj``); b_down : array (E, D) (``experts.down_proj_bias``)
    routing : Routing (gpt-oss: ``Routing(num_experts_per_tok)``, softmax over the top k)
    alpha, limit : the experts' ``swiglu_alpha`` and ``swiglu_limit`` (clamped experts only)
    expert : one of :data:`EXPERT_KINDS`: ``"clamped_swiglu"`` (gpt-oss, interleaved gate/up columns) or
        ``"swiglu"`` (Qwen3-Next, Qwen3-MoE: the gate's F columns then the up's; ``router.weight.T`` with a zero
        ``b_router`` and zero expert biases for their bias-free layers)

    Returns
    -------
    y : array (..., D)
    cache : MoECache for :func:`moe_backward`
    """
    if expert not in EXPERT_KINDS:
        raise ValueError(f"expert must be one of {EXPERT_KINDS}, got {expert!r}")
    x, W_router, b_router, *weights, routing, alpha, limit = _check_moe_inputs(
        x, W_router, b_router, W_gate_up, b_gate_up, W_down, b_down, routing, alpha, limit)
    return moe_formula(x, W_router, b_router, tuple(weights), routing, expert,
                       constants=(alpha, limit) if expert == "clamped_swiglu" else ())


def moe_formula(x, W_router, b_router, weights, routing, expert="clamped_swiglu", choice_bias=None, constants=()):
    """:func:`moe_forward` on checked inputs: ``weights`` the experts' (E, ...) arrays in the order the
    kind's formula takes one expert's (``_EXPERTS``), ``constants`` its constants (gpt-oss's ``alpha``,
    ``limit``); ``choice_bias``: DeepSeek-V3's correction bias, which moves the choice of experts and
    never their weights (:func:`swiglu_moe_forward` passes it). Each expert reads its own weights in
    place (``W[e]``, a view): a step copies no expert's weights."""
    tokens = x.reshape(-1, x.shape[-1])  # (T, D)
    # 1. the router
    w, idx, _, router_cache = router_formula(tokens, W_router, b_router, routing, choice_bias)  # (T, k) each
    # 2.-3. each expert on its tokens, weighted and added up
    y = np.zeros_like(tokens)  # (T, D)
    expert_formula = _EXPERTS[expert][0]
    experts = []
    for e in np.unique(idx).tolist():  # the experts chosen, in order
        t, j = np.nonzero(idx == e)  # (T_e,) tokens that chose e, and in which slot
        y_e, cache_e = expert_formula(tokens[t], *(W[e] for W in weights), *constants)  # (T_e, D)
        np.add.at(y, t, w[t, j][:, None] * y_e)  # a token appears once per expert; add.at keeps it plain
        experts.append((e, t, j, cache_e, y_e))
    shapes = tuple(W.shape for W in weights)
    return y.reshape(x.shape), MoECache(router_cache, w, tuple(experts), x.shape, weights[0].shape[0], shapes,
                                        expert)


def moe_backward(dy, cache: MoECache):
    """Gradients of :func:`moe_forward`, its steps in reverse, the chosen experts held fixed.

    3. ``y_t = sum_j w_tj y_{idx_tj}`` gives ``dw_tj = dy_t . y_{idx_tj}`` and, to expert
       ``e = idx_tj``, the upstream gradient ``w_tj dy_t``
    2. each expert's backward (:func:`attention_ref.nn.clamped_swiglu_backward`, or the plain SwiGLU's) on its tokens:
       its weight gradients, and ``dx_t`` summed over the token's ``k`` experts
    1. the router's backward with ``dw`` (:func:`attention_ref.nn.router_backward`), added to ``dx``

    Returns
    -------
    dx : array (..., D)
    dW_router : array (D, E); db_router : array (E,)
    dW_gate_up : array (E, D, 2F); db_gate_up : array (E, 2F)
    dW_down : array (E, F, D); db_down : array (E, D)
    (an expert no token chose gets zero gradients)
    """
    router_cache, w, experts, x_shape, E, shapes, expert = cache
    expert_backward = _EXPERTS[expert][1]
    dtype = w.dtype
    dy = as_upstream(dy, x_shape, dtype, "dy").reshape(-1, x_shape[-1])  # (T, D)
    dx = np.zeros_like(dy)  # (T, D)
    dw = np.zeros_like(w)  # (T, k)
    dweights = [np.zeros(shape, dtype) for shape in shapes]  # one per expert weight array, in its order
    for e, t, j, cache_e, y_e in experts:
        # 3. the weighted sum
        dw[t, j] = (dy[t] * y_e).sum(axis=-1)  # (T_e,)
        # 2. the expert
        dx_e, *grads_e = expert_backward(w[t, j][:, None] * dy[t], cache_e)  # dx_e (T_e, D)
        for dW, grad in zip(dweights, grads_e):
            dW[e] = grad
        np.add.at(dx, t, dx_e)
    # 1. the router
    dx_router, dW_router, db_router = router_backward(dw, router_cache)  # (T, D), (D, E), (E,)
    return ((dx + dx_router).reshape(x_shape), dW_router, db_router, *dweights)


# ---- the same mixture with plain SwiGLU experts (Qwen3-MoE, DeepSeek-V3): the router and steps 1-3 as above ----

#: :func:`swiglu_moe_forward`'s cache: the one mixture's (:class:`MoECache`, expert ``"swiglu"``)
SwiGLUMoECache = MoECache


def swiglu_moe_forward(x, W_router, W_gate, W_up, W_down, routing: Routing, choice_bias=None):
    """A mixture of SwiGLU experts without biases (Qwen3-MoE's ``Qwen3MoeSparseMoeBlock``, DeepSeek-V3's
    routed experts), the same three steps as :func:`moe_forward` with expert ``e`` the SwiGLU
    ``(silu(x W_gate[e]) * (x W_up[e])) W_down[e]`` (:func:`attention_ref.nn.swiglu_forward`) and a
    router without a bias.

    Parameters
    ----------
    x : array (..., D)
    W_router : array (D, E) (``mlp.gate.weight.T``)
    W_gate, W_up : arrays (E, D, F) (each expert's ``gate_proj.weight.T``, ``up_proj.weight.T``)
    W_down : array (E, F, D) (``down_proj.weight.T``)
    routing : Routing (Qwen3-MoE: ``Routing(k, "softmax_topk", norm_topk_prob)``; DeepSeek-V3:
        ``Routing(k, "sigmoid_topk", norm_topk_prob, n_group, topk_group, routed_scaling_factor)``)
    choice_bias : None or array (E,), ``sigmoid_topk``'s ``e_score_correction_bias`` (choice only)

    Returns
    -------
    y : array (..., D)
    cache : SwiGLUMoECache for :func:`swiglu_moe_backward`
    """
    names = ("x", "W_router", "W_gate", "W_up", "W_down")
    arrays = [as_real_array(a, n) for a, n in zip((x, W_router, W_gate, W_up, W_down), names)]
    x, W_router, W_gate, W_up, W_down = arrays
    require_ndim(x, "x", 1, "(..., D)")
    D = x.shape[-1]
    if W_gate.ndim != 3 or W_gate.shape[1] != D:
        raise ValueError(f"W_gate must have shape (E, D, F) with D = {D} (x's last axis), got {W_gate.shape}")
    E, _, F = W_gate.shape
    expected = {"W_router": (D, E), "W_up": (E, D, F), "W_down": (E, F, D)}
    for name, a in zip(names[1:], arrays[1:]):
        if name in expected and a.shape != expected[name]:
            raise ValueError(f"{name} must have shape {expected[name]} for {E} experts of width {F} and D = {D},"
                             f" got {a.shape}")
    check_routing(routing, E)
    dtype = common_dtype(*arrays)
    choice_bias = check_choice_bias(choice_bias, routing, E, dtype)
    return swiglu_moe_formula(*[a.astype(dtype, copy=False) for a in arrays], routing, choice_bias)


def swiglu_moe_formula(x, W_router, W_gate, W_up, W_down, routing, choice_bias=None):
    """:func:`swiglu_moe_forward` on checked inputs (the blocks call it): the one mixture
    (:func:`moe_formula`) with expert ``"swiglu_split"`` (each expert's ``W_gate[e]``, ``W_up[e]``,
    ``W_down[e]`` read where they lie) and the router's bias 0."""
    return moe_formula(x, W_router, np.zeros(W_gate.shape[0], x.dtype), (W_gate, W_up, W_down), routing,
                       expert="swiglu_split", choice_bias=choice_bias)


def swiglu_moe_backward(dy, cache: SwiGLUMoECache):
    """Gradients of :func:`swiglu_moe_forward`, the chosen experts held fixed: :func:`moe_backward`'s
    three steps with each expert's SwiGLU backward (:func:`attention_ref.nn.swiglu_backward`).

    Returns
    -------
    dx : array (..., D)
    dW_router : array (D, E)
    dW_gate, dW_up : arrays (E, D, F); dW_down : array (E, F, D) (zero for an expert no token chose)
    """
    dx, dW_router, _, dW_gate, dW_up, dW_down = moe_backward(dy, cache)  # the router's bias is not a parameter here
    return dx, dW_router, dW_gate, dW_up, dW_down
