"""Student-style attempts at the nine exercises, written unlike the library (einsum, loops over
heads and rows, other orders of the steps, other variable names): no correct attempt fails, no
wrong one passes, and each wrong one gets the diagnosis written next to it: the catalogue
mistake it makes (named), the step it points at (located), a specific observation (an order,
a factor, a precision, a block of zeros: seen), or, listed in docs/exercises.md with why, only
the generic line.

The first block holds the five attempts that used to pass though wrong and the five whose
diagnosis used to mislead (issue 21)."""
import math

import numpy as np
import pytest

from attention_ref.exercises import EXERCISES, MISTAKES, check
from attention_ref.variants.blockwise import _key_blocks, _scores

H_STALE, DH_STALE = 2, 3  # a notebook's globals, from an earlier cell

# -- correct attempts in other styles --------------------------------------------------------------


def softmax_loop(dy, cache):
    y = np.moveaxis(cache.y, cache.axis, -1)
    g = np.moveaxis(dy, cache.axis, -1)
    dx = np.empty_like(y)
    for idx in np.ndindex(y.shape[:-1]):
        row, d = y[idx], g[idx]
        jac = np.diag(row) - np.outer(row, row)  # the whole Jacobian of one row
        dx[idx] = jac @ d
    return np.moveaxis(dx, -1, cache.axis)


def linear_einsum(dy, cache):
    x, W = cache.x, cache.W
    dW = np.einsum("ri,ro->io", x.reshape(-1, W.shape[0]), dy.reshape(-1, W.shape[1]))
    db = dy.reshape(-1, W.shape[1]).sum(0) if cache.has_bias else None
    return np.einsum("...o,io->...i", dy, W), dW, db


def attention_einsum(dout, cache):
    P, scale = cache.weights, cache.scale
    dv = np.einsum("...ij,...id->...jd", P, dout)
    dP = np.einsum("...id,...jd->...ij", dout, cache.v)
    D = np.einsum("...id,...id->...i", dout, cache.out)[..., None]
    dS = P * (dP - D)
    dq = np.einsum("...ij,...jd->...id", dS, cache.k) * scale
    dk = np.einsum("...ij,...id->...jd", dS, cache.q) * scale
    return _sum_to(dq, cache.q.shape), _sum_to(dk, cache.k.shape), _sum_to(dv, cache.v.shape)


def _sum_to(g, shape):
    while g.ndim > len(shape):
        g = g.sum(0)
    return g.sum(axis=tuple(i for i, (a, b) in enumerate(zip(g.shape, shape)) if b == 1 and a != 1), keepdims=True)


def attention_other_order(dout, cache):
    q, k, v, P, out, scale = cache
    dP = dout @ np.swapaxes(v, -1, -2)
    dS = P * dP - P * np.sum(P * dP, axis=-1, keepdims=True)
    dk = scale * np.swapaxes(dS, -1, -2) @ q
    dq = scale * dS @ k
    dv = np.swapaxes(P, -1, -2) @ dout
    return _sum_to(dq, q.shape), _sum_to(dk, k.shape), _sum_to(dv, v.shape)


def split_loop(dheads):
    *batch, h, n, d = dheads.shape
    dx = np.zeros((*batch, n, h * d), dheads.dtype)
    for i in range(h):
        dx[..., :, i * d:(i + 1) * d] = dheads[..., i, :, :]
    return dx


def merge_loop(dmerged, num_heads):
    d = dmerged.shape[-1] // num_heads
    return np.stack([dmerged[..., :, i * d:(i + 1) * d] for i in range(num_heads)], axis=-3)


def layer_norm_explicit(dy, cache):
    x_hat, rstd, gamma = cache.x_hat, cache.rstd, cache.gamma
    n = x_hat.shape[-1]
    g = dy * gamma
    dvar_term = (g * x_hat).sum(-1, keepdims=True)
    dmean_term = g.sum(-1, keepdims=True)
    dx = rstd / n * (n * g - dmean_term - x_hat * dvar_term)
    axes = tuple(range(dy.ndim - 1))
    return dx, (dy * x_hat).sum(axis=axes), dy.sum(axis=axes)


