"""Phi-3 whole against transformers: tiny ``Phi3ForCausalLM`` models with random weights in float64
(grouped heads; untied, tied, and with a sliding window shorter than the prompts), written by
``save_pretrained`` and read by ``load_pretrained``; the same checks as GPT-NeoX's file, whose
test functions run here on these models: logits, the loss and every parameter's gradient at
1e-10 (the fused ``qkv_proj`` and ``gate_up_proj`` gradients compared as they are), ``generate``
token for token on a left-padded batch, each decoding step against transformers' own cache, and
the ``to_transformers`` round trip through ``from_pretrained``.

transformers' float32 steps inside a float64 Phi-3 are Llama's: ``Phi3RMSNorm`` and the RoPE
angles, both computed with the same formulas in float64 by
``attention_ref.interop.llama_in_float64()``; the ``sdpa`` attention (softmax in the model's dtype).
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import attention_ref as ar  # noqa: E402
from attention_ref.interop import load_pretrained  # noqa: E402
from test_gpt_neox_against_transformers import (  # noqa: E402,F401  (run here on Phi-3's models)
    test_each_decoding_step_against_past_key_values, test_generate_left_padded_batch_token_for_token,
    test_logits_loss_and_every_gradient, test_to_transformers_round_trip)


def _phi3(tie=False, sliding_window=None):
    config = transformers.Phi3Config(vocab_size=41, hidden_size=16, intermediate_size=24, num_attention_heads=4,
                                     num_key_value_heads=2, num_hidden_layers=2, rms_norm_eps=1e-6, rope_theta=500.0,
                                     max_position_embeddings=64, original_max_position_embeddings=64, pad_token_id=0,
                                     bos_token_id=None, eos_token_id=None, tie_word_embeddings=tie,
                                     sliding_window=sliding_window, attn_implementation="sdpa")
    model = transformers.Phi3ForCausalLM(config).double().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():  # the attention not uniform; norms away from 1
            p.mul_(10.0) if p.ndim == 2 else p.add_(0.1 * torch.randn_like(p))
    return model


MODELS = {"phi3": lambda: _phi3(), "phi3-tied": lambda: _phi3(tie=True),
          "phi3-sliding-window": lambda: _phi3(sliding_window=3)}  # shorter than the prompts: the window matters


@pytest.fixture(params=list(MODELS))
def saved(request, tmp_path):
    from attention_ref.interop import llama_in_float64

    with llama_in_float64():
        torch.manual_seed(0)
        model = MODELS[request.param]()
        model.save_pretrained(tmp_path)
        params, config = load_pretrained(tmp_path)
        yield model, params, config


def test_config_and_fused_params(saved):
    model, params, config = saved
    assert config.family == "phi3" and config.num_kv_heads == 2 and config.fused_projections
    assert config.sliding_window == model.config.sliding_window and config.pad_token_id == 0
    W_qkv = model.model.layers[1].self_attn.qkv_proj.weight.detach().numpy()
    np.testing.assert_array_equal(params["layers.1.self_attn.W_qkv"], W_qkv.T)  # fused, [q | k | v], transposed
    assert params["layers.1.mlp.W_gate_up"].shape == (16, 48)


def test_longrope_and_partial_rotary_are_refused_by_name():
    base = {"model_type": "phi3", "vocab_size": 8, "hidden_size": 8, "num_hidden_layers": 1,
            "num_attention_heads": 2, "intermediate_size": 8}
    short = [1.0] * 2
    for scaling in ({"type": "longrope", "short_factor": short, "long_factor": short},
                    {"rope_type": "longrope", "short_factor": short, "long_factor": short}, {"type": "su"}):
        with pytest.raises(ValueError, match="phi3: the RoPE scaling rope_type = '(longrope|su)' is not supported"):
            ar.LMConfig.from_dict({**base, "rope_scaling": scaling})
    with pytest.raises(ValueError, match="phi3: partial_rotary_factor = 0.5 is not supported"):
        ar.LMConfig.from_dict({**base, "partial_rotary_factor": 0.5})
    with pytest.raises(ValueError, match="phi3: hidden_act = 'gelu' is not supported"):
        ar.LMConfig.from_dict({**base, "hidden_act": "gelu"})
