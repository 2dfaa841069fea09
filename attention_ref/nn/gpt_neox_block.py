"""GPT-NeoX's (Pythia's) decoder block: two layer norms with biases, causal self-attention with a
fused per-head QKV projection and partial rotary positions, an exact-GELU MLP, and a parallel
(or, with ``parallel=False``, sequential) residual.

Symbols: ``...`` batch axes, N positions, D model width, H heads, Dh = D / H head width, r the
rotated width of each head (``int(Dh * rotary_pct)``), F the MLP's hidden width.

Forward, numbered so the backward can walk it in reverse:

1. ``z_1 = LN_1(x)``                                           (..., N, D)
2. ``a = Attn(z_1)``: ``(W_q, W_k, W_v) = split(W_qkv)`` and ``(b_q, b_k, b_v) = split(b_qkv)``
   (the per-head layout ``[q_0 k_0 v_0 q_1 ...]``, :mod:`attention_ref.nn.fused_qkv`), ``q = z_1 W_q + b_q``
   ..., split into heads, RoPE on the first r features of each head's q and k (rotate-half within
   them, :mod:`attention_ref.nn.partial_rotary`), causal attention, merge, ``W_dense``, ``b_dense``
3. parallel: ``z_2 = LN_2(x)``;  sequential: ``h = x + a``, ``z_2 = LN_2(h)``
4. ``m = gelu(z_2 W_1 + b_1) W_2 + b_2`` (the exact, erf GELU)
5. parallel: ``y = x + a + m``;  sequential: ``y = h + m``

With the parallel residual the five steps are the pair :func:`attention_ref.nn.parallel_residual.
parallel_residual_formula` (its 1. both norms of ``x``, 2. ``Attn`` and ``MLP``, 3. ``y = x + a + m``)
given this block's attention and MLP, and its backward :func:`parallel_residual_backward_formula`.
Decoding runs the same five steps (:func:`gpt_neox_block_formula` with a :class:`KVCache`).

Backward, in reverse: ``dy`` reaches ``m`` (and ``a`` and ``x`` directly when parallel); the MLP's
backward gives ``dz_2``; LN_2's backward adds to ``dx`` (parallel) or to ``dh = dy + LN_2'(dz_2)``
(sequential), which also feeds the attention; the attention's backward gives ``dz_1`` and the
gradients of the split weights, put back in the fused order (the inverse permutation:
``dW_qkv = join(dW_q, dW_k, dW_v)``, ``db_qkv`` likewise); LN_1's backward adds the last path to ``dx``.

Parameter names (flat, ``group.name``): :data:`GPT_NEOX_PARAM_NAMES` (transformers'
``input_layernorm``, ``attention.query_key_value``, ``attention.dense``, ``post_attention_layernorm``,
``mlp.dense_h_to_4h``, ``mlp.dense_4h_to_h``; the weights transposed to (in, out)).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._checks import as_generator
from .._checks import (as_real_array, as_upstream, cast, check_positive_int, check_positive_real, common_dtype,
                       require_ndim)
from ..variants.grouped_heads import GroupedMultiHeadCache
from ..variants.grouped_heads import multi_head_attention_backward_formula
from ..variants.kv_cache import KVCache, check_decode_mask, check_decode_positions, check_new_tokens
from .feed_forward import FeedForwardCache, feed_forward_backward_formula, feed_forward_formula
from .fused_qkv import FusedQKVCache, fused_qkv_split_backward_formula, fused_qkv_split_formula
from .layer_norm import LayerNormCache, layer_norm_backward_formula, layer_norm_formula
from .multi_head_attention import causal_self_attention_formula, check_block_mask
from .parallel_residual import ParallelResidualCache, parallel_residual_backward_formula, parallel_residual_formula
from .partial_rotary import PartialRotaryHalf
from .rope_scaling import rope_frequencies

__all__ = ["GPT_NEOX_PARAM_NAMES", "GPTNeoXBlockCache", "PartialRotaryHalf", "gpt_neox_block_forward",
           "gpt_neox_block_backward", "gpt_neox_block_decode_step", "init_gpt_neox_block_params",
           "gpt_neox_attention_params"]

GPT_NEOX_PARAM_NAMES = ("input_layernorm.gamma", "input_layernorm.beta", "attention.W_qkv", "attention.b_qkv",
                        "attention.W_dense", "attention.b_dense", "post_attention_layernorm.gamma",
                        "post_attention_layernorm.beta", "mlp.W_1", "mlp.b_1", "mlp.W_2", "mlp.b_2")
_ATTN_KEYS = ("W_q", "W_k", "W_v", "W_o", "b_q", "b_k", "b_v", "b_o")


class GPTNeoXBlockCache(NamedTuple):
    """Nested caches of the five steps."""

    norm1: LayerNormCache  # step 1
    qkv_split: FusedQKVCache  # step 2, W_qkv's split (b_qkv's is the same with no leading axis)
    bias_split: FusedQKVCache  # step 2, b_qkv's
    attn: GroupedMultiHeadCache  # step 2
    norm2: LayerNormCache  # step 3
    mlp: FeedForwardCache  # step 4
    parallel: bool
    y_shape: tuple
    y_dtype: np.dtype

    @property
    def weights(self) -> np.ndarray:
        """Self-attention probabilities of every head, (..., H, N, N)."""
        return self.attn.weights


def gpt_neox_attention_params(p, num_heads):
    """The attention's weights under the multi-head layer's names: ``W_qkv`` and ``b_qkv`` split
    (per-head layout) into ``W_q, W_k, W_v`` (D, D) and ``b_q, b_k, b_v`` (D,), ``W_o = W_dense``,
    ``b_o = b_dense``; and the two splits' caches (for the backward)."""
    (W_q, W_k, W_v), w_split = fused_qkv_split_formula(p["attention.W_qkv"], num_heads, num_heads, "per_head")
    (b_q, b_k, b_v), b_split = fused_qkv_split_formula(p["attention.b_qkv"], num_heads, num_heads, "per_head")
    attn = dict(zip(_ATTN_KEYS, (W_q, W_k, W_v, p["attention.W_dense"], b_q, b_k, b_v, p["attention.b_dense"])))
    return attn, w_split, b_split


