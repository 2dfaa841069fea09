"""The families' new pieces (attention_ref/nn/: rope_scaling, soft_cap, gemma_rms_norm, geglu,
partial_rotary, fused_qkv, parallel_residual; the per-head q/k norm) against transformers' own
functions and modules, built from small configs with random weights (no download), forward and
every gradient through torch's autograd. Skipped without torch and transformers.

In float64 at 1e-12 (1e-10 for the whole GPT-NeoX layer), with transformers' float32 steps patched
to the same formulas in float64, each patch listed here:

* RoPE's ``inv_freq`` (``ROPE_INIT_FUNCTIONS``): ``torch.arange(...).to(dtype=torch.float)`` is
  float32; the test runs the function with ``torch.float`` read as float64 (its module's ``torch``
  replaced by a proxy), the formula untouched. Unpatched, float32, it agrees to 1e-6.
* Gemma 2's eager attention: ``softmax(..., dtype=torch.float32)`` runs in float64.

The RMSNorms of Gemma (``(1 + w)``) and Qwen3 (q/k norm) cast to float32 inside their forward,
so they are compared in float32, both sides, at 1e-5.
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from attention_ref.core.attention import scaled_dot_product_attention_backward as attention_backward  # noqa: E402
from attention_ref.core.attention import scaled_dot_product_attention_forward as attention_forward  # noqa: E402
from attention_ref.core.heads import merge_heads, merge_heads_backward, split_heads, split_heads_backward  # noqa: E402
from attention_ref.core.linear import linear_backward, linear_forward  # noqa: E402
from attention_ref.core.masks import causal_mask  # noqa: E402
from attention_ref.core.softmax import softmax_backward, softmax_forward  # noqa: E402
from attention_ref.nn.feed_forward import feed_forward_backward, feed_forward_forward  # noqa: E402
from attention_ref.nn.fused_qkv import fused_qkv_split_backward, fused_qkv_split_forward  # noqa: E402
from attention_ref.nn.geglu import geglu_backward, geglu_forward  # noqa: E402
from attention_ref.nn.gemma_rms_norm import gemma_rms_norm_backward, gemma_rms_norm_forward  # noqa: E402
from attention_ref.nn.parallel_residual import parallel_residual_backward, parallel_residual_forward  # noqa: E402
from attention_ref.nn.partial_rotary import partial_rotary_backward, partial_rotary_forward  # noqa: E402
from attention_ref.nn.rms_norm import rms_norm_backward, rms_norm_forward  # noqa: E402
from attention_ref.nn.rope_scaling import rope_frequencies  # noqa: E402
from attention_ref.nn.soft_cap import soft_cap_backward, soft_cap_forward  # noqa: E402


def _close(ours, theirs, what, rtol=1e-12):
    """Equal to ``rtol`` of the largest |value|."""
    theirs = theirs.detach().numpy() if hasattr(theirs, "detach") else np.asarray(theirs)
    assert np.shape(ours) == theirs.shape, f"{what}: shape {np.shape(ours)} != {theirs.shape}"
    scale = max(float(np.abs(theirs).max()), 1e-300)
    err = float(np.abs(np.asarray(ours, dtype=np.float64) - theirs).max())
    assert err <= rtol * scale, f"{what}: max abs error {err:.2e} against max |value| {scale:.2e}"


def _leaf(a, dtype=torch.float64):
    return torch.tensor(a, dtype=dtype, requires_grad=True)


# ------------------------------------------------------------------------ RoPE frequencies
class _TorchFloatIs64:
    """``torch`` with ``torch.float`` meaning float64: transformers' inv_freq formula in float64."""

    float = torch.float64

    def __getattr__(self, name):
        return getattr(torch, name)


SCALINGS = [
    {"rope_type": "linear", "factor": 4.0},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 8192},  # Llama 3.1
    {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 8192},  # Llama 3.2
    {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 0.5, "high_freq_factor": 3.0,
     "original_max_position_embeddings": 64},
]


