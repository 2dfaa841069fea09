"""Spot the bug flash-causal-triangle: flash_attention_backward.

One line is wrong on purpose (attention_ref.exercises.bugs says which, once it is fixed).
"""
import numpy as np


def flash_attention_backward(dout, cache):
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
    return _sum_to(dq, q.shape), _sum_to(dk, k.shape), _sum_to(dv, v.shape)


def _sum_to(grad, shape):
    """A gradient summed over the axes its input was broadcast along."""
    extra = grad.ndim - len(shape)
    grad = grad.sum(axis=tuple(range(extra))) if extra > 0 else grad
    ones = tuple(i for i, n in enumerate(shape) if n == 1 != grad.shape[i])
    return grad.sum(axis=ones, keepdims=True)
