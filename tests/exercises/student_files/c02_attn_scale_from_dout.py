import numpy as np
EXERCISE = "scaled_dot_product_attention_backward"
def scaled_dot_product_attention_backward(dout, cache):
    q, k, v, P = cache.q, cache.k, cache.v, cache.weights
    d = dout.shape[-1]                 # WRONG: this is d_v, the scale uses d_k
    scale = 1.0 / np.sqrt(d)
    dv = np.swapaxes(P, -1, -2) @ dout
    dP = dout @ np.swapaxes(v, -1, -2)
    dS = P * (dP - (P * dP).sum(-1, keepdims=True))
    dq = dS @ k * scale
    dk = np.swapaxes(dS, -1, -2) @ q * scale
    return dq, dk, dv
