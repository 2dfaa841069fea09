"""The fused query/key/value projection split into q, k and v (GPT-NeoX, Phi-3), and its backward.

Some checkpoints store ``W_q``, ``W_k``, ``W_v`` as one matrix whose output
``qkv = x W_qkv`` holds all three, in one of two column orders:

* ``"per_head"`` (GPT-NeoX / Pythia ``query_key_value``): head by head,
  ``[q_0, k_0, v_0, q_1, k_1, v_1, ...]``, each block ``Dh`` wide (transformers views the
  output as ``(..., H, 3 Dh)`` and chunks the last axis in three);
* ``"blocks"`` (Phi-3 ``qkv_proj``): ``[q (H Dh), k (Hkv Dh), v (Hkv Dh)]``.

The split is a permutation of the last axis into this package's merged-heads layout
(``q = [q_0, q_1, ...]``, :func:`attention_ref.core.heads.split_heads`), so it applies as well to
the weight ``W_qkv`` (d, 3 H Dh) and the bias ``b_qkv`` (3 H Dh,) as to the activations:
a pure reshape, whose backward puts the three gradients back in the fused order.

Symbols: ``...`` any axes, H query heads, Hkv key/value heads, Dh head width.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._checks import as_real_array, as_upstream, check_positive_int, require_ndim

__all__ = ["QKV_LAYOUTS", "FusedQKVCache", "fused_qkv_split_forward", "fused_qkv_split_backward",
           "fused_qkv_split_formula"]

#: "per_head": [q_0 k_0 v_0 q_1 k_1 v_1 ...] (GPT-NeoX); "blocks": [q | k | v] (Phi-3)
QKV_LAYOUTS = ("per_head", "blocks")


class FusedQKVCache(NamedTuple):
    """What the backward needs to put the gradients back: the layout, the head counts and shape."""

    layout: str
    num_heads: int
    num_kv_heads: int
    shape: tuple  # (..., (H + 2 Hkv) Dh), the fused array's
    dtype: np.dtype


def fused_qkv_split_forward(qkv, num_heads, num_kv_heads=None, layout="per_head"):
    """Split the last axis of a fused ``qkv`` into ``q``, ``k``, ``v`` in the merged-heads layout.

    Parameters
    ----------
    qkv : array (..., (H + 2 Hkv) Dh): activations ``x W_qkv``, the weight ``W_qkv`` or the bias
    num_heads : H
    num_kv_heads : Hkv (None: H); the ``"per_head"`` layout has ``Hkv = H``
    layout : ``"per_head"`` or ``"blocks"`` (see the module docstring)

    Returns
    -------
    (q, k, v) : arrays (..., H Dh), (..., Hkv Dh), (..., Hkv Dh), copies in ``qkv``'s dtype
    cache : FusedQKVCache for :func:`fused_qkv_split_backward`
    """
    qkv = as_real_array(qkv, "qkv")
    require_ndim(qkv, "qkv", 1, "(..., (H + 2 Hkv) Dh)")
    H = check_positive_int(num_heads, "num_heads")
    Hkv = H if num_kv_heads is None else check_positive_int(num_kv_heads, "num_kv_heads")
    if layout not in QKV_LAYOUTS:
        raise ValueError(f"layout must be one of {QKV_LAYOUTS}, got {layout!r}")
    if layout == "per_head" and Hkv != H:
        raise ValueError(f"the per_head layout holds as many key/value heads as query heads: num_kv_heads ="
                         f" {Hkv} != num_heads = {H}")
    width = qkv.shape[-1]
    if width % (H + 2 * Hkv):
        raise ValueError(f"qkv's last dimension {width} is not (num_heads + 2 num_kv_heads) * head_dim ="
                         f" {H + 2 * Hkv} * head_dim (qkv has shape {qkv.shape})")
    return fused_qkv_split_formula(qkv, H, Hkv, layout)


def fused_qkv_split_formula(qkv, H, Hkv, layout):
    """:func:`fused_qkv_split_forward` on checked inputs (GPT-NeoX's block splits its weight and
    bias with it, checked once by the block)."""
    Dh = qkv.shape[-1] // (H + 2 * Hkv)
    lead = qkv.shape[:-1]
    if layout == "per_head":
        heads = qkv.reshape(lead + (H, 3, Dh))  # (..., H, 3, Dh): [q_h, k_h, v_h] per head
        q, k, v = (heads[..., i, :].reshape(lead + (H * Dh,)) for i in range(3))  # (..., H Dh) each, copies
    else:
        q, k, v = (part.copy() for part in np.split(qkv, [H * Dh, (H + Hkv) * Dh], axis=-1))
    return (q, k, v), FusedQKVCache(layout, H, Hkv, qkv.shape, qkv.dtype)


def fused_qkv_split_backward(dqkv_parts, cache: FusedQKVCache):
    """Gradient of :func:`fused_qkv_split_forward`: the split is a permutation of the last axis,
    so ``dqkv`` is ``(dq, dk, dv)`` put back in the fused order (the inverse permutation).

    Parameters
    ----------
    dqkv_parts : (dq, dk, dv), shaped like the forward's (q, k, v)
    cache : FusedQKVCache

    Returns
    -------
    dqkv : array (..., (H + 2 Hkv) Dh)
    """
    layout, H, Hkv, shape, dtype = cache
    if not isinstance(dqkv_parts, (tuple, list)) or len(dqkv_parts) != 3:
        raise TypeError("dqkv_parts must be the three gradients (dq, dk, dv)")
    lead, Dh = shape[:-1], shape[-1] // (H + 2 * Hkv)
    return fused_qkv_split_backward_formula(tuple(as_upstream(g, lead + (n * Dh,), dtype, name) for g, n, name
                                           in zip(dqkv_parts, (H, Hkv, Hkv), ("dq", "dk", "dv"))), cache)


def fused_qkv_split_backward_formula(dqkv_parts, cache: FusedQKVCache):
    """Unchecked backward, for the blocks (their gradients have the forward's shapes already)."""
    layout, H, Hkv, shape, dtype = cache
    lead, Dh = shape[:-1], shape[-1] // (H + 2 * Hkv)
    dq, dk, dv = dqkv_parts
    if layout == "per_head":
        parts = [g.reshape(lead + (H, 1, Dh)) for g in (dq, dk, dv)]  # (..., H, 1, Dh) each
        return np.concatenate(parts, axis=-2).reshape(shape)  # (..., H, 3, Dh) -> (..., 3 H Dh)
    return np.concatenate([dq, dk, dv], axis=-1)  # (..., (H + 2 Hkv) Dh)
