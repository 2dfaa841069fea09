"""The classic wrong derivations, each a real (wrong) implementation with the one sentence
that names it.

Every function here has the signature of the backward it gets wrong and receives the
library forward's cache, so the checker can run it on the same inputs as a student's
attempt and see whether the attempt makes the same mistake. The sentences name the wrong
formula and the right one; :mod:`attention_ref.exercises.catalogue` attaches them to their
exercises, and the tests commit each one as a student's attempt and assert it is named.

Symbols: ``...`` batch axes, Nq/Nk query/key length, Dk/Dv head widths, D model width.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable

import numpy as np

from .._checks import signals_land_here, unbroadcast

from ..core.attention import _attention_backward
from ..core.heads import _merge, _split
from ..core.linear import LinearCache, _linear_backward
from ..core.multi_head import _multi_head_attention_backward
from ..core.softmax import _softmax
from ..variants.blockwise import _key_blocks, _scores
from ..nn.feed_forward import feed_forward_backward_formula
from ..nn.layer_norm import layer_norm_backward_formula
from ..nn.block_params import join_grads

__all__ = ["ANY", "Mistake", "MISTAKES"]

#: In a mistake's prediction: this output is not predicted (any value matches)
ANY = object()


@dataclass(frozen=True)
class Mistake:
    """One wrong derivation: ``backward(dout, cache)`` computes it, ``sentence`` names it."""

    name: str
    sentence: str
    backward: Callable


def _sum_to(grad, shape):
    """Sum the broadcast leading axes of ``grad`` away (the right bias/batch reduction)."""
    extra = grad.ndim - len(shape)
    return grad.sum(axis=tuple(range(extra))) if extra else grad


# -- softmax: dx_i = y_i (dy_i - sum_j y_j dy_j) ---------------------------------------

def _softmax_diagonal_only(dy, cache):
    return dy * cache.y * (1 - cache.y)  # keeps dy_i/dx_i only


def _softmax_without_sum_term(dy, cache):
    return cache.y * dy  # drops - sum_j y_j dy_j


def _softmax_sum_term_sign(dy, cache):
    y, axis = cache
    return y * (dy + (dy * y).sum(axis=axis, keepdims=True))


def _softmax_y_factor_missing(dy, cache):
    y, axis = cache
    return dy - (dy * y).sum(axis=axis, keepdims=True)  # the leading y_i dropped


def _softmax_sum_of_dy(dy, cache):
    y, axis = cache
    return y * (dy - dy.sum(axis=axis, keepdims=True))  # sum_j dy_j, without the weights y_j


def _softmax_sum_axis(dy, cache, *, fixed):
    y, _ = cache
    return y * (dy - (dy * y).sum(axis=fixed, keepdims=True))


# -- linear: y = x W + b -----------------------------------------------------------------

def _linear_dW_transposed(dy, cache: LinearCache):
    x, W, has_bias = cache
    dx = dy @ W.T  # (..., Din)
    dW = dy.reshape(-1, dy.shape[-1]).T @ x.reshape(-1, x.shape[-1])  # (Dout, Din): dy^T x
    return dx, dW, _sum_to(dy, (dy.shape[-1],)) if has_bias else None


def _linear_db_not_summed(dy, cache: LinearCache):
    x, W, has_bias = cache
    dx = dy @ W.T  # (..., Din)
    dW = x.reshape(-1, x.shape[-1]).T @ dy.reshape(-1, dy.shape[-1])  # (Din, Dout)
    return dx, dW, dy.sum(axis=0) if has_bias else None  # only the first axis


# -- scaled dot-product attention --------------------------------------------------------

def _attention_parts(dout, cache, *, scale_power=1, softmax="full", mask=True, dk_transposed=False,
                     recompute=None):
    """The attention backward with one step done the wrong way (the right way by default);
    ``scale_power`` 0 forgets ``1/sqrt(d_k)``, 2 applies it twice; ``recompute="no max"``
    recomputes P as exp(S) / sum exp(S), without subtracting the row maximum."""
    q, k, v, P, out, true_scale = cache
    scale = true_scale ** scale_power
    if not mask:  # recompute the probabilities without the mask
        P = _softmax((q * true_scale) @ k.swapaxes(-1, -2), -1)  # (..., Nq, Nk)
    if recompute == "no max":  # the same probabilities, from the scores themselves
        with np.errstate(over="ignore", invalid="ignore"):
            S = (q * true_scale) @ k.swapaxes(-1, -2)  # (..., Nq, Nk)
            E = np.where(P > 0, np.exp(S), 0.0)  # the mask through the cached zeros
            P = E / E.sum(axis=-1, keepdims=True)  # inf / inf = nan where exp overflows
            signals_land_here()  # a Ctrl-C is raised inside the block (_pair_checks.py)
    dv = P.swapaxes(-1, -2) @ dout  # (..., Nk, Dv)
    dP = dout @ v.swapaxes(-1, -2)  # (..., Nq, Nk)
    with np.errstate(invalid="ignore"):
        if softmax == "full":
            dS = P * (dP - (P * dP).sum(axis=-1, keepdims=True))  # (..., Nq, Nk)
        elif softmax == "diagonal":
            dS = P * (1 - P) * dP
        else:  # "no softmax": the scores treated as the weights
            dS = dP
        signals_land_here()  # a Ctrl-C is raised inside the block (_pair_checks.py)
    dq = dS @ k * scale  # (..., Nq, Dk)
    dk = (dS @ q if dk_transposed else dS.swapaxes(-1, -2) @ q) * scale  # (..., Nk, Dk)
    return unbroadcast(dq, q.shape), unbroadcast(dk, k.shape), unbroadcast(dv, v.shape)


# -- heads ----------------------------------------------------------------------------------

def _split_backward_by_reshape(dheads):
    *batch, h, n, d_head = dheads.shape
    return dheads.reshape(*batch, n, h * d_head)  # no transpose back: heads and positions mixed


def _merge_backward_by_reshape(dmerged, num_heads):
    *batch, n, width = dmerged.shape
    return dmerged.reshape(*batch, num_heads, n, width // num_heads)


def _split_backward_interleaved(dheads):
    *batch, h, n, d_head = dheads.shape
    return np.moveaxis(dheads, -3, -1).reshape(*batch, n, h * d_head)  # features ordered (Dh, H)


def _merge_backward_interleaved(dmerged, num_heads):
    *batch, n, width = dmerged.shape
    return np.moveaxis(dmerged.reshape(*batch, n, width // num_heads, num_heads), -1, -3)  # split as (Dh, H)


def _split_backward_first_axes_swapped(dheads):
    *batch, h, n, d_head = dheads.shape
    return np.swapaxes(dheads, 0, 1).reshape(*batch, n, h * d_head)  # axes 0 and 1: H and N only unbatched


def _merge_backward_first_axes_swapped(dmerged, num_heads):
    *batch, n, width = dmerged.shape
    split = dmerged.reshape(*batch, n, num_heads, width // num_heads)  # (..., N, H, Dh)
    return np.swapaxes(split, 0, 1).reshape(*batch, num_heads, n, width // num_heads)  # N and H only unbatched


def _split_backward_heads_reversed(dheads):
    return _merge(dheads[..., ::-1, :, :])  # concatenated in the wrong head order


# -- layer norm: x_hat = (x - mu) rstd, y = gamma x_hat + beta --------------------------------

def _layer_norm_parts(dy, cache, *, mean_terms=True, x_hat_term=True, gain=True):
    x_hat, rstd, gamma = cache
    d = x_hat.shape[-1]
    dgamma = (dy * x_hat).reshape(-1, d).sum(axis=0)  # (D,)
    dbeta = dy.reshape(-1, d).sum(axis=0)  # (D,)
    g = dy * gamma if gain else dy  # (..., D)
    if not mean_terms:
        return rstd * g, dgamma, dbeta
    dx = g - g.mean(axis=-1, keepdims=True)
    if x_hat_term:
        dx = dx - x_hat * (g * x_hat).mean(axis=-1, keepdims=True)
    return rstd * dx, dgamma, dbeta


def _layer_norm_dgamma_not_summed(dy, cache):
    dx, _, dbeta = _layer_norm_parts(dy, cache)
    return dx, (dy * cache.x_hat)[(0,) * (dy.ndim - 1)], dbeta  # the first row only


# -- blockwise (flash) attention -------------------------------------------------------------

def _flash_parts(dout, cache, *, normalise=True, row_D=True, accumulate=True, scaled=True, softmax="full",
                 use_window=True, use_causal=True, use_mask=True, subtract_max=True):
    """The tiled backward with one step done the wrong way (the right way by default)."""
    q, k, v, mask, out, row_max, log_row_sum, scale, causal, window, block = cache
    window = window if use_window else None
    causal = causal if use_causal else False
    mask = mask if use_mask else None
    n_q, n_k = q.shape[-2], k.shape[-2]
    batch = out.shape[:-2]
    D = (dout * out).sum(axis=-1)  # (..., Nq)
    dq = np.zeros(batch + q.shape[-2:])  # (..., Nq, Dk)
    dk = np.zeros(batch + k.shape[-2:])  # (..., Nk, Dk)
    dv = np.zeros(batch + v.shape[-2:])  # (..., Nk, Dv)
    for qs in range(0, n_q, block):
        qe = min(qs + block, n_q)
        q_blk = q[..., qs:qe, :] * scale  # (..., Bq, Dk)
        for ks in _key_blocks(qs, qe, n_q, n_k, block, causal, window):
            ke = min(ks + block, n_k)
            s = _scores(q_blk, k, mask, qs, qe, ks, ke, n_q, n_k, causal, window)  # (..., Bq, Bk)
            with np.errstate(over="ignore", invalid="ignore"):
                lse = row_max[..., qs:qe, None] + (log_row_sum[..., qs:qe, None] if normalise else 0)
                if subtract_max:
                    p = np.nan_to_num(np.exp(s - lse))  # (..., Bq, Bk); blocked: exp(-inf) = 0
                else:  # exp(S) / exp(m + log l): equal on paper, inf / inf where exp(S) overflows
                    p = np.where(np.isneginf(s), 0.0, np.exp(s) / np.exp(lse))
                signals_land_here()  # a Ctrl-C is raised inside the block (_pair_checks.py)
            dp = dout[..., qs:qe, :] @ v[..., ks:ke, :].swapaxes(-1, -2)  # (..., Bq, Bk)
            with np.errstate(invalid="ignore"):
                D_blk = D[..., qs:qe, None] if row_D else (p * dp).sum(axis=-1, keepdims=True)
                ds = p * (dp - D_blk) if softmax == "full" else p * (1 - p) * dp  # (..., Bq, Bk)
                signals_land_here()  # a Ctrl-C is raised inside the block (_pair_checks.py)
            s_ = scale if scaled else 1.0
            dq[..., qs:qe, :] += ds @ k[..., ks:ke, :] * s_
            if accumulate:
                dk[..., ks:ke, :] += ds.swapaxes(-1, -2) @ q[..., qs:qe, :] * s_
                dv[..., ks:ke, :] += p.swapaxes(-1, -2) @ dout[..., qs:qe, :]
            else:  # the last query block that visits a key block overwrites the others
                dk[..., ks:ke, :] = ds.swapaxes(-1, -2) @ q[..., qs:qe, :] * s_
                dv[..., ks:ke, :] = p.swapaxes(-1, -2) @ dout[..., qs:qe, :]
    return unbroadcast(dq, q.shape), unbroadcast(dk, k.shape), unbroadcast(dv, v.shape)


# -- multi-head attention: the library's backward with one step changed ---------------------

def _multi_head_parts(dout, c, attention_backward=_attention_backward):
    """The plain multi-head backward with its attention step done by ``attention_backward``:
    a part's mistake inside the whole."""
    grads = {}
    dconcat, grads["W_o"], grads["b_o"] = _linear_backward(dout, c.o_proj)  # (..., Nq, H*Dv)
    dq, dk, dv = attention_backward(_split(dconcat, c.num_heads), c.attention)  # (..., H, N, D)
    dQ, dK, dV = _merge(dq), _merge(dk), _merge(dv)
    dquery, grads["W_q"], grads["b_q"] = _linear_backward(dQ, c.q_proj)
    dkey, grads["W_k"], grads["b_k"] = _linear_backward(dK, c.k_proj)
    dvalue, grads["W_v"], grads["b_v"] = _linear_backward(dV, c.v_proj)
    return dquery, dkey, dvalue, {n: grads[n] for n in c.param_keys}


