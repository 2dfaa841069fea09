"""DeepSeek-V3 whole (the family file attention_ref/models/families/deepseek_v3.py) against transformers'
``DeepseekV3ForCausalLM`` on 4.57 and 5.x: the family's small example (a dense first layer, two routed layers of 4
experts in 2 groups of which 1 is kept, 2 experts per token, a shared expert, YaRN with ``mscale`` and
``mscale_all_dim``), with and without ``q_lora_rank``, random weights in float64 (the correction bias too), written by ``save_pretrained`` and read by our
``load_pretrained``; logits,
the loss and the gradient of every parameter at 1e-10 relative; greedy ``generate`` token for token on a
left-padded batch; ``to_transformers`` of the weights (4.57: one module per expert; 5.x: fused); each decoding
step's logits (ours: the absorbed form over cached latents; theirs: per-head keys
and values) against transformers' own cache.

transformers' float32 steps run as the same formulas in float64 (:func:`attention_ref.interop.deepseek_v3_in_float64`):
the RMSNorms' cast, the router's ``F.linear`` and sigmoid, the RoPE angles and YaRN's ``inv_freq``. The attention is
``sdpa`` (the eager path's softmax is float32). The routing is checked far from ties: in every routed layer, for
every real token, the kept groups' scores and the chosen experts' choice scores are at least ``GAP`` from the next
ones, and every chosen choice score is positive (4.57 masks the groups not kept with 0, 5.x with -inf), else the
inputs are drawn again. The checks the mixture-of-experts families share are written once in
tests/interop/_moe_checks.py; this file gives them DeepSeek-V3's difference (``CHECKS``: its float64 patch, its
routing's margins, 30 draws).
"""
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import attention_ref as ar  # noqa: E402
from attention_ref.interop import deepseek_v3_in_float64, load_pretrained  # noqa: E402
from attention_ref.models.families import FAMILY  # noqa: E402
from _moe_checks import MoEChecks, close, weights_written_back  # noqa: E402

FIVE = int(transformers.__version__.split(".")[0]) >= 5
EXAMPLE = FAMILY["deepseek_v3"].example


def _fields(**changes):
    d = {**EXAMPLE, **changes}
    rope = d.pop("rope_scaling")
    theta = d.pop("rope_theta")
    rope_fields = {"rope_parameters": {**rope, "rope_theta": theta}} if FIVE else {"rope_theta": theta,
                                                                                     "rope_scaling": dict(rope)}
    return {**d, **rope_fields, "pad_token_id": 0, "bos_token_id": None, "eos_token_id": None,
            "attn_implementation": "sdpa", **({"experts_implementation": "eager"} if FIVE else {})}


def _model(seed, **changes):
    config = transformers.DeepseekV3Config(**_fields(**changes))
    torch.manual_seed(seed)
    model = transformers.DeepseekV3ForCausalLM(config).double().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.2 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.4 if "embed" in name else 0.3)
        for layer in model.model.layers:
            if hasattr(layer.mlp, "gate"):
                layer.mlp.gate.e_score_correction_bias.copy_(0.05 * torch.randn(EXAMPLE["n_routed_experts"]))
    return model


