"""linear_forward / linear_backward: y = x W + b."""
import numpy as np
import pytest

from attention_ref import linear_backward, linear_forward
from _helpers import assert_close, check_gradients
from _reference import loop_linear

SHAPES = [(3,), (4, 3), (2, 4, 3), (2, 1, 5, 3)]


@pytest.mark.parametrize("x_shape", SHAPES)
@pytest.mark.parametrize("bias", [True, False])
def test_forward_matches_loop(x_shape, bias):
    rng = np.random.default_rng(1)
    x, W = rng.standard_normal(x_shape), rng.standard_normal((3, 2))
    b = rng.standard_normal(2) if bias else None
    y, _ = linear_forward(x, W, b)
    assert_close(y, loop_linear(x, W, b), what="linear forward")


@pytest.mark.parametrize("x_shape", SHAPES)
def test_backward_gradcheck_with_bias(x_shape):
    rng = np.random.default_rng(2)
    x, W, b = rng.standard_normal(x_shape), rng.standard_normal((3, 2)), rng.standard_normal(2)
    check_gradients(linear_forward, linear_backward, x, W, b, names=["x", "W", "b"])


def test_backward_without_bias_returns_none_db():
    rng = np.random.default_rng(3)
    x, W = rng.standard_normal((4, 3)), rng.standard_normal((3, 5))
    y, cache = linear_forward(x, W)
    dx, dW, db = linear_backward(np.ones_like(y), cache)
    assert db is None and dx.shape == x.shape and dW.shape == W.shape
    check_gradients(linear_forward, linear_backward, x, W, names=["x", "W"])


def test_dtypes():
    rng = np.random.default_rng(4)
    x32, W32 = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal((3, 2)).astype(np.float32)
    y, cache = linear_forward(x32, W32, np.zeros(2, np.float32))
    assert y.dtype == np.float32
    assert all(g.dtype == np.float32 for g in linear_backward(np.ones_like(y), cache))
    y_int, _ = linear_forward(np.arange(6).reshape(2, 3), np.ones((3, 2), dtype=int))
    assert y_int.dtype == np.float64 and y_int.tolist() == [[3.0, 3.0], [12.0, 12.0]]


def test_inputs_not_modified():
    rng = np.random.default_rng(5)
    x, W, b = rng.standard_normal((4, 3)), rng.standard_normal((3, 2)), rng.standard_normal(2)
    copies = [a.copy() for a in (x, W, b)]
    y, cache = linear_forward(x, W, b)
    linear_backward(np.ones_like(y), cache)
    for a, c in zip((x, W, b), copies):
        np.testing.assert_array_equal(a, c)


@pytest.mark.parametrize("args, error, words", [
    ((np.ones((4, 3)), np.ones((2, 2))), ValueError, ["x", "(4, 3)", "W", "(2, 2)"]),
    ((np.ones((4, 3)), np.ones(3)), ValueError, ["W", "(d_in, d_out)"]),
    ((np.ones((4, 3)), np.ones((3, 2)), np.ones(3)), ValueError, ["b", "(2,)"]),
    ((np.ones((4, 3)), np.ones((3, 2)), np.ones((1, 2))), ValueError, ["b"]),
    ((np.array([["a", "b", "c"]]), np.ones((3, 2))), TypeError, ["x"]),
    ((np.ones((4, 3)) * 1j, np.ones((3, 2))), TypeError, ["x", "complex"]),
    ((np.ones((4, 3), dtype=bool), np.ones((3, 2))), TypeError, ["x", "boolean"]),
    ((np.full((4, 3), np.nan), np.ones((3, 2))), ValueError, ["x", "NaN"]),
    ((np.ones((4, 3)), np.full((3, 2), np.inf)), ValueError, ["W", "infinity"]),
])
def test_bad_input(args, error, words):
    with pytest.raises(error) as info:
        linear_forward(*args)
    for w in words:
        assert w in str(info.value)


def test_zero_input_width_has_zero_weight_gradient():
    """Din = 0: y = b, dW has shape (0, Dout); reshape(-1, 0) cannot infer the rows."""
    from attention_ref import linear_backward, linear_forward

    y, cache = linear_forward(np.ones((2, 5, 0)), np.ones((0, 3)), np.full(3, 0.5))
    assert (y == 0.5).all()
    dx, dW, db = linear_backward(np.ones_like(y), cache)
    assert dx.shape == (2, 5, 0) and dW.shape == (0, 3)
    np.testing.assert_array_equal(db, np.full(3, 10.0))


