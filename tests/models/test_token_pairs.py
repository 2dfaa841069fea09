"""The embedding and cross-entropy pairs: forwards against plain loops, backwards against finite
differences over many shapes, torch's conventions (ignore_index, padding_idx), dtypes, errors."""
import numpy as np
import pytest

import attention_ref as ar
from tests._reference import loop_cross_entropy, loop_embedding


@pytest.mark.parametrize("ids_shape", [(5,), (2, 6), (2, 3, 4), (0,), (3, 0)])
@pytest.mark.parametrize("padding_idx", [None, 2])
def test_embedding_forward_loop_and_gradcheck(ids_shape, padding_idx):
    rng = np.random.default_rng(sum(ids_shape))
    W = rng.standard_normal((7, 3))
    ids = rng.integers(0, 7, ids_shape)
    out, cache = ar.embedding_forward(ids, W, padding_idx=padding_idx)
    np.testing.assert_array_equal(out, loop_embedding(ids, W))
    assert out.shape == ids_shape + (3,)
    if padding_idx is None:
        ar.gradcheck(lambda W: ar.embedding_forward(ids, W), ar.embedding_backward, W).raise_if_failed()
    else:  # torch's padding_idx: the row is read, but it is not trained (its gradient is set to 0)
        dout = rng.standard_normal(out.shape)
        full = ar.embedding_backward(dout, ar.embedding_forward(ids, W)[1])
        dW = ar.embedding_backward(dout, cache)
        assert not dW[padding_idx].any()
        np.testing.assert_array_equal(np.delete(dW, padding_idx, 0), np.delete(full, padding_idx, 0))


def test_embedding_backward_adds_repeated_ids_and_skips_the_padding_row():
    W = np.arange(12.0).reshape(4, 3)
    ids = np.array([[1, 1, 3], [0, 1, 2]])
    dout = np.ones((2, 3, 3))
    _, cache = ar.embedding_forward(ids, W, padding_idx=2)
    dW = ar.embedding_backward(dout, cache)
    np.testing.assert_array_equal(dW[:, 0], [1, 3, 0, 1])  # row 1 read three times, row 2 is padding


def test_embedding_keeps_float32_and_names_bad_ids():
    W = np.ones((5, 2), np.float32)
    out, cache = ar.embedding_forward([[0, 4]], W)
    assert out.dtype == np.float32 and ar.embedding_backward(np.ones((1, 2, 2)), cache).dtype == np.float32
    with pytest.raises(ValueError, match=r"ids\[0, 1\] = 5 is not a token id in \[0, 5\)"):
        ar.embedding_forward([[0, 5]], W)
    with pytest.raises(ValueError, match=r"ids\[1\] = -1"):
        ar.embedding_forward([0, -1], W)
    with pytest.raises(TypeError, match="ids must hold integer token ids, got dtype float64"):
        ar.embedding_forward([0.0, 1.0], W)
    with pytest.raises(ValueError, match=r"W must be the embedding table \(V, D\), got shape \(5,\)"):
        ar.embedding_forward([0], np.ones(5))
    with pytest.raises(ValueError, match="padding_idx must be None or a row of W"):
        ar.embedding_forward([0], W, padding_idx=5)


@pytest.mark.parametrize("shape", [(6,), (4, 6), (2, 3, 6), (1, 2)])
def test_cross_entropy_forward_loop_and_gradcheck(shape):
    rng = np.random.default_rng(len(shape))
    z = 3 * rng.standard_normal(shape)
    t = rng.integers(0, shape[-1], shape[:-1])
    if t.size > 1:
        t.reshape(-1)[0] = -100  # one ignored row
    loss, cache = ar.cross_entropy_forward(z, t)
    assert loss.shape == () and abs(float(loss) - loop_cross_entropy(z, t)) < 1e-12
    ar.gradcheck(lambda z: ar.cross_entropy_forward(z, t), ar.cross_entropy_backward, z).raise_if_failed()


