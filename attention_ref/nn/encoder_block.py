"""Transformer encoder block: self-attention and a feed-forward network, each with Add & Norm.

Documents 000 and 004 place multi-head self-attention inside the Transformer encoder,
where every position attends to every other (no mask, except padding). One block:

Post-norm (``norm_first=False``, the original Transformer and the documents):

1. ``h = LN_1(x + SelfAttention(x))``
2. ``y = LN_2(h + FFN(h))``

Pre-norm (``norm_first=True``, GPT-style): ``h = x + SelfAttention(LN_1(x))``,
``y = h + FFN(LN_2(h))``.

Parameters, in one flat dict: ``self_attn.W_q .. self_attn.b_o`` (as
:func:`attention_ref.multi_head_attention_forward`), ``ln1.gamma, ln1.beta``,
``ffn.W_1, ffn.b_1, ffn.W_2, ffn.b_2``, ``ln2.gamma, ln2.beta``.

Symbols: ``...`` batch axes, N sequence length, D model width, F hidden width, H heads.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._checks import as_generator
from .._checks import as_real_array, as_upstream, check_float_dtype, check_positive_int, require_ndim
from .._pair_checks import check_scale
from .._pair_checks import PARAM_NAMES
from ..variants.grouped_heads import multi_head_attention_backward_formula, multi_head_attention_forward
from .feed_forward import ACTIVATIONS, FFN_PARAM_NAMES, feed_forward_backward_formula, feed_forward_forward
from .block_params import check_block_params, check_flag, in_group, join_grads, split_params
from .residual import ResidualCache, glorot_uniform, residual_backward_formula, residual_forward

__all__ = [
    "ENCODER_GROUPS",
    "EncoderBlockCache",
    "TransformerEncoderBlock",
    "encoder_block_forward",
    "encoder_block_backward",
    "init_encoder_block_params",
]

_LN = ("gamma", "beta")
#: The parameter groups of an encoder block and the names each allows.
ENCODER_GROUPS = {"self_attn": PARAM_NAMES, "ln1": _LN, "ffn": FFN_PARAM_NAMES, "ln2": _LN}


class EncoderBlockCache(NamedTuple):
    """Nested caches of the two sub-layers."""

    attn: ResidualCache  # step 1
    ffn: ResidualCache  # step 2
    param_keys: tuple

    @property
    def weights(self) -> np.ndarray:
        """Self-attention probabilities of every head, (..., H, N, N)."""
        return self.attn.sublayer.weights


def _self_attention_backward(ds, attn_cache):
    """Sub-layer backward of self-attention: ``x`` fed query, key and value, so dx sums all three."""
    dquery, dkey, dvalue, grads = multi_head_attention_backward_formula(ds, attn_cache)  # ds is internal: unchecked
    return dquery + dkey + dvalue, grads


def encoder_block_forward(x, params, num_heads, mask=None, norm_first=False, *,
                          activation="relu", eps=1e-5, head_mask=None, scale=None):
    """One Transformer encoder block (self-attention, Add & Norm, FFN, Add & Norm).

    Parameters
    ----------
    x : array (..., n, d_model)
    params : flat dict with the keys of :data:`ENCODER_GROUPS` as ``"group.name"``
        (see :func:`init_encoder_block_params`)
    num_heads : int
    mask : optional self-attention mask (bool, True = may attend, or float), broadcastable
        to (..., n, n), e.g. a padding mask
    norm_first : False for post-norm (``LN(x + Sublayer(x))``), True for pre-norm
        (``x + Sublayer(LN(x))``)
    activation : ``"relu"``, ``"gelu"`` (tanh approximation) or ``"gelu_exact"`` in the feed-forward network
    eps : the layer norms' epsilon
    head_mask : optional (num_heads,) multipliers on the heads' outputs (1 keeps a head,
        0 prunes it)
    scale : the factor on the attention scores; None (default) is ``1 / sqrt(d_k)``

    Returns
    -------
    y : array (..., n, d_model)
    cache : EncoderBlockCache; ``cache.weights`` are the attention probabilities
    """
    num_heads = check_positive_int(num_heads, "num_heads")
    norm_first = check_flag(norm_first, "norm_first")
    scale = check_scale(scale)
    p = split_params(params, ENCODER_GROUPS)
    x = as_real_array(x, "x")
    require_ndim(x, "x", 2, "(..., n, d_model)")
    p = check_block_params(p, x.shape[-1], ("ln1", "ln2"),
                           {"self_attn": ("W_o", "b_o"), "ffn": ("W_2", "b_2")})

    def self_attention(z):
        return multi_head_attention_forward(z, z, z, p["self_attn"], num_heads, mask,
                                            head_mask=head_mask, scale=scale)

    def ffn(z):
        return feed_forward_forward(z, p["ffn"], activation)

    # 1. self-attention sub-layer
    h, attn_cache = residual_forward(x, in_group("self_attn", self_attention), p["ln1"].get("gamma"),
                                     p["ln1"].get("beta"), norm_first=norm_first, eps=eps)  # (..., N, D)
    # 2. feed-forward sub-layer
    y, ffn_cache = residual_forward(h, in_group("ffn", ffn), p["ln2"].get("gamma"),
                                    p["ln2"].get("beta"), norm_first=norm_first, eps=eps)  # (..., N, D)
    return y, EncoderBlockCache(attn_cache, ffn_cache, tuple(params))


def encoder_block_backward(dout, cache: EncoderBlockCache):
    """Gradients of :func:`encoder_block_forward`, its two sub-layers in reverse.

    Parameters
    ----------
    dout : array (..., n, d_model), upstream gradient
    cache : EncoderBlockCache from the forward

    Returns
    -------
    dx : array (..., n, d_model)
    grads : flat dict with the keys of ``params`` (plus ``"self_attn.head_mask"`` when a
        head mask was given)
    """
    dout = as_upstream(dout, cache.ffn.y_shape, cache.ffn.y_dtype)
    g = {}
    # 2. feed-forward sub-layer
    dh, g["ffn"], dgamma2, dbeta2 = residual_backward_formula(dout, cache.ffn, feed_forward_backward_formula)
    g["ln2"] = {"gamma": dgamma2, "beta": dbeta2}
    # 1. self-attention sub-layer
    dx, g["self_attn"], dgamma1, dbeta1 = residual_backward_formula(dh, cache.attn, _self_attention_backward)
    g["ln1"] = {"gamma": dgamma1, "beta": dbeta1}
    return dx, join_grads(g, cache.param_keys)


def init_encoder_block_params(d_model, num_heads, d_ff=None, *, seed=None, dtype=np.float64):
    """Fresh encoder-block parameters: Glorot-uniform weights, zero biases, ``gamma = 1``,
    ``beta = 0``; ``d_ff`` defaults to ``4 * d_model`` (2048 = 4 * 512 in the original)."""
    d_model = check_positive_int(d_model, "d_model")
    num_heads = check_positive_int(num_heads, "num_heads")
    d_ff = 4 * d_model if d_ff is None else check_positive_int(d_ff, "d_ff")
    if d_model % num_heads:
        raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}")
    dtype = check_float_dtype(dtype)
    rng = as_generator(seed)
    p = {}
    for name in ("q", "k", "v", "o"):
        p[f"self_attn.W_{name}"] = glorot_uniform(rng, d_model, d_model, dtype)
        p[f"self_attn.b_{name}"] = np.zeros(d_model, dtype)
    p.update(_ln_params("ln1", d_model, dtype))
    p.update(_ffn_params(rng, "ffn", d_model, d_ff, dtype))
    p.update(_ln_params("ln2", d_model, dtype))
    return p


def _check_block_options(activation, norm_first):
    """Validate a block's activation name and placement flag at construction time."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    check_flag(norm_first, "norm_first")


