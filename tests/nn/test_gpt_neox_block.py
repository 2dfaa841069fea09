"""GPT-NeoX's block without torch: against a plain loop written from the formula (per row, per head,
per query), by gradcheck in float64 over many shapes (parallel and sequential, rotary_pct from 1/4
to 1, with and without a padding mask), the decode step in any split against the forward, float32
staying float32, and bad inputs named."""
import math

import numpy as np
import pytest

import attention_ref as ar
from attention_ref.nn.gpt_neox_block import (GPT_NEOX_PARAM_NAMES, gpt_neox_block_backward,
                                             gpt_neox_block_decode_step, gpt_neox_block_forward,
                                             init_gpt_neox_block_params)
from attention_ref.variants.kv_cache import KVCache


def _params(D, H, F, seed=0):
    rng = np.random.default_rng(seed)
    p = init_gpt_neox_block_params(D, H, F, seed=seed)
    return {k: v * 20 if v.ndim == 2 else v + 0.3 * rng.standard_normal(v.shape) for k, v in p.items()}


def _loop(x, p, H, pct, base, eps, parallel, keep=None):
    """The block from its formula, one row, head and query at a time (keep: (B, N) of 0/1 keys)."""
    B, N, D = x.shape
    Dh = D // H
    r = int(Dh * pct)

    def ln(v, g, b):
        mu = sum(v) / D
        var = sum((t - mu) ** 2 for t in v) / D
        return [(t - mu) / math.sqrt(var + eps) * gi + bi for t, gi, bi in zip(v, g, b)]

    def rot(v, pos):  # rotate-half on the first r features, the rest passed
        out = list(v)
        for i in range(r // 2):
            a = pos * base ** (-2 * i / r)
            out[i] = v[i] * math.cos(a) - v[i + r // 2] * math.sin(a)
            out[i + r // 2] = v[i + r // 2] * math.cos(a) + v[i] * math.sin(a)
        return out

    def mlp(z):
        h = [sum(z[d] * p["mlp.W_1"][d, f] for d in range(D)) + p["mlp.b_1"][f] for f in range(p["mlp.W_1"].shape[1])]
        a = [t * 0.5 * (1 + math.erf(t / math.sqrt(2))) for t in h]
        return [sum(a[f] * p["mlp.W_2"][f, d] for f in range(len(a))) + p["mlp.b_2"][d] for d in range(D)]

    y = np.zeros_like(x)
    for b in range(B):
        z1 = [ln(list(x[b, n]), p["input_layernorm.gamma"], p["input_layernorm.beta"]) for n in range(N)]
        qkv = [[sum(z1[n][d] * p["attention.W_qkv"][d, c] for d in range(D)) + p["attention.b_qkv"][c]
                for c in range(3 * D)] for n in range(N)]
        for n in range(N):
            heads = []
            for h in range(H):
                q = rot(qkv[n][3 * h * Dh:(3 * h + 1) * Dh], n)
                seen = [j for j in range(n + 1) if keep is None or keep[b, j]]
                if not seen:  # a padding query before every real key: its row is not compared
                    heads += [0.0] * Dh
                    continue
                scores = [sum(a * c for a, c in zip(q, rot(qkv[j][(3 * h + 1) * Dh:(3 * h + 2) * Dh], j))) / math.sqrt(Dh)
                          for j in seen]
                top = max(scores)
                w = [math.exp(s - top) for s in scores]
                heads += [sum(wi * qkv[j][(3 * h + 2) * Dh + e] for wi, j in zip(w, seen)) / sum(w) for e in range(Dh)]
            a = [sum(heads[c] * p["attention.W_dense"][c, d] for c in range(D)) + p["attention.b_dense"][d]
                 for d in range(D)]
            hidden = list(x[b, n]) if parallel else [t + s for t, s in zip(x[b, n], a)]
            m = mlp(ln(hidden, p["post_attention_layernorm.gamma"], p["post_attention_layernorm.beta"]))
            y[b, n] = [t + s + u for t, s, u in zip(x[b, n], a, m)] if parallel else [t + u for t, u in zip(hidden, m)]
    return y


CASES = [(8, 2, 0.5, True), (8, 2, 0.5, False), (12, 3, 0.5, True), (8, 1, 0.25, True), (8, 2, 1.0, False),
         (16, 2, 0.25, False)]


@pytest.mark.parametrize("D, H, pct, parallel", CASES)
def test_forward_against_a_plain_loop(D, H, pct, parallel):
    p = _params(D, H, 10)
    x = np.random.default_rng(1).standard_normal((2, 4, D))
    keep = np.array([[1, 1, 1, 1], [0, 1, 1, 1]])
    for mask, k in ((None, None), (keep[:, None, :].astype(bool), keep)):
        y, _ = gpt_neox_block_forward(x, p, H, rotary_pct=pct, rope_base=50.0, mask=mask, parallel=parallel)
        ref = _loop(x, p, H, pct, 50.0, 1e-5, parallel, k)
        rows = np.ones((2, 4), bool) if k is None else k.astype(bool)  # a padding query's row is not compared
        np.testing.assert_allclose(y[rows], ref[rows], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("D, H, pct, parallel", CASES)
def test_gradcheck(D, H, pct, parallel):
    p = _params(D, H, 6, seed=D + H)
    x = np.random.default_rng(2).standard_normal((2, 3, D))
    mask = np.array([[True, True, True], [False, True, True]])[:, None, :]

    def forward(x, params):
        return gpt_neox_block_forward(x, params, H, rotary_pct=pct, rope_base=30.0, mask=mask, parallel=parallel)

    def backward(dy, cache):
        dx, grads = gpt_neox_block_backward(dy, cache)
        return dx, grads

    ar.gradcheck(forward, backward, x, p, atol=1e-8, rtol=1e-6).raise_if_failed()


@pytest.mark.parametrize("parallel", [True, False])
def test_decode_in_any_split_gives_the_forward(parallel):
    p = _params(12, 3, 8)
    x = np.random.default_rng(3).standard_normal((2, 6, 12))
    y, _ = gpt_neox_block_forward(x, p, 3, rotary_pct=0.5, parallel=parallel)
    for split in ([6], [1] * 6, [4, 1, 1], [2, 3, 1]):
        cache, outs, start = KVCache(), [], 0
        for t in split:
            outs.append(gpt_neox_block_decode_step(x[:, start:start + t], p, 3, cache, rotary_pct=0.5,
                                                   parallel=parallel))
            start += t
        np.testing.assert_allclose(np.concatenate(outs, axis=1), y, rtol=1e-12, atol=1e-12)


def test_float32_stays_float32():
    p = {k: v.astype(np.float32) for k, v in _params(8, 2, 6).items()}
    x = np.random.default_rng(4).standard_normal((1, 3, 8)).astype(np.float32)
    y, cache = gpt_neox_block_forward(x, p, 2, rotary_pct=0.5)
    dx, grads = gpt_neox_block_backward(np.ones_like(y), cache)
    assert y.dtype == dx.dtype == np.float32 and all(g.dtype == np.float32 for g in grads.values())
    assert sorted(grads) == sorted(GPT_NEOX_PARAM_NAMES)
    assert gpt_neox_block_decode_step(x, p, 2, KVCache(), rotary_pct=0.5).dtype == np.float32


def test_bad_inputs_are_named():
    p = _params(8, 2, 6)
    x = np.zeros((1, 3, 8))
    with pytest.raises(ValueError, match=r"missing \['mlp.b_2'\]"):
        gpt_neox_block_forward(x, {k: v for k, v in p.items() if k != "mlp.b_2"}, 2)
    with pytest.raises(ValueError, match=r"params\['attention.W_qkv'\] must have shape \(8, 24\)"):
        gpt_neox_block_forward(x, {**p, "attention.W_qkv": np.zeros((8, 16))}, 2)
    with pytest.raises(ValueError, match="d_model = 8 must be a multiple of num_heads = 3"):
        gpt_neox_block_forward(x, p, 3)
    with pytest.raises(ValueError, match=r"rotary_pct = 0.25 rotates int\(4 \* 0.25\) = 1 features"):
        gpt_neox_block_forward(x, p, 2, rotary_pct=0.25)
    with pytest.raises(TypeError, match="parallel must be True or False"):
        gpt_neox_block_forward(x, p, 2, rotary_pct=0.5, parallel="yes")
    before = {k: v.copy() for k, v in p.items()}
    gpt_neox_block_forward(x, p, 2, rotary_pct=0.5)
    assert all(np.array_equal(before[k], p[k]) for k in p)  # nothing modified in place
