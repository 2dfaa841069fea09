"""The public pairs: validate once, then run the fast path where it pays and the reference
(``core/``) otherwise.

``attention_ref.scaled_dot_product_attention_forward``, ``linear_forward`` and their
backwards are these functions; ``multi_head_attention_forward`` (in
:mod:`attention_ref.variants.grouped_heads`, which adds grouped heads and a head mask) runs the
plain layer through ``plain_multi_head_formula`` here. The rule: a call runs on the
fast path when the largest array it makes has at least ``FAST_MIN_ELEMENTS`` numbers (the
attention probabilities ``(..., H, Nq, Nk)``; a linear map's output ``(..., Dout)``), and
on the reference below that, where the two cost about the same (``docs/performance.md``).
``attention_ref.core.<function>`` is always the reference, ``attention_ref.fast.<function>_fast``
always the fast path; both take the same arguments and make the same caches, so either
backward takes either forward's cache.

One switch runs everything on the reference, for stepping through the formulas in a
debugger, for teaching, or for bisecting a numerical question: :class:`reference_only`
(``attention_ref.reference_only()``), or the environment variable
``ATTENTION_REF_REFERENCE_ONLY=1`` when the package is imported.
"""
from __future__ import annotations

import math
import os

import numpy as np

from .._checks import as_upstream
from .._pair_checks import check_attention_inputs, check_linear_inputs, check_scale
from ..core import attention as core_attention
from ..core import linear as core_linear
from ..core import multi_head as core_multi_head
from ..core.attention import AttentionCache
from ..core.linear import LinearCache
from ..core.multi_head import MultiHeadCache
from . import attention as fast_attention
from . import linear as fast_linear
from . import multi_head as fast_multi_head
from .row_blocks import BLOCK_ELEMENTS

__all__ = [
    "FAST_MIN_ELEMENTS", "reference_only", "uses_fast_path",
    "linear_forward", "linear_backward",
    "scaled_dot_product_attention_forward", "scaled_dot_product_attention_backward",
]

#: Fewest numbers in a call's largest array for the fast path: the row blocks' size (2**18),
#: below which the fast path has nothing to cut into blocks and the two cost about the same.
FAST_MIN_ELEMENTS = BLOCK_ELEMENTS

_switch = {"reference_only": os.environ.get("ATTENTION_REF_REFERENCE_ONLY", "0") not in ("", "0")}


class reference_only:
    """Run every public pair on the reference (``core/``), whatever the size.

    ``attention_ref.reference_only()`` switches it on for the rest of the process,
    ``reference_only(False)`` back to the size rule, and ``with reference_only(): ...`` only
    inside the block (the previous setting comes back when it ends, an exception included).
    The setting is process-wide, like ``np.seterr``'s."""

    def __init__(self, on: bool = True):
        self._before = _switch["reference_only"]
        _switch["reference_only"] = bool(on)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        _switch["reference_only"] = self._before
        return False


def uses_fast_path(n_elements: int) -> bool:
    """Whether a call whose largest array has ``n_elements`` numbers runs on the fast path."""
    return not _switch["reference_only"] and n_elements >= FAST_MIN_ELEMENTS


def _probabilities(q_shape, k_shape, mask) -> int:
    """Numbers in the attention probabilities (..., Nq, Nk) of q, k and the mask."""
    return math.prod(np.broadcast_shapes(q_shape[:-2] + (q_shape[-2], k_shape[-2]), k_shape[:-2] + (1, 1),
                                         (1, 1) if mask is None else mask.shape))


# ------------------------------------------------------------------------------ linear
def linear_formula(x, W, b, names=("x", "W", "b")):
    """``y = x W + b`` on checked inputs, on the path the size rule picks."""
    path = fast_linear if uses_fast_path(math.prod(x.shape[:-1]) * W.shape[1]) else core_linear
    return path._linear_finite(x, W, b, names)


def linear_backward_formula(dy, cache: LinearCache):
    """The linear backward on a checked upstream gradient, on the path the size rule picks."""
    path = fast_linear if uses_fast_path(dy.size) else core_linear
    return path._linear_backward(dy, cache)


def linear_forward(x, W, b=None):
    """Affine map ``y = x W + b``, arguments ``(x, W, b)``; ``W`` is ``(d_in, d_out)``, the transpose
    of torch's ``Linear.weight`` (``(d_out, d_in)``): pass ``linear.weight.T``.

    Runs the fast path (attention_ref.fast) from FAST_MIN_ELEMENTS numbers in its largest array,
    the reference (attention_ref.core) below, or always with reference_only().

    Parameters
    ----------
    x : array (..., d_in)
    W : array (d_in, d_out)
    b : array (d_out,) or None

    Returns
    -------
    y : array (..., d_out)
    cache : LinearCache for :func:`linear_backward`

    Raises
    ------
    FloatingPointError : when ``x W + b`` overflows the dtype (names x, W, b and their sizes)
    """
    x, W, b = check_linear_inputs(x, W, b)
    return linear_formula(x, W, b), LinearCache(x, W, b is not None)


