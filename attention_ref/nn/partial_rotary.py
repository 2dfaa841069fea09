"""Partial rotary position embedding (GPT-NeoX / Pythia, Phi-2): RoPE on the first ``r`` features
of each head, the others passed through, and its backward.

``y[..., :r] = R(p) x[..., :r]`` and ``y[..., r:] = x[..., r:]``, with RoPE's rotation over the
``r`` rotated features only (frequencies ``theta_i = base^(-2i / r)``, scaled as
:func:`attention_ref.nn.rope_scaling.rope_frequencies` says). GPT-NeoX rotates
``r = int(head_dim * rotary_pct)`` features (``rotary_pct = 0.25`` for Pythia), pairing them
rotate-half style within those ``r``. The map is block-diagonal, ``diag(R(p), I)``, and
orthogonal, so ``dx = diag(R(p)^T, I) dy``.

Symbols: ``...`` batch axes, N positions, D head width, r the rotated width (even, <= D).

Forward: 1. split ``x = [x_rot, x_pass]``; 2. ``y_rot = R(p) x_rot``; 3. ``y = [y_rot, x_pass]``.

:class:`PartialRotaryHalf` is the multi-head path's hook that applies it to queries and keys (GPT-NeoX).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

from .._checks import as_real_array, as_upstream, check_positive_int, require_ndim
from ..variants.rope import ROPE_LAYOUTS, RopeCache, rotate
from .rope_scaling import _check_positions, _rotate_by, rope_frequencies

__all__ = ["PartialRotaryCache", "partial_rotary_forward", "partial_rotary_backward", "partial_rotary_formula"]


class PartialRotaryCache(NamedTuple):
    """The rotation of the first ``rotary_dim`` features (RoPE's cache) and the input's shape."""

    rope: RopeCache  # cos, sin (..., N, r/2)
    x_shape: tuple  # (..., N, D)


def partial_rotary_forward(x, rotary_dim, positions=None, base=None, scaling=None, layout="half"):
    """Rotate the first ``rotary_dim`` features of each vector of ``x`` by RoPE; pass the rest.
    Arguments ``(x, rotary_dim, positions, base, scaling, layout="half")``.

    Parameters
    ----------
    x : array (..., n, d), queries or keys per head
    rotary_dim : even int in [2, d], the rotated width ``r`` (GPT-NeoX: ``int(head_dim * rotary_pct)``)
    positions : None (``0 .. n - 1``), real positions (n,), or an array with as many axes as
        ``x.shape[:-1]`` (size-1 axes broadcast: ``positions[:, None, :]`` for (B, n) against (B, H, n, d))
    base, scaling : RoPE's base and scaling, as :func:`attention_ref.nn.rope_scaling.rope_frequencies`;
        a ``partial_rotary_factor`` in ``scaling`` must give ``int(d * factor) == rotary_dim``
    layout : ``"half"`` (GPT-NeoX's rotate-half within the ``r`` features) or ``"interleaved"``

    Returns
    -------
    y : array (..., n, d), in ``x``'s dtype
    cache : PartialRotaryCache for :func:`partial_rotary_backward`
    """
    x = as_real_array(x, "x")
    require_ndim(x, "x", 2, "(..., n, d)")
    d = x.shape[-1]
    rotary_dim = check_positive_int(rotary_dim, "rotary_dim")
    if rotary_dim % 2 or rotary_dim > d:
        raise ValueError(f"rotary_dim must be even and at most x's last dimension {d}, got {rotary_dim}"
                         f" (x has shape {x.shape})")
    if layout not in ROPE_LAYOUTS:
        raise ValueError(f"layout must be one of {ROPE_LAYOUTS}, got {layout!r}")
    if isinstance(scaling, Mapping) and "partial_rotary_factor" in scaling:
        implied = 2 * len(rope_frequencies(d, base, scaling))
        if implied != rotary_dim:
            raise ValueError(f"scaling['partial_rotary_factor'] = {scaling['partial_rotary_factor']} rotates"
                             f" {implied} of {d} features, but rotary_dim = {rotary_dim}")
        scaling = {k: v for k, v in scaling.items() if k != "partial_rotary_factor"}
    theta = rope_frequencies(rotary_dim, base, scaling)  # (r/2,)
    positions = _check_positions(positions, x)
    return partial_rotary_formula(x, theta, positions, layout)


def partial_rotary_formula(x, theta, positions, layout="half"):
    """:func:`partial_rotary_forward` on checked inputs: ``theta`` (r/2,) the frequencies of the
    ``r = 2 len(theta)`` rotated features, ``positions`` broadcastable to ``x.shape[:-1]``."""
    d, rotary_dim = x.shape[-1], 2 * len(theta)
    # 1. split, 2. rotate the first r features, 3. join
    y_rot, rope = _rotate_by(x[..., :rotary_dim], positions, theta, layout)  # (..., N, r)
    x_pass = np.broadcast_to(x[..., rotary_dim:], y_rot.shape[:-1] + (d - rotary_dim,))  # (..., N, D - r)
    return np.concatenate([y_rot, x_pass], axis=-1), PartialRotaryCache(rope, y_rot.shape[:-1] + (d,))


def partial_rotary_backward(dy, cache: PartialRotaryCache):
    """Gradient of :func:`partial_rotary_forward` (arguments ``dy, cache``): ``dx``.

    3.-1. ``y = [R x_rot, x_pass]`` gives ``dx_rot = R^T dy[..., :r]`` (each pair rotated back)
    and ``dx_pass = dy[..., r:]``.

    Returns
    -------
    dx : array (..., n, d), shaped like the forward output
    """
    return partial_rotary_backward_formula(as_upstream(dy, cache.x_shape, cache.rope.cos.dtype, "dy"), cache)


def partial_rotary_backward_formula(dy, cache: PartialRotaryCache):
    """Unchecked backward, for the blocks."""
    rope = cache.rope
    r = 2 * rope.cos.shape[-1]
    dx_rot = rotate(dy[..., :r], rope.cos, -rope.sin, rope.layout)  # (..., N, r): R^T dy_rot
    return np.concatenate([dx_rot, dy[..., r:]], axis=-1)  # (..., N, D)


# ---------------------------------------------------------------- the rotary hook of the multi-head path


class PartialRotaryHalf(NamedTuple):
    """GPT-NeoX's rotary hook for the multi-head layer: RoPE on the first ``2 len(theta)`` features
    of each head's query and key (rotate-half within them), the rest passed through; queries at
    ``q_positions``, keys at ``k_positions``. Backward: ``diag(R(p)^T, I)`` on each."""

    q_positions: np.ndarray  # broadcastable to q's (..., H, Nq)
    k_positions: np.ndarray  # broadcastable to k's (..., H, Nk)
    theta: np.ndarray  # (r/2,)

    def forward(self, q, k):
        q, q_cache = partial_rotary_formula(q, self.theta, self.q_positions)  # (..., H, Nq, Dh)
        k, k_cache = partial_rotary_formula(k, self.theta, self.k_positions)  # (..., H, Nk, Dh)
        return q, k, (q_cache, k_cache)

    def backward(self, dq, dk, cache):
        q_cache, k_cache = cache
        return partial_rotary_backward_formula(dq, q_cache), partial_rotary_backward_formula(dk, k_cache)