@pytest.mark.parametrize("scaling", SCALINGS, ids=lambda s: f"{s['rope_type']}-{s['factor']}")
@pytest.mark.parametrize("head_dim,theta", [(64, 500000.0), (128, 500000.0), (16, 10000.0)])
def test_rope_frequencies_equal_transformers_rope_init_functions(monkeypatch, scaling, head_dim, theta):
    from transformers import modeling_rope_utils as rope_utils

    config = transformers.LlamaConfig(hidden_size=2 * head_dim, num_attention_heads=2, rope_scaling=dict(scaling),
                                      rope_theta=theta)
    init = rope_utils.ROPE_INIT_FUNCTIONS[scaling["rope_type"]]
    float32, attention_factor = init(config, "cpu")
    assert attention_factor == 1.0  # cos and sin are not rescaled for these types
    ours = rope_frequencies(head_dim, theta, scaling)
    _close(ours, float32.double(), "inv_freq (transformers in float32)", rtol=1e-6)
    monkeypatch.setattr(rope_utils, "torch", _TorchFloatIs64())
    float64, _ = init(config, "cpu")
    assert float64.dtype == torch.float64
    _close(ours, float64, "inv_freq (transformers in float64)")
    # a 5.x config's rope_parameters (rope_theta inside) goes in as it is
    parameters = getattr(config, "rope_parameters", None)
    if isinstance(parameters, dict) and "rope_theta" in parameters:
        _close(rope_frequencies(head_dim, scaling=parameters), float64, "inv_freq from rope_parameters")


@pytest.mark.parametrize("scaling", SCALINGS[:3], ids=lambda s: f"{s['rope_type']}-{s['factor']}")
def test_scaled_rope_equals_llama_rotary_embedding(scaling):
    """A Llama 3.x config's rope parameters as they are, through transformers' LlamaRotaryEmbedding and
    apply_rotary_pos_emb (their angles in float32: compared at 1e-5 for positions below 64)."""
    from transformers.models.llama import modeling_llama as m

    from attention_ref.nn.rope_scaling import scaled_rope_forward

    config = transformers.LlamaConfig(hidden_size=64, num_attention_heads=2, rope_scaling=dict(scaling),
                                      rope_theta=500000.0)
    parameters = getattr(config, "rope_parameters", None) or {**config.rope_scaling, "rope_theta": 500000.0}
    rng = np.random.default_rng(12)
    q = rng.standard_normal((1, 2, 7, 32))  # (B, H, N, Dh)
    positions = np.array([0, 1, 5, 17, 33, 48, 63])
    cos, sin = m.LlamaRotaryEmbedding(config)(torch.tensor(q), torch.tensor(positions)[None])
    theirs, _ = m.apply_rotary_pos_emb(torch.tensor(q), torch.tensor(q), cos, sin)
    ours, _ = scaled_rope_forward(q, positions, scaling=parameters)
    _close(ours, theirs, "rotated q", rtol=1e-5)


def test_partial_rotary_frequencies_from_a_gpt_neox_config():
    config = transformers.GPTNeoXConfig(hidden_size=64, num_attention_heads=2, rotary_pct=0.25,
                                        rotary_emb_base=100.0)
    parameters = getattr(config, "rope_parameters", None)
    if not isinstance(parameters, dict):
        pytest.skip("this transformers keeps rotary_pct outside rope_parameters")
    theta = rope_frequencies(32, scaling=parameters)
    assert len(theta) == 4  # int(32 * 0.25) = 8 rotated features, 4 pairs
    _close(theta, 100.0 ** (-np.arange(0, 8, 2) / 8), "partial frequencies")


