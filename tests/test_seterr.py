"""The user's NumPy settings are theirs: under ``np.seterr(all="raise")`` every public forward and
backward works where an underflow is harmless (the exponential of a shifted score far below the
row maximum is 0, as it should be), and an overflow still raises the package's own named
``FloatingPointError``, never NumPy's bare "overflow encountered in ...". The settings are left
as they were. (``generate``'s sampling is tested with the models.)
"""
import re

import numpy as np
import pytest

import attention_ref as ar

from test_input_contract import BACKWARDS, OVERFLOW

SCALE = 400.0  # inputs of size ~400: scores of 1e5 and more, logits of hundreds, exp(score - max) far below the smallest float


class _Scaled:
    """A Generator whose normal draws are ``SCALE`` times larger: the same cases at extreme sizes."""

    def __init__(self, seed):
        self._rng = np.random.default_rng(seed)

    def standard_normal(self, *args, **kwargs):
        return SCALE * self._rng.standard_normal(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._rng, name)


@pytest.fixture(autouse=True)
def _raise_on_everything():
    before = np.geterr()
    np.seterr(all="raise")
    yield
    assert np.geterr() == {k: "raise" for k in before}, "a function changed the NumPy error settings"
    np.seterr(**before)


@pytest.mark.parametrize("case", sorted(BACKWARDS))
def test_every_public_pair_runs_on_extreme_inputs_under_seterr_raise(case):
    out, backward, _ = BACKWARDS[case](_Scaled(1))
    assert np.all(np.isfinite(out) | (out == -np.inf))  # -inf: a masked score (Transformer-XL's future keys)
    grads = backward(np.ones_like(out))
    leaves = grads.values() if isinstance(grads, dict) else grads if isinstance(grads, tuple) else (grads,)
    for g in leaves:
        for leaf in (g.values() if isinstance(g, dict) else (g,)):
            if leaf is not None:
                assert np.all(np.isfinite(leaf))


@pytest.mark.parametrize("dtype, low", [(np.float64, -800.0), (np.float32, -120.0)])
def test_softmax_of_a_score_far_below_the_maximum_is_zero(dtype, low):
    x = np.array([[low, 0.0, 1.0]], dtype)
    y, cache = ar.softmax_forward(x)
    assert y.dtype == dtype and y[0, 0] == 0
    np.testing.assert_allclose(y[0, 1:], np.exp([-1.0, 0.0]) / (1 + np.exp(-1.0)), rtol=1e-6)
    assert np.all(np.isfinite(ar.softmax_backward(np.ones_like(y), cache)))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_attention_with_scores_far_apart_under_seterr_raise(dtype):
    q = np.array([[30.0, 0.0], [-30.0, 0.0]], dtype)
    k = np.array([[30.0, 0.0], [-30.0, 0.0], [0.0, 1.0]], dtype)  # scores +-636 apart
    v = np.eye(3, 2, dtype=dtype)
    for forward in (ar.scaled_dot_product_attention_forward, ar.flash_attention_forward):
        out, _ = forward(q, k, v)
        np.testing.assert_allclose(out, [[1, 0], [0, 1]], atol=1e-6)
    out, _ = ar.linear_attention_forward(q, k, v)
    assert np.all(np.isfinite(out))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_overflow_keeps_its_named_error(dtype):
    big, largest = OVERFLOW[dtype]
    q = np.full((2, 4), big, dtype)
    with pytest.raises(FloatingPointError, match=re.escape(largest)) as e:
        ar.scaled_dot_product_attention_forward(q, q, q)
    assert "encountered" not in str(e.value)


@pytest.mark.parametrize("feature_map", ["elu", "softplus"])
def test_exact_gelu_and_linear_attention_features_far_out(feature_map):
    """Not shifted scores, but the same harmless underflow: a Gaussian tail, elu's exp far below 0."""
    h = np.linspace(-400.0, 400.0, 12).reshape(3, 4)
    a, cache = ar.gelu_forward(h, approximate="none")
    np.testing.assert_allclose(a[h > 0], h[h > 0])
    np.testing.assert_array_equal(a[h < -40], 0)
    assert np.all(np.isfinite(ar.gelu_backward(np.ones_like(a), cache)))
    out, cache = ar.linear_attention_forward(h, h, h, feature_map=feature_map)
    assert np.all(np.isfinite(out)) and np.all(np.isfinite(ar.linear_attention_backward(np.ones_like(out), cache)))


