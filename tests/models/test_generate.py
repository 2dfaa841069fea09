"""generate as transformers users call it, without torch: against a plain loop written from
transformers' description (the whole forward recomputed at every step, no cache; the logits
through process_logits; a finished row continued with the pad token; stop when every row has
finished), sampled runs against an inverse-CDF draw written here, num_return_sequences, the
prefill that keeps the last position only (memory measured), and every new argument's error."""
import tracemalloc

import numpy as np
import pytest

import attention_ref as ar

GPT2 = ar.LMConfig(family="gpt2", vocab_size=11, d_model=8, num_layers=2, num_heads=2, num_kv_heads=2, d_ff=12,
                   max_positions=40, eps=1e-5)
LLAMA = ar.LMConfig(family="llama", vocab_size=13, d_model=8, num_layers=2, num_heads=4, num_kv_heads=2, d_ff=12,
                    max_positions=64, eps=1e-6, rope_theta=100.0, tie_word_embeddings=False, pad_token_id=0)
CONFIGS = {"gpt2": GPT2, "llama": LLAMA}


def _model(family, seed=0):
    config = CONFIGS[family]
    params = ar.init_lm_params(config, seed=seed)
    rng = np.random.default_rng(seed + 1)
    return {k: v * 10 + 0.1 * rng.standard_normal(v.shape) if v.ndim == 2 else v + 0.3 * rng.standard_normal(v.shape)
            for k, v in params.items()}, config


def _loop(ids, mask, params, config, max_new_tokens, *, do_sample=False, eos=None, pad=None, rng=None, **settings):
    """generate from its description: the whole forward of each row's real tokens at every step,
    the last position's logits processed, argmax or an inverse-CDF draw, finished rows padded,
    stop when all are done."""
    ids, mask = np.array(ids), np.array(mask)
    finished = np.zeros(len(ids), bool)
    for step in range(max_new_tokens):
        # each row alone, its padding dropped: positions 0, 1, ... over its real tokens, as generate's
        last = np.stack([ar.lm_forward(row[keep == 1][None], params, config)[0][0, -1] for row, keep in zip(ids, mask)])
        scores = ar.process_logits(last, ids, num_new_tokens=step, attention_mask=mask, do_sample=do_sample,
                                   eos_token_id=eos, **settings)
        if do_sample:
            p = np.exp(scores - scores.max(axis=-1, keepdims=True))
            p /= p.sum(axis=-1, keepdims=True)
            u = rng.random((len(p), 1))
            token = np.array([np.searchsorted(np.cumsum(row), x[0], side="right") for row, x in zip(p, u)])
            token = np.minimum(token, p.shape[-1] - 1)
        else:
            token = scores.argmax(axis=-1)
        if eos is not None:
            token = np.where(finished, pad, token)
            finished |= np.isin(token, eos)
        ids = np.concatenate([ids, token[:, None]], axis=1)
        mask = np.concatenate([mask, np.ones((len(ids), 1), int)], axis=1)
        if eos is not None and finished.all():
            break
    return ids


def _prompts(config, seed):
    rng = np.random.default_rng(seed)
    return ar.left_pad([rng.integers(1, config.vocab_size, n).tolist() for n in (5, 2, 4)], pad_token_id=0)


def _eos_seen(ids, params, config, which):
    """eos ids that greedy decoding produces early in some rows (so that rows do finish)."""
    out = ar.generate(ids, params, config, 6)[:, ids.shape[1]:]
    return sorted({int(out[0, which[0]]), int(out[2, which[1]])})


@pytest.mark.parametrize("family", CONFIGS)
@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("settings", [
    {},
    {"repetition_penalty": 1.7},
    {"repetition_penalty": 0.6, "min_new_tokens": 3},
    {"min_new_tokens": 2},
])
def test_greedy_with_eos_against_the_loop(family, seed, settings):
    params, config = _model(family, seed)
    ids, mask = _prompts(config, seed)
    eos = _eos_seen(ids, params, config, (1, 2))
    ours = ar.generate(ids, params, config, 9, attention_mask=mask, eos_token_id=eos, pad_token_id=0, **settings)
    np.testing.assert_array_equal(ours, _loop(ids, mask, params, config, 9, eos=eos, pad=0, **settings))
    new = ours[:, ids.shape[1]:]
    for row in new:  # after the first eos of a row (past min_new_tokens) only padding
        hits = np.flatnonzero(np.isin(row, eos))
        assert len(hits) == 0 or hits[0] >= settings.get("min_new_tokens", 0)
        if len(hits):
            assert (row[hits[0] + 1:] == 0).all()


@pytest.mark.parametrize("family", CONFIGS)
def test_generation_stops_when_every_row_has_finished(family):
    params, config = _model(family)
    ids, mask = _prompts(config, 0)
    greedy = ar.generate(ids, params, config, 8, attention_mask=mask)[:, ids.shape[1]:]  # (3, 8)
    eos = sorted({int(row[1]) for row in greedy})  # every row finishes at its second token at the latest
    ours = ar.generate(ids, params, config, 8, attention_mask=mask, eos_token_id=eos)
    assert ours.shape[1] - ids.shape[1] <= 2
    np.testing.assert_array_equal(ours, _loop(ids, mask, params, config, 8, eos=eos, pad=eos[0]))


