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


@pytest.mark.parametrize("make", [lambda p: SGD(p, lr=0.5), lambda p: Adam(p, lr=0.5)])
def test_missing_and_extra_gradients_are_skipped(make):
    params = {"a": np.ones(2), "b": np.ones(2)}
    opt = make(params)
    opt.step({"a": np.array([2.0, -4.0]), "b": None, "self_attn.head_mask": np.ones(2)})
    np.testing.assert_array_equal(params["b"], np.ones(2))
    assert set(params) == {"a", "b"}
    # SGD: 1 - 0.5 g; Adam's first step moves each entry by lr against the sign of g
    expected = np.array([0.0, 3.0]) if isinstance(opt, SGD) else np.array([0.5, 1.5])
    assert_close(params["a"], expected, rtol=1e-7, what="the entry with a gradient")


@pytest.mark.parametrize("grad_dtype", [np.float32, np.float64])
def test_float32_parameters_stay_float32(grad_dtype):
    # a float64 gradient (such as one from a float64 loss) must not promote the parameter
    params = {"t": np.ones(3, np.float32)}
    for opt in (SGD(params, lr=0.1, momentum=0.9), Adam(params, lr=0.1)):
        for _ in range(2):
            opt.step({"t": np.ones(3, grad_dtype)})
            assert params["t"].dtype == np.float32


@pytest.mark.parametrize("make", [lambda p: SGD(p, lr=0.1, momentum=0.5), lambda p: Adam(p, lr=0.1)])
def test_bad_gradients_are_rejected_before_any_update(make):
    params = {"a": np.ones(3), "w": np.ones(3)}
    opt = make(params)
    bad = [
        (np.ones((2, 3)), ValueError, r"grads\['w'\] must have the shape \(3,\) of params\['w'\], got \(2, 3\)"),
        (np.ones(1), ValueError, r"grads\['w'\] must have the shape \(3,\).*got \(1,\)"),
        (np.array([1.0, np.nan, 0.0]), ValueError, r"grads\['w'\] contains NaN or infinity"),
        (np.array([1.0, np.inf, 0.0]), ValueError, r"grads\['w'\] contains NaN or infinity"),
        (np.ones(3, bool), TypeError, r"grads\['w'\] must be a real floating array, got dtype bool"),
        (np.ones(3, int), TypeError, r"grads\['w'\] must be a real floating array"),
        (np.ones(3, complex), TypeError, r"grads\['w'\] must be a real floating array"),
    ]
    for g, error, message in bad:
        with pytest.raises(error, match=message):
            opt.step({"a": np.ones(3), "w": g})
        # nothing moved, not even the parameter whose gradient was fine
        np.testing.assert_array_equal(params["a"], np.ones(3))
        np.testing.assert_array_equal(params["w"], np.ones(3))
        assert params["w"].shape == (3,)
    assert getattr(opt, "t", 0) == 0  # Adam's step count did not advance either
    with pytest.raises(TypeError, match="grads must be a dict"):
        opt.step([np.ones(3)])
    with pytest.raises(TypeError, match=r"params\['i'\] must be a floating array"):
        make({"i": np.ones(3, int)}).step({"i": np.ones(3)})


def test_bad_arguments():
    with pytest.raises(TypeError, match="params must be a dict"):
        SGD([np.ones(2)])
    with pytest.raises(ValueError, match=r"^lr must lie in \[0.0, inf\), got -0.1$"):
        SGD({}, lr=-0.1)
    assert SGD({}, lr=0.0).lr == 0.0  # a warm-up starts at 0, as torch allows
    opt = Adam({})
    with pytest.raises(ValueError, match=r"^lr must lie in \[0.0, inf\), got -1.0$"):
        opt.lr = -1.0  # a schedule's value is checked when it is set
    assert opt.lr == 0.001
    with pytest.raises(ValueError, match="momentum must lie in"):
        SGD({}, momentum=1.0)
    with pytest.raises(ValueError, match="betas must be a pair"):
        Adam({}, betas=0.9)
    with pytest.raises(ValueError, match=r"betas\[1\] must lie in"):
        Adam({}, betas=(0.9, 1.5))
    with pytest.raises(TypeError, match="lr must be a real number"):
        Adam({}, lr="fast")


def test_reprs_show_the_hyperparameters():
    assert repr(SGD({}, lr=0.1, momentum=0.9)) == "SGD(lr=0.1, momentum=0.9)"
    assert repr(Adam({})) == "Adam(lr=0.001, betas=(0.9, 0.999), eps=1e-08)"
