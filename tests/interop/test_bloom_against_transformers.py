"""BLOOM whole (attention_ref/models/families/bloom.py) against transformers' ``BloomForCausalLM``
(4.57.1 and 5.x): built from small configs with random weights in float64, written by
``save_pretrained`` and read by our ``load_pretrained``; logits, the loss and the gradient of
every parameter at 1e-10 relative; ``to_transformers``'s names are the model's; ``generate``
token for token against ``model.generate(do_sample=False)`` on a left-padded batch; each decoding
step's logits against transformers' model run on its own ``past_key_values``. Head counts 4 (a
power of two) and 6 (ALiBi's rule for the others).

transformers' float32 steps inside the float64 model (:mod:`attention_ref.interop.float64`): the
ALiBi slopes and the attention's softmax, run in float64 by ``bloom_in_float64()`` (its own code,
``torch.float32`` read as float64); the ``labels=`` loss (``logits.float()``) is checked at 1e-6
and the same loss on the float64 logits at 1e-10; ``generate`` casts its logits to float32 before
the argmax: the tokens are compared, the logits through the step-by-step loop.
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import attention_ref as ar  # noqa: E402
from attention_ref.interop import load_pretrained, to_transformers  # noqa: E402
from attention_ref.interop.float64 import bloom_in_float64  # noqa: E402
from _transformers_api import returned_cache, with_cache  # noqa: E402

RTOL = 1e-10


def _close(ours, theirs, what):
    theirs = theirs.detach().numpy() if hasattr(theirs, "detach") else np.asarray(theirs)
    scale = max(float(np.abs(theirs).max()), 1e-300)
    err = float(np.abs(np.asarray(ours) - theirs).max())
    assert err <= RTOL * scale, f"{what}: max abs error {err:.2e} against max |value| {scale:.2e}"


def _bloom(heads=4, tie=True, **more):
    config = transformers.BloomConfig(vocab_size=41, hidden_size=4 * heads, n_layer=2, n_head=heads,
                                      layer_norm_epsilon=1e-5, pad_token_id=0, bos_token_id=None, eos_token_id=None,
                                      tie_word_embeddings=tie, **more)
    model = transformers.BloomForCausalLM(config).double().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():  # the attention not uniform; norms and biases away from 1 and 0
            p.mul_(10.0) if "norm" not in name and "ln" not in name and p.ndim == 2 else p.add_(0.2 * torch.randn_like(p))
    return model


MODELS = {"bloom": lambda: _bloom(4), "bloom-6-heads-untied": lambda: _bloom(6, tie=False)}


@pytest.fixture(params=list(MODELS))
def saved(request, tmp_path):
    torch.manual_seed(0)
    model = MODELS[request.param]()
    model.save_pretrained(tmp_path)
    params, config = load_pretrained(tmp_path)
    assert config.family == "bloom"
    with bloom_in_float64():
        yield model, params, config


def test_logits_loss_and_every_gradient(saved):
    model, params, config = saved
    torch.manual_seed(1)
    V = config.vocab_size
    ids = torch.randint(1, V, (2, 9))
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
    assert abs(loss - out.loss.item()) <= 1e-6 * abs(loss)  # labels=: computed in float32 by transformers
    theirs = to_transformers(grads, config)
    named = dict(model.named_parameters(remove_duplicate=False))
    assert sorted(theirs) == sorted(named) == sorted(model.state_dict())  # a tied head included
    for name, p in named.items():
        _close(theirs[name], p.grad, f"d {name}")


def test_left_padded_logits_follow_the_mask_counted_positions(saved):
    """transformers counts ALiBi's positions over the mask; ours are the slots: the same softmax."""
    model, params, config = saved
    torch.manual_seed(4)
    ids = torch.randint(1, config.vocab_size, (2, 7))
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]])
    with torch.no_grad():
        theirs = model(ids, attention_mask=mask).logits
    ours, _ = ar.lm_forward(ids.numpy(), params, config, attention_mask=mask.numpy())
    real = mask.numpy().astype(bool)
    _close(ours[real], theirs[mask.bool()], "left-padded logits at the real positions")


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


