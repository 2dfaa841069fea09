"""split_heads / merge_heads: inverse and transpose of each other."""
import numpy as np
import pytest

from attention_ref import gradcheck, merge_heads, merge_heads_backward, split_heads, split_heads_backward


def test_split_matches_column_blocks():
    x = np.random.default_rng(0).standard_normal((2, 5, 6))
    heads = split_heads(x, 3)
    assert heads.shape == (2, 3, 5, 2)
    for i in range(3):
        np.testing.assert_array_equal(heads[:, i], x[..., 2 * i:2 * i + 2])


@pytest.mark.parametrize("shape, h", [((5, 6), 3), ((2, 5, 6), 2), ((2, 3, 4, 8), 4), ((4, 3), 1)])
def test_merge_inverts_split(shape, h):
    x = np.random.default_rng(1).standard_normal(shape)
    np.testing.assert_array_equal(merge_heads(split_heads(x, h)), x)


def test_split_and_merge_are_each_others_transpose():
    """<split(x), y> == <x, merge(y)> for all x, y: the adjoint of a split is a merge."""
    rng = np.random.default_rng(2)
    x, y = rng.standard_normal((2, 5, 6)), rng.standard_normal((2, 3, 5, 2))
    assert np.isclose(np.sum(split_heads(x, 3) * y), np.sum(x * merge_heads(y)), rtol=1e-13)


def test_backwards_pass_gradcheck():
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((2, 5, 6)), rng.standard_normal((2, 3, 5, 2))
    assert gradcheck(lambda x: (split_heads(x, 3), None), lambda d, _: split_heads_backward(d), x).ok
    assert gradcheck(lambda y: (merge_heads(y), None), lambda d, _: merge_heads_backward(d, 3), y).ok


def test_bad_input():
    with pytest.raises(ValueError, match="not divisible by num_heads=4"):
        split_heads(np.ones((3, 6)), 4)
    with pytest.raises(ValueError, match=r"\(6,\)"):
        split_heads(np.ones(6), 2)
    with pytest.raises(ValueError, match="num_heads"):
        split_heads(np.ones((3, 6)), 0)
    with pytest.raises(TypeError, match="num_heads"):
        split_heads(np.ones((3, 6)), 2.0)
    with pytest.raises(ValueError, match=r"\(3, 6\)"):
        merge_heads(np.ones((3, 6)))


@pytest.mark.parametrize("call, error, message", [
    (lambda: split_heads(np.array(["a", "b"]).reshape(1, 2), 1), TypeError, "x must hold real numbers, got dtype <U1"),
    (lambda: merge_heads(np.ones((1, 2, 2), dtype=complex)), TypeError, "x must hold real numbers, got dtype complex128"),
    (lambda: split_heads(np.ones((3, 6)), 0), ValueError, "num_heads must be a positive integer, got 0"),
    (lambda: merge_heads_backward(np.ones((3, 6)), 0), ValueError, "num_heads must be a positive integer, got 0"),
    (lambda: split_heads_backward(np.ones((3, 6))), ValueError,
     "dheads must have shape (..., num_heads, n, d_head), got shape (3, 6)"),
    (lambda: split_heads_backward(np.full((1, 2, 2), np.nan)), ValueError, "dheads contains NaN"),
    (lambda: merge_heads_backward(np.ones(6), 2), ValueError,
     "dmerged must have shape (..., n, num_heads * d_head) with num_heads=2, got shape (6,)"),
    (lambda: merge_heads_backward(np.ones((3, 6)), 4), ValueError,
     "dmerged must have shape (..., n, num_heads * d_head) with num_heads=4, got shape (3, 6)"),
    (lambda: merge_heads_backward(np.full((3, 6), np.inf), 2), ValueError, "dmerged contains infinity"),
])
def test_errors_name_the_argument_and_its_shape(call, error, message):
    with pytest.raises(error) as info:
        call()
    assert str(info.value).startswith(message), str(info.value)


def test_smallest_valid_ranks_and_integer_input():
    """Three axes are enough for a head gradient, two for a merged one; integers are numbers."""
    dheads = np.arange(12.0).reshape(2, 3, 2)  # (H, N, Dh)
    np.testing.assert_array_equal(split_heads_backward(dheads), merge_heads(dheads))
    dmerged = np.arange(12.0).reshape(3, 4)  # (N, H*Dh)
    np.testing.assert_array_equal(merge_heads_backward(dmerged, 2), split_heads(dmerged, 2))
    for dtype in (np.int64, np.uint8):
        np.testing.assert_array_equal(split_heads(np.arange(4, dtype=dtype).reshape(1, 4), 2), [[[0, 1]], [[2, 3]]])
