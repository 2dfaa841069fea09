"""gpt-oss's mixture of experts: the router and its routing description (nn/moe_routing.py), the
clamped SwiGLU expert (nn/clamped_swiglu.py), the whole layer (nn/moe.py) and the load-balancing
loss (nn/load_balancing.py): against plain loops, by hand, and finite differences in float64 with
inputs far from ties and from the clamps' ends."""
import math

import numpy as np
import pytest

from attention_ref.nn.clamped_swiglu import clamped_swiglu_backward, clamped_swiglu_forward
from attention_ref.nn.load_balancing import load_balancing_loss_backward, load_balancing_loss_forward
from attention_ref.nn.moe import moe_backward, moe_forward
from attention_ref.nn.moe_routing import Routing, router_backward, router_forward
from _helpers import assert_close, check_gradients

LIMIT, ALPHA = 7.0, 1.702


def _sigmoid(z):
    return 1 / (1 + math.exp(-z))


def _expert_loop(x, W_gate_up, b_gate_up, W_down, b_down, alpha=ALPHA, limit=LIMIT):
    """One token through one expert, unit by unit, from the formula."""
    F = W_gate_up.shape[1] // 2
    h = []
    for j in range(F):
        gate = sum(x[i] * W_gate_up[i, 2 * j] for i in range(len(x))) + b_gate_up[2 * j]
        up = sum(x[i] * W_gate_up[i, 2 * j + 1] for i in range(len(x))) + b_gate_up[2 * j + 1]
        gate, up = min(gate, limit), min(max(up, -limit), limit)
        h.append((up + 1) * gate * _sigmoid(alpha * gate))
    return np.array([sum(h[j] * W_down[j, o] for j in range(F)) + b_down[o] for o in range(W_down.shape[1])])


def _route_loop(logits, routing):
    """One token's experts and weights, from the description."""
    order = sorted(range(len(logits)), key=lambda e: (-logits[e], e))
    if routing.order == "topk_softmax":
        chosen = order[:routing.top_k]
        z = sum(math.exp(logits[e]) for e in chosen)
        return chosen, [math.exp(logits[e]) / z for e in chosen]
    z = sum(math.exp(v) for v in logits)
    chosen = order[:routing.top_k]
    w = [math.exp(logits[e]) / z for e in chosen]
    return chosen, [v / sum(w) for v in w] if routing.normalise else w


def _draw(rng, T=10, D=6, E=5, F=4, k=2, scale_gate_up=1.5):
    """Weights whose routing has no near tie and whose gate/up values stay 1e-2 from the clamps."""
    for _ in range(500):
        x = rng.standard_normal((T, D))
        W_router, b_router = rng.standard_normal((D, E)), rng.standard_normal(E)
        W_gate_up, b_gate_up = scale_gate_up * rng.standard_normal((E, D, 2 * F)), rng.standard_normal((E, 2 * F))
        W_down, b_down = 0.5 * rng.standard_normal((E, F, D)), rng.standard_normal((E, D))
        l = np.sort(x @ W_router + b_router, axis=-1)[:, ::-1]
        gu = np.einsum("td,edf->tef", x, W_gate_up) + b_gate_up
        if (l[:, k - 1] - l[:, k]).min() > 1e-2 and np.abs(np.abs(gu) - LIMIT).min() > 1e-2 \
                and (gu[..., ::2] > LIMIT).any() and (np.abs(gu[..., 1::2]) > LIMIT).any():
            return x, W_router, b_router, W_gate_up, b_gate_up, W_down, b_down
    raise AssertionError("no draw far from ties and clamps")


ROUTINGS = [Routing(2), Routing(1), Routing(3), Routing(2, "softmax_topk"), Routing(2, "softmax_topk", True)]


# ------------------------------------------------------------------------ the router
@pytest.mark.parametrize("routing", ROUTINGS, ids=str)
def test_router_matches_loop(routing):
    x, W_router, b_router, *_ = _draw(np.random.default_rng(0))
    w, idx, logits, _ = router_forward(x, W_router, b_router, routing)
    assert_close(logits, x @ W_router + b_router)
    for t in range(len(x)):
        chosen, weights = _route_loop(logits[t], routing)
        assert idx[t].tolist() == chosen
        assert_close(w[t], weights, what=f"token {t}'s weights")


@pytest.mark.parametrize("routing", ROUTINGS, ids=str)
def test_router_backward_gradcheck(routing):
    x, W_router, b_router, *_ = _draw(np.random.default_rng(1))

    def forward(x, W_router, b_router):
        w, _, _, cache = router_forward(x, W_router, b_router, routing)
        return w, cache
    check_gradients(forward, router_backward, x, W_router, b_router, names=["x", "W_router", "b_router"])


def test_ties_go_to_the_lower_expert():
    w, idx, _, _ = router_forward(np.zeros((1, 2)), np.zeros((2, 4)), np.array([0.0, 1.0, 1.0, 1.0]), Routing(2))
    assert idx.tolist() == [[1, 2]] and w.tolist() == [[0.5, 0.5]]


