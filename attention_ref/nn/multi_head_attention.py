"""A small layer class over the functional pair, with KV-cache decoding (``decode_step``).

Symbols as in :mod:`attention_ref.core.multi_head`; T is the number of tokens decoded so far.
"""
from __future__ import annotations

import numpy as np

from .._checks import as_generator
from .._checks import as_mask, cast_mask, check_float_dtype, check_mask_shape, check_positive_int
from .._pair_checks import MultiHeadInputs, check_multi_head_inputs
from ..core.linear import glorot_uniform
from ..core.masks import causal_mask, combine_masks
from ..variants.grouped_heads import (
    multi_head_attention_backward,
    multi_head_attention_formula,
    multi_head_attention_forward,
)
from ..variants.local import local_window_mask
from ..core.separate_heads import (
    multi_head_attention_separate_heads_backward,
    multi_head_attention_separate_heads_forward,
)
# the decoding step's checks and attention live beside the KV cache (0.3's path, kept):
from ..variants.kv_cache import KVCache, check_decode_mask, check_new_tokens, decode_attention_formula
from ..variants.kv_cache import decode_attention_formula as decode_attention  # deprecated since 0.4

__all__ = ["MultiHeadAttention", "check_new_tokens", "decode_attention", "check_decode_mask", "check_block_mask",
           "causal_self_attention_formula"]


def causal_self_attention_formula(z, p, num_heads, num_kv_heads, *, mask=None, kv: KVCache | None = None,
                                  window=None, scale=None, rotary=None, scores=None, param_keys=None, name="z",
                                  sinks=None):
    """A decoder block's attention step ``a = Attn(z)``, one step for the forward and for decoding
    (the KV cache is an argument, as in tinygrad's one ``__call__``): ``(a, cache)``.

    ``kv`` None: the forward over the N positions of ``z`` (..., N, D), causal (within the sliding
    ``window`` W, keys ``i - W < j <= i``, when given) and the extra ``mask`` (None or checked,
    (..., N, N)); ``cache`` is the multi-head layer's for the backward. ``kv`` a
    :class:`KVCache`: the t new tokens after the ``kv.length`` cached ones
    (:func:`attention_ref.variants.kv_cache.decode_attention_formula`; ``mask`` as
    :func:`attention_ref.variants.kv_cache.check_decode_mask`, (..., t, T + t)); ``cache``
    is None. ``rotary`` and ``scores`` are the grouped-heads path's hooks on q and k and on the
    scores, ``sinks`` (H,) its sink logit per head (gpt-oss; their gradient is ``grads["sinks"]``); ``p`` the checked ``W_q ... W_o`` (biases optional), ``param_keys`` their names in
    the gradients (default ``tuple(p)``)."""
    t = z.shape[-2]
    if kv is None:
        rule = causal_mask(t) if window is None else local_window_mask(t, window - 1, causal=True)  # (N, N)
        rule = rule if mask is None else combine_masks(mask, rule)  # (..., N, N)
        inputs = MultiHeadInputs(z, z, z, p, rule, None, num_heads, num_kv_heads)
        return multi_head_attention_formula(inputs, tuple(p) if param_keys is None else param_keys, scale=scale,
                                            rotary=rotary, scores=scores, sinks=sinks)  # (..., N, D)
    if window is not None:  # the t new tokens, last of the T + t, see the keys i - W < j <= i only
        band = local_window_mask(t, window - 1, kv.length + t, causal=True)  # (t, T + t)
        mask = band if mask is None else combine_masks(mask, band)  # (..., t, T + t)
    return decode_attention_formula(z, p, num_heads, num_kv_heads, kv, scale=scale, rotary=rotary, name=name,
                                    mask=mask, scores=scores, sinks=sinks), None  # (..., t, D)


def check_block_mask(mask, x):
    """A block's extra self-attention mask: broadcastable to (..., n, n) for ``x`` (..., n, d),
    boolean (True = may attend) or float (added), cast to ``x``'s dtype; None stays None."""
    mask = as_mask(mask)
    if mask is None:
        return None
    check_mask_shape(mask, x.shape[:-2] + (x.shape[-2], x.shape[-2]), "mask")
    return cast_mask(mask, x.dtype)


_STRATEGIES = {
    "parallel": (multi_head_attention_forward, multi_head_attention_backward),
    "separate": (multi_head_attention_separate_heads_forward, multi_head_attention_separate_heads_backward),
}


