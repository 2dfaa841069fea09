import numpy as np
EXERCISE = "linear_backward"
def linear_backward(dy, cache):
    x, W = cache.x, cache.W
    d_in, d_out = W.shape
    xs = x.reshape(-1, d_in); gs = dy.reshape(-1, d_out)
    dW = np.zeros((d_in, d_out)); db = np.zeros(d_out)
    for r in range(xs.shape[0]):
        dW += np.outer(xs[r], gs[r]); db += gs[r]
    dx = (gs @ W.T).reshape(x.shape)
    return dx, dW, (db if cache.has_bias else None)
