"""Layer norm: forward against a plain loop, backward against finite differences, input checks."""
import numpy as np
import pytest

from attention_ref import layer_norm_backward, layer_norm_forward
from tests._helpers import assert_close, check_gradients


def _layer_norm_loop(x, gamma, beta, eps):
    """Straight from the formula, one row at a time."""
    x = np.asarray(x, dtype=np.float64)
    rows = x.reshape(-1, x.shape[-1])
    out = np.empty_like(rows)
    d = rows.shape[1]
    for r in range(rows.shape[0]):
        mu = sum(rows[r]) / d
        var = sum((v - mu) ** 2 for v in rows[r]) / d
        for j in range(d):
            out[r, j] = gamma[j] * (rows[r, j] - mu) / np.sqrt(var + eps) + beta[j]
    return out.reshape(x.shape)


SHAPES = [(5,), (3, 4), (2, 3, 6), (2, 1, 3, 5)]


@pytest.mark.parametrize("shape", SHAPES)
def test_forward_matches_loop(shape):
    rng = np.random.default_rng(0)
    x = 3.0 * rng.standard_normal(shape) + 1.0
    gamma, beta = rng.standard_normal(shape[-1]), rng.standard_normal(shape[-1])
    y, _ = layer_norm_forward(x, gamma, beta, eps=1e-3)
    assert_close(y, _layer_norm_loop(x, gamma, beta, 1e-3), what="layer_norm_forward")


def test_normalised_rows_have_zero_mean_unit_variance():
    x = np.random.default_rng(1).standard_normal((4, 7)) * 5 + 2
    y, _ = layer_norm_forward(x, np.ones(7), np.zeros(7), eps=0.0 + 1e-12)
    assert_close(y.mean(axis=-1), np.zeros(4), atol=1e-12, what="row means")
    assert_close(y.var(axis=-1), np.ones(4), atol=1e-9, what="row variances")


@pytest.mark.parametrize("shape", SHAPES)
def test_backward_gradcheck(shape):
    rng = np.random.default_rng(2)
    x = rng.standard_normal(shape)
    gamma, beta = rng.standard_normal(shape[-1]), rng.standard_normal(shape[-1])
    check_gradients(lambda x, g, b: layer_norm_forward(x, g, b), layer_norm_backward,
                    x, gamma, beta, names=["x", "gamma", "beta"])


def test_dx_is_orthogonal_to_shift_and_scale():
    # shifting a row or (with eps -> 0) scaling it about its mean does not change y, so dx
    # has zero row mean and zero dot product with x_hat
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 6))
    y, cache = layer_norm_forward(x, rng.standard_normal(6), rng.standard_normal(6), eps=1e-14)
    dx, _, _ = layer_norm_backward(rng.standard_normal(y.shape), cache)
    assert_close(dx.sum(axis=-1), np.zeros(3), atol=1e-12, what="row sums of dx")
    assert_close((dx * cache.x_hat).sum(axis=-1), np.zeros(3), atol=1e-12, what="dx . x_hat")


def test_eps_is_used():
    x = np.array([[0.0, 1e-3]])  # variance 2.5e-7, comparable to eps
    y_small, _ = layer_norm_forward(x, np.ones(2), np.zeros(2), eps=1e-12)
    y_big, _ = layer_norm_forward(x, np.ones(2), np.zeros(2), eps=1e-5)
    assert_close(y_small, _layer_norm_loop(x, np.ones(2), np.zeros(2), 1e-12), rtol=1e-9, what="small eps")
    assert_close(y_big, _layer_norm_loop(x, np.ones(2), np.zeros(2), 1e-5), what="default eps")
    assert abs(y_big[0, 1]) < 0.2 < abs(y_small[0, 1])


def test_float32_stays_float32():
    x = np.random.default_rng(4).standard_normal((2, 5)).astype(np.float32)
    g, b = np.ones(5, np.float32), np.zeros(5, np.float32)
    y, cache = layer_norm_forward(x, g, b)
    dx, dg, db = layer_norm_backward(np.ones_like(y), cache)
    assert {a.dtype for a in (y, dx, dg, db)} == {np.dtype(np.float32)}
    assert_close(y, _layer_norm_loop(x, g, b, 1e-5), rtol=1e-5, atol=1e-5, what="float32")


def test_inputs_not_modified():
    rng = np.random.default_rng(5)
    x, g, b = rng.standard_normal((3, 4)), rng.standard_normal(4), rng.standard_normal(4)
    copies = [a.copy() for a in (x, g, b)]
    y, cache = layer_norm_forward(x, g, b)
    dy = rng.standard_normal(y.shape)
    dy_copy = dy.copy()
    layer_norm_backward(dy, cache)
    for a, c in zip((x, g, b, dy), copies + [dy_copy]):
        np.testing.assert_array_equal(a, c)


