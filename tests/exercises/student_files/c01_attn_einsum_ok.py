import numpy as np
EXERCISE = "scaled_dot_product_attention_backward"
def scaled_dot_product_attention_backward(dout, cache):
    q, k, v, P, out, s = cache.q, cache.k, cache.v, cache.weights, cache.out, cache.scale
    dv = np.einsum('...qk,...qd->...kd', P, dout)
    dP = np.einsum('...qd,...kd->...qk', dout, v)
    D = np.sum(dout * out, axis=-1, keepdims=True)        # rowsum(P*dP) = dout . out
    dS = P * (dP - D)
    dq = s * np.einsum('...qk,...kd->...qd', dS, k)
    dk = s * np.einsum('...qk,...qd->...kd', dS, q)
    return dq, dk, dv
