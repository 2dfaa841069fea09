"""Properties of attention and multi-head attention over random shapes, masks, scales and
dtypes (hypothesis), against the plain-loop references and finite differences.

Shapes include empty ones (no queries, no keys); masks include fully blocked rows; the
inputs' scale spans the dtype's range short of overflow. Warnings are errors (setup.cfg).
"""
from __future__ import annotations

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import attention_ref as ar  # noqa: E402
from _helpers import random_params  # noqa: E402
from _reference import loop_attention, loop_multi_head  # noqa: E402

DTYPES = st.sampled_from([np.float32, np.float64])
TOL = {np.float32: 2e-5, np.float64: 1e-12}


@st.composite
def attention_case(draw, max_n=5):
    """q, k, v (broadcast batch axes), a mask (None, boolean or additive) and the dtype."""
    batch = tuple(draw(st.lists(st.integers(1, 2), max_size=2)))
    n_q, n_k = draw(st.integers(0, max_n)), draw(st.integers(0, max_n))
    d_k, d_v = draw(st.integers(1, 4)), draw(st.integers(1, 3))
    dtype = draw(DTYPES)
    scale = 10.0 ** draw(st.integers(-3, 1))  # small to saturating scores
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    q = (scale * rng.standard_normal(batch + (n_q, d_k))).astype(dtype)
    k = (scale * rng.standard_normal((n_k, d_k))).astype(dtype)  # shared across the batch
    v = rng.standard_normal(batch + (n_k, d_v)).astype(dtype)
    kind = draw(st.sampled_from(["none", "bool", "additive"]))
    mask = None
    if kind != "none":
        keep = rng.random((n_q, n_k)) < draw(st.sampled_from([0.0, 0.5, 1.0]))  # 0.0: every row blocked
        mask = keep if kind == "bool" else np.where(keep, 0.0, -np.inf).astype(dtype)
    return q, k, v, mask, dtype


@given(attention_case())
def test_attention_forward_is_the_loop_formula(case):
    q, k, v, mask, dtype = case
    out, cache = ar.scaled_dot_product_attention_forward(q, k, v, mask)
    ref_out, ref_weights = loop_attention(q, k, v, mask)
    assert out.dtype == dtype and np.isfinite(out).all()
    tol = TOL[dtype]
    np.testing.assert_allclose(out, ref_out, rtol=tol, atol=tol)
    np.testing.assert_allclose(np.broadcast_to(cache.weights, ref_weights.shape), ref_weights, rtol=tol, atol=tol)


@given(attention_case(max_n=3))
def test_attention_backward_agrees_with_finite_differences(case):
    q, k, v, mask, _ = case
    q, k, v = (a.astype(np.float64) for a in (q, k, v))
    mask = None if mask is None else (mask if mask.dtype == bool else mask.astype(np.float64))
    report = ar.gradcheck(lambda q, k, v: ar.scaled_dot_product_attention_forward(q, k, v, mask),
                          ar.scaled_dot_product_attention_backward, q, k, v, atol=1e-7, rtol=1e-6)
    assert report.ok, str(report)


@given(st.integers(1, 3), st.integers(1, 2), st.integers(1, 3), st.booleans(), st.integers(0, 2**32 - 1))
def test_multi_head_forward_is_the_loop_formula(n_kv_heads, group, d_head, bias, seed):
    """Grouped-query attention (h = n_kv_heads * group), with or without biases."""
    rng = np.random.default_rng(seed)
    h = n_kv_heads * group
    d_model = 4
    params = random_params(rng, d_model, h, d_head, d_head, num_kv_heads=n_kv_heads, bias=bias)
    query, key = rng.standard_normal((2, 3, d_model)), rng.standard_normal((2, 4, d_model))
    out, _ = ar.multi_head_attention_forward(query, key, key, params, h, num_kv_heads=n_kv_heads)
    ref, _ = loop_multi_head(query, key, key, params, h, num_kv_heads=n_kv_heads)
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-12)


@given(st.integers(-300, 300), DTYPES, st.integers(0, 2**32 - 1))
def test_softmax_rows_sum_to_one_at_every_scale(exponent, dtype, seed):
    """Any finite scale the dtype holds: no overflow, no NaN, rows of weights summing to 1."""
    limit = int(np.log10(np.finfo(dtype).max)) - 1
    x = np.random.default_rng(seed).standard_normal((3, 5)) * 10.0 ** np.clip(exponent, -limit, limit)
    y, _ = ar.softmax_forward(x.astype(dtype))
    assert y.dtype == dtype and np.isfinite(y).all() and (y >= 0).all()
    np.testing.assert_allclose(y.sum(axis=-1), 1.0, rtol=TOL[dtype] * 10)
