"""The next-token logits as transformers' ``generate`` processes them, and ``left_pad`` for ragged prompts.

Pure functions of the logits of one step, each the formula of one of transformers' logits
processors (``transformers/generation/logits_process.py``), none modifying its input:

* :func:`apply_repetition_penalty` (``RepetitionPenaltyLogitsProcessor``): for each token ``v``
  seen in the row (once, however often), ``s_v <- s_v * penalty`` if ``s_v < 0`` else ``s_v / penalty``
* :func:`apply_min_new_tokens` (``MinNewTokensLengthLogitsProcessor``): ``s_eos <- -inf`` while
  fewer than ``min_new_tokens`` tokens are new
* :func:`apply_temperature` (``TemperatureLogitsWarper``): ``s <- s / temperature``
* :func:`apply_top_k` (``TopKLogitsWarper``): ``s_v <- -inf`` where ``s_v`` is below the k-th largest
* :func:`apply_top_p` (``TopPLogitsWarper``): ``s_v <- -inf`` for the least likely tokens whose
  probabilities add up to at most ``1 - top_p``

:func:`process_logits` applies them in transformers' order (``GenerationMixin._get_logits_processor``):
repetition penalty and min_new_tokens always (greedy too), then, only when sampling, temperature,
top-k and top-p; each is skipped at its neutral value (penalty 1, temperature 1, top_k None or 0,
top_p 1), as transformers skips adding it. Its defaults are transformers' global defaults
(``GenerationConfig._get_default_generation_params``: temperature 1, top_k 50, top_p 1).

Symbols: B rows (prompts), T tokens so far per row (prompt and generated), V vocabulary.
"""
from __future__ import annotations

from numbers import Integral, Real
from typing import NamedTuple

import numpy as np

from .._checks import as_real_array, check_positive_int, require_ndim, signals_land_here
from .._token_checks import as_attention_mask, as_token_ids

__all__ = [
    "apply_repetition_penalty",
    "apply_min_new_tokens",
    "apply_temperature",
    "apply_top_k",
    "apply_top_p",
    "process_logits",
    "left_pad",
]

#: transformers' value of a removed token (``filter_value``): it gets probability 0
FILTERED = -np.inf
#: transformers' global defaults for sampling (top_k 50 applies whenever do_sample is True)
DEFAULT_TOP_K = 50


# ------------------------------------------------------------------------- argument checks
def _as_logits(logits, min_ndim=1, layout="(..., V)"):
    """Real logits, -inf allowed (a token removed by an earlier step), at least one finite per row."""
    logits = as_real_array(logits, "logits", allow_neg_inf=True)
    require_ndim(logits, "logits", min_ndim, layout)
    if logits.shape[-1] == 0:
        raise ValueError(f"logits must have a non-empty vocabulary axis, got shape {logits.shape}")
    dead = np.isneginf(logits).all(axis=-1)  # (...,)
    if dead.any():
        row = tuple(int(i) for i in np.argwhere(dead)[0])
        raise ValueError(f"logits{list(row)} is -inf for every token (no token left to choose); logits has shape"
                         f" {logits.shape}")
    return logits


def _check_real(value, name, *, low, high=None, low_open=True):
    """``value`` as a float in (low, high] (``[low, high]`` when not ``low_open``), else a one-line error."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, Real) or not np.isfinite(value):
        raise TypeError(f"{name} must be a finite real number, got {value!r}")
    value = float(value)
    if (value <= low if low_open else value < low) or (high is not None and value > high):
        bracket = "(" if low_open else "["
        raise ValueError(f"{name} must lie in {bracket}{low:g}, {'inf)' if high is None else f'{high:g}]'},"
                         f" got {value}")
    return value


def _as_eos_ids(eos_token_id, vocab_size):
    """One id or several, each in [0, V), as an int64 array (k,)."""
    if isinstance(eos_token_id, (bool, np.bool_)):
        raise TypeError(f"eos_token_id must be a token id or a list of them, got {eos_token_id!r}")
    if _is_empty(eos_token_id):  # [] is float64 to NumPy: say what is wrong
        raise ValueError("eos_token_id must be a token id or a non-empty list of them, got an empty list")
    eos = as_token_ids(np.atleast_1d(eos_token_id) if isinstance(eos_token_id, Integral) else eos_token_id,
                       "eos_token_id", vocab_size)
    if eos.ndim != 1 or eos.size == 0:
        raise ValueError(f"eos_token_id must be a token id or a non-empty list of them, got shape {eos.shape}")
    return eos


# ------------------------------------------------------------------------------ the steps
def _check_ids(ids, logits, attention_mask):
    """ids (B, T) with ids in [0, V) and B the logits' rows; the mask as booleans (B, T)."""
    if logits.ndim != 2:
        raise ValueError(f"logits must have shape (B, V) to go with ids (B, T), got {logits.shape}")
    ids = as_token_ids(ids, "ids", logits.shape[-1])
    if ids.ndim != 2 or ids.shape[0] != logits.shape[0]:
        raise ValueError(f"ids must have shape (B, T) with B = {logits.shape[0]} rows like logits {logits.shape},"
                         f" got {ids.shape}")
    return ids, as_attention_mask(attention_mask, ids.shape)


