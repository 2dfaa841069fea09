"""Grouped-query / multi-query attention and head masks on the multi-head forward and backward."""
import numpy as np
import pytest

from attention_ref import (
    MultiHeadAttention,
    causal_mask,
    multi_head_attention_backward,
    multi_head_attention_forward,
)
from tests._helpers import assert_close, check_gradients, random_params


def loop_softmax_attention(q, k, v, mask):
    """One head, one query at a time, straight from softmax(q k^T / sqrt(d_k) + mask) v."""
    out = np.zeros((q.shape[0], v.shape[1]))
    for i in range(q.shape[0]):
        scores = np.array([q[i] @ k[j] / np.sqrt(q.shape[1]) for j in range(k.shape[0])])
        if mask is not None:
            scores = np.where(mask[i], scores, -np.inf)
        weights = np.exp(scores - scores.max())
        out[i] = (weights / weights.sum()) @ v
    return out


def loop_gqa(query, key, value, p, h, hkv, mask=None, head_mask=None):
    """Query head i uses key/value head i // (h // hkv); heads concatenated, then W_o."""
    d_k, d_v = p["W_q"].shape[1] // h, p["W_v"].shape[1] // hkv
    bias = {n: p.get(n, None) for n in ("b_q", "b_k", "b_v", "b_o")}
    batch = query.shape[:-2]
    out = np.zeros(batch + (query.shape[-2], p["W_o"].shape[1]))
    for b in np.ndindex(batch):
        heads = []
        for i in range(h):
            j = i // (h // hkv)
            cq, ck, cv = slice(i * d_k, (i + 1) * d_k), slice(j * d_k, (j + 1) * d_k), slice(j * d_v, (j + 1) * d_v)
            q_i = query[b] @ p["W_q"][:, cq] + (0 if bias["b_q"] is None else bias["b_q"][cq])
            k_j = key[b] @ p["W_k"][:, ck] + (0 if bias["b_k"] is None else bias["b_k"][ck])
            v_j = value[b] @ p["W_v"][:, cv] + (0 if bias["b_v"] is None else bias["b_v"][cv])
            head = loop_softmax_attention(q_i, k_j, v_j, mask)
            heads.append(head if head_mask is None else head * head_mask[i])
        out[b] = np.concatenate(heads, axis=-1) @ p["W_o"] + (0 if bias["b_o"] is None else bias["b_o"])
    return out


SETTINGS = [(4, 4), (4, 2), (4, 1), (6, 3), (1, 1)]  # (num_heads, num_kv_heads): MHA, GQA, MQA


@pytest.mark.parametrize("h, hkv", SETTINGS)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("masked", [False, True])
def test_forward_matches_loop(h, hkv, bias, masked):
    rng = np.random.default_rng(0)
    p = random_params(rng, 8, h, 3, 2, kdim=5, vdim=6, d_out=7, num_kv_heads=hkv, bias=bias)
    query, key, value = rng.standard_normal((2, 4, 8)), rng.standard_normal((2, 6, 5)), rng.standard_normal((2, 6, 6))
    mask = causal_mask(4, 6) if masked else None
    head_mask = rng.uniform(0.2, 1.5, h)
    out, cache = multi_head_attention_forward(query, key, value, p, h, mask, num_kv_heads=hkv, head_mask=head_mask)
    assert_close(out, loop_gqa(query, key, value, p, h, hkv, mask, head_mask), what="out")
    assert cache.weights.shape == (2, h, 4, 6)


