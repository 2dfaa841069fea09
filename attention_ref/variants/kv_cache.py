"""The key/value cache of autoregressive decoding: the keys and values of the tokens decoded
so far, grown as tokens arrive (:meth:`attention_ref.MultiHeadAttention.decode_step` uses it).

Symbols: Hkv key/value heads, T tokens decoded so far, Dk/Dv head widths.
"""
from __future__ import annotations

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
