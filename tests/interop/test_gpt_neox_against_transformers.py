"""GPT-NeoX (Pythia) whole against transformers: tiny ``GPTNeoXForCausalLM`` models with random
weights in float64 (parallel and sequential residual, rotary_pct 0.25, 0.5 and 1, tied and untied
head), written by ``save_pretrained`` and read by ``load_pretrained``; logits, the loss and every
parameter's gradient at 1e-10, ``generate`` token for token on a left-padded batch, each decoding
step against transformers' own cache, and the ``to_transformers`` round trip.

transformers' float32 step inside a float64 GPT-NeoX is its rotary embedding (``inv_freq`` and the
angles in float32): ``attention_ref.interop.llama_in_float64()`` computes it with the same formula
in float64. Its eager softmax is float32 too: the ``sdpa`` attention is used. The ``labels=`` loss
is float32 (``logits.float()``): the float64 loss is computed by the test from the logits.

transformers 5.x names the head ``lm_head.weight`` in ``state_dict()`` and ``named_parameters()``
(4.x: ``embed_out.weight``); ``to_transformers`` gives the installed release's name, so the state
dict it returns loads with ``strict=True`` and a file written from it loads in ``from_pretrained``.
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import attention_ref as ar  # noqa: E402
from attention_ref.interop import (from_transformers_state, load_pretrained, to_transformers,  # noqa: E402
                                  write_safetensors)
from _transformers_api import decode_side_by_side  # noqa: E402

RTOL = 1e-10


def _close(ours, theirs, what):
    theirs = theirs.detach().numpy() if hasattr(theirs, "detach") else np.asarray(theirs)
    scale = max(float(np.abs(theirs).max()), 1e-300)
    err = float(np.abs(np.asarray(ours) - theirs).max())
    assert err <= RTOL * scale, f"{what}: max abs error {err:.2e} against max |value| {scale:.2e}"


def _neox(rotary_pct=0.25, parallel=True, tie=False):
    config = transformers.GPTNeoXConfig(vocab_size=41, hidden_size=24, num_attention_heads=3, intermediate_size=20,
                                        num_hidden_layers=2, rotary_pct=rotary_pct, rotary_emb_base=100.0,
                                        max_position_embeddings=64, use_parallel_residual=parallel,
                                        layer_norm_eps=1e-5, hidden_act="gelu", tie_word_embeddings=tie,
                                        bos_token_id=None, eos_token_id=None, pad_token_id=0,
                                        attn_implementation="sdpa")
    model = transformers.GPTNeoXForCausalLM(config).double().eval()
    with torch.no_grad():
        for p in model.parameters():  # the attention not uniform; biases and norms away from 0 and 1
            p.mul_(10.0) if p.ndim == 2 else p.add_(0.1 * torch.randn_like(p))
    return model


MODELS = {"pythia": lambda: _neox(0.25), "sequential-half-rotary": lambda: _neox(0.5, parallel=False),
          "full-rotary-tied": lambda: _neox(1.0, tie=True)}


def _named(model):
    """Every parameter under each of its names (a tied head under the head's name too), as state_dict()."""
    named = dict(model.named_parameters(remove_duplicate=False))
    assert sorted(named) == sorted(model.state_dict())
    return named


@pytest.fixture(params=list(MODELS))
def saved(request, tmp_path):
    from attention_ref.interop import llama_in_float64

    with llama_in_float64():
        torch.manual_seed(0)
        model = MODELS[request.param]()
        model.save_pretrained(tmp_path)
        params, config = load_pretrained(tmp_path)
        yield model, params, config


def test_config_read_from_the_folder(saved):
    model, _, config = saved
    assert config.family == "gpt_neox" and config.rope_theta == 100.0
    assert config.rotary_dim == int(8 * config.rotary_pct) and config.use_parallel_residual == model.config.use_parallel_residual
    assert config.tie_word_embeddings == bool(model.config.tie_word_embeddings)


def test_logits_loss_and_every_gradient(saved):
    model, params, config = saved
    torch.manual_seed(1)
    V = config.vocab_size
    ids = torch.randint(0, V, (2, 9))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0  # right padding in the second row
    labels = ids.masked_fill(mask == 0, -100)
    out = model(ids, attention_mask=mask, labels=labels)
    loss_64 = torch.nn.functional.cross_entropy(out.logits[:, :-1].reshape(-1, V), labels[:, 1:].reshape(-1))
    loss_64.backward()

    loss, grads, logits = ar.lm_loss(ids.numpy(), params, config, attention_mask=mask.numpy())
    _close(logits[mask.numpy().astype(bool)], out.logits[mask.bool()], "logits")
    assert abs(loss - loss_64.item()) <= RTOL * abs(loss_64.item()), (loss, loss_64.item())
    assert abs(loss - out.loss.item()) <= 1e-6 * abs(loss)  # labels=: computed in float32 by transformers
    theirs = to_transformers(grads, config)
    named = _named(model)
    assert sorted(theirs) == sorted(named)  # every name of state_dict(), a tied head included
    for name, p in named.items():
        _close(theirs[name], p.grad, f"d {name}")


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
    """Our decoder's logits at every step against transformers' model run step by step on its
    own cache, in float64, with the positions and masks of a left-padded batch."""
    model, params, config = saved
    torch.manual_seed(3)
    ids = torch.randint(1, config.vocab_size, (2, 5))
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    ids = ids.masked_fill(mask == 0, 0)
    steps = torch.randint(1, config.vocab_size, (2, 4))
    ours, theirs = decode_side_by_side(model, ar.LMDecoder(params, config), ids, mask, steps)
    for i, (a, b) in enumerate(zip(ours, theirs)):
        _close(a, b, f"logits of step {i}")


def test_to_transformers_round_trip(saved, tmp_path):
    """Changed params written by to_transformers into a folder with the config load in transformers'
    from_pretrained with our logits, and come back equal through load_pretrained and
    from_transformers_state (the state dict of 5.x names the head lm_head.weight)."""
    import shutil

    model, params, config = saved
    rng = np.random.default_rng(4)
    changed = {k: v + 0.01 * rng.standard_normal(v.shape) for k, v in params.items()}
    folder = tmp_path / "written"
    folder.mkdir()
    shutil.copy(tmp_path / "config.json", folder / "config.json")
    write_safetensors(to_transformers(changed, config), folder / "model.safetensors")
    reloaded = type(model).from_pretrained(folder, torch_dtype=torch.float64, attn_implementation="sdpa").eval()
    ids = torch.randint(0, config.vocab_size, (2, 7))
    with torch.no_grad():
        theirs = reloaded(ids).logits
    _close(ar.lm_forward(ids.numpy(), changed, config)[0], theirs, "logits after the round trip")
    back, _ = load_pretrained(folder)
    state = from_transformers_state({k: v.detach().numpy() for k, v in reloaded.state_dict().items()}, config)
    for name in params:
        np.testing.assert_array_equal(back[name], changed[name])
        np.testing.assert_array_equal(state[name], changed[name])
    assert sorted(back) == sorted(state) == sorted(params)
