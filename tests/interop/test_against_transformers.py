"""Ours against the reference code: torch.nn.MultiheadAttention, transformers' GPT-2 and Llama,
built from small configs with random weights (no download), in float64; outputs and every
gradient (inputs and weights) at 1e-10 relative. Skipped when torch or transformers is absent
(``pip install torch==2.13.0 transformers==4.57.1``; CPU build).

transformers computes Llama's RMSNorm and RoPE angles in float32 even in a float64 model
(``hidden_states.to(torch.float32)``, ``inv_freq.float()``): the test patches both with the
same formulas in float64, and uses the ``sdpa`` attention (its softmax runs in the model's
dtype), so that 1e-10 compares formulas, not float32 rounding.
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import attention_ref as ar  # noqa: E402
from attention_ref.interop import (  # noqa: E402
    from_gpt2_block,
    from_llama_block,
    from_torch_multihead_attention,
)

RTOL = 1e-10


def _close(ours, theirs, what, scale=None):
    """Equal to 1e-10 of ``scale`` (default: the largest |value|; a gradient that is zero up to
    rounding, such as the key bias's, is measured against its neighbours' instead)."""
    theirs = theirs.detach().numpy() if hasattr(theirs, "detach") else np.asarray(theirs)
    scale = max(float(np.abs(theirs).max()) if scale is None else scale, 1e-300)
    err = float(np.abs(np.asarray(ours) - theirs).max())
    assert err <= RTOL * scale, f"{what}: max abs error {err:.2e} against max |value| {scale:.2e}"


def _state(module):
    return {k: v.detach().numpy() for k, v in module.state_dict().items()}


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# -- torch.nn.MultiheadAttention ---------------------------------------------------------------------

@pytest.mark.parametrize("masked", [False, True])
def test_torch_multihead_attention(masked):
    E, h, B, N, M = 12, 3, 2, 5, 7
    mha = torch.nn.MultiheadAttention(E, h, bias=True, batch_first=True, dtype=torch.float64)
    with torch.no_grad():
        mha.in_proj_bias.normal_()
        mha.out_proj.bias.normal_()
    q = torch.randn(B, N, E, dtype=torch.float64, requires_grad=True)
    kv = torch.randn(B, M, E, dtype=torch.float64, requires_grad=True)
    keep = torch.rand(N, M) < 0.7
    keep[:, 0] = True
    out, _ = mha(q, kv, kv, need_weights=False, attn_mask=~keep if masked else None)  # torch: True = blocked
    dout = torch.randn_like(out)
    (out * dout).sum().backward()
    params = from_torch_multihead_attention(_state(mha))
    ours, cache = ar.multi_head_attention_forward(q.detach().numpy(), kv.detach().numpy(), kv.detach().numpy(),
                                                  params, h, keep.numpy() if masked else None)
    _close(ours, out, "output")
    dquery, dkey, dvalue, grads = ar.multi_head_attention_backward(dout.numpy(), cache)
    _close(dquery, q.grad, "d query")
    _close(dkey + dvalue, kv.grad, "d key + d value")
    W = mha.in_proj_weight.grad.numpy()
    for i, n in enumerate("qkv"):
        _close(grads[f"W_{n}"], W[i * E:(i + 1) * E].T, f"dW_{n}")
        _close(grads[f"b_{n}"], mha.in_proj_bias.grad[i * E:(i + 1) * E], f"db_{n}",  # db_k is 0: softmax is
               scale=float(mha.in_proj_bias.grad.abs().max()))                      # shift-invariant
    _close(grads["W_o"], mha.out_proj.weight.grad.T, "dW_o")
    _close(grads["b_o"], mha.out_proj.bias.grad, "db_o")


# -- GPT-2 -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("scale_attn_weights", [True, False])
def test_gpt2_model_layer(scale_attn_weights):
    """GPT-2's scale_attn_weights=False (scores q.k unscaled) is our scale=1.0."""
    config = transformers.GPT2Config(n_embd=16, n_head=4, n_layer=1, n_positions=32, resid_pdrop=0.0,
                                     embd_pdrop=0.0, attn_pdrop=0.0, attn_implementation="eager",
                                     scale_attn_weights=scale_attn_weights)
    model = transformers.GPT2Model(config).double().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "ln" in name:
                p.add_(0.1 * torch.randn_like(p))  # no special values
    B, N = 2, 6
    x = torch.randn(B, N, 16, dtype=torch.float64, requires_grad=True)
    out = model(inputs_embeds=x).last_hidden_state
    dout = torch.randn_like(out)
    (out * dout).sum().backward()

    state = _state(model)
    params = from_gpt2_block(state, prefix="h.0.")
    h0 = x.detach().numpy() + state["wpe.weight"][:N]  # GPT2Model adds the position embeddings
    y, cache = ar.gpt2_block_forward(h0, params, 4, eps=config.layer_norm_epsilon,
                                     scale=None if scale_attn_weights else 1.0)
    ours, ln_cache = ar.layer_norm_forward(y, state["ln_f.weight"], state["ln_f.bias"], eps=config.layer_norm_epsilon)
    _close(ours, out, "output")
    dy, dgamma_f, dbeta_f = ar.layer_norm_backward(dout.numpy(), ln_cache)
    dx, grads = ar.gpt2_block_backward(dy, cache)
    _close(dx, x.grad, "d inputs_embeds")
    named = dict(model.named_parameters())
    c_attn = named["h.0.attn.c_attn.weight"].grad.numpy()
    for i, n in enumerate("qkv"):
        _close(grads[f"self_attn.W_{n}"], c_attn[:, i * 16:(i + 1) * 16], f"dW_{n}")
    for ours_name, theirs in [("self_attn.W_o", "h.0.attn.c_proj.weight"), ("ffn.W_1", "h.0.mlp.c_fc.weight"),
                              ("ffn.W_2", "h.0.mlp.c_proj.weight"), ("ln1.gamma", "h.0.ln_1.weight"),
                              ("ln2.beta", "h.0.ln_2.bias"), ("ffn.b_1", "h.0.mlp.c_fc.bias")]:
        _close(grads[ours_name], named[theirs].grad, ours_name)
    _close(dgamma_f, named["ln_f.weight"].grad, "d ln_f")


