"""GPT-2's and Llama's blocks: against loops written from their formulas, and by finite differences."""
import math

import numpy as np
import pytest

from attention_ref import (
    LLAMA_PARAM_NAMES,
    gpt2_block_backward,
    gpt2_block_forward,
    init_gpt2_block_params,
    init_llama_block_params,
    llama_block_backward,
    llama_block_forward,
    padding_mask,
)
from _helpers import assert_close, check_gradients


def _jitter(params, rng, size=0.1):
    """Parameters moved off their initial values, so no gain sits at exactly 1."""
    return {k: v + size * rng.standard_normal(v.shape) for k, v in params.items()}


# -- references, position by position and head by head -------------------------------------------

def loop_layer_norm(row, gamma, beta, eps):
    mu = sum(row) / len(row)
    var = sum((v - mu) ** 2 for v in row) / len(row)
    return np.array([gamma[j] * (row[j] - mu) / math.sqrt(var + eps) + beta[j] for j in range(len(row))])


def loop_rms_norm(row, weight, eps):
    ms = sum(v * v for v in row) / len(row)
    return np.array([weight[j] * row[j] / math.sqrt(ms + eps) for j in range(len(row))])


def loop_causal_attention(Q, K, V, allowed, scale):
    """One head: Q (N, Dh), K, V (N, Dh); allowed[i, j] True where query i may see key j."""
    n = Q.shape[0]
    out = np.zeros((n, V.shape[1]))
    for i in range(n):
        scores = [sum(Q[i, t] * K[j, t] for t in range(Q.shape[1])) * scale if allowed[i, j] else -math.inf
                  for j in range(n)]
        top = max(scores)
        w = [math.exp(s - top) if s != -math.inf else 0.0 for s in scores]
        total = sum(w)
        out[i] = sum(w[j] / total * V[j] for j in range(n))
    return out


