import numpy as np
from attention_ref.variants.blockwise import _scores, _key_blocks
EXERCISE = "flash_attention_backward"
def flash_attention_backward(dout, c):
    q, k, v, B = c.q, c.k, c.v, c.block_size
    nq, nk = q.shape[-2], k.shape[-2]
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    D = np.sum(dout * c.out, axis=-1)                       # (..., Nq)
    for qs in range(0, nq, B):
        qe = min(qs + B, nq)
        qb = q[..., qs:qe, :] * c.scale
        m = c.row_max[..., qs:qe, None]; ll = c.log_row_sum[..., qs:qe, None]
        for ks in _key_blocks(qs, qe, nq, nk, B, c.causal, c.window):
            ke = min(ks + B, nk)
            s = _scores(qb, k, c.mask, qs, qe, ks, ke, nq, nk, c.causal, c.window)
            with np.errstate(invalid="ignore"):
                p = np.exp(s - m - ll)
            p = np.where(np.isfinite(ll), np.nan_to_num(p, nan=0.0), 0.0)
            g = dout[..., qs:qe, :]
            dv[..., ks:ke, :] += np.swapaxes(p, -1, -2) @ g
            dp = g @ np.swapaxes(v[..., ks:ke, :], -1, -2)
            ds = p * (dp - D[..., qs:qe, None])
            dq[..., qs:qe, :] += ds @ k[..., ks:ke, :] * c.scale
            dk[..., ks:ke, :] += np.swapaxes(ds, -1, -2) @ q[..., qs:qe, :] * c.scale
    return dq, dk, dv
