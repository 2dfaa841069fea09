"""The reference's formulas that the fast path and the layers above reuse as they are, under
names public inside the package.

Splitting and merging heads is a reshape and a moved axis: there is no faster way to do it, so
the fast path, the grouped heads of ``variants`` and the decoding steps of ``nn`` all run the
reference's own (:mod:`attention_ref.core.heads`, :mod:`attention_ref.core.multi_head`) on
arrays already checked. This module is the one place outside ``core/`` that reaches into its
private formulas.
"""
from __future__ import annotations

from ..core import heads as core_heads
from ..core import multi_head as core_multi_head

__all__ = []  # inside the package only

#: How the attention scores of multi-head attention name their inputs in an overflow message.
SCORE_NAMES = core_multi_head._SCORE_NAMES


def split_heads_formula(x, num_heads):
    """:func:`attention_ref.split_heads` on a checked ``x``: (..., N, H*Dh) -> (..., H, N, Dh), a view."""
    return core_heads._split(x, num_heads)


def merge_heads_formula(x):
    """:func:`attention_ref.merge_heads` on a checked ``x``: (..., H, N, Dh) -> (..., N, H*Dh)."""
    return core_heads._merge(x)


def head_axis(mask):
    """A (..., Nq, Nk) mask with batch axes gets a head axis of size 1: one mask for every head."""
    return core_multi_head._head_axis(mask)
