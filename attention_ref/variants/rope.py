"""Rotary position embedding (RoPE, document 001), ``y = R(p) x``, and its backward.

The vector at position ``p`` has its ``D/2`` feature pairs rotated, pair ``i`` by the angle
``p * theta_i`` with ``theta_i = base^(-2i / D)``. Two layouts pair the features differently,
with the same angles. ``layout="half"`` (the default: transformers' Llama, GPT-NeoX and every
family of this package) rotates ``(x_i, x_{i + D/2})``: for ``i = 0 .. D/2 - 1``

    ``y_i       = x_i cos(p theta_i) - x_{i+D/2} sin(p theta_i)``
    ``y_{i+D/2} = x_i sin(p theta_i) + x_{i+D/2} cos(p theta_i)``

(transformers writes it ``x * cos + rotate_half(x) * sin`` with each angle repeated twice).
``layout="interleaved"`` (RoFormer, GPT-J, Meta's original Llama code written with complex
numbers, Stanford CS336) rotates ``(x_{2i}, x_{2i+1})``:

    ``y_{2i}   = x_{2i} cos(p theta_i) - x_{2i+1} sin(p theta_i)``
    ``y_{2i+1} = x_{2i} sin(p theta_i) + x_{2i+1} cos(p theta_i)``

The two differ by a permutation of the features (a checkpoint converted from one to the other
permutes the rows of W_q and W_k); used on the wrong weights, either one agrees at position 0 and
drifts with the position (``attention_ref.compare`` names that mistake ``rope_layout``).
Rotations preserve lengths, and ``R(m)^T R(n) = R(n - m)``, so after rotating queries and
keys the score ``(R(m) q) . (R(n) k) = q . R(n - m) k`` depends on the positions only
through the offset ``n - m``: relative position information inside a plain dot product.

Symbols: ``...`` batch axes, N positions, D feature width (even), D/2 pairs.

Forward: 1. angles ``p theta`` (..., N, D/2); 2. rotate each pair.

:class:`RotaryHalf` is the rotary hook the multi-head path takes (``rotary=``: queries and keys
rotated after the head split), used by the Llama-built blocks and decoding steps.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._checks import as_real_array, as_upstream, check_positions_for, check_positive_real, require_ndim

__all__ = ["RopeCache", "rope_forward", "rope_backward", "rope_angles", "ROPE_LAYOUTS"]

#: "half": pairs (x_i, x_{i+D/2}) (transformers' Llama); "interleaved": pairs (x_{2i}, x_{2i+1}) (GPT-J)
ROPE_LAYOUTS = ("interleaved", "half")


class RopeCache(NamedTuple):
    """The cosines and sines of the angles (the rotation is all the backward needs) and x's shape."""

    cos: np.ndarray  # (..., N, D/2)
    sin: np.ndarray  # (..., N, D/2)
    x_shape: tuple  # (..., N, D), the shape of x and of the output y
    layout: str = "half"  # which features are paired (see ROPE_LAYOUTS)


def rope_angles(positions, d: int, base: float = 10000.0) -> np.ndarray:
    """Angles ``positions[..., None] * base^(-2i / d)`` for ``i = 0 .. d/2 - 1``, float64.

    Deliberately float64 whatever the caller's dtype: float32 keeps 24 bits, so an angle
    ``p * theta`` near 10^4 would be rounded by up to about 5e-4 rad. The angles are data
    derived from the positions, not the caller's work: :func:`rope_forward` casts their
    cos and sin to ``x``'s dtype before touching ``x``, so float32 work stays float32.
    """
    theta = base ** (-np.arange(0, d, 2, dtype=np.float64) / d)  # (D/2,)
    return np.asarray(positions, dtype=np.float64)[..., None] * theta  # (..., N, D/2)


def rotate(x, cos, sin, layout="half"):
    """Rotate each feature pair of ``x`` by the angle with ``cos`` and ``sin``: pairs
    ``(x_{2i}, x_{2i+1})`` (interleaved) or ``(x_i, x_{i+D/2})`` (half)."""
    half = x.shape[-1] // 2
    first, second = (x[..., 0::2], x[..., 1::2]) if layout == "interleaved" else (x[..., :half], x[..., half:])
    y = np.empty(np.broadcast_shapes(x.shape, cos.shape[:-1] + (x.shape[-1],)), x.dtype)  # (..., N, D)
    out_first, out_second = (y[..., 0::2], y[..., 1::2]) if layout == "interleaved" else (y[..., :half], y[..., half:])
    out_first[...] = first * cos - second * sin  # (..., N, D/2)
    out_second[...] = first * sin + second * cos  # (..., N, D/2)
    return y  # (..., N, D)


