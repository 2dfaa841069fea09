"""The mixture of SwiGLU experts (nn/moe.py's ``swiglu_moe_forward``) with Qwen3-MoE's softmax routing and
DeepSeek-V3's grouped sigmoid routing (nn/moe_routing.py), against transformers' ``Qwen3MoeSparseMoeBlock``
and ``DeepseekV3MoE`` (its routed experts; the shared experts are one SwiGLU added to them), on 4.57 (one
module per expert) and 5.x (the experts' weights stacked: ``gate_up_proj`` (E, 2F, D), ``down_proj`` (E, D, F)):
outputs and every gradient at 1e-10 in float64, the routers' float32 steps run in float64 by
``moe_models_in_float64`` (the same formulas), the draws 1e-2 from any tie of the choice."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from attention_ref.interop import moe_models_in_float64  # noqa: E402
from attention_ref.nn.moe import swiglu_moe_backward, swiglu_moe_forward  # noqa: E402
from attention_ref.nn.moe_routing import Routing, router_forward  # noqa: E402
from attention_ref.nn.swiglu import swiglu_backward, swiglu_forward  # noqa: E402

FIVE = int(transformers.__version__.split(".")[0]) >= 5
D, E, F, T = 8, 8, 4, 12


def _close(ours, theirs, what):
    theirs = theirs.detach().numpy() if hasattr(theirs, "detach") else np.asarray(theirs)
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-10 * max(1.0, np.abs(theirs).max()), err_msg=what)


def _far_from_ties(rng, routing, bias_scale=0.0):
    """Weights whose choice of experts (and of groups) is 1e-2 from any tie, every biased score positive."""
    for _ in range(2000):
        x, W_router = rng.standard_normal((T, D)), rng.standard_normal((D, E))
        bias = bias_scale * rng.standard_normal(E)
        kw = {"choice_bias": bias} if routing.order == "sigmoid_topk" else {}
        w, idx, logits, _ = router_forward(x, W_router, np.zeros(E), routing, **kw)
        c = 1 / (1 + np.exp(-logits)) + bias if routing.order == "sigmoid_topk" else logits
        size = E // routing.n_group
        groups = np.sort(np.sort(c.reshape(T, routing.n_group, size), -1)[..., -2:].sum(-1), -1)[:, ::-1]
        group_gap = np.inf if routing.topk_group == routing.n_group else (
            groups[:, routing.topk_group - 1] - groups[:, routing.topk_group]).min()
        in_kept = np.zeros_like(c, bool)
        for t in range(T):
            for g in set(int(e) // size for e in idx[t]):
                in_kept[t, g * size:(g + 1) * size] = True
        rest = np.where(in_kept, c, -np.inf)
        np.put_along_axis(rest, idx, -np.inf, -1)
        if group_gap > 1e-2 and (np.take_along_axis(c, idx, -1).min(-1) - rest.max(-1)).min() > 1e-2 and (routing.order != "sigmoid_topk" or c.min() > 0):
            W = [0.5 * rng.standard_normal(s) for s in ((E, D, F), (E, D, F), (E, F, D))]
            return x, W_router, bias, *W
    raise AssertionError("no draw far from ties")


def _load_experts(experts, W_gate, W_up, W_down):
    """Our (E, D, F), (E, D, F), (E, F, D) into transformers' experts of either release."""
    with torch.no_grad():
        if hasattr(experts, "gate_up_proj"):  # 5.x: stacked, [gate | up] along the rows of each expert
            experts.gate_up_proj.copy_(torch.tensor(np.concatenate([W_gate, W_up], -1).transpose(0, 2, 1)))
            experts.down_proj.copy_(torch.tensor(W_down.transpose(0, 2, 1)))
        else:
            for e, expert in enumerate(experts):
                expert.gate_proj.weight.copy_(torch.tensor(W_gate[e].T))
                expert.up_proj.weight.copy_(torch.tensor(W_up[e].T))
                expert.down_proj.weight.copy_(torch.tensor(W_down[e].T))


def _expert_grads(experts):
    """transformers' experts' gradients as our (E, D, F), (E, D, F), (E, F, D)."""
    if hasattr(experts, "gate_up_proj"):
        g = experts.gate_up_proj.grad.numpy().transpose(0, 2, 1)  # (E, D, 2F)
        return g[..., :F], g[..., F:], experts.down_proj.grad.numpy().transpose(0, 2, 1)
    def grad(linear):  # an expert no token chose has none: zero, as ours
        return np.zeros(linear.weight.shape[::-1]) if linear.weight.grad is None else linear.weight.grad.numpy().T
    return tuple(np.stack([grad(getattr(ex, name)) for ex in experts]) for name in ("gate_proj", "up_proj", "down_proj"))


