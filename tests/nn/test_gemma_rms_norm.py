"""gemma_rms_norm_forward / gemma_rms_norm_backward: Gemma's (1 + w) RMSNorm."""
import math

import numpy as np
import pytest

from attention_ref.nn.gemma_rms_norm import gemma_rms_norm_backward, gemma_rms_norm_forward
from _helpers import assert_close, check_gradients

SHAPES = [(1,), (4,), (3, 4), (2, 3, 5), (2, 2, 3, 4)]


def loop_gemma_rms_norm(x, w, eps):
    out = np.empty(x.shape)
    for idx in np.ndindex(x.shape[:-1]):
        row = x[idx]
        rms = math.sqrt(sum(v * v for v in row) / len(row) + eps)
        out[idx] = [(1.0 + w[j]) * row[j] / rms for j in range(len(row))]
    return out


@pytest.mark.parametrize("shape", SHAPES)
def test_forward_matches_loop(shape):
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal(shape), rng.standard_normal(shape[-1])
    y, _ = gemma_rms_norm_forward(x, w, 1e-6)
    assert_close(y, loop_gemma_rms_norm(x, w, 1e-6), what="gemma rms norm")


def test_zero_weight_is_the_plain_normalisation():
    x = np.array([[3.0, 4.0]])
    y, _ = gemma_rms_norm_forward(x, np.zeros(2), eps=1e-300)
    assert_close(y, x / math.sqrt(12.5))


@pytest.mark.parametrize("shape", SHAPES)
def test_backward_gradcheck(shape):
    rng = np.random.default_rng(1)
    check_gradients(gemma_rms_norm_forward, gemma_rms_norm_backward, rng.standard_normal(shape),
                    rng.standard_normal(shape[-1]), names=["x", "weight"])


def test_float32_stays_float32_and_inputs_are_kept():
    rng = np.random.default_rng(2)
    x, w = rng.standard_normal((2, 4)).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    x0, w0 = x.copy(), w.copy()
    y, cache = gemma_rms_norm_forward(x, w)
    dx, dw = gemma_rms_norm_backward(np.ones((2, 4)), cache)
    assert y.dtype == dx.dtype == dw.dtype == np.float32
    assert np.array_equal(x, x0) and np.array_equal(w, w0)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match=r"^weight must have shape \(4,\) to match x of shape \(2, 4\), got shape \(3,\)$"):
        gemma_rms_norm_forward(np.ones((2, 4)), np.ones(3))
    with pytest.raises(TypeError, match=r"^weight must hold real numbers"):
        gemma_rms_norm_forward(np.ones((2, 4)), np.array(["a"] * 4))
    with pytest.raises(ValueError, match=r"^eps must be a positive real number"):
        gemma_rms_norm_forward(np.ones((2, 4)), np.ones(4), eps=0)