def check_gpt_neox_block_params(x, params, num_heads):
    """The block's flat ``params`` against ``x`` (..., n, d_model): exactly the keys of
    :data:`GPT_NEOX_PARAM_NAMES`, every array real and finite, of GPT-NeoX's shapes, cast with ``x``
    to their common dtype. Returns ``(x, p)``."""
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict with keys {GPT_NEOX_PARAM_NAMES}, got {type(params).__name__}")
    missing = [n for n in GPT_NEOX_PARAM_NAMES if params.get(n) is None]
    unknown = sorted(set(params) - set(GPT_NEOX_PARAM_NAMES))
    if missing or unknown:
        raise ValueError(f"params must have the keys {GPT_NEOX_PARAM_NAMES}; missing {missing}, unknown {unknown}")
    D = x.shape[-1]
    if D % num_heads:
        raise ValueError(f"x's width d_model = {D} must be a multiple of num_heads = {num_heads} (x has shape {x.shape})")
    F = np.shape(params["mlp.W_1"])[-1] if np.ndim(params["mlp.W_1"]) == 2 else -1
    shapes = {"input_layernorm.gamma": (D,), "input_layernorm.beta": (D,), "attention.W_qkv": (D, 3 * D),
              "attention.b_qkv": (3 * D,), "attention.W_dense": (D, D), "attention.b_dense": (D,),
              "post_attention_layernorm.gamma": (D,), "post_attention_layernorm.beta": (D,),
              "mlp.W_1": (D, F), "mlp.b_1": (F,), "mlp.W_2": (F, D), "mlp.b_2": (D,)}
    p = {}
    for name, shape in shapes.items():
        if np.shape(params[name]) != shape or F < 1:
            raise ValueError(f"params['{name}'] must have shape {shape} for x of width d_model = {D} and the MLP's"
                             f" width F = {F} (mlp.W_1's columns), got shape {np.shape(params[name])}")
        p[name] = as_real_array(params[name], f"params['{name}']")
    dtype = common_dtype(x, *p.values())
    return cast(x, dtype), {name: cast(a, dtype) for name, a in p.items()}


