import numpy as np
EXERCISE = "flash_attention_backward"

def _probs(c, window_offset=True, causal_topleft=False, use_mask=True, use_m=True):
    q, k = c.q, c.k
    nq, nk = q.shape[-2], k.shape[-2]
    S = (q * c.scale) @ np.swapaxes(k, -1, -2)
    pos = np.arange(nq)[:, None] + ((nk - nq) if window_offset else 0)
    pos_c = np.arange(nq)[:, None] + (0 if causal_topleft else nk - nq)
    key = np.arange(nk)[None, :]
    keep = np.ones((nq, nk), bool)
    if c.causal:
        keep &= key <= pos_c
    if c.window is not None:
        keep &= np.abs(pos - key) <= c.window
    S = np.where(keep, S, -np.inf)
    if c.mask is not None and use_mask:
        m = np.asarray(c.mask)
        S = np.where(m, S, -np.inf) if m.dtype == bool else S + m
    with np.errstate(invalid="ignore", over="ignore"):
        shift = (c.row_max if use_m else 0) + c.log_row_sum
        P = np.exp(S - shift[..., None])
    return np.where(np.isfinite(c.log_row_sum)[..., None], np.nan_to_num(P, nan=0.0), 0.0)

def _bwd(dout, c, P, scale=None):
    scale = c.scale if scale is None else scale
    dv = np.swapaxes(P, -1, -2) @ dout
    dP = dout @ np.swapaxes(c.v, -1, -2)
    D = (dout * c.out).sum(-1, keepdims=True)
    dS = P * (dP - D)
    return dS @ c.k * scale, np.swapaxes(dS, -1, -2) @ c.q * scale, dv

def flash_attention_backward(dout, cache):
    return _bwd(dout, cache, _probs(cache, causal_topleft=True))
