"""The arguments of each core pair, checked before any arithmetic; overflow named after it.

Every public function of ``core/`` (and the same functions of ``fast/``) opens with one line
that calls a check of this module, so a core file reads as its formulas: linear
(:func:`check_linear_inputs`), softmax (:func:`check_softmax_inputs`), scaled dot-product
attention (:func:`check_attention_inputs`, :func:`check_scale`) and multi-head attention
(:func:`check_multi_head_inputs`). The generic rules (real arrays, the dtype policy, masks,
upstream gradients) are in :mod:`attention_ref._checks`.

Results too large for the dtype are named *after* the formulas, by
:func:`check_scores_finite` and :func:`check_result_finite`: the reference computes under
``np.errstate`` that keeps NumPy quiet, then one of these raises ``FloatingPointError``
naming the inputs. They are called as the last line *inside* the ``np.errstate`` block, and
every such block of the package ends with a Python call (``_checks.signals_land_here`` where
there is no check): NumPy's operators look for a Ctrl-C only at the next Python call, and if
that were ``np.errstate``'s own exit, the KeyboardInterrupt would be raised before the exit
restores NumPy's error settings, leaving overflow warnings off for the rest of the process
(``tests/test_faults.py``).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

from ._checks import (
    all_finite,
    as_gradient,
    as_mask,
    as_real_array,
    broadcast_batch,
    cast,
    cast_mask,
    check_float_dtype,
    check_mask_shape,
    check_positive_int,
    check_positive_real,
    common_dtype,
    overflow_error,
    require_ndim,
)

__all__ = []  # private module

#: The keys a multi-head ``params`` dict may hold; the biases are optional (absent or None).
PARAM_NAMES = ("W_q", "b_q", "W_k", "b_k", "W_v", "b_v", "W_o", "b_o")
_WEIGHTS = ("W_q", "W_k", "W_v", "W_o")


# ------------------------------------------------------------------------------ linear
# ------------------------------------------------------------------------------ masks
def check_padding_lengths(lengths, n):
    """``padding_mask``'s inputs: integer lengths in [0, n], n a positive int."""
    n = check_positive_int(n, "n")
    lengths = np.asarray(lengths)
    if lengths.dtype.kind not in "iu":
        raise TypeError(f"lengths must be integers, got dtype {lengths.dtype}")
    if lengths.size and (lengths.min() < 0 or lengths.max() > n):
        raise ValueError(f"lengths must lie in [0, {n}], got {lengths.tolist()}")
    return lengths, n


def check_boolean_mask(mask, dtype):
    """``mask_to_additive``'s inputs: a boolean mask and a float dtype."""
    mask = np.asarray(mask)
    if mask.dtype.kind != "b":
        raise TypeError(f"mask must be boolean, got dtype {mask.dtype}")
    return mask, check_float_dtype(dtype)


def check_linear_inputs(x, W, b, names=("x", "W", "b")):
    """Validate and cast ``x, W, b`` to their common dtype; one line per rule."""
    x_name, W_name, b_name = names
    x = as_real_array(x, x_name)
    W = as_real_array(W, W_name)
    b = None if b is None else as_real_array(b, b_name)
    require_ndim(x, x_name, 1, "(..., d_in)")
    if W.ndim != 2:
        raise ValueError(f"{W_name} must have shape (d_in, d_out), got shape {W.shape}")
    if x.shape[-1] != W.shape[0]:
        raise ValueError(
            f"{x_name} of shape {x.shape} has last dimension {x.shape[-1]}, but {W_name} of"
            f" shape {W.shape} expects d_in = {W.shape[0]}"
        )
    if b is not None and b.shape != (W.shape[1],):
        raise ValueError(
            f"{b_name} must have shape ({W.shape[1]},) to match {W_name} of shape {W.shape},"
            f" got shape {b.shape}"
        )
    dtype = common_dtype(x, W, b)
    return cast(x, dtype), cast(W, dtype), cast(b, dtype)


def check_result_finite(y, x, W, b, names=("x", "W", "b")) -> None:
    """Raise ``FloatingPointError`` naming ``x, W, b`` when ``y = x W + b`` overflowed."""
    if all_finite(y):
        return
    x_name, W_name, b_name = names
    inputs = [(x_name, x), (W_name, W)] + ([] if b is None else [(b_name, b)])
    what = f"{x_name} {W_name}" + ("" if b is None else f" + {b_name}")
    raise overflow_error(what, y.dtype, inputs)


# ----------------------------------------------------------------------------- softmax
def check_softmax_inputs(x, axis):
    """``x`` as a real array with at least one axis (``-inf`` allowed) and ``axis`` normalised."""
    x = as_real_array(x, "x", allow_neg_inf=True)
    if x.ndim == 0:
        raise ValueError("x must have at least one axis, got a scalar")
    if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"axis must be an integer, got {axis!r}")
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"axis {axis} is out of range for an input with {x.ndim} axes")
    return x, int(axis) % x.ndim


