"""softmax_forward / softmax_backward."""
import numpy as np
import pytest

from attention_ref import gradcheck, softmax_backward, softmax_forward
from _helpers import assert_close, check_gradients
from _reference import loop_softmax


@pytest.mark.parametrize("shape, axis", [((5,), -1), ((3, 4), -1), ((3, 4), 0), ((2, 3, 4), 1)])
def test_forward_matches_loop(shape, axis):
    x = np.random.default_rng(0).standard_normal(shape) * 3
    y, _ = softmax_forward(x, axis=axis)
    assert_close(y, loop_softmax(x, axis=axis), what="softmax")
    assert_close(y.sum(axis=axis), np.ones(y.sum(axis=axis).shape), what="row sums")


@pytest.mark.parametrize("shape, axis", [((5,), -1), ((3, 4), -1), ((3, 4), 0), ((2, 3, 4), 1)])
def test_backward_gradcheck(shape, axis):
    x = np.random.default_rng(1).standard_normal(shape)
    check_gradients(lambda x: softmax_forward(x, axis=axis), softmax_backward, x, names=["x"])


def test_shift_invariance_and_large_inputs():
    x = np.random.default_rng(2).standard_normal((4, 6))
    y, _ = softmax_forward(x)
    y_shift, _ = softmax_forward(x + 1000.0)
    y_big, _ = softmax_forward(x * 1e4)  # would overflow exp without the max subtraction
    assert_close(y_shift, y, rtol=1e-9, atol=1e-12, what="shift invariance")
    assert np.isfinite(y_big).all()
    assert_close(y_big.sum(-1), np.ones(4), what="rows of large inputs")


def test_neg_inf_entries_and_all_neg_inf_row():
    x = np.array([[0.0, -np.inf, 1.0], [-np.inf, -np.inf, -np.inf]])
    y, cache = softmax_forward(x)
    assert y[0, 1] == 0.0 and y[1].tolist() == [0.0, 0.0, 0.0]
    assert_close(y[0], loop_softmax(x)[0])
    dx = softmax_backward(np.ones_like(x) * np.array([1.0, 2.0, 3.0]), cache)
    assert dx[1].tolist() == [0.0, 0.0, 0.0] and dx[0, 1] == 0.0
    assert np.isfinite(dx).all()


def test_float32_stays_float32():
    x = np.random.default_rng(3).standard_normal((3, 5)).astype(np.float32)
    y, cache = softmax_forward(x)
    assert y.dtype == np.float32 and softmax_backward(np.ones_like(y), cache).dtype == np.float32


def test_input_not_modified():
    x = np.random.default_rng(4).standard_normal((3, 5))
    before = x.copy()
    y, cache = softmax_forward(x)
    softmax_backward(np.ones_like(y), cache)
    np.testing.assert_array_equal(x, before)


def test_diagonal_only_backward_is_caught():
    """The classic bug: keeping only the Jacobian's diagonal, dx = dy * y * (1 - y)."""
    def wrong_backward(dy, cache):
        return dy * cache.y * (1 - cache.y)

    x = np.random.default_rng(5).standard_normal((3, 4))
    assert not gradcheck(softmax_forward, wrong_backward, x).ok


@pytest.mark.parametrize("x, axis, error, word", [
    (np.array([1.0, np.nan]), -1, ValueError, "NaN"),
    (np.array([1.0, np.inf]), -1, ValueError, "infinity"),
    (np.array(["a"]), -1, TypeError, "^x must hold real numbers"),
    (np.ones((2, 3)), 2, ValueError, "axis"),
    (np.ones((2, 3)), 1.5, TypeError, "axis"),
    (np.float64(1.0), -1, ValueError, "^x must have at least one axis, got a scalar$"),
])
def test_bad_input(x, axis, error, word):
    with pytest.raises(error, match=word):
        softmax_forward(x, axis=axis)

@pytest.mark.parametrize("dy, error, message", [
    (np.ones((2, 4)), ValueError, r"^dy must have shape \(3, 4\)"),
    (np.ones((3, 4), dtype=bool), TypeError, "^dy must hold real numbers"),
    (np.full((3, 4), np.nan), ValueError, "^dy contains NaN"),
])
def test_bad_upstream_gradient_is_named(dy, error, message):
    _, cache = softmax_forward(np.zeros((3, 4)))
    with pytest.raises(error, match=message):
        softmax_backward(dy, cache)


def test_extreme_range_row_gives_one_hot_without_warning():
    """x - max underflows to -inf for a row spanning the whole float64 range: weight 0, silently."""
    x = np.array([[-1.7e308, 1.7e308, 0.0]])
    with np.errstate(over="raise", invalid="raise", divide="raise"):  # underflow in exp is fine
        y, _ = softmax_forward(x)
    np.testing.assert_array_equal(y, [[0.0, 1.0, 0.0]])
