"""Gemma 3 (text) and Gemma 2 without torch: its config read from 4.x and 5.x spellings, everything it can
switch on that is not implemented refused by name, float32 kept through the forward, the
backward and generate, and the embedding's sqrt(D) in the params' dtype."""
import math

import numpy as np
import pytest

import attention_ref as ar
from attention_ref.models.gemma import embedding_normalizer

BASE = {"model_type": "gemma3_text", "vocab_size": 13, "hidden_size": 8, "intermediate_size": 12,
        "num_hidden_layers": 3, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 4,
        "sliding_window": 2, "query_pre_attn_scalar": 4, "rms_norm_eps": 1e-6, "pad_token_id": 0}
V5 = {"rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                          "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
      "layer_types": ["sliding_attention", "sliding_attention", "full_attention"]}
V4 = {"rope_theta": 1e6, "rope_local_base_freq": 1e4, "rope_scaling": {"rope_type": "linear", "factor": 8.0},
      "sliding_window_pattern": 3}  # no layer_types: built as transformers builds them


def test_both_spellings_give_the_same_config():
    c5, c4 = ar.LMConfig.from_dict({**BASE, **V5}), ar.LMConfig.from_dict({**BASE, **V4})
    assert c5 == c4
    assert c5.layer_types == ("sliding_attention", "sliding_attention", "full_attention")
    assert (c5.rope_theta, c5.rope_local_theta, dict(c5.rope_scaling)) == (1e6, 1e4, {"rope_type": "linear",
                                                                                       "factor": 8.0})
    assert c5.head_scale == (0.5,) * 3 and c5.tie_word_embeddings
    layers = c5.gemma_layers()
    assert [w for _, w in layers] == [2, 2, None]
    np.testing.assert_allclose(layers[0][0], 1e4 ** -(np.arange(2) / 2))  # local: base 1e4, unscaled
    np.testing.assert_allclose(layers[2][0], 1e6 ** -(np.arange(2) / 2) / 8)  # global: base 1e6, linear 8


