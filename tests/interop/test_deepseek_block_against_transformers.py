"""DeepSeek-V3's decoder block (nn/deepseek_block.py) against transformers' ``DeepseekV3DecoderLayer`` on 4.57
and 5.x: a dense layer (``first_k_dense_replace``) and a MoE layer (8 experts in 4 groups, 2 kept, a correction
bias, a shared expert), with and without ``q_lora_rank``; output and every gradient at 1e-10 in float64 (the
RMSNorms' and the router's float32 steps run in float64 by ``moe_models_in_float64``; the cos and sin given to
the layer, computed in float64), the routing checked 1e-6 from any tie. Plus the block's own gradcheck."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from attention_ref.interop import moe_models_in_float64  # noqa: E402
from attention_ref.nn.deepseek_block import DeepSeekLayer, deepseek_block_backward, deepseek_block_forward  # noqa: E402
from attention_ref.nn.mla import MLAShape, mla_param_shapes  # noqa: E402
from attention_ref.nn.moe_routing import Routing  # noqa: E402

D, E, F, FD = 12, 8, 4, 10
ATTN = {"W_q": "q_proj", "W_q_a": "q_a_proj", "W_q_b": "q_b_proj", "W_kv_a": "kv_a_proj_with_mqa",
        "W_kv_b": "kv_b_proj", "W_o": "o_proj", "q_a_norm.weight": "q_a_layernorm", "kv_a_norm.weight": "kv_a_layernorm"}


def _config(q_lora_rank):
    return transformers.DeepseekV3Config(
        hidden_size=D, intermediate_size=FD, moe_intermediate_size=F, num_hidden_layers=2, num_attention_heads=3,
        num_key_value_heads=3, q_lora_rank=q_lora_rank, kv_lora_rank=5, qk_nope_head_dim=4, qk_rope_head_dim=4,
        v_head_dim=3, n_routed_experts=E, n_shared_experts=1, num_experts_per_tok=2, n_group=4, topk_group=2,
        norm_topk_prob=True, routed_scaling_factor=2.5, first_k_dense_replace=1, rope_interleave=True,
        attn_implementation="sdpa")


def _ours(config, moe, rng):
    shape = MLAShape(3, config.q_lora_rank, 5, 4, 4, 3, eps=config.rms_norm_eps, interleaved=True)
    p = {f"self_attn.{n}": (1 + 0.2 * rng.standard_normal(s) if n.endswith("weight") and len(s) == 1
                            else 0.5 * rng.standard_normal(s)) for n, s in mla_param_shapes(D, shape).items()}
    p["input_norm.weight"], p["post_attention_norm.weight"] = 1 + 0.2 * rng.standard_normal((2, D))
    if not moe:
        p.update({"mlp.W_gate": rng.standard_normal((D, FD)), "mlp.W_up": rng.standard_normal((D, FD)),
                  "mlp.W_down": 0.5 * rng.standard_normal((FD, D))})
        return p, DeepSeekLayer(shape, config.rms_norm_eps)
    p.update({"mlp.W_router": 0.3 * rng.standard_normal((D, E)), "mlp.e_score_correction_bias": 0.1 * rng.standard_normal(E),
              "mlp.experts.W_gate": rng.standard_normal((E, D, F)), "mlp.experts.W_up": rng.standard_normal((E, D, F)),
              "mlp.experts.W_down": 0.5 * rng.standard_normal((E, F, D)), "mlp.shared.W_gate": rng.standard_normal((D, F)),
              "mlp.shared.W_up": rng.standard_normal((D, F)), "mlp.shared.W_down": 0.5 * rng.standard_normal((F, D))})
    return p, DeepSeekLayer(shape, config.rms_norm_eps, Routing(2, "sigmoid_topk", True, 4, 2, 2.5))


def _load(layer, p, moe):
    """Our params into transformers' layer (4.57: one module per expert; 5.x: stacked experts)."""
    with torch.no_grad():
        for name, value in p.items():
            if name.startswith("self_attn."):
                mod = getattr(layer.self_attn, ATTN[name[len("self_attn."):]])
                mod.weight.copy_(torch.tensor(value if value.ndim == 1 else value.T))
        layer.input_layernorm.weight.copy_(torch.tensor(p["input_norm.weight"]))
        layer.post_attention_layernorm.weight.copy_(torch.tensor(p["post_attention_norm.weight"]))
        mlp = layer.mlp
        if not moe:
            for ours, theirs in (("W_gate", "gate_proj"), ("W_up", "up_proj"), ("W_down", "down_proj")):
                getattr(mlp, theirs).weight.copy_(torch.tensor(p[f"mlp.{ours}"].T))
            return
        mlp.gate.weight.copy_(torch.tensor(p["mlp.W_router"].T))
        mlp.gate.e_score_correction_bias.copy_(torch.tensor(p["mlp.e_score_correction_bias"]))
        for ours, theirs in (("W_gate", "gate_proj"), ("W_up", "up_proj"), ("W_down", "down_proj")):
            getattr(mlp.shared_experts, theirs).weight.copy_(torch.tensor(p[f"mlp.shared.{ours}"].T))
        Wg, Wu, Wd = (p[f"mlp.experts.{n}"] for n in ("W_gate", "W_up", "W_down"))
        if hasattr(mlp.experts, "gate_up_proj"):
            mlp.experts.gate_up_proj.copy_(torch.tensor(np.concatenate([Wg, Wu], -1).transpose(0, 2, 1)))
            mlp.experts.down_proj.copy_(torch.tensor(Wd.transpose(0, 2, 1)))
        else:
            for e, ex in enumerate(mlp.experts):
                ex.gate_proj.weight.copy_(torch.tensor(Wg[e].T))
                ex.up_proj.weight.copy_(torch.tensor(Wu[e].T))
                ex.down_proj.weight.copy_(torch.tensor(Wd[e].T))