# ------------------------------------------------------------------------------- heads
def _numeric(x, name: str) -> np.ndarray:
    """``x`` as an array of numbers, or ``TypeError``."""
    x = np.asarray(x)
    if x.dtype.kind not in ("f", "i", "u"):  # float, signed or unsigned integer
        raise TypeError(f"{name} must hold real numbers, got dtype {x.dtype}")
    return x


def check_split_heads_inputs(x, num_heads, name: str = "x", *, gradient: bool = False):
    """``x`` (..., n, num_heads * d_head) and ``num_heads``, checked; a gradient is also
    checked like every upstream gradient (real, finite)."""
    num_heads = check_positive_int(num_heads, "num_heads")
    x = as_gradient(x, name) if gradient else _numeric(x, name)
    if gradient and (x.ndim < 2 or x.shape[-1] % num_heads):
        raise ValueError(f"{name} must have shape (..., n, num_heads * d_head) with num_heads={num_heads},"
                         f" got shape {x.shape}")
    if x.ndim < 2:
        raise ValueError(f"{name} must have shape (..., n, num_heads * d_head), got shape {x.shape}")
    if x.shape[-1] % num_heads:
        raise ValueError(f"the last dimension of {name} (shape {x.shape}) is not divisible by num_heads={num_heads}")
    return x, num_heads


def check_merge_heads_input(x, name: str = "x", *, gradient: bool = False) -> np.ndarray:
    """``x`` (..., num_heads, n, d_head), checked; a gradient also as every upstream gradient."""
    x = as_gradient(x, name) if gradient else _numeric(x, name)
    if x.ndim < 3:
        raise ValueError(f"{name} must have shape (..., num_heads, n, d_head), got shape {x.shape}")
    return x


# --------------------------------------------------------------------------- attention
def check_scale(scale):
    """``None`` (the default ``1/sqrt(d_k)``) or a positive finite real number, as a float."""
    return None if scale is None else check_positive_real(scale, "scale", "a positive real number or None")


def check_attention_inputs(q, k, v, mask, names=("q", "k", "v")):
    """Validate q, k, v and mask; return them cast to one dtype plus the scores' shape."""
    q_name, k_name, v_name = names
    q = as_real_array(q, q_name)
    k = as_real_array(k, k_name)
    v = as_real_array(v, v_name)
    require_ndim(q, q_name, 2, "(..., n_q, d_k)")
    require_ndim(k, k_name, 2, "(..., n_k, d_k)")
    require_ndim(v, v_name, 2, "(..., n_k, d_v)")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"{q_name} and {k_name} must share their last dimension d_k: {q_name} has shape"
            f" {q.shape}, {k_name} has shape {k.shape}"
        )
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(
            f"{k_name} and {v_name} must have the same length n_k (axis -2): {k_name} has"
            f" shape {k.shape}, {v_name} has shape {v.shape}"
        )
    if q.shape[-1] == 0:
        raise ValueError(f"d_k must be positive: {q_name} has shape {q.shape}")
    batch = broadcast_batch(
        [(q_name, q.shape[:-2]), (k_name, k.shape[:-2]), (v_name, v.shape[:-2])],
        what="batch dimensions (all but the last two axes)",
    )
    scores_shape = batch + (q.shape[-2], k.shape[-2])
    mask = as_mask(mask)
    check_mask_shape(mask, scores_shape)
    dtype = common_dtype(q, k, v)
    return cast(q, dtype), cast(k, dtype), cast(v, dtype), cast_mask(mask, dtype), scores_shape


def check_scores_finite(scores, masked, mask, q, k, names=("q", "k")) -> None:
    """After the attention's formulas: raise ``FloatingPointError`` naming ``q`` and ``k``
    when the scores ``q k^T / sqrt(d_k)`` overflowed, or when adding a float mask did."""
    if not all_finite(scores):
        raise overflow_error("the attention scores q k^T / sqrt(d_k)", q.dtype, zip(names, (q, k)))
    if masked is not scores and np.isposinf(masked).any():  # finite scores: a huge positive float mask
        what = f"the scores q k^T / sqrt(d_k) + mask (largest mask value {mask.max():.3g})"
        raise overflow_error(what, q.dtype, zip(names, (q, k)))