def loop_rope_half(X, base):
    """Rotate-half RoPE, position p = row index: pairs (x_i, x_{i + D/2}) by p * base^(-2i / D)."""
    n, d = X.shape
    Y = np.empty_like(X)
    for p in range(n):
        for i in range(d // 2):
            angle = p * base ** (-2 * i / d)
            c, s = math.cos(angle), math.sin(angle)
            Y[p, i] = X[p, i] * c - X[p, i + d // 2] * s
            Y[p, i + d // 2] = X[p, i] * s + X[p, i + d // 2] * c
    return Y


def loop_gpt2_block(x, p, h, eps, allowed):
    """One sequence x (N, D): x + Attn(LN_1 x), then + MLP(LN_2 .), GELU tanh."""
    n, d = x.shape
    z = np.array([loop_layer_norm(x[i], p["ln1.gamma"], p["ln1.beta"], eps) for i in range(n)])
    a = p["self_attn"]
    Q, K, V = z @ a["W_q"] + a["b_q"], z @ a["W_k"] + a["b_k"], z @ a["W_v"] + a["b_v"]
    dh = d // h
    heads = [loop_causal_attention(Q[:, i * dh:(i + 1) * dh], K[:, i * dh:(i + 1) * dh], V[:, i * dh:(i + 1) * dh],
                                   allowed, 1 / math.sqrt(dh)) for i in range(h)]
    hidden = x + np.concatenate(heads, axis=1) @ a["W_o"] + a["b_o"]
    u = np.array([loop_layer_norm(hidden[i], p["ln2.gamma"], p["ln2.beta"], eps) for i in range(n)])
    pre = u @ p["ffn.W_1"] + p["ffn.b_1"]
    gelu = 0.5 * pre * (1 + np.tanh(math.sqrt(2 / math.pi) * (pre + 0.044715 * pre ** 3)))
    return hidden + gelu @ p["ffn.W_2"] + p["ffn.b_2"]


def loop_llama_block(x, p, h, hkv, base, eps, allowed, scale=None):
    """One sequence x (N, D): RMSNorm, attention with RoPE (half) and shared kv heads, SwiGLU."""
    n, d = x.shape
    z = np.array([loop_rms_norm(x[i], p["input_norm.weight"], eps) for i in range(n)])
    Q, K, V = z @ p["self_attn.W_q"], z @ p["self_attn.W_k"], z @ p["self_attn.W_v"]
    dh = Q.shape[1] // h
    heads = []
    for i in range(h):
        j = i // (h // hkv)  # the key/value head query head i shares
        q = loop_rope_half(Q[:, i * dh:(i + 1) * dh], base)
        k = loop_rope_half(K[:, j * dh:(j + 1) * dh], base)
        heads.append(loop_causal_attention(q, k, V[:, j * dh:(j + 1) * dh], allowed,
                                           1 / math.sqrt(dh) if scale is None else scale))
    hidden = x + np.concatenate(heads, axis=1) @ p["self_attn.W_o"]
    u = np.array([loop_rms_norm(hidden[i], p["post_attention_norm.weight"], eps) for i in range(n)])
    a, b = u @ p["mlp.W_gate"], u @ p["mlp.W_up"]
    return hidden + (a / (1 + np.exp(-a)) * b) @ p["mlp.W_down"]


def _gpt2_nested(p):
    return {**p, "self_attn": {k.split(".", 1)[1]: v for k, v in p.items() if k.startswith("self_attn.")}}


# -- GPT-2 ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape, h", [((5, 8), 2), ((2, 4, 6), 3), ((2, 1, 3, 4), 1)])
def test_gpt2_block_matches_loop(shape, h):
    rng = np.random.default_rng(0)
    p = _jitter(init_gpt2_block_params(shape[-1], h, seed=1), rng)
    x = rng.standard_normal(shape)
    y, cache = gpt2_block_forward(x, p, h)
    n = shape[-2]
    allowed = np.tril(np.ones((n, n), bool))
    for idx in np.ndindex(shape[:-2]):
        assert_close(y[idx], loop_gpt2_block(x[idx], _gpt2_nested(p), h, 1e-5, allowed), what="GPT-2 block")
    assert (cache.weights[..., np.triu_indices(n, 1)[0], np.triu_indices(n, 1)[1]] == 0).all()


def test_gpt2_block_padding_mask_and_gradcheck():
    rng = np.random.default_rng(1)
    p = _jitter(init_gpt2_block_params(4, 2, seed=2), rng)
    x = rng.standard_normal((2, 4, 4))
    pad = padding_mask(np.array([4, 2]), 4)  # (2, 1, 4): item 2 has two real tokens
    y, cache = gpt2_block_forward(x, p, 2, mask=pad)
    assert (cache.weights[1, :, :, 2:] == 0).all()
    allowed = np.tril(np.ones((4, 4), bool)) & pad[1]
    assert_close(y[1], loop_gpt2_block(x[1], _gpt2_nested(p), 2, 1e-5, allowed), what="padded GPT-2 block")
    check_gradients(lambda x, p: gpt2_block_forward(x, p, 2, mask=pad), gpt2_block_backward, x, p,
                    names=["x", "params"])


def test_gpt2_block_scale_option():
    """GPT-2's scale_attn_weights=False is scale=1.0; scale_attn_by_inverse_layer_idx multiplies by 1/(i+1)."""
    rng = np.random.default_rng(3)
    p = _jitter(init_gpt2_block_params(4, 2, seed=3), rng)
    x = rng.standard_normal((3, 4))
    y_default, _ = gpt2_block_forward(x, p, 2)
    y_explicit, _ = gpt2_block_forward(x, p, 2, scale=1 / math.sqrt(2))
    np.testing.assert_array_equal(y_default, y_explicit)
    y_one, _ = gpt2_block_forward(x, p, 2, scale=1.0)
    assert not np.allclose(y_one, y_default)
    check_gradients(lambda x, p: gpt2_block_forward(x, p, 2, scale=0.25), gpt2_block_backward, x, p)


# -- Llama ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape, h, hkv", [((5, 8), 2, 2), ((2, 4, 8), 4, 2), ((2, 1, 3, 8), 4, 1), ((6, 12), 3, 1)])
def test_llama_block_matches_loop(shape, h, hkv):
    rng = np.random.default_rng(4)
    d = shape[-1]
    p = _jitter(init_llama_block_params(d, h, 2 * d, num_kv_heads=hkv, seed=5), rng, 0.3)
    x = rng.standard_normal(shape)
    y, cache = llama_block_forward(x, p, h, num_kv_heads=hkv, rope_base=100.0, eps=1e-5)
    n = shape[-2]
    for idx in np.ndindex(shape[:-2]):
        assert_close(y[idx], loop_llama_block(x[idx], p, h, hkv, 100.0, 1e-5, np.tril(np.ones((n, n), bool))),
                     what="Llama block")
    assert cache.weights.shape == shape[:-2] + (h, n, n)


@pytest.mark.parametrize("shape, h, hkv, extra", [((4, 8), 2, 1, None), ((2, 5, 8), 4, 2, "padding"),
                                                   ((2, 4, 6), 3, 3, "float")])
def test_llama_block_gradcheck(shape, h, hkv, extra):
    rng = np.random.default_rng(6)
    d, n = shape[-1], shape[-2]
    p = _jitter(init_llama_block_params(d, h, 2 * d, num_kv_heads=hkv, seed=7), rng, 0.3)
    x = rng.standard_normal(shape)
    mask = None if extra is None else padding_mask(np.array([n, 2]), n) if extra == "padding" else \
        0.5 * rng.standard_normal((n, n))
    y, cache = llama_block_forward(x, p, h, num_kv_heads=hkv, mask=mask)
    _, grads = llama_block_backward(np.ones_like(y), cache)
    assert list(grads) == list(LLAMA_PARAM_NAMES)
    check_gradients(lambda x, p: llama_block_forward(x, p, h, num_kv_heads=hkv, mask=mask), llama_block_backward,
                    x, p, names=["x", "params"])


def test_llama_block_scale_and_float32():
    rng = np.random.default_rng(8)
    p = _jitter(init_llama_block_params(8, 2, 16, seed=9), rng, 0.3)
    x = rng.standard_normal((4, 8))
    y, _ = llama_block_forward(x, p, 2, scale=0.3, rope_base=50.0)
    assert_close(y, loop_llama_block(x, p, 2, 2, 50.0, 1e-6, np.tril(np.ones((4, 4), bool)), scale=0.3))
    p32 = {k: v.astype(np.float32) for k, v in p.items()}
    y32, cache = llama_block_forward(x.astype(np.float32), p32, 2)
    dx, grads = llama_block_backward(np.ones((4, 8)), cache)
    assert y32.dtype == dx.dtype == np.float32 and all(g.dtype == np.float32 for g in grads.values())


@pytest.mark.parametrize("change, error, message", [
    (lambda p: {k: v for k, v in p.items() if k != "mlp.W_up"}, ValueError, r"missing \['mlp.W_up'\]"),
    (lambda p: {**p, "mlp.b_up": np.ones(16)}, ValueError, r"unknown \['mlp.b_up'\]"),
    (lambda p: {**p, "input_norm.weight": np.ones(7)}, ValueError,
     r"^params\['input_norm.weight'\] must have shape \(8,\) to match x of width d_model = 8, got shape \(7,\)$"),
])
def test_llama_block_bad_params_are_named(change, error, message):
    p = init_llama_block_params(8, 2, 16, seed=10)
    with pytest.raises(error, match=message):
        llama_block_forward(np.ones((3, 8)), change(p), 2)


def test_scale_is_checked():
    p = init_llama_block_params(8, 2, 16, seed=11)
    with pytest.raises(ValueError, match="^scale must be a positive real number or None, got -1.0$"):
        llama_block_forward(np.ones((3, 8)), p, 2, scale=-1.0)
    with pytest.raises(TypeError, match="^scale must be a positive real number or None"):
        gpt2_block_forward(np.ones((3, 8)), init_gpt2_block_params(8, 2, seed=1), 2, scale="big")


@pytest.mark.parametrize("splits", [(6,), (1,) * 6, (4, 1, 1), (2, 3, 1)])
def test_llama_decode_with_prefill_in_any_split_is_the_forward(splits):
    from attention_ref import llama_block_decode_step
    from attention_ref.variants.kv_cache import KVCache

    rng = np.random.default_rng(12)
    p = _jitter(init_llama_block_params(8, 4, 16, num_kv_heads=2, seed=13), rng, 0.3)
    x = rng.standard_normal((2, 6, 8))
    full, _ = llama_block_forward(x, p, 4, num_kv_heads=2, rope_base=50.0)
    cache, outs, start = KVCache(), [], 0
    for t in splits:
        outs.append(llama_block_decode_step(x[:, start:start + t], p, 4, cache, num_kv_heads=2, rope_base=50.0))
        start += t
    assert_close(np.concatenate(outs, axis=1), full, what="decoded rows")
    assert cache.length == 6 and cache.keys.shape == (2, 2, 6, 2)  # rotated keys, once per key/value head


def test_llama_decode_bad_input():
    from attention_ref import llama_block_decode_step
    from attention_ref.variants.kv_cache import KVCache

    p = init_llama_block_params(8, 2, 16, seed=14)
    with pytest.raises(TypeError, match="^cache must be a KVCache, got dict$"):
        llama_block_decode_step(np.ones((1, 8)), p, 2, {})
    with pytest.raises(ValueError, match=r"^x_t must have shape \(\.\.\., t, d_model\) with t >= 1 new tokens, got shape \(0, 8\)$"):
        llama_block_decode_step(np.ones((0, 8)), p, 2, KVCache())


@pytest.mark.parametrize("splits", [(5,), (1,) * 5, (3, 2)])
def test_gpt2_decode_with_prefill_in_any_split_is_the_forward(splits):
    from attention_ref import gpt2_block_decode_step
    from attention_ref.variants.kv_cache import KVCache

    rng = np.random.default_rng(15)
    p = _jitter(init_gpt2_block_params(8, 2, seed=16), rng)
    x = rng.standard_normal((2, 5, 8))
    full, _ = gpt2_block_forward(x, p, 2)
    cache, outs, start = KVCache(), [], 0
    for t in splits:
        outs.append(gpt2_block_decode_step(x[:, start:start + t], p, 2, cache))
        start += t
    assert_close(np.concatenate(outs, axis=1), full, what="decoded rows")



def test_llama_key_value_heads_are_read_from_the_shapes():
    rng = np.random.default_rng(17)
    p = _jitter(init_llama_block_params(8, 4, 16, num_kv_heads=2, seed=18), rng, 0.3)
    x = rng.standard_normal((3, 8))
    np.testing.assert_array_equal(llama_block_forward(x, p, 4)[0], llama_block_forward(x, p, 4, num_kv_heads=2)[0])
