"""Spot the bug softmax-s-times-one-minus-s: softmax_backward.

One line is wrong on purpose (attention_ref.exercises.bugs says which, once it is fixed).
"""
import numpy as np


def softmax_backward(dy, cache):
    s = cache.y
    # the derivative of the softmax, s (1 - s)
    grad = s * (1 - s)
    return dy * grad
