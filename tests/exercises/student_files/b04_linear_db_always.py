import numpy as np
EXERCISE = "linear_backward"
def linear_backward(dy, cache):
    x, W = cache.x, cache.W
    lead = tuple(range(x.ndim - 1))
    dx = dy @ W.T
    dW = np.tensordot(x, dy, axes=(lead, lead)) if lead else np.outer(x, dy)
    db = dy.sum(axis=lead)      # returned even without a bias
    return dx, dW, db
