"""Causal decoding with a KV cache equals one causal forward; the cache grows one row per step."""
import numpy as np
import pytest

from attention_ref import KVCache, MultiHeadAttention, causal_mask
from tests._helpers import assert_close


def decode_all(layer, x):
    """Feed x (..., T, d_model) one token at a time; return outputs and the cache lengths seen."""
    cache = KVCache()
    outs, lengths = [], []
    for t in range(x.shape[-2]):  # decoding is sequential by nature
        outs.append(layer.decode_step(x[..., t:t + 1, :], cache))
        lengths.append(cache.length)
    return np.concatenate(outs, axis=-2), lengths, cache


def randomise_biases(layer, rng):
    """The layer starts with zero biases; give them values so the test covers them."""
    for name in ("b_q", "b_k", "b_v", "b_o"):
        if name in layer.params:
            layer.params[name] = 0.3 * rng.standard_normal(layer.params[name].shape)


@pytest.mark.parametrize("h, hkv", [(4, 4), (4, 2), (4, 1)])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("batch", [(), (3,), (2, 2)])
def test_decode_equals_causal_forward(h, hkv, bias, batch):
    rng = np.random.default_rng(0)
    layer = MultiHeadAttention(8, h, num_kv_heads=hkv, bias=bias, seed=1)
    randomise_biases(layer, rng)
    T = 21  # more than the cache's first capacity (16), so the doubling path runs
    x = rng.standard_normal(batch + (T, 8))
    full = layer(x, mask=causal_mask(T))
    stepped, lengths, cache = decode_all(layer, x)
    assert_close(stepped, full, rtol=0, atol=1e-12, what="decoded vs causal forward")
    assert lengths == list(range(1, T + 1))
    d_k = 8 // h
    assert cache.keys.shape == batch + (hkv, T, d_k)
    assert cache.values.shape == batch + (hkv, T, d_k)


def test_cache_contents_are_the_projected_keys_and_values():
    rng = np.random.default_rng(1)
    layer = MultiHeadAttention(6, 3, num_kv_heads=1, seed=2)
    randomise_biases(layer, rng)
    x = rng.standard_normal((2, 5, 6))
    _, _, cache = decode_all(layer, x)
    K = x @ layer.params["W_k"] + layer.params["b_k"]  # (2, 5, 2): one kv head of width 2
    V = x @ layer.params["W_v"] + layer.params["b_v"]
    assert_close(cache.keys[:, 0], K, what="cached keys")
    assert_close(cache.values[:, 0], V, what="cached values")


@pytest.mark.parametrize("h, hkv", [(8, 8), (8, 2), (8, 1)])
def test_cache_size(h, hkv):
    """2 * batch * h_kv * T * d_k * itemsize bytes: MQA keeps h times less than MHA."""
    d_model, T, B = 32, 10, 3
    layer = MultiHeadAttention(d_model, h, num_kv_heads=hkv, seed=0)
    x = np.random.default_rng(3).standard_normal((B, T, d_model))
    _, _, cache = decode_all(layer, x)
    assert cache.nbytes == 2 * B * hkv * T * (d_model // h) * 8


def test_first_step_attends_to_itself_only():
    rng = np.random.default_rng(4)
    layer = MultiHeadAttention(4, 2, seed=0)
    randomise_biases(layer, rng)
    x = rng.standard_normal((1, 4))
    out = layer.decode_step(x, KVCache())
    V = x @ layer.params["W_v"] + layer.params["b_v"]
    assert_close(out, V @ layer.params["W_o"] + layer.params["b_o"], what="first decoded token")


def test_float32_decoding():
    layer = MultiHeadAttention(8, 4, num_kv_heads=2, seed=0, dtype=np.float32)
    x = np.random.default_rng(5).standard_normal((2, 6, 8)).astype(np.float32)
    stepped, _, cache = decode_all(layer, x)
    assert stepped.dtype == np.float32 and cache.keys.dtype == np.float32
    assert_close(stepped, layer(x, mask=causal_mask(6)), rtol=1e-5, atol=1e-6, what="float32 decode")


def test_bad_inputs():
    layer = MultiHeadAttention(8, 4, seed=0)
    cache = KVCache()
    assert cache.length == 0 and cache.keys is None and cache.nbytes == 0
    with pytest.raises(ValueError, match=r"x_t.*t >= 1 new tokens, got shape \(0, 8\)"):
        layer.decode_step(np.ones((0, 8)), cache)
    with pytest.raises(TypeError, match="cache"):
        layer.decode_step(np.ones((1, 8)), {})
    with pytest.raises(ValueError, match="query|d_model|W_q"):
        layer.decode_step(np.ones((1, 5)), cache)
    with pytest.raises(TypeError, match="x_t"):
        layer.decode_step(np.array([["a"] * 8]), cache)
    assert cache.length == 0  # nothing was appended by failed calls
    layer.decode_step(np.ones((2, 1, 8)), cache)
    with pytest.raises(ValueError, match="batch"):
        layer.decode_step(np.ones((3, 1, 8)), cache)
    assert cache.length == 1


def test_cache_repr_shows_length_shapes_and_dtype():
    cache = KVCache()
    assert repr(cache) == "KVCache(length=0)"
    layer = MultiHeadAttention(4, 2, num_kv_heads=1, seed=0, dtype=np.float32)
    for t in range(3):
        layer.decode_step(np.ones((2, 1, 4), np.float32), cache)
    assert repr(cache) == "KVCache(length=3, keys=(2, 1, 3, 2), values=(2, 1, 3, 2), dtype='float32')"


@pytest.mark.parametrize("splits", [(7,), (3, 1, 1, 1, 1), (1, 4, 2), (2, 2, 2, 1)])
def test_prefill_then_decode_in_any_split_is_the_causal_forward(splits):
    from attention_ref import MultiHeadAttention, causal_mask

    rng = np.random.default_rng(20)
    layer = MultiHeadAttention(8, 4, num_kv_heads=2, seed=3)
    x = rng.standard_normal((2, 7, 8))
    full = layer(x, mask=causal_mask(7))
    cache, outs, start = KVCache(), [], 0
    for t in splits:
        outs.append(layer.decode_step(x[:, start:start + t], cache))
        start += t
    np.testing.assert_allclose(np.concatenate(outs, axis=1), full, rtol=1e-12, atol=1e-12)
    assert cache.length == 7 and cache.keys.shape == (2, 2, 7, 2)  # one entry per key/value head
