import numpy as np
EXERCISE = "layer_norm_backward"
def layer_norm_backward(dy, cache):
    xh, rstd, g = cache.x_hat, cache.rstd, cache.gamma
    lead = tuple(range(dy.ndim - 1))
    dxh = dy * g
    N = xh.shape[-1]
    xmu = xh / rstd
    dvar = (dxh * xmu).sum(-1, keepdims=True) * -0.5 * rstd ** 3
    dmu = -(dxh * rstd).sum(-1, keepdims=True) - 2 * dvar * xmu.mean(-1, keepdims=True)
    dx = dxh * rstd + dvar * 2 * xmu / N + dmu / N
    return dx, (dy * xh).sum(axis=lead), dy.sum(axis=lead)
