"""Position-wise feed-forward network ``FFN(x) = act(x W_1 + b_1) W_2 + b_2``, and its backward.

The second sub-layer of every Transformer block: the same two-layer network applied to
each position on its own (no mixing across positions; that is attention's job).

Activations:

* ``"relu"``: ``max(0, h)``; its derivative at exactly 0 is taken as 0.
* ``"gelu"``: the **tanh approximation** of GELU used by GPT-2 and BERT's original code
  (PyTorch's ``gelu(approximate="tanh")``),
  ``gelu(h) = 0.5 h (1 + tanh(s (h + c h^3)))``, ``s = sqrt(2 / pi)``, ``c = 0.044715``.
* ``"gelu_exact"``: the exact form ``h Phi(h)``, ``Phi(h) = (1 + erf(h / sqrt(2))) / 2``
  (PyTorch's default ``gelu``, BERT's ``hidden_act="gelu"``), with the vectorised ``erf``
  of :mod:`attention_ref.nn.erf`. The two forms differ by less than 1e-3 everywhere.

Symbols: ``...`` any leading (batch, position) axes, D model width, F hidden width (d_ff).

Forward, numbered so the backward can walk it in reverse:

1. ``h = x W_1 + b_1``
2. ``a = act(h)``
3. ``y = a W_2 + b_2``
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from functools import partial
from typing import NamedTuple

import numpy as np

from .._checks import as_real_array, as_upstream, common_dtype, signals_land_here
from .._pair_checks import check_linear_inputs
from ..core.linear import LinearCache
from ..fast.dispatch import linear_backward_formula, linear_formula
from .erf import erf

__all__ = [
    "ACTIVATIONS",
    "FFN_PARAM_NAMES",
    "FeedForwardCache",
    "GeluCache",
    "feed_forward_forward",
    "feed_forward_backward",
    "gelu_forward",
    "gelu_backward",
    "relu_forward",
    "relu_backward",
]

ACTIVATIONS = ("relu", "gelu", "gelu_exact")
GELU_APPROXIMATIONS = ("tanh", "none")
FFN_PARAM_NAMES = ("W_1", "b_1", "W_2", "b_2")
_GELU_S = math.sqrt(2.0 / math.pi)  # s, a Python float so float32 stays float32
_GELU_C = 0.044715  # c
#: Beyond |h| = 10 the tanh is exactly +-1 in float32 and float64 (its argument exceeds 43),
#: so h is clipped there inside the tanh: the cube of a huge h (|h| > ~7e12 in float32)
#: would overflow, and its square in the backward would give inf * 0 = NaN.
_GELU_SATURATION = 10.0
_INV_SQRT2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_EXP_UNDERFLOW = 1500.0  # h^2 clipped there: exp(-750) is 0 already, and h * h may overflow


def _gelu_tanh(h, s=_GELU_S):
    """``t = tanh(s (u + c u^3))`` with ``u = clip(h, -10, 10)``: the same t, no overflow (two new arrays)."""
    u = np.clip(h, -_GELU_SATURATION, _GELU_SATURATION)
    t = np.asarray(u * u)
    t *= u
    t *= _GELU_C
    t += u  # u + c u^3
    t *= s
    return np.tanh(t, out=t)


def _gelu_from_tanh(h, t):
    """``0.5 h (1 + t)`` in one new array (a NumPy scalar for a 0-d ``h``, as the exact form gives)."""
    a = np.asarray(t + 1.0)
    a *= 0.5  # exact, and before h: a huge h doubled would overflow
    a *= h
    return a if a.ndim else a[()]


def _gelu_tanh_backward(da, h, t, s=_GELU_S):
    """``da * (0.5 (1 + t) + 0.5 h (1 - t^2) s (1 + 3 c u^2))``, ``u = clip(h, -10, 10)``, ``t`` the
    forward's tanh: two new arrays (a NumPy scalar for a 0-d ``h``)."""
    dt_dh = np.asarray(np.clip(h, -_GELU_SATURATION, _GELU_SATURATION))  # u
    np.multiply(dt_dh, dt_dh, out=dt_dh)  # u^2 <= 100: no overflow
    dt_dh *= 3.0 * _GELU_C
    dt_dh += 1.0
    dt_dh *= s
    one_minus_t2 = np.asarray(t * t)
    np.subtract(1.0, one_minus_t2, out=one_minus_t2)
    dt_dh *= one_minus_t2  # (1 - t^2) s (1 + 3 c u^2): exactly 0 where |h| >= 10
    dgelu = dt_dh
    dgelu *= h
    dgelu *= 0.5  # 0.5 h dt/dh
    half_one_plus_t = np.add(t, 1.0, out=one_minus_t2)
    half_one_plus_t *= 0.5
    dgelu += half_one_plus_t  # gelu'(h)
    if dgelu.dtype == np.result_type(da, dgelu) and np.shape(da) == dgelu.shape:
        dgelu *= da
        return dgelu if dgelu.ndim else dgelu[()]
    return da * dgelu  # a wider dtype or a broadcast da: a new array, as da * gelu'(h) gives


