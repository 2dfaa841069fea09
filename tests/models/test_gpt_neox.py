"""GPT-NeoX (Pythia) as a whole model without torch: its config read from both transformers
spellings, everything it can switch on that is not computed here refused by name, the folder
round trip, and float32 staying float32. (Its gradients against finite differences and the
decoder against the forward are in test_whole_models.py's CONFIGS.)"""
import json

import numpy as np
import pytest

import attention_ref as ar
from attention_ref.interop import load_pretrained, to_transformers, write_safetensors

#: Pythia-70m's config.json as transformers 4.x writes it, shrunk
PYTHIA_4X = {"model_type": "gpt_neox", "architectures": ["GPTNeoXForCausalLM"], "vocab_size": 13, "hidden_size": 8,
             "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 12, "hidden_act": "gelu",
             "rotary_pct": 0.5, "rotary_emb_base": 100, "max_position_embeddings": 32, "layer_norm_eps": 1e-5,
             "use_parallel_residual": True, "tie_word_embeddings": False, "rope_scaling": None,
             "attention_bias": True, "bos_token_id": 0, "eos_token_id": 0, "use_cache": True,
             "attention_dropout": 0.0, "hidden_dropout": 0.0, "classifier_dropout": 0.1, "initializer_range": 0.02}
#: the same as 5.x writes it
PYTHIA_5X = {**{k: v for k, v in PYTHIA_4X.items() if k not in ("rotary_pct", "rotary_emb_base", "rope_scaling")},
             "rope_parameters": {"rope_type": "default", "rope_theta": 100.0, "partial_rotary_factor": 0.5}}


def test_both_spellings_give_the_same_config():
    a, b = ar.LMConfig.from_dict(PYTHIA_4X), ar.LMConfig.from_dict(PYTHIA_5X)
    assert a == b
    assert (a.family, a.rotary_dim, a.rope_theta, a.use_parallel_residual, a.tie_word_embeddings) == (
        "gpt_neox", 2, 100.0, True, False)
    np.testing.assert_allclose(a.rope_frequencies(), [1.0])  # r = 2: one pair, base^0
    assert ar.LMConfig.from_dict({**PYTHIA_4X, "use_parallel_residual": False}).use_parallel_residual is False
    defaults = ar.LMConfig.from_dict({**{k: v for k, v in PYTHIA_4X.items() if k not in ("rotary_pct", "rotary_emb_base")},
                                      "hidden_size": 16})  # heads 8 wide: a quarter is one pair
    assert defaults.rotary_pct == 0.25 and defaults.rope_theta == 10000.0  # transformers' defaults


def test_what_is_not_computed_is_refused_by_name(tmp_path):
    for act in ("gelu_new", "gelu_fast", "relu", "gelu_pytorch_tanh"):
        with pytest.raises(ValueError, match=f"gpt_neox: hidden_act = '{act}' is not supported"):
            ar.LMConfig.from_dict({**PYTHIA_4X, "hidden_act": act})
    with pytest.raises(ValueError, match="gpt_neox: attention_bias = False is not supported"):
        ar.LMConfig.from_dict({**PYTHIA_4X, "attention_bias": False})
    for scaling in ({"type": "linear", "factor": 2.0}, {"rope_type": "dynamic", "factor": 2.0}):
        with pytest.raises(ValueError, match="gpt_neox: the RoPE scaling rope_type = '(linear|dynamic)'"):
            ar.LMConfig.from_dict({**PYTHIA_4X, "rope_scaling": scaling})
    with pytest.raises(ValueError, match=r"gpt_neox: rope parameters = \['factor'\]"):
        ar.LMConfig.from_dict({**PYTHIA_5X, "rope_parameters": {**PYTHIA_5X["rope_parameters"], "factor": 2.0}})
    with pytest.raises(ValueError, match=r"rotary_pct = 0.25 rotates int\(4 \* 0.25\) = 1 features"):
        ar.LMConfig.from_dict({**PYTHIA_4X, "rotary_pct": 0.25})  # head width 4: one feature, no pair
    config = ar.LMConfig.from_dict(PYTHIA_4X)
    for field, value in (("num_kv_heads", 1), ("head_dim", 8), ("sliding_window", 4),
                         ("rope_scaling", {"rope_type": "linear", "factor": 2.0})):
        with pytest.raises(ValueError, match=f"gpt_neox: {field}"):
            ar.LMConfig(**{**config.to_dict(), field: value})
    with pytest.raises(ValueError, match="llama: rotary_pct = 0.5 is not supported"):
        ar.LMConfig(family="llama", vocab_size=8, d_model=4, num_layers=1, num_heads=2, num_kv_heads=2, d_ff=8,
                    max_positions=8, eps=1e-6, rotary_pct=0.5)
    bad = {"rotary_pct": "0.5", "use_parallel_residual": 1, "layer_norm_eps": 0, "hidden_size": 9}
    for field, value in bad.items():
        (tmp_path / "config.json").write_text(json.dumps({**PYTHIA_4X, field: value}))
        with pytest.raises(ValueError, match=f"config.json: field '{field}'"):
            load_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**PYTHIA_5X, "rope_parameters": {"partial_rotary_factor": 2}}))
    with pytest.raises(ValueError, match="field 'rope_parameters.partial_rotary_factor' must be a number in"):
        load_pretrained(tmp_path)


@pytest.mark.parametrize("spelling", [PYTHIA_4X, PYTHIA_5X])
def test_load_pretrained_round_trip(tmp_path, spelling):
    config = ar.LMConfig.from_dict(spelling)
    params = ar.init_lm_params(config, seed=0)
    (tmp_path / "config.json").write_text(json.dumps(spelling))
    state = to_transformers(params, config, version=4)  # 4.x's names, as Pythia's files hold them
    assert "embed_out.weight" in state and state["gpt_neox.layers.1.attention.query_key_value.weight"].shape == (24, 8)
    buffers = {"gpt_neox.layers.0.attention.bias": np.tril(np.ones((1, 1, 32, 32), bool)),  # Pythia's files hold
               "gpt_neox.layers.0.attention.masked_bias": np.array(-1e9, np.float32),  # old transformers' buffers:
               "gpt_neox.layers.0.attention.rotary_emb.inv_freq": np.ones(1, np.float32)}  # not parameters, unread
    write_safetensors({**state, **buffers}, tmp_path / "model.safetensors")
    loaded, loaded_config = load_pretrained(tmp_path)
    assert loaded_config == config and sorted(loaded) == sorted(params)
    for k in params:
        np.testing.assert_array_equal(loaded[k], params[k], err_msg=k)
    del state["gpt_neox.layers.1.mlp.dense_4h_to_h.bias"]
    write_safetensors(state, tmp_path / "model.safetensors")
    with pytest.raises(KeyError, match="gpt_neox.layers.1.mlp.dense_4h_to_h.bias"):
        load_pretrained(tmp_path)


def test_float32_stays_float32():
    config = ar.LMConfig.from_dict(PYTHIA_4X)
    params = ar.init_lm_params(config, seed=1)
    p32 = {k: v.astype(np.float32) for k, v in params.items()}
    logits, cache = ar.lm_forward([[1, 2, 3]], p32, config)
    assert logits.dtype == np.float32
    grads = ar.lm_backward(np.ones_like(logits), cache)
    assert all(g.dtype == np.float32 for g in grads.values())
    np.testing.assert_allclose(logits, ar.lm_forward([[1, 2, 3]], params, config)[0], rtol=1e-4, atol=1e-5)
    assert ar.generate([[1, 2, 3]], p32, config, 3).shape == (1, 6)