def test_zero_dimensional_input_is_rejected():
    with pytest.raises(ValueError, match=r"x must have shape \(\.\.\., d_in\) \(at least 1 axis\), got shape \(\)"):
        linear_forward(np.float64(1.0), np.ones((1, 2)))


def test_glorot_bound_is_sqrt_6_over_fan_in_plus_fan_out():
    from attention_ref import glorot_uniform

    W = glorot_uniform(np.random.default_rng(0), 20, 30)  # a = sqrt(6 / 50)
    a = np.sqrt(6 / 50)
    assert W.shape == (20, 30) and np.abs(W).max() <= a
    assert np.abs(W).max() > 0.98 * a  # 600 uniform draws reach the bound
    assert W.std() == pytest.approx(a / np.sqrt(3), rel=0.1)  # the variance of U(-a, a): a^2 / 3

def test_shape_mismatch_message_names_both_widths():
    with pytest.raises(ValueError) as info:
        linear_forward(np.ones((4, 3)), np.ones((2, 5)))
    assert str(info.value) == "x of shape (4, 3) has last dimension 3, but W of shape (2, 5) expects d_in = 2"


def test_bad_bias_and_upstream_gradient_are_named():
    with pytest.raises(TypeError, match="^b must hold real numbers"):
        linear_forward(np.ones((4, 3)), np.ones((3, 2)), np.array(["a", "b"]))
    _, cache = linear_forward(np.ones((4, 3)), np.ones((3, 2)))
    with pytest.raises(ValueError, match=r"^dy must have shape \(4, 2\) \(the forward output's\), got \(4, 3\)$"):
        linear_backward(np.ones((4, 3)), cache)


@pytest.mark.parametrize("wide", ["x", "W", "b"])
def test_one_float64_input_makes_the_product_float64(wide):
    rng = np.random.default_rng(10)
    arrays = {"x": rng.standard_normal((4, 3)), "W": rng.standard_normal((3, 2)), "b": rng.standard_normal(2)}
    args = {n: a if n == wide else a.astype(np.float32) for n, a in arrays.items()}
    y, cache = linear_forward(args["x"], args["W"], args["b"])
    assert y.dtype == cache.x.dtype == cache.W.dtype == np.float64
    dx, dW, db = linear_backward(np.ones_like(y), cache)
    assert dx.dtype == dW.dtype == db.dtype == np.float64
    assert_close(y, arrays["x"] @ arrays["W"] + arrays["b"], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("bias", [False, True])
def test_overflow_is_named_with_or_without_bias(bias):
    """Products of both signs overflow to +inf and -inf, whose sum is NaN: one clear error."""
    x = np.array([[1e200, 1e200]])
    W = np.array([[1e200], [-1e200]])
    b = np.ones(1) if bias else None
    what = "x W + b" if bias else "x W"
    sizes = "largest |x| = 1e+200, largest |W| = 1e+200" + (", largest |b| = 1" if bias else "")
    with np.errstate(all="raise"), pytest.raises(FloatingPointError) as info:
        linear_forward(x, W, b)
    assert str(info.value) == (f"overflow in {what}: the result exceeds the largest finite float64, 1.798e+308"
                               f" ({sizes}); scale the inputs down")


def test_shape_mismatch_message_of_a_batched_input():
    with pytest.raises(ValueError) as info:
        linear_forward(np.ones((2, 4, 3)), np.ones((2, 5)))
    assert str(info.value) == "x of shape (2, 4, 3) has last dimension 3, but W of shape (2, 5) expects d_in = 2"


def test_float32_overflow_names_float32():
    x, W = np.full((1, 1), 1e20, np.float32), np.full((1, 2), 1e20, np.float32)
    with np.errstate(all="raise"), pytest.raises(FloatingPointError) as info:
        linear_forward(x, W)
    assert str(info.value) == ("overflow in x W: the result exceeds the largest finite float32, 3.403e+38"
                               " (largest |x| = 1e+20, largest |W| = 1e+20); scale the inputs down or compute in float64")
