"""The fast path's pieces (``attention_ref/fast/softmax.py`` and ``linear.py``): the in-place,
row-blocked softmax and ``dS = P * (dP - D)``, and the tall projection product, each against
the reference's formula (bit for bit where the arithmetic is the same)."""
import numpy as np
import pytest

from attention_ref.core.softmax import _softmax
from attention_ref.fast import linear as fast_linear
from attention_ref.fast import row_blocks
from attention_ref.fast import softmax as fast_softmax
from attention_ref.fast.softmax import ScoresOverflow, softmax_backward_in_place, softmax_in_place
from _helpers import assert_close
from _reference import loop_softmax


def _recording_blocks(monkeypatch, module):
    """Record every ``for_each_row_block(fn, n_rows, n_cols)`` that ``module`` calls."""
    calls = []

    def recording(fn, n_rows, n_cols, block=None):
        calls.append((n_rows, n_cols))
        row_blocks.for_each_row_block(fn, n_rows, n_cols, block)

    monkeypatch.setattr(module, "for_each_row_block", recording)
    return calls


# ----------------------------------------------------------------- softmax in place
def test_blocked_softmax_is_bit_identical_to_the_reference():
    rng = np.random.default_rng(0)
    x = 5 * rng.standard_normal((2, 3, 300, 700))  # 1.26M numbers: several row blocks
    assert x.size > 4 * row_blocks.BLOCK_ELEMENTS
    x[0, 1, 7] = -np.inf  # a query with no allowed key: all zeros
    x[1, 2, 9, ::2] = -np.inf
    expected = _softmax(x, -1)
    fast = x.copy()
    out = softmax_in_place(fast)
    assert out is fast
    np.testing.assert_array_equal(fast, expected)
    assert_close(fast.sum(axis=-1)[0, 0], np.ones(300), what="rows sum to 1")
    assert not fast[0, 1, 7].any()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape, order, blocked", [
    ((3, 4), "C", True),     # the smallest case the blocks take
    ((2, 3, 4), "C", True),
    ((5,), "C", False),      # one row: nothing to block
    ((3, 4), "F", False),    # rows are not contiguous
    ((0, 4), "C", False),    # empty
])
def test_in_place_softmax_takes_the_blocks_only_where_they_apply(monkeypatch, dtype, shape, order, blocked):
    calls = _recording_blocks(monkeypatch, fast_softmax)
    x = np.asarray(np.random.default_rng(6).standard_normal(shape), order=order).astype(dtype)
    expected = loop_softmax(x.astype(np.float64))
    out = softmax_in_place(x)
    assert out is x and out.dtype == dtype  # in place on either path, float32 kept
    tol = 1e-12 if dtype == np.float64 else 1e-6
    assert_close(out, expected, rtol=tol, atol=tol, what="softmax in place")
    assert calls == ([(int(np.prod(shape[:-1])), shape[-1])] if blocked else [])


def test_in_place_softmax_reports_an_overflowed_row():
    x = np.array([[0.0, np.inf], [1.0, 2.0]])
    with pytest.raises(ScoresOverflow):
        softmax_in_place(x)


# --------------------------------------------------------- dS = P * (dP - D) in place
def test_softmax_backward_broadcast_falls_back_to_the_formula():
    rng = np.random.default_rng(2)
    P = rng.random((1, 30, 40))
    dP = rng.standard_normal((3, 30, 40))  # a larger batch than P: the plain, broadcasting form
    D = rng.standard_normal((3, 30, 1))
    assert_close(softmax_backward_in_place(dP.copy(), P, D), P * (dP - D))


def test_blocked_softmax_backward_is_bit_identical():
    rng = np.random.default_rng(1)
    P = rng.random((4, 2, 250, 600))
    dP = rng.standard_normal(P.shape)
    D = rng.standard_normal(P.shape[:-1] + (1,))
    expected = P * (dP - D)
    got = softmax_backward_in_place(dP.copy(), P, D)
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("strided", ["dP", "P", "both"])
def test_softmax_backward_strided_layouts_take_the_formula_in_one_piece(monkeypatch, strided):
    """Only C-contiguous dP and P of one shape are reshaped into row blocks (a view of a
    strided dP would be a copy, and the result would never reach dP)."""
    calls = _recording_blocks(monkeypatch, fast_softmax)
    rng = np.random.default_rng(3)
    P = rng.random((2, 40, 30)).swapaxes(-1, -2) if strided in ("P", "both") else rng.random((2, 30, 40))
    dP = rng.standard_normal((2, 40, 30)).swapaxes(-1, -2) if strided in ("dP", "both") else \
        rng.standard_normal((2, 30, 40))
    D = rng.standard_normal((2, 30, 1))
    expected = P * (dP - D)
    got = softmax_backward_in_place(dP, P, D)
    assert got is dP and calls == []
    np.testing.assert_array_equal(got, expected)


def test_softmax_backward_contiguous_layouts_take_the_blocks(monkeypatch):
    calls = _recording_blocks(monkeypatch, fast_softmax)
    rng = np.random.default_rng(4)
    P, dP, D = rng.random((2, 3, 4)), rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 3, 1))
    expected = P * (dP - D)
    np.testing.assert_array_equal(softmax_backward_in_place(dP, P, D), expected)
    assert calls == [(6, 4)]


# ------------------------------------------------------------ one tall projection product
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_folded_rows_product_matches_batched_product(dtype):
    rng = np.random.default_rng(7)
    W = rng.standard_normal((6, 5)).astype(dtype)
    x = rng.standard_normal((3, 4, 7, 6)).astype(dtype)
    for arr in (x, x.swapaxes(0, 1), x[:, :, ::2], x[0, 0], np.empty((0, 3, 6), dtype)):
        got = fast_linear._matmul_rows(arr, W)
        assert got.dtype == dtype and got.shape == arr.shape[:-1] + (5,)
        ref = np.einsum("...i,ij->...j", arr.astype(np.float64), W.astype(np.float64))
        tol = 1e-12 if dtype == np.float64 else 1e-5
        assert_close(got, ref, rtol=tol, atol=tol, what="x @ W")


class _RecordingArray(np.ndarray):
    """An array that records the shape of the left operand of every ``@``."""
    shapes: list = []

    def __matmul__(self, other):
        _RecordingArray.shapes.append(self.shape)
        return np.asarray(self) @ other


@pytest.mark.parametrize("shape, order, product", [
    ((2, 3, 4), "C", (6, 4)),       # leading axes folded: one (rows, Din) product
    ((2, 2, 3, 4), "C", (12, 4)),
    ((3, 4), "C", (3, 4)),          # already one product
    ((2, 3, 4), "F", (2, 3, 4)),    # a fold would copy: NumPy's batched product instead
])
def test_folded_product_is_used_exactly_for_contiguous_batches(shape, order, product):
    x = np.asarray(np.random.default_rng(8).standard_normal(shape), order=order)
    W = np.random.default_rng(9).standard_normal((4, 5))
    _RecordingArray.shapes = []
    got = fast_linear._matmul_rows(x.view(_RecordingArray), W)
    assert _RecordingArray.shapes == [product]
    assert_close(np.asarray(got), x @ W, what="x @ W")
