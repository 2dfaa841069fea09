import numpy as np
EXERCISE = "scaled_dot_product_attention_backward"
def scaled_dot_product_attention_backward(dout, cache):
    q, k, v, P = cache.q, cache.k, cache.v, cache.weights
    dv = np.einsum('...ij,...id->...jd', P, dout)
    dP = np.einsum('...id,...jd->...ij', dout, v)
    dS = P * (dP - np.einsum('...ij,...ij->...i', P, dP)[..., None])
    dq = cache.scale * np.einsum('...ij,...jd->...id', dS, k)
    dk = cache.scale * np.einsum('...ij,...id->...jd', dS, q[..., :, :] * 0 + k.mean(-2, keepdims=True))  # mixed q/k
    return dq, dk, dv