def rope_forward(x, positions=None, base=10000.0, layout="half"):
    """Rotary position embedding of the vectors ``x`` at ``positions``, in transformers' Llama
    layout unless ``layout="interleaved"`` (RoFormer, GPT-J) is given.

    Parameters
    ----------
    x : array (..., n, d) with ``d`` even (queries or keys, typically per head)
    positions : None (``0, 1, ..., n - 1``), a real array (n,) (also behind size-1 axes, such as
        (1, n)), or one with as many axes as ``x.shape[:-1]`` whose size-1 axes broadcast (per batch row against x (B, H, n, d):
        ``positions[:, None, :]``, shape (B, 1, n)); the position of each vector (offsets such
        as ``T`` while decoding, or any real number). Any other shape is refused: (B, n)
        against (B, H, n, d) would be read as per head when B == H.
    base : float > 0, sets the slowest frequency ``theta_{d/2-1} = base^(-(d-2)/d)``
    layout : ``"half"`` (the default since 0.4.0: pairs ``(x_i, x_{i+d/2})``, transformers'
        Llama rotate-half) or ``"interleaved"`` (pairs ``(x_{2i}, x_{2i+1})``, RoFormer, GPT-J;
        the default before 0.4.0)

    Returns
    -------
    y : array (..., n, d), the rotated vectors (same dtype as ``x``)
    cache : RopeCache for :func:`rope_backward`
    """
    x = as_real_array(x, "x")
    require_ndim(x, "x", 2, "(..., n, d)")
    if x.shape[-1] % 2:
        raise ValueError(f"x must have an even last dimension d (feature pairs), got shape {x.shape}")
    base = check_positive_real(base, "base")
    if layout not in ROPE_LAYOUTS:
        raise ValueError(f"layout must be one of {ROPE_LAYOUTS}, got {layout!r}")
    if positions is None:
        positions = np.arange(x.shape[-2])  # (N,)
    else:
        positions = as_real_array(positions, "positions")
        check_positions_for(positions, x.shape)
    # 1. angles in float64 for accuracy at large positions (see rope_angles); cos and sin
    #    are cast to x's dtype here, so the rotation of a float32 x is float32 work
    angles = rope_angles(positions, x.shape[-1], base)  # (..., N, D/2)
    cos, sin = np.cos(angles).astype(x.dtype), np.sin(angles).astype(x.dtype)
    # 2. rotate
    return rotate(x, cos, sin, layout), RopeCache(cos, sin, x.shape, layout)


def rope_backward(dy, cache: RopeCache):
    """Gradient of :func:`rope_forward` with respect to ``x``.

    2. ``y = R x`` with ``R`` orthogonal gives ``dx = R^T dy``: the same pairs rotated by
       the opposite angle (cos unchanged, sin negated).
    1. the angles depend on the positions only, which get no gradient.

    Parameters
    ----------
    dy : array (..., n, d), upstream gradient, shaped like the forward output
    cache : RopeCache

    Returns
    -------
    dx : array (..., n, d)
    """
    cos, sin, x_shape, layout = cache
    return rotate(as_upstream(dy, x_shape, cos.dtype, "dy"), cos, -sin, layout)


# ---------------------------------------------------------------- the rotary hook of the multi-head path


class RotaryHalf(NamedTuple):
    """RoPE on the split heads, as :func:`attention_ref.core.multi_head` expects: queries at
    ``q_positions``, keys at ``k_positions`` (both ``0..N-1`` in a block forward). ``theta``
    (Dh/2,), when given, are the frequencies (Llama 3.x's scaled ones, from
    :func:`attention_ref.nn.rope_scaling.rope_frequencies`); else ``base^(-2i/Dh)``. ``layout``:
    ``"half"`` (rotate-half, transformers' Llama) or ``"interleaved"`` (Meta's original weights)."""

    q_positions: np.ndarray  # (Nq,)
    k_positions: np.ndarray  # (Nk,)
    base: float
    theta: np.ndarray | None = None  # (Dh/2,)
    layout: str = "half"

    def forward(self, q, k):
        if self.theta is None:
            q, q_cache = rope_forward(q, self.q_positions, self.base, layout=self.layout)  # (..., H, Nq, Dh)
            k, k_cache = rope_forward(k, self.k_positions, self.base, layout=self.layout)  # (..., Hkv, Nk, Dh)
        else:
            q, q_cache = self._rotate(q, self.q_positions)  # (..., H, Nq, Dh)
            if self.k_positions is self.q_positions and k.dtype == q.dtype:  # a block's: the same angles
                cos, sin = q_cache.cos, q_cache.sin  # (..., N, Dh/2), computed once for q and k
                k, k_cache = rotate(k, cos, sin, self.layout), RopeCache(cos, sin, k.shape, self.layout)
            else:
                k, k_cache = self._rotate(k, self.k_positions)  # (..., Hkv, Nk, Dh)
        return q, k, (q_cache, k_cache)

    def _rotate(self, x, positions):
        """RoPE's rotation by ``p theta_i`` (angles in float64, cos and sin in x's dtype)."""
        angles = np.asarray(positions, dtype=np.float64)[..., None] * self.theta  # (..., N, Dh/2)
        cos, sin = np.cos(angles).astype(x.dtype), np.sin(angles).astype(x.dtype)
        return rotate(x, cos, sin, self.layout), RopeCache(cos, sin, x.shape, self.layout)

    def backward(self, dq, dk, cache):
        q_cache, k_cache = cache
        return rope_backward(dq, q_cache), rope_backward(dk, k_cache)