class MultiHeadAttention:
    """Multi-head attention layer holding its parameters and the last forward's cache.

    Parameters
    ----------
    d_model : width of the query input and of the output
    num_heads : number of (query) heads h
    d_k, d_v : head widths (default ``d_model // num_heads``; then ``d_model`` must be
        divisible by ``num_heads``)
    num_kv_heads : key/value heads (default ``num_heads``; 1 is multi-query attention)
    kdim, vdim : widths of the key and value inputs (default ``d_model``), for
        cross-attention between sequences of different widths
    bias : whether the four projections have biases
    seed : int or None, seeds the ``numpy.random.Generator`` that draws the weights
        (Xavier/Glorot uniform, ``U(-a, a)`` with ``a = sqrt(6 / (fan_in + fan_out))``;
        biases start at zero)
    dtype : float64 (default) or float32
    strategy : ``"parallel"`` (weight-split, all heads at once; the default) or
        ``"separate"`` (one single-head computation per head, then concatenation), the
        two implementation strategies of document 000; they give the same numbers.

    Attributes
    ----------
    params : dict ``W_q, b_q, W_k, b_k, W_v, b_v, W_o, b_o`` as in
        :func:`attention_ref.multi_head_attention_forward`
    grads : dict with the same keys after :meth:`backward` (plus ``"head_mask"`` when the
        forward was given a head mask)
    cache : the last forward's cache (``cache.weights`` are the attention probabilities)
    """

    def __init__(self, d_model, num_heads, *, d_k=None, d_v=None, num_kv_heads=None,
                 kdim=None, vdim=None, bias=True, seed=None, dtype=np.float64,
                 strategy="parallel"):
        d_model = check_positive_int(d_model, "d_model")
        num_heads = check_positive_int(num_heads, "num_heads")
        if (d_k is None or d_v is None) and d_model % num_heads:
            raise ValueError(
                f"d_model={d_model} is not divisible by num_heads={num_heads}; choose another"
                " head count or give the head widths d_k and d_v explicitly")
        d_k = d_model // num_heads if d_k is None else check_positive_int(d_k, "d_k")
        d_v = d_model // num_heads if d_v is None else check_positive_int(d_v, "d_v")
        hkv = num_heads if num_kv_heads is None else check_positive_int(num_kv_heads, "num_kv_heads")
        if num_heads % hkv:
            raise ValueError(f"num_heads={num_heads} must be a multiple of num_kv_heads={hkv}")
        kdim = d_model if kdim is None else check_positive_int(kdim, "kdim")
        vdim = d_model if vdim is None else check_positive_int(vdim, "vdim")
        if strategy not in _STRATEGIES:
            raise ValueError(f"strategy must be one of {sorted(_STRATEGIES)}, got {strategy!r}")
        if strategy == "separate" and hkv != num_heads:
            raise ValueError("strategy='separate' supports ordinary multi-head attention only"
                             f" (num_kv_heads == num_heads), got num_kv_heads={hkv}")
        dtype = check_float_dtype(dtype)
        self.d_model, self.num_heads, self.num_kv_heads = d_model, num_heads, hkv
        self.d_k, self.d_v, self.kdim, self.vdim = d_k, d_v, kdim, vdim
        self.bias, self.dtype, self.strategy = bool(bias), dtype, strategy
        rng = as_generator(seed)

        shapes = {"q": (d_model, num_heads * d_k), "k": (kdim, hkv * d_k),
                  "v": (vdim, hkv * d_v), "o": (num_heads * d_v, d_model)}
        self.params = {}
        for name, (fan_in, fan_out) in shapes.items():
            self.params["W_" + name] = glorot_uniform(rng, fan_in, fan_out, dtype)
            if bias:
                self.params["b_" + name] = np.zeros(fan_out, dtype=dtype)
        self.grads = None
        self.cache = None
        self._self_attention = False

    def __repr__(self):
        return (f"MultiHeadAttention(d_model={self.d_model}, num_heads={self.num_heads},"
                f" num_kv_heads={self.num_kv_heads}, d_k={self.d_k}, d_v={self.d_v}, kdim={self.kdim},"
                f" vdim={self.vdim}, bias={self.bias}, dtype='{self.dtype}', strategy={self.strategy!r})")

    def parameter_count(self) -> int:
        """Number of scalars in ``params`` (``4 d_model^2 + 4 d_model`` for the default
        shapes with biases, whatever the head count)."""
        return sum(p.size for p in self.params.values() if p is not None)

    def forward(self, query, key=None, value=None, mask=None, head_mask=None):
        """Attend from ``query`` (..., n_q, d_model) to ``key``/``value`` (..., n_k, ...).

        Self-attention when ``key`` and ``value`` are omitted (``value`` defaults to
        ``key``). Returns the output (..., n_q, d_model) and keeps the cache for
        :meth:`backward`.
        """
        self_attention = key is None and value is None
        key = query if key is None else key
        value = key if value is None else value
        fwd, _ = _STRATEGIES[self.strategy]
        kwargs = {}
        if self.strategy == "parallel":
            kwargs = {"num_kv_heads": self.num_kv_heads, "head_mask": head_mask}
        elif head_mask is not None:
            raise ValueError("head_mask is supported by strategy='parallel' only")
        out, self.cache = fwd(query, key, value, self.params, self.num_heads, mask, **kwargs)
        self._self_attention = self_attention  # only once the forward has succeeded
        return out

    __call__ = forward

    def backward(self, dout):
        """Backpropagate ``dout`` through the last forward.

        Stores the parameter gradients in ``self.grads`` and returns the input gradient:
        ``dx = dquery + dkey + dvalue`` for self-attention (``forward(x)``), otherwise
        the tuple ``(dquery, dkey, dvalue)``.
        """
        if self.cache is None:
            raise RuntimeError("backward called before forward")
        _, bwd = _STRATEGIES[self.strategy]
        dquery, dkey, dvalue, self.grads = bwd(dout, self.cache)
        if self._self_attention:
            return dquery + dkey + dvalue
        return dquery, dkey, dvalue

    def decode_step(self, x_t, cache: KVCache):
        """One step of causal (autoregressive) decoding with a key/value cache.

        Projects the new tokens ``x_t`` (..., t, d_model), ``t >= 1`` (a prompt to prefill,
        or one token), to their queries, keys and values, appends the keys and values to
        ``cache`` and attends from each new query to every cached position and, causally,
        to the new ones before it. Feeding a sequence in any split gives the same outputs
        as one causal forward over it, while a one-token step costs O(T d) instead of
        recomputing O(T^2 d).

        Returns the output (..., t, d_model). Inference only: no backward.
        """
        x_t = check_new_tokens(x_t, cache)
        checked = check_multi_head_inputs(x_t, x_t, x_t, self.params, self.num_heads, num_kv_heads=self.num_kv_heads)
        return decode_attention_formula(checked.query, checked.params, checked.num_heads, checked.num_kv_heads,
                                cache)  # (..., t, d_model)
