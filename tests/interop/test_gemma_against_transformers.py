"""Gemma 2 and Gemma 3 (text) whole against transformers' Gemma2ForCausalLM and Gemma3ForCausalLM: tiny configs with random weights
in float64 (every (1 + w) norm's w random, so no gain is the identity), written by
``save_pretrained`` and read by ``load_pretrained``; logits, the loss and every parameter's
gradient at 1e-10 relative; ``generate`` token for token on a left-padded batch; each decoding
step's logits against transformers' own cache; the ``to_transformers`` round trip.

transformers' float32 steps inside the float64 model are run with the same formulas in float64
by ``attention_ref.interop.gemma3_in_float64()`` (RMSNorm, RoPE of both kinds of layer, and the
embedding scale, a float32-rounded buffer); the attention is ``sdpa`` (softmax in the model's
dtype). Gemma 2 runs eager attention (sdpa has no soft cap), its float32 softmax, RMSNorm, RoPE and
embedding scale replaced by the same formulas in float64 by ``gemma2_in_float64()``; its caps are
shrunk (scores 0.5, logits 1.0) so that tanh bends what it caps. The loss is compared as in the Llama tests (our float64 cross-entropy at 1e-10, the
``labels=`` loss at 1e-6). Runs on transformers 4.57 (``rope_local_base_freq``, ``rope_scaling``)
and 5.x (``rope_parameters`` per layer type).
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "Gemma3ForCausalLM"):
    pytest.skip("this transformers has no Gemma3ForCausalLM", allow_module_level=True)

import attention_ref as ar  # noqa: E402
from attention_ref.interop import gemma2_in_float64, gemma3_in_float64, load_pretrained, to_transformers  # noqa: E402
from _transformers_api import decode_side_by_side  # noqa: E402

RTOL = 1e-10
FIVE = int(transformers.__version__.split(".")[0]) >= 5


def _close(ours, theirs, what):
    theirs = theirs.detach().numpy() if hasattr(theirs, "detach") else np.asarray(theirs)
    scale = max(float(np.abs(theirs).max()), 1e-300)
    err = float(np.abs(np.asarray(ours) - theirs).max())
    assert err <= RTOL * scale, f"{what}: max abs error {err:.2e} against max |value| {scale:.2e}"


def _rope(linear):
    """The RoPE settings in this transformers' spelling: local base 20, global base 500 (linear
    scaling by 4 on the global layers when asked)."""
    full = {"rope_type": "linear", "factor": 4.0} if linear else {"rope_type": "default"}
    if FIVE:
        return {"rope_parameters": {"full_attention": {**full, "rope_theta": 500.0},
                                    "sliding_attention": {"rope_type": "default", "rope_theta": 20.0}}}
    return {"rope_theta": 500.0, "rope_local_base_freq": 20.0, "rope_scaling": full if linear else None}


def _gemma3(tie=True, linear=False, head_dim=6, kv_heads=2):
    config = transformers.Gemma3TextConfig(
        vocab_size=41, hidden_size=16, intermediate_size=24, num_attention_heads=4, num_key_value_heads=kv_heads,
        head_dim=head_dim, num_hidden_layers=3, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        sliding_window=3, query_pre_attn_scalar=5, rms_norm_eps=1e-6, max_position_embeddings=64, pad_token_id=0,
        bos_token_id=None, eos_token_id=None, tie_word_embeddings=tie, attn_implementation="sdpa", **_rope(linear))
    model = transformers.Gemma3ForCausalLM(config).double().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():  # the norms' w (0 at init) random too
            p.mul_(10.0) if "norm" not in name and p.ndim == 2 else p.add_(0.3 * torch.randn_like(p))
    return model


def _gemma2(tie=True, caps=(0.5, 1.0), kv_heads=2):
    rope = {"rope_parameters": {"rope_type": "default", "rope_theta": 500.0}} if FIVE else {"rope_theta": 500.0}
    config = transformers.Gemma2Config(
        vocab_size=41, hidden_size=16, intermediate_size=24, num_attention_heads=4, num_key_value_heads=kv_heads,
        head_dim=6, num_hidden_layers=3, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        sliding_window=3, query_pre_attn_scalar=5, rms_norm_eps=1e-6, max_position_embeddings=64, pad_token_id=0,
        bos_token_id=None, eos_token_id=None, tie_word_embeddings=tie, attn_implementation="eager",
        attn_logit_softcapping=caps[0], final_logit_softcapping=caps[1], **rope)
    model = transformers.Gemma2ForCausalLM(config).double().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.mul_(10.0) if "norm" not in name and p.ndim == 2 else p.add_(0.3 * torch.randn_like(p))
    return model


MODELS = {"gemma3": lambda: _gemma3(), "gemma3-untied-linear-rope": lambda: _gemma3(False, True),
          "gemma3-mqa-narrow-heads": lambda: _gemma3(head_dim=2, kv_heads=1),
          "gemma2": lambda: _gemma2(), "gemma2-untied-mqa": lambda: _gemma2(False, kv_heads=1),
          "gemma2-no-caps": lambda: _gemma2(caps=(None, None))}


@pytest.fixture(params=list(MODELS))
def saved(request, tmp_path):
    """A model, saved by save_pretrained and loaded by load_pretrained, run inside its float64 patches."""
    torch.manual_seed(0)
    model = MODELS[request.param]()
    model.save_pretrained(tmp_path)
    params, config = load_pretrained(tmp_path)
    with (gemma2_in_float64() if config.family == "gemma2" else gemma3_in_float64()):
        yield model, params, config


def test_the_config_is_read_whole(saved):
    model, _, config = saved
    assert config.sliding_window == 3 and config.query_pre_attn_scalar == 5
    assert config.layer_types == ("sliding_attention", "full_attention", "sliding_attention")
    if config.family == "gemma2":
        assert config.rope_theta == config.rope_local_theta == 500.0
        assert (config.attn_softcap, config.final_softcap) == (model.config.attn_logit_softcapping,
                                                               model.config.final_logit_softcapping)
    else:
        assert config.family == "gemma3_text" and (config.rope_theta, config.rope_local_theta) == (500.0, 20.0)


def test_logits_loss_and_every_gradient(saved):
    model, params, config = saved
    torch.manual_seed(1)
    V = config.vocab_size
    ids = torch.randint(1, V, (2, 9))
    ids[0, 4] = 0  # the pad token inside a sequence: its row is read, and gets no gradient
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0  # right padding in the second row
    labels = ids.masked_fill(mask == 0, -100)
    out = model(ids, attention_mask=mask, labels=labels)
    loss_64 = torch.nn.functional.cross_entropy(out.logits[:, :-1].reshape(-1, V), labels[:, 1:].reshape(-1))
    loss_64.backward()

    loss, grads, logits = ar.lm_loss(ids.numpy(), params, config, attention_mask=mask.numpy())
    real = mask.numpy().astype(bool)
    _close(logits[real], out.logits[mask.bool()], "logits")
    assert abs(loss - loss_64.item()) <= RTOL * abs(loss_64.item()), (loss, loss_64.item())
    assert abs(loss - out.loss.item()) <= 1e-6 * abs(loss)
    theirs = to_transformers(grads, config)
    named = dict(model.named_parameters(remove_duplicate=False))  # = state_dict()'s names
    assert sorted(theirs) == sorted(named) == sorted(model.state_dict())  # a tied head included
    for name, p in named.items():
        _close(theirs[name], p.grad, f"d {name}")


def test_round_trip_through_to_transformers(saved):
    model, params, config = saved
    state = to_transformers(params, config)
    named = dict(model.named_parameters(remove_duplicate=False))  # = state_dict()'s names
    assert sorted(state) == sorted(named) == sorted(model.state_dict())  # a tied head included
    for name, p in named.items():
        np.testing.assert_array_equal(state[name], p.detach().numpy(), err_msg=name)


def test_generate_left_padded_batch_token_for_token(saved):
    model, params, config = saved
    torch.manual_seed(2)
    ids = torch.randint(1, config.vocab_size, (3, 6))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    mask[2, :4] = 0
    ids = ids.masked_fill(mask == 0, 0)
    theirs = model.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0)
    ours = ar.generate(ids.numpy(), params, config, 8, attention_mask=mask.numpy())
    np.testing.assert_array_equal(ours, theirs.numpy())


def test_each_decoding_step_against_their_cache(saved):
    """Our decoder's logits at every step against transformers' model run step by step on its
    own cache (sliding layers included: 4 steps after 5 prompt tokens pass the window of 3)."""
    model, params, config = saved
    torch.manual_seed(3)
    ids = torch.randint(1, config.vocab_size, (2, 5))
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    ids = ids.masked_fill(mask == 0, 0)
    steps = torch.randint(1, config.vocab_size, (2, 4))
    ours, theirs = decode_side_by_side(model, ar.LMDecoder(params, config), ids, mask, steps)
    for i, (a, b) in enumerate(zip(ours, theirs)):
        _close(a, b, f"logits of step {i}")


@pytest.mark.parametrize("setting, value", [("attn_logit_softcapping", 50.0), ("final_logit_softcapping", 30.0),
                                            ("attention_bias", True), ("use_bidirectional_attention", True),
                                            ("hidden_activation", "gelu")])
def test_what_is_not_implemented_is_refused_by_name(tmp_path, setting, value):
    model = _gemma3()
    model.config.__dict__[setting] = value
    model.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=f"{setting} = .* is not supported"):
        load_pretrained(tmp_path)
