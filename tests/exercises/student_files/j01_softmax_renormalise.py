import numpy as np

EXERCISE = "softmax_backward"


def softmax_backward(dy, cache):
    # renormalise y first, "to be safe" (0/0 on a row with no allowed entry)
    y = cache.y / cache.y.sum(axis=cache.axis, keepdims=True)
    return y * (dy - (y * dy).sum(axis=cache.axis, keepdims=True))
