"""AdamW, global-norm gradient clipping and the cosine schedule with warm-up: against their
formulas written as plain loops, and against torch's AdamW, clip_grad_norm_ and CosineAnnealingLR."""
import math

import numpy as np
import pytest

from attention_ref import Adam, AdamW, clip_grad_norm, cosine_lr_schedule
from tests._helpers import assert_close


def _random_grads(rng, shapes, steps, dtype=np.float64, scale=1.0):
    return [{name: (scale * rng.standard_normal(shape)).astype(dtype) for name, shape in shapes.items()}
            for _ in range(steps)]


SHAPES = {"W": (3, 4), "b": (4,), "g": (2, 1, 3)}


# ------------------------------------------------------------------------------------ AdamW
def test_adamw_steps_follow_the_formula():
    rng = np.random.default_rng(0)
    theta = rng.standard_normal(5)
    params = {"t": theta.copy()}
    opt = AdamW(params, lr=0.05, betas=(0.8, 0.95), eps=1e-7, weight_decay=0.3)
    m = s = np.zeros(5)
    for t in range(1, 5):
        g = rng.standard_normal(5)
        opt.step({"t": g})
        m = 0.8 * m + 0.2 * g
        s = 0.95 * s + 0.05 * g * g
        theta = theta * (1 - 0.05 * 0.3) - 0.05 * (m / (1 - 0.8 ** t)) / (np.sqrt(s / (1 - 0.95 ** t)) + 1e-7)
        assert_close(params["t"], theta, what=f"AdamW step {t}")


def test_adamw_without_decay_is_adam():
    rng = np.random.default_rng(1)
    grads = _random_grads(rng, SHAPES, 4)
    start = {name: rng.standard_normal(shape) for name, shape in SHAPES.items()}
    a, w = dict(start), dict(start)
    adam, adamw = Adam(a, lr=0.01), AdamW(w, lr=0.01, weight_decay=0.0)
    for g in grads:
        adam.step(g)
        adamw.step(g)
    for name in SHAPES:
        np.testing.assert_array_equal(w[name], a[name])


def test_decay_is_decoupled_from_the_gradient():
    """With a zero gradient Adam's direction is 0, so one AdamW step is the decay alone:
    theta (1 - lr lambda). (Adam with an L2 term in the gradient would move by lr instead.)"""
    params = {"t": np.array([2.0, -4.0])}
    AdamW(params, lr=0.1, weight_decay=0.5).step({"t": np.zeros(2)})
    assert_close(params["t"], np.array([2.0, -4.0]) * (1 - 0.1 * 0.5), what="decay only")


@pytest.mark.parametrize("dtype, rtol", [(np.float64, 1e-12), (np.float32, 2e-6)])
@pytest.mark.parametrize("name", ["Adam", "AdamW"])
def test_against_torch_over_several_steps_with_a_schedule(name, dtype, rtol):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(2)
    start = {n: rng.standard_normal(shape).astype(dtype) for n, shape in SHAPES.items()}
    grads = _random_grads(rng, SHAPES, 8, dtype)
    kwargs = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8) | ({"weight_decay": 0.1} if name == "AdamW" else {})
    ours = dict(start)
    opt = {"Adam": Adam, "AdamW": AdamW}[name](ours, **kwargs)
    tensors = {n: torch.nn.Parameter(torch.tensor(a.copy())) for n, a in start.items()}
    reference = getattr(torch.optim, name)(list(tensors.values()), **kwargs)
    for it, g in enumerate(grads):
        lr = cosine_lr_schedule(it, 1e-2, 1e-3, 2, 6)  # the rate changes at every step, from 0
        opt.lr = lr
        reference.param_groups[0]["lr"] = lr
        opt.step(g)
        for n, t in tensors.items():
            t.grad = torch.tensor(g[n])
        reference.step()
        for n, t in tensors.items():
            assert ours[n].dtype == dtype
            assert_close(ours[n], t.detach().numpy(), rtol=rtol, atol=rtol, what=f"{name} {n} after step {it}")


def test_adamw_keeps_float32_and_never_writes_its_inputs():
    params = {"t": np.ones(3, np.float32)}
    before = params["t"]
    g = np.ones(3)
    opt = AdamW(params, lr=0.1)
    for _ in range(2):
        opt.step({"t": g})
        assert params["t"].dtype == np.float32
    np.testing.assert_array_equal(before, np.ones(3, np.float32))
    np.testing.assert_array_equal(g, np.ones(3))


