"""Qwen3-MoE's decoder block (nn/qwen3_moe_block.py) against transformers' ``Qwen3MoeDecoderLayer`` on 4.57 (one
module per expert) and 5.x (stacked experts): a MoE layer (normalised top-k and not) and a dense one
(``mlp_only_layers``); output and every gradient at 1e-10 in float64 (the RMSNorms' and the router's float32
steps run in float64 by ``moe_models_in_float64``; the cos and sin given to the layer, computed in float64),
the routing checked 1e-6 from any tie; then decoding with the KV cache equals the forward, token by token."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from attention_ref.interop import moe_models_in_float64  # noqa: E402
from attention_ref.nn.moe_routing import Routing  # noqa: E402
from attention_ref.nn.qwen3_moe_block import Qwen3MoeLayer, qwen3_moe_block_backward, qwen3_moe_block_forward  # noqa: E402
from attention_ref.variants.kv_cache import KVCache  # noqa: E402

D, H, HKV, DH, E, F, FD = 16, 4, 2, 6, 8, 4, 12
NAMES = (("W_gate", "gate_proj"), ("W_up", "up_proj"), ("W_down", "down_proj"))


def _params(rng, moe):
    p = {"input_norm.weight": 1 + 0.2 * rng.standard_normal(D), "post_attention_norm.weight": 1 + 0.2 * rng.standard_normal(D),
         "self_attn.q_norm.weight": 1 + 0.2 * rng.standard_normal(DH), "self_attn.k_norm.weight": 1 + 0.2 * rng.standard_normal(DH),
         "self_attn.W_q": 0.5 * rng.standard_normal((D, H * DH)), "self_attn.W_k": 0.5 * rng.standard_normal((D, HKV * DH)),
         "self_attn.W_v": 0.5 * rng.standard_normal((D, HKV * DH)), "self_attn.W_o": 0.5 * rng.standard_normal((H * DH, D))}
    if not moe:
        return {**p, "mlp.W_gate": rng.standard_normal((D, FD)), "mlp.W_up": rng.standard_normal((D, FD)),
                "mlp.W_down": 0.5 * rng.standard_normal((FD, D))}
    return {**p, "mlp.W_router": rng.standard_normal((D, E)), "mlp.experts.W_gate": rng.standard_normal((E, D, F)),
            "mlp.experts.W_up": rng.standard_normal((E, D, F)), "mlp.experts.W_down": 0.5 * rng.standard_normal((E, F, D))}


def _far_from_ties(cache, gap=1e-6):
    rc = cache.mlp.router
    p = np.sort(rc.p, -1)[:, ::-1]
    k = rc.routing.top_k
    return (p[:, k - 1] - p[:, k]).min() > gap


@pytest.mark.parametrize("kind", ["moe-normalised", "moe", "dense"])
def test_qwen3_moe_block_equals_decoder_layer(kind):
    from transformers.models.qwen3_moe import modeling_qwen3_moe as qwen
    moe, norm = kind != "dense", kind == "moe-normalised"
    config = transformers.Qwen3MoeConfig(hidden_size=D, intermediate_size=FD, moe_intermediate_size=F,
                                         num_hidden_layers=2, num_attention_heads=H, num_key_value_heads=HKV,
                                         head_dim=DH, num_experts=E, num_experts_per_tok=2, norm_topk_prob=norm,
                                         mlp_only_layers=[] if moe else [0], attn_implementation="sdpa")
    layer = qwen.Qwen3MoeDecoderLayer(config, layer_idx=0).double()
    assert hasattr(layer.mlp, "gate") == moe
    theta = 100.0 ** (-np.arange(0, DH, 2) / DH)
    spec = Qwen3MoeLayer(H, HKV, config.rms_norm_eps, theta, Routing(2, "softmax_topk", norm) if moe else None)
    for seed in range(50):
        rng = np.random.default_rng(seed)
        p, x = _params(rng, moe), rng.standard_normal((2, 7, D))
        y, cache = qwen3_moe_block_forward(x, p, spec)
        if not moe or _far_from_ties(cache):
            break
    else:
        raise AssertionError("no draw far from ties")
    with torch.no_grad():
        layer.input_layernorm.weight.copy_(torch.tensor(p["input_norm.weight"]))
        layer.post_attention_layernorm.weight.copy_(torch.tensor(p["post_attention_norm.weight"]))
        for ours, theirs in (("q_norm.weight", "q_norm"), ("k_norm.weight", "k_norm")):
            getattr(layer.self_attn, theirs).weight.copy_(torch.tensor(p[f"self_attn.{ours}"]))
        for ours, theirs in (("W_q", "q_proj"), ("W_k", "k_proj"), ("W_v", "v_proj"), ("W_o", "o_proj")):
            getattr(layer.self_attn, theirs).weight.copy_(torch.tensor(p[f"self_attn.{ours}"].T))
        if not moe:
            for ours, theirs in NAMES:
                getattr(layer.mlp, theirs).weight.copy_(torch.tensor(p[f"mlp.{ours}"].T))
        else:
            layer.mlp.gate.weight.copy_(torch.tensor(p["mlp.W_router"].T))
            experts = layer.mlp.experts
            if hasattr(experts, "gate_up_proj"):
                experts.gate_up_proj.copy_(torch.tensor(np.concatenate(
                    [p["mlp.experts.W_gate"], p["mlp.experts.W_up"]], -1).transpose(0, 2, 1)))
                experts.down_proj.copy_(torch.tensor(p["mlp.experts.W_down"].transpose(0, 2, 1)))
            else:
                for e, ex in enumerate(experts):
                    for ours, theirs in NAMES:
                        getattr(ex, theirs).weight.copy_(torch.tensor(p[f"mlp.experts.{ours}"][e].T))
    angles = np.arange(7)[:, None] * theta
    emb = np.concatenate([angles, angles], -1)[None]  # (1, N, Dh): rotate-half's cat(freqs, freqs)
    tx = torch.tensor(x, requires_grad=True)
    with moe_models_in_float64():
        out = layer(tx, position_embeddings=(torch.tensor(np.cos(emb)), torch.tensor(np.sin(emb))), attention_mask=None)
    theirs = out[0] if isinstance(out, tuple) else out
    dy = rng.standard_normal(theirs.shape)
    theirs.backward(torch.tensor(dy))
    np.testing.assert_allclose(y, theirs.detach().numpy(), rtol=0, atol=1e-10 * np.abs(y).max())
    dx, g = qwen3_moe_block_backward(dy, cache)
    np.testing.assert_allclose(dx, tx.grad.numpy(), rtol=0, atol=1e-10 * np.abs(dx).max())
    their = {"input_norm.weight": layer.input_layernorm.weight.grad.numpy(),
             "post_attention_norm.weight": layer.post_attention_layernorm.weight.grad.numpy(),
             "self_attn.q_norm.weight": layer.self_attn.q_norm.weight.grad.numpy(),
             "self_attn.k_norm.weight": layer.self_attn.k_norm.weight.grad.numpy()}
    their.update({f"self_attn.{o}": getattr(layer.self_attn, t).weight.grad.numpy().T
                  for o, t in (("W_q", "q_proj"), ("W_k", "k_proj"), ("W_v", "v_proj"), ("W_o", "o_proj"))})
    if not moe:
        their.update({f"mlp.{o}": getattr(layer.mlp, t).weight.grad.numpy().T for o, t in NAMES})
    else:
        their["mlp.W_router"] = layer.mlp.gate.weight.grad.numpy().T
        experts = layer.mlp.experts
        if hasattr(experts, "gate_up_proj"):
            gu = experts.gate_up_proj.grad.numpy().transpose(0, 2, 1)
            their.update({"mlp.experts.W_gate": gu[..., :F], "mlp.experts.W_up": gu[..., F:],
                          "mlp.experts.W_down": experts.down_proj.grad.numpy().transpose(0, 2, 1)})
        else:
            for o, t in NAMES:
                their[f"mlp.experts.{o}"] = np.stack([
                    np.zeros(getattr(ex, t).weight.shape[::-1]) if getattr(ex, t).weight.grad is None
                    else getattr(ex, t).weight.grad.numpy().T for ex in experts])
    assert set(their) == set(g)
    for name, value in their.items():
        np.testing.assert_allclose(g[name], value, rtol=0, atol=1e-10 * np.abs(value).max(), err_msg=name)
    # decoding: 4 tokens, then one at a time with the layer's KV cache, equals the forward's rows
    kv = KVCache()
    first, _ = qwen3_moe_block_forward(x[:, :4], p, spec, kv=kv)
    steps = [first] + [qwen3_moe_block_forward(x[:, t:t + 1], p, spec, kv=kv)[0] for t in range(4, 7)]
    assert kv.length == 7
    np.testing.assert_allclose(np.concatenate(steps, 1), y, rtol=0, atol=1e-12 * np.abs(y).max())
