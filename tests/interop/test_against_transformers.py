"""Ours against the reference code: torch.nn.MultiheadAttention, transformers' GPT-2 and Llama,
built from small configs with random weights (no download), in float64; outputs and every
gradient (inputs and weights) at 1e-10 relative. Skipped when torch or transformers is absent
(``pip install torch==2.13.0 transformers==4.57.1``; CPU build).

transformers computes Llama's RMSNorm and RoPE angles in float32 even in a float64 model
(``hidden_states.to(torch.float32)``, ``inv_freq.float()``): the test runs both with the same
formulas in float64 (``attention_ref.interop.llama_in_float64()``), and uses the ``sdpa`` attention (its softmax runs in the model's
dtype), so that 1e-10 compares formulas, not float32 rounding.
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import attention_ref as ar  # noqa: E402
from _transformers_api import returned_cache, with_cache  # noqa: E402
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


def _every_gradient(model, ours):
    """Every parameter's gradient of ``model`` against ``ours`` (transformers' names -> arrays):
    the two sets of names must be the same, so none is skipped."""
    named = {k: p for k, p in model.named_parameters() if p.grad is not None}
    assert sorted(ours) == sorted(named), sorted(set(ours) ^ set(named))
    for name, p in named.items():
        scale = None
        if name.endswith("key.bias"):  # d b_k is 0 up to rounding (softmax is shift-invariant):
            scale = float(named[name.replace("key.bias", "query.bias")].grad.abs().max())  # its neighbour's
        _close(ours[name], p.grad, f"d {name}", scale=scale)


def _block_grads(table, grads, prefix):
    """Our block's gradients under transformers' names (the converter's table, backwards)."""
    from attention_ref.interop.mappings import MAPPINGS
    from attention_ref.interop.pretrained import _reverse

    return _reverse(MAPPINGS[table], grads, "", prefix)


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
    theirs = _block_grads("transformers GPT2Block (h.<i>.)", grads, "h.0.")
    theirs.update({"wpe.weight": np.pad(dx.sum(axis=0), ((0, config.n_positions - N), (0, 0))),
                   "ln_f.weight": dgamma_f, "ln_f.bias": dbeta_f})
    _every_gradient(model, theirs)  # all 12 tensors of the block, wpe and ln_f


# -- Llama -------------------------------------------------------------------------------------------

@pytest.fixture
def llama_in_float64():
    """transformers' RMSNorm and RoPE angles in float64 (their code casts to float32)."""
    from attention_ref.interop import llama_in_float64

    with llama_in_float64():
        yield


@pytest.mark.parametrize("kv_heads", [2, 4])
def test_llama_model_layer(llama_in_float64, kv_heads):
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
    theirs = _block_grads("transformers LlamaDecoderLayer (layers.<i>.)", grads, "layers.0.")
    theirs["norm.weight"] = dnorm
    _every_gradient(model, theirs)  # the block's 9 tensors and the final norm


# -- KV-cache decoding, step by step, against the model's own past_key_values --------------------

def _decode_theirs(model, x, splits):
    """The model's outputs for x fed in pieces, with its own cache."""
    outs, past, start = [], None, 0
    with torch.no_grad():
        for t in splits:
            res = model(inputs_embeds=x[:, start:start + t], **with_cache(model, past))
            outs.append(res.last_hidden_state)
            past, start = returned_cache(res), start + t
    return torch.cat(outs, dim=1)


def test_llama_decoding_matches_past_key_values(llama_in_float64):
    from attention_ref.variants.kv_cache import KVCache

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
    dx, dgamma_e, dbeta_e = ar.layer_norm_backward(de, e_cache)
    _close(dx, x.grad, "d inputs_embeds")
    theirs = _block_grads("transformers BertLayer (encoder.layer.<i>.)", grads, "encoder.layer.0.")
    theirs.update({"embeddings.position_embeddings.weight": np.pad(dx.sum(axis=0), ((0, 32 - N), (0, 0))),
                   "embeddings.token_type_embeddings.weight": np.stack([dx.sum(axis=(0, 1)), np.zeros(16)]),
                   "embeddings.LayerNorm.weight": dgamma_e, "embeddings.LayerNorm.bias": dbeta_e})
    _every_gradient(model, theirs)  # the layer's 16 tensors and the embeddings'


# -- the fixtures of notebook 16 still come from transformers ----------------------------------------

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
