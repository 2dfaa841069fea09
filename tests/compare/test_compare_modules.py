"""compare.module: correct torch ports of the attention, MLP and decoder layer of GPT-2, Llama,
Gemma 2, GPT-NeoX and Phi-3 (plain torch, tests/compare/_torch_ports.py; and transformers' own
Llama modules behind the few-line wrapper of docs/compare.md) match; every layer-level mistake of
the catalogue, planted in those ports, is named (or, for a load that fails, named from the load's
error), and located at the first submodule that differs."""
import numpy as np
import pytest

from attention_ref import compare
from attention_ref.compare import MISTAKES
from attention_ref.interop import random_model_config

torch = pytest.importorskip("torch")
import _torch_ports as P  # noqa: E402  (needs torch)

FAMILIES = ("gpt2", "llama", "gemma2", "gpt_neox", "phi3")
#: configs where each mistake shows: heads 8 wide (RoPE pairs differ from (2i, 2i+1)), Gemma 2's window
#: of 4 (the cases reach T = 7), Llama's head_dim given
WIDE = {"gpt_neox": {"hidden_size": 32, "rotary_pct": 0.5}, "gemma2": {"sliding_window": 4},
        "llama": {}, "gpt2": {}, "phi3": {}}
CLASSES = {"attention": P.Attention, "mlp": P.MLP, "decoder_layer": P.DecoderLayer}


def build(kind, cfg, mistakes=()):
    cls = CLASSES[kind]
    return cls(cfg, mistakes=mistakes) if kind == "mlp" else cls(cfg, 0, mistakes=mistakes)


@pytest.mark.parametrize("family", FAMILIES)
def test_correct_ports_match(family):
    cfg = random_model_config(family, **WIDE[family])
    for kind in ("attention", "mlp", "decoder_layer"):
        verdict = compare.module(build(kind, cfg), cfg, kind)
        assert verdict.ok, str(verdict)
        assert verdict.error < 1e-13 and verdict.cases >= 4 and verdict.mistake is None


# (family, kind, the planted mistake, the id compare must name, extra config fields)
PLANTED = [
    ("llama", "attention", "rope_layout", "rope_layout", {}),
    ("llama", "attention", "rope_theta", "rope_theta", {}),
    ("llama", "attention", "rope_position_offset", "rope_position_offset", {}),
    ("llama", "attention", "gqa_head_order", "gqa_head_order", {}),
    ("llama", "attention", "attention_scale", "attention_scale", {}),
    ("llama", "attention", "padding_ignored", "padding_ignored", {}),
    ("llama", "attention", "head_dim", "head_dim", {"head_dim": 8}),
    ("llama", "mlp", "gate_up_swapped", "gate_up_swapped", {}),
    ("llama", "decoder_layer", "rms_norm_eps", "rms_norm_eps", {}),
    ("llama", "decoder_layer", "norm_offset", "norm_offset", {}),
    ("gpt2", "attention", "conv1d_transpose", "conv1d_transpose", {}),
    ("gpt2", "attention", "qkv_bias_missing", "qkv_bias_missing", {}),
    ("gpt2", "attention", "attention_scale", "attention_scale", {}),
    ("gpt2", "mlp", "gelu_variant", "gelu_variant", {}),
    ("gpt2", "mlp", "conv1d_transpose_mlp", "conv1d_transpose", {}),
    ("gpt2", "decoder_layer", "rms_norm_eps", "rms_norm_eps", {}),
    ("gemma2", "attention", "softcap_missing", "softcap_missing", {}),
    ("gemma2", "attention", "attention_scale", "attention_scale", {}),
    ("gemma2", "attention", "window_off_by_one", "window_off_by_one", {}),
    ("gemma2", "attention", "window_wrong_layers", "window_wrong_layers", {}),
    ("gemma2", "mlp", "gelu_variant", "gelu_variant", {}),
    ("gemma2", "decoder_layer", "norm_offset", "norm_offset", {}),
    ("gemma2", "decoder_layer", "post_norm_missing", "post_norm_missing", {}),
    ("gpt_neox", "attention", "fused_qkv_split", "fused_qkv_split", {}),
    ("gpt_neox", "attention", "partial_rotary", "partial_rotary", {}),
    ("gpt_neox", "attention", "rope_layout", "rope_layout", {}),
    ("gpt_neox", "attention", "qkv_bias_missing", "qkv_bias_missing", {}),
    ("gpt_neox", "mlp", "gelu_variant", "gelu_variant", {}),
    ("gpt_neox", "decoder_layer", "parallel_residual", "parallel_residual", {}),
    ("phi3", "attention", "rope_theta", "rope_theta", {}),
    ("phi3", "attention", "gqa_head_order", "gqa_head_order", {}),
    ("phi3", "mlp", "gate_up_swapped", "gate_up_swapped", {}),
    ("phi3", "decoder_layer", "norm_offset", "norm_offset", {}),
]


@pytest.mark.parametrize("family, kind, planted, named, extra", PLANTED,
                         ids=[f"{f}-{k}-{p}" for f, k, p, _, _ in PLANTED])
def test_planted_mistakes_are_named(family, kind, planted, named, extra):
    cfg = random_model_config(family, **{**WIDE[family], **extra})
    verdict = compare.module(build(kind, cfg, {planted}), cfg, kind)
    assert not verdict.ok and not verdict
    assert verdict.mistake == named, str(verdict)
    assert named in MISTAKES
    with pytest.raises(AssertionError, match=named):
        verdict.check()
    if verdict.where != "load_state_dict":  # located at a submodule of the layer, by transformers' name
        assert verdict.where and verdict.error > 1e-8


