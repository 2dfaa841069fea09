"""The key/value cache of autoregressive decoding: the keys and values of the tokens decoded
so far, grown as tokens arrive (:meth:`attention_ref.MultiHeadAttention.decode_step` uses it),
and beside it a decoding step's checks (:func:`check_new_tokens`, :func:`check_decode_mask`,
:func:`check_decode_positions`) and its attention over the cache (:func:`decode_attention_formula`),
which every block's decoding step calls.

Symbols: Hkv key/value heads, T tokens decoded so far, Dk/Dv head widths.
"""
from __future__ import annotations

import weakref

import numpy as np

from .._checks import as_mask, as_real_array, broadcasts_into, cast_mask, check_mask_shape, require_ndim
from ..core.masks import causal_mask, combine_masks
from ..fast.core_formulas import merge_heads_formula, split_heads_formula
from ..fast.dispatch import attention_formula, linear_formula
from .grouped_heads import group_heads, group_mask, hooked_attention_formula, ungroup_heads
from .sink_softmax import sink_attention_formula

__all__ = ["KVCache", "check_new_tokens", "check_decode_mask", "check_decode_positions",
           "decode_attention_formula"]


class KVCache:
    """Keys and values of the tokens decoded so far, grown one row per step.

    ``keys`` is (..., Hkv, T, Dk) and ``values`` (..., Hkv, T, Dv). Storage grows by
    doubling, so appending T tokens costs O(T) copies in total rather than O(T^2).
    Memory: ``2 * batch * Hkv * T * Dk * itemsize`` bytes (with Dk = Dv), see ``nbytes``.
    """

    def __init__(self):
        self._k = None  # (..., Hkv, capacity, Dk)
        self._v = None  # (..., Hkv, capacity, Dv)
        self.length = 0
        self._owner = None  # the key projection of the layer whose keys this cache holds

    def claim(self, W_k) -> None:
        """Bind the cache to one layer, known by its key projection ``W_k``; a later step of
        another layer (a different ``W_k``) is refused before anything is appended.

        Sharing one cache between two layers would interleave their keys and give wrong
        outputs without any error: each layer needs its own cache. The layer is recognised
        by the identity of its ``W_k`` array or, for a new array object, by its shape, dtype
        and a sample of its entries (the same weights passed again as a copy are accepted).
        """
        W_k = np.asarray(W_k)
        if self._owner is not None and self._owner[0]() is W_k:  # the same array as before: every decoding step
            return
        sample = W_k.reshape(-1)[:: max(1, W_k.size // 64)].copy()  # up to ~64 entries
        if self._owner is None:
            self._owner = (weakref.ref(W_k), W_k.shape, W_k.dtype, sample)
            return
        ref, shape, dtype, owner_sample = self._owner
        if ref() is W_k or (shape == W_k.shape and dtype == W_k.dtype and np.array_equal(sample, owner_sample)):
            return
        raise ValueError(
            f"this KVCache (length {self.length}) holds the keys of another layer: its key projection"
            f" W_k of shape {W_k.shape} is not the one the cache was filled with (shape {shape});"
            " use one KVCache per layer (e.g. [KVCache() for _ in range(num_layers)])")

    def __repr__(self):
        if self._k is None:
            return "KVCache(length=0)"
        return (f"KVCache(length={self.length}, keys={self.keys.shape}, values={self.values.shape},"
                f" dtype='{self._k.dtype}')")

    @property
    def keys(self):
        """Cached keys, (..., Hkv, T, Dk), or None before the first step."""
        return None if self._k is None else self._k[..., : self.length, :]

    @property
    def values(self):
        """Cached values, (..., Hkv, T, Dv), or None before the first step."""
        return None if self._v is None else self._v[..., : self.length, :]

    @property
    def nbytes(self) -> int:
        """Bytes held by the cached keys and values (not the spare capacity)."""
        return 0 if self._k is None else self.keys.nbytes + self.values.nbytes

    def append(self, k_new, v_new):
        """Add one step's keys (..., Hkv, t, Dk) and values (..., Hkv, t, Dv): real and finite."""
        k_new, v_new = as_real_array(k_new, "keys"), as_real_array(v_new, "values")
        require_ndim(k_new, "keys", 3, "(..., Hkv, t, Dk)")
        require_ndim(v_new, "values", 3, "(..., Hkv, t, Dv)")
        if self._k is None:
            cap = max(16, k_new.shape[-2])
            self._k = np.empty(k_new.shape[:-2] + (cap, k_new.shape[-1]), k_new.dtype)
            self._v = np.empty(v_new.shape[:-2] + (cap, v_new.shape[-1]), v_new.dtype)
        else:
            for name, new, old in (("keys", k_new, self._k), ("values", v_new, self._v)):
                if new.shape[:-2] != old.shape[:-2] or new.shape[-1] != old.shape[-1]:
                    raise ValueError(
                        f"new {name} of shape {new.shape} do not match the cached {name} of shape"
                        f" {old[..., : self.length, :].shape} (batch, heads and width must stay"
                        " the same across steps)")
                if new.dtype != old.dtype:
                    raise TypeError(f"new {name} have dtype {new.dtype}, the cache holds {old.dtype}")
        end = self.length + k_new.shape[-2]
        if end > self._k.shape[-2]:  # grow by doubling
            cap = max(end, 2 * self._k.shape[-2])
            for name in ("_k", "_v"):
                old = getattr(self, name)
                new = np.empty(old.shape[:-2] + (cap, old.shape[-1]), old.dtype)
                new[..., : self.length, :] = old[..., : self.length, :]
                setattr(self, name, new)
        self._k[..., self.length:end, :] = k_new
        self._v[..., self.length:end, :] = v_new
        self.length = end


# ---------------------------------------------------------------- a decoding step's checks and attention


def check_new_tokens(x_t, cache) -> np.ndarray:
    """The new tokens of a decoding step as an array: ``x_t`` (..., t, d_model) with ``t >= 1``
    (a prompt to prefill, or one token), and ``cache`` a :class:`KVCache`."""
    if not isinstance(cache, KVCache):
        raise TypeError(f"cache must be a KVCache, got {type(cache).__name__}")
    x_t = as_real_array(x_t, "x_t")
    if x_t.ndim < 2 or x_t.shape[-2] == 0:
        raise ValueError(f"x_t must have shape (..., t, d_model) with t >= 1 new tokens, got shape {x_t.shape}")
    return x_t


def check_decode_mask(mask, x_t, cache: KVCache, dtype):
    """A decoding step's extra mask: broadcastable to (..., t, T + t), the new tokens against every
    key after this step (the cached ones and the new ones); boolean (True = may attend) or float."""
    mask = as_mask(mask)
    if mask is None:
        return None
    t, total = x_t.shape[-2], cache.length + x_t.shape[-2]
    check_mask_shape(mask, x_t.shape[:-2] + (t, total), "mask")
    return cast_mask(mask, dtype)


def decode_attention_formula(z, p, num_heads, num_kv_heads, cache: KVCache, *, scale=None, rotary=None, name="x_t",
                             mask=None, scores=None, sinks=None):
    """Multi-head attention of the new tokens ``z`` (..., t, D) in a decoding step.

    Projects them to queries, keys and values, rotates the queries and keys when ``rotary``
    is given (``rotary.forward(q, k) -> (q, k, cache)``, as in the core's multi-head path),
    appends the keys and values to ``cache`` (once per key/value head) and attends from each
    new query to every cached position and, causally, to the new ones before it; ``p`` holds
    validated ``W_q ... W_o`` (biases optional). ``mask``, checked by :func:`check_decode_mask`,
    is combined with that causal rule (e.g. the padding of left-padded prompts); ``scores``, a
    hook on the scaled scores as in the grouped-heads path (Gemma 2's cap); ``sinks`` (H,), a sink
    logit per head in the softmax's denominator (gpt-oss). Returns ``concat W_o + b_o`` (..., t, D_out).
    """
    h, hkv = num_heads, num_kv_heads
    cache.claim(p["W_k"])  # one cache per layer: another layer's cache is refused before it changes
    q = split_heads_formula(linear_formula(z, p["W_q"], p.get("b_q"), (name, "W_q", "b_q")), h)  # (..., H, t, Dk)
    k = split_heads_formula(linear_formula(z, p["W_k"], p.get("b_k"), (name, "W_k", "b_k")), hkv)  # (..., Hkv, t, Dk)
    v = split_heads_formula(linear_formula(z, p["W_v"], p.get("b_v"), (name, "W_v", "b_v")), hkv)  # (..., Hkv, t, Dv)
    if rotary is not None:
        q, k, _ = rotary.forward(q, k)  # each new token at its own position
    cache.append(k, v)
    keys = cache.keys[..., None, :, :]  # (..., Hkv, 1, T, Dk)
    values = cache.values[..., None, :, :]  # (..., Hkv, 1, T, Dv)
    t = z.shape[-2]  # the new tokens are the last t of the T cached: causal among themselves
    causal = None if t == 1 else causal_mask(t, cache.length)  # (t, T)
    if mask is not None:
        causal = mask if causal is None else combine_masks(mask, causal)  # (..., t, T)
    if sinks is not None:
        o, _, _ = sink_attention_formula(group_heads(q, hkv), keys, values, group_mask(causal), scale,
                                         sinks.reshape(hkv, h // hkv, 1, 1))  # (..., Hkv, G, t, Dv)
    elif scores is None:
        o, _ = attention_formula(group_heads(q, hkv), keys, values, group_mask(causal), scale=scale)  # (..., Hkv, G, t, Dv)
    else:
        o, _, _ = hooked_attention_formula(group_heads(q, hkv), keys, values, group_mask(causal), scale, scores)
    heads = ungroup_heads(o)  # (..., H, t, Dv)
    return linear_formula(merge_heads_formula(heads), p["W_o"], p.get("b_o"), ("heads", "W_o", "b_o"))  # (..., t, D_out)


def check_decode_positions(positions, x_t):
    """The new tokens' positions: integers broadcastable to x_t's (..., t) without growing it."""
    positions = np.asarray(positions)
    if positions.dtype.kind not in "iu":
        raise TypeError(f"positions must be integers, got dtype {positions.dtype}")
    if not broadcasts_into(positions.shape, x_t.shape[:-1]):
        raise ValueError(f"positions of shape {positions.shape} must broadcast to the new tokens' {x_t.shape[:-1]}"
                         " (..., t)")
    return positions
