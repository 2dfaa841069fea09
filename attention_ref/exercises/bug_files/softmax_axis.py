"""Spot the bug softmax-axis: softmax_backward.

One line is wrong on purpose (attention_ref.exercises.bugs says which, once it is fixed).
"""
import numpy as np


def softmax_backward(dy, cache):
    y, axis = cache.y, cache.axis
    # dx_i = y_i (dy_i - sum_j y_j dy_j), the sum along the softmax's axis
    s = np.sum(dy * y, axis=0, keepdims=True)
    return y * (dy - s)
