import numpy as np
EXERCISE = "multi_head_attention_backward"

def _lin(dy, c):
    lead = tuple(range(dy.ndim - 1))
    dx = dy @ c.W.T
    dW = np.tensordot(c.x, dy, axes=(lead, lead))
    db = dy.sum(axis=lead) if c.has_bias else None
    return dx, dW, db

def multi_head_attention_backward(dout, cache):
    H = cache.num_heads
    a = cache.attention
    q, k, v, P = a.q, a.k, a.v, a.weights  # every head at once, (..., H, N, D)
    dconcat, dWo, dbo = _lin(dout, cache.o_proj)
    *lead, N, Dm = dconcat.shape
    Dh = Dm // H
    dheads = np.moveaxis(dconcat.reshape(*lead, N, H, Dh), -2, -3)            # (..., H, N, Dh)
    dv = np.einsum('...ij,...id->...jd', P, dheads)
    dP = np.einsum('...id,...jd->...ij', dheads, v)
    dS = P * (dP - np.sum(P * dP, -1, keepdims=True))
    dq = a.scale * dS @ k
    dk = np.swapaxes(dS, -1, -2) @ q
    merge = lambda t: np.moveaxis(t, -3, -2).reshape(*t.shape[:-3], t.shape[-2], -1)
    dquery, dWq, dbq = _lin(merge(dq), cache.q_proj)
    dkey, dWk, dbk = _lin(merge(dk), cache.k_proj)
    dvalue, dWv, dbv = _lin(merge(dv), cache.v_proj)
    grads = {"W_q": dWq, "b_q": dbq, "W_k": dWk, "b_k": dbk, "W_v": dWv, "b_v": dbv, "W_o": dWo, "b_o": dbo}
    return dquery, dkey, dvalue, grads
