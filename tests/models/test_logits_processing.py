"""The logits processors of attention_ref.models.logits_processing against plain loops written from
their formulas, against transformers' LogitsProcessor classes at 1e-12 in float64 (skipped without
torch and transformers), and against the processed scores of transformers' own ``generate`` (the
order of the steps, the left padding, min_new_tokens, eos); and ``left_pad``."""
import inspect
import math

import numpy as np
import pytest

from attention_ref.models.logits_processing import (
    apply_min_new_tokens,
    apply_repetition_penalty,
    apply_temperature,
    apply_top_k,
    apply_top_p,
    left_pad,
    process_logits,
)
from _helpers import assert_close

CASES = [(seed, 1 + seed % 4, 1 + (7 * seed) % 37, 1 + (3 * seed) % 9) for seed in range(24)]  # (seed, B, V, T)


def _random_case(seed, B, V, T):
    rng = np.random.default_rng(seed)
    logits = 3.0 * rng.standard_normal((B, V))
    ids = rng.integers(0, V, (B, T))
    return rng, logits, ids


# ------------------------------------------------------------------------ plain loops
def loop_repetition_penalty(logits, ids, penalty, attention_mask=None):
    out = [list(map(float, row)) for row in logits]
    for b in range(len(out)):
        first = 0
        if attention_mask is not None:
            while first < len(ids[b]) and attention_mask[b][first] == 0:
                first += 1
            if first == len(ids[b]):  # no real token: transformers' argmax gives 0
                first = 0
        for v in set(int(t) for t in ids[b][first:]):
            s = out[b][v]
            out[b][v] = s * penalty if s < 0 else s / penalty
    return np.array(out)


def loop_top_k(logits, k):
    out = np.array(logits, dtype=float)
    for row in out.reshape(-1, out.shape[-1]):
        kth = sorted(row, reverse=True)[min(k, len(row)) - 1]
        for v in range(len(row)):
            if row[v] < kth:
                row[v] = -math.inf
    return out


def loop_top_p(logits, p, min_keep=1):
    out = np.array(logits, dtype=float)
    for row in out.reshape(-1, out.shape[-1]):
        order = sorted(range(len(row)), key=lambda v: (row[v], v))  # ascending, ties by index
        top = row[order[-1]]
        weights = [math.exp(row[v] - top) if row[v] > -math.inf else 0.0 for v in order]
        total, running, remove = sum(weights), 0.0, []
        for j, v in enumerate(order):
            running += weights[j] / total
            if running <= 1 - p and j < len(order) - min_keep:
                remove.append(v)
        for v in remove:
            row[v] = -math.inf
    return out


# --------------------------------------------------------------------- against the loops
@pytest.mark.parametrize("seed,B,V,T", CASES)
def test_repetition_penalty_matches_loop(seed, B, V, T):
    rng, logits, ids = _random_case(seed, B, V, T)
    mask = (np.arange(T) >= rng.integers(0, T, (B, 1))).astype(int)  # left padding of random length
    for penalty in (1.3, 0.7):
        assert_close(apply_repetition_penalty(logits, ids, penalty), loop_repetition_penalty(logits, ids, penalty))
        assert_close(apply_repetition_penalty(logits, ids, penalty, mask),
                     loop_repetition_penalty(logits, ids, penalty, mask), what="with left padding")


def test_repetition_penalty_counts_a_token_once_and_ignores_the_padding():
    logits = np.array([[2.0, -2.0, 1.0, 0.5]])
    out = apply_repetition_penalty(logits, [[3, 1, 1, 1]], 2.0, attention_mask=[[0, 1, 1, 1]])
    assert out.tolist() == [[2.0, -4.0, 1.0, 0.5]]  # token 3 is padding; token 1 once: -2 * 2


@pytest.mark.parametrize("seed,B,V,T", CASES)
def test_top_k_matches_loop(seed, B, V, T):
    _, logits, _ = _random_case(seed, B, V, T)
    for k in (1, 2, V, V + 3):
        assert_close(apply_top_k(logits, k), loop_top_k(logits, k))
    assert (np.isfinite(apply_top_k(logits, 1)).sum(axis=-1) == 1).all()


def test_top_k_keeps_ties_with_the_kth():
    assert apply_top_k([[1.0, 3.0, 3.0, 2.0]], 1).tolist() == [[-np.inf, 3.0, 3.0, -np.inf]]


