"""Qwen3-MoE's decoder block (nn/qwen3_moe_block.py): its backward against finite differences in float64 on a MoE
layer (routing 1e-3 from any tie) and a dense one, and its bad inputs named. Against transformers:
tests/interop/test_qwen3_moe_block_against_transformers.py."""
import numpy as np
import pytest

from attention_ref.nn.moe_routing import Routing
from attention_ref.nn.qwen3_moe_block import Qwen3MoeLayer, qwen3_moe_block_backward, qwen3_moe_block_forward
from _helpers import check_gradients

D, H, HKV, DH, E, F = 8, 2, 1, 4, 4, 3
THETA = 100.0 ** (-np.arange(0, DH, 2) / DH)


def _params(rng, moe):
    p = {"input_norm.weight": 1 + 0.2 * rng.standard_normal(D), "post_attention_norm.weight": 1 + 0.2 * rng.standard_normal(D),
         "self_attn.q_norm.weight": 1 + 0.2 * rng.standard_normal(DH), "self_attn.k_norm.weight": 1 + 0.2 * rng.standard_normal(DH),
         "self_attn.W_q": 0.5 * rng.standard_normal((D, H * DH)), "self_attn.W_k": 0.5 * rng.standard_normal((D, HKV * DH)),
         "self_attn.W_v": 0.5 * rng.standard_normal((D, HKV * DH)), "self_attn.W_o": 0.5 * rng.standard_normal((H * DH, D))}
    if not moe:
        return {**p, "mlp.W_gate": rng.standard_normal((D, 6)), "mlp.W_up": rng.standard_normal((D, 6)),
                "mlp.W_down": 0.5 * rng.standard_normal((6, D))}
    return {**p, "mlp.W_router": rng.standard_normal((D, E)), "mlp.experts.W_gate": rng.standard_normal((E, D, F)),
            "mlp.experts.W_up": rng.standard_normal((E, D, F)), "mlp.experts.W_down": 0.5 * rng.standard_normal((E, F, D))}


@pytest.mark.parametrize("moe", [True, False], ids=["moe", "dense"])
def test_qwen3_moe_block_gradcheck(moe):
    layer = Qwen3MoeLayer(H, HKV, 1e-6, THETA, Routing(2, "softmax_topk", True) if moe else None)
    rng = np.random.default_rng(0)
    for _ in range(100):
        p, x = _params(rng, moe), rng.standard_normal((1, 4, D))
        _, cache = qwen3_moe_block_forward(x, p, layer)
        top = np.sort(cache.mlp.router.p, -1)[:, ::-1] if moe else None
        if not moe or (top[:, 1] - top[:, 2]).min() > 1e-3:
            break
    else:
        raise AssertionError("no draw far from ties")
    check_gradients(lambda x, p: qwen3_moe_block_forward(x, p, layer), qwen3_moe_block_backward, x, p,
                    names=["x", "params"])


def test_qwen3_moe_block_bad_inputs_are_named():
    rng = np.random.default_rng(1)
    p, x = _params(rng, True), rng.standard_normal((1, 4, D))
    layer = Qwen3MoeLayer(H, HKV, 1e-6, THETA, Routing(2, "softmax_topk", True))
    with pytest.raises(ValueError, match=r"^params\['mlp.experts.W_down'\] must have shape \(4, 3, 8\) for x of"
                                         r" width 8, got \(4, 8, 3\)$"):
        qwen3_moe_block_forward(x, {**p, "mlp.experts.W_down": p["mlp.experts.W_down"].swapaxes(1, 2)}, layer)
    with pytest.raises(ValueError, match=r"^params lack \['mlp.W_gate', 'mlp.W_up', 'mlp.W_down'\] \(a dense layer\)$"):
        qwen3_moe_block_forward(x, p, layer._replace(routing=None))
    with pytest.raises(ValueError, match=r"^layer.theta must have shape \(2,\) \(head_dim / 2\), got \(3,\)$"):
        qwen3_moe_block_forward(x, p, layer._replace(theta=np.ones(3)))
