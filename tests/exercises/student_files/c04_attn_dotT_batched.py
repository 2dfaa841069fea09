import numpy as np
EXERCISE = "scaled_dot_product_attention_backward"
def scaled_dot_product_attention_backward(dout, cache):
    q, k, v, P = cache.q, cache.k, cache.v, cache.weights
    dv = P.T @ dout if P.ndim == 2 else np.einsum('...ij->...ji', P) @ dout
    dP = dout @ v.T if v.ndim == 2 else dout @ v.transpose(0, 2, 1)   # assumes 3-D
    dS = P * (dP - (P * dP).sum(-1, keepdims=True))
    dq = dS @ k * cache.scale
    dk = np.einsum('...ij->...ji', dS) @ q * cache.scale
    return dq, dk, dv