# -- Llama -------------------------------------------------------------------------------------------

def _llama_in_float64(monkeypatch, m):
    """transformers' RMSNorm and RoPE angles, in float64 (their code casts to float32)."""
    def rms_norm(self, hidden_states):
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))

    def rotary(self, x, position_ids):
        inv_freq = 1.0 / (self.config.rope_theta ** (torch.arange(0, self.inv_freq.shape[0] * 2, 2,
                                                                    dtype=torch.float64) / (self.inv_freq.shape[0] * 2)))
        freqs = position_ids[:, :, None].to(torch.float64) * inv_freq[None, None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    monkeypatch.setattr(m.LlamaRMSNorm, "forward", rms_norm)
    monkeypatch.setattr(m.LlamaRotaryEmbedding, "forward", rotary)


@pytest.mark.parametrize("kv_heads", [2, 4])
def test_llama_model_layer(monkeypatch, kv_heads):
    from transformers.models.llama import modeling_llama

    _llama_in_float64(monkeypatch, modeling_llama)
    config = transformers.LlamaConfig(hidden_size=16, intermediate_size=24, num_attention_heads=4,
                                      num_key_value_heads=kv_heads, num_hidden_layers=1, rms_norm_eps=1e-6,
                                      rope_theta=500.0, max_position_embeddings=64, vocab_size=32,
                                      attn_implementation="sdpa")
    model = transformers.LlamaModel(config).double().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
            else:
                p.mul_(10.0)  # std 0.2: the attention is not uniform
    B, N = 2, 7
    x = torch.randn(B, N, 16, dtype=torch.float64, requires_grad=True)
    out = model(inputs_embeds=x).last_hidden_state
    dout = torch.randn_like(out)
    (out * dout).sum().backward()

    state = _state(model)
    params = from_llama_block(state, 4, prefix="layers.0.")
    y, cache = ar.llama_block_forward(x.detach().numpy(), params, 4, num_kv_heads=kv_heads, rope_base=500.0, eps=1e-6)
    ours, norm_cache = ar.rms_norm_forward(y, state["norm.weight"], eps=1e-6)
    _close(ours, out, "output")
    dy, dnorm = ar.rms_norm_backward(dout.numpy(), norm_cache)
    dx, grads = ar.llama_block_backward(dy, cache)
    _close(dx, x.grad, "d inputs_embeds")
    named = dict(model.named_parameters())
    for ours_name, theirs in [("self_attn.W_q", "q_proj"), ("self_attn.W_k", "k_proj"), ("self_attn.W_v", "v_proj"),
                              ("self_attn.W_o", "o_proj"), ("mlp.W_gate", "gate_proj"), ("mlp.W_up", "up_proj"),
                              ("mlp.W_down", "down_proj")]:
        group = "self_attn" if ours_name.startswith("self_attn") else "mlp"
        _close(grads[ours_name], named[f"layers.0.{group}.{theirs}.weight"].grad.T, ours_name)
    _close(grads["input_norm.weight"], named["layers.0.input_layernorm.weight"].grad, "d input_layernorm")
    _close(grads["post_attention_norm.weight"], named["layers.0.post_attention_layernorm.weight"].grad,
           "d post_attention_layernorm")
    _close(dnorm, named["norm.weight"].grad, "d norm")


# -- KV-cache decoding, step by step, against the model's own past_key_values --------------------

def _decode_theirs(model, x, splits):
    """The model's outputs for x fed in pieces, with its own cache."""
    outs, past, start = [], None, 0
    with torch.no_grad():
        for t in splits:
            res = model(inputs_embeds=x[:, start:start + t], past_key_values=past, use_cache=True)
            outs.append(res.last_hidden_state)
            past, start = res.past_key_values, start + t
    return torch.cat(outs, dim=1)


def test_llama_decoding_matches_past_key_values(monkeypatch):
    from transformers.models.llama import modeling_llama

    from attention_ref.variants.kv_cache import KVCache

    _llama_in_float64(monkeypatch, modeling_llama)
    config = transformers.LlamaConfig(hidden_size=16, intermediate_size=24, num_attention_heads=4,
                                      num_key_value_heads=2, num_hidden_layers=1, rms_norm_eps=1e-6, rope_theta=500.0,
                                      max_position_embeddings=64, vocab_size=32, attn_implementation="sdpa")
    model = transformers.LlamaModel(config).double().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.mul_(10.0) if "norm" not in name else p.add_(0.1 * torch.randn_like(p))
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    splits = (3, 1, 1, 2)  # a prompt, two single tokens, then two at once
    theirs = _decode_theirs(model, x, splits)
    state = _state(model)
    params = from_llama_block(state, 4, prefix="layers.0.")
    cache, outs, start = KVCache(), [], 0
    for t in splits:
        y = ar.llama_block_decode_step(x[:, start:start + t].numpy(), params, 4, cache, num_kv_heads=2,
                                       rope_base=500.0, eps=1e-6)
        outs.append(ar.rms_norm_forward(y, state["norm.weight"], eps=1e-6)[0])
        start += t
    _close(np.concatenate(outs, axis=1), theirs, "decoded outputs")
    assert cache.keys.shape == (2, 2, 7, 4)  # cached once per key/value head


def test_gpt2_decoding_matches_past_key_values():
    from attention_ref.variants.kv_cache import KVCache

    config = transformers.GPT2Config(n_embd=16, n_head=4, n_layer=1, n_positions=32, resid_pdrop=0.0,
                                     embd_pdrop=0.0, attn_pdrop=0.0, attn_implementation="eager")
    model = transformers.GPT2Model(config).double().eval()
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    splits = (2, 1, 3)
    theirs = _decode_theirs(model, x, splits)
    state = _state(model)
    params = from_gpt2_block(state, prefix="h.0.")
    eps = config.layer_norm_epsilon
    cache, outs, start = KVCache(), [], 0
    for t in splits:
        h0 = x[:, start:start + t].numpy() + state["wpe.weight"][start:start + t]  # positions continue
        y = ar.gpt2_block_decode_step(h0, params, 4, cache, eps=eps)
        outs.append(ar.layer_norm_forward(y, state["ln_f.weight"], state["ln_f.bias"], eps=eps)[0])
        start += t
    _close(np.concatenate(outs, axis=1), theirs, "decoded outputs")


# -- BERT --------------------------------------------------------------------------------------------

def test_bert_model_layer():
    """BertLayer is the post-norm encoder block with the exact GELU: our encoder block."""
    from attention_ref.interop import from_bert_layer

    config = transformers.BertConfig(hidden_size=16, num_attention_heads=4, intermediate_size=32, num_hidden_layers=1,
                                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, vocab_size=32,
                                     max_position_embeddings=32, attn_implementation="eager")
    model = transformers.BertModel(config, add_pooling_layer=False).double().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    B, N = 2, 5
    x = torch.randn(B, N, 16, dtype=torch.float64, requires_grad=True)
    out = model(inputs_embeds=x).last_hidden_state
    dout = torch.randn_like(out)
    (out * dout).sum().backward()

    state = _state(model)
    eps = config.layer_norm_eps
    emb = x.detach().numpy() + state["embeddings.position_embeddings.weight"][:N] \
        + state["embeddings.token_type_embeddings.weight"][0]
    e, e_cache = ar.layer_norm_forward(emb, state["embeddings.LayerNorm.weight"], state["embeddings.LayerNorm.bias"], eps)
    params = from_bert_layer(state, prefix="encoder.layer.0.")
    ours, cache = ar.encoder_block_forward(e, params, 4, activation="gelu_exact", eps=eps)
    _close(ours, out, "output")
    de, grads = ar.encoder_block_backward(dout.numpy(), cache)
    dx, _, _ = ar.layer_norm_backward(de, e_cache)
    _close(dx, x.grad, "d inputs_embeds")
    named = dict(model.named_parameters())
    for ours_name, theirs in [("self_attn.W_q", "attention.self.query.weight"), ("ffn.W_1", "intermediate.dense.weight"),
                              ("ffn.W_2", "output.dense.weight"), ("self_attn.W_o", "attention.output.dense.weight")]:
        _close(grads[ours_name], named[f"encoder.layer.0.{theirs}"].grad.T, ours_name)
    _close(grads["ln2.gamma"], named["encoder.layer.0.output.LayerNorm.weight"].grad, "d ln2")


# -- the fixtures of notebook 14 still come from transformers ----------------------------------------

@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_notebook_fixtures_are_what_transformers_computes(name):
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("real_model_fixtures", root / "examples" / "real_model_fixtures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fresh, _ = module.build(name)
    with np.load(root / "notebooks" / "data" / f"{name}_layer.npz") as committed:
        assert sorted(committed.files) == sorted(fresh)
        for key in committed.files:
            np.testing.assert_allclose(committed[key], fresh[key], rtol=1e-12, atol=1e-14, err_msg=key)