def _check_common(x, params, num_heads, rotary_pct, rope_base, eps):
    """The arguments every entry shares; returns ``(x, p, num_heads, theta, eps)``."""
    num_heads = check_positive_int(num_heads, "num_heads")
    x, p = check_gpt_neox_block_params(x, params, num_heads)
    eps, rope_base = check_positive_real(eps, "eps"), check_positive_real(rope_base, "rope_base")
    rotary_pct = check_positive_real(rotary_pct, "rotary_pct")
    d_head = x.shape[-1] // num_heads
    r = int(d_head * rotary_pct)
    if rotary_pct > 1 or r < 2 or r % 2:
        raise ValueError(f"rotary_pct = {rotary_pct} rotates int({d_head} * {rotary_pct}) = {r} features of each"
                         f" head of width {d_head}; it must be an even number from 2 to {d_head}")
    return x, p, num_heads, rope_frequencies(r, rope_base), eps


def gpt_neox_block_forward(x, params, num_heads, *, rotary_pct=0.25, rope_base=10000.0, eps=1e-5, mask=None,
                           parallel=True):
    """One GPT-NeoX decoder block on ``x`` (..., n, d_model); positions start at 0.

    Parameters
    ----------
    x : array (..., n, d_model)
    params : flat dict with the keys of :data:`GPT_NEOX_PARAM_NAMES`
    num_heads : int, H (GPT-NeoX has as many key/value heads)
    rotary_pct : the rotated fraction of each head's features (``r = int(Dh * rotary_pct)``, even)
    rope_base : RoPE's base (``rotary_emb_base``; 5.x: ``rope_parameters["rope_theta"]``)
    eps : the layer norms' epsilon (``layer_norm_eps``)
    mask : optional extra mask (bool, True = may attend; or float, added), broadcastable to
        (..., n, n), combined with the causal one
    parallel : ``use_parallel_residual`` (True: ``y = x + a + m``; False: ``h = x + a``, ``y = h + m(h)``)

    Returns
    -------
    y : array (..., n, d_model)
    cache : GPTNeoXBlockCache for :func:`gpt_neox_block_backward`
    """
    x = as_real_array(x, "x")
    require_ndim(x, "x", 2, "(..., n, d_model)")
    x, p, num_heads, theta, eps = _check_common(x, params, num_heads, rotary_pct, rope_base, eps)
    if not isinstance(parallel, (bool, np.bool_)):
        raise TypeError(f"parallel must be True or False, got {parallel!r}")
    mask = check_block_mask(mask, x)
    return gpt_neox_block_formula(x, p, num_heads, eps=eps, mask=mask, theta=theta, parallel=bool(parallel))


