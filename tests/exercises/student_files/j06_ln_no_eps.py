import numpy as np

EXERCISE = "layer_norm_backward"


def layer_norm_backward(dy, cache):
    x_hat, gamma = cache.x_hat, cache.gamma
    x = x_hat / cache.rstd  # x - mu
    rstd = 1 / np.sqrt((x * x).mean(-1, keepdims=True))  # recomputed, without eps
    x_hat = x * rstd
    g = dy * gamma
    dx = rstd * (g - g.mean(-1, keepdims=True) - x_hat * (g * x_hat).mean(-1, keepdims=True))
    lead = tuple(range(dy.ndim - 1))
    return dx, (dy * x_hat).sum(axis=lead), dy.sum(axis=lead)