def _multi_head_dW_o_transposed(dout, cache):
    dquery, dkey, dvalue, grads = _multi_head_attention_backward(dout, cache)
    return dquery, dkey, dvalue, {**grads, "W_o": grads["W_o"].T}  # dout^T concat = (concat^T dout)^T


def _multi_head_scale_missing(dout, cache):
    unscaled = cache._replace(attention=cache.attention._replace(scale=1.0))  # the forward's scores stay
    return _multi_head_attention_backward(dout, unscaled)


def _multi_head_b_o_not_summed(dout, cache):
    dquery, dkey, dvalue, grads = _multi_head_attention_backward(dout, cache)
    biases = {b: ANY for b in ("b_q", "b_k", "b_v") if grads.get(b) is not None}  # summed the same wrong way
    if grads.get("b_o") is None:  # no biases: nothing to get wrong
        return dquery, dkey, dvalue, grads
    return dquery, dkey, dvalue, {**grads, **biases, "b_o": dout.sum(axis=0)}


# -- encoder block: two residual sub-layers; x feeds query, key and value -------------------------

def _residual_parts(dy, cache, sublayer_backward, *, skip=True, norm_backward=layer_norm_backward_formula):
    """The residual sub-layer's backward; ``skip=False`` forgets the skip connection's term."""
    if cache.norm_first:  # y = x + s(LN(x))
        dz, extra = sublayer_backward(dy, cache.sublayer)
        dx_norm, dgamma, dbeta = norm_backward(dz, cache.norm)
        return (dy + dx_norm if skip else dx_norm), extra, dgamma, dbeta
    dsum, dgamma, dbeta = norm_backward(dy, cache.norm)  # y = LN(x + s(x))
    dz, extra = sublayer_backward(dsum, cache.sublayer)
    return (dsum + dz if skip else dz), extra, dgamma, dbeta


