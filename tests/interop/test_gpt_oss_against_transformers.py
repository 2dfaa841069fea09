"""gpt-oss whole (the family file attention_ref/models/families/gpt_oss.py) against transformers'
``GptOssForCausalLM``: built from a small config with random weights in float64 (sinks, biases,
router and experts included), written by ``save_pretrained`` and read by our ``load_pretrained``;
logits, the loss and the gradient of every parameter at 1e-10 relative; ``generate`` token for
token on a left-padded batch; each decoding step's logits against transformers' own cache;
``to_transformers`` of the weights; the config fields that change the numbers and are not
computed, refused by name.

The small model has what the real one has: sliding and full layers alternating (a window of 3,
shorter than the prompts), YaRN RoPE (factor 4 over 16 positions, ``truncate`` False, so the
ramp is inside the 4 pairs of a head 8 wide and the attention factor is 1.139), 4 experts of
which each token takes 2, and a learned sink per head. Its routing is checked for near ties: the
gap between each real token's k-th and (k+1)-th router logit, in every layer, must be at least
``GAP`` (1e-6) times the logits' scale (else the inputs are drawn again), so that no rounding at
1e-15 can choose another expert in one implementation than in the other. The checks the
mixture-of-experts families share are written once in tests/interop/_moe_checks.py; this file
gives them gpt-oss's difference (``CHECKS``: its float64 patch, its router ``mlp.router``).

transformers' float32 steps inside a float64 model run as the same formulas in float64
(:func:`attention_ref.interop.gpt_oss_in_float64`): the RMSNorm's cast and the RoPE angles,
YaRN's ``inv_freq`` computed by transformers' own function with ``torch.float`` read as float64.
The eager attention (the sink column, the softmax in the logits' dtype), the router and the
experts run in float64 already. The ``labels=`` loss (``logits.float()``) is compared at 1e-6;
the float64 loss is the same shifted cross-entropy on the float64 logits. transformers' loss is
the language-modelling loss alone (``output_router_logits`` False), as ``lm_loss``'s.
Runs on transformers 4.57 (``rope_scaling``, experts indexed through 4.57's scattered scores) and
5.x (``rope_parameters``; the experts' weights keep their names and layout).
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import attention_ref as ar  # noqa: E402
from attention_ref.interop import gpt_oss_in_float64, load_pretrained  # noqa: E402
from _moe_checks import MoEChecks, close, pad_inside_and_right, weights_written_back  # noqa: E402

FIVE = int(transformers.__version__.split(".")[0]) >= 5
YARN = {"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
        "original_max_position_embeddings": 16}
ROPE = ({"rope_parameters": {**YARN, "rope_theta": 500.0}} if FIVE else {"rope_theta": 500.0, "rope_scaling": YARN})
SMALL = dict(vocab_size=41, hidden_size=16, intermediate_size=12, num_attention_heads=4, num_key_value_heads=2,
             head_dim=8, num_hidden_layers=2, num_local_experts=4, num_experts_per_tok=2, sliding_window=3,
             max_position_embeddings=64, rms_norm_eps=1e-5, pad_token_id=0, bos_token_id=None, eos_token_id=None,
             attn_implementation="eager", **ROPE,
             # 5.x's default experts kernel (grouped_mm) refuses float64: its loop over the experts (4.57 has only that)
             **({"experts_implementation": "eager"} if FIVE else {}))


def _model(tie=False, **fields):
    config = transformers.GptOssConfig(**{**SMALL, **fields}, tie_word_embeddings=tie)
    model = transformers.GptOssForCausalLM(config).double().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():  # biases (zero at init), sinks and norms random too
            p.mul_(10.0) if "norm" not in name and p.ndim >= 2 else p.add_(0.3 * torch.randn_like(p))
    return model


#: gpt-oss's difference in the shared checks: its float64 patch and its router, ``mlp.router`` (a bias too)
CHECKS = MoEChecks(gpt_oss_in_float64, router="router")


@pytest.fixture(params=["untied", "tied"])
def saved(request, tmp_path):
    yield from CHECKS.saved(lambda: _model(tie=request.param == "tied"), tmp_path)


def test_the_small_model_has_what_the_real_one_has(saved):
    _, params, config = saved
    assert config.layer_types == ("sliding_attention", "full_attention") and config.sliding_window == 3
    assert dict(config.rope_scaling)["rope_type"] == "yarn" and config.rope_attention_factor() > 1.1
    assert (config.num_experts, config.experts_per_token, config.d_head) == (4, 2, 8)
    assert np.abs(params["layers.0.self_attn.sinks"]).min() > 0


def test_logits_loss_and_every_gradient(saved):
    model, params, config = saved
    theirs, named = CHECKS.loss_and_gradients(model, params, config, pad_inside_and_right(config.vocab_size))
    assert sorted(theirs) == sorted(named) == sorted(model.state_dict())  # sinks, router, experts, a tied head
    for name, p in named.items():
        assert p.grad is not None and float(p.grad.abs().max()) > 0, name  # every weight reached
        close(theirs[name], p.grad, f"d {name}")


def test_to_transformers_gives_their_weights(saved):
    weights_written_back(*saved)


def test_generate_left_padded_batch_token_for_token(saved):
    CHECKS.generate_left_padded(*saved)


def test_each_decoding_step_against_past_key_values(saved):
    """Our decoder's logits at every step against transformers' model run step by step on its own
    cache (the sliding layers' window over the cache), in float64, a left-padded batch."""
    CHECKS.decoding_steps(*saved)


@pytest.mark.parametrize("plain", [False, True])
def test_default_layer_types_and_plain_rope(tmp_path, plain):
    """transformers' default layer types (even layers sliding) over 3 layers; and the default RoPE
    type (5.x ``rope_parameters``; 4.57 writes ``rope_scaling: null`` for it, which 5.x reads as
    its YaRN default, so that file is refused by name rather than guessed)."""
    fields = {k: v for k, v in SMALL.items() if k not in ("rope_parameters", "rope_scaling", "rope_theta")}
    if plain:
        fields.update({"rope_parameters": {"rope_type": "default", "rope_theta": 500.0}} if FIVE
                      else {"rope_theta": 500.0, "rope_scaling": None})
    else:
        fields.update(ROPE)
    with gpt_oss_in_float64():
        torch.manual_seed(4)
        model = _model(**{**fields, "num_hidden_layers": 3})
        model.save_pretrained(tmp_path)
        if plain and not FIVE:
            with pytest.raises(ValueError, match="rope_scaling = None is not supported"):
                load_pretrained(tmp_path)
            return
        params, config = load_pretrained(tmp_path)
        assert config.layer_types == ("sliding_attention", "full_attention", "sliding_attention")
        assert (config.rope_scaling is None) == plain
        CHECKS.full_batch_logits(model, params, config)


@pytest.mark.parametrize("field, value, match", [
    ("attention_bias", False, "attention_bias = False is not supported"),
    ("swiglu_limit", 5.0, "swiglu_limit = 5.0 is not supported"),
    ("swiglu_alpha", 1.0, "swiglu_alpha = 1.0 is not supported"),
    ("rope_scaling", None, "rope_scaling = None is not supported"),
    ("num_experts", 4, "config.json key 'num_experts'"),
])
def test_fields_that_change_the_numbers_are_refused_by_name(field, value, match):
    from attention_ref.models.families import FAMILY

    d = dict(FAMILY["gpt_oss"].example, model_type="gpt_oss")
    d[field] = value
    with pytest.raises(ValueError, match=match):
        ar.LMConfig.from_dict(d)