@pytest.mark.parametrize("seed,B,V,T", CASES)
def test_top_p_matches_loop(seed, B, V, T):
    rng, logits, _ = _random_case(seed, B, V, T)
    logits[rng.random(logits.shape) < 0.2] = -np.inf  # removed by an earlier step
    logits[:, 0] = 1.0  # at least one finite logit per row
    for p in (0.0, 0.3, 0.9, 1.0, float(rng.random())):
        for keep in (1, 3):
            assert_close(apply_top_p(logits, p, keep), loop_top_p(logits, p, keep), what=f"top_p={p} keep={keep}")


def test_top_p_by_hand():
    probs = np.array([0.5, 0.3, 0.15, 0.05])
    out = apply_top_p(np.log(probs)[None], 0.75)  # sorted ascending: cumulative .05 .20 .50 1.0; <= .25 removed
    assert np.isfinite(out).tolist() == [[True, True, False, False]]


def test_temperature_and_min_new_tokens():
    logits = np.array([[1.0, -2.0, 4.0]], dtype=np.float32)
    out = apply_temperature(logits, 2.0)
    assert out.dtype == np.float32 and out.tolist() == [[0.5, -1.0, 2.0]]
    assert apply_min_new_tokens(logits, [0, 2], 1, 2).tolist() == [[-np.inf, -2.0, -np.inf]]
    assert apply_min_new_tokens(logits, 2, 2, 2).tolist() == logits.tolist()


def test_process_logits_order_by_hand():
    """Penalty before temperature: the penalised logit is divided by both."""
    logits = np.array([[4.0, -1.0, 2.0, 0.0]])
    out = process_logits(logits, [[0, 1]], do_sample=True, temperature=0.5, top_k=3, repetition_penalty=2.0)
    # 4/2/0.5 = 4, -1*2/0.5 = -4, 2/0.5 = 4, 0/0.5 = 0; top-3 removes -4
    assert out.tolist() == [[4.0, -np.inf, 4.0, 0.0]]
    greedy = process_logits(logits, [[0, 1]], temperature=0.5, top_k=1, repetition_penalty=2.0)
    assert greedy.tolist() == [[2.0, -2.0, 2.0, 0.0]]  # warpers only when sampling


def test_float32_stays_float32_and_inputs_are_not_modified():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((2, 9)).astype(np.float32)
    before = logits.copy()
    for out in (apply_repetition_penalty(logits, [[1, 2], [3, 3]], 1.5), apply_temperature(logits, 0.7),
                apply_top_k(logits, 3), apply_top_p(logits, 0.5), apply_min_new_tokens(logits, 4, 0, 1),
                process_logits(logits, [[1, 2], [3, 3]], do_sample=True, temperature=0.7, top_p=0.9,
                               repetition_penalty=1.2, min_new_tokens=1, eos_token_id=4)):
        assert out.dtype == np.float32 and out is not logits
    assert np.array_equal(logits, before)


def test_extreme_logits_raise_no_numpy_warning_and_keep_numpy_settings():
    before = np.geterr()
    logits = np.array([[-1e308, 1e-310, 3.0, 1e308]])
    with np.errstate(all="raise"):
        out = apply_repetition_penalty(logits, [[0, 1]], 10.0)
        assert out[0, 0] == -np.inf and out[0, 1] == pytest.approx(1e-311, rel=1e-3)
        assert np.isfinite(apply_top_p(logits, 0.5)).tolist() == [[False, False, False, True]]
        assert apply_temperature(logits[:, :3], 1e300)[0, 1] == 0.0  # underflows to 0, quietly
        with pytest.raises(FloatingPointError, match=r"^logits / penalty overflows float64 \(penalty = 0.1,"):
            apply_repetition_penalty(logits, [[3]], 0.1)
    assert np.geterr() == before