def apply_repetition_penalty(logits, ids, penalty, attention_mask=None):
    """Penalise every token already in the row: ``s * penalty`` where ``s < 0``, ``s / penalty`` elsewhere.

    CTRL's repetition penalty as transformers applies it: each token id present in ``ids[b]``
    is penalised once, however many times it occurs; ``penalty > 1`` makes repeats less
    likely, ``penalty < 1`` more likely. With ``attention_mask``, each row's left padding
    (the positions before its first 1, transformers' ``prompt_ignore_length``) does not count.

    Parameters
    ----------
    logits : array (B, V)
    ids : integer array (B, T), every id in [0, V): the prompt and the tokens generated so far
    penalty : float > 0
    attention_mask : optional 0/1 array (B, T), 0 on the left padding

    Returns
    -------
    array (B, V), the penalised logits (a new array, ``logits``'s dtype)
    """
    logits = _as_logits(logits, 2, "(B, V)")
    ids, keep = _check_ids(ids, logits, attention_mask)
    return _repetition_penalty(logits, ids, _check_real(penalty, "penalty", low=0.0), keep)


def _repetition_penalty(logits, ids, penalty, keep):
    """Unchecked :func:`apply_repetition_penalty`; ``keep`` the boolean mask (B, T)."""
    counted = np.arange(ids.shape[1]) >= keep.argmax(axis=1)[:, None]  # (B, T): from the first real token on
    rows = np.broadcast_to(np.arange(ids.shape[0])[:, None], ids.shape)  # (B, T)
    seen = np.zeros(logits.shape, bool)  # (B, V)
    seen[rows[counted], ids[counted]] = True
    with np.errstate(over="ignore", under="ignore"):  # checked on the next line; underflow to 0 is harmless
        penalised = np.where(logits < 0, logits * penalty, logits / penalty)  # (B, V); penalty a Python float
        out = np.where(seen, penalised, logits)  # (B, V)
        overflowed = np.isposinf(out).any()
        signals_land_here()  # a Ctrl-C is raised inside the block (_pair_checks.py)
    if overflowed:
        raise FloatingPointError(f"logits / penalty overflows {logits.dtype} (penalty = {penalty:g}, largest logit"
                                 f" {float(logits.max()):.3g}); use a larger penalty")
    return out  # a logit sent to -inf by penalty > 1 gets probability 0, as in torch


def apply_min_new_tokens(logits, eos_token_id, num_new_tokens, min_new_tokens):
    """Forbid the end of the text too early: every ``eos_token_id`` gets ``-inf`` while
    ``num_new_tokens < min_new_tokens`` (the tokens generated so far, the prompt not counted).

    Parameters
    ----------
    logits : array (..., V)
    eos_token_id : int or list of ints in [0, V)
    num_new_tokens, min_new_tokens : non-negative ints

    Returns
    -------
    array (..., V), a new array
    """
    logits = _as_logits(logits)
    eos = _as_eos_ids(eos_token_id, logits.shape[-1])
    num_new_tokens = check_positive_int(num_new_tokens, "num_new_tokens", minimum=0)
    min_new_tokens = check_positive_int(min_new_tokens, "min_new_tokens", minimum=0)
    return _min_new_tokens(logits, eos, num_new_tokens, min_new_tokens)