# ------------------------------------------------------------------------ Gemma 2's soft cap
@pytest.mark.parametrize("shape,cap", [((1, 1, 3, 4), 50.0), ((2, 2, 5, 8), 1.0), ((1, 3, 4, 2), 0.3)])
def test_soft_capped_attention_equals_gemma2_eager_attention(monkeypatch, shape, cap):
    """scores = q k^T * scaling, capped, causal-masked, softmax, times v: our pairs composed against
    transformers' Gemma 2 eager_attention_forward, forward and dq, dk, dv."""
    from transformers.models.gemma2 import modeling_gemma2 as m

    softmax = torch.nn.functional.softmax
    monkeypatch.setattr(m.nn.functional, "softmax", lambda x, dim, dtype=None: softmax(x, dim=dim))  # the patch
    rng = np.random.default_rng(0)
    q, k, v = (3.0 * rng.standard_normal(shape) for _ in range(3))
    scaling = shape[-1] ** -0.5
    n = shape[-2]
    mask = np.where(causal_mask(n), 0.0, -np.inf)

    s = (q @ np.swapaxes(k, -1, -2)) * scaling  # (B, H, N, N)
    capped, cap_cache = soft_cap_forward(s, cap)
    weights, sm_cache = softmax_forward(capped + mask)
    out = weights @ v  # (B, H, N, Dh)

    module = torch.nn.Module()
    module.num_key_value_groups, module.head_dim = 1, shape[-1]
    tq, tk, tv = _leaf(q), _leaf(k), _leaf(v)
    theirs, _ = m.eager_attention_forward(module.eval(), tq, tk, tv, torch.tensor(mask)[None, None],  # (1, 1, N, N): 4.57 slices 4 axes
                                        scaling=scaling, softcap=cap)
    _close(out, theirs.transpose(1, 2), "soft-capped attention")
    dout = rng.standard_normal(out.shape)
    theirs.backward(torch.tensor(dout).transpose(1, 2))
    dweights = dout @ np.swapaxes(v, -1, -2)
    ds = soft_cap_backward(softmax_backward(dweights, sm_cache), cap_cache) * scaling
    _close(ds @ k, tq.grad, "dq")
    _close(np.swapaxes(ds, -1, -2) @ q, tk.grad, "dk")
    _close(np.swapaxes(weights, -1, -2) @ dout, tv.grad, "dv")


def test_soft_cap_of_the_final_logits_equals_torch_autograd():
    rng = np.random.default_rng(1)
    logits = 60.0 * rng.standard_normal((2, 3, 11))
    y, cache = soft_cap_forward(logits, 30.0)
    t = _leaf(logits)
    theirs = torch.tanh(t / 30.0) * 30.0  # Gemma2ForCausalLM's three lines
    _close(y, theirs, "capped logits")
    dy = rng.standard_normal(y.shape)
    theirs.backward(torch.tensor(dy))
    _close(soft_cap_backward(dy, cache), t.grad, "d logits")


# ------------------------------------------------------------------------ Gemma's GeGLU and norm
@pytest.mark.parametrize("lead", [(3,), (2, 4)])
def test_geglu_equals_gemma2_mlp(lead):
    from transformers.models.gemma2.modeling_gemma2 import Gemma2MLP

    config = transformers.Gemma2Config(hidden_size=8, intermediate_size=12, hidden_activation="gelu_pytorch_tanh")
    torch.manual_seed(0)
    mlp = Gemma2MLP(config).double()
    W = {name: p.detach().numpy().T for name, p in
         (("gate", mlp.gate_proj.weight), ("up", mlp.up_proj.weight), ("down", mlp.down_proj.weight))}
    x = 2.0 * np.random.default_rng(2).standard_normal(lead + (8,))
    y, cache = geglu_forward(x, W["gate"], W["up"], W["down"])
    tx = _leaf(x)
    theirs = mlp(tx)
    _close(y, theirs, "GeGLU")
    dy = np.random.default_rng(3).standard_normal(y.shape)
    theirs.backward(torch.tensor(dy))
    dx, dW_gate, dW_up, dW_down = geglu_backward(dy, cache)
    _close(dx, tx.grad, "dx")
    _close(dW_gate, mlp.gate_proj.weight.grad.T, "d gate_proj")
    _close(dW_up, mlp.up_proj.weight.grad.T, "d up_proj")
    _close(dW_down, mlp.down_proj.weight.grad.T, "d down_proj")


