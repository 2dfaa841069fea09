import numpy as np
from attention_ref import layer_norm_backward, multi_head_attention_backward, feed_forward_backward
from attention_ref.nn.residual import residual_backward, join_grads
EXERCISE = "encoder_block_backward"
def encoder_block_backward(dout, cache):
    def attn(ds, c):
        dq, dk, dv, g = multi_head_attention_backward(ds, c)
        return dq + dk, g                         # forgot the value path
    dh, gf, g2, b2 = residual_backward(dout, cache.ffn, feed_forward_backward)
    dx, ga, g1, b1 = residual_backward(dh, cache.attn, attn)
    return dx, join_grads({"self_attn": ga, "ffn": gf, "ln1": {"gamma": g1, "beta": b1},
                           "ln2": {"gamma": g2, "beta": b2}}, cache.param_keys)
