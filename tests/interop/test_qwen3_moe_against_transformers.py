"""Qwen3-MoE whole (attention_ref/models/families/qwen3_moe.py) against transformers' ``Qwen3MoeForCausalLM``:
built from a small config with random weights in float64, written by ``save_pretrained`` (one tensor per expert,
on 4.57 and 5.x alike) and read by our ``load_pretrained``; logits, the loss and the gradient of every parameter
at 1e-10 relative; ``to_transformers`` of the weights; ``generate`` token for token on a left-padded batch; each
decoding step's logits against transformers' own cache; the config fields that change the numbers and are not
computed, refused by name.

The small model: 3 layers, layer 0 dense by ``mlp_only_layers`` (width ``intermediate_size`` 24), layers 1 and 2
with 4 experts of width ``moe_intermediate_size`` 12, of which each token takes 2 (``norm_topk_prob`` True and,
in one test, False and ``decoder_sparse_step`` 2), head width 6 (not hidden / heads). Its routing is checked for
near ties: the gap between each real token's k-th and (k+1)-th router logit, in every sparse layer, must be at
least ``GAP`` (1e-6) of the logits' scale (else the inputs are drawn again), so that no rounding at 1e-15 can
choose another expert in one implementation than in the other. The checks the mixture-of-experts families share are
written once in tests/interop/_moe_checks.py; this file gives them Qwen3-MoE's difference (``CHECKS``: its float64
patches, its router ``mlp.gate``).

transformers' float32 steps inside a float64 model, run here as the same formulas in float64:
* the RMSNorms' cast to float32 (``Qwen3MoeRMSNorm``, the q/k norms included) and the RoPE angles
  (``Qwen3MoeRotaryEmbedding``): :func:`attention_ref.interop.llama_in_float64` (the family's ``float32_steps``);
* the router's softmax (``dtype=torch.float``): :func:`attention_ref.interop.moe_models_in_float64`
  (4.57: ``Qwen3MoeSparseMoeBlock.forward``, its router lines and its loop over the experts; 5.x:
  ``Qwen3MoeTopKRouter.forward``).
The attention is SDPA (float64 throughout); 5.x's experts run their eager loop (its default grouped_mm refuses
float64; 4.57 has only the loop). One test switches ``use_sliding_window`` on (a window of 3 on every layer). The ``labels=`` loss (``logits.float()``) is compared at 1e-6; the float64 loss
is the same shifted cross-entropy on the float64 logits. transformers' loss is the language-modelling loss alone
(``output_router_logits`` False), as ``lm_loss``'s.
"""
import contextlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import attention_ref as ar  # noqa: E402
from attention_ref.interop import llama_in_float64, load_pretrained, moe_models_in_float64  # noqa: E402
from _moe_checks import MoEChecks, close, pad_inside_and_right, weights_written_back  # noqa: E402

FIVE = int(transformers.__version__.split(".")[0]) >= 5
ROPE = {"rope_parameters": {"rope_type": "default", "rope_theta": 500.0}} if FIVE else {"rope_theta": 500.0}
SMALL = dict(vocab_size=41, hidden_size=16, intermediate_size=24, moe_intermediate_size=12, num_attention_heads=4,
             num_key_value_heads=2, head_dim=6, num_hidden_layers=3, num_experts=4, num_experts_per_tok=2,
             norm_topk_prob=True, mlp_only_layers=[0], max_position_embeddings=64, rms_norm_eps=1e-6, pad_token_id=0,
             bos_token_id=None, eos_token_id=None, attn_implementation="sdpa", **ROPE,
             **({"experts_implementation": "eager"} if FIVE else {}))


@contextlib.contextmanager
def in_float64():
    with llama_in_float64(), moe_models_in_float64():
        yield


def _model(tie=False, **fields):
    config = transformers.Qwen3MoeConfig(**{**SMALL, **fields}, tie_word_embeddings=tie)
    model = transformers.Qwen3MoeForCausalLM(config).double().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():  # norms away from 1, the router (zero at init in 5.x) random
            p.add_(0.3 * torch.randn_like(p)) if "norm" in name else p.copy_(0.5 * torch.randn_like(p))
    return model


#: Qwen3-MoE's difference in the shared checks: its float64 patches and its router, ``mlp.gate`` on the sparse layers
CHECKS = MoEChecks(in_float64)


@pytest.fixture(params=["untied", "tied"])
def saved(request, tmp_path):
    yield from CHECKS.saved(lambda: _model(tie=request.param == "tied"), tmp_path)


def test_the_small_model_has_what_the_real_one_has(saved):
    model, params, config = saved
    assert config.setting("sparse_layers") == (False, True, True) and config.setting("moe_d_ff") == 12
    assert (config.num_experts, config.experts_per_token, config.d_head) == (4, 2, 6)
    assert params["layers.0.mlp.W_gate"].shape == (16, 24) and "layers.0.mlp.W_router" not in params
    assert params["layers.1.mlp.experts.W_gate"].shape == (4, 16, 12) and "layers.1.mlp.W_gate" not in params
    assert [hasattr(layer.mlp, "experts") for layer in model.model.layers] == [False, True, True]


