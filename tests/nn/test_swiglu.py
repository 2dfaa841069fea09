"""swiglu_forward / swiglu_backward: Llama's gated feed-forward network."""
import math

import numpy as np
import pytest

from attention_ref import swiglu_backward, swiglu_forward
from _helpers import assert_close, check_gradients


def loop_swiglu(x, W_gate, W_up, W_down):
    """Row by row: m_f = silu(sum_i x_i Wg_if) * sum_i x_i Wu_if, y_j = sum_f m_f Wd_fj."""
    x = np.asarray(x, dtype=np.float64)
    out = np.empty(x.shape[:-1] + (W_down.shape[1],))
    for idx in np.ndindex(x.shape[:-1]):
        row = x[idx]
        m = []
        for f in range(W_gate.shape[1]):
            a = sum(row[i] * W_gate[i, f] for i in range(len(row)))
            u = sum(row[i] * W_up[i, f] for i in range(len(row)))
            m.append(a / (1 + math.exp(-a)) * u)
        out[idx] = [sum(m[f] * W_down[f, j] for f in range(len(m))) for j in range(W_down.shape[1])]
    return out


def _params(rng, d=4, f=6, d_out=3):
    return rng.standard_normal((d, f)), rng.standard_normal((d, f)), rng.standard_normal((f, d_out))


@pytest.mark.parametrize("shape", [(4,), (3, 4), (2, 3, 4)])
def test_forward_matches_loop(shape):
    rng = np.random.default_rng(0)
    x, params = rng.standard_normal(shape), _params(rng)
    y, _ = swiglu_forward(x, *params)
    assert_close(y, loop_swiglu(x, *params), what="swiglu")


@pytest.mark.parametrize("shape", [(4,), (3, 4), (2, 3, 4)])
def test_backward_gradcheck(shape):
    rng = np.random.default_rng(1)
    check_gradients(swiglu_forward, swiglu_backward, rng.standard_normal(shape), *_params(rng),
                    names=["x", "W_gate", "W_up", "W_down"])


def test_large_gate_values_do_not_overflow():
    rng = np.random.default_rng(2)
    W_gate, W_up, W_down = _params(rng)
    x = 200.0 * rng.standard_normal((2, 4))  # gate pre-activations of +-1000: sigmoid 0 or 1, no warning
    with np.errstate(all="raise"):
        y, cache = swiglu_forward(x, W_gate, W_up, W_down)
        grads = swiglu_backward(np.ones_like(y), cache)
    assert np.isfinite(y).all() and all(np.isfinite(g).all() for g in grads)


def test_float32_stays_float32():
    rng = np.random.default_rng(3)
    args = [a.astype(np.float32) for a in (rng.standard_normal((2, 4)), *_params(rng))]
    y, cache = swiglu_forward(*args)
    grads = swiglu_backward(np.ones(y.shape), cache)
    assert y.dtype == np.float32 and all(g.dtype == np.float32 for g in grads)


def test_bad_shapes_are_named():
    rng = np.random.default_rng(4)
    x, (W_gate, W_up, W_down) = rng.standard_normal((2, 4)), _params(rng)
    with pytest.raises(ValueError, match=r"^W_gate and W_up must have the same shape \(d, f\), got \(4, 6\) and \(4, 5\)$"):
        swiglu_forward(x, W_gate, W_up[:, :5], W_down)
    with pytest.raises(ValueError, match=r"^x of shape \(2, 3\) has last dimension 3, but W_gate of shape \(4, 6\)"):
        swiglu_forward(x[:, :3], W_gate, W_up, W_down)
    with pytest.raises(ValueError, match=r"W_down of shape \(5, 3\) expects d_in = 5"):
        swiglu_forward(x, W_gate, W_up, W_down[:5])
    _, cache = swiglu_forward(x, W_gate, W_up, W_down)
    with pytest.raises(ValueError, match=r"^dy must have shape \(2, 3\)"):
        swiglu_backward(np.ones((2, 4)), cache)


def test_silu_at_the_top_level_is_x_times_sigmoid():
    from attention_ref import silu

    x = np.array([-800.0, -3.0, -0.5, 0.0, 0.5, 3.0, 800.0])
    expected = np.array([v / (1.0 + math.exp(-v)) if v > -700 else 0.0 for v in x])  # the loop, no overflow
    np.testing.assert_allclose(silu(x), expected, rtol=1e-15, atol=1e-300)
    assert silu(np.ones((2, 3), np.float32)).dtype == np.float32
    assert silu([1, 2]).dtype == np.float64  # integers computed in float64
    with pytest.raises(TypeError, match=r"^x must hold real numbers, got a boolean array of dtype bool and shape \(1,\)$"):
        silu(np.array([True]))
    with pytest.raises(ValueError, match=r"^x contains NaN"):
        silu(np.array([np.nan]))


def test_silu_matches_torch():
    torch = pytest.importorskip("torch")
    from attention_ref import silu

    x = np.random.default_rng(0).standard_normal((4, 5)) * 10
    np.testing.assert_allclose(silu(x), torch.nn.functional.silu(torch.tensor(x)).numpy(), rtol=1e-14, atol=1e-15)
