"""Whole GPT-2 and Llama language models against transformers: built from small configs with
random weights in float64, written by ``save_pretrained`` and read by our ``load_pretrained``
(no torch in the reading); logits, the loss and the gradient of every parameter (all of
``named_parameters()``, none skipped) at 1e-10 relative; ``generate`` token for token against
``model.generate(do_sample=False)`` on a left-padded batch; each decoding step's logits
against a float64 loop over transformers' own ``past_key_values``.

Where transformers works in float32 inside a float64 model, the test runs the same formula in
float64 instead, so that 1e-10 compares formulas, not float32 rounding:

* Llama's RMSNorm (``hidden_states.to(torch.float32)``) and RoPE angles (``inv_freq.float()``):
  both replaced by the same formulas in float64 with ``attention_ref.interop.llama_in_float64()``;
* the eager softmax of Llama (``softmax(..., dtype=torch.float32)``): the ``sdpa`` attention is
  used instead, whose softmax runs in the model's dtype;
* the ``labels=`` loss (``ForCausalLMLoss`` calls ``logits.float()``): the test computes the same
  shifted ``cross_entropy`` on the float64 logits, and checks the ``labels=`` loss at 1e-6 only;
* ``generate``'s logits (cast to float32 before the argmax): the tokens are compared as they are,
  the logits through the float64 loop over ``past_key_values``.

Runs on transformers 4.x (``rope_theta``) and 5.x (``rope_parameters["rope_theta"]``).
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import attention_ref as ar  # noqa: E402
from attention_ref.interop import load_pretrained, to_transformers  # noqa: E402
from _transformers_api import decode_side_by_side  # noqa: E402

RTOL = 1e-10


def _close(ours, theirs, what):
    theirs = theirs.detach().numpy() if hasattr(theirs, "detach") else np.asarray(theirs)
    scale = max(float(np.abs(theirs).max()), 1e-300)
    err = float(np.abs(np.asarray(ours) - theirs).max())
    assert err <= RTOL * scale, f"{what}: max abs error {err:.2e} against max |value| {scale:.2e}"


@pytest.fixture
def llama_in_float64():
    """transformers' RMSNorm and RoPE angles with the same formulas in float64."""
    from attention_ref.interop import llama_in_float64

    with llama_in_float64():
        yield


def _gpt2(tie=True):
    config = transformers.GPT2Config(vocab_size=37, n_embd=16, n_head=4, n_layer=2, n_positions=32, resid_pdrop=0.0,
                                     embd_pdrop=0.0, attn_pdrop=0.0, attn_implementation="eager",
                                     tie_word_embeddings=tie, eos_token_id=None, bos_token_id=None)
    model = transformers.GPT2LMHeadModel(config).double().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "ln" in name:
                p.add_(0.1 * torch.randn_like(p))  # no special values
    return model


#: Llama 3.x's RoPE scalings, shrunk to the tiny model: at head width 4 and base 500 the wavelengths are
#: 6.3 (fast: below 256 / 4, kept) and 140 (between 256 / 4 and 256 / 1: interpolated)
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 256}
LINEAR = {"rope_type": "linear", "factor": 4.0}


def _llama(tie=False, rope_scaling=None, head_dim=None):
    extra = {} if rope_scaling is None else {"rope_scaling": dict(rope_scaling)}
    config = transformers.LlamaConfig(vocab_size=41, hidden_size=16, intermediate_size=24, num_attention_heads=4,
                                      num_key_value_heads=2, num_hidden_layers=2, rms_norm_eps=1e-6, rope_theta=500.0,
                                      max_position_embeddings=64, pad_token_id=0, bos_token_id=None, eos_token_id=None,
                                      tie_word_embeddings=tie, attn_implementation="sdpa", **extra)
    model = transformers.LlamaForCausalLM(config).double().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.mul_(10.0) if "norm" not in name else p.add_(0.1 * torch.randn_like(p))  # the attention not uniform
    return model


def _qwen(family, tie=False, head_dim=4, **more):
    extra = {"head_dim": head_dim} if family in ("Qwen3", "Mistral") else {}  # their configs' default is 128
    extra.update(more)
    if family == "Mistral":
        extra["sliding_window"] = 3  # shorter than the prompts and the generated text: the window matters
    config = getattr(transformers, f"{family}Config")(**extra, vocab_size=41, hidden_size=16, intermediate_size=24, num_attention_heads=4,
                                      num_key_value_heads=2, num_hidden_layers=2, rms_norm_eps=1e-6, rope_theta=500.0,
                                      max_position_embeddings=64, pad_token_id=0, bos_token_id=None, eos_token_id=None,
                                      tie_word_embeddings=tie, attn_implementation="sdpa")
    model = getattr(transformers, f"{family}ForCausalLM")(config).double().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():  # the biases (zero at init) and q/k norms random too
            p.mul_(10.0) if "norm" not in name and p.ndim == 2 else p.add_(0.1 * torch.randn_like(p))
    return model