# ------------------------------------------------------------------------ bad arguments
@pytest.mark.parametrize("call,error,message", [
    (lambda: apply_temperature([[1.0]], 0.0), ValueError, r"^temperature must lie in \(0, inf\), got 0.0$"),
    (lambda: apply_temperature([[1.0]], "hot"), TypeError, r"^temperature must be a finite real number, got 'hot'$"),
    (lambda: apply_temperature([[1e300]], 1e-300), FloatingPointError, r"^logits / temperature overflows float64"),
    (lambda: apply_top_k([[1.0]], 0), ValueError, r"^top_k must be a positive integer, got 0$"),
    (lambda: apply_top_p([[1.0]], 1.5), ValueError, r"^top_p must lie in \[0, 1\], got 1.5$"),
    (lambda: apply_top_p([[-np.inf, -np.inf]], 0.5), ValueError, r"^logits\[0\] is -inf for every token"),
    (lambda: apply_top_p([[np.nan]], 0.5), ValueError, r"^logits contains NaN"),
    (lambda: apply_repetition_penalty([[1.0, 2.0]], [[0, 2]], 1.2), ValueError,
     r"^ids\[0, 1\] = 2 is not a token id in \[0, 2\)"),
    (lambda: apply_repetition_penalty([[1.0, 2.0]], [[0], [1]], 1.2), ValueError,
     r"^ids must have shape \(B, T\) with B = 1 rows like logits \(1, 2\), got \(2, 1\)$"),
    (lambda: apply_repetition_penalty([1.0, 2.0], [[0]], 1.2), ValueError, r"^logits must have shape \(B, V\)"),
    (lambda: apply_repetition_penalty([[1.0, 2.0]], [[0]], -1.0), ValueError, r"^penalty must lie in \(0, inf\)"),
    (lambda: apply_repetition_penalty([[1.0, 2.0]], [[0]], 1.2, [[0, 1]]), ValueError,
     r"^attention_mask must have the shape \(1, 1\) of the ids, got \(1, 2\)$"),
    (lambda: apply_min_new_tokens([[1.0]], 3, 0, 1), ValueError, r"^eos_token_id\[0\] = 3 is not a token id"),
    (lambda: apply_min_new_tokens([[1.0]], True, 0, 1), TypeError, r"^eos_token_id must be a token id"),
    (lambda: apply_min_new_tokens([[1.0]], 0, -1, 1), ValueError, r"^num_new_tokens must be a non-negative integer"),
    (lambda: process_logits([[1.0]], [[0]], do_sample=1), TypeError, r"^do_sample must be True or False, got 1$"),
    (lambda: process_logits([[1.0]], [[0]], top_k=-2), ValueError,
     r"^top_k must be None or a non-negative integer \(0: off\), got -2$"),
    (lambda: process_logits([[1.0]], [[0]], top_k=2.0), TypeError,
     r"^top_k must be None or a non-negative integer \(0: off\), got 2.0$"),
    (lambda: process_logits([[1.0]], [[0]], num_new_tokens=2), ValueError,
     r"^num_new_tokens = 2 is more than the 1 tokens of ids$"),
    (lambda: process_logits([[1.0]], [[0]], repetition_penalty=0), ValueError, r"^repetition_penalty must lie in"),
])
def test_bad_arguments_get_one_line_naming_them(call, error, message):
    with pytest.raises(error, match=message) as info:
        call()
    assert "\n" not in str(info.value)


# ------------------------------------------------------------------------------ left_pad
def test_left_pad():
    ids, mask = left_pad([[5, 6, 7], [8], np.array([1, 2])], pad_token_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8], [0, 1, 2]] and ids.dtype == np.int64
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1], [0, 1, 1]] and mask.dtype == np.int64


@pytest.mark.parametrize("prompts,pad,error,message", [
    ([], 0, ValueError, r"^prompts must hold at least one prompt, got none$"),
    ([[1], []], 0, ValueError, r"^prompts\[1\] is empty: every prompt needs at least one token$"),
    ([[1], [[1, 2]]], 0, ValueError, r"^prompts\[1\] must be a 1-D sequence of token ids, got shape \(1, 2\)$"),
    ([[1], [0.5]], 0, TypeError, r"^prompts\[1\] must hold integer token ids"),
    ([[1], [-3]], 0, ValueError, r"^prompts\[1\] holds the negative token id -3$"),
    ("abc", 0, TypeError, r"^prompts must be a sequence of token-id sequences, got str$"),
    ([[1]], -1, ValueError, r"^pad_token_id must be a non-negative integer, got -1$"),
    ([[1]], None, TypeError, r"^pad_token_id must be a non-negative integer, got None$"),
])
def test_left_pad_refuses_bad_prompts(prompts, pad, error, message):
    with pytest.raises(error, match=message):
        left_pad(prompts, pad)


# ------------------------------------------------------------------- against transformers
@pytest.fixture
def lp():
    pytest.importorskip("torch")
    return pytest.importorskip("transformers.generation.logits_process")


def _theirs(processor, ids, logits):
    import torch

    return processor(torch.tensor(ids), torch.tensor(logits)).numpy()


