import numpy as np
EXERCISE = "linear_backward"
def linear_backward(dy, cache):
    x, W = cache.x, cache.W
    dx = dy @ W.T
    if x.ndim == 1:
        dW = np.outer(x, dy)
    else:
        dW = (x.T @ dy.T).T if x.ndim == 2 else np.sum(x.T @ dy.T, axis=-1).T
    db = dy.sum(axis=tuple(range(dy.ndim - 1))) if cache.has_bias else None
    return dx, dW, db