def _encoder_parts(dout, cache, *, paths=("query", "key", "value"), skip=("attn", "ffn"),
                   norm_backward=layer_norm_backward_formula, attention_backward=_attention_backward):
    """The encoder block's backward with one step done the wrong way (the right way by default);
    ``skip`` names the sub-layers whose skip path is kept; ``norm_backward`` and
    ``attention_backward`` put a part's mistake inside the whole."""
    def self_attention(ds, c):
        dquery, dkey, dvalue, grads = _multi_head_parts(ds, c, attention_backward)
        return sum(d for name, d in zip(("query", "key", "value"), (dquery, dkey, dvalue)) if name in paths), grads
    g = {}
    dh, g["ffn"], dgamma2, dbeta2 = _residual_parts(dout, cache.ffn, feed_forward_backward_formula, skip="ffn" in skip,
                                                    norm_backward=norm_backward)
    g["ln2"] = {"gamma": dgamma2, "beta": dbeta2}
    dx, g["self_attn"], dgamma1, dbeta1 = _residual_parts(dh, cache.attn, self_attention, skip="attn" in skip,
                                                          norm_backward=norm_backward)
    g["ln1"] = {"gamma": dgamma1, "beta": dbeta1}
    return dx, join_grads(g, cache.param_keys)


_D = "dS = P * (dP - D) with D_i = sum_j P_ij dP_ij"