def test_logits_loss_and_every_gradient(saved):
    model, params, config = saved
    theirs, named = CHECKS.loss_and_gradients(model, params, config, pad_inside_and_right(config.vocab_size))
    assert sorted(theirs) == sorted(named) == sorted(model.state_dict())  # router, experts, a tied head
    for name, p in named.items():
        assert p.grad is not None, name
        if ".experts." in name and float(p.grad.abs().max()) == 0:  # an expert no token chose: no gradient
            assert not np.any(theirs[name]), name
            continue
        assert float(p.grad.abs().max()) > 0, name  # every other weight reached
        close(theirs[name], p.grad, f"d {name}")


def test_to_transformers_gives_their_weights(saved):
    weights_written_back(*saved)


def test_generate_left_padded_batch_token_for_token(saved):
    CHECKS.generate_left_padded(*saved)


def test_each_decoding_step_against_past_key_values(saved):
    """Our decoder's logits at every step against transformers' model run step by step on its own
    cache, in float64, a left-padded batch."""
    CHECKS.decoding_steps(*saved)


LINEAR = {"rope_type": "linear", "factor": 2.0}


def test_plain_top_k_a_sparse_step_and_scaled_rope(tmp_path):
    """``norm_topk_prob`` False (the softmax's top k as they are) and ``decoder_sparse_step`` 2 with no
    ``mlp_only_layers`` (layers 1 and 3 sparse, 0 and 2 dense); RoPE scaled (linear, factor 2), as Qwen3 reads it."""
    rope = ({"rope_parameters": {**LINEAR, "rope_theta": 500.0}} if FIVE
            else {"rope_theta": 500.0, "rope_scaling": LINEAR})
    with in_float64():
        torch.manual_seed(4)
        model = _model(norm_topk_prob=False, mlp_only_layers=None, decoder_sparse_step=2, num_hidden_layers=4, **rope)
        model.save_pretrained(tmp_path)
        params, config = load_pretrained(tmp_path)
        assert config.setting("sparse_layers") == (False, True, False, True)
        assert config.setting("norm_topk_prob") is False and dict(config.rope_scaling) == LINEAR
        CHECKS.full_batch_logits(model, params, config)


def test_a_sliding_window_on_every_layer(tmp_path):
    """``use_sliding_window`` with a window of 3 keys, shorter than the prompts: the logits of a left-padded
    batch, and ``generate`` token for token (decoding: the window over the cache)."""
    with in_float64():
        torch.manual_seed(5)
        model = _model(use_sliding_window=True, sliding_window=3)
        model.save_pretrained(tmp_path)
        params, config = load_pretrained(tmp_path)
        assert config.sliding_window == 3

        def draw(g):
            ids = torch.randint(1, config.vocab_size, (2, 8), generator=g)
            mask = torch.ones_like(ids)
            mask[1, :2] = 0
            ids = ids.masked_fill(mask == 0, 0)
            with torch.no_grad():
                full = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
            return ids, mask, full

        ids, mask, full = CHECKS.draw(model, draw)
        with torch.no_grad():
            theirs = model(ids, attention_mask=mask).logits
    logits, _ = ar.lm_forward(ids.numpy(), params, config, attention_mask=mask.numpy())
    real = mask.numpy().astype(bool)
    close(logits[real], theirs[mask.bool()], "logits")
    np.testing.assert_array_equal(ar.generate(ids.numpy(), params, config, 6, attention_mask=mask.numpy()), full.numpy())
    without = ar.LMConfig.from_dict({**ar.models.families.FAMILY["qwen3_moe"].example, "model_type": "qwen3_moe",
                                     "sliding_window": 3})
    assert without.sliding_window is None  # the window is read only when use_sliding_window is true


@pytest.mark.parametrize("field, value, match", [
    ("use_sliding_window", "yes", "field 'use_sliding_window' must be a JSON boolean"),
    ("attention_bias", True, "attention_bias = True is not supported"),
    ("hidden_act", "gelu", "hidden_act = 'gelu' is not supported"),
    ("num_local_experts", 8, "num_experts = 4 and num_local_experts = 8"),
    ("mlp_only_layers", [0.5], "mlp_only_layers must be a list of layer indices"),
    ("shared_expert_intermediate_size", 8, "config.json key 'shared_expert_intermediate_size'"),
    ("decoder_sparse_step", None, "decoder_sparse_step must be a positive integer"),  # was a TypeError of %
    ("num_experts", None, "num_experts is null"),  # was read as the default 128
    ("head_dim", None, "head_dim is null"),  # was hidden / heads; transformers reads None and cannot build it
])
def test_fields_that_change_the_numbers_are_refused_by_name(field, value, match):
    from attention_ref.models.families import FAMILY

    d = dict(FAMILY["qwen3_moe"].example, model_type="qwen3_moe")
    d[field] = value
    with pytest.raises(ValueError, match=match):
        ar.LMConfig.from_dict(d)


def test_both_spellings_of_the_experts_count_are_read():
    from attention_ref.models.families import FAMILY

    d = dict(FAMILY["qwen3_moe"].example, model_type="qwen3_moe")
    five = {**{k: v for k, v in d.items() if k != "num_experts"}, "num_local_experts": 4}
    assert ar.LMConfig.from_dict(five) == ar.LMConfig.from_dict(d)
    assert ar.LMConfig.from_dict({**d, "num_local_experts": 4}).num_experts == 4