def _norm_against(module, forward, backward, x, what):
    """Our norm pair in float32 against a transformers norm module (float32 inside), forward and grads."""
    weight = module.weight.detach().numpy()
    y, cache = forward(x, weight, module_eps(module))
    tx = _leaf(x, torch.float32)
    theirs = module(tx)
    _close(y, theirs, what, rtol=1e-5)
    dy = np.random.default_rng(4).standard_normal(y.shape).astype(np.float32)
    theirs.backward(torch.tensor(dy))
    dx, dweight = backward(dy, cache)
    assert y.dtype == dx.dtype == dweight.dtype == np.float32
    _close(dx, tx.grad, f"{what}: dx", rtol=1e-5)
    _close(dweight, module.weight.grad, f"{what}: d weight", rtol=1e-5)


def module_eps(module):
    return float(getattr(module, "eps", getattr(module, "variance_epsilon", None)))


@pytest.mark.parametrize("family", ["gemma2", "gemma3"])
def test_gemma_rms_norm_equals_transformers(family):
    cls = {"gemma2": "Gemma2RMSNorm", "gemma3": "Gemma3RMSNorm"}[family]
    module = getattr(__import__(f"transformers.models.{family}.modeling_{family}", fromlist=[cls]), cls)(6, eps=1e-6)
    with torch.no_grad():
        module.weight.copy_(torch.randn(6))  # random, not the zeros it starts from
    x = (3.0 * np.random.default_rng(5).standard_normal((2, 3, 6))).astype(np.float32)
    _norm_against(module, gemma_rms_norm_forward, gemma_rms_norm_backward, x, cls)


def test_qwen3_q_norm_is_rms_norm_over_each_head():
    """Qwen3's q_norm acts on (B, N, H, Dh) after the projection; ours on the split heads (B, H, N, Dh)."""
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    module = Qwen3RMSNorm(4, eps=1e-6)
    with torch.no_grad():
        module.weight.copy_(torch.randn(4))
    q = (2.0 * np.random.default_rng(6).standard_normal((2, 5, 3 * 4))).astype(np.float32)  # (B, N, H Dh)
    heads = split_heads(q, 3)  # (B, H, N, Dh)
    y, _ = rms_norm_forward(heads, module.weight.detach().numpy(), 1e-6)
    theirs = module(torch.tensor(q).view(2, 5, 3, 4)).transpose(1, 2)  # Qwen3Attention's view, then transpose
    _close(y, theirs, "Qwen3 q_norm", rtol=1e-5)
    _norm_against(module, rms_norm_forward, rms_norm_backward, np.ascontiguousarray(heads), "Qwen3RMSNorm")


# ------------------------------------------------------------------------ GPT-NeoX
@pytest.mark.parametrize("rotary_pct", [0.25, 0.5, 1.0])
def test_partial_rotary_equals_gpt_neox_apply_rotary_pos_emb(rotary_pct):
    from transformers.models.gpt_neox.modeling_gpt_neox import apply_rotary_pos_emb

    B, H, N, Dh = 2, 3, 5, 16
    r = int(Dh * rotary_pct)
    rng = np.random.default_rng(7)
    q, k = rng.standard_normal((B, H, N, Dh)), rng.standard_normal((B, H, N, Dh))
    positions = np.arange(N)
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, r, 2, dtype=torch.float64) / r))  # transformers' formula
    freqs = torch.tensor(positions, dtype=torch.float64)[None, :, None] * inv_freq  # (1, N, r/2)
    emb = torch.cat((freqs, freqs), dim=-1)
    tq, tk = _leaf(q), _leaf(k)
    their_q, their_k = apply_rotary_pos_emb(tq, tk, emb.cos(), emb.sin())
    our_q, cache_q = partial_rotary_forward(q, r, positions)
    our_k, cache_k = partial_rotary_forward(k, r, positions)
    _close(our_q, their_q, "rotated q")
    _close(our_k, their_k, "rotated k")
    dq, dk = rng.standard_normal(q.shape), rng.standard_normal(k.shape)
    (their_q * torch.tensor(dq) + their_k * torch.tensor(dk)).sum().backward()
    _close(partial_rotary_backward(dq, cache_q), tq.grad, "dq")
    _close(partial_rotary_backward(dk, cache_k), tk.grad, "dk")


