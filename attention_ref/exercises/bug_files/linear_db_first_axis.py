"""Spot the bug linear-db-first-axis: linear_backward.

One line is wrong on purpose (attention_ref.exercises.bugs says which, once it is fixed).
"""
import numpy as np


def linear_backward(dy, cache):
    x, W = cache.x, cache.W
    dx = np.einsum("...o,io->...i", dy, W)
    rows_x, rows_dy = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])
    dW = np.einsum("ri,ro->io", rows_x, rows_dy)
    db = dy.sum(axis=0) if cache.has_bias else None
    return dx, dW, db
