"""Llama's decoder block: RMSNorm, causal self-attention with rotate-half RoPE and grouped-query
heads, RMSNorm, SwiGLU, two residuals, no biases.

Symbols: ``...`` batch axes, N positions, D model width, H query heads, Hkv key/value heads,
Dh head width, F the MLP's hidden width.

Forward, numbered so the backward can walk it in reverse:

1. ``z = RMSNorm_1(x)``                                    (..., N, D)
2. ``a = Attn(z)``: ``q = z W_q``, ``k = z W_k``, ``v = z W_v``, split into heads, RoPE
   (``layout="half"``) on q and k at positions 0..N-1, causal attention with each
   key/value head shared by H / Hkv query heads, merge, ``W_o``        (..., N, D)
3. ``h = x + a``
4. ``u = RMSNorm_2(h)``
5. ``m = SwiGLU(u) = (silu(u W_gate) * (u W_up)) W_down``
6. ``y = h + m``

Decoding runs the same six steps (:func:`llama_block_formula` with a :class:`KVCache`, as
tinygrad's one ``__call__``): step 2 then attends from the new tokens to the cached keys too.

Parameter names (flat, ``group.name``): ``input_norm.weight``, ``self_attn.W_q``, ``.W_k``,
``.W_v``, ``.W_o``, ``post_attention_norm.weight``, ``mlp.W_gate``, ``.W_up``, ``.W_down``, and
for Qwen2 ``self_attn.b_q``, ``.b_k``, ``.b_v`` (``q = z W_q + b_q`` ...; their gradients are the
projections' bias gradients, ``db_q = sum over positions of dq``), and for Qwen3
``self_attn.q_norm.weight``, ``.k_norm.weight`` (:class:`QKNormRotary`)
(transformers' ``input_layernorm``, ``self_attn.q_proj`` ..., ``post_attention_layernorm``,
``mlp.gate_proj`` ...; :func:`attention_ref.interop.from_llama_block` maps them, transposed).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._checks import as_generator
from .._checks import (as_real_array, as_upstream, cast, check_positive_int,
                       check_positive_real, common_dtype, require_ndim)
from .._pair_checks import check_scale
from .._pair_checks import check_multi_head_inputs
from ..variants.grouped_heads import GroupedMultiHeadCache
from ..variants.grouped_heads import multi_head_attention_backward_formula
from ..variants.kv_cache import KVCache, check_decode_mask, check_decode_positions, check_new_tokens
from ..variants.rope import RotaryHalf  # noqa: F401 (0.3's path)
from .multi_head_attention import causal_self_attention_formula, check_block_mask
from .rope_scaling import rope_frequencies
from .rms_norm import QKNormRotary, RMSNormCache, rms_norm_backward_formula, rms_norm_formula, rms_norm_forward
from .swiglu import SwiGLUCache, swiglu_backward_formula, check_swiglu_inputs, swiglu_formula, swiglu_forward

__all__ = ["LLAMA_PARAM_NAMES", "QKV_BIAS_NAMES", "QK_NORM_NAMES", "LlamaBlockCache", "RotaryHalf", "QKNormRotary", "llama_block_forward", "llama_block_backward",
           "llama_block_decode_step", "init_llama_block_params"]

LLAMA_PARAM_NAMES = ("input_norm.weight", "self_attn.W_q", "self_attn.W_k", "self_attn.W_v", "self_attn.W_o",
                     "post_attention_norm.weight", "mlp.W_gate", "mlp.W_up", "mlp.W_down")
#: Qwen2's biases on the q, k and v projections (optional: all three or none; no bias on W_o)
QKV_BIAS_NAMES = ("self_attn.b_q", "self_attn.b_k", "self_attn.b_v")
#: Qwen3's RMSNorm weights (Dh,) over each head's query and key, before RoPE (optional: both or none)
QK_NORM_NAMES = ("self_attn.q_norm.weight", "self_attn.k_norm.weight")
_OPTIONAL_NAMES = QKV_BIAS_NAMES + QK_NORM_NAMES


def _with_qk_norm(rotary, p, eps):
    """``rotary``, or Qwen3's q/k norms then ``rotary`` when ``p`` has their weights."""
    if "self_attn.q_norm.weight" not in p:
        return rotary
    return QKNormRotary(rotary, p["self_attn.q_norm.weight"], p["self_attn.k_norm.weight"], eps)