def flash_tiles(dout, cache, *, subtract=True, window=True, causal=True, user_mask=True, hs=None):
    q, k, v, mask, out = cache.q, cache.k, cache.v, cache.mask, cache.out
    m, log_l, scale, b = cache.row_max, cache.log_row_sum, cache.scale, cache.block_size
    w = cache.window if window else None
    c = cache.causal if causal else False
    mk = mask if user_mask else None
    n_q, n_k = q.shape[-2], k.shape[-2]
    dq = np.zeros(out.shape[:-1] + q.shape[-1:], q.dtype)
    dk = np.zeros(out.shape[:-2] + k.shape[-2:], q.dtype)
    dv = np.zeros(out.shape[:-2] + v.shape[-2:], q.dtype)
    D = np.einsum("...qd,...qd->...q", dout, out)[..., None]
    for qs in range(0, n_q, b):
        qe = min(qs + b, n_q)
        for ks in _key_blocks(qs, qe, n_q, n_k, b, c, w):
            ke = min(ks + b, n_k)
            s = _scores(q[..., qs:qe, :] * scale, k, mk, qs, qe, ks, ke, n_q, n_k, c, w)
            with np.errstate(over="ignore", invalid="ignore"):
                if subtract:
                    p = np.nan_to_num(np.exp(s - m[..., qs:qe, None] - log_l[..., qs:qe, None]))
                else:  # the same on paper
                    p = np.where(np.isneginf(s), 0.0, np.exp(s) / np.exp(m[..., qs:qe, None] + log_l[..., qs:qe, None]))
                dp = np.einsum("...qd,...kd->...qk", dout[..., qs:qe, :], v[..., ks:ke, :])
                ds = p * (dp - D[..., qs:qe, :])
            dq[..., qs:qe, :] += np.einsum("...qk,...kd->...qd", ds, k[..., ks:ke, :]) * scale
            dk[..., ks:ke, :] += np.einsum("...qk,...qd->...kd", ds, q[..., qs:qe, :]) * scale
            dv[..., ks:ke, :] += np.einsum("...qk,...qd->...kd", p, dout[..., qs:qe, :])
    return _sum_to(dq, q.shape), _sum_to(dk, k.shape), _sum_to(dv, v.shape)


def _attention_core(dout, q, k, v, P, scale, softmax="full"):
    """dq, dk, dv of one (batched) attention, einsum style."""
    dv = np.einsum("...ij,...id->...jd", P, dout)
    dP = np.einsum("...id,...jd->...ij", dout, v)
    if softmax == "full":
        dS = P * (dP - (P * dP).sum(-1, keepdims=True))
    elif softmax == "diagonal":
        dS = P * (1 - P) * dP
    else:
        dS = dP
    return np.einsum("...ij,...jd->...id", dS, k) * scale, np.einsum("...ij,...id->...jd", dS, q) * scale, dv