def test_each_decoding_step_against_past_key_values(saved):
    model, params, config = saved
    torch.manual_seed(3)
    ids = torch.randint(1, config.vocab_size, (2, 5))
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    ids = ids.masked_fill(mask == 0, 0)
    steps = torch.randint(1, config.vocab_size, (2, 4))
    decoder = ar.LMDecoder(params, config)
    ours = [decoder.prefill(ids.numpy(), mask.numpy())[:, -1]]
    ours += [decoder.step(steps[:, i].numpy()) for i in range(4)]
    with torch.no_grad():
        res = model(ids, attention_mask=mask, **with_cache(model, None))
        theirs, past = [res.logits[:, -1]], returned_cache(res)
        for i in range(4):
            mask = torch.cat([mask, torch.ones(2, 1, dtype=mask.dtype)], dim=1)
            res = model(steps[:, i:i + 1], attention_mask=mask, **with_cache(model, past))
            theirs.append(res.logits[:, -1])
            past = returned_cache(res)
    for i, (a, b) in enumerate(zip(ours, theirs)):
        _close(a, b, f"logits of step {i}")


def test_reader_defaults_are_bloom_configs():
    """A config.json without the optional fields reads as transformers' BloomConfig builds the model
    (old files spell the width n_embed)."""
    theirs = transformers.BloomConfig(vocab_size=40, n_embed=16, n_head=4, n_layer=2)
    ours = ar.LMConfig.from_dict({"model_type": "bloom", "vocab_size": 40, "n_embed": 16, "n_head": 4, "n_layer": 2})
    assert (ours.d_model, ours.eps, ours.tie_word_embeddings) == (theirs.hidden_size, theirs.layer_norm_epsilon,
                                                                  theirs.tie_word_embeddings) == (16, 1e-5, True)
    assert ar.LMConfig.from_dict(theirs.to_dict()).d_ff == 4 * 16


@pytest.mark.parametrize("fields, name", [({"apply_residual_connection_post_layernorm": True},
                                            "apply_residual_connection_post_layernorm"),
                                           ({"pretraining_tp": 2, "slow_but_exact": True}, "slow_but_exact")])
def test_refused_by_name(tmp_path, fields, name):
    """A residual taken after the norm, and Megatron's slow path, are not computed here: refused by name."""
    model = transformers.BloomForCausalLM(transformers.BloomConfig(vocab_size=41, hidden_size=16, n_layer=1,
                                                                   n_head=4, **fields))
    model.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=name):
        load_pretrained(tmp_path)


def test_pretraining_tp_alone_is_the_fast_path(tmp_path):
    torch.manual_seed(6)
    model = _bloom(4, pretraining_tp=2)
    model.save_pretrained(tmp_path)
    params, config = load_pretrained(tmp_path)
    ids = torch.randint(1, 41, (2, 6))
    with torch.no_grad(), bloom_in_float64():
        theirs = model(ids).logits
    _close(ar.lm_forward(ids.numpy(), params, config)[0], theirs, "logits with pretraining_tp = 2")


def test_the_slow_path_computes_other_numbers():
    """Why it is refused: transformers' slow_but_exact path leaves the dense layers' biases out."""
    torch.manual_seed(5)
    fast = _bloom(4, pretraining_tp=2)
    slow = _bloom(4, pretraining_tp=2, slow_but_exact=True)
    slow.load_state_dict(fast.state_dict())
    ids = torch.randint(1, 41, (1, 5))
    with torch.no_grad(), bloom_in_float64():
        a, b = fast(ids).logits, slow(ids).logits
        for module in fast.modules():  # the biases the slow path leaves out, set to zero in the fast model
            if type(module).__name__ == "BloomAttention":
                module.dense.bias.zero_()
            if type(module).__name__ == "BloomMLP":
                module.dense_4h_to_h.bias.zero_()
        c = fast(ids).logits
    assert not torch.allclose(a, b)
    _close(b.numpy(), c, "the slow path = the fast path without the dense biases")