#: exercise name -> its catalogue of classic mistakes, most common first
MISTAKES = {
    "softmax_backward": (
        Mistake("diagonal-only Jacobian",
                "you kept only the diagonal of the softmax Jacobian, dx_i = dy_i y_i (1 - y_i); every y_i"
                " depends on every x_j, so dx_i = y_i (dy_i - sum_j y_j dy_j)", _softmax_diagonal_only),
        Mistake("missing sum term",
                "you dropped the term - sum_j y_j dy_j: dx_i = y_i dy_i; the right formula is"
                " dx_i = y_i (dy_i - sum_j y_j dy_j)", _softmax_without_sum_term),
        Mistake("sum term with the wrong sign",
                "the sum term has the wrong sign, dx_i = y_i (dy_i + sum_j y_j dy_j); it is"
                " dx_i = y_i (dy_i - sum_j y_j dy_j)", _softmax_sum_term_sign),
        Mistake("leading y factor missing",
                "your dx misses the leading factor y_i: dx_i = dy_i - sum_j y_j dy_j; the Jacobian is"
                " dy_i/dx_j = y_i (delta_ij - y_j), so dx_i = y_i (dy_i - sum_j y_j dy_j)",
                _softmax_y_factor_missing),
        Mistake("sum of dy without the weights",
                "your sum term is sum_j dy_j; each dy_j is weighted by y_j: dx_i = y_i (dy_i - sum_j y_j dy_j)",
                _softmax_sum_of_dy),
        Mistake("sum along axis 0",
                "your sum_j y_j dy_j runs along axis 0 whatever the softmax's axis: sum along"
                " cache.axis (keepdims=True), the axis the softmax normalised", partial(_softmax_sum_axis, fixed=0)),
        Mistake("sum along the last axis whatever cache.axis",
                "your sum_j y_j dy_j always runs along the last axis: right for the default axis=-1,"
                " wrong for another; sum along cache.axis", partial(_softmax_sum_axis, fixed=-1)),
    ),
    "linear_backward": (
        Mistake("transposed weight gradient",
                "your dW is transposed: dW = dy^T x has shape (d_out, d_in); it must be dW = x^T dy,"
                " shaped like W (d_in, d_out)", _linear_dW_transposed),
        Mistake("bias gradient not summed over the batch axes",
                "your db sums dy over the first axis only; b is added to every row of every batch"
                " item, so db = dy summed over all axes but the last, shape (d_out,)", _linear_db_not_summed),
    ),
    "scaled_dot_product_attention_backward": (
        Mistake("missing 1/sqrt(d_k)",
                "your dq and dk miss the factor 1/sqrt(d_k): S = q k^T / sqrt(d_k), so"
                " dq = dS k / sqrt(d_k) and dk = dS^T q / sqrt(d_k)", partial(_attention_parts, scale_power=0)),
        Mistake("1/sqrt(d_k) applied twice",
                "your dq and dk carry 1/sqrt(d_k) twice (1/d_k): scale once, dq = dS k / sqrt(d_k)",
                partial(_attention_parts, scale_power=2)),
        Mistake("masked positions let through",
                "your gradient flows through masked positions: the backward recomputes"
                " P = softmax(q k^T / sqrt(d_k)) without the mask; use the cached weights (0 where"
                " masked), so " + _D + " is 0 there", partial(_attention_parts, mask=False)),
        Mistake("diagonal-only softmax Jacobian",
                "inside attention you used the diagonal-only softmax Jacobian, dS = P (1 - P) dP;"
                " it is " + _D, partial(_attention_parts, softmax="diagonal")),
        Mistake("softmax skipped",
                "you passed dP straight to the scores (dS = dP), skipping the softmax; it is " + _D,
                partial(_attention_parts, softmax="skipped")),
        Mistake("dk without the transpose",
                "your dk is dS q / sqrt(d_k); S_ij pairs query i with key j, so dk = dS^T q / sqrt(d_k)",
                partial(_attention_parts, dk_transposed=True)),
        Mistake("P recomputed without the row maximum",
                "you recomputed P = exp(S) / sum exp(S) without subtracting the row maximum: exp"
                " overflows on large scores (inf / inf = NaN); use the cached weights, or"
                " exp(S - max S) / sum exp(S - max S)", partial(_attention_parts, recompute="no max")),
    ),
    "split_heads_backward": (
        Mistake("reshape without moving the heads back",
                "you reshaped (..., H, N, Dh) straight to (..., N, H*Dh); the heads axis must first be"
                " moved back next to Dh: dx = reshape(moveaxis(dheads, -3, -2), (..., N, H*Dh))",
                _split_backward_by_reshape),
        Mistake("heads concatenated in reverse order",
                "your heads are concatenated in reverse order: head i owns columns i*Dh:(i+1)*Dh",
                _split_backward_heads_reversed),
        Mistake("features interleaved (Dh, H)",
                "your dx interleaves the heads' features (its last axis is ordered (Dh, H)); head i owns the"
                " whole block of columns i*Dh:(i+1)*Dh, so put H before Dh: moveaxis(dheads, -3, -2)",
                _split_backward_interleaved),
        Mistake("axes 0 and 1 swapped whatever the batch axes",
                "you swapped axes 0 and 1: that moves H back next to Dh only when there are no batch axes;"
                " count from the end, dx = reshape(moveaxis(dheads, -3, -2), (..., N, H*Dh))",
                _split_backward_first_axes_swapped),
    ),
    "merge_heads_backward": (
        Mistake("reshape without moving the heads axis",
                "you reshaped (..., N, H*Dh) straight to (..., H, N, Dh); split the last axis into"
                " (H, Dh) first, then move H before N: moveaxis(reshape(d, (..., N, H, Dh)), -2, -3)",
                _merge_backward_by_reshape),
        Mistake("features split as (Dh, H)",
                "you split the last axis as (Dh, H); the merge concatenates whole heads, so split it as"
                " (H, Dh): reshape(d, (..., N, H, Dh)), then move H before N", _merge_backward_interleaved),
        Mistake("axes 0 and 1 swapped whatever the batch axes",
                "you swapped axes 0 and 1: that moves H before N only when there are no batch axes; count"
                " from the end, moveaxis(reshape(d, (..., N, H, Dh)), -2, -3)", _merge_backward_first_axes_swapped),
    ),
    "layer_norm_backward": (
        Mistake("mean and variance treated as constants",
                "you treated the mean and the variance as constants, dx = rstd * gamma * dy; both"
                " depend on x: dx = rstd (g - mean(g) - x_hat mean(g x_hat)) with g = gamma * dy",
                partial(_layer_norm_parts, mean_terms=False)),
        Mistake("variance treated as a constant",
                "you kept the mean's term but not the variance's: dx = rstd (g - mean(g)); add"
                " - x_hat mean(g x_hat), with g = gamma * dy", partial(_layer_norm_parts, x_hat_term=False)),
        Mistake("gain forgotten in dx",
                "your dx misses the gain: the gradient reaching x_hat is g = gamma * dy, not dy; then"
                " dx = rstd (g - mean(g) - x_hat mean(g x_hat))", partial(_layer_norm_parts, gain=False)),
        Mistake("dgamma not summed over rows",
                "your dgamma is one row's dy * x_hat; gamma scales every row, so dgamma = sum over"
                " rows of dy * x_hat", _layer_norm_dgamma_not_summed),
    ),
    "flash_attention_backward": (
        Mistake("probabilities not normalised",
                "you recomputed P = exp(S - m) without dividing by the row sum l; use the saved"
                " log-sum-exp, P = exp(S - m - log l)", partial(_flash_parts, normalise=False)),
        Mistake("D from one tile",
                "your D is summed over one tile of keys; D_i = sum_j P_ij dP_ij runs over the whole"
                " row, which is rowsum(dout_i * out_i)", partial(_flash_parts, row_D=False)),
        Mistake("dk and dv overwritten",
                "your dk and dv keep only the last query block's contribution: accumulate them,"
                " dk[keys] += dS^T q / sqrt(d_k) and dv[keys] += P^T dout, over every query block",
                partial(_flash_parts, accumulate=False)),
        Mistake("missing 1/sqrt(d_k)",
                "your dq and dk miss the factor 1/sqrt(d_k): dq = dS k / sqrt(d_k), dk = dS^T q / sqrt(d_k)",
                partial(_flash_parts, scaled=False)),
        Mistake("diagonal-only softmax Jacobian",
                "inside each tile you used the diagonal-only softmax Jacobian, dS = P (1 - P) dP; it is"
                " dS = P * (dP - D) with D_i = rowsum(dout_i * out_i)", partial(_flash_parts, softmax="diagonal")),
        Mistake("window ignored",
                "your backward ignores the window: keys farther than `window` from a query get P = 0 in the"
                " forward; skip those tiles and mask those scores (_key_blocks and _scores take window)",
                partial(_flash_parts, use_window=False)),
        Mistake("causal rule ignored",
                "your backward ignores causal=True: keys after a query get P = 0 in the forward; pass"
                " causal to _key_blocks and _scores", partial(_flash_parts, use_causal=False)),
        Mistake("user mask ignored",
                "your backward ignores the caller's mask (cache.mask): blocked keys get P = 0 in the"
                " forward; pass it to _scores", partial(_flash_parts, use_mask=False)),
        Mistake("P recomputed without the row maximum",
                "you recomputed P as exp(S) / exp(m + log l): equal on paper, but exp(S) overflows on"
                " large scores (inf / inf = NaN); subtract first, P = exp(S - m - log l)",
                partial(_flash_parts, subtract_max=False)),
    ),
    "encoder_block_backward": (
        Mistake("self-attention paths not summed",
                "your dx takes only the query path of the self-attention: x is the query, the key and"
                " the value, so dx = dquery + dkey + dvalue (plus the residual path)",
                partial(_encoder_parts, paths=("query",))),
        Mistake("self-attention's value path dropped",
                "your dx sums the query and key paths of the self-attention but not the value's: x is the"
                " value too, so dx = dquery + dkey + dvalue (plus the residual path)",
                partial(_encoder_parts, paths=("query", "key"))),
        Mistake("self-attention's key path dropped",
                "your dx sums the query and value paths of the self-attention but not the key's: x is the"
                " key too, so dx = dquery + dkey + dvalue (plus the residual path)",
                partial(_encoder_parts, paths=("query", "value"))),
        Mistake("residual path dropped",
                "your dx drops the residual connection: the skip path adds its own term to dx, the"
                " upstream gradient itself (pre-norm, y = x + s(LN(x))) or the layer norm's input"
                " gradient (post-norm, y = LN(x + s(x))), besides the sub-layer's",
                partial(_encoder_parts, skip=())),
        Mistake("feed-forward's skip path dropped",
                "your dx drops the feed-forward sub-layer's skip path: the gradient reaching the block's"
                " middle h is the feed-forward's input gradient plus the skip's term, dy itself (pre-norm,"
                " y = h + FFN(LN(h))) or the layer norm's input gradient (post-norm, y = LN(h + FFN(h)))",
                partial(_encoder_parts, skip=("attn",))),
        Mistake("self-attention's skip path dropped",
                "your dx drops the self-attention sub-layer's skip path: dx is the self-attention's input"
                " gradient plus the skip's term, dh itself (pre-norm, h = x + MHA(LN(x))) or the layer"
                " norm's input gradient (post-norm, h = LN(x + MHA(x)))", partial(_encoder_parts, skip=("ffn",))),
    ),
    "multi_head_attention_backward": (
        Mistake("transposed W_o gradient",
                "your dW_o is transposed: dW_o = dout^T concat; it must be concat^T dout, shaped like"
                " W_o (H*Dv, D)", _multi_head_dW_o_transposed),
        Mistake("missing 1/sqrt(d_k)",
                "the attention step misses 1/sqrt(d_k) in dq and dk (S = q k^T / sqrt(d_k), d_k the"
                " width of one head)", _multi_head_scale_missing),
        Mistake("bias gradients not summed over the batch axes",
                "your db_o sums dout over the first axis only; a bias is added to every position"
                " of every batch item, so sum over all axes but the last", _multi_head_b_o_not_summed),
    ),
}