def gpt_neox_block_formula(x, p, num_heads, *, eps, mask, theta, parallel, kv: KVCache | None = None,
                           positions=None, split=None):
    """:func:`gpt_neox_block_forward` on checked inputs (``p`` as :func:`check_gpt_neox_block_params`
    returns it, ``mask`` None or checked, ``theta`` the rotated features' frequencies (r/2,);
    ``split`` what :func:`gpt_neox_attention_params` returns for ``p``, when made once per model).

    The same five steps serve decoding: with ``kv`` this layer's :class:`KVCache`, ``x`` holds the
    t new tokens at ``positions`` (..., t) (default ``T .. T + t - 1``), step 2 attends to the
    cached keys too, ``mask`` is as :func:`check_decode_mask` gives it, and the cache returned is
    None (:func:`gpt_neox_block_decode_step`)."""
    ln_1 = p["input_layernorm.gamma"], p["input_layernorm.beta"]
    ln_2 = p["post_attention_layernorm.gamma"], p["post_attention_layernorm.beta"]
    attn_params, qkv_split, bias_split = gpt_neox_attention_params(p, num_heads) if split is None else split
    if positions is None:
        positions = np.arange(x.shape[-2]) if kv is None else np.arange(kv.length, kv.length + x.shape[-2])
    at = positions if kv is None else positions[..., None, :]  # (N,), or (..., 1, t): the same for every head

    def attend(z1):  # 2. a = Attn(z_1): the fused weights split per head, partial rotary, causal
        return causal_self_attention_formula(z1, attn_params, num_heads, num_heads, mask=mask, kv=kv,
                                             rotary=PartialRotaryHalf(at, at, theta), param_keys=_ATTN_KEYS,
                                             name="z_1")  # (..., N, D)

    def mlp(z2):  # 4. m = MLP(z_2), exact GELU
        return feed_forward_formula(z2, p["mlp.W_1"], p["mlp.b_1"], p["mlp.W_2"], p["mlp.b_2"], "gelu_exact",
                                    ("W_1", "b_1", "W_2", "b_2"))  # (..., N, D)

    if parallel:  # 1.-5. y = x + Attn(LN_1(x)) + MLP(LN_2(x)): the parallel residual pair
        y, steps = parallel_residual_formula(x, attend, mlp, *ln_1, *ln_2, eps)  # (..., N, D)
        if kv is not None:
            return y, None
        return y, GPTNeoXBlockCache(steps.norm_1, qkv_split, bias_split, steps.sublayer_1, steps.norm_2,
                                    steps.sublayer_2, True, y.shape, y.dtype)
    # 1. z_1 = LN_1(x)
    z1, norm1 = layer_norm_formula(x, *ln_1, eps)  # (..., N, D)
    # 2. a = Attn(z_1)
    a, attn = attend(z1)  # (..., N, D)
    # 3. z_2 = LN_2(h), h = x + a
    hidden = x + a  # (..., N, D)
    z2, norm2 = layer_norm_formula(hidden, *ln_2, eps)  # (..., N, D)
    # 4. m = MLP(z_2)
    m, mlp_cache = mlp(z2)  # (..., N, D)
    # 5. y = h + m
    y = hidden + m  # (..., N, D)
    if kv is not None:
        return y, None
    return y, GPTNeoXBlockCache(norm1, qkv_split, bias_split, attn, norm2, mlp_cache, False, y.shape, y.dtype)


def _attention_backward(da, attn_cache):
    """Step 2 back: ``dz_1`` (z_1 fed the query, the key and the value: the three summed) and the
    split weights' gradients."""
    dquery, dkey, dvalue, attn_grads = multi_head_attention_backward_formula(da, attn_cache)
    return dquery + dkey + dvalue, attn_grads  # (..., N, D)


def gpt_neox_block_backward(dout, cache: GPTNeoXBlockCache):
    """Gradients of :func:`gpt_neox_block_forward`, its five steps in reverse.

    Returns
    -------
    dx : array (..., n, d_model)
    grads : dict with the keys of :data:`GPT_NEOX_PARAM_NAMES`
    """
    dy = as_upstream(dout, cache.y_shape, cache.y_dtype, "dout")
    g = {}
    if cache.parallel:  # 5.-1. the parallel residual pair's backward: dx = dy + LN_1'(dz_1) + LN_2'(dz_2)
        steps = ParallelResidualCache(cache.norm1, cache.norm2, cache.attn, cache.mlp, cache.y_shape, cache.y_dtype)
        dx, attn_grads, mlp_grads, *norm_grads = parallel_residual_backward_formula(
            dy, steps, _attention_backward, feed_forward_backward_formula)  # (..., N, D)
        (g["input_layernorm.gamma"], g["input_layernorm.beta"], g["post_attention_layernorm.gamma"],
         g["post_attention_layernorm.beta"]) = norm_grads
    else:
        # 5. y = h + m: dy reaches m and h unchanged
        # 4. m = MLP(z_2)
        dz2, mlp_grads = feed_forward_backward_formula(dy, cache.mlp)  # (..., N, D)
        # 3. z_2 = LN_2(h), h = x + a: dh = dy + LN_2'(dz_2) reaches a and x
        dnorm2, g["post_attention_layernorm.gamma"], g["post_attention_layernorm.beta"] = layer_norm_backward_formula(
            dz2, cache.norm2)  # (..., N, D)
        dh = dy + dnorm2  # (..., N, D)
        # 2. a = Attn(z_1)
        dz1, attn_grads = _attention_backward(dh, cache.attn)  # (..., N, D)
        # 1. z_1 = LN_1(x)
        dnorm1, g["input_layernorm.gamma"], g["input_layernorm.beta"] = layer_norm_backward_formula(dz1, cache.norm1)
        dx = dh + dnorm1  # (..., N, D): both paths from x summed
    g.update({f"mlp.{name}": grad for name, grad in mlp_grads.items()})
    # 2. the split weights' gradients back in the fused per-head order
    g["attention.W_qkv"] = fused_qkv_split_backward_formula((attn_grads["W_q"], attn_grads["W_k"], attn_grads["W_v"]),
                                                     cache.qkv_split)  # (D, 3 D)
    g["attention.b_qkv"] = fused_qkv_split_backward_formula((attn_grads["b_q"], attn_grads["b_k"], attn_grads["b_v"]),
                                                     cache.bias_split)  # (3 D,)
    g["attention.W_dense"], g["attention.b_dense"] = attn_grads["W_o"], attn_grads["b_o"]
    return dx, {name: g[name] for name in GPT_NEOX_PARAM_NAMES}


