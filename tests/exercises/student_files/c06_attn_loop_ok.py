import numpy as np
EXERCISE = "scaled_dot_product_attention_backward"
def scaled_dot_product_attention_backward(dout, cache):
    q, k, v, P = cache.q, cache.k, cache.v, cache.weights
    lead = q.shape[:-2]
    Q = q.reshape(-1, *q.shape[-2:]); K = k.reshape(-1, *k.shape[-2:]); V = v.reshape(-1, *v.shape[-2:])
    PP = P.reshape(-1, *P.shape[-2:]); G = dout.reshape(-1, *dout.shape[-2:])
    dq = np.zeros_like(Q); dk = np.zeros_like(K); dv = np.zeros_like(V)
    for b in range(Q.shape[0]):
        for i in range(Q.shape[1]):           # row by row
            p = PP[b, i]; dp = V[b] @ G[b, i]
            ds = p * (dp - p @ dp)
            dq[b, i] = cache.scale * ds @ K[b]
            dk[b] += cache.scale * np.outer(ds, Q[b, i])
            dv[b] += np.outer(p, G[b, i])
    return dq.reshape(q.shape), dk.reshape(k.shape), dv.reshape(v.shape)
