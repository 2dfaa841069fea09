import numpy as np
EXERCISE = "layer_norm_backward"
def layer_norm_backward(dy, cache):
    xh, rstd, g = cache.x_hat, cache.rstd, cache.gamma
    lead = tuple(range(dy.ndim - 1))
    dgamma = (dy * xh).sum(axis=lead)
    dbeta = dy.sum(axis=lead)
    dxh = dy * g
    dx = rstd * (dxh - dxh.mean(-1, keepdims=True) - xh * (dxh * xh).mean(-1, keepdims=True))
    return dx, dgamma, dbeta