def _routing_margins(gate, h, config):
    """The margins of one routed layer's routing over the real tokens ``h`` (T, D): between the kept groups' and
    the next group's score, the chosen experts' and the next kept expert's choice score, and the smallest chosen
    choice score itself (it must be positive for 4.57's masking with 0 to agree with 5.x's -inf)."""
    gaps = []
    E, G, kept, k = (EXAMPLE[n] for n in ("n_routed_experts", "n_group", "topk_group", "num_experts_per_tok"))
    c = torch.sigmoid(h @ gate.weight.T) + gate.e_score_correction_bias  # (T, E)
    groups = c.view(-1, G, E // G).topk(2, dim=-1)[0].sum(-1).sort(-1, descending=True).values
    gaps.append(float((groups[:, kept - 1] - groups[:, kept]).min()) if kept < G else 1.0)
    best = c.view(-1, G, E // G).topk(2, dim=-1)[0].sum(-1).topk(kept, dim=-1)[1]  # (T, kept)
    inside = torch.zeros_like(c, dtype=torch.bool).view(-1, G, E // G)
    inside[torch.arange(len(c))[:, None], best] = True
    choice = c.masked_fill(~inside.view(-1, E), float("-inf")).sort(-1, descending=True).values
    gaps.append(float(choice[:, k - 1].min()))
    if k < kept * (E // G):
        gaps.append(float((choice[:, k - 1] - choice[:, k]).min()))
    return gaps


#: DeepSeek-V3's difference in the shared checks: its float64 patch, its grouped routing's margins, 30 draws
CHECKS = MoEChecks(deepseek_v3_in_float64, margins=_routing_margins, tries=30)


@pytest.fixture(params=["q-lora", "no-q-lora"], scope="module")
def built(request, tmp_path_factory):
    """transformers' model, written by its ``save_pretrained`` and read by our ``load_pretrained``."""
    folder = tmp_path_factory.mktemp(request.param)
    model = _model(0, **({} if request.param == "q-lora" else {"q_lora_rank": None}))
    model.save_pretrained(folder)
    params, config = load_pretrained(folder)
    return model, params, config


def test_the_small_model_has_what_the_real_one_has(built):
    model, params, config = built
    layers = FAMILY["deepseek_v3"].layers(config)
    assert [layer.block.routing is None for layer in layers] == [True, False, False]
    attn = layers[0].block.attn
    assert attn.rope_factor != 1.0 and attn.scale != (4 + 4) ** -0.5 and attn.interleaved
    assert attn.scale == pytest.approx(model.model.layers[0].self_attn.scaling, rel=1e-15)
    assert (config.num_experts, config.experts_per_token) == (4, 2)
    assert ("self_attn.q_proj" in dict(model.model.layers[0].named_modules())) == (config.setting("q_lora_rank") is None)


def test_logits_loss_and_every_gradient(built):
    model, params, config = built
    model.zero_grad()

    def draw(g):
        ids = torch.randint(1, config.vocab_size, (2, 9), generator=g)
        mask = torch.ones_like(ids)
        mask[1, 6:] = 0  # right padding in the second row
        return ids, mask

    theirs, named = CHECKS.loss_and_gradients(model, params, config, draw, labels=False)
    buffers = sorted(n for n in model.state_dict() if n.endswith("e_score_correction_bias"))
    assert sorted(theirs) == sorted(model.state_dict()) == sorted(list(named) + buffers)
    for name in buffers:  # the choice bias, a buffer: no gradient here either
        assert not theirs[name].any()
    for name, p in named.items():
        assert p.grad is not None and float(p.grad.abs().max()) > 0, name  # every weight reached
        close(theirs[name], p.grad, f"d {name}")


def test_to_transformers_gives_their_weights(built):
    weights_written_back(*built)


def test_generate_left_padded_batch_token_for_token(built):
    CHECKS.generate_left_padded(*built, new_tokens=6)


def test_each_decoding_step_against_past_key_values(built):
    """Our decoder (a latent per token and layer, the absorbed form) against transformers' model run step by step
    on its own cache (per-head keys and values), in float64, a left-padded batch: the logits of every step."""
    model, params, config = built
    decoder = CHECKS.decoding_steps(model, params, config)
    cache = decoder.caches[1]
    assert isinstance(cache, ar.MLADecodeCache) and cache.latent.c_hat.shape == (2, 9, config.setting("kv_lora_rank"))


def test_the_readers_defaults_are_transformers():
    """Every default the reader takes for an absent key is DeepseekV3Config's (4.57 and 5.x)."""
    from attention_ref.models.families.deepseek_v3 import DEEPSEEK_V3_DEFAULTS

    theirs = transformers.DeepseekV3Config()
    for name, value in DEEPSEEK_V3_DEFAULTS.items():
        assert getattr(theirs, name) == value, name
    theta = getattr(theirs, "rope_theta", None) or theirs.rope_parameters["rope_theta"]  # 4.57's field, 5.x's dict
    assert theta == 10000.0
    assert theirs.attention_bias is False and theirs.hidden_act == "silu" and theirs.tie_word_embeddings is False