# -------------------------------------------------------------------------- multi-head
def _check_params(params, num_heads, num_kv_heads, dims):
    """Validate the parameter dict against the head counts and input widths."""
    if not isinstance(params, Mapping):
        raise TypeError(f"params must be a dict with keys {PARAM_NAMES}, got {type(params).__name__}")
    unknown = sorted(set(params) - set(PARAM_NAMES))
    if unknown:
        raise ValueError(f"params has unknown keys {unknown}; allowed keys are {PARAM_NAMES}")
    missing = [n for n in _WEIGHTS if params.get(n) is None]
    if missing:
        raise ValueError(f"params is missing the weights {missing}")
    p = {n: as_real_array(params[n], f"params['{n}']") for n in PARAM_NAMES if params.get(n) is not None}
    for n in _WEIGHTS:
        if p[n].ndim != 2:
            raise ValueError(f"params['{n}'] must be a 2-D matrix, got shape {p[n].shape}")
    shapes = {n: a.shape for n, a in p.items()}

    def fail(msg):
        raise ValueError(f"{msg}; parameter shapes: {shapes}")

    h, hkv = num_heads, num_kv_heads
    width_q, width_k, width_v = p["W_q"].shape[1], p["W_k"].shape[1], p["W_v"].shape[1]
    if width_q % h:
        fail(f"params['W_q'] has {width_q} columns, not divisible by num_heads={h}")
    d_k = width_q // h
    if d_k == 0:
        fail("params['W_q'] has no columns (d_k = 0)")
    if width_k != hkv * d_k:
        fail(f"params['W_k'] must have num_kv_heads*d_k = {hkv}*{d_k} = {hkv * d_k} columns"
             f" to match params['W_q'], got {width_k}")
    if width_v % hkv:
        fail(f"params['W_v'] has {width_v} columns, not divisible by num_kv_heads={hkv}")
    d_v = width_v // hkv
    if p["W_o"].shape[0] != h * d_v:
        fail(f"params['W_o'] must have num_heads*d_v = {h}*{d_v} = {h * d_v} rows, got {p['W_o'].shape[0]}")
    for w_name, x_name in zip(("W_q", "W_k", "W_v"), ("query", "key", "value")):
        if p[w_name].shape[0] != dims[x_name][-1]:
            raise ValueError(
                f"{x_name} of shape {dims[x_name]} has last dimension {dims[x_name][-1]}, but"
                f" params['{w_name}'] of shape {shapes[w_name]} expects {p[w_name].shape[0]}"
            )
    for b_name, w_name in zip(("b_q", "b_k", "b_v", "b_o"), _WEIGHTS):
        if b_name in p and p[b_name].shape != (p[w_name].shape[1],):
            fail(f"params['{b_name}'] must have shape ({p[w_name].shape[1]},) to match"
                 f" params['{w_name}'], got {p[b_name].shape}")
    return p


class MultiHeadInputs(NamedTuple):
    """The arguments of multi-head attention, checked: arrays in their common dtype, ``params``
    holding only the parameters present (biases may be absent). What the formulas take."""

    query: np.ndarray  # (..., Nq, D)
    key: np.ndarray  # (..., Nk, Dk_in)
    value: np.ndarray  # (..., Nk, Dv_in)
    params: dict  # W_q, W_k, W_v, W_o and the biases present
    mask: np.ndarray | None  # broadcastable to (..., Nq, Nk), boolean or in the dtype
    head_mask: np.ndarray | None  # (H,)
    num_heads: int  # H
    num_kv_heads: int  # Hkv, dividing H


def check_multi_head_inputs(query, key, value, params, num_heads, mask=None,
                            num_kv_heads=None, head_mask=None, *, warn_mask=True):
    """Validate every argument of the multi-head forward before any arithmetic.

    Returns a :class:`MultiHeadInputs` ``(query, key, value, params, mask, head_mask, num_heads,
    num_kv_heads)`` with arrays cast to their common dtype; ``params`` holds only the parameters
    that are present.
    ``warn_mask=False`` skips the 0/1 float mask warning (for a caller that gave it).
    """
    num_heads = check_positive_int(num_heads, "num_heads")
    num_kv_heads = num_heads if num_kv_heads is None else check_positive_int(num_kv_heads, "num_kv_heads")
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads={num_heads} must be a multiple of num_kv_heads={num_kv_heads}")
    query = as_real_array(query, "query")
    key = as_real_array(key, "key")
    value = as_real_array(value, "value")
    require_ndim(query, "query", 2, "(..., n_q, d_model)")
    require_ndim(key, "key", 2, "(..., n_k, d_key_in)")
    require_ndim(value, "value", 2, "(..., n_k, d_value_in)")
    if key.shape[-2] != value.shape[-2]:
        raise ValueError(f"key and value must have the same length n_k (axis -2): key has shape"
                         f" {key.shape}, value has shape {value.shape}")
    dims = {"query": query.shape, "key": key.shape, "value": value.shape}
    p = _check_params(params, num_heads, num_kv_heads, dims)
    batch = broadcast_batch([(n, s[:-2]) for n, s in dims.items()],
                            what="batch dimensions of query, key and value")
    mask = as_mask(mask, warn=warn_mask)
    check_mask_shape(mask, batch + (query.shape[-2], key.shape[-2]))
    if head_mask is not None:
        head_mask = as_real_array(head_mask, "head_mask")
        if head_mask.shape != (num_heads,):
            raise ValueError(f"head_mask must have shape (num_heads,) = ({num_heads},), got {head_mask.shape}")
    dtype = common_dtype(query, key, value, *p.values())  # head_mask follows, never leads
    p = {n: cast(a, dtype) for n, a in p.items()}
    return MultiHeadInputs(cast(query, dtype), cast(key, dtype), cast(value, dtype), p, cast_mask(mask, dtype),
                           cast(head_mask, dtype), num_heads, num_kv_heads)
