"""Spot the bug attention-dq-unscaled: scaled_dot_product_attention_backward.

One line is wrong on purpose (attention_ref.exercises.bugs says which, once it is fixed).
"""
import numpy as np


def scaled_dot_product_attention_backward(dout, cache):
    q, k, v, P, scale = cache.q, cache.k, cache.v, cache.weights, cache.scale
    dv = np.einsum("...qk,...qd->...kd", P, dout)
    dP = np.einsum("...qd,...kd->...qk", dout, v)
    dS = P * (dP - np.einsum("...qd,...qd->...q", dout, cache.out)[..., None])
    dq = np.einsum("...qk,...kd->...qd", dS, k)
    dk = np.einsum("...qk,...qd->...kd", dS, q) * scale
    return _sum_to(dq, q.shape), _sum_to(dk, k.shape), _sum_to(dv, v.shape)


def _sum_to(grad, shape):
    """A gradient summed over the axes its input was broadcast along."""
    extra = grad.ndim - len(shape)
    grad = grad.sum(axis=tuple(range(extra))) if extra > 0 else grad
    ones = tuple(i for i, n in enumerate(shape) if n == 1 != grad.shape[i])
    return grad.sum(axis=ones, keepdims=True)
