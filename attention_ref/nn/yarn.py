"""YaRN's RoPE frequencies and attention factor (Peng et al. 2023, "YaRN: Efficient Context Window
Extension of Large Language Models"; gpt-oss uses it with ``factor`` 32 over 4096 positions).

Plain RoPE turns feature pair ``i`` of a ``d``-wide head (``d`` rotated features) by ``p theta_i``,
``theta_i = base^(-2i / d)``. Pair ``i`` makes ``L theta_i / (2 pi)`` full turns over the
``L = original_max_position_embeddings`` positions seen in training. YaRN leaves the fast pairs
(many turns: they only see relative offsets they already know) alone, slows the slow ones
(less than one turn: their angles past ``L`` were never seen) by ``factor``, like position
interpolation, and ramps linearly in between ("NTK-by-parts"):

* the pair index at which a pair makes ``r`` turns over ``L`` positions is
  ``i(r) = d ln(L / (2 pi r)) / (2 ln base)``; ``low = i(beta_fast)``, ``high = i(beta_slow)``
  (``beta_fast`` 32 and ``beta_slow`` 1 turns by default), floored and ceiled when ``truncate``
  (transformers' default; gpt-oss sets ``truncate = False``), then clipped to ``[0, d - 1]``;
* ``ramp_i = clip((i - low) / (high - low), 0, 1)`` (``high`` nudged by 0.001 when equal), 0 for
  the fast pairs and 1 for the slow ones;
* ``theta'_i = (1 - ramp_i) theta_i + ramp_i theta_i / factor``.

Interpolated positions flatten the attention's softmax; YaRN sharpens it back by scaling both
rotated ``q`` and ``k`` by ``sqrt(t)`` with ``sqrt(t) = 0.1 ln(factor) + 1`` (``mscale``), which
transformers applies to ``cos`` and ``sin`` as the "attention factor" (so the scores grow by
``t``). A config may give ``attention_factor`` itself, or ``mscale`` and ``mscale_all_dim``
(DeepSeek's) for the ratio ``g(factor, mscale) / g(factor, mscale_all_dim)``, with
``g(s, m) = 0.1 m ln(s) + 1`` for ``s > 1`` and 1 otherwise.
"""
from __future__ import annotations

import math

import numpy as np

__all__ = ["yarn_frequencies", "yarn_attention_factor"]

#: transformers' nudge when the ramp's two ends coincide (its ``linear_ramp_factor``)
RAMP_EPSILON = 0.001


def _turns_to_pair_index(turns, d, base, L):
    """The (real) pair index whose frequency makes ``turns`` full turns over ``L`` positions."""
    return d * math.log(L / (turns * 2 * math.pi)) / (2 * math.log(base))


def yarn_frequencies(d, base, factor, original_max_position_embeddings, beta_fast=32.0, beta_slow=1.0,
                     truncate=True) -> np.ndarray:
    """YaRN's frequencies ``theta'_i`` (float64, shape (d/2,)), as the module docstring derives.

    Unchecked: :func:`attention_ref.nn.rope_scaling.rope_parameters` checks a config's values
    and calls this.
    """
    theta = base ** (-np.arange(0, d, 2, dtype=np.float64) / d)  # (d/2,), plain RoPE
    low = _turns_to_pair_index(beta_fast, d, base, original_max_position_embeddings)
    high = _turns_to_pair_index(beta_slow, d, base, original_max_position_embeddings)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += RAMP_EPSILON
    ramp = np.clip((np.arange(d // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)  # (d/2,)
    return (1.0 - ramp) * theta + ramp * theta / factor  # (d/2,): fast pairs kept, slow ones divided


def _mscale(scale, m=1.0):
    """``0.1 m ln(scale) + 1`` for ``scale > 1``, else 1."""
    return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0


def yarn_attention_factor(factor, attention_factor=None, mscale=None, mscale_all_dim=None) -> float:
    """The factor YaRN multiplies ``cos`` and ``sin`` by: ``attention_factor`` when given, else
    ``g(factor, mscale) / g(factor, mscale_all_dim)`` when both are given and nonzero, else
    ``g(factor, 1) = 0.1 ln(factor) + 1``."""
    if attention_factor is not None:
        return float(attention_factor)
    if mscale and mscale_all_dim:
        return float(_mscale(factor, mscale) / _mscale(factor, mscale_all_dim))
    return float(_mscale(factor))
