import numpy as np

EXERCISE = "merge_heads_backward"


def merge_heads_backward(dmerged, num_heads):
    *batch, n, width = dmerged.shape
    d_head = width // num_heads
    split = dmerged.reshape(*batch, n, num_heads, d_head)  # the reshape, fixed
    return np.moveaxis(split, -1, -3)  # but the axis moved is still the last