def test_routing_is_checked_by_name():
    x, W, b = np.zeros((1, 2)), np.zeros((2, 3)), np.zeros(3)
    with pytest.raises(ValueError, match=r"^routing.top_k = 4 is more than the 3 experts$"):
        router_forward(x, W, b, Routing(4))
    with pytest.raises(ValueError, match=r"^routing.order must be one of \('topk_softmax', 'softmax_topk',"
                                         r" 'sigmoid_topk'\), got 'sigmoid'$"):
        router_forward(x, W, b, Routing(2, "sigmoid"))
    with pytest.raises(ValueError, match=r"^routing.normalise applies to order='softmax_topk' or 'sigmoid_topk' only"):
        router_forward(x, W, b, Routing(2, normalise=True))
    with pytest.raises(TypeError, match=r"^routing must be an attention_ref.nn.Routing, got dict$"):
        router_forward(x, W, b, {"top_k": 2})


# ------------------------------------------------------------------------ one expert
def test_expert_matches_loop_and_reaches_both_clamps():
    x, _, _, W_gate_up, b_gate_up, W_down, b_down = _draw(np.random.default_rng(2))
    y, cache = clamped_swiglu_forward(x, W_gate_up[0], b_gate_up[0], W_down[0], b_down[0])
    for t in range(len(x)):
        assert_close(y[t], _expert_loop(x[t], W_gate_up[0], b_gate_up[0], W_down[0], b_down[0]), what=f"token {t}")
    assert not cache.g_passes.all() or not cache.u_passes.all()  # the clamps are exercised


def test_expert_layout_is_interleaved():
    """Column 2j is gate unit j, column 2j + 1 is up unit j: swapping them changes the result."""
    x = np.array([[1.0]])
    W = np.array([[2.0, 0.5]])  # gate 2, up 0.5
    y, _ = clamped_swiglu_forward(x, W, np.zeros(2), np.ones((1, 1)), np.zeros(1))
    assert_close(y, [[(0.5 + 1) * 2 * _sigmoid(ALPHA * 2)]])


@pytest.mark.parametrize("e", [0, 1, 2])
def test_expert_backward_gradcheck(e):
    """Some gate and up values past the clamps, none within 1e-2 of their ends (see _draw)."""
    x, _, _, W_gate_up, b_gate_up, W_down, b_down = _draw(np.random.default_rng(3))
    check_gradients(clamped_swiglu_forward, clamped_swiglu_backward, x, W_gate_up[e], b_gate_up[e], W_down[e],
                    b_down[e], names=["x", "W_gate_up", "b_gate_up", "W_down", "b_down"])


def test_clamped_units_get_no_gradient_through_the_clamp():
    x = np.array([[1.0]])
    W = np.array([[9.0, -9.0]])  # gate 9 > 7 and up -9 < -7: both clamped
    _, cache = clamped_swiglu_forward(x, W, np.zeros(2), np.ones((1, 1)), np.zeros(1))
    dx, dW, db, dW_down, db_down = clamped_swiglu_backward(np.ones((1, 1)), cache)
    assert dx.tolist() == [[0.0]] and dW.tolist() == [[0.0, 0.0]] and db.tolist() == [0.0, 0.0]
    assert_close(dW_down, [[(-7 + 1) * 7 * _sigmoid(ALPHA * 7)]])


# ------------------------------------------------------------------------ the mixture
@pytest.mark.parametrize("routing", ROUTINGS, ids=str)
def test_moe_matches_loop(routing):
    x, W_router, b_router, W_gate_up, b_gate_up, W_down, b_down = _draw(np.random.default_rng(4))
    y, _ = moe_forward(x.reshape(2, 5, -1), W_router, b_router, W_gate_up, b_gate_up, W_down, b_down, routing)
    assert y.shape == (2, 5, x.shape[1])
    for t in range(len(x)):
        chosen, weights = _route_loop(x[t] @ W_router + b_router, routing)
        expected = sum(w * _expert_loop(x[t], W_gate_up[e], b_gate_up[e], W_down[e], b_down[e])
                       for e, w in zip(chosen, weights))
        assert_close(y.reshape(len(x), -1)[t], expected, what=f"token {t}")


@pytest.mark.parametrize("routing", [Routing(2), Routing(2, "softmax_topk", True), Routing(3, "softmax_topk")],
                         ids=str)
def test_moe_backward_gradcheck(routing):
    inputs = _draw(np.random.default_rng(5))
    names = ["x", "W_router", "b_router", "W_gate_up", "b_gate_up", "W_down", "b_down"]
    check_gradients(lambda *a: moe_forward(*a, routing), moe_backward, *inputs, names=names)