def _neox_layer(rotary_pct, parallel):
    config = transformers.GPTNeoXConfig(vocab_size=10, hidden_size=24, num_attention_heads=3, intermediate_size=20,
                                        rotary_pct=rotary_pct, rotary_emb_base=100.0, hidden_act="gelu",
                                        use_parallel_residual=parallel, attention_bias=True, hidden_dropout=0.0,
                                        attention_dropout=0.0, layer_norm_eps=1e-5)
    config._attn_implementation = "sdpa"  # its softmax runs in the model's dtype
    torch.manual_seed(0)
    layer = transformers.models.gpt_neox.modeling_gpt_neox.GPTNeoXLayer(config, 0).double().eval()
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(0.1 * torch.randn_like(p))  # biases and norms away from 0 and 1
    return config, layer


def _neox_forward(x, p, H, r, positions, base, eps):
    """GPT-NeoX's block from the pieces: the fused QKV split, partial rotary, causal attention, the
    GELU MLP, all inside the parallel residual. Returns y and a function giving every gradient."""
    N = x.shape[-2]

    def attn(z):
        qkv, c_qkv = linear_forward(z, p["W_qkv"], p["b_qkv"])  # (B, N, 3 D)
        (q, k, v), c_split = fused_qkv_split_forward(qkv, H)  # (B, N, D) each
        q, k, v = split_heads(q, H), split_heads(k, H), split_heads(v, H)  # (B, H, N, Dh)
        q, c_q = partial_rotary_forward(q, r, positions, base)
        k, c_k = partial_rotary_forward(k, r, positions, base)
        o, c_att = attention_forward(q, k, v, causal_mask(N))  # (B, H, N, Dh)
        out, c_dense = linear_forward(merge_heads(o), p["W_dense"], p["b_dense"])  # (B, N, D)
        return out, (c_qkv, c_split, c_q, c_k, c_att, c_dense)

    def attn_backward(dout, c):
        c_qkv, c_split, c_q, c_k, c_att, c_dense = c
        dmerged, dW_dense, db_dense = linear_backward(dout, c_dense)
        dq, dk, dv = attention_backward(merge_heads_backward(dmerged, H), c_att)
        dq, dk = partial_rotary_backward(dq, c_q), partial_rotary_backward(dk, c_k)
        dqkv = fused_qkv_split_backward(tuple(split_heads_backward(g) for g in (dq, dk, dv)), c_split)
        dz, dW_qkv, db_qkv = linear_backward(dqkv, c_qkv)
        return dz, {"W_qkv": dW_qkv, "b_qkv": db_qkv, "W_dense": dW_dense, "b_dense": db_dense}

    mlp_params = {"W_1": p["W_1"], "b_1": p["b_1"], "W_2": p["W_2"], "b_2": p["b_2"]}
    y, cache = parallel_residual_forward(x, attn, lambda z: feed_forward_forward(z, mlp_params, "gelu_exact"),
                                         p["g1"], p["b1"], p["g2"], p["b2"], eps)

    def grads(dy):
        dx, d_attn, d_mlp, dg1, db1, dg2, db2 = parallel_residual_backward(dy, cache, attn_backward,
                                                                           feed_forward_backward)
        return dx, {**d_attn, **d_mlp, "g1": dg1, "b1": db1, "g2": dg2, "b2": db2}
    return y, grads


NEOX_NAMES = {"W_qkv": "attention.query_key_value.weight", "b_qkv": "attention.query_key_value.bias",
              "W_dense": "attention.dense.weight", "b_dense": "attention.dense.bias",
              "W_1": "mlp.dense_h_to_4h.weight", "b_1": "mlp.dense_h_to_4h.bias",
              "W_2": "mlp.dense_4h_to_h.weight", "b_2": "mlp.dense_4h_to_h.bias",
              "g1": "input_layernorm.weight", "b1": "input_layernorm.bias",
              "g2": "post_attention_layernorm.weight", "b2": "post_attention_layernorm.bias"}