@pytest.mark.parametrize("family", CONFIGS)
@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("settings", [
    {"temperature": 0.7},
    {"temperature": 1.3, "top_k": 4, "top_p": 0.8, "repetition_penalty": 1.2},
    {"top_p": 0.5, "min_new_tokens": 2},
    {"temperature": 1e-3, "top_k": 0},
])
def test_sampled_against_the_loop(family, seed, settings):
    params, config = _model(family, seed)
    ids, mask = _prompts(config, seed)
    eos = _eos_seen(ids, params, config, (0, 1))
    ours = ar.generate(ids, params, config, 7, attention_mask=mask, do_sample=True, seed=seed, eos_token_id=eos,
                       pad_token_id=0, **settings)
    theirs = _loop(ids, mask, params, config, 7, do_sample=True, eos=eos, pad=0, rng=np.random.default_rng(seed),
                   top_k=settings.pop("top_k", None), **settings)
    np.testing.assert_array_equal(ours, theirs)


def test_do_sample_and_temperature_keep_the_older_calls():
    params, config = _model("llama")
    ids = np.array([[3, 4, 5]])
    greedy = ar.generate(ids, params, config, 6)
    np.testing.assert_array_equal(ar.generate(ids, params, config, 6, temperature=0.0), greedy)
    np.testing.assert_array_equal(ar.generate(ids, params, config, 6, temperature=5.0, do_sample=False), greedy)
    np.testing.assert_array_equal(ar.generate(ids, params, config, 6, temperature=0.9, seed=3),
                                  ar.generate(ids, params, config, 6, temperature=0.9, seed=3, do_sample=True))
    np.testing.assert_array_equal(ar.generate(ids, params, config, 6, do_sample=True, seed=3),
                                  ar.generate(ids, params, config, 6, temperature=1.0, seed=3))


@pytest.mark.parametrize("family", CONFIGS)
def test_num_return_sequences(family):
    params, config = _model(family)
    ids, mask = _prompts(config, 1)
    out = ar.generate(ids, params, config, 6, attention_mask=mask, temperature=3.0, seed=0, num_return_sequences=4)
    assert out.shape == (12, ids.shape[1] + 6)
    np.testing.assert_array_equal(out[:, :ids.shape[1]], np.repeat(ids, 4, axis=0))  # prompt b at rows 4b .. 4b+3
    assert len({tuple(row) for row in out[:4, ids.shape[1]:]}) > 1  # the continuations differ
    repeated = _loop(np.repeat(ids, 4, axis=0), np.repeat(mask, 4, axis=0), params, config, 6, do_sample=True,
                     rng=np.random.default_rng(0), temperature=3.0, top_k=None)
    np.testing.assert_array_equal(out, repeated)
    one = ar.generate(ids[0], params, config, 3, temperature=3.0, seed=0, num_return_sequences=2)
    assert one.shape == (2, ids.shape[1] + 3)
    assert ar.generate(ids[0], params, config, 3).shape == (ids.shape[1] + 3,)


@pytest.mark.parametrize("family", CONFIGS)
def test_prefill_last_only_is_the_last_column(family):
    params, config = _model(family)
    ids, mask = _prompts(config, 2)
    full = ar.LMDecoder(params, config).prefill(ids, mask)
    last = ar.LMDecoder(params, config).prefill(ids, mask, last_only=True)
    assert last.shape == (len(ids), config.vocab_size)
    np.testing.assert_allclose(last, full[:, -1], rtol=1e-13, atol=1e-13)


def test_the_prefill_keeps_no_logits_but_the_last():
    """8 prompts of 64 tokens on a 4000-token vocabulary: the logits of every position would
    take 8 x 64 x 4000 x 8 bytes = 16.4 MB; generate's peak stays far below that."""
    config = ar.LMConfig(family="llama", vocab_size=4000, d_model=16, num_layers=1, num_heads=2, num_kv_heads=2,
                         d_ff=16, max_positions=128, eps=1e-6, rope_theta=100.0, tie_word_embeddings=True)
    params = ar.init_lm_params(config, seed=0)
    ids = np.random.default_rng(0).integers(0, 4000, (8, 64))
    all_logits = 8 * 64 * 4000 * 8
    tracemalloc.start()
    try:
        ar.generate(ids, params, config, 2)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        ar.LMDecoder(params, config).prefill(ids)
        full_peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert full_peak > all_logits  # the measurement sees the B x T x V logits when they are made
    assert peak < all_logits / 4, (peak, all_logits)


