"""SGD with momentum and Adam: one step against the formulas, convergence to a known minimum."""
import numpy as np
import pytest

from attention_ref import SGD, Adam
from tests._helpers import assert_close

# f(w) = 0.5 (w - w*)^T A (w - w*) + 0.5 |B - B*|^2: minimum exactly at (w*, B*)
A = np.array([[3.0, 0.5, 0.0], [0.5, 1.0, 0.2], [0.0, 0.2, 0.5]])  # symmetric positive definite
W_STAR = np.array([1.0, -2.0, 0.5])
B_STAR = np.array([[0.3, -0.7], [1.5, 0.0]])


def _grads(p):
    return {"w": A @ (p["w"] - W_STAR), "B": p["B"] - B_STAR}


def _minimise(opt, params, steps):
    for _ in range(steps):  # optimisation is sequential
        opt.step(_grads(params))
    return params


def test_sgd_momentum_finds_the_known_minimum():
    params = {"w": np.zeros(3), "B": np.zeros((2, 2))}
    _minimise(SGD(params, lr=0.1, momentum=0.9), params, 400)
    assert_close(params["w"], W_STAR, atol=1e-8, what="w")
    assert_close(params["B"], B_STAR, atol=1e-8, what="B")


def test_adam_finds_the_known_minimum():
    params = {"w": np.zeros(3), "B": np.zeros((2, 2))}
    opt = Adam(params, lr=0.05)
    _minimise(opt, params, 2000)
    assert_close(params["w"], W_STAR, atol=1e-4, what="w")
    assert_close(params["B"], B_STAR, atol=1e-4, what="B")


def test_sgd_steps_follow_the_formula():
    rng = np.random.default_rng(0)
    theta0 = rng.standard_normal(4)
    theta0_copy = theta0.copy()
    g1, g2 = rng.standard_normal(4), rng.standard_normal(4)
    params = {"t": theta0}
    opt = SGD(params, lr=0.3, momentum=0.5)
    opt.step({"t": g1})
    opt.step({"t": g2})
    v1 = g1
    v2 = 0.5 * v1 + g2
    assert_close(params["t"], theta0 - 0.3 * v1 - 0.3 * v2, what="two SGD steps")
    np.testing.assert_array_equal(theta0, theta0_copy)  # the old array is never modified


def test_adam_steps_follow_the_formula():
    rng = np.random.default_rng(1)
    theta = rng.standard_normal(3)
    gs = [rng.standard_normal(3) for _ in range(3)]
    params = {"t": theta.copy()}
    opt = Adam(params, lr=0.1, betas=(0.8, 0.9), eps=1e-6)
    m = s = np.zeros(3)
    for t, g in enumerate(gs, start=1):
        opt.step({"t": g})
        m = 0.8 * m + 0.2 * g
        s = 0.9 * s + 0.1 * g * g
        theta = theta - 0.1 * (m / (1 - 0.8 ** t)) / (np.sqrt(s / (1 - 0.9 ** t)) + 1e-6)
        assert_close(params["t"], theta, what=f"Adam step {t}")


def test_first_adam_step_moves_each_entry_by_lr():
    # with bias correction, m_hat = g and s_hat = g^2 after one step: |update| = lr
    params = {"t": np.zeros(4)}
    Adam(params, lr=0.01, eps=1e-12).step({"t": np.array([1e-3, -5.0, 20.0, -0.1])})
    assert_close(params["t"], np.array([-0.01, 0.01, -0.01, 0.01]), rtol=1e-8, what="first step")


def test_missing_and_extra_gradients_are_skipped():
    params = {"a": np.ones(2), "b": np.ones(2)}
    for opt in (SGD(params, lr=0.5), Adam(params, lr=0.5)):
        opt.step({"a": np.ones(2), "b": None, "self_attn.head_mask": np.ones(2)})
    np.testing.assert_array_equal(params["b"], np.ones(2))
    assert set(params) == {"a", "b"}
    assert np.all(params["a"] < 1)


def test_float32_parameters_stay_float32():
    params = {"t": np.ones(3, np.float32)}
    for opt in (SGD(params, lr=0.1, momentum=0.9), Adam(params, lr=0.1)):
        opt.step({"t": np.ones(3, np.float32)})
        assert params["t"].dtype == np.float32


def test_bad_arguments():
    with pytest.raises(TypeError, match="params must be a dict"):
        SGD([np.ones(2)])
    with pytest.raises(ValueError, match=r"lr must lie in \(0.0, inf\)"):
        SGD({}, lr=0.0)
    with pytest.raises(ValueError, match="momentum must lie in"):
        SGD({}, momentum=1.0)
    with pytest.raises(ValueError, match="betas must be a pair"):
        Adam({}, betas=0.9)
    with pytest.raises(ValueError, match=r"betas\[1\] must lie in"):
        Adam({}, betas=(0.9, 1.5))
    with pytest.raises(TypeError, match="lr must be a real number"):
        Adam({}, lr="fast")
