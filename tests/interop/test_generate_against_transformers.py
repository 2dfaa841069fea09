"""``generate`` against transformers' ``model.generate`` on tiny random GPT-2 and Llama models
(float64 weights, written by ``save_pretrained``, read by ``load_pretrained``):

* greedy, token for token, on a left-padded batch with two eos ids (rows finish and continue
  with the pad token, generation stops when all have finished), ``min_new_tokens`` and
  ``repetition_penalty``;
* sampled, with ``num_return_sequences``, top-k, top-p, temperature, repetition penalty, eos ids:
  transformers' run is replayed in ours, its tokens taken as our draws (``generate(draw=...)``;
  the draws themselves, with ``interop.torch_draw``, are compared in
  ``test_sampling_against_transformers.py``): our processed logits at each step equal its ``scores``
  (the -inf pattern exactly, the values to float32 rounding, since transformers processes the
  logits in float32), each drawn token is one our processing allows, and our eos/pad/stop rule
  gives its sequences exactly.

transformers whose generate passes no ``prompt_ignore_length`` (4.57) counts the left padding in the repetition
penalty; there the penalty runs on prompts of one length (the padded case is skipped, saying so).
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import attention_ref as ar  # noqa: E402
from attention_ref.interop import llama_in_float64, load_pretrained  # noqa: E402
from _transformers_api import penalty_skips_padding  # noqa: E402


PAD = 0


def _gpt2():
    config = transformers.GPT2Config(vocab_size=37, n_embd=16, n_head=4, n_layer=2, n_positions=48, resid_pdrop=0.0,
                                     embd_pdrop=0.0, attn_pdrop=0.0, attn_implementation="eager",
                                     eos_token_id=None, bos_token_id=None)
    return transformers.GPT2LMHeadModel(config).double().eval()


def _llama():
    config = transformers.LlamaConfig(vocab_size=41, hidden_size=16, intermediate_size=24, num_attention_heads=4,
                                      num_key_value_heads=2, num_hidden_layers=2, rms_norm_eps=1e-6, rope_theta=500.0,
                                      max_position_embeddings=64, pad_token_id=PAD, bos_token_id=None,
                                      eos_token_id=None, tie_word_embeddings=False, attn_implementation="sdpa")
    model = transformers.LlamaForCausalLM(config).double().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.mul_(10.0) if "norm" not in name else p.add_(0.1 * torch.randn_like(p))  # the attention not uniform
    return model


@pytest.fixture(params=["gpt2", "llama"])
def saved(request, tmp_path):
    torch.manual_seed(0)
    model = {"gpt2": _gpt2, "llama": _llama}[request.param]()
    model.save_pretrained(tmp_path)
    params, config = load_pretrained(tmp_path)
    with llama_in_float64():
        yield model, params, config


def _prompts(V, padded, seed=3):
    rng = np.random.default_rng(seed)
    lengths = (6, 3, 5, 2) if padded else (5, 5, 5, 5)
    return ar.left_pad([rng.integers(1, V, n).tolist() for n in lengths], pad_token_id=PAD)


def _theirs(model, ids, mask, max_new_tokens, **settings):
    with torch.no_grad():
        return model.generate(torch.tensor(ids), attention_mask=torch.tensor(mask), max_new_tokens=max_new_tokens,
                              pad_token_id=PAD, **settings)


_penalty_skips_padding = penalty_skips_padding  # tests/_transformers_api.py


@pytest.mark.parametrize("padded", [True, False])
@pytest.mark.parametrize("settings", [{}, {"min_new_tokens": 3}, {"repetition_penalty": 1.4},
                                      {"repetition_penalty": 0.7, "min_new_tokens": 2}])
def test_greedy_with_eos_token_for_token(saved, padded, settings):
    model, params, config = saved
    if padded and "repetition_penalty" in settings and not _penalty_skips_padding():
        pytest.skip("this transformers' generate counts the left padding in the repetition penalty (it passes no"
                    " prompt_ignore_length); the unpadded case runs")
    ids, mask = _prompts(config.vocab_size, padded)
    plain = _theirs(model, ids, mask, 8, do_sample=False).numpy()[:, ids.shape[1]:]
    eos = sorted({int(plain[0, 1]), int(plain[2, 3])})  # rows that do finish, at different steps
    theirs = _theirs(model, ids, mask, 8, do_sample=False, eos_token_id=eos, **settings).numpy()
    ours = ar.generate(ids, params, config, 8, attention_mask=mask, eos_token_id=eos, pad_token_id=PAD, **settings)
    np.testing.assert_array_equal(ours, theirs)
    # and with an eos that every row produces: both stop early, at the same step
    every = sorted({int(row[0]) for row in plain})
    theirs = _theirs(model, ids, mask, 8, do_sample=False, eos_token_id=every).numpy()
    assert theirs.shape[1] == ids.shape[1] + 1
    np.testing.assert_array_equal(ar.generate(ids, params, config, 8, attention_mask=mask, eos_token_id=every,
                                              pad_token_id=PAD), theirs)


@pytest.mark.parametrize("padded", [True, False])
def test_sampled_run_replayed_through_our_processing(saved, padded):
    model, params, config = saved
    ids, mask = _prompts(config.vocab_size, padded)
    settings = dict(temperature=0.8, top_k=9, top_p=0.85, min_new_tokens=2)
    if not padded or _penalty_skips_padding():
        settings["repetition_penalty"] = 1.3
    plain = _theirs(model, ids, mask, 6, do_sample=False).numpy()[:, ids.shape[1]:]
    eos = sorted({int(plain[0, 2]), int(plain[1, 3])})
    torch.manual_seed(5)
    with torch.no_grad():
        out = model.generate(torch.tensor(ids), attention_mask=torch.tensor(mask), max_new_tokens=7, do_sample=True,
                             num_return_sequences=3, eos_token_id=eos, pad_token_id=PAD, output_scores=True,
                             return_dict_in_generate=True, **settings)
    sequences, T = out.sequences.numpy(), ids.shape[1]
    assert sequences.shape[0] == 3 * len(ids)
    processed = []

    def replay(scores):  # transformers' draw, in place of ours (generate's draw=)
        step = len(processed)
        processed.append(scores)
        drawn = sequences[:, T + step]
        allowed = np.isfinite(scores[np.arange(len(drawn)), drawn]) | (drawn == PAD)  # PAD: a finished row
        assert allowed.all(), f"step {step}: transformers drew a token our processing removed"
        return drawn

    ours = ar.generate(ids, params, config, 7, attention_mask=mask, do_sample=True, num_return_sequences=3,
                       eos_token_id=eos, pad_token_id=PAD, draw=replay, **settings)
    np.testing.assert_array_equal(ours, sequences)
    assert len(processed) == len(out.scores)
    for step, (scores, theirs) in enumerate(zip(processed, out.scores)):
        theirs = theirs.numpy()
        # generate subtracts each row's maximum before the temperature (the same softmax): compare the softmax
        assert np.array_equal(np.isneginf(scores), np.isneginf(theirs)), f"step {step}: the removed tokens differ"
        p_ours = np.exp(scores - scores.max(axis=-1, keepdims=True))
        p_theirs = np.exp(theirs.astype(np.float64) - theirs.max(axis=-1, keepdims=True))
        np.testing.assert_allclose(p_ours / p_ours.sum(-1, keepdims=True), p_theirs / p_theirs.sum(-1, keepdims=True),
                                   rtol=1e-5, atol=1e-7, err_msg=f"step {step}")
