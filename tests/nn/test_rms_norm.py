"""rms_norm_forward / rms_norm_backward: Llama's RMSNorm, from the formula and by finite differences."""
import numpy as np
import pytest

from attention_ref import rms_norm_backward, rms_norm_forward
from _helpers import assert_close, check_gradients

SHAPES = [(5,), (3, 5), (2, 3, 4), (2, 1, 3, 6)]


def loop_rms_norm(x, weight, eps):
    """Row by row: y_j = w_j x_j / sqrt((1/D) sum_l x_l^2 + eps)."""
    x = np.asarray(x, dtype=np.float64)
    out = np.empty_like(x)
    for idx in np.ndindex(x.shape[:-1]):
        row = x[idx]
        ms = sum(v * v for v in row) / len(row)
        out[idx] = [weight[j] * row[j] / np.sqrt(ms + eps) for j in range(len(row))]
    return out


@pytest.mark.parametrize("shape", SHAPES)
def test_forward_matches_loop(shape):
    rng = np.random.default_rng(0)
    x, w = 3 * rng.standard_normal(shape) + 1, rng.standard_normal(shape[-1])
    y, _ = rms_norm_forward(x, w, eps=1e-6)
    assert_close(y, loop_rms_norm(x, w, 1e-6), what="rms norm")


@pytest.mark.parametrize("shape", SHAPES)
def test_backward_gradcheck(shape):
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal(shape), rng.standard_normal(shape[-1])
    check_gradients(lambda x, w: rms_norm_forward(x, w, eps=1e-3), rms_norm_backward, x, w, names=["x", "weight"])


def test_eps_default_and_use():
    x, w = np.full((1, 4), 1e-3), np.ones(4)
    y_default, _ = rms_norm_forward(x, w)
    assert_close(y_default, x / np.sqrt(1e-6 + 1e-6), what="eps = 1e-6 by default")
    y_big, _ = rms_norm_forward(x, w, eps=1.0)
    assert_close(y_big, x / np.sqrt(1e-6 + 1.0), what="eps = 1")


def test_float32_stays_float32_and_inputs_untouched():
    rng = np.random.default_rng(2)
    x, w = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    before = x.copy(), w.copy()
    y, cache = rms_norm_forward(x, w)
    dx, dw = rms_norm_backward(np.ones((3, 4)), cache)
    assert y.dtype == dx.dtype == dw.dtype == np.float32
    np.testing.assert_array_equal(x, before[0])
    np.testing.assert_array_equal(w, before[1])


@pytest.mark.parametrize("dtype, big", [(np.float32, 1e20), (np.float64, 1e160)])
def test_rows_whose_squares_overflow_are_normalised(dtype, big):
    small = np.array([[1.0, -2.0, 3.0]])
    x = np.concatenate([(small * big).astype(dtype), small.astype(dtype)])  # an ordinary row beside it
    with np.errstate(all="raise"):
        y, _ = rms_norm_forward(x, np.ones(3, dtype))
    expected = small / np.sqrt((small ** 2).mean())
    tol = 1e-6 if dtype == np.float32 else 1e-12
    assert y.dtype == dtype
    np.testing.assert_allclose(y, np.concatenate([expected, loop_rms_norm(small, np.ones(3), 1e-6)]), rtol=tol)


@pytest.mark.parametrize("args, error, message", [
    ((np.ones((2, 3)), np.ones(4)), ValueError, r"^weight must have shape \(3,\) to match x of shape \(2, 3\), got shape \(4,\)$"),
    ((np.ones((2, 0)), np.ones(0)), ValueError, "^x must have a non-empty last axis"),
    ((np.float64(1.0), np.ones(1)), ValueError, r"^x must have shape \(\.\.\., d\)"),
    ((np.ones((2, 3)), np.ones(3), 0.0), ValueError, "^eps must be a positive real number, got 0.0$"),
    ((np.ones((2, 3)), np.ones(3), "small"), TypeError, "^eps must be a positive real number"),
    ((np.full((2, 3), np.nan), np.ones(3)), ValueError, "^x contains NaN"),
])
def test_bad_input(args, error, message):
    with pytest.raises(error, match=message):
        rms_norm_forward(*args)


def test_bad_upstream_gradient():
    _, cache = rms_norm_forward(np.ones((2, 3)), np.ones(3))
    with pytest.raises(ValueError, match=r"^dy must have shape \(2, 3\)"):
        rms_norm_backward(np.ones((3, 2)), cache)
