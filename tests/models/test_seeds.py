"""``seed`` takes None, an int or a ``numpy.random.Generator`` (SPEC 7) in every public function
that draws; anything else is refused by name. ``generate``'s draw: a user's ``draw``, checked, and a
one-line error when no token can be drawn."""
import numpy as np
import pytest

import attention_ref as ar
from attention_ref._checks import as_generator
from attention_ref.documents.toy_task import init_toy_model, train_toy_model
from attention_ref.nn import init_gpt2_block_params, init_llama_block_params

GPT2 = ar.LMConfig(family="gpt2", vocab_size=16, d_model=8, num_layers=1, num_heads=2, num_kv_heads=2, d_ff=8,
                   max_positions=32, eps=1e-5, tie_word_embeddings=False)

#: every public function that draws, called with a given seed
DRAWS = {
    "init_lm_params": lambda seed: ar.init_lm_params(GPT2, seed=seed),
    "init_llama_block_params": lambda seed: init_llama_block_params(8, 2, 12, seed=seed),
    "init_gpt2_block_params": lambda seed: init_gpt2_block_params(8, 2, seed=seed),
    "MultiHeadAttention": lambda seed: ar.MultiHeadAttention(8, 2, seed=seed).params,
    "init_toy_model": lambda seed: init_toy_model(seed=seed),
    "gradcheck": lambda seed: ar.gradcheck(ar.softmax_forward, ar.softmax_backward,
                                           np.linspace(-1, 1, 6).reshape(2, 3), seed=seed).rows[0].scale,
    "generate": lambda seed: ar.generate(np.array([[1, 2, 3]]), ar.init_lm_params(GPT2, seed=0), GPT2, 8,
                                         do_sample=True, seed=seed),
}


def _same(a, b):
    if isinstance(a, dict):
        return sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a)
    return np.array_equal(a, b)


@pytest.mark.parametrize("name", list(DRAWS))
def test_an_int_and_a_generator_seeded_with_it_draw_the_same(name):
    f = DRAWS[name]
    assert _same(f(3), f(3))
    assert _same(f(3), f(np.random.default_rng(3)))
    assert _same(f(np.int64(3)), f(3))
    f(None)  # fresh entropy


@pytest.mark.parametrize("name", list(DRAWS))
def test_a_generator_is_used_as_it_is(name):
    """Its state advances: two calls on one Generator draw different numbers (SPEC 7; gradcheck's one
    draw is the upstream gradient, seen in its report's largest gradient entry)."""
    rng = np.random.default_rng(0)
    assert not _same(DRAWS[name](rng), DRAWS[name](rng))


@pytest.mark.parametrize("name", list(DRAWS) + ["train_toy_model", "write_random_model"])
@pytest.mark.parametrize("seed, error", [(-1, ValueError), (1.5, TypeError), (True, TypeError), ("0", TypeError),
                                         (np.random.RandomState(0), TypeError)])
def test_a_bad_seed_is_refused_by_name(name, seed, error, tmp_path):
    calls = {**DRAWS, "train_toy_model": lambda s: train_toy_model(2, seed=s, epochs=1),
             "write_random_model": lambda s: ar.interop.write_random_model(tmp_path / "m", "llama", seed=s)}
    with pytest.raises(error, match=r"^seed must be None, an integer >= 0 or a numpy.random.Generator, got "):
        calls[name](seed)


def test_the_toy_run_with_an_int_seed_is_unchanged():
    """An int seed keeps the streams of the recorded runs (docs/training_results.json)."""
    rng = np.random.default_rng(0)
    assert _same(init_toy_model(seed=0), init_toy_model(seed=0))
    a = train_toy_model(2, seed=0, epochs=1, steps_per_epoch=2)
    b = train_toy_model(2, seed=0, epochs=1, steps_per_epoch=2)
    c = train_toy_model(2, seed=rng, epochs=1, steps_per_epoch=2)
    assert a.final_loss == b.final_loss and c.final_loss != a.final_loss


def test_as_generator_takes_the_three_kinds():
    rng = np.random.default_rng(1)
    assert as_generator(rng) is rng
    assert isinstance(as_generator(None), np.random.Generator)
    assert as_generator(7).random() == np.random.default_rng(7).random()
    with pytest.raises(TypeError, match="^my_seed must be None"):
        as_generator([1, 2], "my_seed")


def _all_negative_model():
    """Every logit -1e10 whatever the input: a huge repetition penalty on a prompt that holds every
    token sends them all to -inf."""
    params = ar.init_lm_params(GPT2, seed=0)
    params["ln_f.gamma"][:] = 0
    params["ln_f.beta"][:] = np.eye(8)[0]
    params["lm_head.W"][:] = 0
    params["lm_head.W"][0] = -1e10
    return params


def test_no_token_to_draw_is_a_one_line_error():
    params = _all_negative_model()
    every = np.arange(16)[None]
    with pytest.raises(ValueError, match=r"^no token can be drawn for rows \[0\]: the logits processors .* left"
                                         r" every logit at -inf$"):
        ar.generate(every, params, GPT2, 2, do_sample=True, seed=0, repetition_penalty=1e300)
    both = np.stack([every[0], np.roll(every[0], 1)])
    with pytest.raises(ValueError, match=r"rows \[0, 1\]"):
        ar.generate(both, params, GPT2, 2, do_sample=True, seed=0, repetition_penalty=1e300)
    # greedy takes the first of equal maxima, as torch's argmax, and transformers' greedy search
    assert ar.generate(every, params, GPT2, 1, repetition_penalty=1e300)[0, -1] == 0


def test_a_draw_replaces_numpy_and_is_checked():
    params = ar.init_lm_params(GPT2, seed=0)
    seen = []

    def last_token(processed):
        seen.append(processed.shape)
        return np.full(len(processed), 15)

    out = ar.generate(np.array([[1, 2], [3, 4]]), params, GPT2, 3, do_sample=True, draw=last_token)
    assert (out[:, 2:] == 15).all() and seen == [(2, 16)] * 3
    for bad in (lambda p: np.zeros(3, int), lambda p: np.full(len(p), 16), lambda p: np.zeros(len(p))):
        with pytest.raises(ValueError, match=r"^draw must return one token id in \[0, 16\) per row"):
            ar.generate(np.array([[1, 2], [3, 4]]), params, GPT2, 3, do_sample=True, draw=bad)
    for kwargs in (dict(do_sample=False, draw=last_token), dict(do_sample=True, seed=0, draw=last_token),
                   dict(do_sample=True, draw="torch")):
        with pytest.raises(ValueError, match="^draw must be a callable, given only when sampling"):
            ar.generate(np.array([[1, 2]]), params, GPT2, 3, **kwargs)


def test_torch_draw_without_torch_says_how_to_install_it(monkeypatch):
    import sys

    from attention_ref.interop import torch_draw

    monkeypatch.setitem(sys.modules, "torch", None)  # as if torch were not installed
    with pytest.raises(ImportError, match=r'^torch_draw needs torch: pip install -e "\.\[interop\]"'):
        torch_draw(0)
    for seed, error in ((-1, ValueError), (None, TypeError), (np.random.default_rng(0), TypeError)):
        with pytest.raises(error, match="^seed must be a non-negative integer"):
            torch_draw(seed)  # torch's generator takes an integer seed only