class LlamaBlockCache(NamedTuple):
    """Nested caches of the six steps."""

    norm1: RMSNormCache  # step 1
    attn: GroupedMultiHeadCache  # step 2
    norm2: RMSNormCache  # step 4
    mlp: SwiGLUCache  # step 5
    y_shape: tuple
    y_dtype: np.dtype

    @property
    def weights(self) -> np.ndarray:
        """Self-attention probabilities of every head, (..., H, N, N)."""
        return self.attn.weights


def _check_llama_params(params, d_model):
    """``params`` has exactly the Llama block's keys (and Qwen2's three biases, all or none); the
    norms' weights are (d_model,)."""
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict with keys {LLAMA_PARAM_NAMES}, got {type(params).__name__}")
    missing = [n for n in LLAMA_PARAM_NAMES if params.get(n) is None]
    unknown = sorted(set(params) - set(LLAMA_PARAM_NAMES) - set(_OPTIONAL_NAMES))
    if missing or unknown:
        raise ValueError(f"params must have the keys {LLAMA_PARAM_NAMES}; missing {missing}, unknown {unknown}")
    biases = [n for n in QKV_BIAS_NAMES if params.get(n) is not None]
    if biases and len(biases) != len(QKV_BIAS_NAMES):
        raise ValueError(f"params must have all of {QKV_BIAS_NAMES} (Qwen2) or none; got only {biases}")
    norms = [n for n in QK_NORM_NAMES if params.get(n) is not None]
    if norms and len(norms) != len(QK_NORM_NAMES):
        raise ValueError(f"params must have both of {QK_NORM_NAMES} (Qwen3) or neither; got only {norms}")
    for n in ("input_norm.weight", "post_attention_norm.weight"):
        if np.shape(params[n]) != (d_model,):
            raise ValueError(f"params['{n}'] must have shape ({d_model},) to match x of width d_model = {d_model},"
                             f" got shape {np.shape(params[n])}")


