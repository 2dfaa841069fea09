import numpy as np
EXERCISE = "softmax_backward"
def softmax_backward(dy, cache):
    y = cache.y
    s = (dy * y).sum(axis=cache.axis)        # forgot keepdims
    return y * (dy - np.expand_dims(s, -1))  # ...and re-added it at the end
