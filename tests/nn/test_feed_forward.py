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


def test_exact_gelu_matches_the_erf_formula_and_its_derivative():
    h = np.concatenate([np.linspace(-12, 12, 2401), [0.0, 1e-300, -1e-300, 40.0, -40.0]])
    exact = np.array([v * 0.5 * (1.0 + math.erf(v / math.sqrt(2.0))) for v in h])
    ours, cache = gelu_forward(h, approximate="none")
    assert cache.approximate == "none"
    assert_close(ours, exact, rtol=1e-14, atol=1e-14, what="h Phi(h)")  # 1 + erf: absolute accuracy
    slope = np.array([0.5 * (1.0 + math.erf(v / math.sqrt(2.0))) + v * math.exp(-v * v / 2) / math.sqrt(2 * math.pi)
                      for v in h])
    assert_close(gelu_backward(np.ones_like(h), cache), slope, rtol=1e-14, atol=1e-14, what="Phi(h) + h phi(h)")


@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_gelu_gradcheck_both_forms(approximate):
    h = 3 * np.random.default_rng(7).standard_normal((4, 5))
    check_gradients(lambda h: gelu_forward(h, approximate=approximate), gelu_backward, h, names=["h"])


def test_gelu_default_is_tanh_and_a_bare_array_cache_still_works():
    h = np.linspace(-3, 3, 13)
    a, cache = gelu_forward(h)
    assert cache.approximate == "tanh" and cache.h is not None
    np.testing.assert_array_equal(gelu_backward(np.ones_like(h), cache), gelu_backward(np.ones_like(h), h))
    with pytest.raises(ValueError, match=r"^approximate must be one of \('tanh', 'none'\), got 'erf'$"):
        gelu_forward(h, approximate="erf")


def test_exact_gelu_in_the_feed_forward_network():
    rng = np.random.default_rng(8)
    p = {"W_1": rng.standard_normal((4, 6)), "b_1": rng.standard_normal(6),
         "W_2": rng.standard_normal((6, 4)), "b_2": rng.standard_normal(4)}
    x = rng.standard_normal((2, 3, 4))
    y, _ = feed_forward_forward(x, p, activation="gelu_exact")
    h = x @ p["W_1"] + p["b_1"]
    ref = np.vectorize(lambda v: v * 0.5 * (1.0 + math.erf(v / math.sqrt(2.0))))(h) @ p["W_2"] + p["b_2"]
    assert_close(y, ref, what="FFN with exact GELU")
    check_gradients(lambda x, p: feed_forward_forward(x, p, activation="gelu_exact"), feed_forward_backward, x, p)


def test_exact_gelu_keeps_float32():
    h = np.linspace(-5, 5, 11, dtype=np.float32)
    a, cache = gelu_forward(h, approximate="none")
    assert a.dtype == np.float32 and gelu_backward(np.ones(11), cache).dtype == np.float32


def test_exact_gelu_backward_reuses_the_forwards_erf(monkeypatch):
    """The exact GELU's backward takes Phi(h) from the cache: one erf per forward + backward
    (alone and inside the network, GPT-NeoX's MLP), the same gradients as computing it again."""
    import attention_ref.nn.feed_forward as ff

    calls = []
    real_erf = ff.erf
    monkeypatch.setattr(ff, "erf", lambda z: calls.append(z.shape) or real_erf(z))
    rng = np.random.default_rng(9)
    h = 2 * rng.standard_normal((3, 5))
    a, cache = gelu_forward(h, approximate="none")
    dh = gelu_backward(np.ones_like(h), cache)
    assert calls == [(3, 5)]
    np.testing.assert_array_equal(dh, gelu_backward(np.ones_like(h), cache._replace(Phi=None)))  # 2nd erf here
    p = {"W_1": rng.standard_normal((4, 6)), "W_2": rng.standard_normal((6, 4))}
    calls.clear()
    y, fcache = feed_forward_forward(rng.standard_normal((2, 4)), p, activation="gelu_exact")
    feed_forward_backward(np.ones_like(y), fcache)
    assert calls == [(2, 6)] and fcache.Phi.shape == (2, 6)


