"""Transformer decoder block: causal self-attention, cross-attention, feed-forward network.

Document 000 describes the decoder's masked self-attention (each position sees only
itself and the positions before it) and the encoder-decoder ("cross") attention, whose
queries come from the decoder and whose keys and values come from the encoder output
``memory``. One block, post-norm (``norm_first=False``, the original Transformer):

1. ``h1 = LN_1(x + CausalSelfAttention(x))``
2. ``h2 = LN_2(h1 + CrossAttention(h1, memory))``
3. ``y = LN_3(h2 + FFN(h2))``

Pre-norm (``norm_first=True``): ``h1 = x + CausalSelfAttention(LN_1(x))`` and so on;
``memory`` is used as given (a pre-norm encoder stack normalises its final output).

Parameters, in one flat dict: ``self_attn.*``, ``ln1.*``, ``cross_attn.*``, ``ln2.*``,
``ffn.*``, ``ln3.*`` (names as in :mod:`attention_ref.nn.encoder_block`).

Symbols: ``...`` batch axes, N target length, M memory (source) length, D model width,
Dm memory width, H heads.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._checks import as_generator
from .._checks import (
    as_mask,
    as_real_array,
    as_upstream,
    broadcast_batch,
    check_float_dtype,
    check_mask_shape,
    check_positive_int,
    require_ndim,
)
from ..core.masks import causal_mask
from .._pair_checks import PARAM_NAMES, check_multi_head_inputs
from ..variants.grouped_heads import multi_head_attention_backward_formula, multi_head_attention_formula
from .encoder_block import _check_block_options, _ffn_params, _ln_params, _self_attention_backward
from .feed_forward import FFN_PARAM_NAMES, feed_forward_backward_formula, feed_forward_forward
from .block_params import check_block_params, check_flag, in_group, join_grads, split_params
from .residual import ResidualCache, glorot_uniform, residual_backward_formula, residual_forward

__all__ = [
    "DECODER_GROUPS",
    "DecoderBlockCache",
    "TransformerDecoderBlock",
    "decoder_block_forward",
    "decoder_block_backward",
    "init_decoder_block_params",
]

_LN = ("gamma", "beta")
#: The parameter groups of a decoder block and the names each allows.
DECODER_GROUPS = {"self_attn": PARAM_NAMES, "ln1": _LN, "cross_attn": PARAM_NAMES, "ln2": _LN,
                  "ffn": FFN_PARAM_NAMES, "ln3": _LN}


class DecoderBlockCache(NamedTuple):
    """Nested caches of the three sub-layers."""

    self_attn: ResidualCache  # step 1
    cross_attn: ResidualCache  # step 2
    ffn: ResidualCache  # step 3
    param_keys: tuple

    @property
    def self_weights(self) -> np.ndarray:
        """Causal self-attention probabilities, (..., H, N, N)."""
        return self.self_attn.sublayer.weights

    @property
    def cross_weights(self) -> np.ndarray:
        """Cross-attention probabilities over the memory, (..., H, N, M)."""
        return self.cross_attn.sublayer.weights


def _cross_attention_backward(ds, attn_cache):
    """Sub-layer backward of cross-attention: the query path goes on; memory fed key and value."""
    dquery, dkey, dvalue, grads = multi_head_attention_backward_formula(ds, attn_cache)  # ds is internal: unchecked
    return dquery, (dkey + dvalue, grads)


def _self_mask(mask, scores_shape, causal):
    """The causal mask, combined with ``mask`` (AND for bool, -inf where causal blocks for float).

    ``mask`` is checked against the self-attention scores' shape (..., N, N) first, so a
    wrong length is reported as such rather than as a failed broadcast with the causal mask.
    """
    mask = as_mask(mask)
    check_mask_shape(mask, scores_shape, "mask")
    n = scores_shape[-1]
    if not causal:
        return mask
    allowed = causal_mask(n)  # (N, N)
    if mask is None:
        return allowed
    if mask.dtype.kind == "b":
        return allowed & mask
    return np.where(allowed, mask, -np.inf).astype(mask.dtype, copy=False)


def decoder_block_forward(x, memory, params, num_heads, mask=None, memory_mask=None,
                          norm_first=False, *, causal=True, activation="relu", eps=1e-5):
    """One Transformer decoder block.

    Parameters
    ----------
    x : array (..., n, d_model), the target sequence so far
    memory : array (..., m, d_memory), the encoder output
    params : flat dict with the keys of :data:`DECODER_GROUPS` as ``"group.name"``
    num_heads : int, used by both attention sub-layers
    mask : optional extra self-attention mask (e.g. padding), combined with the causal one
    memory_mask : optional cross-attention mask broadcastable to (..., n, m)
    norm_first : post-norm (False) or pre-norm (True)
    causal : apply the causal mask to the self-attention (True, the decoder's mask)
    activation, eps : as in :func:`attention_ref.encoder_block_forward`

    Returns
    -------
    y : array (..., n, d_model)
    cache : DecoderBlockCache (``self_weights``, ``cross_weights``)
    """
    num_heads = check_positive_int(num_heads, "num_heads")
    norm_first = check_flag(norm_first, "norm_first")
    causal = check_flag(causal, "causal")
    p = split_params(params, DECODER_GROUPS)
    x = as_real_array(x, "x")
    memory = as_real_array(memory, "memory")
    require_ndim(x, "x", 2, "(..., n, d_model)")
    require_ndim(memory, "memory", 2, "(..., m, d_memory)")
    p = check_block_params(p, x.shape[-1], ("ln1", "ln2", "ln3"),
                           {"self_attn": ("W_o", "b_o"), "cross_attn": ("W_o", "b_o"), "ffn": ("W_2", "b_2")})
    n, m = x.shape[-2], memory.shape[-2]
    batch = broadcast_batch([("x", x.shape[:-2]), ("memory", memory.shape[:-2])])
    self_mask = _self_mask(mask, x.shape[:-2] + (n, n), causal)  # (..., N, N)
    memory_mask = as_mask(memory_mask, "memory_mask")
    check_mask_shape(memory_mask, batch + (n, m), "memory_mask")

    def attention(group, query, key_value, group_mask):
        """Multi-head attention of one group; the masks were validated, and warned about, above."""
        checked = check_multi_head_inputs(query, key_value, key_value, p[group], num_heads, group_mask,
                                          warn_mask=False)
        return multi_head_attention_formula(checked, tuple(p[group]))

    def self_attention(z):
        return attention("self_attn", z, z, self_mask)

    def cross_attention(z):
        return attention("cross_attn", z, memory, memory_mask)

    def ffn(z):
        return feed_forward_forward(z, p["ffn"], activation)

    ln = {g: (p[g].get("gamma"), p[g].get("beta")) for g in ("ln1", "ln2", "ln3")}
    # 1. causal self-attention sub-layer
    h1, c1 = residual_forward(x, in_group("self_attn", self_attention), *ln["ln1"],
                              norm_first=norm_first, eps=eps)  # (..., N, D)
    # 2. cross-attention sub-layer (queries from h1, keys and values from memory)
    h2, c2 = residual_forward(h1, in_group("cross_attn", cross_attention), *ln["ln2"],
                              norm_first=norm_first, eps=eps)  # (..., N, D)
    # 3. feed-forward sub-layer
    y, c3 = residual_forward(h2, in_group("ffn", ffn), *ln["ln3"],
                             norm_first=norm_first, eps=eps)  # (..., N, D)
    return y, DecoderBlockCache(c1, c2, c3, tuple(params))


def decoder_block_backward(dout, cache: DecoderBlockCache):
    """Gradients of :func:`decoder_block_forward`, its three sub-layers in reverse.

    Parameters
    ----------
    dout : array (..., n, d_model), upstream gradient
    cache : DecoderBlockCache from the forward

    Returns
    -------
    dx : array (..., n, d_model)
    dmemory : array (..., m, d_memory), from the cross-attention's keys and values
    grads : flat dict with the keys of ``params``
    """
    dout = as_upstream(dout, cache.ffn.y_shape, cache.ffn.y_dtype)
    g = {}
    # 3. feed-forward sub-layer
    dh2, g["ffn"], dgamma, dbeta = residual_backward_formula(dout, cache.ffn, feed_forward_backward_formula)
    g["ln3"] = {"gamma": dgamma, "beta": dbeta}
    # 2. cross-attention sub-layer
    dh1, (dmemory, g["cross_attn"]), dgamma, dbeta = residual_backward_formula(dh2, cache.cross_attn,
                                                                      _cross_attention_backward)
    g["ln2"] = {"gamma": dgamma, "beta": dbeta}
    # 1. causal self-attention sub-layer
    dx, g["self_attn"], dgamma, dbeta = residual_backward_formula(dh1, cache.self_attn, _self_attention_backward)
    g["ln1"] = {"gamma": dgamma, "beta": dbeta}
    return dx, dmemory, join_grads(g, cache.param_keys)


def init_decoder_block_params(d_model, num_heads, d_ff=None, *, d_memory=None, seed=None,
                              dtype=np.float64):
    """Fresh decoder-block parameters (Glorot-uniform weights, zero biases, ``gamma = 1``,
    ``beta = 0``); ``d_memory`` (the encoder output width) defaults to ``d_model``."""
    d_model = check_positive_int(d_model, "d_model")
    num_heads = check_positive_int(num_heads, "num_heads")
    d_ff = 4 * d_model if d_ff is None else check_positive_int(d_ff, "d_ff")
    d_memory = d_model if d_memory is None else check_positive_int(d_memory, "d_memory")
    if d_model % num_heads:
        raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}")
    dtype = check_float_dtype(dtype)
    rng = as_generator(seed)
    p = {}
    for group, d_kv_in in (("self_attn", d_model), ("cross_attn", d_memory)):
        for name, fan_in in (("q", d_model), ("k", d_kv_in), ("v", d_kv_in), ("o", d_model)):
            p[f"{group}.W_{name}"] = glorot_uniform(rng, fan_in, d_model, dtype)
            p[f"{group}.b_{name}"] = np.zeros(d_model, dtype)
        p.update(_ln_params("ln1" if group == "self_attn" else "ln2", d_model, dtype))
    p.update(_ffn_params(rng, "ffn", d_model, d_ff, dtype))
    p.update(_ln_params("ln3", d_model, dtype))
    return p


class TransformerDecoderBlock:
    """A decoder block holding its parameters and the last forward's cache.

    Parameters as :class:`attention_ref.TransformerEncoderBlock`, plus ``d_memory`` (the
    encoder output width, default ``d_model``). ``forward(x, memory, mask=None,
    memory_mask=None)`` returns ``y``; ``backward(dout)`` stores ``self.grads`` and
    returns ``(dx, dmemory)``.
    """

    def __init__(self, d_model, num_heads, d_ff=None, *, d_memory=None, activation="relu",
                 norm_first=False, eps=1e-5, seed=None, dtype=np.float64):
        _check_block_options(activation, norm_first)
        self.params = init_decoder_block_params(d_model, num_heads, d_ff, d_memory=d_memory,
                                                seed=seed, dtype=dtype)
        self.d_model, self.d_ff = d_model, self.params["ffn.W_1"].shape[1]
        self.d_memory = self.params["cross_attn.W_k"].shape[0]
        self.num_heads, self.activation, self.norm_first, self.eps = num_heads, activation, norm_first, eps
        self.dtype = self.params["ffn.W_1"].dtype
        self.grads = None
        self.cache = None

    def __repr__(self):
        return (f"TransformerDecoderBlock(d_model={self.d_model}, num_heads={self.num_heads}, d_ff={self.d_ff},"
                f" d_memory={self.d_memory}, activation={self.activation!r}, norm_first={self.norm_first},"
                f" eps={self.eps}, dtype='{self.dtype}')")

    def forward(self, x, memory, mask=None, memory_mask=None):
        """Run the block on ``x`` (..., n, d_model) attending to ``memory`` (..., m, d_memory)."""
        y, self.cache = decoder_block_forward(x, memory, self.params, self.num_heads, mask,
                                              memory_mask, self.norm_first,
                                              activation=self.activation, eps=self.eps)
        return y

    __call__ = forward

    def backward(self, dout):
        """Store the parameter gradients in ``self.grads`` and return ``(dx, dmemory)``."""
        if self.cache is None:
            raise RuntimeError("backward called before forward")
        dx, dmemory, self.grads = decoder_block_backward(dout, self.cache)
        return dx, dmemory