def _min_new_tokens(logits, eos, num_new_tokens, min_new_tokens):
    """Unchecked :func:`apply_min_new_tokens`; ``eos`` an int64 array (k,)."""
    out = logits.copy()  # (..., V)
    if num_new_tokens < min_new_tokens:
        out[..., eos] = FILTERED
    return out


def apply_temperature(logits, temperature):
    """``logits / temperature``, ``temperature > 0`` (below 1 sharpens the distribution, above 1 flattens it).

    Returns a new array (..., V) in ``logits``'s dtype.
    """
    return _temperature(_as_logits(logits), _check_real(temperature, "temperature", low=0.0))


def _temperature(logits, temperature):
    """Unchecked :func:`apply_temperature`."""
    with np.errstate(over="ignore", under="ignore"):  # checked on the next line; underflow to 0 is harmless
        out = logits / temperature  # (..., V); a Python float, float32 stays float32
        overflowed = np.isposinf(out).any()
        signals_land_here()  # a Ctrl-C is raised inside the block (_pair_checks.py)
    if overflowed:
        raise FloatingPointError(f"logits / temperature overflows {logits.dtype} (temperature = {temperature:g},"
                                 f" largest logit {float(logits.max()):.3g}); use a larger temperature or greedy"
                                 " decoding")
    return out


def apply_top_k(logits, top_k, min_tokens_to_keep=1):
    """Keep the ``top_k`` largest logits of each row (and any tied with the k-th), ``-inf`` elsewhere.

    As transformers' ``TopKLogitsWarper``: ``k = min(max(top_k, min_tokens_to_keep), V)`` and a
    logit is removed when it is strictly below the k-th largest of its row.

    Returns a new array (..., V).
    """
    logits = _as_logits(logits)
    top_k = check_positive_int(top_k, "top_k")
    return _top_k(logits, max(top_k, check_positive_int(min_tokens_to_keep, "min_tokens_to_keep")))


def _top_k(logits, k):
    """Unchecked :func:`apply_top_k` with ``k >= 1``."""
    k = min(k, logits.shape[-1])
    kth = np.partition(logits, -k, axis=-1)[..., -k, None]  # (..., 1): the k-th largest of each row
    return np.where(logits < kth, FILTERED, logits)


def apply_top_p(logits, top_p, min_tokens_to_keep=1):
    """Nucleus filtering: remove the least likely tokens whose probabilities add up to at most ``1 - top_p``.

    As transformers' ``TopPLogitsWarper``: sort each row ascending, ``c_j`` the cumulative sum of
    ``softmax`` of the sorted logits; remove the tokens with ``c_j <= 1 - top_p``, except the
    ``min_tokens_to_keep`` largest. Tied logits are ordered by index (a stable sort), where
    torch's sort leaves their order unspecified. ``top_p = 1`` still removes the tokens whose
    probability is exactly 0 (:func:`process_logits` skips this step at ``top_p = 1``, as
    ``generate`` does).

    Parameters
    ----------
    logits : array (..., V)
    top_p : float in [0, 1]
    min_tokens_to_keep : positive int

    Returns
    -------
    array (..., V), a new array
    """
    logits = _as_logits(logits)
    top_p = _check_real(top_p, "top_p", low=0.0, high=1.0, low_open=False)
    return _top_p(logits, top_p, check_positive_int(min_tokens_to_keep, "min_tokens_to_keep"))


def _top_p(logits, top_p, min_tokens_to_keep):
    """Unchecked :func:`apply_top_p`."""
    order = np.argsort(logits, axis=-1, kind="stable")  # (..., V), ascending
    ascending = np.take_along_axis(logits, order, axis=-1)  # (..., V)
    # a difference past the float range is -inf and a probability below the smallest float is 0, as they should be
    with np.errstate(over="ignore", under="ignore"):
        e = np.exp(ascending - ascending[..., -1:])  # (..., V): the row maximum is the last
        cumulative = np.cumsum(e / e.sum(axis=-1, keepdims=True), axis=-1)  # (..., V)
        signals_land_here()  # a Ctrl-C is raised inside the block (_pair_checks.py)
    remove_sorted = cumulative <= 1.0 - top_p  # (..., V)
    remove_sorted[..., max(logits.shape[-1] - min_tokens_to_keep, 0):] = False  # the largest are kept
    remove = np.empty_like(remove_sorted)
    np.put_along_axis(remove, order, remove_sorted, axis=-1)  # back to the vocabulary's order
    return np.where(remove, FILTERED, logits)