@pytest.mark.parametrize("h, hkv", SETTINGS)
def test_gradcheck_with_head_mask(h, hkv):
    rng = np.random.default_rng(1)
    p = random_params(rng, 4, h, 2, 3, num_kv_heads=hkv)
    query, key, value = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 5, 4)), rng.standard_normal((2, 5, 4))
    head_mask = rng.uniform(0.5, 1.5, h)

    def forward(query, key, value, params, head_mask):
        return multi_head_attention_forward(query, key, value, params, h, num_kv_heads=hkv, head_mask=head_mask)

    def backward(dout, cache):
        dquery, dkey, dvalue, grads = multi_head_attention_backward(dout, cache)
        head = grads.pop("head_mask")
        return dquery, dkey, dvalue, grads, head

    check_gradients(forward, backward, query, key, value, p, head_mask,
                    names=["query", "key", "value", "params", "head_mask"])


@pytest.mark.parametrize("h, hkv", [(4, 2), (4, 1)])
def test_gradcheck_self_attention_masked_unbatched(h, hkv):
    rng = np.random.default_rng(2)
    p = random_params(rng, 4, h, 2, 2, num_kv_heads=hkv, bias=False)
    x = rng.standard_normal((5, 4))

    def forward(x, params):
        return multi_head_attention_forward(x, x, x, params, h, causal_mask(5), num_kv_heads=hkv)

    def backward(dout, cache):
        dquery, dkey, dvalue, grads = multi_head_attention_backward(dout, cache)
        return dquery + dkey + dvalue, grads

    check_gradients(forward, backward, x, p, names=["x", "params"])


def test_kv_gradient_sums_over_sharing_heads():
    """With one kv head, its gradient is the sum of what each query head would send alone."""
    rng = np.random.default_rng(3)
    h = 3
    p = random_params(rng, 4, h, 2, 2, num_kv_heads=1, bias=False)
    x = rng.standard_normal((4, 4))
    dout = rng.standard_normal((4, 4))
    _, cache = multi_head_attention_forward(x, x, x, p, h, num_kv_heads=1)
    _, _, _, grads = multi_head_attention_backward(dout, cache)
    total = np.zeros_like(p["W_k"])
    for i in range(h):  # switch off all heads but i
        only_i = np.eye(h)[i]
        _, c_i = multi_head_attention_forward(x, x, x, p, h, num_kv_heads=1, head_mask=only_i)
        total += multi_head_attention_backward(dout, c_i)[3]["W_k"]
    assert_close(grads["W_k"], total, what="dW_k of the shared head")


def test_mha_default_equals_explicit_num_kv_heads():
    rng = np.random.default_rng(4)
    p = random_params(rng, 6, 3, 2, 2)
    x = rng.standard_normal((2, 5, 6))
    a, _ = multi_head_attention_forward(x, x, x, p, 3)
    b, _ = multi_head_attention_forward(x, x, x, p, 3, num_kv_heads=3)
    np.testing.assert_array_equal(a, b)


def test_head_mask_ones_and_zeros():
    rng = np.random.default_rng(5)
    h = 4
    p = random_params(rng, 8, h, 2, 3, num_kv_heads=2)
    x = rng.standard_normal((2, 5, 8))
    plain, plain_cache = multi_head_attention_forward(x, x, x, p, h, num_kv_heads=2)
    ones, _ = multi_head_attention_forward(x, x, x, p, h, num_kv_heads=2, head_mask=np.ones(h))
    assert_close(ones, plain, what="head_mask of ones")
    assert "head_mask" not in multi_head_attention_backward(np.ones_like(plain), plain_cache)[3]
    # zeroing head 1 equals zeroing the rows of W_o that read head 1's output
    off, _ = multi_head_attention_forward(x, x, x, p, h, num_kv_heads=2, head_mask=np.array([1.0, 0.0, 1.0, 1.0]))
    p_cut = dict(p)
    p_cut["W_o"] = p["W_o"].copy()
    p_cut["W_o"][3:6] = 0.0  # d_v = 3: head 1 is rows 3..5
    cut, _ = multi_head_attention_forward(x, x, x, p_cut, h, num_kv_heads=2)
    assert_close(off, cut, what="head 1 removed")
    assert not np.allclose(off, plain)


