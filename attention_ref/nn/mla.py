"""Multi-head latent attention (MLA; DeepSeek-V2 and V3, Kimi K2; transformers' ``DeepseekV3Attention``),
its backward, and its absorbed decoding step with a cache of the latent.

Keys and values are not projected from a token directly: the token is first compressed to a
latent ``c`` of ``kv_lora_rank`` features (plus ``qk_rope_head_dim`` features of one RoPE key
shared by every head), and each head's key and value are read out of the normalised latent.
The positional part of a key is decoupled from the rest: RoPE rotates only the ``q_pe`` and
``k_pe`` features, so the rest of the key is a fixed linear function of the latent, and a
decoding step can fold that function into the query (the absorbed form) and cache only the
latent and the rotated ``k_pe``: ``kv_lora_rank + qk_rope_head_dim`` numbers per token and layer,
where multi-head attention caches ``2 H Dh``.

Symbols: ``...`` batch axes, N positions, D model width, H heads, ``dn`` = ``qk_nope_head_dim``,
``dr`` = ``qk_rope_head_dim``, ``dv`` = ``v_head_dim``, ``rq`` = ``q_lora_rank``, ``r`` =
``kv_lora_rank``. Parameters (``W`` in (in, out), transformers' ``nn.Linear`` weights transposed):
``W_q`` (D, H (dn + dr)) when ``q_lora_rank`` is None, else ``W_q_a`` (D, rq), ``q_a_norm.weight``
(rq,), ``W_q_b`` (rq, H (dn + dr)); ``W_kv_a`` (D, r + dr), ``kv_a_norm.weight`` (r,), ``W_kv_b``
(r, H (dn + dv)); ``W_o`` (H dv, D).

Forward (:func:`mla_forward`), numbered so the backward walks it in reverse:

1. the query: ``q = x W_q``, or ``q = RMSNorm(x W_q_a) W_q_b``; per head ``[q_nope | q_pe]`` (dn, dr)
2. the latent: ``[c | k_pe] = x W_kv_a``; ``c_hat = RMSNorm(c)``          (..., N, r), (..., N, dr)
3. keys and values from the latent: ``c_hat W_kv_b``, per head ``[k_nope | v]`` (dn, dv)
4. RoPE on ``q_pe`` (each head) and ``k_pe`` (one, shared by the heads), at the positions, with
   the frequencies given (YaRN's for DeepSeek-V3), times the shape's ``rope_factor`` (YaRN's attention
   factor, which transformers puts on cos and sin); pairs interleaved or half, as the config says
5. ``q = [q_nope | q_pe]``, ``k = [k_nope | k_pe]`` (k_pe repeated for every head), causal attention
   with the scale given (DeepSeek-V3: ``(dn + dr)^-1/2``, times ``mscale^2`` under YaRN)
6. heads merged, ``y = o W_o``

Absorbed decoding (:func:`mla_decode_absorbed`): with ``W_kv_b`` split per head into ``W_uk``
(r, dn) and ``W_uv`` (r, dv), ``q_nope . k_nope_j = q_nope . (c_hat_j W_uk) = (q_nope W_uk^T) .
c_hat_j`` and ``sum_j p_j v_j = (sum_j p_j c_hat_j) W_uv``: the scores and the output read the
cached latents ``c_hat_j`` and ``k_pe_j`` only, never a per-head key or value.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .._checks import as_real_array, as_upstream, check_positive_int, check_positive_real, common_dtype
from ..core.linear import LinearCache
from ..core.masks import causal_mask
from ..fast.core_formulas import merge_heads_formula, split_heads_formula
from ..fast.dispatch import attention_backward_formula, attention_formula, linear_backward_formula, linear_formula
from ..variants.rope import rotate
from .rms_norm import rms_norm_backward, rms_norm_formula

__all__ = ["MLAShape", "MLACache", "LatentCache", "MLADecodeCache", "mla_param_shapes", "mla_scale", "mla_forward",
           "mla_backward", "mla_decode_absorbed"]


class MLAShape(NamedTuple):
    """The sizes and constants of one MLA layer (transformers' DeepseekV3Config fields in brackets)."""

    num_heads: int  # H (num_attention_heads)
    q_lora_rank: int | None  # rq, or None: one query projection (q_lora_rank)
    kv_lora_rank: int  # r (kv_lora_rank)
    qk_nope_head_dim: int  # dn
    qk_rope_head_dim: int  # dr, even
    v_head_dim: int  # dv
    eps: float = 1e-6  # the two RMSNorms' epsilon (rms_norm_eps)
    interleaved: bool = True  # RoPE pairs (2i, 2i+1) (rope_interleave, DeepSeek-V3's default) or (i, i + dr/2)
    scale: float | None = None  # the scores' factor; None: (dn + dr)^-1/2
    rope_factor: float = 1.0  # what RoPE's cos and sin are multiplied by (YaRN's attention factor; transformers'
    #                           attention_scaling): the q_pe . k_pe part of the scores grows by its square


class MLACache(NamedTuple):
    """What :func:`mla_backward` needs, by step."""

    q_a: object  # step 1: LinearCache of x W_q_a (None without q_lora_rank)
    q_a_norm: object  # RMSNormCache (None without q_lora_rank)
    q_b: object  # LinearCache of the query's last projection (W_q or W_q_b)
    kv_a: object  # step 2: LinearCache of x W_kv_a
    kv_a_norm: object  # RMSNormCache of c
    kv_b: object  # step 3: LinearCache of c_hat W_kv_b
    rope: tuple  # step 4: (cos, sin) (..., N, dr/2)
    attn: object  # step 5: AttentionCache
    o: object  # step 6: LinearCache of the merged heads
    shape: MLAShape


class LatentCache(NamedTuple):
    """The absorbed form's cache of one layer: per token the normalised latent and the rotated shared key."""

    c_hat: np.ndarray  # (B, T, r)
    k_pe: np.ndarray  # (B, T, dr)


class MLADecodeCache:
    """One layer's decoding state in the absorbed form, grown by each step: its :class:`LatentCache`
    (None before the first step). A model's decoder keeps one per layer (DeepSeek-V3's
    ``Family.new_cache``) and the block passes it to :func:`mla_decode_absorbed`.
    Memory: ``batch * T * (kv_lora_rank + qk_rope_head_dim) * itemsize`` bytes (:attr:`nbytes`)."""

    def __init__(self):
        self.latent = None

    @property
    def length(self) -> int:
        """The tokens cached so far."""
        return 0 if self.latent is None else self.latent.c_hat.shape[1]

    @property
    def nbytes(self) -> int:
        return 0 if self.latent is None else self.latent.c_hat.nbytes + self.latent.k_pe.nbytes

    def __repr__(self):
        return f"MLADecodeCache(length={self.length})"


def mla_param_shapes(D: int, shape: MLAShape) -> dict:
    """The shape of each parameter of an MLA layer of width ``D``."""
    H, rq, r = shape.num_heads, shape.q_lora_rank, shape.kv_lora_rank
    dn, dr, dv = shape.qk_nope_head_dim, shape.qk_rope_head_dim, shape.v_head_dim
    query = {"W_q": (D, H * (dn + dr))} if rq is None else {
        "W_q_a": (D, rq), "q_a_norm.weight": (rq,), "W_q_b": (rq, H * (dn + dr))}
    return {**query, "W_kv_a": (D, r + dr), "kv_a_norm.weight": (r,), "W_kv_b": (r, H * (dn + dv)),
            "W_o": (H * dv, D)}


def mla_scale(qk_head_dim, factor=None, mscale_all_dim=0.0) -> float:
    """DeepSeek-V3's factor on the scores: ``qk_head_dim^-1/2``, times ``m^2`` under YaRN with
    ``m = 0.1 mscale_all_dim ln(factor) + 1`` when ``factor > 1`` and ``mscale_all_dim`` is not 0
    (transformers' ``yarn_get_mscale``; the cos and sin carry YaRN's own attention factor too)."""
    scale = check_positive_int(qk_head_dim, "qk_head_dim") ** -0.5
    if factor is not None and mscale_all_dim and check_positive_real(factor, "factor") > 1:
        m = 0.1 * mscale_all_dim * math.log(factor) + 1.0
        scale *= m * m
    return scale


def check_mla_inputs(x, p, shape, theta, positions, per_row=False):
    """Checked inputs: ``shape`` an MLAShape, ``p`` exactly its parameters, all of one dtype;
    ``positions`` (N,), or also (B, N) when ``per_row``."""
    if not isinstance(shape, MLAShape):
        raise TypeError(f"shape must be an attention_ref.nn.MLAShape, got {type(shape).__name__}")
    for name in ("num_heads", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
        check_positive_int(getattr(shape, name), f"shape.{name}")
    if shape.q_lora_rank is not None:
        check_positive_int(shape.q_lora_rank, "shape.q_lora_rank")
    if shape.qk_rope_head_dim % 2:
        raise ValueError(f"shape.qk_rope_head_dim must be even (RoPE rotates pairs), got {shape.qk_rope_head_dim}")
    check_positive_real(shape.eps, "shape.eps")
    if shape.scale is not None:
        check_positive_real(shape.scale, "shape.scale")
    check_positive_real(shape.rope_factor, "shape.rope_factor")
    x = as_real_array(x, "x")
    if x.ndim < 2:
        raise ValueError(f"x must have shape (..., N, D), got {x.shape}")
    expected = mla_param_shapes(x.shape[-1], shape)
    if not isinstance(p, dict) or set(p) != set(expected):
        raise ValueError(f"params must hold exactly {sorted(expected)}, got {sorted(p) if isinstance(p, dict) else p!r}")
    p = {name: as_real_array(p[name], f"params[{name!r}]") for name in expected}
    for name, want in expected.items():
        if p[name].shape != want:
            raise ValueError(f"params[{name!r}] must have shape {want}, got {p[name].shape}")
    theta = as_real_array(theta, "theta").astype(np.float64)
    if theta.shape != (shape.qk_rope_head_dim // 2,):
        raise ValueError(f"theta must have shape ({shape.qk_rope_head_dim // 2},) (qk_rope_head_dim / 2), got"
                         f" {theta.shape}")
    positions = as_real_array(positions, "positions").astype(np.float64)
    if positions.shape != x.shape[-2:-1] and not (per_row and positions.shape == x.shape[:-1]):
        rows = f" or {x.shape[:-1]} (one per token of each row)" if per_row else ""
        raise ValueError(f"positions must have shape ({x.shape[-2]},) (one per token of x){rows}, got {positions.shape}")
    dtype = common_dtype(x, *p.values())
    return x.astype(dtype, copy=False), {k: v.astype(dtype, copy=False) for k, v in p.items()}, theta, positions


def _scale(shape):
    return shape.scale if shape.scale is not None else 1.0 / math.sqrt(shape.qk_nope_head_dim + shape.qk_rope_head_dim)


def _cos_sin(positions, theta, shape, dtype):
    """RoPE's ``a cos`` and ``a sin`` (..., N, dr/2) at ``positions`` (..., N), ``a`` the shape's ``rope_factor``."""
    angles = positions[..., None] * theta  # (..., N, dr/2), float64
    return (np.cos(angles) * shape.rope_factor).astype(dtype), (np.sin(angles) * shape.rope_factor).astype(dtype)


def _layout(shape):
    return "interleaved" if shape.interleaved else "half"


def _query(x, p, shape):
    """Step 1: the query (..., N, H (dn + dr)) and its caches."""
    if shape.q_lora_rank is None:
        return linear_formula(x, p["W_q"], None), None, None, LinearCache(x, p["W_q"], False)
    q_a = linear_formula(x, p["W_q_a"], None)  # (..., N, rq)
    q_a_hat, q_a_norm = rms_norm_formula(q_a, p["q_a_norm.weight"], shape.eps)
    q = linear_formula(q_a_hat, p["W_q_b"], None)  # (..., N, H (dn + dr))
    return q, LinearCache(x, p["W_q_a"], False), q_a_norm, LinearCache(q_a_hat, p["W_q_b"], False)


def _latent(x, p, shape, cos, sin):
    """Step 2 and step 4's shared key: ``c_hat`` (..., N, r) and the rotated ``k_pe`` (..., N, dr)."""
    r = shape.kv_lora_rank
    ckv = linear_formula(x, p["W_kv_a"], None)  # (..., N, r + dr)
    c_hat, kv_a_norm = rms_norm_formula(ckv[..., :r], p["kv_a_norm.weight"], shape.eps)  # (..., N, r)
    k_pe = rotate(ckv[..., r:], cos, sin, _layout(shape))  # (..., N, dr)
    return c_hat, k_pe, LinearCache(x, p["W_kv_a"], False), kv_a_norm


def mla_forward(x, params, shape: MLAShape, theta, positions, mask=None):
    """Multi-head latent attention of the tokens ``x`` over themselves (causal).

    Parameters
    ----------
    x : array (..., N, D)
    params : dict of the layer's parameters (:func:`mla_param_shapes`)
    shape : MLAShape
    theta : array (dr/2,), RoPE's frequencies (YaRN's, or ``base^(-2i/dr)``)
    positions : array (N,), the tokens' positions
    mask : None or a bool array broadcastable to (..., 1, N, N) (True: may attend), combined with
        the causal mask

    Returns
    -------
    y : array (..., N, D)
    cache : MLACache for :func:`mla_backward`
    """
    return mla_formula(*check_mla_inputs(x, params, shape, theta, positions), shape, mask)


def mla_formula(x, p, theta, positions, shape, mask=None):
    """:func:`mla_forward` on checked inputs (the DeepSeek-V3 block calls it: the model's params are
    checked once, by ``lm_forward`` or ``LMDecoder``)."""
    H, dn, dv = shape.num_heads, shape.qk_nope_head_dim, shape.v_head_dim
    n = x.shape[-2]
    cos, sin = _cos_sin(positions, theta, shape, x.dtype)  # (N, dr/2)
    # 1. the query, per head [q_nope | q_pe]
    q, q_a, q_a_norm, q_b = _query(x, p, shape)
    q = split_heads_formula(q, H)  # (..., H, N, dn + dr)
    # 2. the latent, normalised; its shared RoPE key (rotated in step 4)
    c_hat, k_pe, kv_a, kv_a_norm = _latent(x, p, shape, cos, sin)
    # 3. each head's k_nope and v from the latent
    kv = split_heads_formula(linear_formula(c_hat, p["W_kv_b"], None), H)  # (..., H, N, dn + dv)
    k_nope, v = kv[..., :dn], kv[..., dn:]
    # 4. RoPE on the query's q_pe (the key's k_pe was rotated with the latent)
    q_pe = rotate(q[..., dn:], cos, sin, _layout(shape))  # (..., H, N, dr)
    # 5. causal attention over [nope | pe], the shared k_pe repeated for every head
    q_full = np.concatenate([q[..., :dn], q_pe], axis=-1)  # (..., H, N, dn + dr)
    k_full = np.concatenate([k_nope, np.broadcast_to(k_pe[..., None, :, :], k_nope.shape[:-1] + k_pe.shape[-1:])],
                            axis=-1)  # (..., H, N, dn + dr)
    allowed = causal_mask(n) if mask is None else np.logical_and(np.asarray(mask, bool), causal_mask(n))
    o, attn = attention_formula(q_full, k_full, v, allowed, scale=_scale(shape))  # (..., H, N, dv)
    # 6. heads merged, the output projection
    merged = merge_heads_formula(o)  # (..., N, H dv)
    y = linear_formula(merged, p["W_o"], None)  # (..., N, D)
    return y, MLACache(q_a, q_a_norm, q_b, kv_a, kv_a_norm, LinearCache(c_hat, p["W_kv_b"], False), (cos, sin), attn,
                       LinearCache(merged, p["W_o"], False), shape)


def _rotate_back(dy, cos, sin, layout):
    """RoPE's backward: the rotation by the opposite angle (``a R^T``: the cached cos and sin carry ``a``)."""
    return rotate(dy, cos, -sin, layout)


def mla_backward(dy, cache: MLACache):
    """Gradients of :func:`mla_forward`, its steps in reverse: ``(dx, grads)``, ``grads`` keyed like the params.

    6. ``y = o W_o``: ``do = dy W_o^T``, ``dW_o = o^T dy``; split into heads
    5. the attention's backward gives ``dq``, ``dk`` (..., H, N, dn + dr) and ``dv``; the shared
       ``k_pe`` sums its heads' gradients
    4. RoPE's backward (rotation by the opposite angle) on ``dq_pe`` and ``dk_pe``
    3. ``[k_nope | v] = c_hat W_kv_b``: ``dc_hat = d[k_nope | v] W_kv_b^T``, ``dW_kv_b = c_hat^T d[k_nope | v]``
    2. ``c_hat = RMSNorm(c)`` and ``[c | k_pe] = x W_kv_a``: the norm's backward, then the projection's
    1. the query's projections (and its norm) in reverse
    ``dx`` adds the query's, the latent's parts.
    """
    shape = cache.shape
    cos, sin = cache.rope
    merged = cache.o.x
    dy = as_upstream(dy, merged.shape[:-1] + cache.o.W.shape[1:], merged.dtype, "dy")
    layout = _layout(shape)
    dn, H = shape.qk_nope_head_dim, shape.num_heads
    g = {}
    # 6. y = o W_o
    dmerged, g["W_o"], _ = linear_backward_formula(dy, cache.o)  # (..., N, H dv)
    do = split_heads_formula(dmerged, H)  # (..., H, N, dv)
    # 5. the attention
    dq_full, dk_full, dv = attention_backward_formula(do, cache.attn)  # (..., H, N, dn + dr), (..., H, N, dv)
    dk_pe = dk_full[..., dn:].sum(axis=-3)  # (..., N, dr): one key for every head
    # 4. RoPE
    dq = np.concatenate([dq_full[..., :dn], _rotate_back(dq_full[..., dn:], cos, sin, layout)], axis=-1)
    dk_pe = _rotate_back(dk_pe, cos, sin, layout)  # (..., N, dr)
    # 3. [k_nope | v] = c_hat W_kv_b
    dkv = merge_heads_formula(np.concatenate([dk_full[..., :dn], dv], axis=-1))  # (..., N, H (dn + dv))
    dc_hat, g["W_kv_b"], _ = linear_backward_formula(dkv, cache.kv_b)  # (..., N, r)
    # 2. c_hat = RMSNorm(c), [c | k_pe] = x W_kv_a
    dc, g["kv_a_norm.weight"] = rms_norm_backward(dc_hat, cache.kv_a_norm)
    dx, g["W_kv_a"], _ = linear_backward_formula(np.concatenate([dc, dk_pe], axis=-1), cache.kv_a)  # (..., N, D)
    # 1. the query
    dq = merge_heads_formula(dq)  # (..., N, H (dn + dr))
    if shape.q_lora_rank is None:
        dx_q, g["W_q"], _ = linear_backward_formula(dq, cache.q_b)
    else:
        dq_a_hat, g["W_q_b"], _ = linear_backward_formula(dq, cache.q_b)  # (..., N, rq)
        dq_a, g["q_a_norm.weight"] = rms_norm_backward(dq_a_hat, cache.q_a_norm)
        dx_q, g["W_q_a"], _ = linear_backward_formula(dq_a, cache.q_a)
    return dx + dx_q, g


def mla_decode_absorbed(x, params, shape: MLAShape, theta, positions, latent: LatentCache | None = None, mask=None):
    """One decoding step of MLA in the absorbed form: the new tokens ``x`` attend to the cached
    latents and to themselves (causally), and the cache grows by their latents.

    Parameters
    ----------
    x : array (B, n, D), the new tokens; positions : array (n,), theirs (after the cached ones), or
        (B, n), each row's own (a left-padded batch counts its real tokens only)
    params, shape, theta : as :func:`mla_forward`
    latent : LatentCache of the earlier tokens (B, T, r) and (B, T, dr), or None (T = 0)
    mask : None or a bool array broadcastable to (B, 1, n, T + n) (True: may attend; a batch's
        padding keys False), combined with the causal mask

    Returns
    -------
    y : array (B, n, D), equal to :func:`mla_forward`'s outputs at these positions (up to rounding)
    latent : LatentCache (B, T + n, r), (B, T + n, dr)

    Steps: the query as step 1 of the forward (``q_nope`` and the rotated ``q_pe``); the new
    latents (steps 2 and 4), appended; ``q_lat = q_nope W_uk^T`` per head (..., H, n, r); scores
    ``(q_lat c_hat^T + q_pe k_pe^T) * scale``, causal; ``P = softmax``; ``o_lat = P c_hat`` (..., H, n, r);
    ``o = o_lat W_uv`` per head; heads merged, ``W_o``.
    """
    x, p, theta, positions = check_mla_inputs(x, params, shape, theta, positions, per_row=True)
    check_mla_decode_inputs(x, shape, latent, mask)
    return mla_decode_absorbed_formula(x, p, theta, positions, shape, latent, mask)


def check_mla_decode_inputs(x, shape: MLAShape, latent, mask):
    """:func:`mla_decode_absorbed`'s own checks: ``x`` (B, n, D), ``latent`` None or a LatentCache of ``B``
    rows, ``mask`` None or a bool array broadcastable to (B, 1, n, T + n)."""
    if x.ndim != 3:
        raise ValueError(f"x must have shape (B, n, D) when decoding, got {x.shape}")
    r, dr = shape.kv_lora_rank, shape.qk_rope_head_dim
    B, n = x.shape[:2]
    if latent is not None and (not isinstance(latent, LatentCache) or latent.c_hat.shape[::2] != (B, r)
                               or latent.k_pe.shape != latent.c_hat.shape[:2] + (dr,)):
        raise ValueError(f"latent must be a LatentCache of shapes (B, T, {r}) and (B, T, {dr}) with B = {B}")
    T = 0 if latent is None else latent.c_hat.shape[1]
    if mask is not None:
        mask = np.asarray(mask)
        if mask.dtype != bool:
            raise TypeError(f"mask must be a bool array (True: may attend), got dtype {mask.dtype}")
        try:
            np.broadcast_shapes(mask.shape, (B, 1, n, T + n))
        except ValueError:
            raise ValueError(f"mask must be broadcastable to (B, 1, n, T + n) = {(B, 1, n, T + n)}, got {mask.shape}"
                             ) from None


def mla_decode_absorbed_formula(x, p, theta, positions, shape, latent=None, mask=None):
    """:func:`mla_decode_absorbed` on checked inputs (the DeepSeek-V3 block's decoding step)."""
    H, r = shape.num_heads, shape.kv_lora_rank
    dn, dr, dv = shape.qk_nope_head_dim, shape.qk_rope_head_dim, shape.v_head_dim
    B, n = x.shape[:2]
    if latent is None:
        latent = LatentCache(np.zeros((B, 0, r), x.dtype), np.zeros((B, 0, dr), x.dtype))
    T = latent.c_hat.shape[1]
    cos, sin = _cos_sin(positions, theta, shape, x.dtype)  # (n, dr/2) or (B, n, dr/2)
    q = split_heads_formula(_query(x, p, shape)[0], H)  # (B, H, n, dn + dr)
    q_cos, q_sin = (cos, sin) if cos.ndim == 2 else (cos[:, None], sin[:, None])  # the heads' axis
    q_nope, q_pe = q[..., :dn], rotate(q[..., dn:], q_cos, q_sin, _layout(shape))
    c_new, k_pe_new = _latent(x, p, shape, cos, sin)[:2]
    latent = LatentCache(np.concatenate([latent.c_hat, c_new], axis=1), np.concatenate([latent.k_pe, k_pe_new], axis=1))
    W_kv_b = p["W_kv_b"].reshape(r, H, dn + dv)
    W_uk, W_uv = W_kv_b[..., :dn], W_kv_b[..., dn:]  # (r, H, dn), (r, H, dv)
    q_lat = np.einsum("bhnd,rhd->bhnr", q_nope, W_uk)  # (B, H, n, r): the key's readout folded into the query
    c_all, k_pe_all = latent.c_hat[:, None], latent.k_pe[:, None]  # (B, 1, T + n, r), (B, 1, T + n, dr)
    q_abs = np.concatenate([q_lat, q_pe], axis=-1)  # (B, H, n, r + dr)
    k_abs = np.concatenate([c_all, k_pe_all], axis=-1)  # (B, 1, T + n, r + dr): one key for every head
    allowed = causal_mask(n, T + n) if mask is None else np.logical_and(mask, causal_mask(n, T + n))
    o_lat, _ = attention_formula(q_abs, k_abs, c_all, allowed, scale=_scale(shape))  # (B, H, n, r)
    o = np.einsum("bhnr,rhd->bhnd", o_lat, W_uv)  # (B, H, n, dv): the value's readout after the sum
    y = linear_formula(merge_heads_formula(o), p["W_o"], None)  # (B, n, D)
    return y, latent
