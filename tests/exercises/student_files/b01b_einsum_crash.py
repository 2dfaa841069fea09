import numpy as np
EXERCISE = "linear_backward"
def linear_backward(dy, cache):
    x, W = cache.x, cache.W
    dx = np.einsum('...o,io->...i', dy, W)
    dW = np.einsum('...i,...o->io', x, dy)
    db = dy.reshape(-1, dy.shape[-1]).sum(axis=0) if cache.has_bias else None
    return dx, dW, db
