"""causal_mask, padding_mask, mask_to_additive: True means "may attend"."""
import numpy as np
import pytest

from attention_ref import causal_mask, mask_to_additive, padding_mask


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
    (lambda: causal_mask(0), ValueError),
    (lambda: causal_mask(2.5), TypeError),
    (lambda: padding_mask([5], 4), ValueError),
    (lambda: padding_mask([-1], 4), ValueError),
    (lambda: padding_mask([1.5], 4), TypeError),
    (lambda: mask_to_additive(np.ones(3)), TypeError),
])
def test_bad_input(call, error):
    with pytest.raises(error):
        call()