def _inside(part: str, mistakes, names, make):
    """A part's catalogue mistakes, named inside a composite exercise: ``make(backward)`` is the
    composite backward with the part's step done by that (wrong) backward."""
    return tuple(Mistake(f"{part}: {m.name}", f"in the {part}, {m.sentence}", make(m.backward))
                 for m in mistakes if m.name in names)


_ATTENTION_PARTS = ("diagonal-only softmax Jacobian", "softmax skipped", "masked positions let through",
                    "dk without the transpose", "1/sqrt(d_k) applied twice", "P recomputed without the row maximum")
MISTAKES["multi_head_attention_backward"] += _inside(
    "attention step", MISTAKES["scaled_dot_product_attention_backward"], _ATTENTION_PARTS,
    lambda wrong: partial(_multi_head_parts, attention_backward=wrong))
MISTAKES["encoder_block_backward"] += _inside(
    "layer norms", MISTAKES["layer_norm_backward"],
    ("mean and variance treated as constants", "variance treated as a constant", "gain forgotten in dx"),
    lambda wrong: partial(_encoder_parts, norm_backward=wrong))
MISTAKES["encoder_block_backward"] += _inside(
    "self-attention's attention step", MISTAKES["scaled_dot_product_attention_backward"],
    ("missing 1/sqrt(d_k)",) + _ATTENTION_PARTS[:-1], lambda wrong: partial(_encoder_parts, attention_backward=wrong))
