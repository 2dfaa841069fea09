"""Gemma 3's and Gemma 2's decoder block: (1 + w) RMSNorms before and after each sub-layer, causal
self-attention (Gemma 3: per-head (1 + w) q/k norms; Gemma 2: soft-capped scores), rotate-half
RoPE and grouped-query heads, GeGLU.

Symbols: ``...`` batch axes, N positions, D model width, H query heads, Hkv key/value heads,
Dh head width (Gemma's ``head_dim``, not D / H), F the MLP's hidden width. ``GRMS_w(x)`` is
``(1 + w) * x / sqrt(mean(x^2) + eps)`` (:mod:`attention_ref.nn.gemma_rms_norm`).

Forward, numbered so the backward can walk it in reverse:

1. ``z = GRMS_input(x)``                                         (..., N, D)
2. ``a = Attn(z)``: ``q = z W_q``, ``k = z W_k``, ``v = z W_v``, split into heads;
   ``q = GRMS_qnorm(q)``, ``k = GRMS_knorm(k)`` over each head's Dh features; RoPE on q and k
   (the layer's frequencies: local layers ``rope_local_base_freq``, global layers ``rope_theta``
   and its scaling); scores times ``scale`` (``query_pre_attn_scalar ** -0.5``); causal, and on
   sliding layers keys ``i - W < j <= i`` only; grouped heads; merge; ``W_o``     (..., N, D)
   Gemma 2 instead: no q/k norms, and the scaled scores ``S`` become ``C = cap * tanh(S / cap)``
   before the mask and the softmax (the grouped path's ``scores`` hook,
   :class:`attention_ref.nn.soft_cap.SoftCapScores`)
3. ``b = GRMS_post_attention(a)``
4. ``h = x + b``
5. ``u = GRMS_pre_feedforward(h)``
6. ``m = GeGLU(u) = (gelu_tanh(u W_gate) * (u W_up)) W_down``
7. ``c = GRMS_post_feedforward(m)``
8. ``y = h + c``

Decoding runs the same eight steps (:func:`gemma_block_formula` with a :class:`KVCache`).

Backward: the same steps in reverse. Each ``GRMS`` is RMSNorm with gain ``g = 1 + w``, so its
backward is RMSNorm's with ``dw = dg``; the q/k norms are :class:`QKNormRotary` given the gains
``1 + w`` (their gradients sum over batch, heads and positions); the residuals pass their
gradient to both branches. Gemma 2's cap: ``dS = dC * (1 - t^2)``, ``t = tanh(S / cap)``, between
the softmax's backward and the scale's (the hook's backward, inside the grouped path's).

Parameter names (flat): ``input_norm.weight``, ``self_attn.W_q``, ``.W_k``, ``.W_v``, ``.W_o``,
``self_attn.q_norm.weight``, ``.k_norm.weight`` (Dh,), ``post_attention_norm.weight``,
``pre_feedforward_norm.weight``, ``post_feedforward_norm.weight``, ``mlp.W_gate``, ``.W_up``,
``.W_down``; Gemma 2 without the q/k norms (:data:`GEMMA2_PARAM_NAMES`)
(transformers' ``input_layernorm``, ``self_attn.q_proj`` ..., ``self_attn.q_norm``,
``post_attention_layernorm``, ``pre_feedforward_layernorm``, ``post_feedforward_layernorm``,
``mlp.gate_proj`` ...). Every norm weight is the offset ``w`` (transformers initialises it at 0).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._checks import as_generator
from .._checks import (as_real_array, as_upstream, cast, check_positive_int, check_positive_real, common_dtype,
                       require_ndim)
from .._pair_checks import check_scale
from ..variants.grouped_heads import GroupedMultiHeadCache
from ..variants.grouped_heads import multi_head_attention_backward_formula
from ..variants.kv_cache import KVCache
from .geglu import GeGLUCache, geglu_backward_formula, geglu_formula
from ..variants.kv_cache import check_decode_mask, check_decode_positions, check_new_tokens
from ..variants.rope import RotaryHalf
from .llama_block import QK_NORM_NAMES, LLAMA_PARAM_NAMES, check_llama_block_params
from .rms_norm import QKNormRotary
from .multi_head_attention import causal_self_attention_formula, check_block_mask
from .gemma_rms_norm import gemma_rms_norm_formula
from .rms_norm import RMSNormCache, rms_norm_backward_formula
from .rope_scaling import rope_frequencies
from .soft_cap import SoftCapScores

__all__ = ["GEMMA_PARAM_NAMES", "GEMMA2_PARAM_NAMES", "GemmaBlockCache",
           "gemma_block_forward", "gemma_block_backward",
           "gemma_block_decode_step", "gemma_block_formula", "check_gemma_block_params",
           "init_gemma_block_params"]

GEMMA_PARAM_NAMES = ("input_norm.weight", "self_attn.W_q", "self_attn.W_k", "self_attn.W_v", "self_attn.W_o",
                     "self_attn.q_norm.weight", "self_attn.k_norm.weight", "post_attention_norm.weight",
                     "pre_feedforward_norm.weight", "post_feedforward_norm.weight", "mlp.W_gate", "mlp.W_up",
                     "mlp.W_down")
#: Gemma 2's block: Gemma 3's without the q/k norms (its scores are soft-capped instead)
GEMMA2_PARAM_NAMES = tuple(n for n in GEMMA_PARAM_NAMES if n not in QK_NORM_NAMES)
_NORMS_D = ("input_norm.weight", "post_attention_norm.weight", "pre_feedforward_norm.weight",
            "post_feedforward_norm.weight")


class GemmaBlockCache(NamedTuple):
    """Nested caches of the eight steps."""

    norm_in: RMSNormCache  # step 1
    attn: GroupedMultiHeadCache  # step 2
    norm_post_attn: RMSNormCache  # step 3
    norm_pre_ff: RMSNormCache  # step 5
    mlp: GeGLUCache  # step 6
    norm_post_ff: RMSNormCache  # step 7
    y_shape: tuple
    y_dtype: np.dtype

    @property
    def weights(self) -> np.ndarray:
        """Self-attention probabilities of every head, (..., H, N, N)."""
        return self.attn.weights


def check_gemma_block_params(x, params, num_heads, num_kv_heads=None):
    """The block's flat ``params`` against ``x`` (..., n, d_model): exactly the keys of
    :data:`GEMMA_PARAM_NAMES`, every array real and finite, of matching shapes (the projections
    and the q/k norms as Llama's block checks them), cast with ``x`` to their common dtype.
    Returns ``(x, p, num_heads, num_kv_heads)``."""
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict with keys {GEMMA_PARAM_NAMES}, got {type(params).__name__}")
    missing = [n for n in GEMMA2_PARAM_NAMES if params.get(n) is None]
    unknown = sorted(set(params) - set(GEMMA_PARAM_NAMES))
    if missing or unknown:
        raise ValueError(f"params must have the keys {GEMMA2_PARAM_NAMES} (and Gemma 3's {QK_NORM_NAMES});"
                         f" missing {missing}, unknown {unknown}")
    d_model = x.shape[-1]
    for n in _NORMS_D:
        if np.shape(params[n]) != (d_model,):
            raise ValueError(f"params['{n}'] must have shape ({d_model},) to match x of width d_model = {d_model},"
                             f" got shape {np.shape(params[n])}")
    llama_part = {n: params[n] for n in LLAMA_PARAM_NAMES + QK_NORM_NAMES if n in params}
    x, p, h, hkv = check_llama_block_params(x, llama_part, num_heads, num_kv_heads)  # q/k norms: both or neither
    p.update({n: as_real_array(params[n], f"params['{n}']") for n in _NORMS_D[2:]})
    dtype = common_dtype(x, *p.values())
    return cast(x, dtype), {n: cast(p[n], dtype) for n in GEMMA_PARAM_NAMES if n in p}, h, hkv


def _frequencies(p, num_heads, rope_base, rope_scaling):
    """The layer's RoPE frequencies (Dh/2,), float64 (a scaling checked by name)."""
    return rope_frequencies(p["self_attn.W_q"].shape[-1] // num_heads, rope_base, rope_scaling)


def gemma_block_forward(x, params, num_heads, *, num_kv_heads=None, rope_base=10000.0, eps=1e-6, mask=None,
                        scale=None, rope_scaling=None, sliding_window=None, attn_softcap=None):
    """One Gemma 3 (or Gemma 2) decoder block on ``x`` (..., n, d_model); positions start at 0.

    Parameters
    ----------
    x : array (..., n, d_model)
    params : flat dict with the keys of :data:`GEMMA_PARAM_NAMES` (Gemma 3), or of
        :data:`GEMMA2_PARAM_NAMES` (Gemma 2: no q/k norms)
    num_heads : int, query heads; num_kv_heads : key/value heads dividing it (default: read from
        the shapes)
    rope_base : the layer's RoPE base (Gemma 3: ``rope_local_base_freq`` on sliding layers,
        ``rope_theta`` on global ones)
    eps : the norms' epsilon (``rms_norm_eps``)
    mask : optional extra mask (bool, True = may attend; or float, added), broadcastable to
        (..., n, n), combined with the causal one
    scale : the scores' factor; None is ``1/sqrt(d_head)`` (Gemma: ``query_pre_attn_scalar ** -0.5``)
    rope_scaling : None or a scaling mapping (``rope_type`` ``"linear"`` or ``"llama3"``), as
        :func:`attention_ref.nn.rope_scaling.rope_frequencies` takes it
    sliding_window : None (global layer) or the window W of a sliding layer (keys ``i - W < j <= i``)
    attn_softcap : None, or Gemma 2's ``attn_logit_softcapping``: the scaled scores become
        ``cap * tanh(S / cap)`` before the mask and the softmax

    Returns
    -------
    y : array (..., n, d_model)
    cache : GemmaBlockCache for :func:`gemma_block_backward`
    """
    x = as_real_array(x, "x")
    require_ndim(x, "x", 2, "(..., n, d_model)")
    num_heads = check_positive_int(num_heads, "num_heads")
    scale = check_scale(scale)
    x, p, num_heads, num_kv_heads = check_gemma_block_params(x, params, num_heads, num_kv_heads)
    eps, rope_base = check_positive_real(eps, "eps"), check_positive_real(rope_base, "rope_base")
    mask = check_block_mask(mask, x)
    theta = _frequencies(p, num_heads, rope_base, rope_scaling)
    window = None if sliding_window is None else check_positive_int(sliding_window, "sliding_window")
    cap = None if attn_softcap is None else check_positive_real(attn_softcap, "attn_softcap")
    return gemma_block_formula(x, p, num_heads, num_kv_heads, eps=eps, mask=mask, scale=scale, theta=theta,
                               window=window, cap=cap)


def _qk_norm_rotary(rotary, p, eps):
    """Step 2's q/k norms (gains ``1 + w``) then ``rotary``; ``rotary`` alone for Gemma 2."""
    if "self_attn.q_norm.weight" not in p:
        return rotary
    return QKNormRotary(rotary, 1.0 + p["self_attn.q_norm.weight"], 1.0 + p["self_attn.k_norm.weight"], eps)


def _capped(cap):
    """Gemma 2's scores hook (the scaled scores soft-capped before the mask), None for Gemma 3."""
    return None if cap is None else SoftCapScores(cap)


def _attention_params(p):
    return {name: p[f"self_attn.{name}"] for name in ("W_q", "W_k", "W_v", "W_o")}


def gemma_block_formula(x, p, num_heads, num_kv_heads, *, eps, mask, scale, theta, window=None, cap=None,
                        kv: KVCache | None = None, positions=None):
    """:func:`gemma_block_forward` on checked inputs (``p`` as :func:`check_gemma_block_params`
    returns it, ``mask`` None or checked, ``theta`` the layer's RoPE frequencies (Dh/2,),
    ``window`` None or the sliding window, ``cap`` None or Gemma 2's score soft cap).

    The same eight steps serve decoding: with ``kv`` this layer's :class:`KVCache`, ``x`` holds the
    t new tokens at ``positions`` (..., t) (default ``T .. T + t - 1``), step 2 attends to the
    cached keys too, ``mask`` is as :func:`check_decode_mask` gives it, and the cache returned is
    None (:func:`gemma_block_decode_step`)."""
    if positions is None:
        positions = np.arange(x.shape[-2]) if kv is None else np.arange(kv.length, kv.length + x.shape[-2])
    at = positions if kv is None else positions[..., None, :]  # (N,), or (..., 1, t): the same for every head
    # 1. z = GRMS_input(x)
    z, norm_in = gemma_rms_norm_formula(x, p["input_norm.weight"], eps)  # (..., N, D)
    # 2. a = Attn(z): q/k norms, RoPE, causal (sliding on local layers), grouped heads, Gemma 2's scores
    #    capped (the scores hook); decoding: against the cached keys too
    a, attn = causal_self_attention_formula(z, _attention_params(p), num_heads, num_kv_heads, mask=mask, kv=kv,
                                            window=window, scale=scale,
                                            rotary=_qk_norm_rotary(RotaryHalf(at, at, 1.0, theta), p, eps),
                                            scores=_capped(cap))  # (..., N, D)
    # 3. b = GRMS_post_attention(a)
    b, norm_post_attn = gemma_rms_norm_formula(a, p["post_attention_norm.weight"], eps)  # (..., N, D)
    # 4. h = x + b
    hidden = x + b  # (..., N, D)
    # 5. u = GRMS_pre_feedforward(h)
    u, norm_pre_ff = gemma_rms_norm_formula(hidden, p["pre_feedforward_norm.weight"], eps)  # (..., N, D)
    # 6. m = GeGLU(u)
    m, mlp = geglu_formula(u, p["mlp.W_gate"], p["mlp.W_up"], p["mlp.W_down"])  # (..., N, D)
    # 7. c = GRMS_post_feedforward(m)
    c, norm_post_ff = gemma_rms_norm_formula(m, p["post_feedforward_norm.weight"], eps)  # (..., N, D)
    # 8. y = h + c
    y = hidden + c  # (..., N, D)
    if kv is not None:
        return y, None
    return y, GemmaBlockCache(norm_in, attn, norm_post_attn, norm_pre_ff, mlp, norm_post_ff, y.shape, y.dtype)


def gemma_block_backward(dout, cache: GemmaBlockCache):
    """Gradients of :func:`gemma_block_forward`, its eight steps in reverse.

    Returns
    -------
    dx : array (..., n, d_model)
    grads : dict with the keys of :data:`GEMMA_PARAM_NAMES`
    """
    dy = as_upstream(dout, cache.y_shape, cache.y_dtype, "dout")
    g = {}
    # 8. y = h + c: the residual passes dy to both
    # 7. c = GRMS_post_feedforward(m): dw is the gain's gradient (d(1 + w)/dw = 1)
    dm, g["post_feedforward_norm.weight"] = rms_norm_backward_formula(dy, cache.norm_post_ff)  # (..., N, D)
    # 6. m = GeGLU(u)
    du, g["mlp.W_gate"], g["mlp.W_up"], g["mlp.W_down"] = geglu_backward_formula(dm, cache.mlp)  # (..., N, D)
    # 5. u = GRMS_pre_feedforward(h)
    dh_norm, g["pre_feedforward_norm.weight"] = rms_norm_backward_formula(du, cache.norm_pre_ff)
    dh = dy + dh_norm  # (..., N, D)
    # 4. h = x + b: the residual passes dh to both
    # 3. b = GRMS_post_attention(a)
    da, g["post_attention_norm.weight"] = rms_norm_backward_formula(dh, cache.norm_post_attn)  # (..., N, D)
    # 2. a = Attn(z): z fed the query, the key and the value, so dz sums the three (the q/k norms'
    #    gradients come back with the attention's)
    #    Gemma 2's cap: dS = dC (1 - t^2) inside, the scores hook's backward
    dquery, dkey, dvalue, attn_grads = multi_head_attention_backward_formula(da, cache.attn)
    dz = dquery + dkey + dvalue  # (..., N, D)
    g.update({f"self_attn.{name}": grad for name, grad in attn_grads.items()})
    # 1. z = GRMS_input(x)
    dx_norm, g["input_norm.weight"] = rms_norm_backward_formula(dz, cache.norm_in)
    dx = dh + dx_norm  # (..., N, D)
    return dx, {name: g[name] for name in GEMMA_PARAM_NAMES if name in g}


def gemma_block_decode_step(x_t, params, num_heads, cache: KVCache, *, num_kv_heads=None, rope_base=10000.0,
                            eps=1e-6, scale=None, mask=None, positions=None, rope_scaling=None, sliding_window=None,
                            attn_softcap=None):
    """The block on ``x_t`` (..., t, d_model), the next ``t`` tokens after the ``T`` keys and
    values in ``cache`` (which this call extends); feeding a sequence in any split gives the
    rows of :func:`gemma_block_forward` over the whole of it. Inference only: no backward.

    Parameters as :func:`attention_ref.nn.llama_block.llama_block_decode_step` (``mask`` of the
    new tokens against every key after this step, (..., t, T + t); ``positions`` of the new
    tokens, default ``T .. T + t - 1``), the others as :func:`gemma_block_forward`.

    Returns
    -------
    y_t : array (..., t, d_model)
    """
    x_t = check_new_tokens(x_t, cache)
    num_heads = check_positive_int(num_heads, "num_heads")
    scale = check_scale(scale)
    x_t, p, num_heads, num_kv_heads = check_gemma_block_params(x_t, params, num_heads, num_kv_heads)
    eps, rope_base = check_positive_real(eps, "eps"), check_positive_real(rope_base, "rope_base")
    mask = check_decode_mask(mask, x_t, cache, x_t.dtype)
    if positions is None:
        positions = np.arange(cache.length, cache.length + x_t.shape[-2])  # (t,)
    positions = check_decode_positions(positions, x_t)
    theta = _frequencies(p, num_heads, rope_base, rope_scaling)
    window = None if sliding_window is None else check_positive_int(sliding_window, "sliding_window")
    cap = None if attn_softcap is None else check_positive_real(attn_softcap, "attn_softcap")
    return gemma_block_formula(x_t, p, num_heads, num_kv_heads, eps=eps, mask=mask, scale=scale, theta=theta,
                               window=window, cap=cap, kv=cache, positions=positions)[0]


def init_gemma_block_params(d_model, num_heads, d_ff, *, num_kv_heads=None, d_head=None, seed=None,
                            dtype=np.float64, qk_norm=True):
    """Random weights of Gemma 3's shapes (normal, std 0.02; every norm's offset ``w`` at 0, as
    transformers initialises it; ``d_head`` default ``d_model // num_heads``)."""
    hkv = num_heads if num_kv_heads is None else num_kv_heads
    d_head = d_model // num_heads if d_head is None else d_head
    rng = as_generator(seed)
    shapes = {"self_attn.W_q": (d_model, num_heads * d_head), "self_attn.W_k": (d_model, hkv * d_head),
              "self_attn.W_v": (d_model, hkv * d_head), "self_attn.W_o": (num_heads * d_head, d_model),
              "mlp.W_gate": (d_model, d_ff), "mlp.W_up": (d_model, d_ff), "mlp.W_down": (d_ff, d_model)}
    params = {name: (0.02 * rng.standard_normal(shape)).astype(dtype) for name, shape in shapes.items()}
    params.update({name: np.zeros(d_model, dtype) for name in _NORMS_D})
    if qk_norm:  # Gemma 3; Gemma 2 has none
        params.update({name: np.zeros(d_head, dtype) for name in QK_NORM_NAMES})
    return {name: params[name] for name in GEMMA_PARAM_NAMES if name in params}
