import numpy as np
EXERCISE = "layer_norm_backward"
def layer_norm_backward(dy, cache):
    xh, rstd, g = cache.x_hat, cache.rstd, cache.gamma
    dxh = dy * g
    D = xh.shape[-1]
    dx = rstd / D * (D * dxh - dxh.sum(-1, keepdims=True) - xh * (dxh * xh).sum(-1, keepdims=True))
    dgamma = (dy * xh).sum(axis=0) if dy.ndim > 1 else dy * xh   # only the first axis summed
    dbeta = dy.sum(axis=0) if dy.ndim > 1 else dy
    return dx, dgamma, dbeta