def _their_grads(layer, p, moe):
    def grad(t, shape):
        return np.zeros(shape) if t.grad is None else t.grad.numpy()
    g = {}
    for name in p:
        if name.startswith("self_attn."):
            w = getattr(layer.self_attn, ATTN[name[len("self_attn."):]]).weight
            g[name] = grad(w, w.shape) if w.ndim == 1 else grad(w, w.shape).T
    g["input_norm.weight"] = layer.input_layernorm.weight.grad.numpy()
    g["post_attention_norm.weight"] = layer.post_attention_layernorm.weight.grad.numpy()
    mlp = layer.mlp
    names = (("W_gate", "gate_proj"), ("W_up", "up_proj"), ("W_down", "down_proj"))
    if not moe:
        g.update({f"mlp.{o}": getattr(mlp, t).weight.grad.numpy().T for o, t in names})
        return g
    g["mlp.W_router"] = mlp.gate.weight.grad.numpy().T
    g.update({f"mlp.shared.{o}": getattr(mlp.shared_experts, t).weight.grad.numpy().T for o, t in names})
    if hasattr(mlp.experts, "gate_up_proj"):
        gu = mlp.experts.gate_up_proj.grad.numpy().transpose(0, 2, 1)
        g.update({"mlp.experts.W_gate": gu[..., :F], "mlp.experts.W_up": gu[..., F:],
                  "mlp.experts.W_down": mlp.experts.down_proj.grad.numpy().transpose(0, 2, 1)})
    else:
        for o, t in names:
            g[f"mlp.experts.{o}"] = np.stack([grad(getattr(ex, t).weight, getattr(ex, t).weight.shape).T
                                              for ex in mlp.experts])
    return g


@pytest.mark.parametrize("q_lora_rank", [None, 6], ids=["no-q-lora", "q-lora"])
@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_deepseek_block_equals_decoder_layer(moe, q_lora_rank):
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as deepseek
    config = _config(q_lora_rank)
    layer = deepseek.DeepseekV3DecoderLayer(config, layer_idx=int(moe)).double()
    assert hasattr(layer.mlp, "gate") == moe
    theta = 50.0 ** (-np.arange(0, 4, 2) / 4)
    positions = np.arange(6)
    angles = positions[:, None] * theta
    emb = np.concatenate([angles, angles], -1)[None]
    for seed in range(50):  # a draw whose routing is 1e-6 from any tie
        rng = np.random.default_rng(seed)
        p, spec = _ours(config, moe, rng)
        x = rng.standard_normal((2, 6, D))
        y, cache = deepseek_block_forward(x, p, spec, theta, positions)
        if not moe or _far_from_ties(cache, p["mlp.e_score_correction_bias"]):
            break
    else:
        raise AssertionError("no draw far from ties")
    _load(layer, p, moe)
    tx = torch.tensor(x, requires_grad=True)
    with moe_models_in_float64():
        out = layer(tx, attention_mask=None, position_embeddings=(torch.tensor(np.cos(emb)), torch.tensor(np.sin(emb))))
    theirs = out[0] if isinstance(out, tuple) else out
    dy = rng.standard_normal(theirs.shape)
    theirs.backward(torch.tensor(dy))
    np.testing.assert_allclose(y, theirs.detach().numpy(), rtol=0, atol=1e-10 * np.abs(y).max())
    dx, g = deepseek_block_backward(dy, cache)
    np.testing.assert_allclose(dx, tx.grad.numpy(), rtol=0, atol=1e-10 * np.abs(dx).max())
    their = _their_grads(layer, p, moe)
    for name, value in their.items():
        np.testing.assert_allclose(g[name], value, rtol=0, atol=1e-10 * max(np.abs(value).max(), 1e-300), err_msg=name)
    if moe:
        assert not g["mlp.e_score_correction_bias"].any()


def _far_from_ties(cache, bias, gap=1e-6):
    rc = cache.mlp[0].router
    s, idx, routing = rc.p, rc.idx, rc.routing
    c = s + bias
    T, _ = c.shape
    size = E // routing.n_group
    groups = np.sort(np.sort(c.reshape(T, routing.n_group, size), -1)[..., -2:].sum(-1), -1)[:, ::-1]
    if (groups[:, routing.topk_group - 1] - groups[:, routing.topk_group]).min() < gap:
        return False
    if np.take_along_axis(c, idx, -1).min() <= gap:  # 4.57 masks the groups not kept with 0 (5.x: -inf)
        return False
    for t in range(T):
        kept = set(int(e) // size for e in idx[t])
        rest = [c[t, e] for e in range(E) if e not in idx[t] and e // size in kept]
        if rest and c[t, idx[t]].min() - max(rest) < gap:
            return False
    return True