MODELS = {"gpt2": lambda: _gpt2(True), "gpt2-untied": lambda: _gpt2(False),
          "llama": lambda: _llama(False), "llama-tied": lambda: _llama(True),
          "llama3-rope": lambda: _llama(False, LLAMA3), "llama-linear-rope": lambda: _llama(True, LINEAR),
          "qwen2": lambda: _qwen("Qwen2"), "qwen2-tied": lambda: _qwen("Qwen2", True),
          "qwen3": lambda: _qwen("Qwen3"), "qwen3-tied": lambda: _qwen("Qwen3", True),
          "mistral": lambda: _qwen("Mistral"),
          "qwen3-wide-heads": lambda: _qwen("Qwen3", head_dim=6),  # H Dh = 24 != D = 16, as Qwen3-0.6B
          # OLMo 2: norms after the sub-layers, q/k norms over the whole projection (the family file
          # attention_ref/models/families/olmo2.py); its RMSNorm and RoPE patched to float64 as Llama's
          "olmo2": lambda: _qwen("Olmo2"), "olmo2-tied": lambda: _qwen("Olmo2", True),
          # SmolLM3: no RoPE on every second layer here (no_rope_layer_interval = 2: layer 1 is NoPE), and
          # no_rope_layers given as a list (layer 0 NoPE); its RMSNorm and RoPE patched as Llama's
          "smollm3": lambda: _qwen("SmolLM3", no_rope_layer_interval=2),
          "smollm3-listed": lambda: _qwen("SmolLM3", True, no_rope_layers=[0, 1])}


@pytest.fixture(params=list(MODELS))
def saved(request, tmp_path, llama_in_float64):
    """A model, saved by save_pretrained and loaded by load_pretrained."""
    torch.manual_seed(0)
    model = MODELS[request.param]()
    model.save_pretrained(tmp_path)
    params, config = load_pretrained(tmp_path)
    return model, params, config


def test_logits_loss_and_every_gradient(saved):
    model, params, config = saved
    torch.manual_seed(1)
    V = config.vocab_size
    ids = torch.randint(1, V, (2, 9))
    ids[0, 4] = 0  # Llama's pad token inside a sequence: its row is read, and gets no gradient
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
    named = dict(model.named_parameters(remove_duplicate=False))  # = state_dict()'s names
    assert sorted(theirs) == sorted(named) == sorted(model.state_dict())  # a tied head included
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
    own cache, in float64 (the positions and masks of a left-padded batch, as generate)."""
    model, params, config = saved
    torch.manual_seed(3)
    ids = torch.randint(1, config.vocab_size, (2, 5))
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    ids = ids.masked_fill(mask == 0, 0)
    steps = torch.randint(1, config.vocab_size, (2, 4))
    ours, theirs = decode_side_by_side(model, ar.LMDecoder(params, config), ids, mask, steps)
    for i, (a, b) in enumerate(zip(ours, theirs)):
        _close(a, b, f"logits of step {i}")


def test_scaled_configs_are_read_with_their_scaling(tmp_path):
    """load_pretrained keeps a Llama 3.x config's scaling (4.x rope_scaling or 5.x rope_parameters)."""
    for scaling in (LLAMA3, LINEAR):
        _llama(False, scaling).save_pretrained(tmp_path)
        _, config = load_pretrained(tmp_path)
        assert dict(config.rope_scaling) == scaling


def test_llama_in_float64_refuses_an_unsupported_scaled_rope(llama_in_float64):
    """The helper computes the default, llama3 and linear RoPE only: a dynamic-scaled model raises
    rather than being changed silently (and load_pretrained refuses that type by name)."""
    config = transformers.LlamaConfig(vocab_size=41, hidden_size=16, intermediate_size=24, num_attention_heads=4,
                                      num_key_value_heads=2, num_hidden_layers=1, max_position_embeddings=64,
                                      rope_scaling={"rope_type": "dynamic", "factor": 2.0},
                                      attn_implementation="sdpa")
    model = transformers.LlamaForCausalLM(config).double().eval()
    with pytest.raises(ValueError, match="rope_type is 'dynamic'"):
        model(torch.arange(5)[None])
    with pytest.raises(ValueError, match="rope_type = 'dynamic' is not supported"):
        ar.LMConfig.from_transformers(config)
