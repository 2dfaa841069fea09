"""Phi-3 as a whole model without torch: its config read from both transformers spellings, what it
can switch on that is not computed here refused by name, the fused params equal to Llama's pieces
side by side (the same logits as the Llama-like model built from those pieces), the folder
round trip, and float32 staying float32. (Its gradients against finite differences and the
decoder against the forward are in test_whole_models.py's CONFIGS.)"""
import json

import numpy as np
import pytest

import attention_ref as ar
from attention_ref.interop import load_pretrained, to_transformers, write_safetensors

#: Phi-3-mini-4k's config.json as transformers 4.x writes it, shrunk
PHI3_4X = {"model_type": "phi3", "architectures": ["Phi3ForCausalLM"], "vocab_size": 13, "hidden_size": 8,
           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 12,
           "hidden_act": "silu", "max_position_embeddings": 32, "original_max_position_embeddings": 32,
           "rms_norm_eps": 1e-5, "rope_theta": 100.0, "rope_scaling": None, "partial_rotary_factor": 1.0,
           "sliding_window": 3, "tie_word_embeddings": False, "pad_token_id": 0, "bos_token_id": 1,
           "eos_token_id": 2, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attention_dropout": 0.0}
#: the same as 5.x writes it
PHI3_5X = {**{k: v for k, v in PHI3_4X.items() if k not in ("rope_theta", "rope_scaling", "partial_rotary_factor")},
           "rope_parameters": {"rope_type": "default", "rope_theta": 100.0, "partial_rotary_factor": 1.0}}


def test_both_spellings_give_the_same_config():
    a, b = ar.LMConfig.from_dict(PHI3_4X), ar.LMConfig.from_dict(PHI3_5X)
    assert a == b
    assert (a.family, a.sliding_window, a.pad_token_id, a.fused_projections) == ("phi3", 3, 0, True)
    assert ar.LMConfig.from_dict({**PHI3_4X, "sliding_window": None}).sliding_window is None


def test_what_is_not_computed_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="phi3: the RoPE scaling rope_type = 'longrope' is not supported"):
        ar.LMConfig.from_dict({**PHI3_5X, "rope_parameters": {"rope_type": "longrope", "rope_theta": 100.0,
                                                             "short_factor": [1.0], "long_factor": [1.0]}})
    with pytest.raises(ValueError, match="phi3: partial_rotary_factor = 0.5 is not supported"):
        ar.LMConfig.from_dict({**PHI3_4X, "partial_rotary_factor": 0.5})
    with pytest.raises(ValueError, match="phi3: the RoPE partial_rotary_factor = 0.5 is not supported"):
        ar.LMConfig.from_dict({**PHI3_5X, "rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5}})
    for field, value in (("sliding_window", 0), ("partial_rotary_factor", "1"), ("tie_word_embeddings", 0)):
        (tmp_path / "config.json").write_text(json.dumps({**PHI3_4X, field: value}))
        with pytest.raises(ValueError, match=f"config.json: field '{field}'"):
            load_pretrained(tmp_path)


def test_the_fused_params_are_llamas_pieces_side_by_side():
    """A Phi-3 model and the Mistral model (Llama with the same window) whose W_q, W_k, W_v and
    W_gate, W_up are the fused weights' column blocks give the same logits; the fused gradients
    are the pieces' gradients side by side."""
    config = ar.LMConfig.from_dict(PHI3_4X)
    params = ar.init_lm_params(config, seed=3)
    mistral = ar.LMConfig(**{**config.to_dict(), "family": "mistral"})
    pieces = {k: v for k, v in params.items() if not k.endswith(("W_qkv", "W_gate_up"))}
    for i in range(config.num_layers):
        q, k, v = np.split(params[f"layers.{i}.self_attn.W_qkv"], [8, 12], axis=1)  # H Dh = 8, Hkv Dh = 4
        gate, up = np.split(params[f"layers.{i}.mlp.W_gate_up"], 2, axis=1)
        pieces.update({f"layers.{i}.self_attn.W_q": q, f"layers.{i}.self_attn.W_k": k,
                       f"layers.{i}.self_attn.W_v": v, f"layers.{i}.mlp.W_gate": gate, f"layers.{i}.mlp.W_up": up})
    ids = np.array([[1, 2, 3, 4, 5, 6]])
    loss, grads, logits = ar.lm_loss(ids, params, config)
    loss_m, grads_m, logits_m = ar.lm_loss(ids, pieces, mistral)
    np.testing.assert_allclose(logits, logits_m, rtol=1e-13, atol=1e-15)
    for i in range(config.num_layers):
        np.testing.assert_allclose(grads[f"layers.{i}.self_attn.W_qkv"], np.concatenate(
            [grads_m[f"layers.{i}.self_attn.W_{n}"] for n in "qkv"], axis=1), rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(grads[f"layers.{i}.mlp.W_gate_up"], np.concatenate(
            [grads_m[f"layers.{i}.mlp.W_gate"], grads_m[f"layers.{i}.mlp.W_up"]], axis=1), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("spelling", [PHI3_4X, PHI3_5X])
def test_load_pretrained_round_trip(tmp_path, spelling):
    config = ar.LMConfig.from_dict(spelling)
    params = ar.init_lm_params(config, seed=0)
    (tmp_path / "config.json").write_text(json.dumps(spelling))
    state = to_transformers(params, config)
    assert state["model.layers.1.self_attn.qkv_proj.weight"].shape == (16, 8)
    assert state["model.layers.1.mlp.gate_up_proj.weight"].shape == (24, 8) and "lm_head.weight" in state
    write_safetensors(state, tmp_path / "model.safetensors")
    loaded, loaded_config = load_pretrained(tmp_path)
    assert loaded_config == config and sorted(loaded) == sorted(params)
    for k in params:
        np.testing.assert_array_equal(loaded[k], params[k], err_msg=k)
    state["model.layers.0.mlp.gate_up_proj.weight"] = state["model.layers.0.mlp.gate_up_proj.weight"][:20]
    write_safetensors(state, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match=r"'model.layers.0.mlp.gate_up_proj.weight' has shape \(20, 8\).*makes it"
                                         r" \(8, 24\)"):
        load_pretrained(tmp_path)


def test_float32_stays_float32():
    config = ar.LMConfig.from_dict(PHI3_4X)
    params = ar.init_lm_params(config, seed=1)
    p32 = {k: v.astype(np.float32) for k, v in params.items()}
    logits, cache = ar.lm_forward([[1, 2, 3]], p32, config)
    assert logits.dtype == np.float32
    grads = ar.lm_backward(np.ones_like(logits), cache)
    assert all(g.dtype == np.float32 for g in grads.values())
    np.testing.assert_allclose(logits, ar.lm_forward([[1, 2, 3]], params, config)[0], rtol=1e-4, atol=1e-5)
    assert ar.generate([[1, 2, 3]], p32, config, 3).shape == (1, 6)