def _denormal_case(dtype):
    """Scores whose weights land in the subnormal range (e^-740 in float64, e^-100 in float32)."""
    low = -740.0 if dtype == np.float64 else -100.0
    q = np.array([[1.0, 0.0], [0.5, 0.0]], dtype)
    k = np.array([[low, 0.0], [0.0, 0.0], [low / 2, 1.0]], dtype) * np.sqrt(2.0).astype(dtype)
    return q, k, np.random.default_rng(0).standard_normal((3, 2)).astype(dtype)  # products with them inexact


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_subnormal_weights_forward_and_backward(dtype):
    """A weight of e^-740 is subnormal: products with it underflow, harmlessly, in every backward."""
    low = -740.0 if dtype == np.float64 else -100.0
    y, cache = ar.softmax_forward(np.array([[low, 0.0, low / 2]], dtype))
    assert 0 < y[0, 0] < np.finfo(dtype).tiny  # subnormal indeed
    assert np.all(np.isfinite(ar.softmax_backward(np.array([[0.3, 1.0, 2.0]], dtype), cache)))
    q, k, v = _denormal_case(dtype)
    dout = np.array([[0.3, -1.1], [2.3, 0.7]], dtype)
    for forward, backward in ((ar.scaled_dot_product_attention_forward, ar.scaled_dot_product_attention_backward),
                              (ar.flash_attention_forward, ar.flash_attention_backward)):
        out, cache = forward(q, k, v)
        assert all(np.all(np.isfinite(g)) for g in backward(dout, cache))
    big = np.zeros((64, 64, 3), dtype)  # the fast path's size: its in-place softmax and backward
    big[..., 0], big[..., 2] = low, low / 2
    for forward, backward in ((ar.softmax_forward, ar.softmax_backward),):
        y, cache = forward(big)
        assert np.all(np.isfinite(backward(np.ones_like(y), cache)))
    x = np.repeat(q[None], 64, axis=0)  # (64, 2, 2): large enough for the fast attention path
    out, cache = ar.scaled_dot_product_attention_forward(np.repeat(x, 64, axis=1), k, v)
    dout = np.random.default_rng(1).standard_normal(out.shape).astype(dtype)
    assert all(np.all(np.isfinite(g)) for g in ar.scaled_dot_product_attention_backward(dout, cache))
    loss, cache = ar.cross_entropy_forward(np.array([[low, 0.0, low / 2]] * 3, dtype), [1, 1, 1])
    assert np.all(np.isfinite(ar.cross_entropy_backward(1.0, cache)))


@pytest.mark.parametrize("dtype, low", [(np.float64, -740.0), (np.float32, -100.0)])
@pytest.mark.parametrize("path", ["core", "fast"])
def test_subnormal_weights_on_both_paths(dtype, low, path):
    """The reference and the fast path (BLAS products) with weights e^low, subnormal."""
    rng = np.random.default_rng(0)
    q = np.ones((2, 4, 8, 1), dtype)
    k = np.concatenate([np.full((2, 4, 8, 1), low, dtype), np.zeros((2, 4, 8, 1), dtype)], axis=2)
    v = rng.standard_normal((2, 4, 16, 3)).astype(dtype)
    forward, backward = {"core": (ar.core.scaled_dot_product_attention_forward,
                                  ar.core.scaled_dot_product_attention_backward),
                         "fast": (ar.fast.scaled_dot_product_attention_forward_fast,
                                  ar.fast.scaled_dot_product_attention_backward_fast)}[path]
    out, cache = forward(q, k, v, scale=1.0)
    assert 0 < cache.weights.min() < np.finfo(dtype).tiny
    grads = backward(rng.standard_normal(out.shape).astype(dtype), cache)
    assert all(np.all(np.isfinite(g)) for g in grads)


MULTI_HEAD = {"public": (ar.multi_head_attention_forward, ar.multi_head_attention_backward),
              "separate heads": (ar.multi_head_attention_separate_heads_forward,
                                 ar.multi_head_attention_separate_heads_backward),
              "core": (ar.core.multi_head_attention_forward, ar.core.multi_head_attention_backward),
              "fast": (ar.fast.multi_head_attention_forward_fast, ar.fast.multi_head_attention_backward_fast)}


@pytest.mark.parametrize("dtype, low", [(np.float64, -740.0), (np.float32, -100.0)])
@pytest.mark.parametrize("B, N", [(1, 3), (8, 64)])
@pytest.mark.parametrize("which", sorted(MULTI_HEAD))
def test_subnormal_weights_through_the_projections(dtype, low, B, N, which):
    """The tiny gradients past a subnormal weight reach the projections' backward: no underflow raised."""
    rng = np.random.default_rng(0)
    eye = np.eye(2, dtype=dtype)
    params = {"W_q": eye, "W_k": eye, "W_v": rng.standard_normal((2, 2)).astype(dtype),
              "W_o": rng.standard_normal((2, 2)).astype(dtype)}
    x = np.zeros((B, N, 2), dtype)
    x[..., 0] = np.sqrt(2.0)
    kv = np.zeros((B, N, 2), dtype)
    kv[:, ::2, 0] = low
    kv[..., 1] = rng.standard_normal((B, N))
    forward, backward = MULTI_HEAD[which]
    out, cache = forward(x, kv, kv, params, 1)
    grads = backward(rng.standard_normal(out.shape).astype(dtype), cache)
    leaves = [g for g in (grads.values() if isinstance(grads, dict) else grads) if g is not None]
    for g in leaves:
        for leaf in (g.values() if isinstance(g, dict) else (g,)):
            assert leaf is None or np.all(np.isfinite(leaf))
