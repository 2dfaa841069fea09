"""Spot the bug linear-dW-transposed: linear_backward.

One line is wrong on purpose (attention_ref.exercises.bugs says which, once it is fixed).
"""
import numpy as np


def linear_backward(dy, cache):
    x, W = cache.x, cache.W
    x2 = x.reshape(-1, x.shape[-1])      # (rows, d_in)
    dy2 = dy.reshape(-1, dy.shape[-1])   # (rows, d_out)
    dx = dy @ W.T
    dW = dy2.T @ x2
    db = dy2.sum(axis=0) if cache.has_bias else None
    return dx, dW, db
