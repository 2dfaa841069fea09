"""Position-wise feed-forward network and its activations."""
import math

import numpy as np
import pytest

from attention_ref import feed_forward_backward, feed_forward_forward, gelu_backward, gelu_forward, relu_forward
from tests._helpers import assert_close, check_gradients


def _gelu_scalar_tanh(h):
    return 0.5 * h * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * h ** 3)))


def _ffn_loop(x, p, activation):
    """One position and one output unit at a time, from the formula."""
    act = (lambda h: max(h, 0.0)) if activation == "relu" else _gelu_scalar_tanh
    rows = x.reshape(-1, x.shape[-1])
    d_ff, d_out = p["W_1"].shape[1], p["W_2"].shape[1]
    out = np.empty((rows.shape[0], d_out))
    for r in range(rows.shape[0]):
        hidden = [act(sum(rows[r, i] * p["W_1"][i, f] for i in range(rows.shape[1])) + p["b_1"][f])
                  for f in range(d_ff)]
        for o in range(d_out):
            out[r, o] = sum(hidden[f] * p["W_2"][f, o] for f in range(d_ff)) + p["b_2"][o]
    return out.reshape(x.shape[:-1] + (d_out,))


def _params(rng, d, f, d_out=None):
    d_out = d if d_out is None else d_out
    return {"W_1": rng.standard_normal((d, f)) / np.sqrt(d), "b_1": 0.1 * rng.standard_normal(f),
            "W_2": rng.standard_normal((f, d_out)) / np.sqrt(f), "b_2": 0.1 * rng.standard_normal(d_out)}


CASES = [((4,), 4, 7, None), ((3, 4), 4, 8, 3), ((2, 3, 5), 5, 6, None)]


@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("shape,d,f,d_out", CASES)
def test_forward_matches_loop(activation, shape, d, f, d_out):
    rng = np.random.default_rng(0)
    x, p = rng.standard_normal(shape), _params(rng, d, f, d_out)
    y, _ = feed_forward_forward(x, p, activation)
    assert_close(y, _ffn_loop(x, p, activation), what=f"ffn ({activation})")


@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("shape,d,f,d_out", CASES)
def test_backward_gradcheck(activation, shape, d, f, d_out):
    rng = np.random.default_rng(1)
    x, p = rng.standard_normal(shape), _params(rng, d, f, d_out)
    check_gradients(lambda x, p: feed_forward_forward(x, p, activation), feed_forward_backward,
                    x, p, names=["x", "params"])


def test_without_biases_gradcheck():
    rng = np.random.default_rng(2)
    p = _params(rng, 4, 6)
    p = {"W_1": p["W_1"], "W_2": p["W_2"]}
    y, cache = feed_forward_forward(rng.standard_normal((3, 4)), p)
    _, grads = feed_forward_backward(np.ones_like(y), cache)
    assert set(grads) == {"W_1", "W_2"}
    check_gradients(feed_forward_forward, feed_forward_backward, rng.standard_normal((3, 4)), p)


def test_gelu_is_close_to_exact_erf_form():
    h = np.linspace(-6, 6, 241)
    exact = np.array([v * 0.5 * (1.0 + math.erf(v / math.sqrt(2.0))) for v in h])
    ours, _ = gelu_forward(h)
    assert np.max(np.abs(ours - exact)) < 1e-3
    assert_close(ours, np.array([_gelu_scalar_tanh(v) for v in h]), what="gelu tanh form")


def test_relu_values():
    a, _ = relu_forward(np.array([-2.0, 0.0, 3.0]))
    np.testing.assert_array_equal(a, [0.0, 0.0, 3.0])


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_float32_stays_float32(activation):
    rng = np.random.default_rng(3)
    p = {k: v.astype(np.float32) for k, v in _params(rng, 4, 5).items()}
    x = rng.standard_normal((2, 4)).astype(np.float32)
    y, cache = feed_forward_forward(x, p, activation)
    dx, grads = feed_forward_backward(np.ones_like(y), cache)
    assert y.dtype == dx.dtype == np.float32
    assert all(g.dtype == np.float32 for g in grads.values())


def test_bad_inputs():
    rng = np.random.default_rng(4)
    p = _params(rng, 4, 6)
    x = np.zeros((2, 4))
    with pytest.raises(ValueError, match="activation must be one of"):
        feed_forward_forward(x, p, "tanh")
    with pytest.raises(ValueError, match=r"x of shape \(2, 3\).*params\['W_1'\]"):
        feed_forward_forward(np.zeros((2, 3)), p)
    with pytest.raises(ValueError, match=r"params\['W_2'\] must have shape \(d_ff, d_out\) with d_ff = 6"):
        feed_forward_forward(x, {**p, "W_2": np.zeros((5, 4))})
    with pytest.raises(ValueError, match=r"params\['b_2'\] must have shape \(4,\)"):
        feed_forward_forward(x, {**p, "b_2": np.zeros(3)})
    with pytest.raises(ValueError, match="unknown keys"):
        feed_forward_forward(x, {**p, "W_3": np.zeros((4, 4))})
    with pytest.raises(ValueError, match="missing the weights"):
        feed_forward_forward(x, {"W_1": p["W_1"]})
    with pytest.raises(TypeError, match="x must hold real numbers"):
        feed_forward_forward(np.array([["a"] * 4]), p)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gelu_huge_inputs_saturate_without_warnings(dtype):
    # the cube of |h| > ~7e12 overflows float32; GELU must still be h for large positive h,
    # 0 for large negative h, with derivative 1 and 0, and no warning (warnings are errors here)
    big = np.array([1e4, 7e12, 1e13, 1e20, 3e38], dtype)
    h = np.concatenate([big, -big])
    a, cache = gelu_forward(h)
    assert a.dtype == dtype
    np.testing.assert_array_equal(a, np.concatenate([big, np.zeros_like(big)]))
    dh = gelu_backward(np.ones(h.shape), cache)  # a float64 upstream gradient
    assert dh.dtype == dtype
    np.testing.assert_array_equal(dh, np.concatenate([np.ones_like(big), np.zeros_like(big)]))
    # unchanged where the tanh is not yet saturated, including around the clipping point |h| = 10
    h = np.array([-10.5, -10.0, -9.5, -3.0, 0.5, 9.5, 10.0, 10.5])
    assert_close(gelu_forward(h)[0], np.array([_gelu_scalar_tanh(v) for v in h]), what="gelu near 10")
