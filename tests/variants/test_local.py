"""local_window_mask: the band definition, checked entry by entry against its docstring."""
import numpy as np
import pytest

from attention_ref import causal_mask, local_window_mask


def loop_window_mask(n_q, n_k, window, causal):
    """The docstring's rule, one entry at a time: |p_i - j| <= window, p_i = i + n_k - n_q."""
    mask = np.zeros((n_q, n_k), dtype=bool)
    for i in range(n_q):
        p = i + n_k - n_q
        for j in range(n_k):
            mask[i, j] = abs(p - j) <= window and (not causal or j <= p)
    return mask


@pytest.mark.parametrize("n_q, n_k", [(1, 1), (6, 6), (4, 9), (7, 3)])
@pytest.mark.parametrize("window", [0, 1, 2, 10])
@pytest.mark.parametrize("causal", [False, True])
def test_matches_loop(n_q, n_k, window, causal):
    n_k_arg = None if n_k == n_q else n_k
    got = local_window_mask(n_q, window, n_k_arg, causal=causal)
    assert got.dtype == bool and got.shape == (n_q, n_k)
    np.testing.assert_array_equal(got, loop_window_mask(n_q, n_k, window, causal))


def test_small_hand_checked():
    expected = np.array([[1, 1, 0, 0],
                         [1, 1, 1, 0],
                         [0, 1, 1, 1],
                         [0, 0, 1, 1]], dtype=bool)
    np.testing.assert_array_equal(local_window_mask(4, 1), expected)
    np.testing.assert_array_equal(local_window_mask(4, 1, causal=True), np.tril(expected))


def test_row_counts_and_limits():
    n, w = 20, 3
    counts = local_window_mask(n, w).sum(axis=1)
    assert counts.max() == 2 * w + 1 and counts.min() == w + 1
    assert local_window_mask(n, w, causal=True).sum(axis=1).max() == w + 1
    # a window as long as the sequence is no restriction at all
    assert local_window_mask(n, n).all()
    np.testing.assert_array_equal(local_window_mask(n, n, causal=True), causal_mask(n))
    np.testing.assert_array_equal(local_window_mask(n, 0), np.eye(n, dtype=bool))


@pytest.mark.parametrize("window, exc", [(-1, ValueError), (1.5, TypeError), (True, TypeError), (None, TypeError)])
def test_bad_window(window, exc):
    with pytest.raises(exc, match="window"):
        local_window_mask(5, window)


def test_bad_n():
    with pytest.raises(ValueError, match="n must be a non-negative integer"):
        local_window_mask(-1, 2)
    with pytest.raises(ValueError, match="n_k"):
        local_window_mask(3, 2, -1)


def test_empty_lengths_give_empty_masks():
    """n = 0 (or n_k = 0) works like causal_mask: the forwards accept empty sequences."""
    assert local_window_mask(0, 2).shape == (0, 0) and local_window_mask(0, 2).dtype == bool
    assert local_window_mask(3, 2, 0).shape == (3, 0)
    assert local_window_mask(0, 1, 4, causal=True).shape == (0, 4)