def gpt_neox_block_decode_step(x_t, params, num_heads, cache: KVCache, *, rotary_pct=0.25, rope_base=10000.0,
                               eps=1e-5, mask=None, positions=None, parallel=True):
    """Decode with a key/value cache: the block's output for the new tokens ``x_t`` (..., t, d_model).

    The new tokens sit at ``positions`` (default ``T .. T + t - 1``, ``T = cache.length``); their
    rotated keys and their values are appended to ``cache`` (this layer's own); they attend to
    every cached token and causally among themselves, so feeding a sequence in any split gives
    the rows of :func:`gpt_neox_block_forward` over the whole of it. Inference only: no backward.

    Parameters
    ----------
    x_t : array (..., t, d_model)
    params, num_heads, rotary_pct, rope_base, eps, parallel : as :func:`gpt_neox_block_forward`
    cache : KVCache of this layer
    mask : optional extra mask broadcastable to (..., t, T + t) (e.g. left padding)
    positions : optional integer positions broadcastable to (..., t)

    Returns
    -------
    y_t : array (..., t, d_model)
    """
    x_t = check_new_tokens(x_t, cache)
    x_t, p, num_heads, theta, eps = _check_common(x_t, params, num_heads, rotary_pct, rope_base, eps)
    if not isinstance(parallel, (bool, np.bool_)):
        raise TypeError(f"parallel must be True or False, got {parallel!r}")
    mask = check_decode_mask(mask, x_t, cache, x_t.dtype)
    if positions is None:
        positions = np.arange(cache.length, cache.length + x_t.shape[-2])  # (t,)
    positions = check_decode_positions(positions, x_t)
    return gpt_neox_block_formula(x_t, p, num_heads, eps=eps, mask=mask, theta=theta, parallel=bool(parallel), kv=cache,
                                  positions=positions)[0]


def init_gpt_neox_block_params(d_model, num_heads, d_ff=None, *, seed=None, dtype=np.float64):
    """Random weights of GPT-NeoX's shapes (normal, std 0.02; norms' gains at 1, biases at 0;
    ``d_ff`` default ``4 d_model``)."""
    d_ff = 4 * d_model if d_ff is None else d_ff
    rng = as_generator(seed)
    shapes = {"attention.W_qkv": (d_model, 3 * d_model), "attention.W_dense": (d_model, d_model),
              "mlp.W_1": (d_model, d_ff), "mlp.W_2": (d_ff, d_model)}
    params = {name: (0.02 * rng.standard_normal(shape)).astype(dtype) for name, shape in shapes.items()}
    for norm in ("input_layernorm", "post_attention_layernorm"):
        params[f"{norm}.gamma"], params[f"{norm}.beta"] = np.ones(d_model, dtype), np.zeros(d_model, dtype)
    for name, width in (("attention.b_qkv", 3 * d_model), ("attention.b_dense", d_model), ("mlp.b_1", d_ff),
                        ("mlp.b_2", d_model)):
        params[name] = np.zeros(width, dtype)
    return {name: params[name] for name in GPT_NEOX_PARAM_NAMES}
