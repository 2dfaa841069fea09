import numpy as np
from attention_ref import layer_norm_backward, multi_head_attention_backward, feed_forward_backward
EXERCISE = "encoder_block_backward"
MODE = "postnorm_dy_to_sub"

def _attn(ds, c):
    dq, dk, dv, g = multi_head_attention_backward(ds, c)
    return dq + dk + dv, g

def _res(dy, rc, sub_bwd):
    if rc.norm_first:                       # y = x + s(LN(x))
        dz, g = sub_bwd(dy, rc.sublayer)
        if MODE == "prenorm_ln_of_sum":
            dxn, dgam, dbet = layer_norm_backward(dz + dy, rc.norm); return dxn, g, dgam, dbet
        dxn, dgam, dbet = layer_norm_backward(dz, rc.norm)
        return dy + dxn, g, dgam, dbet
    dsum, dgam, dbet = layer_norm_backward(dy, rc.norm)   # y = LN(x + s(x))
    dz, g = sub_bwd(dy if MODE == "postnorm_dy_to_sub" else dsum, rc.sublayer)
    return dsum + dz, g, dgam, dbet

def encoder_block_backward(dout, cache):
    dh, gf, g2, b2 = _res(dout, cache.ffn, feed_forward_backward)
    dx, ga, g1, b1 = _res(dh, cache.attn, _attn)
    flat = {}
    for grp, d in (("self_attn", ga), ("ffn", gf), ("ln1", {"gamma": g1, "beta": b1}),
                   ("ln2", {"gamma": g2, "beta": b2})):
        for name, val in d.items():
            flat[f"{grp}.{name}"] = val
    return dx, {k: flat[k] for k in cache.param_keys}