@pytest.mark.parametrize("rotary_pct", [0.25, 1.0])
def test_gpt_neox_layer_from_the_pieces_equals_transformers(rotary_pct):
    """The whole GPTNeoXLayer (parallel residual) in float64: output, dx and all 12 parameter gradients
    at 1e-10. The cos and sin are given to transformers from the float64 formula (the patch of its
    float32 rotary embedding)."""
    config, layer = _neox_layer(rotary_pct, parallel=True)
    state = {k: v.detach().numpy() for k, v in layer.state_dict().items()}
    p = {ours: state[theirs].T if theirs.endswith("weight") and state[theirs].ndim == 2 else state[theirs]
         for ours, theirs in NEOX_NAMES.items()}
    B, N, D, H = 2, 6, 24, 3
    r = int(D // H * rotary_pct)
    x = np.random.default_rng(8).standard_normal((B, N, D))
    positions = np.arange(N)
    y, grads = _neox_forward(x, p, H, r, positions, 100.0, 1e-5)

    inv_freq = 1.0 / (100.0 ** (torch.arange(0, r, 2, dtype=torch.float64) / r))
    freqs = torch.arange(N, dtype=torch.float64)[None, :, None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    tx = _leaf(x)
    theirs = layer(tx, attention_mask=None, position_ids=torch.arange(N)[None],
                   position_embeddings=(emb.cos(), emb.sin()))
    theirs = theirs[0] if isinstance(theirs, tuple) else theirs
    _close(y, theirs, "GPT-NeoX layer", rtol=1e-10)
    dy = np.random.default_rng(9).standard_normal(y.shape)
    theirs.backward(torch.tensor(dy))
    dx, ours = grads(dy)
    _close(dx, tx.grad, "dx", rtol=1e-10)
    named = dict(layer.named_parameters())
    assert sorted(NEOX_NAMES.values()) == sorted(named)  # every parameter is compared
    for name, their_name in NEOX_NAMES.items():
        g = named[their_name].grad
        _close(ours[name], g.T if g.ndim == 2 else g, f"d {their_name}", rtol=1e-10)


def test_fused_qkv_split_equals_gpt_neox_view_and_chunk():
    """GPTNeoXAttention: qkv.view(B, N, H, 3 Dh).transpose(1, 2).chunk(3, dim=-1)."""
    rng = np.random.default_rng(10)
    qkv = rng.standard_normal((2, 5, 3 * 4 * 3))  # H = 3, Dh = 4
    their_q, their_k, their_v = torch.tensor(qkv).view(2, 5, 3, 12).transpose(1, 2).chunk(3, dim=-1)
    (q, k, v), _ = fused_qkv_split_forward(qkv, 3)
    for ours, theirs, what in ((q, their_q, "q"), (k, their_k, "k"), (v, their_v, "v")):
        assert np.array_equal(split_heads(ours, 3), theirs.numpy()), what


def test_phi3_blocks_split_equals_phi3_attention_slices():
    """Phi3Attention: qkv[..., :H Dh], qkv[..., H Dh:(H + Hkv) Dh], qkv[..., (H + Hkv) Dh:]."""
    rng = np.random.default_rng(11)
    H, Hkv, Dh = 4, 2, 3
    qkv = rng.standard_normal((2, 5, (H + 2 * Hkv) * Dh))
    t = torch.tensor(qkv)
    query_pos = H * Dh
    theirs = (t[..., :query_pos], t[..., query_pos:query_pos + Hkv * Dh], t[..., query_pos + Hkv * Dh:])
    (q, k, v), _ = fused_qkv_split_forward(qkv, H, Hkv, layout="blocks")
    for ours, their, what in zip((q, k, v), theirs, "qkv"):
        assert np.array_equal(ours, their.numpy()), what
