"""Spot the bug attention-D-axis: scaled_dot_product_attention_backward.

One line is wrong on purpose (attention_ref.exercises.bugs says which, once it is fixed).
"""
import numpy as np


def scaled_dot_product_attention_backward(dout, cache):
    q, k, v, P, scale = cache.q, cache.k, cache.v, cache.weights, cache.scale
    dv = np.swapaxes(P, -1, -2) @ dout
    dP = dout @ np.swapaxes(v, -1, -2)
    D = np.sum(P * dP, axis=-2, keepdims=True)  # one number per query row
    dS = P * (dP - D)
    dq = dS @ k * scale
    dk = np.swapaxes(dS, -1, -2) @ q * scale
    return _sum_to(dq, q.shape), _sum_to(dk, k.shape), _sum_to(dv, v.shape)


def _sum_to(grad, shape):
    """A gradient summed over the axes its input was broadcast along."""
    extra = grad.ndim - len(shape)
    grad = grad.sum(axis=tuple(range(extra))) if extra > 0 else grad
    ones = tuple(i for i, n in enumerate(shape) if n == 1 != grad.shape[i])
    return grad.sum(axis=ones, keepdims=True)