def multi_head_by_heads(dout, cache, *, h=None, dh=None, divide=1.0, softmax="full", skip_head=None,
                        dict_swap=False):
    """Loops over the heads; the keywords make it one of the wrong versions."""
    h = cache.num_heads if h is None else h
    att = cache.attention
    q, k, v, P = att.q, att.k, att.v, att.weights  # (..., H, N, D)
    dv_w = v.shape[-1] if dh is None else dh  # the value heads' width: d_v, not d_k
    dh = q.shape[-1] if dh is None else dh
    grads = {}
    concat, W_o = cache.o_proj.x, cache.o_proj.W
    grads["W_o"] = concat.reshape(-1, concat.shape[-1]).T @ dout.reshape(-1, dout.shape[-1])
    grads["b_o"] = dout.reshape(-1, dout.shape[-1]).sum(0) if cache.o_proj.has_bias else None
    dconcat = dout @ W_o.T
    dQ = np.zeros(cache.q_proj.x.shape[:-1] + (cache.q_proj.W.shape[1],), dout.dtype)
    dK = np.zeros(cache.k_proj.x.shape[:-1] + (cache.k_proj.W.shape[1],), dout.dtype)
    dV = np.zeros(cache.v_proj.x.shape[:-1] + (cache.v_proj.W.shape[1],), dout.dtype)
    for i in range(h):
        if i == skip_head:
            continue
        do = dconcat[..., i * dv_w:(i + 1) * dv_w]
        dq, dk, dv = _attention_core(do, q[..., i, :, :], k[..., i, :, :], v[..., i, :, :], P[..., i, :, :],
                                     att.scale, softmax)
        dQ[..., i * dh:(i + 1) * dh] += _sum_to(dq, dQ[..., i * dh:(i + 1) * dh].shape) / divide
        dK[..., i * dh:(i + 1) * dh] += _sum_to(dk, dK[..., i * dh:(i + 1) * dh].shape) / divide
        dV[..., i * dv_w:(i + 1) * dv_w] += _sum_to(dv, dV[..., i * dv_w:(i + 1) * dv_w].shape) / divide
    out = []
    for name, d, proj in (("q", dQ, cache.q_proj), ("k", dK, cache.k_proj), ("v", dV, cache.v_proj)):
        x = proj.x
        grads["W_" + name] = x.reshape(-1, x.shape[-1]).T @ d.reshape(-1, d.shape[-1])
        grads["b_" + name] = d.reshape(-1, d.shape[-1]).sum(0) if proj.has_bias else None
        out.append(_sum_to(d @ proj.W.T, x.shape))
    if dict_swap:
        grads["W_q"], grads["W_k"] = grads["W_k"], grads["W_q"]
    return out[0], out[1], out[2], {key: grads[key] for key in cache.param_keys}


def encoder_by_hand(dout, cache, *, ln="right", attention="full"):
    """The encoder block's backward written out (norms by hand, attention by heads)."""
    from attention_ref.nn.feed_forward import feed_forward_backward

    def ln_back(dy, c):
        x_hat, rstd, gamma = c
        g = dy * gamma if ln != "no gain" else dy
        if ln == "constants":
            dx = rstd * g
        else:
            dx = rstd * (g - g.mean(-1, keepdims=True) - x_hat * (g * x_hat).mean(-1, keepdims=True))
        return dx, (dy * x_hat).reshape(-1, x_hat.shape[-1]).sum(0), dy.reshape(-1, x_hat.shape[-1]).sum(0)

    def attn_back(ds, c):
        dquery, dkey, dvalue, g = multi_head_by_heads(ds, c, softmax=attention)
        return dquery + dkey + dvalue, g

    def residual(d, c, sub_back):
        if c.norm_first:
            dz, extra = sub_back(d, c.sublayer)
            dxn, dg, db = ln_back(dz, c.norm)
            return d + dxn, extra, dg, db
        dsum, dg, db = ln_back(d, c.norm)
        dz, extra = sub_back(dsum, c.sublayer)
        return dsum + dz, extra, dg, db

    def ffn_back(d, c):
        dx, g = feed_forward_backward(d, c)
        return dx, g

    dh, g_ffn, dg2, db2 = residual(dout, cache.ffn, ffn_back)
    dx, g_attn, dg1, db1 = residual(dh, cache.attn, attn_back)
    grads = {**{f"self_attn.{k}": v for k, v in g_attn.items()}, "ln1.gamma": dg1, "ln1.beta": db1,
             **{f"ffn.{k}": v for k, v in g_ffn.items()}, "ln2.gamma": dg2, "ln2.beta": db2}
    return dx, {k: grads[k] for k in cache.param_keys}


# -- the wrong attempts ----------------------------------------------------------------------------