@pytest.mark.parametrize("seed,B,V,T", CASES)
def test_each_step_equals_transformers_processor(lp, seed, B, V, T):
    rng, logits, ids = _random_case(seed, B, V, T)
    logits[rng.random(logits.shape) < 0.1] = -np.inf
    logits[:, 0] = 0.5
    penalty, temperature, k, p = 0.5 + 1.5 * rng.random(), 0.2 + 2 * rng.random(), int(rng.integers(1, V + 3)), \
        float(rng.random())
    eos = sorted(set(rng.integers(0, V, 2).tolist()))
    for ours, processor in [
        (apply_repetition_penalty(logits, ids, penalty), lp.RepetitionPenaltyLogitsProcessor(penalty)),
        (apply_temperature(logits, temperature), lp.TemperatureLogitsWarper(temperature)),
        (apply_top_k(logits, k), lp.TopKLogitsWarper(k)),
        (apply_top_p(logits, p), lp.TopPLogitsWarper(p)),
        (apply_top_p(logits, p, 2), lp.TopPLogitsWarper(p, min_tokens_to_keep=2)),
        (apply_min_new_tokens(logits, eos, T - 1, T), lp.MinNewTokensLengthLogitsProcessor(1, T, eos)),
        (apply_min_new_tokens(logits, eos, T - 1, T - 1), lp.MinNewTokensLengthLogitsProcessor(1, T - 1, eos)),
    ]:
        theirs = _theirs(processor, ids, logits)
        assert np.array_equal(np.isneginf(ours), np.isneginf(theirs)), type(processor).__name__
        assert_close(np.where(np.isneginf(ours), 0, ours), np.where(np.isneginf(theirs), 0, theirs),
                     what=type(processor).__name__)


@pytest.mark.parametrize("seed,B,V,T", CASES[:8])
def test_repetition_penalty_skips_padding_as_transformers(lp, seed, B, V, T):
    import inspect

    import torch

    if "prompt_ignore_length" not in inspect.signature(lp.RepetitionPenaltyLogitsProcessor).parameters:
        pytest.skip("this transformers counts the padding in the repetition penalty (no prompt_ignore_length)")
    rng, logits, ids = _random_case(seed, B, V, T)
    pads = rng.integers(0, T, B)
    mask = (np.arange(T)[None] >= pads[:, None]).astype(int)
    try:
        processor = lp.RepetitionPenaltyLogitsProcessor(1.7, prompt_ignore_length=torch.tensor(pads))
    except ValueError as exc:  # 4.57: one int for the whole batch, and generate passes none
        pytest.skip(f"this transformers takes no per-row prompt_ignore_length ({exc})")
    assert_close(apply_repetition_penalty(logits, ids, 1.7, mask), _theirs(processor, ids, logits))


@pytest.mark.parametrize("do_sample", [False, True])
def test_process_logits_equals_transformers_generate(do_sample):
    """transformers' generate on a tiny random Llama, left-padded batch, eos and min_new_tokens:
    our processing of its raw logits (``output_logits``) equals its processed ``scores`` at every step."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=23, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                                      bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = transformers.LlamaForCausalLM(config).eval()
    ids, mask = left_pad([[5, 6, 7, 8], [9, 3], [4, 4, 11]], pad_token_id=0)
    settings = dict(repetition_penalty=1.3, min_new_tokens=3, eos_token_id=[2, 7], pad_token_id=0)
    if do_sample:
        settings.update(temperature=0.8, top_k=9, top_p=0.85)
    with torch.no_grad():
        out = model.generate(torch.tensor(ids), attention_mask=torch.tensor(mask), max_new_tokens=6,
                             do_sample=do_sample, output_logits=True, output_scores=True,
                             return_dict_in_generate=True, **settings)
    sequences = out.sequences.numpy()
    T = ids.shape[1]
    from transformers.generation.utils import GenerationMixin

    # 4.57's generate passes no prompt_ignore_length: its penalty counts the padding, as ours without a mask
    skips_padding = "prompt_ignore_length" in inspect.getsource(GenerationMixin._get_logits_processor)
    assert len(out.logits) == len(out.scores) >= 3
    for step, (raw, scores) in enumerate(zip(out.logits, out.scores)):
        seen = sequences[:, :T + step]
        seen_mask = np.concatenate([mask, np.ones((len(ids), step), int)], axis=1)
        ours = process_logits(raw.numpy(), seen, num_new_tokens=step,
                              attention_mask=seen_mask if skips_padding else None,
                              do_sample=do_sample, **{k: v for k, v in settings.items() if k != "pad_token_id"},
                              **({} if do_sample else {"top_k": None}))
        theirs = scores.numpy()
        assert ours.dtype == theirs.dtype == np.float32
        assert np.array_equal(np.isneginf(ours), np.isneginf(theirs)), f"step {step}"
        assert_close(np.where(np.isneginf(ours), 0, ours), np.where(np.isneginf(theirs), 0, theirs),
                     rtol=1e-6, atol=1e-6, what=f"step {step}")
