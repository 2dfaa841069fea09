"""Each family reader's defaults for a field absent from config.json are transformers' config
class defaults (4.57 and 5.x): a config.json written without the field reads as transformers
builds the model (issue 41 item 1)."""
import pytest

transformers = pytest.importorskip("transformers")

import attention_ref as ar  # noqa: E402

SIZES = {"vocab_size": 40, "hidden_size": 16, "intermediate_size": 24, "num_attention_heads": 4,
         "num_key_value_heads": 2, "num_hidden_layers": 2}


def _ours_and_theirs(model_type, config_class, leave_out, **extra):
    d = {**SIZES, **extra, "model_type": model_type}
    theirs = getattr(transformers, config_class)(**{k: v for k, v in d.items() if k != "model_type"})
    for name in leave_out:
        d.pop(name, None)
    return ar.LMConfig.from_dict(d), theirs


def test_mistral_sliding_window_default():
    ours, theirs = _ours_and_theirs("mistral", "MistralConfig", ["sliding_window"])
    assert ours.sliding_window == theirs.sliding_window == 4096
    ours = ar.LMConfig.from_dict({**SIZES, "model_type": "mistral", "sliding_window": None})
    assert ours.sliding_window is None  # an explicit null: every earlier key


def test_gemma2_soft_caps_default():
    ours, theirs = _ours_and_theirs("gemma2", "Gemma2Config", [], head_dim=4)
    assert (ours.attn_softcap, ours.final_softcap) == (theirs.attn_logit_softcapping,
                                                       theirs.final_logit_softcapping) == (50.0, 30.0)
    ours = ar.LMConfig.from_dict({**SIZES, "model_type": "gemma2", "head_dim": 4, "attn_logit_softcapping": None,
                                  "final_logit_softcapping": None})
    assert ours.attn_softcap is None and ours.final_softcap is None


@pytest.mark.parametrize("model_type, config_class", [("phi3", "Phi3Config"), ("olmo2", "Olmo2Config"),
                                                      ("llama", "LlamaConfig"), ("smollm3", "SmolLM3Config")])
def test_rms_norm_eps_and_tied_head_defaults(model_type, config_class):
    ours, theirs = _ours_and_theirs(model_type, config_class, ["rms_norm_eps", "tie_word_embeddings"])
    assert ours.eps == theirs.rms_norm_eps
    assert ours.tie_word_embeddings == theirs.tie_word_embeddings


def test_qwen3_moe_defaults():
    """Qwen3MoeConfig's defaults: 4 key/value heads (not the query heads' count), 128 experts of which 8 per token,
    experts 768 wide, the top k not normalised, every layer sparse, 32768 positions, eps 1e-6, untied."""
    leave_out = ["num_key_value_heads", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
                 "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers", "max_position_embeddings", "rms_norm_eps",
                 "tie_word_embeddings"]
    d = {k: v for k, v in {**SIZES, "num_attention_heads": 8, "hidden_size": 32}.items() if k not in leave_out}
    theirs = transformers.Qwen3MoeConfig(**d)  # built without the fields: its defaults
    ours = ar.LMConfig.from_dict({**d, "model_type": "qwen3_moe"})
    assert ours.num_kv_heads == theirs.num_key_value_heads == 4
    assert (ours.num_experts, ours.experts_per_token) == (theirs.num_experts, theirs.num_experts_per_tok) == (128, 8)
    assert ours.setting("moe_d_ff") == theirs.moe_intermediate_size == 768
    assert ours.setting("norm_topk_prob") is theirs.norm_topk_prob is False
    sparse = tuple(i not in theirs.mlp_only_layers and (i + 1) % theirs.decoder_sparse_step == 0 for i in range(2))
    assert ours.setting("sparse_layers") == sparse == (True, True)
    assert (ours.max_positions, ours.eps, ours.tie_word_embeddings) == (
        theirs.max_position_embeddings, theirs.rms_norm_eps, theirs.tie_word_embeddings) == (32768, 1e-6, False)
