"""DeepSeek-V3's reader without torch (models/families/deepseek_v3.py): what it computes from a config.json
(the settings, RoPE's width and YaRN's two factors, the dense and routed layers), DeepseekV3Config's defaults for
absent keys, and each field that changes the numbers in a way not computed here refused by name. The numbers
against transformers: tests/interop/test_deepseek_v3_against_transformers.py."""
import math

import numpy as np
import pytest

import attention_ref as ar
from attention_ref.models.families import FAMILY

EXAMPLE = {**FAMILY["deepseek_v3"].example, "model_type": "deepseek_v3"}


def test_the_example_read():
    config = ar.LMConfig.from_dict(EXAMPLE)
    s = dict(config.settings)
    assert (s["q_lora_rank"], s["kv_lora_rank"], s["qk_nope_head_dim"], s["qk_rope_head_dim"], s["v_head_dim"]) == (
        12, 8, 4, 4, 6)
    assert config.d_head == 4 and config.rotary_dim == 4 and config.num_kv_heads == config.num_heads == 4
    layers = FAMILY["deepseek_v3"].layers(config)
    assert [layer.block.routing is None for layer in layers] == [True, False, False]
    attn, routing = layers[0].block.attn, layers[1].block.routing
    g = lambda m: 0.1 * m * math.log(4.0) + 1.0  # noqa: E731  (transformers' yarn_get_mscale, factor 4)
    assert attn.rope_factor == pytest.approx(g(1.0) / g(0.8), rel=1e-15)  # mscale / mscale_all_dim
    assert attn.scale == pytest.approx(8 ** -0.5 * g(0.8) ** 2, rel=1e-15)  # mscale_all_dim on the scores
    assert routing == ar.Routing(2, "sigmoid_topk", True, 2, 1, 2.5)
    assert ar.LMConfig(**config.to_dict()) == config  # the settings survive the round trip


def test_defaults_of_absent_keys_and_no_query_compression():
    d = {k: v for k, v in EXAMPLE.items() if k in ("model_type", "vocab_size", "hidden_size", "num_hidden_layers",
                                                   "num_attention_heads")}
    config = ar.LMConfig.from_dict({**d, "num_attention_heads": 2, "n_routed_experts": 16, "n_group": 8})
    s = dict(config.settings)
    assert (s["q_lora_rank"], s["kv_lora_rank"], s["qk_rope_head_dim"], s["first_k_dense_replace"]) == (1536, 512, 64, 3)
    assert config.d_ff == 18432 and config.rope_scaling is None and config.experts_per_token == 8
    params = ar.init_lm_params(ar.LMConfig.from_dict({**EXAMPLE, "q_lora_rank": None}), seed=0)
    assert "layers.0.self_attn.W_q" in params and "layers.0.self_attn.W_q_a" not in params
    assert params["layers.1.mlp.experts.W_gate"].shape == (4, 16, 8) and "layers.0.mlp.W_router" not in params


@pytest.mark.parametrize("field, value, match", [
    ("attention_bias", True, "attention_bias = True is not supported"),
    ("hidden_act", "gelu", "hidden_act = 'gelu' is not supported"),
    ("num_key_value_heads", 2, "num_key_value_heads .* = 2 is not supported"),
    ("head_dim", 8, "head_dim .* = 8 is not supported"),
    ("qk_head_dim", 4, "qk_head_dim .* = 4 is not supported"),
    ("rope_scaling", {"rope_type": "linear", "factor": 2.0}, "rope_type = 'linear' is not supported"),
    ("n_group", 3, "n_routed_experts = 4 must split into n_group = 3 groups"),
    ("topk_group", 3, "topk_group = 3 is more than n_group = 2"),
    ("num_experts_per_tok", 3, "num_experts_per_tok = 3 is more than the 2 experts"),
    ("first_k_dense_replace", -1, "first_k_dense_replace must be an integer >= 0"),
    ("rope_interleave", 1, "field 'rope_interleave' must be a JSON boolean"),
    ("moe_layer_freq", 1, "config.json key 'moe_layer_freq'"),
    ("rope_scaling", {"rope_type": "default", "factor": 2.0, "mscale_all_dim": 1.0},
     r"the plain RoPE's parameters = \['factor', 'mscale_all_dim'\] is not supported"),
])
def test_fields_that_change_the_numbers_are_refused_by_name(field, value, match):
    with pytest.raises(ValueError, match=match):
        ar.LMConfig.from_dict({**EXAMPLE, field: value})


def test_settings_checked_by_name():
    config = ar.LMConfig.from_dict(EXAMPLE)
    with pytest.raises(ValueError, match="settings must hold exactly"):
        ar.LMConfig(**{**config.to_dict(), "settings": {"kv_lora_rank": 8}})
    with pytest.raises(ValueError, match=r"n_group must be an integer >= 1, got 0"):
        ar.LMConfig(**{**config.to_dict(), "settings": {**dict(config.settings), "n_group": 0}})


def test_latent_cache_per_layer_is_smaller():
    """The decoder keeps kv_lora_rank + qk_rope_head_dim numbers per token and layer (12 here), where per-head keys
    and values would take H (dn + dr + dv) = 56."""
    config = ar.LMConfig.from_dict(EXAMPLE)
    params = ar.init_lm_params(config, seed=0)
    decoder = ar.LMDecoder(params, config)
    decoder.prefill(np.array([[1, 2, 3], [4, 5, 6]]))
    cache = decoder.caches[0]
    assert isinstance(cache, ar.MLADecodeCache) and cache.length == 3
    assert cache.nbytes == 2 * 3 * (8 + 4) * params["embed_tokens"].itemsize