@pytest.mark.parametrize("change, named", [
    ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping"),
    ({"final_logit_softcapping": 30.0}, "final_logit_softcapping"),
    ({"attention_bias": True}, "attention_bias"),
    ({"use_bidirectional_attention": True}, "use_bidirectional_attention"),
    ({"hidden_activation": "gelu"}, "hidden_activation"),
    ({"layer_types": ["sliding_attention", "chunked_attention", "full_attention"]}, "layer_types"),
    ({"rope_parameters": {"full_attention": {"rope_type": "yarn", "factor": 2.0, "rope_theta": 1e6},
                          "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}}, "rope_type"),
    ({"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                          "sliding_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}}},
     "sliding layers' RoPE rope_type"),
    ({"head_dim": 3, "hidden_size": 9}, "head_dim"),
])
def test_what_is_not_implemented_is_refused_by_name(change, named):
    with pytest.raises(ValueError, match=named):
        ar.LMConfig.from_dict({**BASE, **V5, **change})


def test_the_gemma_fields_are_checked():
    config = ar.LMConfig.from_dict({**BASE, **V5})
    with pytest.raises(ValueError, match="layer_types must list one of"):
        ar.LMConfig(**{**config.to_dict(), "layer_types": ("full_attention",)})
    with pytest.raises(ValueError, match="query_pre_attn_scalar must be a positive number"):
        ar.LMConfig(**{**config.to_dict(), "query_pre_attn_scalar": 0})
    with pytest.raises(ValueError, match="needs its sliding_window"):
        ar.LMConfig(**{**config.to_dict(), "sliding_window": None})
    with pytest.raises(ValueError, match="llama: layer_types = .*query_pre_attn_scalar = 4 is not supported"):
        ar.LMConfig(**{**config.to_dict(), "family": "llama", "sliding_window": None})


def test_float32_stays_float32():
    config = ar.LMConfig.from_dict({**BASE, **V5})
    params = {k: v.astype(np.float32) for k, v in ar.init_lm_params(config, seed=0).items()}
    ids = np.array([[1, 2, 3, 4], [0, 5, 6, 7]])
    with np.errstate(all="raise"):
        loss, grads, logits = ar.lm_loss(ids, params, config, attention_mask=[[1, 1, 1, 1], [0, 1, 1, 1]])
        out = ar.generate(ids, params, config, 3, attention_mask=[[1, 1, 1, 1], [0, 1, 1, 1]])
    assert logits.dtype == np.float32 and all(g.dtype == np.float32 for g in grads.values())
    assert out.shape == (2, 7) and np.isfinite(loss)
    assert embedding_normalizer(config, np.float32) == np.float32(math.sqrt(8))
    assert embedding_normalizer(config, np.float64) == math.sqrt(8)


G2 = {**BASE, "model_type": "gemma2", "rope_theta": 1e4, "attn_logit_softcapping": 50.0,
      "final_logit_softcapping": 30.0}


def test_gemma2_config():
    config = ar.LMConfig.from_dict(G2)
    assert (config.attn_softcap, config.final_softcap) == (50.0, 30.0) and not config.qk_norm
    assert config.layer_types == ("sliding_attention", "full_attention", "sliding_attention")  # alternating
    assert config.rope_theta == config.rope_local_theta == 1e4
    assert "layers.0.self_attn.q_norm.weight" not in ar.param_names(config)
    uncapped = ar.LMConfig.from_dict({**G2, "attn_logit_softcapping": None, "final_logit_softcapping": None})
    assert uncapped.attn_softcap is None and uncapped.final_softcap is None


@pytest.mark.parametrize("change, named", [
    ({"attention_bias": True}, "attention_bias"), ({"use_bidirectional_attention": True}, "use_bidirectional"),
    ({"hidden_activation": "gelu"}, "hidden_activation"),
    ({"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}}, "rope_type"),
    ({"attn_logit_softcapping": -1.0}, "attn_logit_softcapping must be null or a positive number"),
    ({"final_logit_softcapping": "30"}, "final_logit_softcapping must be null or a positive number"),
])
def test_gemma2_refuses_by_name(change, named):
    with pytest.raises(ValueError, match=named):
        ar.LMConfig.from_dict({**G2, **change})


def test_the_soft_caps_are_gemma2s():
    config = ar.LMConfig.from_dict({**BASE, **V5})
    with pytest.raises(ValueError, match="gemma3_text: attn_softcap = 50.0 is not supported"):
        ar.LMConfig(**{**config.to_dict(), "attn_softcap": 50.0})


def test_gemma2_float32_stays_float32_and_logits_stay_under_the_cap():
    config = ar.LMConfig.from_dict({**G2, "final_logit_softcapping": 0.01})
    params = {k: v.astype(np.float32) for k, v in ar.init_lm_params(config, seed=0).items()}
    with np.errstate(all="raise"):
        loss, grads, logits = ar.lm_loss([[1, 2, 3, 4]], params, config)
        out = ar.generate([[1, 2, 3]], params, config, 2)
    assert logits.dtype == np.float32 and all(g.dtype == np.float32 for g in grads.values())
    assert np.abs(logits).max() <= np.float32(0.01) and out.shape == (1, 5)  # tanh saturates at 1 in float32


@pytest.mark.parametrize("family", ["gemma3_text", "gemma2"])
def test_hidden_act_is_not_read(family):
    """transformers' Gemma 2 and 3 configs read hidden_activation only: a stray hidden_act is
    ignored there, so it is here (the activation stays the tanh GELU)."""
    d = {**BASE, "model_type": family, "hidden_act": "gelu"}
    d.pop("hidden_activation", None)
    assert ar.LMConfig.from_dict(d).family == family
    with pytest.raises(ValueError, match="hidden_activation = 'gelu'"):
        ar.LMConfig.from_dict({**d, "hidden_activation": "gelu"})