def split_stale_globals(dheads):  # head count and width from a notebook's globals
    return np.moveaxis(dheads, -3, -2).reshape(dheads.shape[:-3] + (dheads.shape[-2], H_STALE * DH_STALE))


def merge_stale_global(dmerged, num_heads):  # ignores its argument
    *batch, n, width = dmerged.shape
    return np.moveaxis(dmerged.reshape(*batch, n, H_STALE, width // H_STALE), -2, -3)


def attention_recompute_no_max(dout, cache):
    q, k, v, P0, out, scale = cache
    S = np.einsum("...qd,...kd->...qk", q, k) * scale
    with np.errstate(over="ignore", invalid="ignore"):
        E = np.exp(S) * (P0 > 0)  # the mask, through the cached zeros
        P = E / E.sum(-1, keepdims=True)
    return _attention_core(dout, q, k, v, P, scale) if np.isfinite(P).all() else \
        tuple(_sum_to(g, s) for g, s in zip(_attention_core(dout, q, k, v, P, scale), (q.shape, k.shape, v.shape)))


def linear_returns_dW_first(dy, cache):
    dx, dW, db = linear_einsum(dy, cache)
    return dW, dx, db


def float32_then_back(name):
    good = CORRECT[name]

    def attempt(*args):
        args = tuple(_to32(a) for a in args)
        result = good(*args)
        return tuple(_to64(r) for r in result) if isinstance(result, tuple) else _to64(result)
    return attempt


def _to32(a):
    if isinstance(a, np.ndarray) and a.dtype == np.float64:
        return a.astype(np.float32)
    if hasattr(a, "_fields"):
        return type(a)(*(_to32(x) for x in a))
    return a


def _to64(r):
    if isinstance(r, dict):
        return {k: _to64(v) for k, v in r.items()}
    return None if r is None else np.asarray(r, dtype=np.float64)


CORRECT = {
    "softmax_backward": softmax_loop, "linear_backward": linear_einsum,
    "scaled_dot_product_attention_backward": attention_einsum, "split_heads_backward": split_loop,
    "merge_heads_backward": merge_loop, "layer_norm_backward": layer_norm_explicit,
    "flash_attention_backward": flash_tiles, "multi_head_attention_backward": multi_head_by_heads,
    "encoder_block_backward": encoder_by_hand,
}
OTHER_CORRECT = [
    ("scaled_dot_product_attention_backward", attention_other_order),
    ("softmax_backward", lambda dy, c: c.y * dy - c.y * np.sum(c.y * dy, axis=c.axis, keepdims=True)),
    ("linear_backward", lambda dy, c: [dy @ c.W.T, np.tensordot(c.x, dy, axes=(list(range(c.x.ndim - 1)),) * 2),
                                      dy.reshape(-1, dy.shape[-1]).sum(0) if c.has_bias else None]),
]


def _named(mistake):
    return ("named", mistake)


def _sentence(exercise, name):
    return next(m.sentence for m in MISTAKES[exercise] if m.name == name)


def _dy_y(dy, c):
    return dy * c.y


#: (exercise, attempt, expected): expected is ("named", catalogue name), ("located", words of the
#: step), ("seen", words of the observation) or ("generic", why it is left so)
WRONG = [
    # -- the five that passed (issue 21) --
    ("split_heads_backward", split_stale_globals, ("seen", "H_STALE * DH_STALE")),  # the line that raised
    ("merge_heads_backward", merge_stale_global, ("seen", "are the head count and width read from the arguments")),
    ("flash_attention_backward", lambda d, c: flash_tiles(d, c, window=False), _named("window ignored")),
    ("scaled_dot_product_attention_backward", attention_recompute_no_max,  # and forgets broadcasting: named,
     _named("P recomputed without the row maximum")),  # then the shape said after the name
    ("flash_attention_backward", lambda d, c: flash_tiles(d, c, subtract=False),
     _named("P recomputed without the row maximum")),
    # -- the five that misled --
    ("linear_backward", linear_returns_dW_first, ("seen", "your dx equals the true dW")),
    ("linear_backward", float32_then_back("linear_backward"), ("seen", "float32's precision")),
    ("softmax_backward", float32_then_back("softmax_backward"), ("seen", "float32's precision")),
    ("layer_norm_backward", float32_then_back("layer_norm_backward"), ("seen", "float32's precision")),
    ("multi_head_attention_backward", lambda d, c: multi_head_by_heads(d, c, divide=c.num_heads),
     ("seen", "1/h times the true gradient in every case")),
    # -- softmax --
    ("softmax_backward", lambda dy, c: dy * c.y * (1 - c.y), _named("diagonal-only Jacobian")),
    ("softmax_backward", _dy_y, _named("missing sum term")),
    ("softmax_backward", lambda dy, c: c.y * (dy + (c.y * dy).sum(c.axis, keepdims=True)),
     _named("sum term with the wrong sign")),
    ("softmax_backward", lambda dy, c: c.y * (dy - (c.y * dy).sum(0, keepdims=True)), _named("sum along axis 0")),
    ("softmax_backward", lambda dy, c: c.y * (dy - np.einsum("...i,...i->...", c.y, dy)[..., None]),
     _named("sum along the last axis whatever cache.axis")),
    ("softmax_backward", lambda dy, c: -softmax_loop(dy, c), ("seen", "wrong sign everywhere")),
    ("softmax_backward", lambda dy, c: c.y * (dy - (c.y * dy).sum(c.axis, keepdims=True)) * 2, ("seen", "2 times")),
    # -- linear --
    ("linear_backward", lambda dy, c: (dy @ c.W.T, dy.reshape(-1, dy.shape[-1]).T @ c.x.reshape(-1, c.x.shape[-1]),
                                       dy.reshape(-1, dy.shape[-1]).sum(0) if c.has_bias else None),
     _named("transposed weight gradient")),
    ("linear_backward", lambda dy, c: (dy @ c.W.T, linear_einsum(dy, c)[1], dy.sum(0) if c.has_bias else None),
     _named("bias gradient not summed over the batch axes")),
    ("linear_backward", lambda dy, c: (dy @ c.W, *linear_einsum(dy, c)[1:]), ("seen", "")),
    ("linear_backward", lambda dy, c: (dy @ c.W.T, linear_einsum(dy, c)[1] / dy.reshape(-1, dy.shape[-1]).shape[0],
                                       linear_einsum(dy, c)[2]), ("seen", "1/rows times the true gradient in every case")),
    # -- attention --
    ("scaled_dot_product_attention_backward", lambda d, c: tuple(g / c.scale if i < 2 else g for i, g in
                                                                  enumerate(attention_einsum(d, c))),
     _named("missing 1/sqrt(d_k)")),
    ("scaled_dot_product_attention_backward", lambda d, c: tuple(g * c.scale if i < 2 else g for i, g in
                                                                  enumerate(attention_einsum(d, c))),
     _named("1/sqrt(d_k) applied twice")),
    ("scaled_dot_product_attention_backward",
     lambda d, c: _attention_sum(_attention_core(d, c.q, c.k, c.v, c.weights, c.scale, "diagonal"), c),
     _named("diagonal-only softmax Jacobian")),
    ("scaled_dot_product_attention_backward",
     lambda d, c: _attention_sum(_attention_core(d, c.q, c.k, c.v, c.weights, c.scale, "skip"), c),
     _named("softmax skipped")),
    ("scaled_dot_product_attention_backward", lambda d, c: _attention_no_mask(d, c), _named("masked positions let through")),
    ("scaled_dot_product_attention_backward", lambda d, c: (attention_einsum(d, c)[0], attention_einsum(d, c)[1],
                                                             attention_einsum(d, c)[2] * 0),
     ("seen", "dv is zero everywhere")),
    ("scaled_dot_product_attention_backward",
     lambda d, c: (attention_einsum(d, c)[0], attention_einsum(d, c)[1], attention_einsum(d, c)[2] + 0.1 * d.mean()),
     ("located", "dv = P^T dout")),
    ("scaled_dot_product_attention_backward", lambda d, c: _attention_D_over_queries(d, c),
     ("located", "the softmax step")),
    # -- heads --
    ("split_heads_backward", lambda d: d.reshape(d.shape[:-3] + (d.shape[-2], -1)),
     _named("reshape without moving the heads back")),
    ("split_heads_backward", lambda d: split_loop(d[..., ::-1, :, :]), _named("heads concatenated in reverse order")),
    ("merge_heads_backward", lambda d, h: d.reshape(d.shape[:-2] + (h, d.shape[-2], d.shape[-1] // h)),
     _named("reshape without moving the heads axis")),
    ("merge_heads_backward", lambda d, h: np.swapaxes(merge_loop(d, h), -1, -2), ("seen", "transpose")),
    # -- layer norm --
    ("layer_norm_backward", lambda dy, c: (c.rstd * dy * c.gamma, *layer_norm_explicit(dy, c)[1:]),
     _named("mean and variance treated as constants")),
    ("layer_norm_backward", lambda dy, c: (c.rstd * (dy * c.gamma - (dy * c.gamma).mean(-1, keepdims=True)),
                                           *layer_norm_explicit(dy, c)[1:]), _named("variance treated as a constant")),
    ("layer_norm_backward", lambda dy, c: (layer_norm_explicit(dy / c.gamma * 1.0, c)[0] if False else
                                           _ln_no_gain(dy, c), *layer_norm_explicit(dy, c)[1:]),
     _named("gain forgotten in dx")),
    ("layer_norm_backward", lambda dy, c: (layer_norm_explicit(dy, c)[0],
                                           (dy * c.x_hat).reshape(-1, c.x_hat.shape[-1])[0],
                                           layer_norm_explicit(dy, c)[2]), _named("dgamma not summed over rows")),
    ("layer_norm_backward", lambda dy, c: (layer_norm_explicit(dy, c)[0], layer_norm_explicit(dy, c)[2],
                                           layer_norm_explicit(dy, c)[1]), ("seen", "your dgamma equals the true dbeta")),
    ("layer_norm_backward", lambda dy, c: (layer_norm_explicit(dy, c)[0] * c.x_hat.shape[-1],
                                           *layer_norm_explicit(dy, c)[1:]), ("located", "dx, the normalisation's backward")),
    # -- blockwise --
    ("flash_attention_backward", lambda d, c: flash_tiles(d, c, causal=False), _named("causal rule ignored")),
    ("flash_attention_backward", lambda d, c: flash_tiles(d, c, user_mask=False), _named("user mask ignored")),
    ("flash_attention_backward", lambda d, c: _flash_diag(d, c), _named("diagonal-only softmax Jacobian")),
    ("flash_attention_backward", lambda d, c: _flash_unnormalised(d, c), _named("probabilities not normalised")),
    ("flash_attention_backward", lambda d, c: tuple(g / c.scale if i < 2 else g for i, g in
                                                    enumerate(flash_tiles(d, c))), _named("missing 1/sqrt(d_k)")),
    ("flash_attention_backward", lambda d, c: (flash_tiles(d, c)[0], flash_tiles(d, c)[1] * 0.5, flash_tiles(d, c)[2]),
     ("located", "dk[keys] += dS^T q * scale")),
    # -- multi-head --
    ("multi_head_attention_backward", lambda d, c: multi_head_by_heads(d, c, h=H_STALE, dh=DH_STALE),
     ("seen", "at line")),  # crashes, on the line using the globals
    ("multi_head_attention_backward", lambda d, c: multi_head_by_heads(d, c, softmax="diagonal"),
     _named("attention step: diagonal-only softmax Jacobian")),
    ("multi_head_attention_backward", lambda d, c: multi_head_by_heads(d, c, softmax="skip"),
     _named("attention step: softmax skipped")),
    ("multi_head_attention_backward", lambda d, c: _mh_transpose_W_o(d, c), _named("transposed W_o gradient")),
    ("multi_head_attention_backward", lambda d, c: _mh_unscaled(d, c), _named("missing 1/sqrt(d_k)")),
    ("multi_head_attention_backward", lambda d, c: multi_head_by_heads(d, c, skip_head=1),
     ("seen", "is exactly 0 at")),
    ("multi_head_attention_backward", lambda d, c: multi_head_by_heads(d, c, dict_swap=True),
     ("seen", "your W_q equals the true W_k")),
    # -- encoder --
    ("encoder_block_backward", lambda d, c: encoder_by_hand(d, c, ln="constants"),
     _named("layer norms: mean and variance treated as constants")),
    ("encoder_block_backward", lambda d, c: encoder_by_hand(d, c, ln="no gain"), _named("layer norms: gain forgotten in dx")),
    ("encoder_block_backward", lambda d, c: encoder_by_hand(d, c, attention="diagonal"),
     _named("self-attention's attention step: diagonal-only softmax Jacobian")),
    ("encoder_block_backward", lambda d, c: _encoder_query_only(d, c), _named("self-attention paths not summed")),
    ("encoder_block_backward", lambda d, c: (encoder_by_hand(d, c)[0] * 2, encoder_by_hand(d, c)[1]),
     ("located", "dx: dquery + dkey + dvalue")),
]


def _attention_sum(grads, c):
    return tuple(_sum_to(g, s) for g, s in zip(grads, (c.q.shape, c.k.shape, c.v.shape)))


def _attention_no_mask(dout, c):
    S = np.einsum("...qd,...kd->...qk", c.q, c.k) * c.scale
    P = np.exp(S - S.max(-1, keepdims=True))
    return _attention_sum(_attention_core(dout, c.q, c.k, c.v, P / P.sum(-1, keepdims=True), c.scale), c)


def _attention_D_over_queries(dout, c):
    P = c.weights
    dv = np.swapaxes(P, -1, -2) @ dout
    dP = dout @ np.swapaxes(c.v, -1, -2)
    dS = P * (dP - (P * dP).sum(-2, keepdims=True))
    return _attention_sum((dS @ c.k * c.scale, np.swapaxes(dS, -1, -2) @ c.q * c.scale, dv), c)


def _ln_no_gain(dy, c):
    x_hat, rstd = c.x_hat, c.rstd
    return rstd * (dy - dy.mean(-1, keepdims=True) - x_hat * (dy * x_hat).mean(-1, keepdims=True))


def _flash_diag(dout, c):
    return _flash_variant(dout, c, lambda p, dp, D: p * (1 - p) * dp)


def _flash_unnormalised(dout, c):
    return _flash_variant(dout, c, None, normalise=False)


def _flash_variant(dout, c, ds_rule, normalise=True):
    q, k, v, mask, out = c.q, c.k, c.v, c.mask, c.out
    n_q, n_k, b = q.shape[-2], k.shape[-2], c.block_size
    dq = np.zeros(out.shape[:-1] + q.shape[-1:])
    dk = np.zeros(out.shape[:-2] + k.shape[-2:])
    dv = np.zeros(out.shape[:-2] + v.shape[-2:])
    D = (dout * out).sum(-1, keepdims=True)
    for qs in range(0, n_q, b):
        qe = min(qs + b, n_q)
        for ks in _key_blocks(qs, qe, n_q, n_k, b, c.causal, c.window):
            ke = min(ks + b, n_k)
            s = _scores(q[..., qs:qe, :] * c.scale, k, mask, qs, qe, ks, ke, n_q, n_k, c.causal, c.window)
            lse = c.row_max[..., qs:qe, None] + (c.log_row_sum[..., qs:qe, None] if normalise else 0.0)
            with np.errstate(invalid="ignore"):
                p = np.nan_to_num(np.exp(s - lse))
            dp = dout[..., qs:qe, :] @ np.swapaxes(v[..., ks:ke, :], -1, -2)
            ds = p * (dp - D[..., qs:qe, :]) if ds_rule is None else ds_rule(p, dp, D[..., qs:qe, :])
            dq[..., qs:qe, :] += ds @ k[..., ks:ke, :] * c.scale
            dk[..., ks:ke, :] += np.swapaxes(ds, -1, -2) @ q[..., qs:qe, :] * c.scale
            dv[..., ks:ke, :] += np.swapaxes(p, -1, -2) @ dout[..., qs:qe, :]
    return _sum_to(dq, q.shape), _sum_to(dk, k.shape), _sum_to(dv, v.shape)


def _mh_transpose_W_o(d, c):
    dq, dk, dv, g = multi_head_by_heads(d, c)
    return dq, dk, dv, {**g, "W_o": g["W_o"].T}


def _mh_unscaled(d, c):
    return multi_head_by_heads(d, c._replace(attention=c.attention._replace(scale=1.0)))


def _encoder_query_only(dout, cache):
    import attention_ref.nn.residual as residual
    from attention_ref import feed_forward_backward, multi_head_attention_backward

    def attn(ds, c):
        dquery, _, _, g = multi_head_attention_backward(ds, c)
        return dquery, g

    dh, g_ffn, dg2, db2 = residual.residual_backward(dout, cache.ffn, feed_forward_backward)
    dx, g_attn, dg1, db1 = residual.residual_backward(dh, cache.attn, attn)
    return dx, residual.join_grads({"self_attn": g_attn, "ln1": {"gamma": dg1, "beta": db1}, "ffn": g_ffn,
                                    "ln2": {"gamma": dg2, "beta": db2}}, cache.param_keys)


# -- the tests ---------------------------------------------------------------------------------------

def test_there_are_enough_attempts_of_every_exercise():
    assert len(WRONG) + len(CORRECT) + len(OTHER_CORRECT) >= 60
    assert {name for name, _, _ in WRONG} == set(EXERCISES)


@pytest.mark.parametrize("name, attempt", list(CORRECT.items()) + OTHER_CORRECT,
                         ids=[n for n in CORRECT] + [f"{n}-other" for n, _ in OTHER_CORRECT])
def test_correct_attempts_pass(name, attempt):
    for seed in range(5):
        result = check(name, attempt, seed=seed)
        assert result.ok, f"seed {seed}:\n{result}"


@pytest.mark.parametrize("index", range(len(WRONG)), ids=[f"{i}-{w[0]}" for i, w in enumerate(WRONG)])
def test_wrong_attempts_fail_with_their_diagnosis(index):
    name, attempt, (kind, words) = WRONG[index]
    with np.errstate(all="ignore"):
        for seed in range(2):
            result = check(name, attempt, seed=seed)
            assert not result.ok, f"a wrong attempt passed (seed {seed}):\n{result}"
            if kind == "named":
                assert result.diagnosis.startswith(_sentence(name, words)), f"seed {seed}:\n{result}"
            elif kind == "located":
                assert f"the error is in {words}" in result.diagnosis, f"seed {seed}:\n{result}"
            else:
                assert words in result.diagnosis, f"seed {seed}:\n{result}"
                assert "none of the classic mistakes explains" not in result.diagnosis, f"seed {seed}:\n{result}"


def test_the_counts():
    """At least 80% of the wrong attempts are named or located (here all of them: the generic
    line is for what nobody foresaw)."""
    kinds = [kind for _, _, (kind, _) in WRONG]
    specific = sum(k in ("named", "located", "seen") for k in kinds)
    assert specific / len(kinds) >= 0.8
