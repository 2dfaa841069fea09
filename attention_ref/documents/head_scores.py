"""What a head attends to, as a number per head: the measures behind the lessons' attention maps.

Each score is a mean of attention weights over a set of (query, key) pairs that a rule picks,
so it lies in [0, 1] and reads as "the share of its attention this head puts there". A head
that ignored the rule and spread its weight evenly over the t + 1 keys a causal query t sees
would score the mean of 1 / (t + 1) over the same queries: :func:`uniform_baseline` gives that
number, to compare with.

* :func:`current_token_scores`: the weight from query t on key t, itself.
* :func:`previous_token_scores`: the weight from query t on key t - 1.
* :func:`induction_scores`: the weight from query t on the keys j whose previous token is the
  current token (``ids[j - 1] == ids[t]``, j <= t): "after the last time I saw this token",
  the pattern of an induction head (Olsson et al., 2022), over the queries that have one.
* :func:`bracket_scores`: from a query inside brackets, the weight on the innermost bracket
  still open (``(``, ``[`` or ``{``), over the queries inside at least one.
* :func:`line_start_scores`: the weight on the most recent newline, over the queries after one.
* :func:`lm_attention`: the attention weights of every layer of a language model on ``ids``.

Symbols: B batch (any leading axes), H heads, T positions.
"""
from __future__ import annotations

import numpy as np

__all__ = ["lm_attention", "current_token_scores", "previous_token_scores", "induction_scores", "bracket_scores",
           "line_start_scores", "uniform_baseline", "open_bracket_positions", "last_newline_positions"]

_OPEN, _CLOSE = b"([{", b")]}"


def lm_attention(ids, params, config) -> list:
    """Attention weights of each layer of the model ``(params, config)`` (as :func:`attention_ref.lm_forward`
    runs it) on ``ids`` (..., T): a list of ``num_layers`` arrays (..., H, T, T)."""
    from ..models.lm import lm_forward

    _, cache = lm_forward(ids, params, config)
    return [block.weights for block in cache.blocks]


def _check_weights(weights) -> np.ndarray:
    weights = np.asarray(weights)
    if weights.ndim < 3 or weights.shape[-1] != weights.shape[-2]:
        raise ValueError(f"weights must be (..., H, T, T) attention probabilities, got shape {weights.shape}")
    return weights


def _rows_to_keys(weights, keys):
    """Per head, the mean over batch and queries of ``weights[..., h, t, keys[..., t]]`` for ``keys >= 0``
    (``keys`` (..., T): one key per query, -1 for a query not counted)."""
    weights = _check_weights(weights)
    keys = np.broadcast_to(np.asarray(keys), weights.shape[:-3] + weights.shape[-1:])  # (..., T)
    picked = np.take_along_axis(weights, np.maximum(keys, 0)[..., None, :, None], axis=-1)[..., 0]  # (..., H, T)
    counted = np.broadcast_to((keys >= 0)[..., None, :], picked.shape)
    if not counted.any():
        raise ValueError("no query has a key under this rule (the sequences are too short or have none)")
    heads = picked.shape[-2]
    return (np.where(counted, picked, 0.0).reshape(-1, heads, picked.shape[-1]).sum(axis=(0, 2))
            / counted.reshape(-1, heads, picked.shape[-1]).sum(axis=(0, 2)))  # (H,)


def current_token_scores(weights) -> np.ndarray:
    """(H,): mean weight from query t on key t (itself), over t = 0..T-1 and the batch."""
    return _rows_to_keys(weights, np.arange(_check_weights(weights).shape[-1]))


def previous_token_scores(weights) -> np.ndarray:
    """(H,): mean weight from query t on key t - 1, over t = 1..T-1 and the batch."""
    T = _check_weights(weights).shape[-1]
    return _rows_to_keys(weights, np.arange(T) - 1)


def induction_scores(weights, ids) -> np.ndarray:
    """(H,): mean over the queries t whose token occurred before (at some i < t) of the total weight on the
    keys j = i + 1 right after such an occurrence; ``ids`` (..., T) are the tokens the weights were computed on."""
    weights = _check_weights(weights)
    ids = np.asarray(ids)
    if ids.shape[-1] != weights.shape[-1]:
        raise ValueError(f"ids has {ids.shape[-1]} positions, weights {weights.shape[-1]}")
    T = ids.shape[-1]
    t, j = np.arange(T)[:, None], np.arange(T)[None, :]
    after = np.zeros(ids.shape[:-1] + (T, T), bool)  # (..., T, T): key j follows an earlier copy of ids[t]
    after[..., :, 1:] = ids[..., :, None] == ids[..., None, :-1]
    after &= (j >= 1) & (j <= t)
    queries = after.any(axis=-1)  # (..., T)
    if not queries.any():
        raise ValueError("ids: no token occurs twice, so no query has an earlier occurrence to look after")
    total = (weights * after[..., None, :, :]).sum(axis=-1)  # (..., H, T)
    heads = total.shape[-2]
    counted = np.broadcast_to(queries[..., None, :], total.shape)
    return (np.where(counted, total, 0.0).reshape(-1, heads, T).sum(axis=(0, 2))
            / counted.reshape(-1, heads, T).sum(axis=(0, 2)))


def open_bracket_positions(text: bytes) -> np.ndarray:
    """(T,): for each position, that of the innermost bracket still open just before it (-1 outside any).
    The bracket itself does not count as inside its own pair; a closing bracket is inside it."""
    stack, out = [], np.full(len(text), -1)
    for t, byte in enumerate(text):
        out[t] = stack[-1] if stack else -1
        if byte in _OPEN:
            stack.append(t)
        elif byte in _CLOSE and stack:
            stack.pop()
    return out


def last_newline_positions(text: bytes) -> np.ndarray:
    """(T,): for each position, that of the most recent earlier newline (-1 before the first)."""
    out, last = np.full(len(text), -1), -1
    for t, byte in enumerate(text):
        out[t] = last
        if byte == ord("\n"):
            last = t
    return out


def _keys_of(texts, rule) -> np.ndarray:
    texts = [texts] if isinstance(texts, (bytes, bytearray)) else list(texts)
    if not texts or not all(isinstance(s, (bytes, bytearray)) for s in texts):
        raise TypeError("texts must be bytes or a list of bytes (one per row of the weights)")
    return np.stack([rule(bytes(s)) for s in texts])


def bracket_scores(weights, texts) -> np.ndarray:
    """(H,): mean weight from a query inside brackets on the innermost open bracket (``texts``: the bytes the
    rows were computed on, one per row)."""
    return _rows_to_keys(weights, _keys_of(texts, open_bracket_positions).reshape(np.shape(weights)[:-3] + (-1,)))


def line_start_scores(weights, texts) -> np.ndarray:
    """(H,): mean weight from a query on the most recent newline before it."""
    return _rows_to_keys(weights, _keys_of(texts, last_newline_positions).reshape(np.shape(weights)[:-3] + (-1,)))


def uniform_baseline(keys) -> float:
    """What a head spreading its weight evenly over the causal keys would score under a rule whose key
    positions are ``keys`` (..., T) (-1 where a query is not counted): the mean of 1 / (t + 1)."""
    keys = np.asarray(keys)
    t = np.broadcast_to(np.arange(keys.shape[-1]), keys.shape)
    return float((1.0 / (t[keys >= 0] + 1)).mean())
