import numpy as np
EXERCISE = "softmax_backward"
def softmax_backward(dy, cache):
    y = cache.y
    dx = y * (dy - np.sum(dy * y, axis=cache.axis, keepdims=True))
    return np.where(y > 0, dx, dy)     # "masked entries: let the gradient through unchanged"
