"""Blockwise attention equals the plain path for every causal / window / mask / tile
combination, forward and backward (hypothesis; see tests/conftest.py for the profiles)."""
from __future__ import annotations

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import attention_ref as ar  # noqa: E402


@given(st.integers(0, 6), st.integers(0, 3), st.integers(1, 4), st.booleans(),
       st.one_of(st.none(), st.integers(0, 3)), st.booleans(), st.integers(0, 2**32 - 1))
def test_blockwise_equals_plain(n_q, extra_keys, block, causal, window, masked, seed):
    rng = np.random.default_rng(seed)
    n_k = n_q + extra_keys  # causal needs n_q <= n_k: the queries are the last positions
    q, k, v = rng.standard_normal((2, n_q, 3)), rng.standard_normal((2, n_k, 3)), rng.standard_normal((2, n_k, 2))
    mask = rng.random((n_q, n_k)) < 0.7 if masked else None
    out, cache = ar.flash_attention_forward(q, k, v, mask, causal=causal, window=window, block_size=block)
    full = np.ones((n_q, n_k), bool) if mask is None else mask.copy()
    position = np.arange(n_q)[:, None] + (n_k - n_q)
    key = np.arange(n_k)[None, :]
    if causal:
        full &= key <= position
    if window is not None:
        full &= np.abs(position - key) <= window
    ref, ref_cache = ar.scaled_dot_product_attention_forward(q, k, v, full)
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-12)
    dout = rng.standard_normal(out.shape)
    for ours, theirs in zip(ar.flash_attention_backward(dout, cache), ar.scaled_dot_product_attention_backward(dout, ref_cache)):
        np.testing.assert_allclose(ours, theirs, rtol=1e-10, atol=1e-12)