#: BLOOM's ``bloom_gelu_forward`` writes ``s = sqrt(2 / pi)`` to eight digits, 0.79788456 (8e-10 below
#: it): at 1e-10 against transformers' BLOOM its MLP needs the same constant ("gelu_bloom")
_BLOOM_GELU_S = 0.79788456


def relu_forward(h):
    """``max(0, h)``; returns ``(a, cache)`` where the cache is ``h``."""
    return relu_formula(as_real_array(h, "h"))


def relu_formula(h):
    """Unchecked ``max(0, h)``; returns ``(a, h)``."""
    return np.maximum(h, 0.0), h


def relu_backward(da, h):
    """``dh = da * [h > 0]`` (derivative 0 at h = 0); ``da`` shaped like ``h``."""
    return relu_backward_formula(as_upstream(da, h.shape, h.dtype, "da"), h)


def relu_backward_formula(da, h):
    """Unchecked ``da * [h > 0]``."""
    return np.where(h > 0, da, 0.0).astype(h.dtype, copy=False)


class GeluCache(NamedTuple):
    """What ``gelu_backward`` needs: the input, which form of GELU was applied and the forward's
    ``Phi(h)`` (exact form) or ``t = tanh(s (h + c h^3))`` (tanh form), so the backward computes no
    second ``erf`` or ``tanh``."""

    h: np.ndarray
    approximate: str  # "tanh" or "none" (exact)
    Phi: np.ndarray | None = None  # shaped like h: (1 + erf(h / sqrt(2))) / 2 of the exact form, else None
    t: np.ndarray | None = None  # shaped like h: the tanh form's t, else None


def gelu_forward(h, approximate="tanh"):
    """GELU of ``h``: ``approximate="tanh"`` (the default, GPT-2's) gives
    ``0.5 h (1 + tanh(s (h + c h^3)))``; ``approximate="none"`` the exact ``h Phi(h)`` with
    ``Phi(h) = (1 + erf(h / sqrt(2))) / 2``. Returns ``(a, GeluCache)``."""
    h = as_real_array(h, "h")
    if approximate not in GELU_APPROXIMATIONS:
        raise ValueError(f"approximate must be one of {GELU_APPROXIMATIONS}, got {approximate!r}")
    return gelu_formula(h, approximate)


def gelu_formula(h, approximate="tanh"):
    """Unchecked :func:`gelu_forward` (``approximate`` is ``"tanh"`` or ``"none"``): ``(a, GeluCache)``."""
    if approximate == "none":
        a, Phi = _gelu_exact(h)
        return a, GeluCache(h, "none", Phi)
    a, t = _gelu_tanh_act(h)
    return a, GeluCache(h, "tanh", t=t)


def _gelu_tanh_act(h, s=_GELU_S):
    """Unchecked tanh GELU ``0.5 h (1 + tanh(s (h + c h^3)))``: ``(a, t)``, the backward reuses ``t``."""
    t = _gelu_tanh(h, s)
    return _gelu_from_tanh(h, t), t


def _gelu_exact(h):
    """Unchecked ``(h Phi(h), Phi(h))``: the backward reuses ``Phi(h)``."""
    Phi = 0.5 * (1.0 + erf(h * _INV_SQRT2))
    return h * Phi, Phi


def gelu_backward(da, cache):
    """Gradient of :func:`gelu_forward`; ``da`` shaped like ``h``.

    tanh form: ``dh = da * (0.5 (1 + t) + 0.5 h (1 - t^2) s (1 + 3 c h^2))``, ``t`` as in the
    forward; exact form: ``dh = da * (Phi(h) + h phi(h))``, ``phi(h) = exp(-h^2 / 2) / sqrt(2 pi)``.
    ``cache`` is the forward's GeluCache (a bare ``h`` array means the tanh form, as before).
    """
    h = cache.h if isinstance(cache, GeluCache) else cache
    da = as_upstream(da, h.shape, h.dtype, "da")  # a float64 da keeps float32 float32
    if isinstance(cache, GeluCache) and cache.approximate == "none":
        return _gelu_exact_backward(da, h, cache.Phi)
    return gelu_backward_formula(da, h, cache.t if isinstance(cache, GeluCache) else None)