def _top_k_or_off(top_k):
    """None or 0 turn top-k off (transformers); else a positive int."""
    if top_k is None:
        return 0
    message = f"top_k must be None or a non-negative integer (0: off), got {top_k!r}"
    if isinstance(top_k, (bool, np.bool_)) or not isinstance(top_k, Integral):
        raise TypeError(message)
    if top_k < 0:
        raise ValueError(message)
    return int(top_k)


class LogitsSettings(NamedTuple):
    """The checked settings of :func:`process_logits` (what ``generate`` checks once and uses at every step).

    Fields: ``do_sample`` bool; ``temperature`` float > 0; ``top_k`` int, 0 for off; ``top_p``
    float in [0, 1]; ``penalty`` float > 0; ``min_new_tokens`` int >= 0; ``eos`` int64 array (k,)
    or None."""
    do_sample: bool
    temperature: float
    top_k: int
    top_p: float
    penalty: float
    min_new_tokens: int
    eos: np.ndarray | None


def check_logits_settings(vocab_size, *, do_sample=False, temperature=1.0, top_k=DEFAULT_TOP_K, top_p=1.0,
                          repetition_penalty=1.0, min_new_tokens=0, eos_token_id=None) -> LogitsSettings:
    """The settings of :func:`process_logits` checked for a vocabulary of ``vocab_size``, as a
    :class:`LogitsSettings` (a one-line error naming the first bad one)."""
    if not isinstance(do_sample, (bool, np.bool_)):
        raise TypeError(f"do_sample must be True or False, got {do_sample!r}")
    penalty = _check_real(repetition_penalty, "repetition_penalty", low=0.0)
    min_new_tokens = check_positive_int(min_new_tokens, "min_new_tokens", minimum=0)
    eos = None if eos_token_id is None else _as_eos_ids(eos_token_id, vocab_size)
    temperature = _check_real(temperature, "temperature", low=0.0)
    top_k = _top_k_or_off(top_k)
    top_p = _check_real(top_p, "top_p", low=0.0, high=1.0, low_open=False)
    return LogitsSettings(bool(do_sample), temperature, top_k, top_p, penalty, min_new_tokens, eos)


def process_logits(logits, ids, *, num_new_tokens=0, attention_mask=None, do_sample=False, temperature=1.0,
                   top_k=DEFAULT_TOP_K, top_p=1.0, repetition_penalty=1.0, min_new_tokens=0, eos_token_id=None):
    """The logits of one step of ``generate`` after transformers' processors, in transformers' order.

    1. repetition penalty (skipped at 1.0), over ``ids`` minus each row's left padding
    2. min_new_tokens: ``eos_token_id`` at ``-inf`` while ``num_new_tokens < min_new_tokens``
       (skipped without ``eos_token_id`` or at 0)
    3. only when ``do_sample``: temperature (skipped at 1.0), top-k (skipped for None or 0),
       top-p (skipped at 1.0)

    Greedy decoding takes the argmax of the result; sampling draws from its softmax.

    Parameters
    ----------
    logits : array (B, V), the last position's logits
    ids : integer array (B, T), the prompts (left-padded) and the tokens generated so far
    num_new_tokens : int in [0, T], how many of the T tokens have been generated
    attention_mask : optional 0/1 array (B, T), 0 on the left padding
    do_sample, temperature, top_k, top_p, repetition_penalty, min_new_tokens, eos_token_id :
        as ``generate``'s arguments of the same names (defaults: transformers')

    Returns
    -------
    array (B, V), the processed logits (a new array)
    """
    # every argument checked once, here; the steps below trust them
    logits = _as_logits(logits, 2, "(B, V)")
    ids, keep = _check_ids(ids, logits, attention_mask)
    num_new_tokens = check_positive_int(num_new_tokens, "num_new_tokens", minimum=0)
    if num_new_tokens > ids.shape[1]:
        raise ValueError(f"num_new_tokens = {num_new_tokens} is more than the {ids.shape[1]} tokens of ids")
    settings = check_logits_settings(logits.shape[-1], do_sample=do_sample, temperature=temperature, top_k=top_k,
                                     top_p=top_p, repetition_penalty=repetition_penalty,
                                     min_new_tokens=min_new_tokens, eos_token_id=eos_token_id)
    return processed_logits(logits, ids, keep, num_new_tokens, settings)


