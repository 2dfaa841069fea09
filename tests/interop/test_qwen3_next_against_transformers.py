"""Qwen3-Next whole (the family file attention_ref/models/families/qwen3_next.py) against transformers'
``Qwen3NextForCausalLM``: built from a small config with random weights in float64, written by ``save_pretrained``
and read by our ``load_pretrained``; logits, the loss and the gradient of every parameter at 1e-10 relative (a
left-padded batch among them); ``to_transformers`` of the weights under the installed release's state-dict names
(4.57: one module per expert; 5.x: the experts fused); ``generate`` token for token on a left-padded batch; each
decoding step's logits against transformers' own cache (the linear layers' recurrent state and convolution window,
the full layer's keys and values); the config fields that change the numbers and are not computed, refused by name.

The small model has what the real one has: a Gated DeltaNet layer and a gated-attention layer (``layer_types``),
two key heads shared by four value heads, a convolution of width 3 (shorter than the prompts), RoPE on half of each
head, 4 experts of which each token takes 2 (renormalised) and a gated shared expert, on every layer or (one test)
with a dense MLP on the second. Its routing is checked for near ties: the gap between each real token's k-th and
(k+1)-th router logit, in every layer, must be at least ``GAP`` (1e-6) of the logits' scale (else the inputs are
drawn again), so that no rounding at 1e-15 can choose another expert here than there. The checks the
mixture-of-experts families share are written once in tests/interop/_moe_checks.py; this file gives them
Qwen3-Next's difference (``CHECKS``: its float64 patch, its router ``mlp.gate``).

transformers' float32 steps inside a float64 model run as the same formulas in float64
(:func:`attention_ref.interop.qwen3_next_in_float64`): the gated delta rule's and the gated RMSNorm's
``.to(torch.float32)``, the decay's ``A_log.float()`` and ``a.float()``, the (1 + w) RMSNorms' ``.float()``, the
router's ``softmax(dtype=torch.float)``, eager attention's softmax and the partial RoPE's ``inv_freq`` and angles.
5.x's default experts kernel (``grouped_mm``) refuses float64: its loop over the experts (4.57 has only that).
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import attention_ref as ar  # noqa: E402
from attention_ref.interop import load_pretrained, qwen3_next_in_float64, to_transformers  # noqa: E402
from attention_ref.models.families import FAMILY  # noqa: E402
from attention_ref.nn.cross_entropy import cross_entropy_backward, cross_entropy_forward  # noqa: E402
from _moe_checks import RTOL, MoEChecks, close, weights_written_back  # noqa: E402

FIVE = int(transformers.__version__.split(".")[0]) >= 5
EXAMPLE = FAMILY["qwen3_next"].example
ROPE = ({"rope_parameters": {"rope_type": "default", "rope_theta": EXAMPLE["rope_theta"],
                             "partial_rotary_factor": EXAMPLE["partial_rotary_factor"]}} if FIVE
        else {"rope_theta": EXAMPLE["rope_theta"], "partial_rotary_factor": EXAMPLE["partial_rotary_factor"]})
SMALL = dict({k: v for k, v in EXAMPLE.items() if k not in ("rope_theta", "partial_rotary_factor")}, **ROPE,
             pad_token_id=0, bos_token_id=None, eos_token_id=None, attn_implementation="eager",
             **({"experts_implementation": "eager"} if FIVE else {}))


def _model(**fields):
    config = transformers.Qwen3NextConfig(**{**SMALL, **fields})
    model = transformers.Qwen3NextForCausalLM(config).double().eval()
    with torch.no_grad():  # away from the initialisation: every norm, decay and gate matters
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith(("dt_bias", "A_log")):
                p.add_(0.3 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.5)
    return model


#: Qwen3-Next's difference in the shared checks: its float64 patch and its router, ``mlp.gate`` on the expert layers
CHECKS = MoEChecks(qwen3_next_in_float64)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    yield from CHECKS.saved(_model, tmp_path_factory.mktemp("qwen3_next"))


def test_the_small_model_has_what_the_real_one_has(saved):
    _, params, config = saved
    assert config.setting("linear_layers") == (True, False) and config.setting("moe_layers") == (True, True)
    assert config.setting("linear_value_heads") == 2 * config.setting("linear_key_heads")
    assert config.rotary_dim == config.d_head // 2 and (config.num_experts, config.experts_per_token) == (4, 2)
    assert params["layers.0.linear_attn.conv1d.weight"].shape[-1] == 3
    assert "layers.0.self_attn.W_q" not in params and "layers.1.linear_attn.A_log" not in params


@pytest.mark.parametrize("padded", [False, True], ids=["full", "left-padded"])
def test_logits_loss_and_every_gradient(saved, padded):
    """A plain batch, and a left-padded one (the linear layers zero the padded positions' inputs, as transformers):
    the real positions' logits, the loss of the real positions' next tokens and every gradient. (A padded query sees
    no key: its logits follow no convention, so the loss here leaves the padded positions out on both sides, where
    ``lm_loss``, as ``labels=``, would count the last padded position's prediction of the first real token.)"""
    model, params, config = saved
    V = config.vocab_size

    def draw(g):
        ids = torch.randint(1, V, (2, 9), generator=g)
        mask = torch.ones_like(ids)
        if padded:
            mask[1, :3] = 0
            ids = ids.masked_fill(mask == 0, 0)
        return ids, mask

    model.zero_grad()
    with qwen3_next_in_float64():
        ids, mask = CHECKS.draw(model, draw)
        targets = torch.cat([ids[:, 1:], torch.zeros_like(ids[:, :1])], 1)  # the next token, at each position
        targets = targets.masked_fill((mask == 0) | (torch.cat([mask[:, 1:], torch.zeros_like(mask[:, :1])], 1) == 0),
                                      -100)  # real positions predicting a real token only
        out = model(ids, attention_mask=mask)
        loss_64 = torch.nn.functional.cross_entropy(out.logits.reshape(-1, V), targets.reshape(-1))
        loss_64.backward()
    logits, cache = ar.lm_forward(ids.numpy(), params, config, attention_mask=mask.numpy())
    loss, loss_cache = cross_entropy_forward(logits, targets.numpy())
    grads = ar.lm_backward(cross_entropy_backward(1.0, loss_cache), cache)
    real = mask.numpy().astype(bool)
    close(logits[real], out.logits[mask.bool()], "logits")
    if not padded:  # lm_loss is the same loss (transformers' labels= computes it in float32: 1e-6)
        assert ar.lm_loss(ids.numpy(), params, config)[0] == pytest.approx(float(loss), rel=1e-12)
    assert abs(loss - loss_64.item()) <= RTOL * abs(loss_64.item()), (loss, loss_64.item())
    theirs = to_transformers(grads, config)
    named = dict(model.named_parameters(remove_duplicate=False))
    assert sorted(theirs) == sorted(named) == sorted(model.state_dict())
    for name, p in named.items():
        if p.grad is None:  # 4.57: an expert no token chose has no gradient; ours is zero there
            assert not FIVE and ".experts." in name and not np.any(theirs[name]), name
            continue
        close(theirs[name], p.grad, f"d {name}")


def test_to_transformers_gives_their_weights(saved):
    weights_written_back(*saved)


def test_generate_left_padded_batch_token_for_token(saved):
    CHECKS.generate_left_padded(*saved)


def test_each_decoding_step_against_the_cache(saved):
    """Our decoder's logits at every step against transformers' model run step by step on its own cache (the
    linear layer's ``conv_states`` and ``recurrent_states``, the full layer's keys and values), a left-padded
    batch."""
    decoder = CHECKS.decoding_steps(*saved)
    assert [c.length for c in decoder.caches] == [9, 9]


def test_default_layer_types_and_a_dense_layer(tmp_path):
    """transformers' default layer types (every 4th layer full: 3 linear, 1 full) with a dense MLP on layer 2
    (``mlp_only_layers``) and experts on every second layer otherwise (``decoder_sparse_step`` 2)."""
    fields = {k: v for k, v in SMALL.items() if k != "layer_types"}
    with qwen3_next_in_float64():
        torch.manual_seed(4)
        model = _model(**{**fields, "layer_types": None, "num_hidden_layers": 4, "mlp_only_layers": [3],
                          "decoder_sparse_step": 2})
        model.save_pretrained(tmp_path)
        params, config = load_pretrained(tmp_path)
        assert config.setting("linear_layers") == (True, True, True, False)
        assert config.setting("moe_layers") == (False, True, False, False)
        CHECKS.full_batch_logits(model, params, config)


def test_one_padded_row_is_refused_by_name(saved):
    """transformers 4.57 zeroes the padded positions' inputs of the linear layers only in a batch of several rows,
    5.x in any batch: a single padded row is refused rather than guessed."""
    _, params, config = saved
    ids = np.array([[0, 0, 5, 6, 7]])
    with pytest.raises(ValueError, match="attention_mask pads a batch of one row"):
        ar.lm_forward(ids, params, config, attention_mask=np.array([[0, 0, 1, 1, 1]]))
    ar.lm_forward(ids, params, config, attention_mask=np.ones((1, 5), int))  # no padding: computed


@pytest.mark.parametrize("field, value, match", [
    ("attention_bias", True, "attention_bias = True is not supported"),
    ("hidden_act", "gelu", "hidden_act = 'gelu' is not supported"),
    ("layer_types", ["linear_attention", "sliding_attention"], "layer_types must list"),
    ("rope_scaling", {"rope_type": "yarn", "factor": 2.0}, "rope_type = 'yarn' is not supported"),
    ("shared_expert_bias", 1, "config.json key 'shared_expert_bias'"),
    ("head_dim", None, "head_dim is null"),  # transformers reads None (no hidden / heads): it cannot build the model
    ("partial_rotary_factor", None, "partial_rotary_factor is null"),  # not the default 0.25: 4.57's RoPE fails
])
def test_fields_that_change_the_numbers_are_refused_by_name(field, value, match):
    d = dict(EXAMPLE, model_type="qwen3_next")
    d[field] = value
    with pytest.raises(ValueError, match=match):
        ar.LMConfig.from_dict(d)
