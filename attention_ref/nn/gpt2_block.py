"""GPT-2's decoder-only block: pre-norm, causal self-attention, a GELU (tanh) MLP, two residuals.

Symbols: ``...`` batch axes, N positions, D model width, H heads, F the MLP's hidden width.

Forward, numbered so the backward can walk it in reverse (nanoGPT's two lines
``x = x + attn(ln_1(x)); x = x + mlp(ln_2(x))``, one pair per step):

1. ``z = LN_1(x)``                                         (..., N, D)
2. ``a = Attn(z)``: causal multi-head self-attention, biases on the four projections
3. ``h = x + a``
4. ``u = LN_2(h)``
5. ``m = MLP(u) = gelu_tanh(u W_1 + b_1) W_2 + b_2``       (..., N, D)
6. ``y = h + m``

Parameter names (flat, ``group.name``) as the encoder block's: ``ln1.gamma``, ``ln1.beta``,
``self_attn.W_q`` ... ``.b_o``, ``ln2.gamma``, ``ln2.beta``, ``ffn.W_1``, ``.b_1``, ``.W_2``,
``.b_2``; :func:`attention_ref.interop.from_gpt2_block` maps transformers' ``GPT2Block``
weights onto them. The decode step (:func:`gpt2_block_decode_step`) runs the same steps on new
tokens against a :class:`KVCache`: :func:`gpt2_block_formula` with the cache as an argument, one
step list for both.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._checks import (as_real_array, as_upstream, cast, check_positive_int, check_positive_real, common_dtype,
                       require_ndim)
from .._pair_checks import check_multi_head_inputs, check_scale
from ..fast.dispatch import plain_multi_head_backward_formula
from ..variants.kv_cache import KVCache
from .encoder_block import ENCODER_GROUPS, init_encoder_block_params
from .feed_forward import FeedForwardCache, feed_forward_backward_formula, check_ffn_inputs, feed_forward_formula
from .layer_norm import LayerNormCache, layer_norm_backward_formula, layer_norm_formula
from ..variants.kv_cache import check_decode_mask, check_new_tokens
from .multi_head_attention import causal_self_attention_formula, check_block_mask
from .block_params import check_block_params, split_params

__all__ = ["GPT2BlockCache", "gpt2_block_forward", "gpt2_block_backward", "gpt2_block_decode_step", "init_gpt2_block_params"]


class GPT2BlockCache(NamedTuple):
    """Nested caches of the six steps."""

    ln1: LayerNormCache  # step 1
    attn: object  # step 2, MultiHeadCache (GroupedMultiHeadCache never: GPT-2 has H key/value heads)
    ln2: LayerNormCache  # step 4
    mlp: FeedForwardCache  # step 5
    param_keys: tuple
    y_shape: tuple
    y_dtype: np.dtype

    @property
    def weights(self) -> np.ndarray:
        """Self-attention probabilities of every head, (..., H, N, N)."""
        return self.attn.weights


def gpt2_block_forward(x, params, num_heads, *, eps=1e-5, mask=None, scale=None):
    """One GPT-2 block on ``x`` (..., n, d_model); positions start at 0.

    Parameters
    ----------
    x : array (..., n, d_model)
    params : flat dict ``ln1.gamma, ln1.beta, self_attn.W_q, .b_q, ..., .W_o, .b_o, ln2.gamma,
        ln2.beta, ffn.W_1, .b_1, .W_2, .b_2`` (see :func:`init_gpt2_block_params`; the biases
        may be absent)
    num_heads : int
    eps : the layer norms' epsilon (GPT-2's ``layer_norm_epsilon``, 1e-5)
    mask : optional extra mask (bool, True = may attend, e.g. padding; or float, added),
        broadcastable to (..., n, n), combined with the causal one
    scale : the attention scores' factor; None is ``1/sqrt(d_head)``; GPT-2's
        ``scale_attn_weights=False`` is ``scale=1.0`` and ``scale_attn_by_inverse_layer_idx``
        multiplies it by ``1 / (layer_idx + 1)``

    Returns
    -------
    y : array (..., n, d_model)
    cache : GPT2BlockCache (``cache.weights``: the attention probabilities)
    """
    x = as_real_array(x, "x")
    require_ndim(x, "x", 2, "(..., n, d_model)")
    num_heads = check_positive_int(num_heads, "num_heads")
    scale = check_scale(scale)
    x, p = check_gpt2_block_params(x, params, num_heads)
    eps = check_positive_real(eps, "eps")
    mask = check_block_mask(mask, x)
    return gpt2_block_formula(x, p, num_heads, eps=eps, mask=mask, scale=scale, param_keys=tuple(params))


def gpt2_block_formula(x, p, num_heads, *, eps, mask, scale, param_keys, kv: KVCache | None = None):
    """:func:`gpt2_block_forward` on checked inputs (``p`` grouped as
    :func:`check_gpt2_block_params` returns it, ``mask`` None or checked; whole models call it
    on weights they checked once). ``param_keys`` names the gradients of the backward.

    The same six steps serve decoding: with ``kv`` this layer's :class:`KVCache`, ``x`` holds the
    t new tokens after the cached ones, step 2 attends to the cached keys too, ``mask`` is as
    :func:`check_decode_mask` gives it, and the cache returned is None (:func:`gpt2_block_decode_step`)."""
    ln1, attn, ln2, ffn = p["ln1"], p["self_attn"], p["ln2"], p["ffn"]
    # 1. z = LN_1(x)
    z, ln1_cache = layer_norm_formula(x, ln1["gamma"], ln1["beta"], eps)  # (..., N, D)
    # 2. a = Attn(z), causal (and the extra mask); decoding: against the cached keys too
    a, attn_cache = causal_self_attention_formula(z, attn, num_heads, num_heads, mask=mask, kv=kv,
                                                  scale=scale)  # (..., N, D)
    # 3. h = x + a
    hidden = x + a  # (..., N, D)
    # 4. u = LN_2(h)
    u, ln2_cache = layer_norm_formula(hidden, ln2["gamma"], ln2["beta"], eps)  # (..., N, D)
    # 5. m = MLP(u)
    m, mlp_cache = feed_forward_formula(u, ffn["W_1"], ffn.get("b_1"), ffn["W_2"], ffn.get("b_2"), "gelu",
                                        tuple(ffn))  # (..., N, D)
    # 6. y = h + m
    y = hidden + m  # (..., N, D)
    if kv is not None:
        return y, None
    return y, GPT2BlockCache(ln1_cache, attn_cache, ln2_cache, mlp_cache, tuple(param_keys), y.shape, y.dtype)


def gpt2_block_backward(dout, cache: GPT2BlockCache):
    """Gradients of :func:`gpt2_block_forward`, its six steps in reverse.

    Returns
    -------
    dx : array (..., n, d_model)
    grads : dict keyed like params (None for a bias given as None)
    """
    dy = as_upstream(dout, cache.y_shape, cache.y_dtype, "dout")
    g = {}
    # 6. y = h + m: the residual passes dy to both
    # 5. m = MLP(u)
    du, ffn_grads = feed_forward_backward_formula(dy, cache.mlp)  # (..., N, D)
    g.update({f"ffn.{name}": grad for name, grad in ffn_grads.items()})
    # 4. u = LN_2(h)
    dh_norm, g["ln2.gamma"], g["ln2.beta"] = layer_norm_backward_formula(du, cache.ln2)
    dh = dy + dh_norm  # (..., N, D)
    # 3. h = x + a: the residual passes dh to both
    # 2. a = Attn(z): z fed the query, the key and the value, so dz sums the three
    dquery, dkey, dvalue, attn_grads = plain_multi_head_backward_formula(dh, cache.attn)
    dz = dquery + dkey + dvalue  # (..., N, D)
    g.update({f"self_attn.{name}": grad for name, grad in attn_grads.items()})
    # 1. z = LN_1(x)
    dx_norm, g["ln1.gamma"], g["ln1.beta"] = layer_norm_backward_formula(dz, cache.ln1)
    dx = dh + dx_norm  # (..., N, D)
    return dx, {name: g.get(name) for name in cache.param_keys}


def gpt2_block_decode_step(x_t, params, num_heads, cache: KVCache, *, eps=1e-5, scale=None, mask=None):
    """Decode with a key/value cache: the block's output for the new tokens ``x_t`` (..., t, d_model).

    ``t >= 1`` new tokens (a prompt to prefill, or one token) attend to the ``cache.length``
    cached ones and causally among themselves; their keys and values are appended to
    ``cache``, which must be this layer's own (a :class:`KVCache` filled by another layer is
    refused). Feeding a sequence in any split gives the rows of :func:`gpt2_block_forward`
    over the whole of it. GPT-2's positions are not the block's business: add
    ``wpe[positions]`` to the tokens before the first block. Inference only: no backward.

    Parameters
    ----------
    x_t : array (..., t, d_model), the new tokens
    params, num_heads, eps, scale : as :func:`gpt2_block_forward`
    cache : KVCache of this layer, (..., H, T, d_head) after T tokens
    mask : optional extra mask of the new tokens against every key after this step,
        broadcastable to (..., t, T + t) (bool, True = may attend; or float, added), combined
        with the causal one: e.g. ``attention_mask[:, None, :]`` to hide left padding

    Returns
    -------
    y_t : array (..., t, d_model)
    """
    x_t = check_new_tokens(x_t, cache)
    num_heads = check_positive_int(num_heads, "num_heads")
    scale = check_scale(scale)
    x_t, p = check_gpt2_block_params(x_t, params, num_heads)
    eps = check_positive_real(eps, "eps")
    mask = check_decode_mask(mask, x_t, cache, x_t.dtype)
    return gpt2_block_formula(x_t, p, num_heads, eps=eps, mask=mask, scale=scale, param_keys=tuple(params),
                              kv=cache)[0]


def check_gpt2_block_params(x, params, num_heads):
    """The block's flat ``params`` against ``x`` (..., n, d_model): every array real and finite,
    of matching shapes, cast with ``x`` to their common dtype. Returns ``(x, p)``, ``p`` grouped
    as ``p["ln1"]["gamma"]``, ``p["self_attn"]["W_q"]``, ``p["ffn"]["W_1"]`` ..."""
    p = check_block_params(split_params(params, ENCODER_GROUPS), x.shape[-1], ("ln1", "ln2"),
                           {"self_attn": ("W_o", "b_o"), "ffn": ("W_2", "b_2")})
    p["self_attn"] = check_multi_head_inputs(x, x, x, p["self_attn"], num_heads).params
    _, *ffn = check_ffn_inputs(x, p["ffn"], "gelu")
    p["ffn"] = {name: a for name, a in zip(("W_1", "b_1", "W_2", "b_2"), ffn) if a is not None}
    dtype = common_dtype(x, *(a for group in p.values() for a in group.values()))
    return cast(x, dtype), {g: {n: cast(a, dtype) for n, a in group.items()} for g, group in p.items()}


def init_gpt2_block_params(d_model, num_heads, d_ff=None, *, seed=None, dtype=np.float64):
    """GPT-2's shapes (``d_ff = 4 d_model``), initialised as the encoder block's."""
    return init_encoder_block_params(d_model, num_heads, 4 * d_model if d_ff is None else d_ff,
                                     seed=seed, dtype=dtype)
