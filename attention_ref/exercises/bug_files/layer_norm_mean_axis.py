"""Spot the bug layer-norm-mean-axis: layer_norm_backward.

One line is wrong on purpose (attention_ref.exercises.bugs says which, once it is fixed).
"""
import numpy as np


def layer_norm_backward(dy, cache):
    x_hat, rstd, gamma = cache.x_hat, cache.rstd, cache.gamma
    d = x_hat.shape[-1]
    dgamma = (dy * x_hat).reshape(-1, d).sum(axis=0)
    dbeta = dy.reshape(-1, d).sum(axis=0)
    g = dy * gamma
    mean_g = g.mean(axis=0, keepdims=True)
    mean_gx = (g * x_hat).mean(axis=-1, keepdims=True)
    dx = rstd * (g - mean_g - x_hat * mean_gx)
    return dx, dgamma, dbeta