def test_tanh_gelu_backward_reuses_the_forwards_tanh(monkeypatch):
    """The tanh GELU's backward takes t = tanh(s (h + c h^3)) from the cache: one tanh per forward +
    backward (alone, in GPT-2's network and in BLOOM's), the same gradients as computing it again;
    a huge h saturates in both."""
    import attention_ref.nn.feed_forward as ff

    calls = []
    real_tanh = np.tanh
    monkeypatch.setattr(ff.np, "tanh", lambda z, **kw: calls.append(z.shape) or real_tanh(z, **kw))
    rng = np.random.default_rng(10)
    h = np.concatenate([2 * rng.standard_normal(13), [9.99, 10.0, 10.01, -12.0, 1e30, -1e30]])
    a, cache = gelu_forward(h)
    dh = gelu_backward(np.ones_like(h), cache)
    assert calls == [h.shape]
    u = np.clip(h, -10, 10)
    assert_close(cache.t, real_tanh(math.sqrt(2 / math.pi) * (u + 0.044715 * (u * u * u))), rtol=1e-15, atol=0,
                 what="the cached t")
    assert_close(dh, gelu_backward(np.ones_like(h), cache._replace(t=None)), rtol=1e-15, atol=0, what="dh, t again")
    p = {"W_1": rng.standard_normal((4, 6)), "W_2": rng.standard_normal((6, 4))}
    x = rng.standard_normal((2, 4))
    for activation in ("gelu", "gelu_bloom"):
        calls.clear()
        y, fcache = ff.feed_forward_formula(x, p["W_1"], None, p["W_2"], None, activation)
        dx, grads = ff.feed_forward_backward(np.ones_like(y), fcache)
        assert calls == [(2, 6)] and fcache.t.shape == (2, 6) and fcache.Phi is None, activation
        dx_again, grads_again = ff.feed_forward_backward(np.ones_like(y), fcache._replace(t=None))
        assert calls == [(2, 6), (2, 6)], activation  # the backward's own tanh only without the cached t
        assert_close(dx, dx_again, rtol=1e-14, atol=0, what=f"{activation}: dx, t again")
        assert_close(grads["W_1"], grads_again["W_1"], rtol=1e-14, atol=0, what=f"{activation}: dW_1, t again")
    check_gradients(lambda x, p: feed_forward_forward(x, p, activation="gelu"), feed_forward_backward, x, p)


def test_relu_and_exact_gelu_caches_hold_no_tanh():
    rng = np.random.default_rng(11)
    p = {"W_1": rng.standard_normal((4, 6)), "W_2": rng.standard_normal((6, 4))}
    x = rng.standard_normal((2, 4))
    assert feed_forward_forward(x, p, activation="relu")[1][5:] == (None, None)
    exact = feed_forward_forward(x, p, activation="gelu_exact")[1]
    assert exact.t is None and exact.Phi.shape == (2, 6)
    assert gelu_forward(x, approximate="none")[1].t is None


def test_bloom_gelu_backward_is_the_derivative_with_blooms_constant():
    """BLOOM's GELU writes s = 0.79788456: its forward and its backward (with the cached t and without it)
    are those of that constant, in closed form (float64), not GPT-2's sqrt(2 / pi)."""
    import attention_ref.nn.feed_forward as ff

    s, c = 0.79788456, 0.044715
    h = np.concatenate([np.linspace(-6, 6, 241), [-12.0, 12.0]])
    u = np.clip(h, -10, 10)
    t = np.tanh(s * (u + c * u ** 3))
    slope = 0.5 * (1 + t) + 0.5 * h * (1 - t * t) * s * (1 + 3 * c * u * u)
    a, t_cached = ff._gelu_bloom(h)
    assert_close(a, 0.5 * h * (1 + t), rtol=1e-14, atol=1e-15, what="BLOOM's gelu")
    da = np.random.default_rng(12).standard_normal(h.shape)
    for saved in (t_cached, None):
        assert_close(ff._gelu_bloom_backward(da, h, saved), da * slope, rtol=1e-13, atol=1e-15,
                     what=f"BLOOM's gelu' ({'cached' if saved is not None else 'no'} t)")
    with pytest.raises(AssertionError):  # GPT-2's constant is 8e-10 away: the check above tells them apart
        assert_close(gelu_backward(da, gelu_forward(h)[1]), da * slope, rtol=1e-13, atol=1e-15, what="GPT-2's")


def test_tanh_gelu_of_a_0d_input_and_a_broadcast_upstream():
    """A 0-d h gives NumPy scalars, as the exact form does; the unchecked backward broadcasts a wider da."""
    import attention_ref.nn.feed_forward as ff

    for approximate in ("tanh", "none"):
        a, cache = gelu_forward(np.float64(0.3), approximate=approximate)
        dh = gelu_backward(1.0, cache)
        assert type(a) is np.float64 and type(dh) is np.float64, approximate
    assert_close(a, 0.3 * 0.5 * (1 + math.erf(0.3 / math.sqrt(2))), what="exact gelu(0.3)")
    assert_close(gelu_forward(np.float64(0.3))[0], _gelu_scalar_tanh(0.3), what="gelu(0.3)")
    h = np.linspace(-1, 1, 5)
    dh = ff.gelu_backward_formula(np.ones((2, 5)), h)
    assert dh.shape == (2, 5)
    np.testing.assert_array_equal(dh[0], ff.gelu_backward_formula(np.ones(5), h))
