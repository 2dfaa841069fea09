"""GPT-NeoX (Pythia) as a whole language model: the 0.3 names, kept (deprecated since 0.4) as aliases of the
model written once over the family modules.

The family is :mod:`attention_ref.models.families.gpt_neox` (its reader, parameter table, block steps
and hooks); its forward and backward are :func:`attention_ref.models.lm.lm_forward` and
:func:`attention_ref.models.lm.lm_backward`, which these names call. Removed in 0.5.
"""
from __future__ import annotations

from .lm import LMCache as GPTNeoXLMCache
from .lm import lm_backward as gpt_neox_lm_backward
from .lm import lm_forward as gpt_neox_lm_forward

__all__ = ["GPTNeoXLMCache", "gpt_neox_lm_forward", "gpt_neox_lm_backward"]
