import numpy as np

EXERCISE = "flash_attention_backward"


def flash_attention_backward(dout, c):
    q, k, v, B = c.q, c.k, c.v, c.block_size
    nq, nk = q.shape[-2], k.shape[-2]
    full = np.zeros(np.broadcast_shapes(q.shape[:-2], k.shape[:-2]) + (nq, nk), dtype=q.dtype)
    keep = np.ones((nq, nk), bool)
    off = nk - nq
    i, j = np.arange(nq)[:, None], np.arange(nk)[None, :]
    if c.causal:
        keep &= j <= i + off
    if c.window is not None:
        keep &= np.abs(i + off - j) <= c.window
    s = (q @ np.swapaxes(k, -1, -2)) * c.scale
    if c.mask is not None:
        m = c.mask[..., :nq, :nk]  # the mask as (..., Nq, Nk)
        s = np.where(m, s, -np.inf) if m.dtype == bool else s + m
    s = np.where(keep, s, -np.inf)
    with np.errstate(invalid="ignore"):
        p = np.exp(s - c.row_max[..., None] - c.log_row_sum[..., None])
    p = np.where(np.isfinite(c.log_row_sum)[..., None], np.nan_to_num(p, nan=0.0), 0.0) + full
    dv = np.swapaxes(p, -1, -2) @ dout
    dp = dout @ np.swapaxes(v, -1, -2)
    ds = p * (dp - (dout * c.out).sum(-1, keepdims=True))
    dq = ds @ k * c.scale
    dk = np.swapaxes(ds, -1, -2) @ q * c.scale
    return _back(dq, q.shape), _back(dk, k.shape), _back(dv, v.shape)


def _back(g, shape):
    extra = g.ndim - len(shape)
    g = g.sum(axis=tuple(range(extra))) if extra else g
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and g.shape[i] != 1)
    return g.sum(axis=axes, keepdims=True) if axes else g
