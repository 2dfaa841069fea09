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
inputs are drawn again.
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import attention_ref as ar  # noqa: E402
from attention_ref.interop import deepseek_v3_in_float64, load_pretrained, to_transformers  # noqa: E402
from attention_ref.models.families import FAMILY  # noqa: E402
from _transformers_api import returned_cache, with_cache  # noqa: E402

FIVE = int(transformers.__version__.split(".")[0]) >= 5
RTOL = 1e-10
GAP = 1e-6
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


def _routing_gap(model, ids, mask):
    """The smallest margin of the routing over every routed layer and real token: between the kept groups' and
    the next group's score, the chosen experts' and the next kept expert's choice score, and the smallest chosen
    choice score itself (it must be positive for 4.57's masking with 0 to agree with 5.x's -inf)."""
    keep = torch.as_tensor(mask).reshape(-1).bool()
    gaps, handles = [], []
    E, G, kept, k = (EXAMPLE[n] for n in ("n_routed_experts", "n_group", "topk_group", "num_experts_per_tok"))

    def hook(gate, args, output):
        h = args[0].reshape(-1, gate.weight.shape[1])[keep]
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

    for layer in model.model.layers:
        if hasattr(layer.mlp, "gate"):
            handles.append(layer.mlp.gate.register_forward_hook(hook))
    try:
        with torch.no_grad():
            model(torch.as_tensor(ids), attention_mask=torch.as_tensor(mask))
    finally:
        for handle in handles:
            handle.remove()
    return min(gaps)


def _draw(model, draw, tries=30):
    for seed in range(tries):
        ids, mask, *rest = draw(torch.Generator().manual_seed(seed))
        if _routing_gap(model, ids, mask) >= GAP:
            return (ids, mask, *rest)
    raise AssertionError(f"no inputs without a near tie in the routing after {tries} draws")


def _close(ours, theirs, what):
    theirs = theirs.detach().numpy() if hasattr(theirs, "detach") else np.asarray(theirs)
    scale = max(float(np.abs(theirs).max()), 1e-300)
    err = float(np.abs(np.asarray(ours) - theirs).max())
    assert err <= RTOL * scale, f"{what}: max abs error {err:.2e} against max |value| {scale:.2e}"


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
    V = config.vocab_size
    model.zero_grad()

    def draw(g):
        ids = torch.randint(1, V, (2, 9), generator=g)
        mask = torch.ones_like(ids)
        mask[1, 6:] = 0  # right padding in the second row
        return ids, mask

    with deepseek_v3_in_float64():
        ids, mask = _draw(model, draw)
        labels = ids.masked_fill(mask == 0, -100)
        out = model(ids, attention_mask=mask)
        loss_64 = torch.nn.functional.cross_entropy(out.logits[:, :-1].reshape(-1, V), labels[:, 1:].reshape(-1))
        loss_64.backward()
    loss, grads, logits = ar.lm_loss(ids.numpy(), params, config, attention_mask=mask.numpy())
    real = mask.numpy().astype(bool)
    _close(logits[real], out.logits[mask.bool()], "logits")
    assert abs(loss - loss_64.item()) <= RTOL * abs(loss_64.item()), (loss, loss_64.item())
    theirs = to_transformers(grads, config)
    named = dict(model.named_parameters(remove_duplicate=False))
    buffers = sorted(n for n in model.state_dict() if n.endswith("e_score_correction_bias"))
    assert sorted(theirs) == sorted(model.state_dict()) == sorted(list(named) + buffers)
    for name in buffers:  # the choice bias, a buffer: no gradient here either
        assert not theirs[name].any()
    for name, p in named.items():
        assert p.grad is not None and float(p.grad.abs().max()) > 0, name  # every weight reached
        _close(theirs[name], p.grad, f"d {name}")


def test_to_transformers_gives_their_weights(built):
    model, params, config = built
    theirs = to_transformers(params, config)
    for name, p in model.state_dict().items():
        np.testing.assert_array_equal(theirs[name], p.numpy(), err_msg=name)


def test_generate_left_padded_batch_token_for_token(built):
    model, params, config = built

    def draw(g):
        ids = torch.randint(1, config.vocab_size, (3, 6), generator=g)
        mask = torch.ones_like(ids)
        mask[1, :2] = 0
        mask[2, :4] = 0
        ids = ids.masked_fill(mask == 0, 0)
        with torch.no_grad():
            full = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
        return full, torch.cat([mask, torch.ones(3, 6, dtype=mask.dtype)], dim=1), ids, mask

    with deepseek_v3_in_float64():  # the gap checked over the prompt and every generated token
        full, _, ids, mask = _draw(model, draw)
    ours = ar.generate(ids.numpy(), params, config, 6, attention_mask=mask.numpy())
    np.testing.assert_array_equal(ours, full.numpy())


def test_each_decoding_step_against_past_key_values(built):
    """Our decoder (a latent per token and layer, the absorbed form) against transformers' model run step by step
    on its own cache (per-head keys and values), in float64, a left-padded batch: the logits of every step."""
    model, params, config = built

    def draw(g):
        ids = torch.randint(1, config.vocab_size, (2, 5), generator=g)
        mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
        steps = torch.randint(1, config.vocab_size, (2, 4), generator=g)
        return (torch.cat([ids.masked_fill(mask == 0, 0), steps], 1),
                torch.cat([mask, torch.ones(2, 4, dtype=mask.dtype)], 1))

    with deepseek_v3_in_float64():
        full, full_mask = _draw(model, draw)
        ids, mask, steps = full[:, :5], full_mask[:, :5], full[:, 5:]
        decoder = ar.LMDecoder(params, config)
        ours = [decoder.prefill(ids.numpy(), mask.numpy())[:, -1]]
        ours += [decoder.step(steps[:, i].numpy()) for i in range(4)]
        with torch.no_grad():
            positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
            res = model(ids, attention_mask=mask, position_ids=positions, **with_cache(model, None))
            theirs, past = [res.logits[:, -1]], returned_cache(res)
            for i in range(4):
                mask = torch.cat([mask, torch.ones(2, 1, dtype=mask.dtype)], dim=1)
                positions = positions[:, -1:] + 1
                res = model(steps[:, i:i + 1], attention_mask=mask, position_ids=positions, **with_cache(model, past))
                theirs.append(res.logits[:, -1])
                past = returned_cache(res)
    for i, (a, b) in enumerate(zip(ours, theirs)):
        _close(a, b, f"logits of step {i}")
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
