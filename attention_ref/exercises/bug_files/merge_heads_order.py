"""Spot the bug merge-heads-order: merge_heads_backward.

One line is wrong on purpose (attention_ref.exercises.bugs says which, once it is fixed).
"""
import numpy as np


def merge_heads_backward(dmerged, num_heads):
    *batch, n, width = dmerged.shape
    d_head = width // num_heads
    # (..., N, H*Dh) -> (..., H, N, Dh)
    split = dmerged.reshape(*batch, n, d_head, num_heads)
    return np.moveaxis(split, -1, -3)