@pytest.mark.parametrize("kwargs, error, message", [
    ({"lr": -1e-3}, ValueError, r"^lr must lie in \[0.0, inf\), got -0.001$"),
    ({"lr": "fast"}, TypeError, r"^lr must be a real number, got 'fast'$"),
    ({"betas": (1.0, 0.999)}, ValueError, r"^betas\[0\] must lie in \[0.0, 1.0\), got 1.0$"),
    ({"betas": (0.9, -0.1)}, ValueError, r"^betas\[1\] must lie in \[0.0, 1.0\), got -0.1$"),
    ({"betas": 0.9}, ValueError, r"^betas must be a pair \(beta1, beta2\), got 0.9$"),
    ({"eps": 0.0}, ValueError, r"^eps must lie in \(0.0, inf\), got 0.0$"),
    ({"weight_decay": -0.01}, ValueError, r"^weight_decay must lie in \[0.0, inf\), got -0.01$"),
    ({"weight_decay": float("nan")}, ValueError, r"^weight_decay must lie in \[0.0, inf\), got nan$"),
    ({"weight_decay": None}, TypeError, r"^weight_decay must be a real number, got None$"),
])
def test_adamw_refuses_bad_settings_by_name(kwargs, error, message):
    with pytest.raises(error, match=message):
        AdamW({}, **kwargs)


def test_adamw_repr():
    assert repr(AdamW({})) == "AdamW(lr=0.001, betas=(0.9, 0.999), eps=1e-08, weight_decay=0.01)"


# ------------------------------------------------------------------------------- clipping
def _clip_loop(grads, max_norm, eps):
    """The formula entry by entry: the norm of all entries together, then one factor."""
    total = 0.0
    for g in grads.values():
        for x in np.asarray(g, dtype=np.float64).ravel():
            total += float(x) * float(x)
    total = math.sqrt(total)
    factor = min(1.0, max_norm / (total + eps))
    return {n: g * factor for n, g in grads.items()}, total


@pytest.mark.parametrize("scale", [0.01, 1.0, 100.0])  # below, near and above max_norm
def test_clip_matches_the_loop(scale):
    rng = np.random.default_rng(3)
    grads = _random_grads(rng, SHAPES, 1, scale=scale)[0]
    expected, expected_norm = _clip_loop(grads, 1.0, 1e-6)
    clipped, total = clip_grad_norm(grads, 1.0)
    assert math.isclose(total, expected_norm, rel_tol=1e-13)
    for n in SHAPES:
        assert_close(clipped[n], expected[n], what=n)
    if scale == 100.0:  # clipped: the new global norm is max_norm, less eps's share
        new = math.sqrt(sum(float(np.sum(g * g)) for g in clipped.values()))
        assert math.isclose(new, total / (total + 1e-6), rel_tol=1e-12)


@pytest.mark.parametrize("dtype, rtol", [(np.float64, 1e-13), (np.float32, 2e-6)])
@pytest.mark.parametrize("max_norm", [0.05, 1.0, 50.0])
def test_clip_matches_torch(dtype, rtol, max_norm):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(4)
    grads = _random_grads(rng, SHAPES, 1, dtype)[0]
    copies = {n: g.copy() for n, g in grads.items()}
    tensors = [torch.nn.Parameter(torch.zeros(g.shape, dtype=torch.float64 if dtype == np.float64 else torch.float32))
               for g in grads.values()]
    for t, g in zip(tensors, grads.values()):
        t.grad = torch.tensor(g)
    reference_norm = float(torch.nn.utils.clip_grad_norm_(tensors, max_norm))
    clipped, total = clip_grad_norm(grads, max_norm)
    assert math.isclose(total, reference_norm, rel_tol=rtol)
    for (n, c), t in zip(clipped.items(), tensors):
        assert c.dtype == dtype
        assert_close(c, t.grad.numpy(), rtol=rtol, atol=0, what=n)
        np.testing.assert_array_equal(grads[n], copies[n])  # nothing modified in place


def test_clip_keeps_none_and_survives_huge_gradients():
    grads = {"a": np.full(4, 1e300), "b": None, "c": np.array([-1e300])}
    clipped, total = clip_grad_norm(grads, 2.0)
    assert math.isclose(total, math.sqrt(5) * 1e300, rel_tol=1e-14)  # no square overflowed
    assert clipped["b"] is None
    assert_close(clipped["a"], np.full(4, 2.0 / math.sqrt(5)), rtol=1e-14, what="a")
    zero, norm = clip_grad_norm({"a": np.zeros(3)}, 1.0)
    assert norm == 0.0 and not zero["a"].any()
    assert clip_grad_norm({}, 1.0) == ({}, 0.0)


