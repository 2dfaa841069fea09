import numpy as np
EXERCISE = "merge_heads_backward"
def merge_heads_backward(dmerged, num_heads):
    Dh = dmerged.shape[-1] // num_heads
    out = np.zeros(dmerged.shape[:-2] + (num_heads, dmerged.shape[-2], Dh))
    for i in range(num_heads):
        out[..., i, :, :] = dmerged[..., i * Dh + 1:(i + 1) * Dh + 1] if i < num_heads - 1 else dmerged[..., -Dh:]
    return out
