"""geglu_forward / geglu_backward: Gemma's gated feed-forward network with GELU's tanh form."""
import math

import numpy as np
import pytest

from attention_ref.nn.geglu import geglu_backward, geglu_forward
from _helpers import assert_close, check_gradients

SHAPES = [(4,), (3, 4), (2, 3, 4), (2, 1, 2, 4)]


def loop_geglu(x, W_gate, W_up, W_down):
    """m_f = gelu_tanh(sum_i x_i Wg_if) * sum_i x_i Wu_if, y_j = sum_f m_f Wd_fj."""
    out = np.empty(x.shape[:-1] + (W_down.shape[1],))
    for idx in np.ndindex(x.shape[:-1]):
        row, m = x[idx], []
        for f in range(W_gate.shape[1]):
            a = sum(row[i] * W_gate[i, f] for i in range(len(row)))
            u = sum(row[i] * W_up[i, f] for i in range(len(row)))
            gelu = 0.5 * a * (1 + math.tanh(math.sqrt(2 / math.pi) * (a + 0.044715 * a ** 3)))
            m.append(gelu * u)
        out[idx] = [sum(m[f] * W_down[f, j] for f in range(len(m))) for j in range(W_down.shape[1])]
    return out


def _params(rng, d=4, f=6, d_out=3):
    return rng.standard_normal((d, f)), rng.standard_normal((d, f)), rng.standard_normal((f, d_out))


@pytest.mark.parametrize("shape", SHAPES)
def test_forward_matches_loop(shape):
    rng = np.random.default_rng(0)
    x, params = rng.standard_normal(shape), _params(rng)
    y, _ = geglu_forward(x, *params)
    assert_close(y, loop_geglu(x, *params), what="geglu")


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dims", [(4, 6, 3), (4, 1, 4), (4, 9, 2)])
def test_backward_gradcheck(shape, dims):
    rng = np.random.default_rng(1)
    check_gradients(geglu_forward, geglu_backward, rng.standard_normal(shape), *_params(rng, *dims),
                    names=["x", "W_gate", "W_up", "W_down"])


def test_large_gate_values_do_not_overflow_and_float32_stays_float32():
    rng = np.random.default_rng(2)
    args = [a.astype(np.float32) for a in (1e6 * rng.standard_normal((2, 4)), *_params(rng))]
    with np.errstate(all="raise"):
        y, cache = geglu_forward(*args)
        grads = geglu_backward(np.ones(y.shape), cache)
    assert y.dtype == np.float32 and all(g.dtype == np.float32 for g in grads)
    assert np.isfinite(y).all() and all(np.isfinite(g).all() for g in grads)


def test_bad_shapes_are_named():
    rng = np.random.default_rng(4)
    x, (W_gate, W_up, W_down) = rng.standard_normal((2, 4)), _params(rng)
    with pytest.raises(ValueError, match=r"^W_gate and W_up must have the same shape \(d, f\), got \(4, 6\) and \(4, 5\)$"):
        geglu_forward(x, W_gate, W_up[:, :5], W_down)
    with pytest.raises(ValueError, match=r"^x of shape \(2, 3\) has last dimension 3, but W_gate of shape \(4, 6\)"):
        geglu_forward(x[:, :3], W_gate, W_up, W_down)
    with pytest.raises(ValueError, match=r"W_down of shape \(5, 3\) expects d_in = 5"):
        geglu_forward(x, W_gate, W_up, W_down[:5])
    _, cache = geglu_forward(x, W_gate, W_up, W_down)
    with pytest.raises(ValueError, match=r"^dy must have shape \(2, 3\)"):
        geglu_backward(np.ones((2, 4)), cache)


def test_backward_reuses_the_forwards_tanh(monkeypatch):
    """The cache keeps the gate's t = tanh(s (a + c a^3)); the backward reads it (one tanh per forward +
    backward) and computes it again (the same gradients) only when a cache without it is given."""
    import attention_ref.nn.feed_forward as ff

    calls = []
    real_tanh = np.tanh
    monkeypatch.setattr(ff.np, "tanh", lambda z, **kw: calls.append(z.shape) or real_tanh(z, **kw))
    rng = np.random.default_rng(5)
    x, params = rng.standard_normal((2, 3, 4)), _params(rng)
    y, cache = geglu_forward(x, *params)
    dy = rng.standard_normal(y.shape)
    grads = geglu_backward(dy, cache)
    assert calls == [(2, 3, 6)]
    a = cache.a
    assert_close(cache.t, real_tanh(math.sqrt(2 / math.pi) * (a + 0.044715 * (a * a * a))), rtol=1e-15, atol=0,
                 what="the cached t")
    for ours, again in zip(grads, geglu_backward(dy, cache._replace(t=None))):
        assert_close(ours, again, rtol=1e-14, atol=1e-15, what="t cached against t again")
    assert calls == [(2, 3, 6), (2, 3, 6)]  # the second only without the cached t
