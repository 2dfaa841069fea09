import numpy as np

EXERCISE = "layer_norm_backward"


def layer_norm_backward(dy, cache):
    x = cache.x_hat / cache.rstd  # x - mu
    rstd = 1 / np.sqrt(1 / cache.rstd**2 + 1e-5)  # rstd = 1/sqrt(var + eps), and eps added again
    x_hat = x * rstd
    g = dy * cache.gamma
    dx = rstd * (g - g.mean(-1, keepdims=True) - x_hat * (g * x_hat).mean(-1, keepdims=True))
    lead = tuple(range(dy.ndim - 1))
    return dx, (dy * x_hat).sum(axis=lead), dy.sum(axis=lead)
