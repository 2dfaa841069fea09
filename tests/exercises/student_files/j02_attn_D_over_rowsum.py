import numpy as np

EXERCISE = "scaled_dot_product_attention_backward"


def scaled_dot_product_attention_backward(dout, cache):
    P, q, k, v, s = cache.weights, cache.q, cache.k, cache.v, cache.scale
    dv = np.swapaxes(P, -1, -2) @ dout
    dP = dout @ np.swapaxes(v, -1, -2)
    D = (P * dP).sum(-1, keepdims=True) / P.sum(-1, keepdims=True)  # a weighted mean: 0/0 on an empty row
    dS = P * (dP - D)
    dq = dS @ k * s
    dk = np.swapaxes(dS, -1, -2) @ q * s
    return _back(dq, q.shape), _back(dk, k.shape), _back(dv, v.shape)


def _back(g, shape):
    extra = g.ndim - len(shape)
    g = g.sum(axis=tuple(range(extra))) if extra else g
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and g.shape[i] != 1)
    return g.sum(axis=axes, keepdims=True) if axes else g
