"""Edge cases found in review: empty axes, batch axes on v only, dtypes, stale state."""
import numpy as np
import pytest

from attention_ref import (
    KVCache,
    MultiHeadAttention,
    causal_mask,
    gradcheck,
    mask_to_additive,
    multi_head_attention_backward as mha_backward,
    multi_head_attention_forward as mha_forward,
    scaled_dot_product_attention_backward as sdpa_backward,
    scaled_dot_product_attention_forward as sdpa_forward,
    softmax_backward,
    softmax_forward,
    split_heads,
)
from _helpers import assert_close, check_gradients, random_params
from _reference import loop_attention


def test_mask_with_batch_axes_of_v_only():
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((3, 4)), rng.standard_normal((5, 4)), rng.standard_normal((2, 5, 3))
    for mask in (rng.random((2, 3, 5)) < 0.6, rng.standard_normal((2, 3, 5))):
        out, _ = sdpa_forward(q, k, v, mask)
        assert_close(out, loop_attention(q, k, v, mask)[0])
        check_gradients(lambda q, k, v: sdpa_forward(q, k, v, mask), sdpa_backward, q, k, v)


def test_empty_key_sequence_gives_zero_output():
    out, cache = sdpa_forward(np.ones((3, 4)), np.ones((0, 4)), np.ones((0, 2)))
    assert out.shape == (3, 2) and (out == 0).all()
    y, _ = softmax_forward(np.ones((3, 0)))
    assert y.shape == (3, 0)


def test_zero_width_queries_are_rejected():
    with pytest.raises(ValueError, match="d_k must be positive"):
        sdpa_forward(np.ones((3, 0)), np.ones((3, 0)), np.ones((3, 2)))


def test_head_mask_with_no_queries_and_float32():
    rng = np.random.default_rng(1)
    params = random_params(rng, 4, 2, 2, 2)
    out, cache = mha_forward(np.ones((0, 4)), np.ones((3, 4)), np.ones((3, 4)), params, 2,
                             head_mask=np.ones(2))
    grads = mha_backward(np.ones_like(out), cache)[3]
    assert grads["head_mask"].tolist() == [0.0, 0.0]
    layer = MultiHeadAttention(4, 2, seed=0, dtype=np.float32)
    y = layer.forward(np.ones((3, 4), np.float32), head_mask=[1.0, 0.0])
    assert y.dtype == np.float32
    assert layer.backward(np.ones_like(y)).dtype == np.float32
    assert all(g.dtype == np.float32 for g in layer.grads.values())


def test_extreme_softmax_inputs_do_not_warn():
    for dtype, big in ((np.float32, 3e38), (np.float64, 1e308)):
        y, _ = softmax_forward(np.array([-big, big], dtype=dtype))
        assert y.tolist() == [0.0, 1.0]


def test_float_mask_too_large_for_float32_is_rejected():
    q = np.ones((2, 4), np.float32)
    with pytest.raises(ValueError, match="too large for float32"):
        sdpa_forward(q, q, q, np.full((2, 2), 1e39))


def test_failed_forward_does_not_leave_stale_self_attention_flag():
    layer = MultiHeadAttention(4, 2, seed=0)
    x = np.random.default_rng(2).standard_normal((3, 4))
    layer.forward(x, x, x)
    with pytest.raises(ValueError):
        layer.forward(np.ones((3, 5)))
    grads = layer.backward(np.ones((3, 4)))
    assert isinstance(grads, tuple) and len(grads) == 3


def test_gradcheck_passes_trailing_dicts_through_unchanged():
    x = np.random.default_rng(3).standard_normal((3, 4))
    report = gradcheck(lambda x, opts: softmax_forward(x, **opts), softmax_backward, x, {"axis": 0})
    assert report.ok


def test_gradcheck_single_input_gradient_in_a_list_and_ragged_gradients():
    x = np.random.default_rng(4).standard_normal((3, 4))
    assert gradcheck(softmax_forward, lambda d, c: [softmax_backward(d, c)], x).ok
    ragged = gradcheck(softmax_forward, lambda d, c: ([[1.0], [1.0, 2.0]],), x)
    assert not ragged.ok and "not an array" in str(ragged)


def test_kv_cache_misuse_is_reported():
    cache = KVCache()
    cache.append(np.ones((2, 1, 3)), np.ones((2, 1, 4)))
    with pytest.raises(ValueError, match="values"):
        cache.append(np.ones((2, 1, 3)), np.ones((2, 1, 5)))
    with pytest.raises(TypeError, match="dtype"):
        cache.append(np.ones((2, 1, 3), np.float32), np.ones((2, 1, 4), np.float32))
    with pytest.raises(TypeError, match="KVCache"):
        MultiHeadAttention(4, 2).decode_step(np.ones((1, 4)), cache={})
    with pytest.raises(ValueError, match=r"t >= 1 new tokens, got shape \(0, 4\)"):
        MultiHeadAttention(4, 2).decode_step(np.ones((0, 4)), KVCache())


def test_small_validations():
    with pytest.raises(TypeError, match="real numbers"):
        split_heads([["a", "b"]], 2)
    with pytest.raises(TypeError, match="floating"):
        mask_to_additive(np.array([True]), dtype=int)
    assert causal_mask(3, 2).tolist() == [[False, False], [True, False], [True, True]]