def _ln_params(group, d_model, dtype):
    """``gamma = 1``, ``beta = 0`` for one layer norm."""
    return {f"{group}.gamma": np.ones(d_model, dtype), f"{group}.beta": np.zeros(d_model, dtype)}


def _ffn_params(rng, group, d_model, d_ff, dtype):
    """Glorot-uniform weights and zero biases for one feed-forward network."""
    return {f"{group}.W_1": glorot_uniform(rng, d_model, d_ff, dtype), f"{group}.b_1": np.zeros(d_ff, dtype),
            f"{group}.W_2": glorot_uniform(rng, d_ff, d_model, dtype), f"{group}.b_2": np.zeros(d_model, dtype)}


class TransformerEncoderBlock:
    """An encoder block holding its parameters and the last forward's cache.

    Parameters
    ----------
    d_model, num_heads, d_ff : widths and head count (``d_ff`` default ``4 * d_model``)
    activation : ``"relu"`` or ``"gelu"``
    norm_first : False (post-norm, the default, as the original Transformer) or True
    eps : the layer norms' epsilon
    seed : seeds the weights (see :func:`init_encoder_block_params`)
    dtype : float64 (default) or float32

    Attributes
    ----------
    params : flat dict keyed by dotted names (``"self_attn.W_q"``, ``"ln1.gamma"``, ...)
    grads : dict with the same keys after :meth:`backward`
    cache : the last forward's cache (``cache.weights`` are the attention probabilities)
    """

    def __init__(self, d_model, num_heads, d_ff=None, *, activation="relu", norm_first=False,
                 eps=1e-5, seed=None, dtype=np.float64):
        _check_block_options(activation, norm_first)
        self.params = init_encoder_block_params(d_model, num_heads, d_ff, seed=seed, dtype=dtype)
        self.d_model, self.d_ff = d_model, self.params["ffn.W_1"].shape[1]
        self.num_heads, self.activation, self.norm_first, self.eps = num_heads, activation, norm_first, eps
        self.dtype = self.params["ffn.W_1"].dtype
        self.grads = None
        self.cache = None

    def __repr__(self):
        return (f"TransformerEncoderBlock(d_model={self.d_model}, num_heads={self.num_heads}, d_ff={self.d_ff},"
                f" activation={self.activation!r}, norm_first={self.norm_first}, eps={self.eps},"
                f" dtype='{self.dtype}')")

    def forward(self, x, mask=None, head_mask=None):
        """Run the block on ``x`` (..., n, d_model); returns (..., n, d_model)."""
        y, self.cache = encoder_block_forward(x, self.params, self.num_heads, mask, self.norm_first,
                                              activation=self.activation, eps=self.eps,
                                              head_mask=head_mask)
        return y

    __call__ = forward

    def backward(self, dout):
        """Store the parameter gradients in ``self.grads`` and return ``dx``."""
        if self.cache is None:
            raise RuntimeError("backward called before forward")
        dx, self.grads = encoder_block_backward(dout, self.cache)
        return dx