@pytest.mark.parametrize("grads, max_norm, eps, error, message", [
    ([np.ones(2)], 1.0, 1e-6, TypeError, r"^grads must be a dict of arrays keyed like params, got list$"),
    ({"w": np.array([1.0, np.nan])}, 1.0, 1e-6, ValueError, r"^grads\['w'\] contains NaN or infinity$"),
    ({"w": np.array([1, 2])}, 1.0, 1e-6, TypeError, r"^grads\['w'\] must be a real floating array, got dtype int64$"),
    ({"w": np.ones(2)}, 0.0, 1e-6, ValueError, r"^max_norm must lie in \(0.0, inf\), got 0.0$"),
    ({"w": np.ones(2)}, -1.0, 1e-6, ValueError, r"^max_norm must lie in \(0.0, inf\), got -1.0$"),
    ({"w": np.ones(2)}, 1.0, -1e-6, ValueError, r"^eps must lie in \[0.0, inf\), got -1e-06$"),
])
def test_clip_refuses_bad_input_by_name(grads, max_norm, eps, error, message):
    with pytest.raises(error, match=message):
        clip_grad_norm(grads, max_norm, eps)


# ------------------------------------------------------------------------------- schedule
def _schedule_loop(it, lr_max, lr_min, t_w, t_c):
    """The three cases as written in the docstring."""
    if it < t_w:
        return it / t_w * lr_max
    if it <= t_c:
        return lr_min + 0.5 * (1 + math.cos((it - t_w) / (t_c - t_w) * math.pi)) * (lr_max - lr_min)
    return lr_min


def test_schedule_at_hand_checked_iterations():
    values = [cosine_lr_schedule(it, 1.0, 0.1, 7, 21) for it in range(25)]
    assert values[0] == 0.0
    assert math.isclose(values[1], 1 / 7, rel_tol=1e-15)
    assert values[7] == 1.0  # the end of the warm-up is the top
    assert math.isclose(values[14], 0.55, rel_tol=1e-15)  # half-way down: (max + min) / 2
    assert math.isclose(values[21], 0.1, rel_tol=1e-15) and values[22:] == [0.1] * 3
    assert all(a >= b for a, b in zip(values[7:], values[8:]))  # never rises after the warm-up
    for it, v in enumerate(values):
        assert math.isclose(v, _schedule_loop(it, 1.0, 0.1, 7, 21), rel_tol=1e-15, abs_tol=1e-15)


def test_schedule_edge_settings():
    assert cosine_lr_schedule(0, 3e-4, 3e-5, 0, 10) == 3e-4  # no warm-up: the top at once
    assert cosine_lr_schedule(5, 3e-4, 3e-5, 5, 5) == 3e-4  # an empty decay: the top, then min
    assert cosine_lr_schedule(6, 3e-4, 3e-5, 5, 5) == 3e-5
    assert cosine_lr_schedule(np.int64(3), 2.0, 2.0, 0, 4) == 2.0


def test_schedule_decay_is_torchs_cosine_annealing():
    torch = pytest.importorskip("torch")
    t_w, t_c, lr_max, lr_min = 4, 19, 3e-3, 2e-4
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=lr_max)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=t_c - t_w, eta_min=lr_min)
    for epoch in range(t_c - t_w + 1):
        assert math.isclose(cosine_lr_schedule(t_w + epoch, lr_max, lr_min, t_w, t_c), scheduler.get_last_lr()[0],
                            rel_tol=1e-12), epoch
        opt.step()
        scheduler.step()


@pytest.mark.parametrize("args, error, message", [
    ((-1, 1.0, 0.1, 2, 5), ValueError, r"^it must be a non-negative integer, got -1$"),
    ((1.5, 1.0, 0.1, 2, 5), TypeError, r"^it must be a non-negative integer, got 1.5$"),
    ((1, 1.0, 0.1, 5, 2), ValueError, r"^cosine_cycle_iters must be >= warmup_iters = 5 \(the iteration where"),
    ((1, 0.1, 1.0, 2, 5), ValueError, r"^max_learning_rate must be >= min_learning_rate = 1.0, got 0.1$"),
    ((1, 1.0, -0.1, 2, 5), ValueError, r"^min_learning_rate must lie in \[0.0, inf\), got -0.1$"),
    ((1, 1.0, 0.1, -2, 5), ValueError, r"^warmup_iters must be a non-negative integer, got -2$"),
    ((1, True, 0.1, 2, 5), TypeError, r"^max_learning_rate must be a real number, got True$"),
])
def test_schedule_refuses_bad_input_by_name(args, error, message):
    with pytest.raises(error, match=message):
        cosine_lr_schedule(*args)
