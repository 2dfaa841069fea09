"""Gemma 2 and Gemma 3 (text) as a whole language model: the 0.3 names, kept (deprecated since 0.4) as aliases of the
model written once over the family modules.

The family is :mod:`attention_ref.models.families.gemma3_text` (its reader, parameter table, block steps
and hooks); its forward and backward are :func:`attention_ref.models.lm.lm_forward` and
:func:`attention_ref.models.lm.lm_backward`, which these names call. Removed in 0.5.
"""
from __future__ import annotations

from .lm import LMCache as GemmaLMCache
from .lm import lm_backward as gemma_lm_backward
from .lm import lm_forward as gemma_lm_forward
from ..nn.soft_cap import soft_cap_formula
from .families.gemma3_text import embedding_normalizer


def final_soft_cap(z, config):
    """Gemma 2's final cap: ``(cap * t, t)`` with ``t = tanh(z / cap)``, else ``(z, None)``
    (:func:`attention_ref.nn.soft_cap.soft_cap_formula`; deprecated since 0.4)."""
    if config.final_softcap is None:
        return z, None
    y, cache = soft_cap_formula(z, config.final_softcap)
    return y, cache.t


__all__ = ["GemmaLMCache", "gemma_lm_forward", "gemma_lm_backward", "embedding_normalizer", "final_soft_cap"]