@pytest.mark.parametrize("kwargs, error, message", [
    ({"do_sample": "yes"}, TypeError, "do_sample must be None, True or False, got 'yes'"),
    ({"do_sample": True, "temperature": 0}, ValueError, "temperature must be > 0 when do_sample=True"),
    ({"top_p": 1.5}, ValueError, r"top_p must lie in \[0, 1\], got 1.5"),
    ({"top_p": "a"}, TypeError, "top_p must be a finite real number"),
    ({"repetition_penalty": 0.0}, ValueError, r"repetition_penalty must lie in \(0, inf\), got 0.0"),
    ({"repetition_penalty": np.nan}, TypeError, "repetition_penalty must be a finite real number"),
    ({"min_new_tokens": -1}, ValueError, "min_new_tokens must be a non-negative integer"),
    ({"eos_token_id": 13}, ValueError, r"eos_token_id\[0\] = 13 is not a token id in \[0, 13\)"),
    ({"eos_token_id": []}, ValueError, "eos_token_id must be a token id or a non-empty list"),
    ({"eos_token_id": True}, TypeError, "eos_token_id must be a token id or a list of them"),
    ({"eos_token_id": 2, "pad_token_id": 13}, ValueError, r"pad_token_id = 13 is not a token id in \[0, 13\)"),
    ({"pad_token_id": -1}, ValueError, "pad_token_id must be a non-negative integer"),
    ({"num_return_sequences": 0}, ValueError, "num_return_sequences must be a positive integer"),
    ({"num_return_sequences": 2}, ValueError, r"num_return_sequences = 2 needs sampling \(do_sample=True\)"),
    ({"eos_token_id": list(range(13)), "min_new_tokens": 1}, ValueError, "eos_token_id names all 13 tokens"),
])
def test_every_new_argument_is_named_before_any_work(kwargs, error, message):
    calls = []
    original = ar.LMDecoder.__init__

    def spy(self, *args):
        calls.append(1)
        original(self, *args)

    ar.LMDecoder.__init__ = spy
    try:
        with pytest.raises(error, match=message):
            ar.generate([[1, 2]], ar.init_lm_params(LLAMA, seed=0), LLAMA, 2, **kwargs)
    finally:
        ar.LMDecoder.__init__ = original
    assert not calls  # no decoder made: the error came before any work


def test_generate_modifies_nothing_and_leaves_numpy_settings():
    params, config = _model("llama")
    ids, mask = _prompts(config, 0)
    copies = {k: v.copy() for k, v in params.items()}
    ids0, mask0 = ids.copy(), mask.copy()
    before = np.seterr(all="raise")
    try:
        ar.generate(ids, params, config, 5, attention_mask=mask, do_sample=True, temperature=1e-320, top_p=0.9,
                    repetition_penalty=3.0, eos_token_id=[1, 2], min_new_tokens=2, seed=0, num_return_sequences=2)
        assert np.geterr() == {"divide": "raise", "over": "raise", "under": "raise", "invalid": "raise"}
    finally:
        np.seterr(**before)
    assert all(np.array_equal(copies[k], params[k]) for k in params)
    np.testing.assert_array_equal(ids, ids0)
    np.testing.assert_array_equal(mask, mask0)


def test_the_decoder_keeps_the_head_with_its_rows_contiguous():
    """A tied head (the token table's transpose, F order) is copied once, in blocks of columns, into a
    C-ordered (D, V): the same numbers; an untied head already C-ordered is kept as it is."""
    from attention_ref.models.config import family_of
    from attention_ref.models.params import head_weight

    for family, tied in (("llama", True), ("gpt_neox", False)):
        config = ar.LMConfig.from_dict({**family_of(family).example, "model_type": family, "tie_word_embeddings": tied,
                                        "vocab_size": 200})  # 200 columns: three full blocks of 64 and a part
        params = ar.init_lm_params(config, seed=0, dtype=np.float32)
        decoder = ar.LMDecoder(params, config)
        W = head_weight(params, config)
        assert decoder.head.flags.c_contiguous and (decoder.head is W) == (not tied)
        np.testing.assert_array_equal(decoder.head, W)


def test_a_short_generate_reads_the_tied_head_where_it_lies():
    """``copy_head=False`` keeps a tied head as the table's transpose (no copy); ``generate`` asks for
    the copy only from ``COPY_HEAD_TOKENS`` new tokens on; the tokens are the same either way."""
    import importlib

    generate_module = importlib.import_module("attention_ref.models.generate")  # the module, not the function
    from attention_ref.models.config import family_of
    from attention_ref.models.params import head_weight

    config = ar.LMConfig.from_dict({**family_of("llama").example, "model_type": "llama", "tie_word_embeddings": True,
                                    "vocab_size": 200})
    params = ar.init_lm_params(config, seed=0, dtype=np.float64)
    decoder = ar.LMDecoder(params, config, copy_head=False)
    assert np.shares_memory(decoder.head, head_weight(params, config)) and not decoder.head.flags.c_contiguous
    made = []
    original = generate_module.LMDecoder

    class Recording(original):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self.head.flags.c_contiguous)

    ids = np.array([[3, 4, 5]])
    n = generate_module.COPY_HEAD_TOKENS
    try:
        generate_module.LMDecoder = Recording
        short, long = (ar.generate(ids, params, config, k) for k in (n - 1, n))
    finally:
        generate_module.LMDecoder = original
    assert made == [False, True]
    np.testing.assert_array_equal(long[:, :short.shape[1]], short)
