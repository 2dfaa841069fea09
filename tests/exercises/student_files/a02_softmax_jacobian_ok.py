import numpy as np
EXERCISE = "softmax_backward"
def softmax_backward(dy, cache):
    # explicit Jacobian, axis moved to the end
    y = np.moveaxis(cache.y, cache.axis, -1)
    g = np.moveaxis(dy, cache.axis, -1)
    n = y.shape[-1]
    J = y[..., :, None] * np.eye(n) - y[..., :, None] * y[..., None, :]
    dx = np.einsum('...ij,...i->...j', J, g)
    return np.moveaxis(dx, -1, cache.axis)
