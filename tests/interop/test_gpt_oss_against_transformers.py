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
``GAP`` times the logits' scale (else the inputs are drawn again), so that no rounding at 1e-15
can choose another expert in one implementation than in the other.

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
from attention_ref.interop import gpt_oss_in_float64, load_pretrained, to_transformers  # noqa: E402
from _transformers_api import returned_cache, with_cache  # noqa: E402

FIVE = int(transformers.__version__.split(".")[0]) >= 5
RTOL = 1e-10
#: the smallest gap between a token's k-th and (k+1)-th router logit, relative to the logits' scale
GAP = 1e-6
YARN = {"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
        "original_max_position_embeddings": 16}
ROPE = ({"rope_parameters": {**YARN, "rope_theta": 500.0}} if FIVE else {"rope_theta": 500.0, "rope_scaling": YARN})
SMALL = dict(vocab_size=41, hidden_size=16, intermediate_size=12, num_attention_heads=4, num_key_value_heads=2,
             head_dim=8, num_hidden_layers=2, num_local_experts=4, num_experts_per_tok=2, sliding_window=3,
             max_position_embeddings=64, rms_norm_eps=1e-5, pad_token_id=0, bos_token_id=None, eos_token_id=None,
             attn_implementation="eager", **ROPE,
             # 5.x's default experts kernel (grouped_mm) refuses float64: its loop over the experts (4.57 has only that)
             **({"experts_implementation": "eager"} if FIVE else {}))


def _close(ours, theirs, what):
    theirs = theirs.detach().numpy() if hasattr(theirs, "detach") else np.asarray(theirs)
    scale = max(float(np.abs(theirs).max()), 1e-300)
    err = float(np.abs(np.asarray(ours) - theirs).max())
    assert err <= RTOL * scale, f"{what}: max abs error {err:.2e} against max |value| {scale:.2e}"


def _model(tie=False, **fields):
    config = transformers.GptOssConfig(**{**SMALL, **fields}, tie_word_embeddings=tie)
    model = transformers.GptOssForCausalLM(config).double().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():  # biases (zero at init), sinks and norms random too
            p.mul_(10.0) if "norm" not in name and p.ndim >= 2 else p.add_(0.3 * torch.randn_like(p))
    return model


def _routing_gap(model, ids, mask):
    """The smallest gap between the k-th and (k+1)-th router logit of a real token, over every
    layer, relative to the largest logit (forward hooks on each ``mlp.router``'s input)."""
    k = model.config.num_experts_per_tok
    gaps, handles = [], []
    keep = torch.as_tensor(mask).reshape(-1).bool()

    def hook(router, args, output):
        logits = torch.nn.functional.linear(args[0].reshape(-1, router.weight.shape[1]), router.weight, router.bias)
        top = logits[keep].sort(dim=-1, descending=True).values
        gaps.append(float((top[:, k - 1] - top[:, k]).min() / top.abs().max()))

    for layer in model.model.layers:
        handles.append(layer.mlp.router.register_forward_hook(hook))
    try:
        with torch.no_grad():
            model(torch.as_tensor(ids), attention_mask=torch.as_tensor(mask))
    finally:
        for handle in handles:
            handle.remove()
    return min(gaps)


def _draw(model, draw, tries=20):
    """Inputs from ``draw(generator)`` whose routing has no near tie (redrawn until it has none)."""
    for seed in range(tries):
        ids, mask, *rest = draw(torch.Generator().manual_seed(seed))
        if _routing_gap(model, ids, mask) >= GAP:
            return (ids, mask, *rest)
    raise AssertionError(f"no inputs without a near tie in the routing after {tries} draws")


@pytest.fixture(params=["untied", "tied"])
def saved(request, tmp_path):
    with gpt_oss_in_float64():
        torch.manual_seed(0)
        model = _model(tie=request.param == "tied")
        model.save_pretrained(tmp_path)
        params, config = load_pretrained(tmp_path)
        yield model, params, config


