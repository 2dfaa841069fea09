"""The key/value cache of autoregressive decoding: the keys and values of the tokens decoded
so far, grown as tokens arrive (:meth:`attention_ref.MultiHeadAttention.decode_step` uses it).

Symbols: Hkv key/value heads, T tokens decoded so far, Dk/Dv head widths.
"""
from __future__ import annotations

import weakref

import numpy as np

from .._checks import as_real_array, require_ndim

__all__ = ["KVCache"]


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
