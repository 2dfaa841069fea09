import numpy as np

EXERCISE = "scaled_dot_product_attention_backward"


def scaled_dot_product_attention_backward(dout, cache):
    P, q, k, v, s = cache.weights, cache.q, cache.k, cache.v, cache.scale
    dv = np.swapaxes(P, -1, -2) @ dout
    dP = dout @ np.swapaxes(v, -1, -2)
    dS = P * (dP - (P * dP).sum(-1, keepdims=True))
    dq = dS @ k * s
    dk = np.swapaxes(dS, -1, -2) @ q * s
    return _back(dq, q.shape), _back(dk, k.shape), _back(dv, v.shape)


def _back(g, shape):
    # sum back to the input's shape: missing leading axes, and a first axis of size 1
    extra = g.ndim - len(shape)
    g = g.sum(axis=tuple(range(extra))) if extra else g
    if len(shape) > 2 and shape[0] == 1 and g.shape[0] != 1:
        g = g.sum(axis=0, keepdims=True)
    return g
