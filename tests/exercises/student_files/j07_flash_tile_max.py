import numpy as np
from attention_ref.variants.blockwise import _key_blocks, _scores

EXERCISE = "flash_attention_backward"


def flash_attention_backward(dout, c):
    q, k, v, B = c.q, c.k, c.v, c.block_size
    nq, nk = q.shape[-2], k.shape[-2]
    lead = np.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    dq = np.zeros(lead + q.shape[-2:], q.dtype)
    dk = np.zeros(lead + k.shape[-2:], q.dtype)
    dv = np.zeros(lead + v.shape[-2:], q.dtype)
    D = (dout * c.out).sum(-1)
    for qs in range(0, nq, B):
        qe = min(qs + B, nq)
        qb = q[..., qs:qe, :] * c.scale
        for ks in _key_blocks(qs, qe, nq, nk, B, c.causal, c.window):
            ke = min(ks + B, nk)
            s = _scores(qb, k, c.mask, qs, qe, ks, ke, nq, nk, c.causal, c.window)
            top = np.max(s, axis=-1, keepdims=True)  # this tile's own maximum
            top = np.where(np.isfinite(top), top, 0)
            with np.errstate(invalid="ignore", over="ignore"):
                p = np.exp(s - top - c.log_row_sum[..., qs:qe, None])
            p = np.nan_to_num(p, nan=0.0, posinf=0.0)
            g = dout[..., qs:qe, :]
            dv[..., ks:ke, :] += np.swapaxes(p, -1, -2) @ g
            ds = p * (g @ np.swapaxes(v[..., ks:ke, :], -1, -2) - D[..., qs:qe, None])
            dq[..., qs:qe, :] += ds @ k[..., ks:ke, :] * c.scale
            dk[..., ks:ke, :] += np.swapaxes(ds, -1, -2) @ q[..., qs:qe, :] * c.scale
    return _back(dq, q.shape), _back(dk, k.shape), _back(dv, v.shape)


def _back(g, shape):
    extra = g.ndim - len(shape)
    g = g.sum(axis=tuple(range(extra))) if extra else g
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and g.shape[i] != 1)
    return g.sum(axis=axes, keepdims=True) if axes else g
