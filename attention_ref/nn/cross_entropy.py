"""Cross-entropy of the next token: ``loss = mean over kept positions of -log softmax(logits)[target]``,
and its backward.

Symbols: ``...`` batch axes, V the vocabulary (the last axis of the logits).

Forward, numbered so the backward can walk it in reverse (as ``torch.nn.functional.cross_entropy``
with ``reduction="mean"`` and ``ignore_index``):

1. ``m = max_v z_v`` per row; ``log p = z - m - log sum_v exp(z_v - m)``, a stable log-softmax
2. ``l = -log p[target]`` per kept row (a target equal to ``ignore_index`` drops its row)
3. ``loss = sum(l) / K``, K the number of kept rows

Backward: ``dz = dloss / K * (p - onehot(target))`` on the kept rows, 0 on the dropped ones
(the gradient of ``-log softmax(z)[t]`` with respect to ``z`` is ``softmax(z) - e_t``).

:func:`next_token_targets` shifts token ids into targets, so that a language model's logits
at position n are scored against the token at n + 1 without slicing the logits.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._checks import as_upstream, signals_land_here
from .._token_checks import check_cross_entropy_inputs, check_next_token_inputs

__all__ = ["CrossEntropyCache", "cross_entropy_forward", "cross_entropy_backward", "next_token_targets"]


class CrossEntropyCache(NamedTuple):
    """What ``cross_entropy_backward`` needs: the probabilities, the targets and which rows count."""

    p: np.ndarray  # (..., V) softmax of the logits
    targets: np.ndarray  # (...,) with the dropped rows at 0
    kept: np.ndarray  # (...,) bool
    count: int  # K, the kept rows


def cross_entropy_forward(logits, targets, ignore_index=-100):
    """Mean cross-entropy of ``logits`` (..., V) against integer ``targets`` (...), in that order
    (torch's ``cross_entropy(input, target)`` with the classes on the last axis).

    Parameters
    ----------
    logits : array (..., V), unnormalised scores
    targets : integer array (...), each in ``[0, V)`` or equal to ``ignore_index``
    ignore_index : targets equal to it are left out of the mean (as torch, default -100)

    Returns
    -------
    loss : 0-d array in the logits' dtype; 0 when every target is ignored (torch gives nan)
    cache : CrossEntropyCache for :func:`cross_entropy_backward`
    """
    logits, targets, kept = check_cross_entropy_inputs(logits, targets, ignore_index)
    t = np.where(kept, targets, 0)  # (...,): a dropped row reads index 0, then counts for nothing
    # 1. the logits shifted by their row maximum (max 0), and the targets' shifted logits
    shifted = logits - logits.max(axis=-1, keepdims=True)  # (..., V)
    target_shifted = np.take_along_axis(shifted, t[..., None], axis=-1)[..., 0]  # (...,)
    # 2. stable softmax and its log-normaliser: p = exp(shifted) / s
    with np.errstate(under="ignore"):
        p = np.exp(shifted, out=shifted)  # (..., V), written over the shifted logits; far below the maximum: 0
        s = p.sum(axis=-1, keepdims=True)  # (..., 1), at least 1 (the maximum's exp(0))
        p /= s  # (..., V), for the backward
        signals_land_here()  # a Ctrl-C is raised inside the block (_pair_checks.py)
    # the target's negative log-probability, kept rows only: -log p[t] = log s - shifted[t]
    nll = np.log(s[..., 0]) - target_shifted  # (...,)
    # 3. mean over the kept rows
    count = int(kept.sum())
    loss = np.asarray(np.where(kept, nll, 0).sum() / max(count, 1), dtype=logits.dtype)  # ()
    return loss, CrossEntropyCache(p, t, kept, count)


def cross_entropy_backward(dloss, cache: CrossEntropyCache):
    """Gradient of :func:`cross_entropy_forward` (arguments ``dloss, cache``) with respect to the
    logits, (..., V).

    ``dlogits = dloss / K * (p - onehot(target))`` on the kept rows, 0 on the ignored ones.
    """
    dloss = as_upstream(dloss, (), cache.p.dtype, "dloss")
    p = cache.p.reshape(-1, cache.p.shape[-1])  # (rows, V)
    kept, targets = cache.kept.reshape(-1), cache.targets.reshape(-1)  # (rows,)
    rows = np.flatnonzero(kept)  # the kept rows
    with np.errstate(under="ignore"):  # a probability far below 1, scaled, may round to 0: harmless
        scale = dloss / max(cache.count, 1)  # () in the logits' dtype; a tiny dloss may round to 0
        dz = p * scale  # (rows, V): (p - onehot) * scale away from the targets
        dz[rows, targets[rows]] = (p[rows, targets[rows]] - 1) * scale  # (p - 1) * scale at the targets
        signals_land_here()  # a Ctrl-C is raised inside the block (_pair_checks.py)
    dz[~kept] = 0  # the ignored rows count for nothing
    return dz.reshape(cache.p.shape)  # (..., V)


def next_token_targets(ids, attention_mask=None, ignore_index=-100):
    """Targets for next-token prediction: ``targets[..., n] = ids[..., n + 1]``.

    The last position has no next token and gets ``ignore_index``; so does every position
    whose next token is padding (``attention_mask`` 0 there). This is the shift of
    transformers' ``labels=ids`` loss, written as targets for the unshifted logits.

    Parameters
    ----------
    ids : integer array (..., N)
    attention_mask : optional array (..., N) of 0/1 (or bool), 1 for real tokens

    Returns
    -------
    targets : int64 array (..., N)
    """
    ids, keep = check_next_token_inputs(ids, attention_mask)
    targets = np.full(ids.shape, ignore_index, dtype=np.int64)  # (..., N)
    targets[..., :-1] = np.where(keep[..., 1:], ids[..., 1:], ignore_index)  # (..., N-1): the next token
    return targets