def test_head_importance_is_a_directional_derivative():
    """grads['head_mask'][i] is d(loss)/d(head_mask_i): compare with a one-sided change."""
    rng = np.random.default_rng(6)
    h = 3
    p = random_params(rng, 6, h, 2, 2)
    x = rng.standard_normal((4, 6))
    dout = rng.standard_normal((4, 6))
    m = np.ones(h)
    out, cache = multi_head_attention_forward(x, x, x, p, h, head_mask=m)
    importance = multi_head_attention_backward(dout, cache)[3]["head_mask"]
    for i in range(h):
        # the loss is linear in each head_mask entry, so removing head i changes it by exactly -importance_i
        off, _ = multi_head_attention_forward(x, x, x, p, h, head_mask=m - np.eye(h)[i])
        assert abs(np.sum((off - out) * dout) + importance[i]) < 1e-12


@pytest.mark.parametrize("h, hkv", [(8, 8), (8, 4), (8, 2), (8, 1)])
def test_parameter_count(h, hkv):
    d_model = 64
    d_k = d_model // h
    layer = MultiHeadAttention(d_model, h, num_kv_heads=hkv, seed=0)
    assert layer.params["W_k"].shape == (d_model, hkv * d_k)
    assert layer.params["W_v"].shape == (d_model, hkv * d_k)
    expected = 2 * (d_model * d_model + d_model) + 2 * (d_model * hkv * d_k + hkv * d_k)
    assert layer.parameter_count() == expected
    no_bias = MultiHeadAttention(d_model, h, num_kv_heads=hkv, bias=False, seed=0)
    assert no_bias.parameter_count() == 2 * d_model * d_model + 2 * d_model * hkv * d_k


@pytest.mark.parametrize("kwargs, exc, match", [
    ({"num_kv_heads": 3}, ValueError, "multiple of num_kv_heads"),
    ({"num_kv_heads": 0}, ValueError, "num_kv_heads"),
    ({"num_kv_heads": 2.0}, TypeError, "num_kv_heads"),
    ({"head_mask": np.ones(3)}, ValueError, r"head_mask.*\(4,\).*\(3,\)"),
    ({"head_mask": np.ones(4, dtype=bool)}, TypeError, "head_mask"),
    ({"head_mask": np.array([1.0, np.nan, 1.0, 1.0])}, ValueError, "head_mask"),
])
def test_bad_arguments(kwargs, exc, match):
    rng = np.random.default_rng(7)
    p = random_params(rng, 8, 4, 2, 2)
    x = rng.standard_normal((3, 8))
    with pytest.raises(exc, match=match):
        multi_head_attention_forward(x, x, x, p, 4, **kwargs)


def test_wrong_kv_width_is_named():
    rng = np.random.default_rng(8)
    p = random_params(rng, 8, 4, 2, 2, num_kv_heads=4)  # W_k has 4 heads' columns
    x = rng.standard_normal((3, 8))
    with pytest.raises(ValueError, match=r"W_k.*num_kv_heads\*d_k = 2\*2 = 4"):
        multi_head_attention_forward(x, x, x, p, 4, num_kv_heads=2)


def test_layer_gqa_and_head_mask():
    layer = MultiHeadAttention(8, 4, num_kv_heads=2, seed=1)
    x = np.random.default_rng(9).standard_normal((2, 5, 8))
    out = layer(x, head_mask=np.array([1.0, 0.5, 0.0, 2.0]))
    layer.backward(np.ones_like(out))
    assert set(layer.grads) == {"W_q", "b_q", "W_k", "b_k", "W_v", "b_v", "W_o", "b_o", "head_mask"}
    assert_close(out, loop_gqa(x, x, x, layer.params, 4, 2, None, np.array([1.0, 0.5, 0.0, 2.0])),
                 what="layer out")
    with pytest.raises(ValueError, match="separate"):
        MultiHeadAttention(8, 4, num_kv_heads=2, strategy="separate")
