"""causal_mask, padding_mask, mask_to_additive: True means "may attend"; float masks are added."""
import os
import warnings

import numpy as np
import pytest

from attention_ref import (
    MultiHeadAttention,
    TransformerEncoderBlock,
    causal_mask,
    decoder_block_forward,
    flash_attention_forward,
    init_decoder_block_params,
    init_encoder_block_params,
    mask_to_additive,
    multi_head_attention_forward as mha_forward,
    padding_mask,
    scaled_dot_product_attention_backward as sdpa_backward,
    scaled_dot_product_attention_forward as sdpa_forward,
)


def test_causal_mask_is_lower_triangular():
    m = causal_mask(4)
    assert m.dtype == bool and m.shape == (4, 4)
    for i in range(4):
        for j in range(4):
            assert m[i, j] == (j <= i)


def test_causal_mask_with_longer_keys_aligns_to_the_end():
    m = causal_mask(2, 5)  # two new queries at positions 3 and 4 of a 5-token sequence
    assert m.tolist() == [[True, True, True, True, False], [True] * 5]


def test_padding_mask_values_and_broadcast_shape():
    m = padding_mask([3, 1], 4)
    assert m.shape == (2, 1, 4)
    assert m[:, 0].tolist() == [[True, True, True, False], [True, False, False, False]]
    assert np.broadcast_shapes(m.shape, (2, 5, 4)) == (2, 5, 4)


def test_mask_to_additive():
    a = mask_to_additive(np.array([True, False]))
    assert a[0] == 0.0 and a[1] == -np.inf


@pytest.mark.parametrize("call, error", [
    (lambda: causal_mask(-1), ValueError),
    (lambda: causal_mask(2.5), TypeError),
    (lambda: padding_mask([5], 4), ValueError),
    (lambda: padding_mask([-1], 4), ValueError),
    (lambda: padding_mask([1.5], 4), TypeError),
    (lambda: mask_to_additive(np.ones(3)), TypeError),
])
def test_bad_input(call, error):
    with pytest.raises(error):
        call()


# --- n = 0: an empty sequence has an empty mask ---

def test_causal_mask_of_length_zero():
    m = causal_mask(0)
    assert m.shape == (0, 0) and m.dtype == bool
    assert causal_mask(0, 3).shape == (0, 3) and causal_mask(2, 0).shape == (2, 0)


def test_attention_with_the_empty_causal_mask():
    q, v = np.ones((0, 4)), np.ones((0, 2))
    out, cache = sdpa_forward(q, q, v, causal_mask(0))
    assert out.shape == (0, 2)
    dq, dk, dv = sdpa_backward(np.ones((0, 2)), cache)
    assert dq.shape == (0, 4) and dk.shape == (0, 4) and dv.shape == (0, 2)
    layer = MultiHeadAttention(4, 2, seed=0)
    assert layer(q, mask=causal_mask(0)).shape == (0, 4)
    assert layer.backward(np.ones((0, 4))).shape == (0, 4)


# --- a float mask of 0s and 1s is a boolean keep-mask in disguise: warn ---

def _float_mask_calls():
    """Every public entry that takes a float mask, as ``mask -> call``, on n = 3 tokens."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 4))
    params = init_encoder_block_params(4, 2, 8, seed=0)
    decoder = init_decoder_block_params(4, 2, 8, seed=0)
    return {
        "attention": lambda m: sdpa_forward(x, x, x, m),
        "multi-head": lambda m: mha_forward(x, x, x, {k[10:]: v for k, v in params.items()
                                                       if k.startswith("self_attn.")}, 2, m),
        "flash": lambda m: flash_attention_forward(x, x, x, m, block_size=2),
        "layer": lambda m: MultiHeadAttention(4, 2, seed=0)(x, mask=m),
        "encoder block": lambda m: TransformerEncoderBlock(4, 2, seed=0)(x, m),
        "decoder block, mask": lambda m: decoder_block_forward(x, x, decoder, 2, mask=m),
        "decoder block, memory_mask": lambda m: decoder_block_forward(x, x, decoder, 2, memory_mask=m),
    }


FLOAT_MASK_CALLS = _float_mask_calls()


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("case", FLOAT_MASK_CALLS)
def test_float_mask_of_zeros_and_ones_warns_once_naming_the_fix(case, dtype):
    name = "memory_mask" if "memory_mask" in case else "mask"
    with pytest.warns(UserWarning, match=rf"{name} is a float mask of 0s and 1s.*{name}\.astype\(bool\)") as record:
        FLOAT_MASK_CALLS[case](causal_mask(3).astype(dtype))
    assert len(record) == 1, [str(w.message) for w in record]
    if "MUTANT_UNDER_TEST" not in os.environ:  # mutmut's trampoline adds a frame (docs/development.md)
        assert record[0].filename == __file__  # points at the caller's line, not into the library


@pytest.mark.parametrize("mask", [
    np.where(causal_mask(3), 0.0, -np.inf),  # the usual additive mask
    np.where(causal_mask(3), 0.0, -1e9),  # 0 and a large negative number
    np.zeros((3, 3)),  # all zero: adds nothing, and says so
    np.full((3, 3), 0.5),  # a bias, not 0/1
    np.where(causal_mask(3), 1.0, -np.inf),  # 1 and -inf: an additive mask with a shift
], ids=["0,-inf", "0,-1e9", "zeros", "0.5", "1,-inf"])
@pytest.mark.parametrize("case", FLOAT_MASK_CALLS)
def test_additive_float_masks_are_silent(case, mask):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        FLOAT_MASK_CALLS[case](mask)


def test_the_warning_is_about_a_real_mistake():
    """causal_mask(n).astype(float) lets the future through; astype(bool) does not."""
    x = np.random.default_rng(1).standard_normal((3, 4))
    with pytest.warns(UserWarning):
        _, wrong = sdpa_forward(x, x, x, causal_mask(3).astype(float))
    _, right = sdpa_forward(x, x, x, causal_mask(3).astype(float).astype(bool))
    assert wrong.weights[0, 2] > 0 and right.weights[0, 2] == 0


def test_combine_with_causal_keeps_both_rules():
    from attention_ref.core.masks import combine_with_causal

    np.testing.assert_array_equal(combine_with_causal(None, 3), causal_mask(3))
    pad = np.array([True, True, False])
    np.testing.assert_array_equal(combine_with_causal(pad, 3), causal_mask(3) & pad)
    bias = np.full((3, 3), 0.5)
    combined = combine_with_causal(bias, 3)
    assert combined.dtype == bias.dtype
    np.testing.assert_array_equal(combined, np.where(causal_mask(3), 0.5, -np.inf))
