"""Phi-3 as a whole language model: the 0.3 names, kept (deprecated since 0.4) as aliases of the
model written once over the family modules.

The family is :mod:`attention_ref.models.families.phi3` (its reader, parameter table, block steps
and hooks); its forward and backward are :func:`attention_ref.models.lm.lm_forward` and
:func:`attention_ref.models.lm.lm_backward`, which these names call. Removed in 0.5.
"""
from __future__ import annotations

from .lm import LMCache as Phi3LMCache
from .lm import lm_backward as phi3_lm_backward
from .lm import lm_forward as phi3_lm_forward
from .families.phi3 import phi3_block_as_llama

__all__ = ["Phi3LMCache", "phi3_lm_forward", "phi3_lm_backward", "phi3_block_as_llama"]
