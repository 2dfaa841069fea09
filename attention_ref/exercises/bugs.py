"""Spot the bug: backwards with one realistic mistake each, to find and fix.

Each :class:`Bug` is the source of a whole backward, written as people write it (loops,
einsum, reshapes), with one line wrong: a mistake from the exercises' catalogue or one
seen in public code (the softmax summed over the wrong axis, the wrong triangle of a causal
mask, ``s * (1 - s)`` for the softmax's Jacobian, ...). ``python -m attention_ref exercise bug
start NAME`` writes it to a file; the student finds the line, fixes it, and ``bug check FILE``
runs the exercise's checker on it: it passes once the bug is fixed, and then names the bug
that was there. ``fix`` is the one replacement that mends it (the tests apply it).
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Bug", "BUGS"]


@dataclass(frozen=True)
class Bug:
    """One backward with one bug: its exercise, the source, the fix, and what the bug was."""

    name: str
    exercise: str
    story: str  # what the student is told: where the code comes from, what it should do
    source: str  # the whole function, with the bug
    fix: tuple  # (the wrong text, the right text): one replacement mends it
    sentence: str  # what the bug was, said once it is fixed


_SOFTMAX_AXIS = '''def softmax_backward(dy, cache):
    y, axis = cache.y, cache.axis
    # dx_i = y_i (dy_i - sum_j y_j dy_j), the sum along the softmax's axis
    s = np.sum(dy * y, axis=0, keepdims=True)
    return y * (dy - s)
'''

_SOFTMAX_DIAGONAL = '''def softmax_backward(dy, cache):
    s = cache.y
    # the derivative of the softmax, s (1 - s)
    grad = s * (1 - s)
    return dy * grad
'''

_LINEAR_DW = '''def linear_backward(dy, cache):
    x, W = cache.x, cache.W
    x2 = x.reshape(-1, x.shape[-1])      # (rows, d_in)
    dy2 = dy.reshape(-1, dy.shape[-1])   # (rows, d_out)
    dx = dy @ W.T
    dW = dy2.T @ x2
    db = dy2.sum(axis=0) if cache.has_bias else None
    return dx, dW, db
'''

_LINEAR_DB = '''def linear_backward(dy, cache):
    x, W = cache.x, cache.W
    dx = np.einsum("...o,io->...i", dy, W)
    rows_x, rows_dy = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])
    dW = np.einsum("ri,ro->io", rows_x, rows_dy)
    db = dy.sum(axis=0) if cache.has_bias else None
    return dx, dW, db
'''

_ATTENTION_D_AXIS = '''def scaled_dot_product_attention_backward(dout, cache):
    q, k, v, P, scale = cache.q, cache.k, cache.v, cache.weights, cache.scale
    dv = np.swapaxes(P, -1, -2) @ dout
    dP = dout @ np.swapaxes(v, -1, -2)
    D = np.sum(P * dP, axis=-2, keepdims=True)  # one number per query row
    dS = P * (dP - D)
    dq = dS @ k * scale
    dk = np.swapaxes(dS, -1, -2) @ q * scale
    return _sum_to(dq, q.shape), _sum_to(dk, k.shape), _sum_to(dv, v.shape)
{SUM_TO}'''

_ATTENTION_SCALE = '''def scaled_dot_product_attention_backward(dout, cache):
    q, k, v, P, scale = cache.q, cache.k, cache.v, cache.weights, cache.scale
    dv = np.einsum("...qk,...qd->...kd", P, dout)
    dP = np.einsum("...qd,...kd->...qk", dout, v)
    dS = P * (dP - np.einsum("...qd,...qd->...q", dout, cache.out)[..., None])
    dq = np.einsum("...qk,...kd->...qd", dS, k)
    dk = np.einsum("...qk,...qd->...kd", dS, q) * scale
    return _sum_to(dq, q.shape), _sum_to(dk, k.shape), _sum_to(dv, v.shape)
{SUM_TO}'''

_ATTENTION_DV = '''def scaled_dot_product_attention_backward(dout, cache):
    q, k, v, P, scale = cache.q, cache.k, cache.v, cache.weights, cache.scale
    dv = np.einsum("...qk,...qd->...kd", P, dout)
    dP = np.einsum("...qd,...kd->...qk", dout, v)
    D = np.einsum("...qk,...qk->...q", P, dP)[..., None]
    dS = P * (dP - D)
    dq = np.einsum("...qk,...kd->...qd", dS, k) * scale
    dk = np.einsum("...qk,...kd->...qd", dS, q) * scale
    return _sum_to(dq, q.shape), _sum_to(dk, k.shape), _sum_to(dv, v.shape)
{SUM_TO}'''

_SUM_TO = '''

def _sum_to(grad, shape):
    """A gradient summed over the axes its input was broadcast along."""
    extra = grad.ndim - len(shape)
    grad = grad.sum(axis=tuple(range(extra))) if extra > 0 else grad
    ones = tuple(i for i, n in enumerate(shape) if n == 1 != grad.shape[i])
    return grad.sum(axis=ones, keepdims=True)
'''
_ATTENTION_D_AXIS, _ATTENTION_SCALE, _ATTENTION_DV = (
    text.replace("{SUM_TO}", _SUM_TO) for text in (_ATTENTION_D_AXIS, _ATTENTION_SCALE, _ATTENTION_DV))

_LAYER_NORM_AXIS = '''def layer_norm_backward(dy, cache):
    x_hat, rstd, gamma = cache.x_hat, cache.rstd, cache.gamma
    d = x_hat.shape[-1]
    dgamma = (dy * x_hat).reshape(-1, d).sum(axis=0)
    dbeta = dy.reshape(-1, d).sum(axis=0)
    g = dy * gamma
    mean_g = g.mean(axis=0, keepdims=True)
    mean_gx = (g * x_hat).mean(axis=-1, keepdims=True)
    dx = rstd * (g - mean_g - x_hat * mean_gx)
    return dx, dgamma, dbeta
'''

_SPLIT_RESHAPE = '''def split_heads_backward(dheads):
    *batch, h, n, d_head = dheads.shape
    # (..., H, N, Dh) back to (..., N, H*Dh)
    return dheads.reshape(*batch, n, h * d_head)
'''

_FLASH_TRIANGLE = '''def flash_attention_backward(dout, cache):
    q, k, v, mask, out = cache.q, cache.k, cache.v, cache.mask, cache.out
    m, log_l = cache.row_max, cache.log_row_sum
    scale, b = cache.scale, cache.block_size
    n_q, n_k = q.shape[-2], k.shape[-2]
    dq = np.zeros(out.shape[:-1] + q.shape[-1:], q.dtype)
    dk = np.zeros(out.shape[:-2] + k.shape[-2:], q.dtype)
    dv = np.zeros(out.shape[:-2] + v.shape[-2:], q.dtype)
    D = np.sum(dout * out, axis=-1, keepdims=True)  # (..., Nq, 1)
    offset = n_k - n_q  # query i sits at position i + offset
    for qs in range(0, n_q, b):
        qe = min(qs + b, n_q)
        for ks in range(0, n_k, b):
            ke = min(ks + b, n_k)
            s = q[..., qs:qe, :] @ np.swapaxes(k[..., ks:ke, :], -1, -2) * scale
            pos = np.arange(qs, qe)[:, None] + offset
            key = np.arange(ks, ke)[None, :]
            keep = np.ones((qe - qs, ke - ks), bool)
            if cache.causal:
                keep &= key >= pos  # no peeking ahead
            if cache.window is not None:
                keep &= np.abs(pos - key) <= cache.window
            if mask is not None:
                full = np.broadcast_to(mask, mask.shape[:-2] + (n_q, n_k))
                if mask.dtype == bool:
                    keep = keep & full[..., qs:qe, ks:ke]
                else:  # an additive mask: -inf blocks a key
                    s = s + full[..., qs:qe, ks:ke]
            lse = m[..., qs:qe, None] + log_l[..., qs:qe, None]
            with np.errstate(invalid="ignore"):
                p = np.where(keep, np.exp(s - lse), 0.0)
            dp = dout[..., qs:qe, :] @ np.swapaxes(v[..., ks:ke, :], -1, -2)
            ds = p * (dp - D[..., qs:qe, :])
            dq[..., qs:qe, :] += ds @ k[..., ks:ke, :] * scale
            ds_t = np.swapaxes(ds, -1, -2)
            dk[..., ks:ke, :] += ds_t @ q[..., qs:qe, :] * scale
            dv[..., ks:ke, :] += np.swapaxes(p, -1, -2) @ dout[..., qs:qe, :]
    return dq, dk, dv
'''

_MERGE_ORDER = '''def merge_heads_backward(dmerged, num_heads):
    *batch, n, width = dmerged.shape
    d_head = width // num_heads
    # (..., N, H*Dh) -> (..., H, N, Dh)
    split = dmerged.reshape(*batch, n, d_head, num_heads)
    return np.moveaxis(split, -1, -3)
'''

BUGS = {b.name: b for b in [
    Bug("softmax-axis", "softmax_backward",
        "A softmax backward from a tutorial: right for a single vector, but the sum runs along a fixed axis.",
        _SOFTMAX_AXIS, ("axis=0, keepdims=True", "axis=axis, keepdims=True"),
        "the sum_j y_j dy_j ran along axis 0, not along the softmax's axis (cache.axis): right for a 1-d"
        " input only"),
    Bug("softmax-s-times-one-minus-s", "softmax_backward",
        "A softmax backward seen in many answers online, with the derivative s (1 - s).",
        _SOFTMAX_DIAGONAL, ("return dy * grad", "return s * (dy - np.sum(dy * s, axis=cache.axis, keepdims=True))"),
        "s (1 - s) is the sigmoid's derivative, only the diagonal of the softmax's Jacobian: every y_i"
        " depends on every x_j, so dx_i = y_i (dy_i - sum_j y_j dy_j)"),
    Bug("linear-dW-transposed", "linear_backward",
        "A linear layer's backward with the leading axes folded into rows.",
        _LINEAR_DW, ("dW = dy2.T @ x2", "dW = x2.T @ dy2"),
        "dW was dy^T x, the transpose (d_out, d_in); for y = x W it is x^T dy, shaped like W"),
    Bug("linear-db-first-axis", "linear_backward",
        "A linear layer's backward in einsum, for inputs with any number of batch axes.",
        _LINEAR_DB, ("db = dy.sum(axis=0)", "db = dy.reshape(-1, dy.shape[-1]).sum(axis=0)"),
        "db summed dy over the first axis only; the bias is added to every row of every batch item, so"
        " db sums over every axis but the last"),
    Bug("attention-D-axis", "scaled_dot_product_attention_backward",
        "An attention backward that computes the softmax's row sums D itself.",
        _ATTENTION_D_AXIS, ("axis=-2, keepdims=True", "axis=-1, keepdims=True"),
        "D was summed over the queries (axis -2); D_i = sum_j P_ij dP_ij sums over the keys of row i"
        " (axis -1)"),
    Bug("attention-dq-unscaled", "scaled_dot_product_attention_backward",
        "An attention backward in einsum, using D_i = rowsum(dout_i * out_i).",
        _ATTENTION_SCALE, ('dq = np.einsum("...qk,...kd->...qd", dS, k)',
                           'dq = np.einsum("...qk,...kd->...qd", dS, k) * scale'),
        "dq missed the factor 1/sqrt(d_k) that dk had: S = q k^T / sqrt(d_k) scales both"),
    Bug("attention-dk-einsum", "scaled_dot_product_attention_backward",
        "An attention backward in einsum; one subscript string is copied from the line above it.",
        _ATTENTION_DV, ('dk = np.einsum("...qk,...kd->...qd", dS, q) * scale',
                        'dk = np.einsum("...qk,...qd->...kd", dS, q) * scale'),
        "dk's einsum was dq's subscripts with q for k: it computed dS q (query by query); dk = dS^T q"
        " pairs each key with the queries that scored it"),
    Bug("layer-norm-mean-axis", "layer_norm_backward",
        "A layer norm backward; one mean runs along the wrong axis.",
        _LAYER_NORM_AXIS, ("mean_g = g.mean(axis=0, keepdims=True)", "mean_g = g.mean(axis=-1, keepdims=True)"),
        "mean(g) was taken over the rows (axis 0); the mean and the variance of layer norm are over"
        " each row's features (axis -1), so mean(g) is too"),
    Bug("split-heads-reshape", "split_heads_backward",
        "A split-heads backward that only reshapes.",
        _SPLIT_RESHAPE, ("return dheads.reshape(*batch, n, h * d_head)",
                         "return np.moveaxis(dheads, -3, -2).reshape(*batch, n, h * d_head)"),
        "the reshape mixed heads and positions: the heads axis must be moved back next to Dh first"),
    Bug("merge-heads-order", "merge_heads_backward",
        "A merge-heads backward that splits the features in the wrong order.",
        _MERGE_ORDER, ("split = dmerged.reshape(*batch, n, d_head, num_heads)\n    return np.moveaxis(split, -1, -3)",
                       "split = dmerged.reshape(*batch, n, num_heads, d_head)\n    return np.moveaxis(split, -2, -3)"),
        "the features were split as (Dh, H); the merge concatenates whole heads, so they split as (H, Dh)"),
    Bug("flash-causal-triangle", "flash_attention_backward",
        "A blockwise backward that applies the masks itself, tile by tile.",
        _FLASH_TRIANGLE, ("keep &= key >= pos  # no peeking ahead", "keep &= key <= pos  # no peeking ahead"),
        "the causal mask kept the wrong triangle (key >= position): a query sees the keys at or before it,"
        " key <= position"),
]}
