"""The mixture of experts with plain SwiGLU experts (Qwen3-MoE, DeepSeek-V3; nn/moe.py's
``swiglu_moe_forward``) and DeepSeek-V3's grouped sigmoid routing (nn/moe_routing.py's
``order="sigmoid_topk"``): against loops written from the description, and finite differences in
float64 with the choice of experts (and of groups) far from ties."""
import math

import numpy as np
import pytest

from attention_ref.nn.moe import swiglu_moe_backward, swiglu_moe_forward
from attention_ref.nn.moe_routing import Routing, router_backward, router_forward
from _helpers import assert_close, check_gradients

SIGMOID = [Routing(2, "sigmoid_topk"), Routing(2, "sigmoid_topk", True, 4, 2, 2.5),
           Routing(3, "sigmoid_topk", True, 2, 1, 1.0), Routing(1, "sigmoid_topk", False, 4, 1, 0.5)]


def _sig(z):
    return 1 / (1 + math.exp(-z))


def _sigmoid_route_loop(logits, bias, routing):
    """One token's experts and weights, from the description: scores, groups by their two best
    biased scores, the k best biased scores in the kept groups, the unbiased scores as weights."""
    E, G = len(logits), routing.n_group
    s = [_sig(v) for v in logits]
    c = [s[e] + bias[e] for e in range(E)]
    size = E // G
    group_score = [sum(sorted(c[g * size:(g + 1) * size], reverse=True)[:2]) for g in range(G)]
    kept = sorted(range(G), key=lambda g: (-group_score[g], g))[:routing.topk_group]
    candidates = [e for e in range(E) if e // size in kept]
    chosen = sorted(candidates, key=lambda e: (-c[e], e))[:routing.top_k]
    w = [s[e] for e in chosen]
    if routing.normalise:
        w = [v / (sum(w) + 1e-20) for v in w]
    return chosen, [routing.scaling * v for v in w]


def _margins(x, W_router, bias, routing):
    """The smallest gap at each discrete choice: between the k-th and (k+1)-th biased score of the kept
    groups, and between the kept groups' scores and the next one."""
    c = 1 / (1 + np.exp(-(x @ W_router))) + bias  # (T, E)
    T, E = c.shape
    size = E // routing.n_group
    g = np.sort(np.sort(c.reshape(T, routing.n_group, size), -1)[..., -2:].sum(-1), -1)[:, ::-1]  # (T, G)
    gap = np.inf if routing.topk_group == routing.n_group else (g[:, routing.topk_group - 1] -
                                                                g[:, routing.topk_group]).min()
    return gap, c


def _draw(rng, routing, T=10, D=6, E=8, F=4):
    for _ in range(2000):
        x, W_router = rng.standard_normal((T, D)), rng.standard_normal((D, E))
        bias = 0.3 * rng.standard_normal(E)
        W_gate, W_up, W_down = rng.standard_normal((E, D, F)), rng.standard_normal((E, D, F)), rng.standard_normal((E, F, D))
        if routing.order != "sigmoid_topk":  # the choice reads the logits' order
            gap, c, bias = np.inf, x @ W_router, np.zeros(E)
        else:
            gap, c = _margins(x, W_router, bias, routing)
        w, idx, _, _ = router_forward(x, W_router, np.zeros(E), routing,
                                      bias if routing.order == "sigmoid_topk" else None)
        chosen = np.take_along_axis(c, idx, -1).min(-1)  # (T,)
        rest = c.copy()
        np.put_along_axis(rest, idx, -np.inf, -1)
        if gap > 1e-2 and (chosen - rest.max(-1)).min() > 1e-2 or (
                gap > 1e-2 and routing.topk_group < routing.n_group and _kept_far(c, idx, routing)):
            return x, W_router, bias, W_gate, W_up, W_down
    raise AssertionError("no draw far from ties")


def _kept_far(c, idx, routing):
    """Within the kept groups, the k-th chosen is 1e-2 above the next candidate."""
    T, E = c.shape
    size = E // routing.n_group
    for t in range(T):
        groups = set(int(e) // size for e in idx[t])
        rest = [c[t, e] for e in range(E) if e not in idx[t] and e // size in groups]
        if rest and c[t, idx[t]].min() - max(rest) < 1e-2:
            return False
    return True


# ------------------------------------------------------------------------ DeepSeek-V3's router
@pytest.mark.parametrize("routing", SIGMOID, ids=str)
def test_sigmoid_router_matches_loop(routing):
    x, W_router, bias, *_ = _draw(np.random.default_rng(0), routing)
    w, idx, logits, _ = router_forward(x, W_router, np.zeros(8), routing, bias)
    for t in range(len(x)):
        chosen, weights = _sigmoid_route_loop(logits[t], bias, routing)
        assert idx[t].tolist() == chosen
        assert_close(w[t], weights, what=f"token {t}'s weights")


def test_the_bias_moves_the_choice_not_the_weights():
    """A bias large enough for expert 3 chooses it, with its unbiased score as its weight."""
    x, W = np.array([[1.0]]), np.array([[2.0, 1.0, 0.5, -1.0]])
    routing = Routing(1, "sigmoid_topk", False, 2, 1, 1.0)
    _, idx, _, _ = router_forward(x, W, np.zeros(4), routing)
    w, idx_biased, _, _ = router_forward(x, W, np.zeros(4), routing, np.array([0.0, 0.0, 0.0, 5.0]))
    assert idx.tolist() == [[0]] and idx_biased.tolist() == [[3]]
    assert_close(w, [[_sig(-1.0)]])


def test_groups_restrict_the_choice():
    """Expert 2 has the second best score, but its group (2, 3) loses to (0, 1): with one group kept,
    the second choice is expert 1."""
    W = np.array([[3.0, 1.0, 2.0, -3.0]])
    _, idx, _, _ = router_forward(np.ones((1, 1)), W, np.zeros(4), Routing(2, "sigmoid_topk", False, 2, 1))
    _, idx_all, _, _ = router_forward(np.ones((1, 1)), W, np.zeros(4), Routing(2, "sigmoid_topk", False, 2, 2))
    assert idx.tolist() == [[0, 1]] and idx_all.tolist() == [[0, 2]]


@pytest.mark.parametrize("routing", SIGMOID, ids=str)
def test_sigmoid_router_backward_gradcheck(routing):
    x, W_router, bias, *_ = _draw(np.random.default_rng(1), routing)
    b = np.zeros(8)

    def forward(x, W_router):
        w, _, _, cache = router_forward(x, W_router, b, routing, bias)
        return w, cache
    check_gradients(forward, lambda dw, cache: router_backward(dw, cache)[:2], x, W_router, names=["x", "W_router"])


def test_grouped_routing_is_checked_by_name():
    x, W, b = np.zeros((1, 2)), np.zeros((2, 6)), np.zeros(6)
    with pytest.raises(ValueError, match=r"^routing.n_group = 4 must divide the 6 experts into groups of at least 2"):
        router_forward(x, W, b, Routing(2, "sigmoid_topk", n_group=4))
    with pytest.raises(ValueError, match=r"^routing.topk_group = 3 must be at most routing.n_group = 2"):
        router_forward(x, W, b, Routing(2, "sigmoid_topk", n_group=2, topk_group=3))
    with pytest.raises(ValueError, match=r"^routing.n_group, routing.topk_group and routing.scaling apply to"):
        router_forward(x, W, b, Routing(2, "softmax_topk", scaling=2.0))
    with pytest.raises(ValueError, match=r"^choice_bias applies to routing.order='sigmoid_topk' only$"):
        router_forward(x, W, b, Routing(2, "softmax_topk"), np.zeros(6))
    with pytest.raises(ValueError, match=r"^choice_bias must have shape \(6,\), got \(5,\)$"):
        router_forward(x, W, b, Routing(2, "sigmoid_topk"), np.zeros(5))


# ------------------------------------------------------------------------ the mixture of SwiGLU experts
def _swiglu_loop(x, W_gate, W_up, W_down):
    F = W_gate.shape[1]
    h = []
    for j in range(F):
        a = sum(x[i] * W_gate[i, j] for i in range(len(x)))
        u = sum(x[i] * W_up[i, j] for i in range(len(x)))
        h.append(a * _sig(a) * u)
    return np.array([sum(h[j] * W_down[j, o] for j in range(F)) for o in range(W_down.shape[1])])


def _softmax_route_loop(logits, routing):
    z = sum(math.exp(v) for v in logits)
    chosen = sorted(range(len(logits)), key=lambda e: (-logits[e], e))[:routing.top_k]
    w = [math.exp(logits[e]) / z for e in chosen]
    return chosen, [v / sum(w) for v in w] if routing.normalise else w


MIXTURES = [Routing(2, "softmax_topk", True), Routing(3, "softmax_topk"), Routing(2, "sigmoid_topk", True, 4, 2, 2.5)]


@pytest.mark.parametrize("routing", MIXTURES, ids=str)
def test_swiglu_moe_matches_loop(routing):
    x, W_router, bias, W_gate, W_up, W_down = _draw(np.random.default_rng(2), routing)
    bias = bias if routing.order == "sigmoid_topk" else None
    y, _ = swiglu_moe_forward(x.reshape(2, 5, -1), W_router, W_gate, W_up, W_down, routing, bias)
    for t in range(len(x)):
        logits = x[t] @ W_router
        chosen, weights = (_sigmoid_route_loop(logits, bias, routing) if bias is not None
                           else _softmax_route_loop(logits, routing))
        expected = sum(w * _swiglu_loop(x[t], W_gate[e], W_up[e], W_down[e]) for e, w in zip(chosen, weights))
        assert_close(y.reshape(len(x), -1)[t], expected, what=f"token {t}")


@pytest.mark.parametrize("routing", MIXTURES, ids=str)
def test_swiglu_moe_backward_gradcheck(routing):
    x, W_router, bias, W_gate, W_up, W_down = _draw(np.random.default_rng(3), routing)
    bias = bias if routing.order == "sigmoid_topk" else None
    check_gradients(lambda *a: swiglu_moe_forward(*a, routing, bias), swiglu_moe_backward, x, W_router, W_gate,
                    W_up, W_down, names=["x", "W_router", "W_gate", "W_up", "W_down"])


def test_swiglu_moe_float32_and_bad_shapes():
    x, W_router, _, W_gate, W_up, W_down = (a.astype(np.float32) for a in _draw(np.random.default_rng(4),
                                                                                 MIXTURES[0]))
    y, cache = swiglu_moe_forward(x, W_router, W_gate, W_up, W_down, MIXTURES[0])
    assert y.dtype == np.float32 and all(g.dtype == np.float32 for g in swiglu_moe_backward(np.ones_like(y), cache))
    with pytest.raises(ValueError, match=r"^W_down must have shape \(8, 4, 6\) for 8 experts of width 4 and D = 6,"
                                         r" got \(8, 6, 4\)$"):
        swiglu_moe_forward(x, W_router, W_gate, W_up, W_down.swapaxes(1, 2), MIXTURES[0])
