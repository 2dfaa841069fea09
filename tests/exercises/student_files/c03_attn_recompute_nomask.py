import numpy as np
EXERCISE = "scaled_dot_product_attention_backward"
def scaled_dot_product_attention_backward(dout, cache):
    q, k, v = cache.q, cache.k, cache.v
    S = q @ np.swapaxes(k, -1, -2) * cache.scale
    S = S - S.max(-1, keepdims=True)
    P = np.exp(S); P /= P.sum(-1, keepdims=True)      # recomputed, mask forgotten
    dv = np.swapaxes(P, -1, -2) @ dout
    dP = dout @ np.swapaxes(v, -1, -2)
    dS = P * (dP - (P * dP).sum(-1, keepdims=True))
    return dS @ k * cache.scale, np.swapaxes(dS, -1, -2) @ q * cache.scale, dv
