"""The cache-sized row blocks (``attention_ref/fast/row_blocks.py``) give the reference's numbers.

The row-blocked softmax and ``dS = P * (dP - D)`` only change WHICH rows a
NumPy call sees at once, never the arithmetic on a row, so the results must be bit-for-bit
those of the plain formula, and float32 must stay float32. Small arrays normally go in one
piece; ``tiny_blocks`` forces blocks of a few rows on test-sized arrays so the gradient
checks run through them too.
"""
from __future__ import annotations

import numpy as np
import pytest

import attention_ref as ar
from attention_ref import fast
from attention_ref.core.softmax import _softmax
from attention_ref.fast import row_blocks as _row_blocks
from attention_ref.fast.softmax import softmax_in_place

from _helpers import assert_close, check_gradients, random_params


@pytest.fixture
def tiny_blocks(monkeypatch):
    """Blocks of about 7 numbers, so test-sized arrays take the blocked path."""
    monkeypatch.setattr(_row_blocks, "BLOCK_ELEMENTS", 7)


def _loop_attention_fwd_bwd(q, k, v, dout):
    """Forward and backward straight from the formulas, a Python loop over the batch axes."""
    out = np.empty(q.shape[:-1] + (v.shape[-1],))
    dq, dk, dv = np.empty(q.shape), np.empty(k.shape), np.empty(v.shape)
    for idx in np.ndindex(q.shape[:-2]):
        s = q[idx] @ k[idx].T / np.sqrt(q.shape[-1])
        p = np.exp(s - s.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        out[idx] = p @ v[idx]
        dp = dout[idx] @ v[idx].T
        ds = p * (dp - (p * dp).sum(axis=1, keepdims=True))  # the textbook rowsum(P * dP)
        dq[idx] = ds @ k[idx] / np.sqrt(q.shape[-1])
        dk[idx] = ds.T @ q[idx] / np.sqrt(q.shape[-1])
        dv[idx] = p.T @ dout[idx]
    return out, dq, dk, dv


@pytest.mark.parametrize("n_rows, n_cols, block", [(10, 3, 7), (10, 3, 30), (0, 5, 7), (5, 0, 7), (1, 100, 7)])
def test_blocks_cover_every_row_once_in_order(monkeypatch, n_rows, n_cols, block):
    monkeypatch.setattr(_row_blocks, "BLOCK_ELEMENTS", block)
    seen = []
    _row_blocks.for_each_row_block(lambda start, stop: seen.append((start, stop)), n_rows, n_cols)
    assert seen[0][0] == 0 and seen[-1][1] == n_rows
    assert all(a[1] == b[0] for a, b in zip(seen, seen[1:]))  # contiguous, in order
    if n_rows * n_cols <= block:
        assert seen == [(0, n_rows)]  # small: one piece
    else:
        assert all(0 < (stop - start) * n_cols <= max(block, n_cols) for start, stop in seen)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_large_attention_matches_loop_reference(dtype):
    rng = np.random.default_rng(3)
    q = rng.standard_normal((2, 2, 300, 16)).astype(dtype)
    k = rng.standard_normal((2, 2, 500, 16)).astype(dtype)
    v = rng.standard_normal((2, 2, 500, 8)).astype(dtype)
    dout = rng.standard_normal((2, 2, 300, 8)).astype(dtype)
    out, cache = fast.scaled_dot_product_attention_forward_fast(q, k, v)
    grads = fast.scaled_dot_product_attention_backward_fast(dout, cache)
    assert cache.weights.size > _row_blocks.BLOCK_ELEMENTS  # the blocked path
    for a in (out, *grads):
        assert a.dtype == dtype, f"{a.dtype} is not {np.dtype(dtype)}"
    reference = _loop_attention_fwd_bwd(*(a.astype(np.float64) for a in (q, k, v, dout)))
    tol = 1e-12 if dtype == np.float64 else 2e-4
    for name, ours, ref in zip(("out", "dq", "dk", "dv"), (out, *grads), reference):
        assert_close(ours, ref, rtol=tol, atol=tol, what=name)


def test_blocked_softmax_is_bit_identical_at_any_block_size(monkeypatch):
    x = 3 * np.random.default_rng(4).standard_normal((4, 9, 11))
    expected = _softmax(x, -1)
    for block in (1, 7, 11, 50, 10_000):
        monkeypatch.setattr(_row_blocks, "BLOCK_ELEMENTS", block)
        got = softmax_in_place(x.copy())
        np.testing.assert_array_equal(got, expected)


def test_gradients_through_the_blocked_path(tiny_blocks):
    rng = np.random.default_rng(5)
    query = rng.standard_normal((2, 5, 6))
    key = rng.standard_normal((2, 7, 6))
    value = rng.standard_normal((2, 7, 4))
    p = random_params(rng, 6, 2, 3, 2, kdim=6, vdim=4)
    mask = rng.random((5, 7)) < 0.7
    mask[:, 0] = True

    def forward(query, key, value, W_q, b_q, W_k, b_k, W_v, b_v, W_o, b_o):
        params = dict(W_q=W_q, b_q=b_q, W_k=W_k, b_k=b_k, W_v=W_v, b_v=b_v, W_o=W_o, b_o=b_o)
        return fast.multi_head_attention_forward_fast(query, key, value, params, 2, mask)

    def backward(dout, cache):
        dquery, dkey, dvalue, g = fast.multi_head_attention_backward_fast(dout, cache)
        return (dquery, dkey, dvalue, *g.values())

    check_gradients(forward, backward, query, key, value, *p.values())


def test_blocked_path_equals_plain_path_on_small_inputs(tiny_blocks):
    rng = np.random.default_rng(6)
    q, k, v = (rng.standard_normal((3, 9, 4)) for _ in range(3))
    dout = rng.standard_normal((3, 9, 4))
    out, cache = fast.scaled_dot_product_attention_forward_fast(q, k, v)
    grads = fast.scaled_dot_product_attention_backward_fast(dout, cache)
    reference = _loop_attention_fwd_bwd(q, k, v, dout)
    for name, ours, ref in zip(("out", "dq", "dk", "dv"), (out, *grads), reference):
        assert_close(ours, ref, what=name)


def test_errors_in_a_block_propagate(tiny_blocks):
    def fail(start, stop):
        raise RuntimeError(f"block {start}:{stop}")

    with pytest.raises(RuntimeError, match="block 0:"):
        _row_blocks.for_each_row_block(fail, 10, 3)


def test_the_removed_thread_settings_are_gone():
    """get_num_threads and set_num_threads, no-ops since 0.2, were removed in 0.3.0 (CHANGELOG.md)."""
    assert not hasattr(ar, "get_num_threads") and not hasattr(ar, "set_num_threads")