@pytest.mark.parametrize("norm_topk_prob", [True, False])
def test_swiglu_moe_equals_qwen3_moe_sparse_block(norm_topk_prob):
    from transformers.models.qwen3_moe import modeling_qwen3_moe as qwen
    routing = Routing(2, "softmax_topk", norm_topk_prob)
    rng = np.random.default_rng(0)
    x, W_router, _, W_gate, W_up, W_down = _far_from_ties(rng, routing)
    config = transformers.Qwen3MoeConfig(hidden_size=D, num_experts=E, num_experts_per_tok=2, moe_intermediate_size=F,
                                         norm_topk_prob=norm_topk_prob)
    block = qwen.Qwen3MoeSparseMoeBlock(config).double()
    with torch.no_grad():
        block.gate.weight.copy_(torch.tensor(W_router.T))
    _load_experts(block.experts, W_gate, W_up, W_down)
    tx = torch.tensor(x.reshape(2, 6, D), requires_grad=True)
    with moe_models_in_float64():
        theirs = block(tx)
    theirs = theirs[0] if isinstance(theirs, tuple) else theirs
    dy = rng.standard_normal(theirs.shape)
    theirs.backward(torch.tensor(dy))
    y, cache = swiglu_moe_forward(x.reshape(2, 6, D), W_router, W_gate, W_up, W_down, routing)
    _close(y, theirs, "output")
    dx, dW_router, dW_gate, dW_up, dW_down = swiglu_moe_backward(dy, cache)
    _close(dx, tx.grad, "dx")
    _close(dW_router, block.gate.weight.grad.T, "dW_router")
    for ours, theirs_grad, name in zip((dW_gate, dW_up, dW_down), _expert_grads(block.experts),
                                       ("dW_gate", "dW_up", "dW_down")):
        _close(ours, theirs_grad, name)


@pytest.mark.parametrize("groups", [(4, 2, True, 2.5), (1, 1, False, 1.0)], ids=["4-groups-keep-2", "1-group"])
def test_swiglu_moe_and_shared_expert_equal_deepseek_v3_moe(groups):
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as deepseek
    n_group, topk_group, norm, scaling = groups
    routing = Routing(2, "sigmoid_topk", norm, n_group, topk_group, scaling)
    rng = np.random.default_rng(1)
    x, W_router, bias, W_gate, W_up, W_down = _far_from_ties(rng, routing, bias_scale=0.1)
    shared = [0.5 * rng.standard_normal(s) for s in ((D, 2 * F), (D, 2 * F), (2 * F, D))]  # 2 shared experts wide
    config = transformers.DeepseekV3Config(hidden_size=D, n_routed_experts=E, num_experts_per_tok=2,
                                           moe_intermediate_size=F, n_shared_experts=2, n_group=n_group,
                                           topk_group=topk_group, norm_topk_prob=norm, routed_scaling_factor=scaling)
    moe = deepseek.DeepseekV3MoE(config).double()
    with torch.no_grad():
        moe.gate.weight.copy_(torch.tensor(W_router.T))
        moe.gate.e_score_correction_bias.copy_(torch.tensor(bias))
        for name, W in zip(("gate_proj", "up_proj", "down_proj"), shared):
            getattr(moe.shared_experts, name).weight.copy_(torch.tensor(W.T))
    _load_experts(moe.experts, W_gate, W_up, W_down)
    tx = torch.tensor(x.reshape(3, 4, D), requires_grad=True)
    with moe_models_in_float64():
        theirs = moe(tx)
    dy = rng.standard_normal(theirs.shape)
    theirs.backward(torch.tensor(dy))
    y_routed, cache = swiglu_moe_forward(x.reshape(3, 4, D), W_router, W_gate, W_up, W_down, routing, bias)
    y_shared, shared_cache = swiglu_forward(x.reshape(3, 4, D), *shared)
    _close(y_routed + y_shared, theirs, "output")
    dx, dW_router, dW_gate, dW_up, dW_down = swiglu_moe_backward(dy, cache)
    dx_shared, *d_shared = swiglu_backward(dy, shared_cache)
    _close(dx + dx_shared, tx.grad, "dx")
    _close(dW_router, moe.gate.weight.grad.T, "dW_router")
    for ours, theirs_grad, name in zip((dW_gate, dW_up, dW_down), _expert_grads(moe.experts),
                                       ("dW_gate", "dW_up", "dW_down")):
        _close(ours, theirs_grad, name)
    for ours, name in zip(d_shared, ("gate_proj", "up_proj", "down_proj")):
        _close(ours, getattr(moe.shared_experts, name).weight.grad.T, f"shared {name}")
