"""The family readers on hostile and contradictory ``config.json`` files (issue 41 item 1).

Each case is computed as transformers computes it or refused by one line naming the field; each
refusal is justified by what transformers (the installed release: 4.57.1 or 5.x, both run by CI)
does with the same dict: which of two RoPE spellings it reads, which keys its config class has,
what its model refuses to build. The readers never import transformers; these tests do.
"""
import json

import numpy as np
import pytest

import attention_ref as ar
from attention_ref.interop import from_transformers_state, load_pretrained, to_transformers, write_safetensors
from attention_ref.models.families import FAMILY

LLAMA = {"model_type": "llama", "vocab_size": 13, "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
         "num_key_value_heads": 1, "intermediate_size": 12, "tie_word_embeddings": False}
SIZES = {k: v for k, v in LLAMA.items() if k != "model_type"}


def _refused(d, *words):
    """``LMConfig.from_dict(d)`` raises one line holding each of ``words``."""
    with pytest.raises(ValueError) as e:
        ar.LMConfig.from_dict(d)
    message = str(e.value)
    assert "\n" not in message, message
    for word in words:
        assert word in message, f"{word!r} not in: {message}"
    return message


def _transformers_major():
    transformers = pytest.importorskip("transformers")
    return int(transformers.__version__.split(".")[0])


def _inv_freq(d):
    """The installed transformers' RoPE frequencies for the Llama config dict ``d``."""
    pytest.importorskip("torch")
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    config = LlamaConfig.from_dict({k: v for k, v in d.items() if k != "model_type"})
    return LlamaRotaryEmbedding(config).inv_freq.double().numpy()


def _ours_inv_freq(d):
    return ar.LMConfig.from_dict(d).rope_frequencies()


