"""parallel_residual_forward / parallel_residual_backward: GPT-NeoX's x + attn(LN_1(x)) + mlp(LN_2(x))."""
import math

import numpy as np
import pytest

from attention_ref import linear_backward, linear_forward
from attention_ref.nn.parallel_residual import parallel_residual_backward, parallel_residual_forward
from attention_ref.nn.residual import residual_forward
from attention_ref.nn.soft_cap import soft_cap_backward, soft_cap_forward
from _helpers import assert_close, check_gradients


def loop_layer_norm(row, gamma, beta, eps):
    mu = sum(row) / len(row)
    var = sum((v - mu) ** 2 for v in row) / len(row)
    return [gamma[j] * (row[j] - mu) / math.sqrt(var + eps) + beta[j] for j in range(len(row))]


def loop_parallel_residual(x, W_1, W_2, g1, b1, g2, b2, eps):
    """Row by row: y = x + LN_1(x) W_1 + tanh-capped(LN_2(x) W_2)."""
    out = np.empty(x.shape)
    for idx in np.ndindex(x.shape[:-1]):
        row = list(x[idx])
        z1, z2 = loop_layer_norm(row, g1, b1, eps), loop_layer_norm(row, g2, b2, eps)
        d = len(row)
        s1 = [sum(z1[i] * W_1[i, j] for i in range(d)) for j in range(d)]
        s2 = [2.0 * math.tanh(sum(z2[i] * W_2[i, j] for i in range(d)) / 2.0) for j in range(d)]
        out[idx] = [row[j] + s1[j] + s2[j] for j in range(d)]
    return out


def _pair(x, W_1, W_2, g1, b1, g2, b2, eps=1e-5):
    """The block with a linear 'attention' and a soft-capped linear 'mlp', every parameter differentiable."""
    def mlp(z):
        h, lin = linear_forward(z, W_2)
        s, cap = soft_cap_forward(h, 2.0)
        return s, (lin, cap)

    return parallel_residual_forward(x, lambda z: linear_forward(z, W_1), mlp, g1, b1, g2, b2, eps)


def _pair_backward(dy, cache):
    def mlp_backward(ds, c):
        lin, cap = c
        dz, dW, _ = linear_backward(soft_cap_backward(ds, cap), lin)
        return dz, dW

    def attn_backward(ds, c):
        dz, dW, _ = linear_backward(ds, c)
        return dz, dW

    dx, dW_1, dW_2, dg1, db1, dg2, db2 = parallel_residual_backward(dy, cache, attn_backward, mlp_backward)
    return dx, dW_1, dW_2, dg1, db1, dg2, db2


def _inputs(rng, lead, d):
    return (rng.standard_normal(lead + (d,)), rng.standard_normal((d, d)) / math.sqrt(d),
            rng.standard_normal((d, d)) / math.sqrt(d), 1 + 0.1 * rng.standard_normal(d), 0.1 * rng.standard_normal(d),
            1 + 0.1 * rng.standard_normal(d), 0.1 * rng.standard_normal(d))


SHAPES = [((1,), 2), ((3,), 4), ((2, 3), 5), ((2, 2, 2), 3)]


@pytest.mark.parametrize("lead,d", SHAPES)
def test_forward_matches_loop(lead, d):
    args = _inputs(np.random.default_rng(0), lead, d)
    y, _ = _pair(*args)
    assert_close(y, loop_parallel_residual(*args, 1e-5), what="parallel residual")


@pytest.mark.parametrize("lead,d", SHAPES)
def test_backward_gradcheck(lead, d):
    check_gradients(_pair, _pair_backward, *_inputs(np.random.default_rng(1), lead, d),
                    names=["x", "W_1", "W_2", "gamma_1", "beta_1", "gamma_2", "beta_2"])


def test_differs_from_the_sequential_block():
    """The same sub-layers one after the other (GPT-NeoX with use_parallel_residual=False) give another y."""
    rng = np.random.default_rng(2)
    x, W_1, W_2, g1, b1, g2, b2 = _inputs(rng, (3,), 4)
    parallel, _ = parallel_residual_forward(x, lambda z: linear_forward(z, W_1), lambda z: linear_forward(z, W_2),
                                            g1, b1, g2, b2)
    h, _ = residual_forward(x, lambda z: linear_forward(z, W_1), g1, b1, norm_first=True)
    sequential, _ = residual_forward(h, lambda z: linear_forward(z, W_2), g2, b2, norm_first=True)
    assert not np.allclose(parallel, sequential)


def test_float32_stays_float32():
    args = [a.astype(np.float32) for a in _inputs(np.random.default_rng(3), (2,), 4)]
    y, cache = _pair(*args)
    grads = _pair_backward(np.ones(y.shape), cache)
    assert y.dtype == np.float32 and all(g.dtype == np.float32 for g in grads)


def test_bad_arguments_are_named():
    x, W_1, W_2, g1, b1, g2, b2 = _inputs(np.random.default_rng(4), (2,), 4)
    with pytest.raises(ValueError, match=r"^mlp's output of shape \(2, 3\) must have the shape \(2, 4\) of its input x"):
        parallel_residual_forward(x, lambda z: (z, None), lambda z: (z[:, :3], None), g1, b1, g2, b2)
    with pytest.raises(ValueError, match=r"^gamma_1 must have shape \(4,\) to match x of shape \(2, 4\), got shape \(3,\)$"):
        parallel_residual_forward(x, lambda z: (z, None), lambda z: (z, None), g1[:3], b1, g2, b2)
    with pytest.raises(ValueError, match=r"^beta_2 contains NaN"):
        parallel_residual_forward(x, lambda z: (z, None), lambda z: (z, None), g1, b1, g2, b2 * np.nan)
    _, cache = _pair(x, W_1, W_2, g1, b1, g2, b2)
    with pytest.raises(ValueError, match=r"^dy must have shape \(2, 4\)"):
        _pair_backward(np.ones(4), cache)