def gelu_backward_formula(da, h, t=None, s=_GELU_S):
    """Unchecked backward of the tanh form; ``t`` the forward's tanh (computed again when not given),
    ``s`` its constant (BLOOM's differs)."""
    if t is None:
        t = _gelu_tanh(h, s)
    return _gelu_tanh_backward(da, h, t, s)


#: BLOOM's tanh GELU, ``0.5 h (1 + tanh(0.79788456 (h + c h^3)))``, and its own derivative: ``(a, t)``,
#: and ``(da, h, t=None)`` -> dh
_gelu_bloom = partial(_gelu_tanh_act, s=_BLOOM_GELU_S)
_gelu_bloom_backward = partial(gelu_backward_formula, s=_BLOOM_GELU_S)


def _gelu_exact_backward(da, h, Phi=None):
    """Unchecked backward of the exact form: ``da * (Phi(h) + h phi(h))``, ``Phi`` the forward's
    (computed again only when not given)."""
    if Phi is None:
        Phi = 0.5 * (1.0 + erf(h * _INV_SQRT2))
    with np.errstate(under="ignore"):  # the density far out is 0, as it should be
        phi = np.exp(-0.5 * np.minimum(h * h, _EXP_UNDERFLOW)) * _INV_SQRT_2PI  # the normal density
        dh = da * (Phi + h * phi)
        signals_land_here()  # a Ctrl-C is raised inside the block (_pair_checks.py)
    return dh


def _relu_act(h):
    """Unchecked ``max(0, h)``: ``(a, None)``, the backward needs only ``h``."""
    return np.maximum(h, 0.0), None


def _relu_act_backward(da, h, _saved=None):
    """:func:`relu_backward_formula` with the activations' signature."""
    return relu_backward_formula(da, h)


#: name -> (unchecked forward h -> (a, saved), unchecked backward (da, h, saved)); ``saved`` is what the
#: backward reuses: None (ReLU), the tanh forms' ``t``, the exact form's ``Phi(h)``
_ACT = {"relu": (_relu_act, _relu_act_backward),
        "gelu": (_gelu_tanh_act, gelu_backward_formula),
        "gelu_exact": (_gelu_exact, _gelu_exact_backward),
        "gelu_bloom": (_gelu_bloom, _gelu_bloom_backward)}  # the blocks' only (BLOOM): not in ACTIVATIONS


class FeedForwardCache(NamedTuple):
    """Nested caches of the three forward steps."""

    fc1: LinearCache  # step 1
    h: np.ndarray  # (..., F), pre-activation, step 2
    fc2: LinearCache  # step 3
    activation: str
    param_keys: tuple
    Phi: np.ndarray | None = None  # (..., F), "gelu_exact": step 2's Phi(h), which the backward reuses
    t: np.ndarray | None = None  # (..., F), "gelu" and BLOOM's: step 2's tanh, which the backward reuses


def check_ffn_inputs(x, params, activation):
    """Validate ``params`` keys and shapes, and the activation name."""
    if activation not in _ACT:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    if not isinstance(params, Mapping):
        raise TypeError(f"params must be a dict with keys {FFN_PARAM_NAMES}, got {type(params).__name__}")
    unknown = sorted(set(params) - set(FFN_PARAM_NAMES))
    if unknown:
        raise ValueError(f"params has unknown keys {unknown}; allowed keys are {FFN_PARAM_NAMES}")
    missing = [n for n in ("W_1", "W_2") if params.get(n) is None]
    if missing:
        raise ValueError(f"params is missing the weights {missing}")
    x, W_1, b_1 = check_linear_inputs(x, params["W_1"], params.get("b_1"),
                                names=("x", "params['W_1']", "params['b_1']"))
    W_2 = as_real_array(params["W_2"], "params['W_2']")
    if W_2.ndim != 2 or W_2.shape[0] != W_1.shape[1]:
        raise ValueError(f"params['W_2'] must have shape (d_ff, d_out) with d_ff = {W_1.shape[1]}"
                         f" (the columns of params['W_1'] of shape {W_1.shape}), got {W_2.shape}")
    b_2 = params.get("b_2")
    if b_2 is not None:
        b_2 = as_real_array(b_2, "params['b_2']")
        if b_2.shape != (W_2.shape[1],):
            raise ValueError(f"params['b_2'] must have shape ({W_2.shape[1]},) to match params['W_2']"
                             f" of shape {W_2.shape}, got shape {b_2.shape}")
    dtype = common_dtype(x, W_1, b_1, W_2, b_2)
    return [None if a is None else a.astype(dtype, copy=False) for a in (x, W_1, b_1, W_2, b_2)]


