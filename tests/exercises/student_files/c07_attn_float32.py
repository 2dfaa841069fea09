import numpy as np
EXERCISE = "scaled_dot_product_attention_backward"
def scaled_dot_product_attention_backward(dout, cache):
    f = np.float32
    q, k, v, P, g = (a.astype(f) for a in (cache.q, cache.k, cache.v, cache.weights, dout))
    dv = np.swapaxes(P, -1, -2) @ g
    dP = g @ np.swapaxes(v, -1, -2)
    dS = P * (dP - (P * dP).sum(-1, keepdims=True))
    s = f(cache.scale)
    return (dS @ k * s).astype(np.float64), (np.swapaxes(dS, -1, -2) @ q * s).astype(np.float64), dv.astype(np.float64)