# ------------------------------------------------------------------ the two RoPE spellings
CONFLICTS = {
    "theta": ({"rope_theta": 100.0, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}},
              ("rope_theta = 100.0", "rope_parameters.rope_theta = 10000.0")),
    "scaling": ({"rope_scaling": {"rope_type": "linear", "factor": 4.0},
                 "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}, ("rope_scaling =", "rope_parameters =")),
    "scaling theta": ({"rope_theta": 100.0, "rope_scaling": {"rope_type": "linear", "factor": 4.0, "rope_theta": 7.0}},
                      ("rope_theta = 100.0", "rope_scaling.rope_theta = 7.0")),
}


@pytest.mark.parametrize("case", sorted(CONFLICTS))
def test_two_rope_spellings_that_disagree_are_refused_naming_both(case):
    extra, words = CONFLICTS[case]
    _refused({**LLAMA, **extra}, "llama:", *words, "neither is guessed")


def test_the_theta_conflict_is_read_differently_by_the_two_transformers():
    """4.57 reads the top-level rope_theta (100), 5.x rope_parameters' (10000): the refusal's reason."""
    major = _transformers_major()
    theirs = _inv_freq({**LLAMA, **CONFLICTS["theta"][0]})
    meant = _ours_inv_freq({**LLAMA, "rope_theta": 100.0 if major == 4 else 10000.0})
    np.testing.assert_allclose(theirs, meant, rtol=1e-6)  # transformers keeps inv_freq in float32


def test_the_scaling_conflict_is_the_scaling_for_transformers():
    """Both releases apply the old rope_scaling (linear 4) beside a default rope_parameters; the
    file says two things, so it is refused rather than read either way."""
    theirs = _inv_freq({**LLAMA, **CONFLICTS["scaling"][0]})
    np.testing.assert_allclose(theirs, _ours_inv_freq({**LLAMA, "rope_scaling": {"rope_type": "linear", "factor": 4.0}}),
                               rtol=1e-6)


@pytest.mark.parametrize("spelling", [{"rope_theta": 500.0}, {"rope_parameters": {"rope_type": "default", "rope_theta": 500.0}},
                                      {"rope_theta": 500.0, "rope_parameters": {"rope_type": "default", "rope_theta": 500.0}},
                                      {"rope_scaling": {"rope_type": "linear", "factor": 2.0}, "rope_theta": 500.0}])
def test_either_spelling_alone_or_both_agreeing_is_read(spelling):
    config = ar.LMConfig.from_dict({**LLAMA, **spelling})
    assert config.rope_theta == 500.0
    major = _transformers_major()
    if major == 4 and "rope_theta" not in spelling:
        return  # 4.57 does not read rope_parameters at all (it keeps its default 10000): a 5.x-only file
    np.testing.assert_allclose(_inv_freq({**LLAMA, **spelling}), config.rope_frequencies(), rtol=1e-6)


def test_the_other_families_spellings_conflict_by_name():
    neox = {"model_type": "gpt_neox", **{k: v for k, v in SIZES.items() if k != "num_key_value_heads"}}
    _refused({**neox, "rotary_pct": 0.5, "rope_parameters": {"rope_type": "default", "partial_rotary_factor": 1.0}},
             "rotary_pct = 0.5", "rope_parameters.partial_rotary_factor = 1.0")
    _refused({**neox, "rotary_emb_base": 100, "rope_theta": 10000}, "rotary_emb_base = 100", "rope_theta = 10000")
    _refused({**LLAMA, "model_type": "phi3", "partial_rotary_factor": 1.0,
              "rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5}},
             "partial_rotary_factor = 1.0", "rope_parameters.partial_rotary_factor = 0.5")
    gemma = {**LLAMA, "model_type": "gemma3_text", "head_dim": 4}
    _refused({**gemma, "rope_local_base_freq": 100.0,
              "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                  "full_attention": {"rope_type": "default", "rope_theta": 1e6}}},
             "rope_local_base_freq = 100.0", "rope_parameters.sliding_attention.rope_theta = 10000.0")
    _refused({**LLAMA, "model_type": "gemma2", "head_dim": 4, "rope_theta": 100.0,
              "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}, "gemma2:", "rope_theta = 100.0")


# ------------------------------------------------------------------ every key known, or refused by name
def _transformers_config_dict(model_type):
    from transformers import AutoConfig
    return AutoConfig.for_model(model_type).to_dict()


@pytest.mark.parametrize("model_type", sorted(FAMILY))
def test_every_key_of_transformers_config_class_is_in_the_family_table(model_type):
    """The table was derived from ``Config().to_dict()`` of both releases; the installed one's keys are
    all in it, and its default config (a neutral value for every key) is read."""
    pytest.importorskip("transformers")
    d = _transformers_config_dict(model_type)
    missing = sorted(set(d) - set(FAMILY[model_type].keys))
    assert not missing, f"{model_type}: transformers' config has keys the family table lacks: {missing}"
    ar.LMConfig.from_dict(d)


# Keys of other families' configs saved under model_type "llama" (issue 41): each changes the maths
ALIENS = {"granite": {"embedding_multiplier": 12.0, "attention_multiplier": 0.015625, "residual_multiplier": 0.22,
                      "logits_scaling": 8.0},
          "smollm3": {"no_rope_layers": [1]}, "ernie4_5": {"use_bias": False}, "hunyuan_v1_dense": {"eod_token_id": 127960, "use_qk_norm": True}}
# (HunYuan's q/k norms are always on in transformers; its checkpoint's query_layernorm / key_layernorm tensors
# are refused by the unread-tensor check below, its hub config's use_qk_norm and eod_token_id by name)


@pytest.mark.parametrize("key, value", [(k, v) for keys in ALIENS.values() for k, v in keys.items()])
def test_another_familys_key_under_llama_is_refused_by_name(key, value):
    _refused({**LLAMA, key: value}, "llama:", f"key {key!r}", "another family")


@pytest.mark.parametrize("family", sorted(ALIENS))
def test_the_alien_keys_are_their_familys_and_not_llamas(family):
    """transformers' Llama config has none of these keys (its model would ignore them), while the
    family they come from reads them: so a Llama reading would give other numbers than that family."""
    transformers = pytest.importorskip("transformers")
    llama = _transformers_config_dict("llama")
    try:
        theirs = _transformers_config_dict(family)
    except (ValueError, KeyError):
        pytest.skip(f"transformers {transformers.__version__} has no {family}")
    assert not set(ALIENS[family]) & set(llama)
    if family != "hunyuan_v1_dense":  # HunYuan's are its hub files' keys (4.57's class writes neither)
        assert set(ALIENS[family]) <= set(theirs)


NON_NEUTRAL = [
    ("llama", {"attention_bias": True}, "attention_bias = True"),
    ("llama", {"mlp_bias": True}, "mlp_bias = True"),
    ("llama", {"attention_dropout": 1.5}, "attention_dropout must be a dropout probability"),
    ("llama", {"quantization_config": {"quant_method": "bitsandbytes"}}, "quantization_config ="),
    ("llama", {"pruned_heads": {"0": [1]}}, "pruned_heads ="),
    ("llama", {"is_encoder_decoder": True}, "is_encoder_decoder = True"),
    ("llama", {"use_sliding_window": False}, "key 'use_sliding_window'"),  # Qwen2's key, not Llama's
    ("qwen2", {"use_sliding_window": True}, "use_sliding_window = True"),
    ("gpt2", {"reorder_and_upcast_attn": True}, "reorder_and_upcast_attn = True"),
    ("gpt2", {"add_cross_attention": True}, "add_cross_attention = True"),
    ("gemma3_text", {"attn_logit_softcapping": 50.0}, "attn_logit_softcapping = 50.0"),
    ("gemma3_text", {"use_bidirectional_attention": True}, "use_bidirectional_attention = True"),
    ("gemma2", {"sliding_window_pattern": 2}, "key 'sliding_window_pattern'"),  # Gemma 3's, read by no Gemma 2
]


@pytest.mark.parametrize("model_type, extra, words", NON_NEUTRAL)
def test_a_key_at_a_value_that_changes_the_maths_is_refused_by_name(model_type, extra, words):
    base = {**LLAMA, "model_type": model_type}
    if model_type == "gpt2":
        base = {"model_type": "gpt2", "vocab_size": 11, "n_embd": 8, "n_layer": 1, "n_head": 2, "n_positions": 16}
    if model_type.startswith("gemma"):
        base["head_dim"] = 4
    ar.LMConfig.from_dict(base)  # the base is read
    _refused({**base, **extra}, f"{model_type}:" if "must be" not in words else "", words)


def test_dropout_and_generation_settings_are_neutral():
    """transformers' from_pretrained model is in eval mode (dropout is the identity); sampling settings
    are generate's, not the forward's."""
    ar.LMConfig.from_dict({**LLAMA, "attention_dropout": 0.1, "temperature": 0.7, "top_p": 0.9, "architectures": ["x"],
                           "torch_dtype": "bfloat16", "transformers_version": "4.57.1", "pretraining_tp": 2})


# ------------------------------------------------------------------ pad_token_id and the strict fields
@pytest.mark.parametrize("pad", [13, 100, -14])
def test_a_pad_token_outside_the_vocabulary_is_refused(pad):
    _refused({**LLAMA, "pad_token_id": pad}, "pad_token_id", "vocab_size = 13")


def test_transformers_refuses_to_build_a_model_with_that_pad_token():
    pytest.importorskip("torch")
    from transformers import LlamaConfig, LlamaForCausalLM
    with pytest.raises(AssertionError, match="[Pp]adding_idx"):
        LlamaForCausalLM(LlamaConfig.from_dict({**SIZES, "pad_token_id": 13}))
    assert ar.LMConfig.from_dict({**LLAMA, "pad_token_id": -1}).pad_token_id == 12  # as nn.Embedding: from the end


def test_gpt2_and_gpt_neox_read_no_pad_token():
    """Their token tables have no padding_idx in transformers: any pad_token_id is neutral there."""
    gpt2 = {"model_type": "gpt2", "vocab_size": 11, "n_embd": 8, "n_layer": 1, "n_head": 2, "n_positions": 16}
    assert ar.LMConfig.from_dict({**gpt2, "pad_token_id": 50256}).pad_token_id is None


@pytest.mark.parametrize("field, value", [("num_key_value_heads", 0), ("num_key_value_heads", False),
                                          ("head_dim", 0), ("num_attention_heads", 2.0), ("rms_norm_eps", -1.0),
                                          ("tie_word_embeddings", "yes")])
def test_from_dict_is_as_strict_as_load_pretrained(tmp_path, field, value):
    message = _refused({**LLAMA, field: value}, f"field {field!r}")
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA, field: value}))
    with pytest.raises(ValueError) as e:
        load_pretrained(tmp_path)
    assert str(e.value) == f"{tmp_path / 'config.json'}: {message}"


# ------------------------------------------------------------------ tensors no step reads
def _folder(tmp_path, extra):
    config = ar.LMConfig.from_dict(LLAMA)
    state = to_transformers(ar.init_lm_params(config, seed=0, dtype=np.float32), config)
    folder = tmp_path / "model"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(LLAMA))
    write_safetensors({**state, **extra}, folder / "model.safetensors")
    return folder


@pytest.mark.parametrize("name", ["model.layers.0.mlp.extra_proj.weight", "model.embedding_multiplier",
                                  "lm_head.bias", "model.norm.bias"])
def test_a_tensor_no_step_reads_is_refused_by_name(tmp_path, name):
    folder = _folder(tmp_path, {name: np.ones(8, np.float32)})
    with pytest.raises(ValueError) as e:
        load_pretrained(folder)
    assert f"{name!r}" in str(e.value) and "no step of a llama model reads" in str(e.value)
    state = {k: np.asarray(v) for k, v in to_transformers(load_pretrained(_folder(tmp_path / "b", {}))[0],
                                                          ar.LMConfig.from_dict(LLAMA)).items()}
    with pytest.raises(ValueError, match=f"'{name}'"):
        from_transformers_state({**state, name: np.ones(8)}, ar.LMConfig.from_dict(LLAMA))


def test_a_buffer_transformers_recomputes_is_left_unread(tmp_path):
    """Old Llama files hold each layer's ``rotary_emb.inv_freq``: transformers recomputes it from the
    config and never loads it (a non-persistent buffer); so does this loader."""
    folder = _folder(tmp_path, {"model.layers.0.self_attn.rotary_emb.inv_freq": np.full(2, 7.0, np.float32)})
    params, config = load_pretrained(folder)
    assert config.rope_theta == 10000.0 and "model.layers.0.self_attn.rotary_emb.inv_freq" not in params


def test_gpt2_files_causal_mask_buffers_are_left_unread(tmp_path):
    """The hub's GPT-2 files hold each layer's ``h.<i>.attn.bias`` (the causal mask) and old ones
    ``attn.masked_bias``: buffers transformers builds from the config (non-persistent in 4.57, in 5.x's
    ``_keys_to_ignore_on_load_unexpected``); they are left unread, while ``attn.c_attn.bias`` is read."""
    gpt2 = {"model_type": "gpt2", "vocab_size": 11, "n_embd": 8, "n_layer": 1, "n_head": 2, "n_positions": 16}
    config = ar.LMConfig.from_dict(gpt2)
    params = ar.init_lm_params(config, seed=0, dtype=np.float32)
    state = {k[len("transformer."):] if k.startswith("transformer.") else k: v
             for k, v in to_transformers(params, config).items()}  # the hub's names: no "transformer."
    buffers = {"h.0.attn.bias": np.tril(np.ones((1, 1, 16, 16), np.float32)), "h.0.attn.masked_bias": np.float32([-1e4])}
    (tmp_path / "config.json").write_text(json.dumps(gpt2))
    write_safetensors({**state, **buffers}, tmp_path / "model.safetensors")
    loaded, _ = load_pretrained(tmp_path)
    np.testing.assert_array_equal(loaded["h.0.self_attn.b_q"], params["h.0.self_attn.b_q"])
    write_safetensors({**state, "h.0.attn.extra": np.ones(2, np.float32)}, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="'transformer.h.0.attn.extra'.*no step of a gpt2 model reads"):
        load_pretrained(tmp_path)
