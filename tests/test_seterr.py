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
    assert np.all(np.isfinite(out))
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
