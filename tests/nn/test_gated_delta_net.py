"""gated_delta_net_forward / gated_delta_net_backward: Qwen3-Next's linear-attention layer as steps of
pairs; its gradients against finite differences and its decoding (state carried) against the sequence."""
import numpy as np
import pytest

from attention_ref.nn.gated_delta_net import (DeltaNetShape, gated_delta_net_backward, gated_delta_net_forward)
from _helpers import assert_close, check_gradients

SHAPE = DeltaNetShape(key_heads=2, key_dim=3, value_heads=4, value_dim=2, eps=1e-6)
D, K = 5, 3


def delta_net_params(rng, shape=SHAPE, d=D, kw=K, scale=0.5):
    hk, dk, hv, dv, _ = shape
    c = 2 * hk * dk + hv * dv
    return {"in_proj_qkvz.W": scale * rng.standard_normal((d, 2 * hk * dk + 2 * hv * dv)),
            "in_proj_ba.W": scale * rng.standard_normal((d, 2 * hv)),
            "conv1d.weight": scale * rng.standard_normal((c, kw)),
            "dt_bias": rng.standard_normal(hv), "A_log": np.log(rng.uniform(0.5, 4.0, hv)),
            "norm.weight": 1 + 0.1 * rng.standard_normal(dv), "out_proj.W": scale * rng.standard_normal((hv * dv, d))}


def test_gradients():
    rng = np.random.default_rng(0)
    x, params = rng.standard_normal((2, 4, D)), delta_net_params(rng)
    check_gradients(lambda x, p: gated_delta_net_forward(x, p, SHAPE), gated_delta_net_backward, x, params,
                    names=["x", "params"])


def test_decoding_carries_the_window_and_the_state():
    rng = np.random.default_rng(1)
    x, params = rng.standard_normal((2, 6, D)), delta_net_params(rng)
    y, cache = gated_delta_net_forward(x, params, SHAPE)
    y3, c = gated_delta_net_forward(x[:, :3], params, SHAPE)  # a prompt of 3, then one token at a time
    assert_close(y3, y[:, :3], what="prompt")
    state = c.state
    for t in range(3, 6):
        y_t, c = gated_delta_net_forward(x[:, t:t + 1], params, SHAPE, state)
        assert_close(y_t[:, 0], y[:, t], what=f"token {t}")
        state = c.state
    assert_close(state.recurrent, cache.state.recurrent, what="final state")
    assert_close(state.window, cache.state.window, what="final window")


def test_refuses_a_wrong_weight_by_name():
    params = delta_net_params(np.random.default_rng(2))
    params["A_log"] = params["A_log"][:3]
    with pytest.raises(ValueError, match=r"^params\['A_log'\] must have shape \(4,\), got \(3,\)$"):
        gated_delta_net_forward(np.ones((1, 2, D)), params, SHAPE)
