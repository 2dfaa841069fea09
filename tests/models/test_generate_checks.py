"""generate and LMDecoder check every argument once, at the edge: each bad argument is named
before any work, the weights are checked when the decoder is made and never again at a decode
step, and sampling leaves the user's NumPy error settings alone."""
import sys

import numpy as np
import pytest

import attention_ref as ar
from attention_ref import _checks

GPT2 = ar.LMConfig(family="gpt2", vocab_size=11, d_model=8, num_layers=2, num_heads=2, num_kv_heads=2, d_ff=12,
                   max_positions=16, eps=1e-5)
LLAMA = ar.LMConfig(family="llama", vocab_size=13, d_model=8, num_layers=2, num_heads=4, num_kv_heads=2, d_ff=12,
                    max_positions=64, eps=1e-6, rope_theta=100.0, tie_word_embeddings=False)
CONFIGS = {"gpt2": GPT2, "llama": LLAMA}


@pytest.mark.parametrize("family", CONFIGS)
def test_a_decode_step_checks_no_weight(family):
    """Every array a step's checks look at is a handful of new-token numbers, never a weight:
    the weights were checked once, by LMDecoder."""
    config = CONFIGS[family]
    decoder = ar.LMDecoder(ar.init_lm_params(config, seed=0), config)
    decoder.prefill([[1, 2, 3]])
    seen = []

    def profile(frame, event, arg):
        if event == "call" and frame.f_code is _checks.as_real_array.__code__:
            seen.append(np.size(frame.f_locals["x"]))

    sys.setprofile(profile)
    try:
        decoder.step(np.array([4]))
    finally:
        sys.setprofile(None)
    smallest_weight = min(np.size(a) for a in decoder.params.values() if np.ndim(a) == 2)
    assert max(seen, default=0) < smallest_weight, seen


@pytest.mark.parametrize("name, value, message", [
    ("h.1.ffn.W_1", np.nan, r"params\['h.1.ffn.W_1'\] contains NaN"),
    ("ln_f.beta", np.inf, r"params\['ln_f.beta'\] contains infinity"),
])
def test_decoder_names_a_bad_weight_when_made(name, value, message):
    params = ar.init_lm_params(GPT2, seed=0)
    params[name] = params[name].copy()
    params[name].flat[3] = value
    with pytest.raises(ValueError, match=message):
        ar.LMDecoder(params, GPT2)
    with pytest.raises(ValueError, match=message):
        ar.generate([[1, 2]], params, GPT2, 0)  # even with nothing to generate
    with pytest.raises(ValueError, match=message):
        ar.lm_forward([[1, 2]], params, GPT2)


@pytest.mark.parametrize("family, name", [("gpt2", "h.0.ffn.W_1"), ("gpt2", "h.1.self_attn.b_k"),
                                          ("llama", "layers.1.mlp.W_down"), ("llama", "layers.0.self_attn.W_k")])
def test_a_weight_of_the_wrong_shape_is_named_against_the_config(family, name):
    config = CONFIGS[family]
    params = ar.init_lm_params(config, seed=0)
    params[name] = np.zeros(params[name].shape[:-1] + (params[name].shape[-1] + 1,))
    with pytest.raises(ValueError, match=rf"params\['{name}'\] must have shape .*d_ff = 12.*, got"):
        ar.LMDecoder(params, config)
    with pytest.raises(ValueError, match=rf"params\['{name}'\] must have shape"):
        ar.lm_forward([[1, 2]], params, config)


@pytest.mark.parametrize("kwargs, error, message", [
    ({"ids": [[1, 2], [3]]}, TypeError, "ids must be an array of integer token ids"),
    ({"ids": np.zeros((0, 3), int)}, ValueError, r"ids must be prompts \(B, T\) with B >= 1 and T >= 1"),
    ({"ids": np.zeros((2, 0), int)}, ValueError, r"ids must be prompts \(B, T\) with B >= 1 and T >= 1"),
    ({"ids": [[1.5, 2]]}, TypeError, "ids must hold integer token ids"),
    ({"attention_mask": [[1]], "max_new_tokens": 0}, ValueError, r"attention_mask must have the shape \(1, 2\)"),
    ({"max_new_tokens": -1}, ValueError, "max_new_tokens must be a non-negative integer"),
    ({"max_new_tokens": 2.0}, TypeError, "max_new_tokens must be a non-negative integer"),
    ({"temperature": float("nan")}, ValueError, "temperature must be a finite number >= 0"),
    ({"top_k": -1}, ValueError, r"top_k must be None or a non-negative integer \(0: off\), got -1"),
    ({"top_k": True}, TypeError, r"top_k must be None or a non-negative integer \(0: off\), got True"),
    ({"seed": -1}, ValueError, "seed must be None, an integer >= 0 or a numpy.random.Generator, got -1"),
    ({"seed": "a"}, TypeError, "seed must be None, an integer >= 0 or a numpy.random.Generator, got 'a'"),
    ({"config": {"model_type": "llama"}}, TypeError, "config must be an LMConfig"),
    ({"params": [1, 2]}, TypeError, "params must be a dict of arrays"),
])
def test_every_argument_of_generate_is_named_before_any_work(kwargs, error, message):
    args = {"ids": [[1, 2]], "params": ar.init_lm_params(LLAMA, seed=0), "config": LLAMA, "max_new_tokens": 2,
            **kwargs}
    with pytest.raises(error, match=message):
        ar.generate(**args)


def test_generate_makes_only_the_tokens_it_returns():
    """No output buffer of max_new_tokens columns up front: a step that fails after two tokens
    has allocated two columns' worth (measured with tracemalloc against a billion asked)."""
    import tracemalloc

    params = ar.init_lm_params(LLAMA, seed=0)

    class Stop(Exception):
        pass

    calls = []
    original = ar.LMDecoder.step

    def step(self, next_ids):
        calls.append(1)
        if len(calls) == 2:
            raise Stop
        return original(self, next_ids)

    ar.LMDecoder.step = step
    tracemalloc.start()
    try:
        with pytest.raises(Stop):
            ar.generate([[1, 2]], params, LLAMA, 10**9)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        ar.LMDecoder.step = original
    assert peak < 10**6  # a (1, 10**9) int64 buffer would be 8 GB


@pytest.mark.parametrize("temperature", [1e-3, 1e-30, 0.7])
def test_sampling_under_numpy_raise_settings(temperature):
    """A tiny temperature underflows every probability but the largest: harmless, no
    FloatingPointError, and the user's settings are as they were."""
    params = ar.init_lm_params(LLAMA, seed=0)
    expected = ar.generate([[1, 2, 3]], params, LLAMA, 4, temperature=temperature, top_k=5, seed=1)
    before = np.seterr(all="raise")
    try:
        got = ar.generate([[1, 2, 3]], params, LLAMA, 4, temperature=temperature, top_k=5, seed=1)
        assert np.geterr() == {"divide": "raise", "over": "raise", "under": "raise", "invalid": "raise"}
    finally:
        np.seterr(**before)
    np.testing.assert_array_equal(got, expected)
    if temperature < 1e-2:  # greedy in effect
        np.testing.assert_array_equal(got, ar.generate([[1, 2, 3]], params, LLAMA, 4))
