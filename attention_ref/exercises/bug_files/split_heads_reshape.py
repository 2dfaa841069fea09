"""Spot the bug split-heads-reshape: split_heads_backward.

One line is wrong on purpose (attention_ref.exercises.bugs says which, once it is fixed).
"""
import numpy as np


def split_heads_backward(dheads):
    *batch, h, n, d_head = dheads.shape
    # (..., H, N, Dh) back to (..., N, H*Dh)
    return dheads.reshape(*batch, n, h * d_head)
