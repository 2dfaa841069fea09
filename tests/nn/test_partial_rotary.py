"""partial_rotary_forward / partial_rotary_backward: RoPE on the first rotary_dim features (GPT-NeoX)."""
import math

import numpy as np
import pytest

from attention_ref.nn.partial_rotary import partial_rotary_backward, partial_rotary_forward
from _helpers import assert_close, check_gradients


def loop_partial_rotary(x, r, positions, base):
    """The first r features rotated rotate-half style with theta_i = base^(-2i/r), the rest copied."""
    y = np.array(x, dtype=float)
    half = r // 2
    for idx in np.ndindex(x.shape[:-1]):
        p = positions[idx[-1]]
        for i in range(half):
            angle = p * base ** (-2 * i / r)
            c, s = math.cos(angle), math.sin(angle)
            y[idx + (i,)] = x[idx + (i,)] * c - x[idx + (i + half,)] * s
            y[idx + (i + half,)] = x[idx + (i,)] * s + x[idx + (i + half,)] * c
    return y


CASES = [((3, 4), 2), ((3, 4), 4), ((2, 5, 8), 2), ((2, 5, 8), 6), ((2, 2, 3, 16), 4), ((1, 3, 10), 8)]


@pytest.mark.parametrize("shape,r", CASES)
def test_forward_matches_loop(shape, r):
    rng = np.random.default_rng(0)
    x, positions = rng.standard_normal(shape), rng.uniform(0, 300, shape[-2])
    y, _ = partial_rotary_forward(x, r, positions, base=10000.0)
    assert_close(y, loop_partial_rotary(x, r, positions, 10000.0))
    assert np.array_equal(y[..., r:], x[..., r:])


@pytest.mark.parametrize("shape,r", CASES)
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_backward_gradcheck(shape, r, layout):
    rng = np.random.default_rng(1)
    positions = rng.uniform(0, 50, shape[:-1])
    check_gradients(lambda x: partial_rotary_forward(x, r, positions, 100.0, layout=layout),
                    partial_rotary_backward, rng.standard_normal(shape), names=["x"])


def test_the_factor_in_scaling_must_agree_with_rotary_dim():
    x = np.random.default_rng(2).standard_normal((3, 16))
    y, _ = partial_rotary_forward(x, 4, scaling={"rope_type": "default", "partial_rotary_factor": 0.25})
    assert_close(y, partial_rotary_forward(x, 4)[0])
    with pytest.raises(ValueError, match=r"^scaling\['partial_rotary_factor'\] = 0.5 rotates 8 of 16 features,"
                                         r" but rotary_dim = 4$"):
        partial_rotary_forward(x, 4, scaling={"partial_rotary_factor": 0.5})


def test_float32_stays_float32_and_x_is_kept():
    x = np.random.default_rng(3).standard_normal((2, 3, 8)).astype(np.float32)
    x0 = x.copy()
    y, cache = partial_rotary_forward(x, 4, scaling={"rope_type": "linear", "factor": 2.0})
    assert y.dtype == partial_rotary_backward(np.ones(x.shape), cache).dtype == np.float32
    assert np.array_equal(x, x0)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match=r"^rotary_dim must be even and at most x's last dimension 8, got 10"):
        partial_rotary_forward(np.ones((2, 8)), 10)
    with pytest.raises(ValueError, match=r"^rotary_dim must be even and at most x's last dimension 8, got 3"):
        partial_rotary_forward(np.ones((2, 8)), 3)
    with pytest.raises(TypeError, match=r"^rotary_dim must be a positive integer, got 2.0$"):
        partial_rotary_forward(np.ones((2, 8)), 2.0)
    with pytest.raises(ValueError, match=r"^layout must be one of"):
        partial_rotary_forward(np.ones((2, 8)), 2, layout="neox")
    _, cache = partial_rotary_forward(np.ones((2, 8)), 2)
    with pytest.raises(ValueError, match=r"^dy must have shape \(2, 8\)"):
        partial_rotary_backward(np.ones((2, 4)), cache)