def test_bad_inputs():
    x = np.zeros((2, 4))
    with pytest.raises(ValueError, match=r"gamma must have shape \(4,\).*\(2, 4\)"):
        layer_norm_forward(x, np.ones(3), np.zeros(4))
    with pytest.raises(ValueError, match=r"beta must have shape \(4,\)"):
        layer_norm_forward(x, np.ones(4), np.zeros((1, 4)))
    with pytest.raises(ValueError, match="eps must be a positive"):
        layer_norm_forward(x, np.ones(4), np.zeros(4), eps=0.0)
    with pytest.raises(TypeError, match="eps"):
        layer_norm_forward(x, np.ones(4), np.zeros(4), eps="small")
    with pytest.raises(TypeError, match="x must hold real numbers"):
        layer_norm_forward(np.zeros((2, 4), bool), np.ones(4), np.zeros(4))
    with pytest.raises(ValueError, match="x contains NaN"):
        layer_norm_forward(np.full((2, 4), np.nan), np.ones(4), np.zeros(4))
    _, cache = layer_norm_forward(x + np.arange(4), np.ones(4), np.zeros(4))
    with pytest.raises(ValueError, match=r"dy must have shape \(2, 4\) \(the forward output's\)"):
        layer_norm_backward(np.zeros((4, 2)), cache)


def test_zero_width_is_a_value_error():
    # an empty last axis has no mean: ValueError, not NumPy's "Mean of empty slice" warning
    for shape in ((3, 0), (0,), (2, 1, 0)):
        with pytest.raises(ValueError, match=r"x must have a non-empty last axis.*got shape"):
            layer_norm_forward(np.zeros(shape), np.ones(0), np.zeros(0))


@pytest.mark.parametrize("dtype, big", [(np.float32, 1e20), (np.float64, 1e160)])
def test_rows_whose_variance_overflows_are_normalised(dtype, big):
    """(x - mu)^2 overflows, x_hat does not: LN_eps(c x) = LN_{eps / c^2}(x) and
    rstd(c x) = rstd_{eps / c^2}(x) / c, computed here on the small row in float64."""
    import warnings

    from attention_ref import layer_norm_backward, layer_norm_forward

    small = np.array([[1.0, -1.0, 3.0], [2.0, 2.0, 2.5]])
    x = (small * big).astype(dtype)
    x = np.concatenate([x, np.array([[1.0, 2.0, 4.0]], dtype)])  # an ordinary row beside them
    gamma, beta = np.ones(3, dtype), np.zeros(3, dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y, cache = layer_norm_forward(x, gamma, beta)
        dx, _, _ = layer_norm_backward(np.ones_like(y), cache)
    eps_small = max(1e-5 / big / big, 1e-300)  # 1e-325 would underflow to 0; both negligible
    ref_small, ref_cache = layer_norm_forward(small, np.ones(3), np.zeros(3), eps=eps_small)
    ref_plain, plain_cache = layer_norm_forward(np.array([[1.0, 2.0, 4.0]]), np.ones(3), np.zeros(3))
    tol = 1e-6 if dtype == np.float32 else 1e-12
    assert y.dtype == dtype and np.isfinite(y).all() and np.isfinite(dx).all()
    np.testing.assert_allclose(y[:2], ref_small, rtol=tol, atol=tol)
    np.testing.assert_allclose(cache.rstd[:2] * big, ref_cache.rstd, rtol=tol)
    np.testing.assert_allclose(y[2:], ref_plain, rtol=tol)  # the ordinary row is untouched
    # the same rows as a (3, 1, 3) batch: statistics over the last axis only, rows apart
    y3, cache3 = layer_norm_forward(x.reshape(3, 1, 3), gamma, beta)
    assert y3.dtype == cache3.x_hat.dtype == cache3.rstd.dtype == dtype
    np.testing.assert_array_equal(y3, y.reshape(3, 1, 3))
    np.testing.assert_array_equal(cache3.rstd, cache.rstd.reshape(3, 1, 1))


def test_a_constant_row_too_large_to_average_normalises_to_zero():
    from attention_ref import layer_norm_forward

    x = np.full((1, 3), 3e38, np.float32)  # the row sum overflows; x - mu is 0
    y, cache = layer_norm_forward(x, np.ones(3, np.float32), np.zeros(3, np.float32))
    assert not y.any() and np.isclose(cache.rstd[0, 0], 1 / np.sqrt(1e-5))


def test_zero_dimensional_input_is_rejected():
    with pytest.raises(ValueError, match=r"x must have shape \(\.\.\., d\) \(at least 1 axis\), got shape \(\)"):
        layer_norm_forward(np.float64(1.0), np.ones(1), np.zeros(1))


@pytest.mark.parametrize("wide", ["x", "gamma", "beta"])
def test_one_float64_input_makes_the_layer_float64(wide):
    rng = np.random.default_rng(11)
    arrays = {"x": rng.standard_normal((2, 4)), "gamma": rng.standard_normal(4), "beta": rng.standard_normal(4)}
    args = {n: a if n == wide else a.astype(np.float32) for n, a in arrays.items()}
    y, cache = layer_norm_forward(args["x"], args["gamma"], args["beta"])
    assert y.dtype == cache.x_hat.dtype == cache.gamma.dtype == np.float64
    ref, _ = layer_norm_forward(*(args[n].astype(np.float64) for n in ("x", "gamma", "beta")))
    np.testing.assert_allclose(y, ref, rtol=1e-12)


@pytest.mark.parametrize("name", ["gamma", "beta"])
def test_bad_gain_or_shift_is_named(name):
    args = {"x": np.zeros((2, 4)), "gamma": np.ones(4), "beta": np.zeros(4)}
    args[name] = np.full(4, np.nan)
    with pytest.raises(ValueError, match=f"^{name} contains NaN"):
        layer_norm_forward(args["x"], args["gamma"], args["beta"])
    args[name] = np.array(["a"] * 4)
    with pytest.raises(TypeError, match=f"^{name} must hold real numbers"):
        layer_norm_forward(args["x"], args["gamma"], args["beta"])
