"""The thread pool (``attention_ref/_parallel.py``) gives the plain path's numbers.

(The fast paths of each core module are tested beside that module's other tests, in
``tests/core/``.) The row-blocked softmax and ``dS = P * (dP - D)`` only
change WHICH rows a NumPy call sees at once, never the arithmetic on a row, so the results
must be bit-for-bit those of the plain formula, with the pool on or off, and float32 must
stay float32. Small arrays normally skip the fast path; ``tiny_blocks`` forces it on
test-sized arrays (blocks of a few rows, several threads) so the gradient checks run
through it too.
"""
from __future__ import annotations

import numpy as np
import pytest

import attention_ref as ar
from attention_ref import _parallel
from attention_ref.core.softmax import _softmax

from tests._helpers import assert_close, check_gradients, random_params


@pytest.fixture
def tiny_blocks(monkeypatch):
    """Force the blocked, threaded path on small arrays: blocks of about 7 numbers."""
    monkeypatch.setattr(_parallel, "PARALLEL_MIN_ELEMENTS", 0)
    monkeypatch.setattr(_parallel, "BLOCK_ELEMENTS", 7)
    with _parallel.num_threads(3):
        yield


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








@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_large_attention_matches_loop_reference_pool_on_and_off(dtype):
    rng = np.random.default_rng(3)
    q = rng.standard_normal((2, 2, 300, 16)).astype(dtype)
    k = rng.standard_normal((2, 2, 500, 16)).astype(dtype)
    v = rng.standard_normal((2, 2, 500, 8)).astype(dtype)
    dout = rng.standard_normal((2, 2, 300, 8)).astype(dtype)
    results = {}
    for threads in (1, 2):
        with _parallel.num_threads(threads):
            out, cache = ar.scaled_dot_product_attention_forward(q, k, v)
            grads = ar.scaled_dot_product_attention_backward(dout, cache)
        results[threads] = (out, *grads)
        for a in results[threads]:
            assert a.dtype == dtype, f"{a.dtype} is not {np.dtype(dtype)}"
    for a, b in zip(results[1], results[2]):
        np.testing.assert_array_equal(a, b)  # the pool never changes a number
    reference = _loop_attention_fwd_bwd(*(a.astype(np.float64) for a in (q, k, v, dout)))
    tol = 1e-12 if dtype == np.float64 else 2e-4
    for name, ours, ref in zip(("out", "dq", "dk", "dv"), results[2], reference):
        assert_close(ours, ref, rtol=tol, atol=tol, what=name)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_multi_head_pool_on_and_off_identical(dtype):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 256, 32)).astype(dtype)
    p = random_params(rng, 32, 4, 8, 8, dtype=dtype)
    dout = rng.standard_normal((2, 256, 32)).astype(dtype)
    mask = ar.causal_mask(256)
    results = []
    for threads in (1, 2):
        with _parallel.num_threads(threads):
            out, cache = ar.multi_head_attention_forward(x, x, x, p, 4, mask)
            dq, dk, dv, grads = ar.multi_head_attention_backward(dout, cache)
        results.append([out, dq, dk, dv, *grads.values()])
    assert cache.attention.weights.size > _parallel.PARALLEL_MIN_ELEMENTS  # fast path taken
    for a, b in zip(*results):
        assert a.dtype == dtype
        np.testing.assert_array_equal(a, b)


def test_gradients_through_the_blocked_threaded_path(tiny_blocks):
    rng = np.random.default_rng(5)
    query = rng.standard_normal((2, 5, 6))
    key = rng.standard_normal((2, 7, 6))
    value = rng.standard_normal((2, 7, 4))
    p = random_params(rng, 6, 2, 3, 2, kdim=6, vdim=4)
    mask = rng.random((5, 7)) < 0.7
    mask[:, 0] = True

    def forward(query, key, value, W_q, b_q, W_k, b_k, W_v, b_v, W_o, b_o):
        params = dict(W_q=W_q, b_q=b_q, W_k=W_k, b_k=b_k, W_v=W_v, b_v=b_v, W_o=W_o, b_o=b_o)
        return ar.multi_head_attention_forward(query, key, value, params, 2, mask)

    def backward(dout, cache):
        dquery, dkey, dvalue, g = ar.multi_head_attention_backward(dout, cache)
        return (dquery, dkey, dvalue, *g.values())

    check_gradients(forward, backward, query, key, value, *p.values())


def test_blocked_path_equals_plain_path_on_small_inputs(tiny_blocks):
    rng = np.random.default_rng(6)
    q, k, v = (rng.standard_normal((3, 9, 4)) for _ in range(3))
    dout = rng.standard_normal((3, 9, 4))
    out, cache = ar.scaled_dot_product_attention_forward(q, k, v)
    grads = ar.scaled_dot_product_attention_backward(dout, cache)
    reference = _loop_attention_fwd_bwd(q, k, v, dout)
    for name, ours, ref in zip(("out", "dq", "dk", "dv"), (out, *grads), reference):
        assert_close(ours, ref, what=name)


def test_set_num_threads_validates_and_restores():
    before = _parallel.get_num_threads()
    for bad in (0, -1):
        with pytest.raises(ValueError, match="positive integer"):
            _parallel.set_num_threads(bad)
    for bad in (1.5, True, "2"):
        with pytest.raises(TypeError, match="positive integer"):
            _parallel.set_num_threads(bad)
    with _parallel.num_threads(1):
        assert _parallel.get_num_threads() == 1
    assert _parallel.get_num_threads() == before


def test_errors_in_a_block_propagate(tiny_blocks):
    def fn(start, stop):
        if start > 0:
            raise RuntimeError(f"block {start}")

    with pytest.raises(RuntimeError, match="block"):
        _parallel.for_each_row_block(fn, 10, 3)


def test_environment_switch(monkeypatch):
    monkeypatch.setenv("ATTENTION_REF_NUM_THREADS", "1")
    assert _parallel._default_threads() == 1
    for bad in ("0", "two", "-3"):
        monkeypatch.setenv("ATTENTION_REF_NUM_THREADS", bad)
        with pytest.raises(ValueError, match="ATTENTION_REF_NUM_THREADS"):
            _parallel._default_threads()
    monkeypatch.delenv("ATTENTION_REF_NUM_THREADS")
    assert 1 <= _parallel._default_threads() <= 8
    assert ar.get_num_threads is _parallel.get_num_threads




def test_pool_respects_the_callers_errstate_and_survives_fork():
    """Review findings: np.errstate is per thread, and a forked child has no pool threads."""
    import os

    import attention_ref._parallel as par

    x = np.zeros((1024, 1024))
    x[:, 0] = 1000.0  # exp(-1000) underflows
    with par.num_threads(2), np.errstate(under="raise"):
        with pytest.raises(FloatingPointError):
            y = x.copy()
            _softmax(y, axis=-1, out=y)  # in place: the blocked, threaded path
    with par.num_threads(2):
        y = x.copy()
        _softmax(y, axis=-1, out=y)  # the pool exists now
        if not hasattr(os, "fork"):
            return
        import warnings

        with warnings.catch_warnings():  # Python 3.12+ warns about fork() with threads running
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # child: must not hang waiting on the parent's threads
            try:
                y = x.copy()
                _softmax(y, axis=-1, out=y)
            finally:
                os._exit(0)
        _, status = os.waitpid(pid, 0)
        assert status == 0


def test_set_num_threads_accepts_numpy_integers():
    import attention_ref._parallel as par

    old = par.get_num_threads()
    par.set_num_threads(np.int64(1))
    assert par.get_num_threads() == 1
    par.set_num_threads(old)
