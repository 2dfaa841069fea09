"""Qwen3-Next's new pairs against transformers' ``qwen3_next`` code (4.57.1 and 5.x): the gated delta rule
(``torch_recurrent_gated_delta_rule`` and ``torch_chunk_gated_delta_rule``, with q/k L2-normalised in the
kernel as the model calls them), the short causal convolution (``nn.Conv1d`` as the layer builds it, and
the decoding update that carries ``conv_state``), the gated RMSNorm (``Qwen3NextRMSNormGated``), the
sigmoid output gate (``attn_output * torch.sigmoid(gate)``) and the partial RoPE
(``Qwen3NextRotaryEmbedding`` and ``apply_rotary_pos_emb``). Small shapes, random inputs, no download;
forward and every gradient through torch's autograd. Skipped without torch/transformers.

float64 at 1e-10. transformers computes the delta rule and the gated norm in float32 (``.to(torch.float32)``)
and RoPE's ``inv_freq`` and angles in float32: each comparison runs inside
:func:`attention_ref.interop.qwen3_next_in_float64`, which reads those casts as float64 with the formulas
untouched. One test shows the patch matters: unpatched, the delta rule agrees only to float32's ~1e-7.
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
qn = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")

from attention_ref.interop import qwen3_next_in_float64  # noqa: E402
from attention_ref.nn.causal_conv1d import causal_conv1d_backward, causal_conv1d_forward  # noqa: E402
from attention_ref.nn.gated_rms_norm import gated_rms_norm_backward, gated_rms_norm_forward  # noqa: E402
from attention_ref.nn.partial_rotary import partial_rotary_backward, partial_rotary_forward  # noqa: E402
from attention_ref.nn.sigmoid_gate import sigmoid_gate_backward, sigmoid_gate_forward  # noqa: E402
from attention_ref.variants.gated_delta_rule import gated_delta_rule_backward, gated_delta_rule_forward  # noqa: E402

RTOL = 1e-10


def _close(ours, theirs, what, rtol=RTOL):
    theirs = theirs.detach().numpy() if hasattr(theirs, "detach") else np.asarray(theirs)
    assert np.shape(ours) == theirs.shape, f"{what}: shape {np.shape(ours)} != {theirs.shape}"
    scale = max(float(np.abs(theirs).max()), 1e-300)
    error = float(np.abs(np.asarray(ours) - theirs).max()) / scale
    assert error <= rtol, f"{what}: relative difference {error:.3g} > {rtol:g}"
    return error


def _tensors(*arrays):
    return [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in arrays]


def _to_ours(x):
    """transformers' (B, T, H, ...) as this package's (B, H, T, ...)."""
    return np.moveaxis(x, 1, 2)


def _delta_inputs(seed, t=5):
    rng = np.random.default_rng(seed)
    B, H, dk, dv = 2, 3, 4, 5
    q, k = rng.standard_normal((B, t, H, dk)), rng.standard_normal((B, t, H, dk))
    v = rng.standard_normal((B, t, H, dv))
    g = -np.log1p(np.exp(rng.standard_normal((B, t, H)))) * rng.uniform(0.1, 2.0, H)  # -exp(A_log) softplus(a)
    beta = 1 / (1 + np.exp(-rng.standard_normal((B, t, H))))
    s0 = rng.standard_normal((B, H, dk, dv))
    return q, k, v, g, beta, s0


@pytest.mark.parametrize("kernel", ["torch_recurrent_gated_delta_rule", "torch_chunk_gated_delta_rule"])
def test_gated_delta_rule(kernel):
    q, k, v, g, beta, s0 = _delta_inputs(0)
    rng = np.random.default_rng(1)
    dout, dstate = rng.standard_normal(v.shape), rng.standard_normal(s0.shape)
    tq, tk, tv, tg, tb, ts = _tensors(q, k, v, g, beta, s0)
    with qwen3_next_in_float64():
        out_t, state_t = getattr(qn, kernel)(tq, tk, tv, g=tg, beta=tb, initial_state=ts, output_final_state=True,
                                             use_qk_l2norm_in_kernel=True)
    assert out_t.dtype == torch.float64
    ((out_t * torch.tensor(dout)).sum() + (state_t * torch.tensor(dstate)).sum()).backward()

    out, cache = gated_delta_rule_forward(_to_ours(q), _to_ours(k), _to_ours(v), g.transpose(0, 2, 1),
                                          beta.transpose(0, 2, 1), s0)
    _close(np.moveaxis(out, 2, 1), out_t, "out")
    _close(cache.final_state, state_t, "final state")
    grads = gated_delta_rule_backward(_to_ours(dout), cache, dstate)
    for name, ours, theirs in zip(["dq", "dk", "dv"], grads[:3], (tq, tk, tv)):
        _close(np.moveaxis(ours, 2, 1), theirs.grad, name)
    _close(grads[3].transpose(0, 2, 1), tg.grad, "dg")
    _close(grads[4].transpose(0, 2, 1), tb.grad, "dbeta")
    _close(grads[5], ts.grad, "dinitial_state")


def test_gated_delta_rule_unpatched_is_float32():
    """Without the patch transformers rounds to float32: the difference is float32's, not 1e-10's."""
    q, k, v, g, beta, s0 = _delta_inputs(2)
    out_t, _ = qn.torch_recurrent_gated_delta_rule(*(torch.tensor(x) for x in (q, k, v)), g=torch.tensor(g),
                                                   beta=torch.tensor(beta), initial_state=torch.tensor(s0),
                                                   output_final_state=True, use_qk_l2norm_in_kernel=True)
    out, _ = gated_delta_rule_forward(_to_ours(q), _to_ours(k), _to_ours(v), g.transpose(0, 2, 1),
                                      beta.transpose(0, 2, 1), s0)
    error = float(np.abs(np.moveaxis(out, 2, 1) - out_t.double().numpy()).max())
    assert 1e-9 < error < 1e-5


def test_causal_conv_and_its_decoding_update():
    """The layer's ``F.silu(conv1d(x)[..., :T])`` with ``nn.Conv1d(groups=C, padding=K - 1, bias=False)``,
    then one token at a time through the update transformers' decoding calls (4.57.1:
    ``torch_causal_conv1d_update``; 5.x: ``causal_conv1d_update``)."""
    rng = np.random.default_rng(3)
    B, T, C, K = 2, 6, 5, 4
    x, w, dy = rng.standard_normal((B, T, C)), rng.standard_normal((C, K)), rng.standard_normal((B, T, C))
    conv = torch.nn.Conv1d(C, C, K, groups=C, padding=K - 1, bias=False).double()
    with torch.no_grad():
        conv.weight.copy_(torch.tensor(w)[:, None, :])
    tx, = _tensors(x)
    y_t = torch.nn.functional.silu(conv(tx.transpose(1, 2))[:, :, :T]).transpose(1, 2)
    (y_t * torch.tensor(dy)).sum().backward()
    y, cache = causal_conv1d_forward(x, w)
    _close(y, y_t, "conv output")
    dx, dw, _, _ = causal_conv1d_backward(dy, cache)
    _close(dx, tx.grad, "dx")
    _close(dw, conv.weight.grad[:, 0, :], "dweight")

    update = getattr(qn, "torch_causal_conv1d_update", None) or qn.causal_conv1d_update
    prefix = 3
    conv_state = torch.nn.functional.pad(torch.tensor(x[:, :prefix]).transpose(1, 2), (K - prefix, 0))
    _, cache = causal_conv1d_forward(x[:, :prefix], w)
    window = cache.window
    for t in range(prefix, T):
        theirs = update(torch.tensor(x[:, t:t + 1]).transpose(1, 2), conv_state, torch.tensor(w), None, "silu")
        ours, cache = causal_conv1d_forward(x[:, t:t + 1], w, window=window)
        _close(ours[:, 0], theirs[:, :, 0], f"decoding token {t}")
        _close(ours[:, 0], y[:, t], f"decoding token {t} against the sequence")
        window = cache.window
        _close(window, conv_state[:, :, 1:].transpose(1, 2), f"window after token {t}")


def test_gated_rms_norm():
    rng = np.random.default_rng(4)
    x, z, w, dy = (rng.standard_normal(s) for s in ((6, 8), (6, 8), (8,), (6, 8)))
    norm = qn.Qwen3NextRMSNormGated(8, eps=1e-6).double()
    with torch.no_grad():
        norm.weight.copy_(torch.tensor(w))
    tx, tz = _tensors(x, z)
    with qwen3_next_in_float64():
        y_t = norm(tx, tz)
    (y_t * torch.tensor(dy)).sum().backward()
    y, cache = gated_rms_norm_forward(x, z, w, 1e-6)
    _close(y, y_t, "gated RMSNorm")
    dx, dz, dw = gated_rms_norm_backward(dy, cache)
    _close(dx, tx.grad, "dx")
    _close(dz, tz.grad, "dz")
    _close(dw, norm.weight.grad, "dweight")


def test_sigmoid_gate():
    rng = np.random.default_rng(5)
    x, gate, dy = (rng.standard_normal((2, 3, 8)) for _ in range(3))
    tx, tg = _tensors(x, gate)
    y_t = tx * torch.sigmoid(tg)  # Qwen3NextAttention: attn_output * torch.sigmoid(gate)
    (y_t * torch.tensor(dy)).sum().backward()
    y, cache = sigmoid_gate_forward(x, gate)
    _close(y, y_t, "gated output")
    dx, dgate = sigmoid_gate_backward(dy, cache)
    _close(dx, tx.grad, "dx")
    _close(dgate, tg.grad, "dgate")


def test_partial_rotary_as_the_config_says():
    """head_dim 16 with partial_rotary_factor 0.25: the first 4 features of each head rotated, rotate-half."""
    config = transformers.Qwen3NextConfig(hidden_size=32, head_dim=16, num_attention_heads=2, num_key_value_heads=1,
                                          partial_rotary_factor=0.25, rope_theta=1000.0)
    rng = np.random.default_rng(6)
    q, dy = rng.standard_normal((2, 2, 7, 16)), rng.standard_normal((2, 2, 7, 16))
    positions = np.array([np.arange(7), np.arange(7) + 3])
    rotary = qn.Qwen3NextRotaryEmbedding(config).double()
    tq, = _tensors(q)
    with qwen3_next_in_float64():
        cos, sin = rotary(tq, torch.tensor(positions))
    y_t, _ = qn.apply_rotary_pos_emb(tq, tq.detach(), cos, sin)
    (y_t * torch.tensor(dy)).sum().backward()
    y, cache = partial_rotary_forward(q, 4, positions[:, None, :], base=1000.0)
    _close(y, y_t, "partial RoPE")
    _close(partial_rotary_backward(dy, cache), tq.grad, "dq")


def _small_config(**overrides):
    fields = dict(vocab_size=32, hidden_size=12, intermediate_size=16, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=8, partial_rotary_factor=0.25, rope_theta=1000.0,
                  linear_conv_kernel_dim=3, linear_key_head_dim=3, linear_value_head_dim=2, linear_num_key_heads=2,
                  linear_num_value_heads=4, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=6,
                  shared_expert_intermediate_size=5, layer_types=["linear_attention", "full_attention"])
    return transformers.Qwen3NextConfig(**{**fields, **overrides})


def test_gated_delta_net_layer():
    """The whole ``Qwen3NextGatedDeltaNet`` (projections in their grouped layout, conv, decay, delta rule,
    gated norm, output), forward and every gradient, with our weights copied in (W transposed)."""
    from attention_ref.nn.gated_delta_net import DeltaNetShape, gated_delta_net_backward, gated_delta_net_forward

    config = _small_config()
    torch.manual_seed(0)
    layer = qn.Qwen3NextGatedDeltaNet(config, layer_idx=0).double()
    rng = np.random.default_rng(7)
    with torch.no_grad():
        for name, tensor in layer.named_parameters():
            tensor.copy_(torch.tensor(0.5 * rng.standard_normal(tuple(tensor.shape))))
        layer.A_log.copy_(torch.tensor(np.log(rng.uniform(0.5, 4.0, 4))))
    params = {"in_proj_qkvz.W": layer.in_proj_qkvz.weight.detach().numpy().T,
              "in_proj_ba.W": layer.in_proj_ba.weight.detach().numpy().T,
              "conv1d.weight": layer.conv1d.weight.detach().numpy()[:, 0, :],
              "dt_bias": layer.dt_bias.detach().numpy(), "A_log": layer.A_log.detach().numpy(),
              "norm.weight": layer.norm.weight.detach().numpy(), "out_proj.W": layer.out_proj.weight.detach().numpy().T}
    x, dy = rng.standard_normal((2, 5, 12)), rng.standard_normal((2, 5, 12))
    tx, = _tensors(x)
    with qwen3_next_in_float64():
        y_t = layer(tx)
    (y_t * torch.tensor(dy)).sum().backward()
    shape = DeltaNetShape(config.linear_num_key_heads, config.linear_key_head_dim, config.linear_num_value_heads,
                          config.linear_value_head_dim, config.rms_norm_eps)
    y, cache = gated_delta_net_forward(x, params, shape)
    _close(y, y_t, "Gated DeltaNet output")
    dx, grads = gated_delta_net_backward(dy, cache)
    _close(dx, tx.grad, "dx")
    theirs = {"in_proj_qkvz.W": layer.in_proj_qkvz.weight.grad.T, "in_proj_ba.W": layer.in_proj_ba.weight.grad.T,
              "conv1d.weight": layer.conv1d.weight.grad[:, 0, :], "dt_bias": layer.dt_bias.grad,
              "A_log": layer.A_log.grad, "norm.weight": layer.norm.weight.grad, "out_proj.W": layer.out_proj.weight.grad.T}
    for name, grad in theirs.items():
        _close(grads[name], grad, f"d{name}")


def test_gated_attention_layer():
    """The whole ``Qwen3NextAttention`` (q_proj with each head's gate beside its query, (1 + w) q/k norms, partial
    RoPE from ``Qwen3NextRotaryEmbedding``, grouped heads, causal eager attention, sigmoid gate, o_proj),
    forward and every gradient."""
    from attention_ref.nn.gated_attention import GatedAttentionShape, gated_attention_backward, gated_attention_forward

    config = _small_config(attn_implementation="eager")
    config._attn_implementation = "eager"
    layer = qn.Qwen3NextAttention(config, layer_idx=1).double()
    rotary = qn.Qwen3NextRotaryEmbedding(config).double()
    rng = np.random.default_rng(8)
    with torch.no_grad():
        for tensor in layer.parameters():
            tensor.copy_(torch.tensor(0.5 * rng.standard_normal(tuple(tensor.shape))))
    x, dy = rng.standard_normal((2, 5, 12)), rng.standard_normal((2, 5, 12))
    tx, = _tensors(x)
    positions = torch.arange(5)[None].expand(2, 5)
    mask = torch.full((5, 5), float("-inf"), dtype=torch.float64).triu(1)[None, None].expand(2, 1, 5, 5)
    with qwen3_next_in_float64():
        y_t, _ = layer(tx, rotary(tx, positions), mask)
    (y_t * torch.tensor(dy)).sum().backward()
    params = {"W_q": layer.q_proj.weight.detach().numpy().T, "W_k": layer.k_proj.weight.detach().numpy().T,
              "W_v": layer.v_proj.weight.detach().numpy().T, "W_o": layer.o_proj.weight.detach().numpy().T,
              "q_norm.weight": layer.q_norm.weight.detach().numpy(), "k_norm.weight": layer.k_norm.weight.detach().numpy()}
    shape = GatedAttentionShape(config.num_attention_heads, config.num_key_value_heads, config.head_dim,
                                int(config.head_dim * 0.25), 1000.0, config.rms_norm_eps)
    y, cache = gated_attention_forward(x, params, shape)
    _close(y, y_t, "gated attention output")
    dx, grads = gated_attention_backward(dy, cache)
    _close(dx, tx.grad, "dx")
    theirs = {"W_q": layer.q_proj.weight.grad.T, "W_k": layer.k_proj.weight.grad.T, "W_v": layer.v_proj.weight.grad.T,
              "W_o": layer.o_proj.weight.grad.T, "q_norm.weight": layer.q_norm.weight.grad,
              "k_norm.weight": layer.k_norm.weight.grad}
    for name, grad in theirs.items():
        _close(grads[name], grad, f"d{name}")


def _expert_weights(block, E):
    """transformers' experts as (E, D, 2F) [gate | up] and (E, F, D): 4.57.1 keeps a list of Qwen3NextMLP,
    5.x one fused ``gate_up_proj`` (E, 2F, D) (gate rows first) and ``down_proj`` (E, D, F)."""
    experts = block.experts
    if hasattr(experts, "gate_up_proj"):  # 5.x
        return experts.gate_up_proj.transpose(1, 2), experts.down_proj.transpose(1, 2)
    gate_up = torch.stack([torch.cat([experts[e].gate_proj.weight, experts[e].up_proj.weight]).T for e in range(E)])
    down = torch.stack([experts[e].down_proj.weight.T for e in range(E)])
    return gate_up, down


def test_sparse_moe_block_with_gated_shared_expert():
    """``Qwen3NextSparseMoeBlock``: softmax over all experts, top k, renormalised (``norm_topk_prob``), plain
    SwiGLU experts, plus ``sigmoid(shared_expert_gate(x)) * shared_expert(x)``; forward and every gradient
    (the router's through the chosen weights, the choice held fixed, as autograd does). Router weights are drawn
    until every token's k-th and (k+1)-th probabilities are at least 0.02 apart (no near ties in the choice)."""
    from attention_ref.nn.moe import moe_backward, moe_forward
    from attention_ref.nn.moe_routing import Routing
    from attention_ref.nn.shared_expert import gated_shared_expert_backward, gated_shared_expert_forward

    config = _small_config()
    E, k = config.num_experts, config.num_experts_per_tok
    block = qn.Qwen3NextSparseMoeBlock(config).double()
    rng = np.random.default_rng(9)
    x = rng.standard_normal((2, 4, 12))
    with torch.no_grad():
        for tensor in block.parameters():
            tensor.copy_(torch.tensor(0.5 * rng.standard_normal(tuple(tensor.shape))))
        router = block.gate.weight
        while True:  # a router with no near ties on these tokens
            logits = x.reshape(-1, 12) @ router.numpy().T
            p = np.exp(logits - logits.max(1, keepdims=True))
            p /= p.sum(1, keepdims=True)
            ranked = -np.sort(-p, axis=1)
            if (ranked[:, k - 1] - ranked[:, k]).min() > 0.02:  # the k-th and the (k+1)-th well apart
                break
            router.copy_(torch.tensor(2 * rng.standard_normal(tuple(router.shape))))
    dy = rng.standard_normal(x.shape)
    tx, = _tensors(x)
    with qwen3_next_in_float64():
        out = block(tx)
    y_t = out[0] if isinstance(out, tuple) else out
    (y_t * torch.tensor(dy)).sum().backward()

    gate_up, down = _expert_weights(block, E)
    se = block.shared_expert
    W_router = block.gate.weight.detach().numpy().T
    routed, moe_cache = moe_forward(x, W_router, np.zeros(E), gate_up.detach().numpy(), np.zeros((E, 2 * 6)),
                                    down.detach().numpy(), np.zeros((E, 12)), Routing(k, "softmax_topk", True),
                                    expert="swiglu")
    shared, shared_cache = gated_shared_expert_forward(x, se.gate_proj.weight.detach().numpy().T,
                                                       se.up_proj.weight.detach().numpy().T,
                                                       se.down_proj.weight.detach().numpy().T,
                                                       block.shared_expert_gate.weight.detach().numpy().T)
    _close(routed + shared, y_t, "MoE block output")
    dx, dW_router, _, dW_gate_up, _, dW_down, _ = moe_backward(dy, moe_cache)
    dx_s, dW_gate, dW_up, dW_down_s, dw_gate = gated_shared_expert_backward(dy, shared_cache)
    _close(dx + dx_s, tx.grad, "dx")
    _close(dW_router, block.gate.weight.grad.T, "drouter")
    if hasattr(block.experts, "gate_up_proj"):
        _close(dW_gate_up, block.experts.gate_up_proj.grad.transpose(1, 2), "dgate_up_proj")
        _close(dW_down, block.experts.down_proj.grad.transpose(1, 2), "ddown_proj")
    else:
        for e in range(E):
            ex = block.experts[e]
            if ex.gate_proj.weight.grad is None:  # no token chose it
                assert not dW_gate_up[e].any() and not dW_down[e].any()
                continue
            _close(dW_gate_up[e], torch.cat([ex.gate_proj.weight.grad, ex.up_proj.weight.grad]).T, f"expert {e} gate/up")
            _close(dW_down[e], ex.down_proj.weight.grad.T, f"expert {e} down")
    _close(dW_gate, se.gate_proj.weight.grad.T, "shared gate_proj")
    _close(dW_up, se.up_proj.weight.grad.T, "shared up_proj")
    _close(dW_down_s, se.down_proj.weight.grad.T, "shared down_proj")
    _close(dw_gate, block.shared_expert_gate.weight.grad.T, "shared_expert_gate")
