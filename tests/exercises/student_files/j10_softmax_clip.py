import numpy as np

EXERCISE = "softmax_backward"


def softmax_backward(dy, cache):
    y = np.clip(cache.y, 1e-8, None)  # "avoid exact zeros"
    return y * (dy - (y * dy).sum(axis=cache.axis, keepdims=True))
