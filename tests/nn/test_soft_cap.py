"""soft_cap_forward / soft_cap_backward: Gemma 2's cap * tanh(x / cap)."""
import math

import numpy as np
import pytest

from attention_ref.nn.soft_cap import soft_cap_backward, soft_cap_forward
from _helpers import assert_close, check_gradients

SHAPES = [(1,), (5,), (3, 4), (2, 3, 4), (2, 2, 3, 5)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("cap", [0.5, 30.0, 50.0])
def test_forward_matches_loop(shape, cap):
    x = 40.0 * np.random.default_rng(0).standard_normal(shape)
    y, _ = soft_cap_forward(x, cap)
    reference = np.array([cap * math.tanh(v / cap) for v in x.ravel()]).reshape(shape)
    assert_close(y, reference, what="soft cap")
    assert (np.abs(y) <= cap).all()


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("cap", [0.5, 30.0])
def test_backward_gradcheck(shape, cap):
    x = 20.0 * cap * np.random.default_rng(1).standard_normal(shape) / 30.0
    check_gradients(lambda x: soft_cap_forward(x, cap), soft_cap_backward, x, names=["x"])


def test_backward_by_hand():
    _, cache = soft_cap_forward(np.array([0.0, 3.0]), 3.0)
    assert_close(soft_cap_backward(np.ones(2), cache), [1.0, 1.0 - math.tanh(1.0) ** 2])


def test_huge_inputs_saturate_quietly_and_float32_stays_float32():
    x = np.array([1e38, -3e38, 0.5], dtype=np.float32)
    with np.errstate(all="raise"):
        y, cache = soft_cap_forward(x, 1e-30)
        dx = soft_cap_backward(np.ones(3, np.float32), cache)
    assert y.dtype == dx.dtype == np.float32 and y.tolist() == pytest.approx([1e-30, -1e-30, 1e-30])
    assert dx.tolist() == [0.0, 0.0, 0.0]


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match=r"^cap must be a positive real number, got 0$"):
        soft_cap_forward([1.0], 0)
    with pytest.raises(ValueError, match=r"^x contains NaN"):
        soft_cap_forward([np.nan], 1.0)
    _, cache = soft_cap_forward(np.ones((2, 3)), 1.0)
    with pytest.raises(ValueError, match=r"^dy must have shape \(2, 3\) \(the forward output's\), got \(3,\)$"):
        soft_cap_backward(np.ones(3), cache)