def test_cross_entropy_is_stable_and_ignores_rows():
    z = np.array([[1000.0, 0.0, -1000.0], [0.0, 0.0, 0.0]])
    loss, cache = ar.cross_entropy_forward(z, [1, -100])
    assert float(loss) == pytest.approx(1000.0)  # -log softmax(z)[1] = 1000, no overflow
    dz = ar.cross_entropy_backward(2.0, cache)
    np.testing.assert_allclose(dz, [[2.0, -2.0, 0.0], [0.0, 0.0, 0.0]], atol=1e-300)
    loss, cache = ar.cross_entropy_forward(z, [7, 7], ignore_index=7)  # every row ignored: 0, not nan
    assert float(loss) == 0.0 and not ar.cross_entropy_backward(1.0, cache).any()
    z32 = z.astype(np.float32)
    loss, cache = ar.cross_entropy_forward(z32, [0, 2])
    assert loss.dtype == np.float32 and ar.cross_entropy_backward(1.0, cache).dtype == np.float32


def test_cross_entropy_errors_name_the_argument():
    z = np.zeros((2, 3))
    with pytest.raises(ValueError, match=r"targets\[1\] = 3 is not a token id in \[0, 3\) or -100"):
        ar.cross_entropy_forward(z, [0, 3])
    with pytest.raises(ValueError, match=r"targets must have shape \(2,\)"):
        ar.cross_entropy_forward(z, [0, 1, 2])
    with pytest.raises(ValueError, match="logits contains NaN"):
        ar.cross_entropy_forward(np.full((2, 3), np.nan), [0, 1])
    with pytest.raises(ValueError, match=r"dloss must have shape \(\)"):
        ar.cross_entropy_backward(np.ones(2), ar.cross_entropy_forward(z, [0, 1])[1])


def test_next_token_targets_shift_and_padding():
    ids = np.array([[5, 6, 7, 8], [0, 0, 3, 4]])
    mask = np.array([[1, 1, 1, 1], [0, 0, 1, 1]])
    np.testing.assert_array_equal(ar.next_token_targets(ids), [[6, 7, 8, -100], [0, 3, 4, -100]])
    np.testing.assert_array_equal(ar.next_token_targets(ids, mask), [[6, 7, 8, -100], [-100, 3, 4, -100]])
    with pytest.raises(ValueError, match="attention_mask must have the shape"):
        ar.next_token_targets(ids, mask[:, :3])


def test_embedding_backward_adds_into_a_given_gradient_and_keeps_its_padding_row():
    """``into`` (a tied head's gradient of the table) gets the lookups added, in place; the padding
    row keeps what ``into`` had (the head's part) and gets nothing from its lookups."""
    rng = np.random.default_rng(5)
    W = rng.standard_normal((6, 3))
    ids = np.array([[2, 0, 2], [5, 2, 1]])
    dout = rng.standard_normal((2, 3, 3))
    head = rng.standard_normal((6, 3))
    for padding_idx in (None, 2):
        _, cache = ar.embedding_forward(ids, W, padding_idx=padding_idx)
        into = head.copy()
        dW = ar.embedding_backward(dout, cache, into=into)
        assert dW is into
        expected = head + ar.embedding_backward(dout, cache)
        if padding_idx is not None:
            expected[padding_idx] = head[padding_idx]
        np.testing.assert_allclose(dW, expected, rtol=1e-15, atol=1e-15)


def test_embedding_backward_into_is_checked_and_names_the_argument():
    W = np.zeros((4, 3))
    _, cache = ar.embedding_forward(np.array([1, 2]), W)
    dout = np.ones((2, 3))
    for bad, error, words in ((np.zeros((4, 3), np.int64), ValueError, "dtype float64"),
                              (np.zeros((5, 3)), ValueError, r"shape \(4, 3\)"),
                              (np.zeros((4, 3), np.float32), ValueError, "dtype float64"),
                              ([[0.0] * 3] * 4, TypeError, "NumPy array"),
                              (np.full((4, 3), np.nan), ValueError, "into contains NaN")):
        with pytest.raises(error, match=words):
            ar.embedding_backward(dout, cache, into=bad)
    frozen = np.zeros((4, 3))
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="into must be writeable"):
        ar.embedding_backward(dout, cache, into=frozen)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cross_entropy_backward_of_a_tiny_dloss_rounds_to_zero_under_seterr_raise(dtype):
    logits = np.random.default_rng(0).standard_normal((3, 5)).astype(dtype)
    _, cache = ar.cross_entropy_forward(logits, np.array([0, 4, 2]))
    old = np.seterr(all="raise")
    try:
        dz = ar.cross_entropy_backward(np.finfo(dtype).tiny, cache)
    finally:
        np.seterr(**old)
    assert dz.dtype == dtype and np.all(np.abs(dz) <= np.finfo(dtype).tiny)