def _kv_heads(params, num_heads, num_kv_heads):
    """``num_kv_heads``, or read from the shapes: ``W_k`` has ``num_kv_heads * d_head`` columns
    and ``W_q`` has ``num_heads * d_head`` (left as None when they do not divide: the
    multi-head check then names the shapes)."""
    if num_kv_heads is not None:
        return num_kv_heads
    width_q, width_k = np.shape(params["self_attn.W_q"])[-1], np.shape(params["self_attn.W_k"])[-1]
    if width_q % num_heads or not width_q or width_k % (width_q // num_heads):
        return None
    return width_k // (width_q // num_heads)


def llama_block_forward(x, params, num_heads, *, num_kv_heads=None, rope_base=10000.0, eps=1e-6,
                        mask=None, scale=None, rope_scaling=None, sliding_window=None):
    """One Llama decoder block on ``x`` (..., n, d_model); positions start at 0.

    Parameters
    ----------
    x : array (..., n, d_model)
    params : flat dict with the keys of :data:`LLAMA_PARAM_NAMES`, and optionally those of
        :data:`QKV_BIAS_NAMES` (Qwen2's biases on q, k, v) and of :data:`QK_NORM_NAMES` (Qwen3)
    num_heads : int, query heads; num_kv_heads : key/value heads dividing it (default: read from
        the shapes, ``W_k`` having ``num_kv_heads * d_head`` columns)
    rope_base : RoPE's base (transformers' ``rope_theta``)
    eps : the RMSNorms' epsilon (``rms_norm_eps``)
    mask : optional extra mask (bool, True = may attend, e.g. padding; or float, added),
        broadcastable to (..., n, n), combined with the causal one
    scale : the attention scores' factor; None is ``1/sqrt(d_head)``
    rope_scaling : None (plain RoPE) or Llama 3.x's scaling, a mapping as a config's
        ``rope_scaling`` (``rope_type`` ``"llama3"`` or ``"linear"`` and its parameters; see
        :func:`attention_ref.nn.rope_scaling.rope_frequencies`, which refuses any other type)
    sliding_window : None (every earlier key) or Mistral's positive ``sliding_window`` W: query
        ``i`` sees keys ``i - W < j <= i`` only (transformers' rule)

    Returns
    -------
    y : array (..., n, d_model)
    cache : LlamaBlockCache for :func:`llama_block_backward`
    """
    x = as_real_array(x, "x")
    require_ndim(x, "x", 2, "(..., n, d_model)")
    num_heads = check_positive_int(num_heads, "num_heads")
    scale = check_scale(scale)
    x, p, num_heads, num_kv_heads = check_llama_block_params(x, params, num_heads, num_kv_heads)
    eps, rope_base = check_positive_real(eps, "eps"), check_positive_real(rope_base, "rope_base")
    mask = check_block_mask(mask, x)
    theta = _scaled_frequencies(p, num_heads, rope_base, rope_scaling)
    window = None if sliding_window is None else check_positive_int(sliding_window, "sliding_window")
    return llama_block_formula(x, p, num_heads, num_kv_heads, rope_base=rope_base, eps=eps, mask=mask, scale=scale,
                               theta=theta, window=window)


def _scaled_frequencies(p, num_heads, rope_base, rope_scaling):
    """None for plain RoPE, else the scaled frequencies (Dh/2,) (the scaling checked by name)."""
    if rope_scaling is None:
        return None
    return rope_frequencies(p["self_attn.W_q"].shape[-1] // num_heads, rope_base, rope_scaling)


def llama_block_formula(x, p, num_heads, num_kv_heads, *, rope_base, eps, mask, scale, theta=None, window=None,
                        rotate=True, layout="half", kv: KVCache | None = None, positions=None):
    """:func:`llama_block_forward` on checked inputs (``p`` as :func:`check_llama_block_params`
    returns it, ``mask`` None or checked, ``theta`` None or RoPE's frequencies (Dh/2,), ``window``
    None or Mistral's sliding window; whole models call it on weights they checked once).
    ``rotate=False``: no RoPE in this layer (SmolLM3's NoPE layers); ``layout``: RoPE's pairing
    (:class:`RotaryHalf`).

    The same six steps serve decoding: with ``kv`` this layer's :class:`KVCache`, ``x`` holds the
    t new tokens at ``positions`` (..., t) (default ``T .. T + t - 1``), step 2 attends to the
    cached keys too (appending the new ones), ``mask`` is as :func:`check_decode_mask` gives it,
    and the cache returned is None (:func:`llama_block_decode_step`)."""
    attn_params = _attention_params(p)
    if positions is None:
        positions = np.arange(x.shape[-2]) if kv is None else np.arange(kv.length, kv.length + x.shape[-2])
    at = positions if kv is None else positions[..., None, :]  # (N,), or (..., 1, t): the same for every head
    rotary = RotaryHalf(at, at, float(rope_base), theta, layout) if rotate else None
    # 1. z = RMSNorm_1(x)
    z, norm1 = rms_norm_formula(x, p["input_norm.weight"], eps)  # (..., N, D)
    # 2. a = Attn(z): causal (within the window), RoPE on q and k (Qwen3: each head's q and k normalised
    #    first), grouped heads; decoding: against the cached keys too
    a, attn = causal_self_attention_formula(z, attn_params, num_heads, num_kv_heads, mask=mask, kv=kv, window=window,
                                            scale=scale, rotary=_with_qk_norm(rotary, p, eps))  # (..., N, D)
    # 3. h = x + a
    hidden = x + a  # (..., N, D)
    # 4. u = RMSNorm_2(h)
    u, norm2 = rms_norm_formula(hidden, p["post_attention_norm.weight"], eps)  # (..., N, D)
    # 5. m = SwiGLU(u)
    mlp_out, mlp = swiglu_formula(u, p["mlp.W_gate"], p["mlp.W_up"], p["mlp.W_down"])  # (..., N, D)
    # 6. y = h + m
    y = hidden + mlp_out  # (..., N, D)
    return y, (None if kv is not None else LlamaBlockCache(norm1, attn, norm2, mlp, y.shape, y.dtype))


def _attention_params(p):
    """The attention's weights (and Qwen2's biases, when present) under its own names."""
    return {name: p[f"self_attn.{name}"] for name in ("W_q", "W_k", "W_v", "W_o", "b_q", "b_k", "b_v")
            if f"self_attn.{name}" in p}


def llama_block_backward(dout, cache: LlamaBlockCache):
    """Gradients of :func:`llama_block_forward`, its six steps in reverse.

    Returns
    -------
    dx : array (..., n, d_model)
    grads : dict with the keys of :data:`LLAMA_PARAM_NAMES` (then :data:`QKV_BIAS_NAMES` when the
        forward had them)
    """
    dy = as_upstream(dout, cache.y_shape, cache.y_dtype, "dout")
    g = {}
    # 6. y = h + m: the residual passes dy to both
    # 5. m = SwiGLU(u)
    du, g["mlp.W_gate"], g["mlp.W_up"], g["mlp.W_down"] = swiglu_backward_formula(dy, cache.mlp)  # (..., N, D)
    # 4. u = RMSNorm_2(h)
    dh_norm, g["post_attention_norm.weight"] = rms_norm_backward_formula(du, cache.norm2)
    dh = dy + dh_norm  # (..., N, D)
    # 3. h = x + a: the residual passes dh to both
    # 2. a = Attn(z): z fed the query, the key and the value, so dz sums the three
    dquery, dkey, dvalue, attn_grads = multi_head_attention_backward_formula(dh, cache.attn)
    dz = dquery + dkey + dvalue  # (..., N, D)
    g.update({f"self_attn.{name}": grad for name, grad in attn_grads.items()})
    # 1. z = RMSNorm_1(x)
    dx_norm, g["input_norm.weight"] = rms_norm_backward_formula(dz, cache.norm1)
    dx = dh + dx_norm  # (..., N, D)
    return dx, {name: g[name] for name in LLAMA_PARAM_NAMES + _OPTIONAL_NAMES if name in g}


def llama_block_decode_step(x_t, params, num_heads, cache: KVCache, *, num_kv_heads=None, rope_base=10000.0,
                            eps=1e-6, scale=None, mask=None, positions=None, rope_scaling=None,
                            sliding_window=None):
    """Decode with a key/value cache: the block's output for the new tokens ``x_t``.

    ``x_t`` (..., t, d_model) holds ``t >= 1`` new tokens: a prompt (prefill) or one token.
    They sit at positions ``T .. T + t - 1``, ``T = cache.length`` the tokens seen so far
    (or at ``positions``), and RoPE rotates their queries and keys at those positions; the
    rotated keys and the values are appended to ``cache``, which must be this layer's own,
    once per key/value head, (..., Hkv, T + t, Dh). The new tokens attend to every cached
    token and causally among themselves, so feeding a sequence in any split gives the rows
    of :func:`llama_block_forward` over the whole of it. Inference only: no backward.

    Parameters
    ----------
    x_t : array (..., t, d_model), the new tokens
    params, num_heads, num_kv_heads, rope_base, eps, scale, rope_scaling, sliding_window : as
        :func:`llama_block_forward` (the window counts the tokens of the cache, padding included,
        as transformers' does)
    cache : KVCache of this layer (a cache filled by another layer is refused)
    mask : optional extra mask of the new tokens against every key after this step,
        broadcastable to (..., t, T + t), combined with the causal one (e.g. left padding)
    positions : optional integer positions of the new tokens, broadcastable to (..., t):
        with left padding, each row's positions count its real tokens only, as transformers'
        ``generate`` does (default ``T .. T + t - 1`` for every row)

    Returns
    -------
    y_t : array (..., t, d_model)
    """
    x_t = check_new_tokens(x_t, cache)
    num_heads = check_positive_int(num_heads, "num_heads")
    scale = check_scale(scale)
    x_t, p, num_heads, num_kv_heads = check_llama_block_params(x_t, params, num_heads, num_kv_heads)
    eps, rope_base = check_positive_real(eps, "eps"), check_positive_real(rope_base, "rope_base")
    mask = check_decode_mask(mask, x_t, cache, x_t.dtype)
    if positions is None:
        positions = np.arange(cache.length, cache.length + x_t.shape[-2])  # (t,): the new tokens' positions
    positions = check_decode_positions(positions, x_t)
    theta = _scaled_frequencies(p, num_heads, rope_base, rope_scaling)
    window = None if sliding_window is None else check_positive_int(sliding_window, "sliding_window")
    return llama_block_formula(x_t, p, num_heads, num_kv_heads, rope_base=rope_base, eps=eps, mask=mask, scale=scale,
                               theta=theta, window=window, kv=cache, positions=positions)[0]


def check_llama_block_params(x, params, num_heads, num_kv_heads=None):
    """The block's flat ``params`` against ``x`` (..., n, d_model): the keys of
    :data:`LLAMA_PARAM_NAMES`, every array real and finite, of matching shapes, cast with ``x``
    to their common dtype. Returns ``(x, p, num_heads, num_kv_heads)``, ``p`` keyed like params."""
    _check_llama_params(params, x.shape[-1])
    attn = _attention_params({n: a for n, a in params.items() if a is not None})
    checked = check_multi_head_inputs(x, x, x, attn, num_heads, num_kv_heads=_kv_heads(params, num_heads, num_kv_heads))
    attn, h, hkv = checked.params, checked.num_heads, checked.num_kv_heads
    _, W_gate, W_up, W_down = check_swiglu_inputs(x, params["mlp.W_gate"], params["mlp.W_up"], params["mlp.W_down"])
    if W_down.shape[1] != x.shape[-1]:
        raise ValueError(f"params['mlp.W_down'] must have {x.shape[-1]} columns, shape (f, {x.shape[-1]}): the MLP"
                         f" output is added to its input of width d_model = {x.shape[-1]}, got shape {W_down.shape}")
    p = {**{f"self_attn.{n}": a for n, a in attn.items()}, "mlp.W_gate": W_gate, "mlp.W_up": W_up,
         "mlp.W_down": W_down, **{n: as_real_array(params[n], f"params['{n}']")
                                  for n in ("input_norm.weight", "post_attention_norm.weight")}}
    d_head = attn["W_q"].shape[-1] // h
    for n in QK_NORM_NAMES:
        if params.get(n) is not None:
            if np.shape(params[n]) != (d_head,):
                raise ValueError(f"params['{n}'] must have shape ({d_head},), the head width (W_q's"
                                 f" {attn['W_q'].shape[-1]} columns / num_heads = {h}), got shape {np.shape(params[n])}")
            p[n] = as_real_array(params[n], f"params['{n}']")
    dtype = common_dtype(x, *p.values())
    return cast(x, dtype), {n: cast(p[n], dtype) for n in LLAMA_PARAM_NAMES + _OPTIONAL_NAMES if n in p}, h, hkv


def init_llama_block_params(d_model, num_heads, d_ff, *, num_kv_heads=None, seed=None, dtype=np.float64,
                            qkv_bias=False, qk_norm=False, d_head=None):
    """Random weights of Llama's shapes (normal, std 0.02 as transformers' ``initializer_range``;
    norms at 1; with ``qkv_bias``, Qwen2's q, k, v biases at 0; with ``qk_norm``, Qwen3's q and k
    norms at 1; ``d_head`` the head width, default ``d_model // num_heads``)."""
    hkv = num_heads if num_kv_heads is None else num_kv_heads
    d_head = d_model // num_heads if d_head is None else d_head
    rng = as_generator(seed)
    shapes = {"self_attn.W_q": (d_model, num_heads * d_head), "self_attn.W_k": (d_model, hkv * d_head),
              "self_attn.W_v": (d_model, hkv * d_head), "self_attn.W_o": (num_heads * d_head, d_model),
              "mlp.W_gate": (d_model, d_ff), "mlp.W_up": (d_model, d_ff), "mlp.W_down": (d_ff, d_model)}
    params = {name: (0.02 * rng.standard_normal(shape)).astype(dtype) for name, shape in shapes.items()}
    params["input_norm.weight"] = np.ones(d_model, dtype)
    params["post_attention_norm.weight"] = np.ones(d_model, dtype)
    if qkv_bias:
        for name, width in zip(QKV_BIAS_NAMES, (num_heads * d_head, hkv * d_head, hkv * d_head)):
            params[name] = np.zeros(width, dtype)
    if qk_norm:
        params.update({name: np.ones(d_head, dtype) for name in QK_NORM_NAMES})
    return {name: params[name] for name in LLAMA_PARAM_NAMES + _OPTIONAL_NAMES if name in params}