def processed_logits(logits, ids, keep, num_new_tokens, settings: LogitsSettings, shift=False):
    """Unchecked :func:`process_logits`: ``keep`` the boolean mask (B, T), ``settings`` checked by
    :func:`check_logits_settings` (``generate`` calls this at every step). With ``shift``, each
    row's maximum is subtracted before the temperature: the same softmax, top-k and top-p, and
    a temperature so small that ``logits / temperature`` would overflow is greedy instead."""
    # 1. repetition penalty, 2. min_new_tokens
    out = logits.copy()  # (B, V)
    if settings.penalty != 1.0:
        out = _repetition_penalty(out, ids, settings.penalty, keep)
    if settings.eos is not None and settings.min_new_tokens > 0:
        out = _min_new_tokens(out, settings.eos, num_new_tokens, settings.min_new_tokens)
    # 3. the sampling warpers
    if settings.do_sample:
        if settings.temperature != 1.0 and shift:
            with np.errstate(over="ignore", under="ignore"):  # a score sent to -inf has probability 0, as meant
                out = (out - out.max(axis=-1, keepdims=True)) / settings.temperature  # (B, V), each row's max 0
                signals_land_here()  # a Ctrl-C is raised inside the block (_pair_checks.py)
        elif settings.temperature != 1.0:
            out = _temperature(out, settings.temperature)
        if settings.top_k:
            out = _top_k(out, settings.top_k)
        if settings.top_p < 1.0:
            out = _top_p(out, settings.top_p, 1)
    return out


# ------------------------------------------------------------------------------ left_pad
def _is_empty(prompt) -> bool:
    """Whether ``prompt`` is a sequence of length 0."""
    try:
        return len(prompt) == 0
    except TypeError:  # a number or a 0-d array: as_token_ids says what is wrong with it
        return False


def left_pad(prompts, pad_token_id):
    """Prompts of different lengths as one batch, padded on the left (as ``generate`` expects).

    Parameters
    ----------
    prompts : sequence of B non-empty 1-D sequences of non-negative integer token ids
    pad_token_id : non-negative int, the id put before the shorter prompts

    Returns
    -------
    ids : int64 array (B, T), T the longest prompt's length; row b is
        ``[pad] * (T - len(prompts[b])) + prompts[b]``
    attention_mask : int64 array (B, T), 0 on the padding and 1 on the prompt (a tokenizer's
        ``padding_side="left"`` output)
    """
    pad_token_id = check_positive_int(pad_token_id, "pad_token_id", minimum=0)
    if isinstance(prompts, (str, bytes)) or not hasattr(prompts, "__len__"):
        raise TypeError(f"prompts must be a sequence of token-id sequences, got {type(prompts).__name__}")
    if len(prompts) == 0:
        raise ValueError("prompts must hold at least one prompt, got none")
    rows = []
    for b, prompt in enumerate(prompts):
        if _is_empty(prompt):  # [] is float64 to NumPy: say what is wrong
            raise ValueError(f"prompts[{b}] is empty: every prompt needs at least one token")
        row = as_token_ids(prompt, f"prompts[{b}]")
        if row.ndim != 1:
            raise ValueError(f"prompts[{b}] must be a 1-D sequence of token ids, got shape {row.shape}")
        if row.min() < 0:
            raise ValueError(f"prompts[{b}] holds the negative token id {int(row.min())}")
        rows.append(row)
    length = max(len(row) for row in rows)
    ids = np.full((len(rows), length), pad_token_id, np.int64)  # (B, T)
    attention_mask = np.zeros((len(rows), length), np.int64)  # (B, T)
    for b, row in enumerate(rows):
        ids[b, length - len(row):] = row
        attention_mask[b, length - len(row):] = 1
    return ids, attention_mask