def test_where_is_the_first_diverging_submodule():
    cfg = random_model_config("llama")
    assert compare.module(build("decoder_layer", cfg, {"norm_offset"}), cfg, "decoder_layer").where == \
        "input_layernorm"
    assert compare.module(build("decoder_layer", cfg, {"rope_theta"}), cfg, "decoder_layer").where == \
        "self_attn.o_proj"  # q_proj, k_proj, v_proj agree; RoPE is inside the attention


def test_padding_shows_only_on_the_padded_batch():
    cfg = random_model_config("llama")
    verdict = compare.module(build("attention", cfg, {"padding_ignored"}), cfg, "attention")
    assert verdict.inputs == ("left padding",) and verdict.failed == 1


def test_a_difference_no_variant_explains_is_located_not_named():
    cfg = random_model_config("llama")
    module = build("mlp", cfg)
    module.act = lambda x: torch.nn.functional.silu(x) * 1.001  # no porting mistake of the catalogue
    verdict = compare.module(module, cfg, "mlp")
    assert not verdict.ok and verdict.mistake is None and verdict.where == "mlp.down_proj"
    assert "located only" in str(verdict)


def test_a_module_that_raises_is_a_verdict_with_its_line():
    cfg = random_model_config("llama")
    module = build("attention", cfg)

    def broken(x, positions, attention_mask=None):
        raise RuntimeError("shapes do not fit")
    module.forward = broken
    verdict = compare.module(module, cfg, "attention")
    assert not verdict.ok and verdict.where == "the call raised" and "shapes do not fit" in verdict.detail


def test_an_unknown_tensor_is_located_not_named():
    cfg = random_model_config("llama")
    module = build("mlp", cfg)
    module.extra = torch.nn.Linear(2, 2)
    verdict = compare.module(module, cfg, "mlp")
    assert not verdict.ok and verdict.mistake is None and verdict.where == "load_state_dict"
    assert "unexpected extra.bias, extra.weight" in verdict.detail


def test_the_user_module_is_left_as_it_was():
    cfg = random_model_config("llama")
    module = build("mlp", cfg)
    before = {k: v.clone() for k, v in module.state_dict().items()}
    compare.module(module, cfg, "mlp")
    after = module.state_dict()
    assert all(after[k].dtype == torch.float32 and torch.equal(after[k], before[k]) for k in before)


def test_bad_arguments_are_refused_by_name():
    cfg = random_model_config("llama")
    with pytest.raises(ValueError, match="kind"):
        compare.module(build("mlp", cfg), cfg, "block")
    with pytest.raises(TypeError, match="module"):
        compare.module(lambda x: x, cfg, "mlp")
    with pytest.raises(TypeError, match="config"):
        compare.module(build("mlp", cfg), 3, "mlp")
    with pytest.raises(ValueError, match="model_type"):
        compare.module(build("mlp", cfg), {"hidden_size": 16}, "mlp")


def test_transformers_own_llama_modules_behind_the_wrapper_match():
    """Another style: transformers' LlamaAttention and LlamaDecoderLayer with transformers' own
    signature (position_embeddings=(cos, sin), a 4-D additive mask), behind the wrapper of
    docs/compare.md; in float64 through interop.llama_in_float64 (transformers computes the RoPE
    angles and the RMSNorm in float32 otherwise), attention through sdpa (eager's softmax is float32)."""
    pytest.importorskip("transformers")
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaAttention, LlamaDecoderLayer, LlamaRotaryEmbedding

    from attention_ref.interop import llama_in_float64

    def additive_mask(x, attention_mask):
        T = x.shape[1]
        allowed = torch.ones(T, T, dtype=torch.bool).tril()[None, None]
        if attention_mask is not None:
            allowed = allowed & attention_mask[:, None, None, :].bool()
        return torch.zeros(allowed.shape, dtype=x.dtype).masked_fill(~allowed, torch.finfo(x.dtype).min)

    class Attention(LlamaAttention):
        def __init__(self, config):
            super().__init__(config, layer_idx=0)
            self.rotary = LlamaRotaryEmbedding(config)

        def forward(self, x, positions, attention_mask=None):
            return super().forward(x, position_embeddings=self.rotary(x, positions),
                                   attention_mask=additive_mask(x, attention_mask))[0]

    class Layer(LlamaDecoderLayer):
        def __init__(self, config):
            super().__init__(config, layer_idx=0)
            self.rotary = LlamaRotaryEmbedding(config)

        def forward(self, x, positions, attention_mask=None):
            out = super().forward(x, position_embeddings=self.rotary(x, positions),
                                  attention_mask=additive_mask(x, attention_mask))
            return out[0] if isinstance(out, tuple) else out

    config = LlamaConfig(**random_model_config("llama"))
    config._attn_implementation = "sdpa"
    with llama_in_float64():
        for cls, kind in ((Attention, "attention"), (Layer, "decoder_layer")):
            verdict = compare.module(cls(config), config, kind)
            assert verdict.ok, str(verdict)
            assert verdict.error < 1e-13


def test_verdict_numbers_are_real():
    cfg = random_model_config("llama")
    verdict = compare.module(build("attention", cfg, {"rope_theta"}), cfg, "attention")
    assert verdict.cases == 5 and verdict.failed >= 4 and np.isfinite(verdict.error) and verdict.error > 1e-6


def test_a_real_models_config_draws_its_first_layers_only():
    """A config with Llama 2's vocabulary and depth: the module is layer 0, so neither the 32000-row
    table nor the other layers are drawn (this runs in about the time of the small config)."""
    cfg = random_model_config("llama", vocab_size=32000, num_hidden_layers=32, pad_token_id=31999)
    verdict = compare.module(build("decoder_layer", cfg), cfg, "decoder_layer")
    assert verdict.ok, str(verdict)