def feed_forward_forward(x, params, activation="relu"):
    """Position-wise feed-forward network ``y = act(x W_1 + b_1) W_2 + b_2``, arguments
    ``(x, params, activation)``; ``W_1`` ``(d, f)`` and ``W_2`` ``(f, d)`` are ``(d_in, d_out)``,
    the transposes of torch's ``Linear.weight``.

    Parameters
    ----------
    x : array (..., d_model)
    params : dict with ``W_1 (d_model, d_ff)``, ``W_2 (d_ff, d_out)`` and optional biases
        ``b_1 (d_ff,)``, ``b_2 (d_out,)`` (absent or None for no bias)
    activation : ``"relu"`` (the original Transformer) or ``"gelu"`` (tanh approximation,
        GPT/BERT)

    Returns
    -------
    y : array (..., d_out)
    cache : FeedForwardCache for :func:`feed_forward_backward`
    """
    x, W_1, b_1, W_2, b_2 = check_ffn_inputs(x, params, activation)
    return feed_forward_formula(x, W_1, b_1, W_2, b_2, activation, tuple(params))


def feed_forward_formula(x, W_1, b_1, W_2, b_2, activation, param_keys=FFN_PARAM_NAMES):
    """:func:`feed_forward_forward` on checked inputs (the blocks and the decoding steps call it)."""
    activation_formula, _ = _ACT[activation]
    # 1. first linear map
    h = linear_formula(x, W_1, b_1, ("x", "W_1", "b_1"))  # (..., F)
    # 2. activation
    a, saved = activation_formula(h)  # (..., F)
    # 3. second linear map
    y = linear_formula(a, W_2, b_2, ("act(x W_1 + b_1)", "W_2", "b_2"))  # (..., Dout)
    exact = activation == "gelu_exact"
    cache = FeedForwardCache(LinearCache(x, W_1, b_1 is not None), h,
                             LinearCache(a, W_2, b_2 is not None), activation, tuple(param_keys),
                             saved if exact else None, None if exact else saved)
    return y, cache


def feed_forward_backward(dy, cache: FeedForwardCache):
    """Gradients of :func:`feed_forward_forward` (arguments ``dy, cache``), its steps in reverse:
    ``(dx, grads)``, weight gradients ``(d_in, d_out)`` like the weights.

    ``da = dy W_2^T``, ``dh = da * act'(h)``, ``dx = dh W_1^T``; the weight gradients are
    those of :func:`attention_ref.linear_backward`.

    Parameters
    ----------
    dy : array (..., d_out), upstream gradient
    cache : FeedForwardCache from the forward

    Returns
    -------
    dx : array (..., d_model)
    grads : dict with the keys of ``params`` (None for a bias given as None)
    """
    fc2 = cache.fc2
    return feed_forward_backward_formula(as_upstream(dy, fc2.x.shape[:-1] + (fc2.W.shape[1],), fc2.x.dtype, "dy"), cache)


def feed_forward_backward_formula(dy, cache: FeedForwardCache):
    """Unchecked backward, for the blocks (they check their own upstream gradient)."""
    fc2 = cache.fc2
    _, activation_backward_formula = _ACT[cache.activation]
    grads = {}
    # 3. y = a W_2 + b_2
    da, grads["W_2"], grads["b_2"] = linear_backward_formula(dy, fc2)  # (..., F)
    # 2. a = act(h)
    dh = activation_backward_formula(da, cache.h, cache.Phi if cache.activation == "gelu_exact" else cache.t)  # (..., F)
    # 1. h = x W_1 + b_1
    dx, grads["W_1"], grads["b_1"] = linear_backward_formula(dh, cache.fc1)  # (..., D)
    return dx, {n: grads[n] for n in cache.param_keys}