def test_the_small_model_has_what_the_real_one_has(saved):
    _, params, config = saved
    assert config.layer_types == ("sliding_attention", "full_attention") and config.sliding_window == 3
    assert dict(config.rope_scaling)["rope_type"] == "yarn" and config.rope_attention_factor() > 1.1
    assert (config.num_experts, config.experts_per_token, config.d_head) == (4, 2, 8)
    assert np.abs(params["layers.0.self_attn.sinks"]).min() > 0


def test_logits_loss_and_every_gradient(saved):
    model, params, config = saved
    V = config.vocab_size

    def draw(g):
        ids = torch.randint(1, V, (2, 9), generator=g)
        ids[0, 4] = 0  # the pad token inside a sequence: its row is read, and gets no gradient
        mask = torch.ones_like(ids)
        mask[1, 6:] = 0  # right padding in the second row
        return ids, mask

    with gpt_oss_in_float64():
        ids, mask = _draw(model, draw)
        labels = ids.masked_fill(mask == 0, -100)
        out = model(ids, attention_mask=mask, labels=labels)
        loss_64 = torch.nn.functional.cross_entropy(out.logits[:, :-1].reshape(-1, V), labels[:, 1:].reshape(-1))
        loss_64.backward()

    loss, grads, logits = ar.lm_loss(ids.numpy(), params, config, attention_mask=mask.numpy())
    real = mask.numpy().astype(bool)
    _close(logits[real], out.logits[mask.bool()], "logits")
    assert abs(loss - loss_64.item()) <= RTOL * abs(loss_64.item()), (loss, loss_64.item())
    assert abs(loss - out.loss.item()) <= 1e-6 * abs(loss)  # labels=: computed in float32 by transformers
    theirs = to_transformers(grads, config)
    named = dict(model.named_parameters(remove_duplicate=False))
    assert sorted(theirs) == sorted(named) == sorted(model.state_dict())  # sinks, router, experts, a tied head
    for name, p in named.items():
        assert p.grad is not None and float(p.grad.abs().max()) > 0, name  # every weight reached
        _close(theirs[name], p.grad, f"d {name}")


def test_to_transformers_gives_their_weights(saved):
    model, params, config = saved
    theirs = to_transformers(params, config)
    for name, p in model.state_dict().items():
        np.testing.assert_array_equal(theirs[name], p.numpy(), err_msg=name)


def test_generate_left_padded_batch_token_for_token(saved):
    model, params, config = saved

    def draw(g):
        ids = torch.randint(1, config.vocab_size, (3, 6), generator=g)
        mask = torch.ones_like(ids)
        mask[1, :2] = 0
        mask[2, :4] = 0
        ids = ids.masked_fill(mask == 0, 0)
        with torch.no_grad():
            full = model.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0)
        return full, torch.cat([mask, torch.ones(3, 8, dtype=mask.dtype)], dim=1), ids, mask

    with gpt_oss_in_float64():  # the gap checked over the prompt and every generated token
        full, _, ids, mask = _draw(model, draw)
    ours = ar.generate(ids.numpy(), params, config, 8, attention_mask=mask.numpy())
    np.testing.assert_array_equal(ours, full.numpy())


def test_each_decoding_step_against_past_key_values(saved):
    """Our decoder's logits at every step against transformers' model run step by step on its own
    cache (the sliding layers' window over the cache), in float64, a left-padded batch."""
    model, params, config = saved

    def draw(g):
        ids = torch.randint(1, config.vocab_size, (2, 5), generator=g)
        mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
        steps = torch.randint(1, config.vocab_size, (2, 4), generator=g)
        return torch.cat([ids.masked_fill(mask == 0, 0), steps], 1), torch.cat([mask, torch.ones(2, 4, dtype=mask.dtype)], 1)

    with gpt_oss_in_float64():
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

        def draw(g):
            ids = torch.randint(1, config.vocab_size, (2, 8), generator=g)
            return ids, torch.ones_like(ids)

        ids, mask = _draw(model, draw)
        with torch.no_grad():
            theirs = model(ids).logits
    logits, _ = ar.lm_forward(ids.numpy(), params, config)
    _close(logits, theirs, "logits")


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
