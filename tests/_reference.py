"""Plain-loop implementations written straight from the formulas, one scalar at a time.

Slow on purpose: no vectorisation, no tricks, so that they are easy to check by eye
against the documents' formulas. The tests compare the library's forwards with them.
"""
from __future__ import annotations

import math

import numpy as np


def loop_linear(x, W, b=None):
    """y[r, j] = sum_i x[r, i] W[i, j] + b[j] for every row r of x (..., Din)."""
    x = np.asarray(x, dtype=np.float64)
    rows = x.reshape(-1, x.shape[-1])
    y = np.zeros((rows.shape[0], W.shape[1]))
    for r in range(rows.shape[0]):
        for j in range(W.shape[1]):
            total = 0.0 if b is None else float(b[j])
            for i in range(W.shape[0]):
                total += rows[r, i] * W[i, j]
            y[r, j] = total
    return y.reshape(x.shape[:-1] + (W.shape[1],))


def loop_softmax_row(row):
    """softmax of one list of numbers; -inf entries get 0; an all -inf row gives zeros."""
    finite = [s for s in row if s != -math.inf]
    if not finite:
        return [0.0] * len(row)
    m = max(finite)
    e = [0.0 if s == -math.inf else math.exp(s - m) for s in row]
    total = sum(e)
    return [ei / total for ei in e]


def loop_softmax(x, axis=-1):
    """softmax along ``axis`` by looping over every other index."""
    x = np.moveaxis(np.asarray(x, dtype=np.float64), axis, -1)
    y = np.zeros_like(x)
    for idx in np.ndindex(x.shape[:-1]):
        y[idx] = loop_softmax_row(list(x[idx]))
    return np.moveaxis(y, -1, axis)


def loop_attention_2d(q, k, v, mask=None):
    """Attention for one (n_q, d_k), (n_k, d_k), (n_k, d_v) triple, score by score.

    score_ij = sum_l q_il k_jl / sqrt(d_k) (+ float mask, or -inf where a bool mask is
    False); weights_i = softmax(score_i); out_i = sum_j weights_ij v_j.
    """
    n_q, d_k = q.shape
    n_k, d_v = v.shape
    out = np.zeros((n_q, d_v))
    weights = np.zeros((n_q, n_k))
    for i in range(n_q):
        scores = []
        for j in range(n_k):
            s = sum(q[i, l] * k[j, l] for l in range(d_k)) / math.sqrt(d_k)
            if mask is not None:
                m = mask[i, j]
                if isinstance(m, (bool, np.bool_)):
                    s = s if m else -math.inf
                else:
                    s = s + float(m)
            scores.append(s)
        weights[i] = loop_softmax_row(scores)
        for j in range(n_k):
            for c in range(d_v):
                out[i, c] += weights[i, j] * v[j, c]
    return out, weights


def loop_attention(q, k, v, mask=None):
    """loop_attention_2d over every batch index, broadcasting q, k, v and mask."""
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    scores_shape = batch + (q.shape[-2], k.shape[-2])
    if mask is not None:
        mask = np.broadcast_to(mask, scores_shape)
    q = np.broadcast_to(q, batch + q.shape[-2:])
    k = np.broadcast_to(k, batch + k.shape[-2:])
    v = np.broadcast_to(v, batch + v.shape[-2:])
    out = np.zeros(batch + (q.shape[-2], v.shape[-1]))
    weights = np.zeros(scores_shape)
    for idx in np.ndindex(batch):
        out[idx], weights[idx] = loop_attention_2d(q[idx], k[idx], v[idx],
                                                   None if mask is None else mask[idx])
    return out, weights


def loop_multi_head(query, key, value, params, num_heads, mask=None, num_kv_heads=None,
                    head_mask=None):
    """The documents' formula, head by head with plain loops:

    head_i = Attention(query W_i^Q + b_i^Q, key W_j^K + b_j^K, value W_j^V + b_j^V),
    j = i // (h / h_kv); out = Concat(head_1..head_h) W^O + b^O.
    """
    h = num_heads
    hkv = h if num_kv_heads is None else num_kv_heads
    d_k = params["W_q"].shape[1] // h
    d_v = params["W_v"].shape[1] // hkv
    heads, weights = [], []
    for i in range(h):
        j = i // (h // hkv)
        qs, ks, vs = slice(i * d_k, (i + 1) * d_k), slice(j * d_k, (j + 1) * d_k), slice(j * d_v, (j + 1) * d_v)
        b = {n: params.get(n) for n in ("b_q", "b_k", "b_v")}
        q_i = loop_linear(query, params["W_q"][:, qs], None if b["b_q"] is None else b["b_q"][qs])
        k_i = loop_linear(key, params["W_k"][:, ks], None if b["b_k"] is None else b["b_k"][ks])
        v_i = loop_linear(value, params["W_v"][:, vs], None if b["b_v"] is None else b["b_v"][vs])
        o, w = loop_attention(q_i, k_i, v_i, mask)
        if head_mask is not None:
            o = o * head_mask[i]
        heads.append(o)
        weights.append(w)
    concat = np.concatenate(heads, axis=-1)
    return loop_linear(concat, params["W_o"], params.get("b_o")), np.stack(weights, axis=-3)


def loop_embedding(ids, W):
    """out[..., n, :] = W[ids[..., n], :], one position at a time."""
    ids = np.asarray(ids)
    flat = ids.reshape(-1)
    out = np.zeros((flat.size, W.shape[1]), dtype=W.dtype)
    for n in range(flat.size):
        for j in range(W.shape[1]):
            out[n, j] = W[int(flat[n]), j]
    return out.reshape(ids.shape + (W.shape[1],))


def loop_cross_entropy(logits, targets, ignore_index=-100):
    """mean over the kept rows of -log(exp(z_t) / sum_v exp(z_v)), with math.log and math.exp."""
    z = np.asarray(logits, dtype=np.float64).reshape(-1, np.shape(logits)[-1])
    t = np.asarray(targets).reshape(-1)
    total, count = 0.0, 0
    for r in range(z.shape[0]):
        if t[r] == ignore_index:
            continue
        m = max(z[r])
        log_sum = m + math.log(sum(math.exp(v - m) for v in z[r]))
        total += log_sum - z[r, int(t[r])]
        count += 1
    return total / count if count else 0.0
