import numpy as np
EXERCISE = "softmax_backward"
def softmax_backward(dy, cache):
    y = cache.y
    # "sum of the upstream gradient" instead of sum of y*dy
    return y * (dy - dy.mean(axis=cache.axis, keepdims=True))