def linear_backward(dy, cache: LinearCache):
    """Gradients of ``y = x W + b`` (arguments ``dy, cache``): ``(dx, dW, db)``, ``dW`` ``(d_in, d_out)``
    like ``W`` (torch's ``weight.grad`` is its transpose).

    Runs the fast path (attention_ref.fast) from FAST_MIN_ELEMENTS numbers in its largest array,
    the reference (attention_ref.core) below, or always with reference_only().

    ``dx = dy W^T``, ``dW = sum over rows of x^T dy``, ``db = sum over rows of dy``.

    Parameters
    ----------
    dy : array (..., d_out), upstream gradient
    cache : LinearCache from :func:`linear_forward`

    Returns
    -------
    dx : array (..., d_in)
    dW : array (d_in, d_out)
    db : array (d_out,), or None when the forward had no bias
    """
    x, W, _ = cache
    return linear_backward_formula(as_upstream(dy, x.shape[:-1] + (W.shape[1],), x.dtype, "dy"), cache)


# --------------------------------------------------------------------------- attention
def attention_formula(q, k, v, mask, names=("q", "k"), scale=None):
    """Attention's forward on checked inputs, on the path the size rule picks."""
    path = fast_attention if uses_fast_path(_probabilities(q.shape, k.shape, mask)) else core_attention
    return path._attention_forward(q, k, v, mask, names, scale)


def attention_backward_formula(dout, cache: AttentionCache):
    """Attention's backward on a checked upstream gradient, on the path the size rule picks."""
    path = fast_attention if uses_fast_path(cache.weights.size) else core_attention
    return path._attention_backward(dout, cache)


def scaled_dot_product_attention_forward(q, k, v, mask=None, *, scale=None):
    """Scaled dot-product attention ``softmax(q k^T / sqrt(d_k) + mask) v``, arguments
    ``(q, k, v, mask)``; a boolean mask is True where a query may attend (as torch's
    ``scaled_dot_product_attention``), any number of leading axes (B, H, ...) broadcast.

    Runs the fast path (attention_ref.fast) from FAST_MIN_ELEMENTS numbers in its largest array,
    the reference (attention_ref.core) below, or always with reference_only().

    Parameters
    ----------
    q : array (..., n_q, d_k), queries
    k : array (..., n_k, d_k), keys
    v : array (..., n_k, d_v), values
    mask : None, bool array (True = may attend) or float array (added to the scaled
        scores), broadcastable to (..., n_q, n_k); see :mod:`attention_ref.core.masks`
    scale : the factor on ``q k^T``; None (default) is ``1 / sqrt(d_k)`` (GPT-2's
        ``scale_attn_weights=False`` is ``scale=1.0``)

    Returns
    -------
    out : array (..., n_q, d_v); zero for a query with no allowed key
    cache : AttentionCache; ``cache.weights`` (..., n_q, n_k) are the probabilities, with
        the batch axes of q, k and the mask (not those that only v carries: the
        probabilities do not depend on v, so they are not repeated for them)

    Raises
    ------
    FloatingPointError : when the scores (plus a float mask) overflow the dtype
    """
    scale, (q, k, v, mask, _) = check_scale(scale), check_attention_inputs(q, k, v, mask)
    out, cache = attention_formula(q, k, v, mask, scale=scale)
    return out.copy(), cache  # the caller's own copy: editing it cannot change the backward


def scaled_dot_product_attention_backward(dout, cache: AttentionCache):
    """Gradients of scaled dot-product attention (arguments ``dout, cache``): ``(dq, dk, dv)``.

    Runs the fast path (attention_ref.fast) from FAST_MIN_ELEMENTS numbers in its largest array,
    the reference (attention_ref.core) below, or always with reference_only().

    Walking the forward in reverse, with ``P = weights`` and ``S = scores``:

    4. ``out = P v``          gives ``dv = P^T dout`` and ``dP = dout v^T``
    3. ``P = softmax(S)``     gives ``dS = P * (dP - D)`` with ``D_i = sum_j P_ij dP_ij``
    2. masking                ``S + M`` passes ``dS`` through (identity Jacobian in ``S``)
    1. ``S = q k^T / sqrt(d_k)`` gives ``dq = dS k / sqrt(d_k)``, ``dk = dS^T q / sqrt(d_k)``

    Parameters
    ----------
    dout : array (..., n_q, d_v), upstream gradient
    cache : AttentionCache from the forward

    Returns
    -------
    dq : array, shape of q
    dk : array, shape of k
    dv : array, shape of v
    """
    return attention_backward_formula(as_upstream(dout, cache.out.shape, cache.out.dtype), cache)


# -------------------------------------------------------------------------- multi-head
def plain_multi_head_formula(query, key, value, p, mask, h, param_keys, *, scale=None):
    """The plain multi-head layer's forward on checked inputs, on the path the size rule picks
    (the public function, with grouped heads and a head mask, is
    :func:`attention_ref.variants.grouped_heads.multi_head_attention_forward`)."""
    n = h * _probabilities(query.shape, key.shape, mask)  # (..., H, Nq, Nk)
    path = fast_multi_head if uses_fast_path(n) else core_multi_head
    return path._multi_head_attention_forward(query, key, value, p, mask, h, param_keys, scale=scale)


def plain_multi_head_backward_formula(dout, cache: MultiHeadCache):
    """The plain multi-head layer's backward on a checked upstream gradient, on the path the size rule picks."""
    path = fast_multi_head if uses_fast_path(cache.attention.weights.size) else core_multi_head
    return path._multi_head_attention_backward(dout, cache)