def test_unused_expert_gets_zero_gradients_and_float32_stays_float32():
    x, W_router, b_router, W_gate_up, b_gate_up, W_down, b_down = (a.astype(np.float32) for a in
                                                                   _draw(np.random.default_rng(6)))
    b_router = b_router.copy()
    b_router[4] = -100.0  # nobody picks expert 4
    y, cache = moe_forward(x, W_router, b_router, W_gate_up, b_gate_up, W_down, b_down, Routing(2))
    grads = moe_backward(np.ones_like(y), cache)
    assert y.dtype == np.float32 and all(g.dtype == np.float32 for g in grads)
    assert not grads[3][4].any() and not grads[6][4].any()


def test_moe_bad_shapes_are_named():
    x, W_router, b_router, W_gate_up, b_gate_up, W_down, b_down = _draw(np.random.default_rng(7))
    with pytest.raises(ValueError, match=r"^W_down must have shape \(5, 4, 6\) for 5 experts of width 4 and"
                                         r" D = 6, got \(5, 6, 4\)$"):
        moe_forward(x, W_router, b_router, W_gate_up, b_gate_up, W_down.swapaxes(1, 2), b_down, Routing(2))
    with pytest.raises(ValueError, match=r"^W_gate_up must have shape \(E, D, 2F\) with D = 6"):
        moe_forward(x, W_router, b_router, W_gate_up[..., :-1], b_gate_up, W_down, b_down, Routing(2))


# ------------------------------------------------------------------------ load balancing
def _aux_loop(rows, k, m):
    """E sum_e f_e P_e from the definitions, row by row."""
    E = len(rows[0])
    f, P = [0.0] * E, [0.0] * E
    for row, weight in zip(rows, m):
        z = sum(math.exp(v) for v in row)
        p = [math.exp(v) / z for v in row]
        for e in sorted(range(E), key=lambda e: (-p[e], e))[:k]:
            f[e] += weight / sum(m)
        for e in range(E):
            P[e] += weight * p[e] / sum(m)
    return E * sum(a * b for a, b in zip(f, P))


@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("masked", [False, True])
def test_load_balancing_matches_loop(k, masked):
    rng = np.random.default_rng(8)
    layers = [rng.standard_normal((6, 4)) for _ in range(3)]  # 3 layers of B S = 2 x 3 tokens
    mask = np.array([[1, 1, 0], [1, 0, 0]]) if masked else None
    loss, _ = load_balancing_loss_forward(layers, k, mask)
    m = np.tile(mask.ravel(), 3) if masked else np.ones(18)
    assert_close(loss, _aux_loop(np.concatenate(layers), k, m))


def test_uniform_routing_gives_k():
    """Equal probabilities and an even load: E sum_e (k / E) (1 / E) = k."""
    logits = np.array([[0.0, 0.0, 0.0, 0.0]] * 4)
    loss, cache = load_balancing_loss_forward(logits, 2)
    assert loss == pytest.approx(2.0, rel=1e-15)


@pytest.mark.parametrize("masked", [False, True])
def test_load_balancing_backward_gradcheck(masked):
    logits = np.random.default_rng(9).standard_normal((12, 5))
    mask = np.array([[1, 1, 1], [0, 1, 1]]) if masked else None
    check_gradients(lambda l: load_balancing_loss_forward(l, 2, mask), load_balancing_loss_backward, logits,
                    names=["router_logits"])


def test_load_balancing_bad_arguments_are_named():
    with pytest.raises(ValueError, match=r"^top_k = 5 is more than the 4 experts of router_logits \(3, 4\)$"):
        load_balancing_loss_forward(np.zeros((3, 4)), 5)
    with pytest.raises(ValueError, match=r"^attention_mask must hold 0 and 1 \(at least one 1\) for a whole"
                                         r" number of layers of 6 rows, got shape \(2, 2\)$"):
        load_balancing_loss_forward(np.zeros((6, 4)), 2, np.ones((2, 2)))
    with pytest.raises(ValueError, match=r"^router_logits must hold at least one layer's logits"):
        load_balancing_loss_forward([], 2)


def test_softmax_then_topk_renormalised_is_topk_then_softmax():
    """exp(l_j) / sum_E exp(l), renormalised over the k chosen, is exp(l_j) / sum_k exp(l): the same weights
    (lesson 19's second exercise); without the renormalisation they sum to less than 1."""
    x, W_router, b_router, *_ = _draw(np.random.default_rng(10))
    w, idx, _, _ = router_forward(x, W_router, b_router, Routing(2))
    w_norm, idx_norm, _, _ = router_forward(x, W_router, b_router, Routing(2, "softmax_topk", True))
    w_raw, _, _, _ = router_forward(x, W_router, b_router, Routing(2, "softmax_topk"))
    assert np.array_equal(idx, idx_norm)
    assert_close(w_norm, w, what="renormalised softmax-then-top-k against top-k-then-softmax")
    assert np.all(w_raw.sum(-1) < 1 - 1e-3)
