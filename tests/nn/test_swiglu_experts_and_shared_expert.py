"""moe_forward(expert="swiglu") (Qwen3-Next's and Qwen3-MoE's plain SwiGLU experts) and the gated shared expert
(gated_shared_expert_forward / _backward): against loops and finite differences."""
import numpy as np
import pytest

from attention_ref.nn.moe import moe_backward, moe_forward
from attention_ref.nn.moe_routing import Routing
from attention_ref.nn.shared_expert import gated_shared_expert_backward, gated_shared_expert_forward
from _helpers import assert_close, check_gradients

E, D, F, T = 4, 5, 3, 8


def _silu(a):
    return a / (1.0 + np.exp(-a))


def _draw(rng):
    """Router weights giving each token probabilities at least 0.02 apart (no near ties to flip under the
    finite differences' steps)."""
    while True:
        x, W_router = rng.standard_normal((T, D)), 2 * rng.standard_normal((D, E))
        logits = x @ W_router
        p = np.exp(logits - logits.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        if np.diff(np.sort(p, axis=1), axis=1).min() > 0.02:
            break
    return (x, W_router, np.zeros(E), 0.5 * rng.standard_normal((E, D, 2 * F)), 0.1 * rng.standard_normal((E, 2 * F)),
            0.5 * rng.standard_normal((E, F, D)), 0.1 * rng.standard_normal((E, D)))


def test_swiglu_experts_match_loop():
    x, W_router, b_router, W_gate_up, b_gate_up, W_down, b_down = _draw(np.random.default_rng(0))
    routing = Routing(2, "softmax_topk", True)
    y, _ = moe_forward(x, W_router, b_router, W_gate_up, b_gate_up, W_down, b_down, routing, expert="swiglu")
    for t in range(T):
        logits = x[t] @ W_router
        p = np.exp(logits - logits.max())
        p /= p.sum()
        chosen = np.argsort(-p)[:2]
        weights = p[chosen] / p[chosen].sum()
        expected = 0
        for e, w in zip(chosen, weights):
            au = x[t] @ W_gate_up[e] + b_gate_up[e]
            expected = expected + w * ((_silu(au[:F]) * au[F:]) @ W_down[e] + b_down[e])
        assert_close(y[t], expected, what=f"token {t}")


@pytest.mark.parametrize("routing", [Routing(2, "softmax_topk", True), Routing(2, "softmax_topk")], ids=str)
def test_swiglu_experts_gradcheck(routing):
    inputs = _draw(np.random.default_rng(1))
    names = ["x", "W_router", "b_router", "W_gate_up", "b_gate_up", "W_down", "b_down"]
    check_gradients(lambda *a: moe_forward(*a, routing, expert="swiglu"), moe_backward, *inputs, names=names)


def test_unknown_expert_is_refused_by_name():
    with pytest.raises(ValueError, match=r"^expert must be one of \('clamped_swiglu', 'swiglu'\), got 'gelu'$"):
        moe_forward(*_draw(np.random.default_rng(2)), Routing(2), expert="gelu")


def test_gated_shared_expert():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, D))
    W_gate, W_up, W_down, w_gate = (rng.standard_normal(s) for s in ((D, F), (D, F), (F, D), (D, 1)))
    y, _ = gated_shared_expert_forward(x, W_gate, W_up, W_down, w_gate)
    expected = (_silu(x @ W_gate) * (x @ W_up)) @ W_down / (1 + np.exp(-(x @ w_gate)))
    assert_close(y, expected, what="sigmoid(x w) SwiGLU(x)")
    check_gradients(gated_shared_expert_forward, gated_shared_expert_backward, x, W_gate, W_up, W_down, w_gate,
                    names=["x", "W_gate", "W_up", "W_down", "w_gate"])
    with pytest.raises(ValueError, match=r"^w_gate must have shape \(5, 1\), got \(5, 2\)$"):
        gated_shared_expert_forward(x, W_gate, W_up, W_down, np.ones((D, 2)))
